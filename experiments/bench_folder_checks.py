"""What loading a prepared dataset folder checks by default costs (issue 31, finding 10).

A folder of a random graph with 2M vertices and 30M edges (``--quick``: 200k / 3M) and 16 float32
features per vertex is written once with ``save_folder``; then, in interleaved rounds on a warm page
cache (the same load every rank of a job sees after the first):

* ``default`` -- ``load_folder(path)``: sizes, dtypes, the file stamps (size, time, 64 sampled blocks),
  ``indptr`` (one chunked pass over one entry per vertex), labels and splits; the id pass and the
  feature scan are skipped because the files are the ones written;
* ``copied`` -- the same on a copy of the folder (new modification times): the graph's ids get their
  pass too, the features (same sampled blocks) are still trusted;
* ``validate`` -- ``load_folder(path, validate=True)``: every full pass (ids, finite features);
* ``read graph`` -- reading the graph's two arrays once (a sum over each, as the first epochs do),
  the yardstick "next to reading the arrays".

Prints a table of median seconds per variant and their ratio to ``read graph``, and writes JSON.

    python experiments/bench_folder_checks.py --quick
    python experiments/bench_folder_checks.py          # 2M vertices, 30M edges
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import numpy as np
import torch

import gsplit
from gsplit.datasets import Dataset, load_folder, save_folder


def random_dataset(n: int, m: int, dim: int, seed: int) -> Dataset:
    gen = np.random.default_rng(seed)
    degrees = gen.multinomial(m, np.full(n, 1.0 / n))
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    indices = gen.integers(0, n, size=m, dtype=np.int64)
    graph = gsplit.Graph.from_csc(torch.from_numpy(indptr), torch.from_numpy(indices))
    perm = torch.from_numpy(gen.permutation(n))
    cut = [int(n * 0.6), int(n * 0.8)]
    return Dataset(graph=graph, features=torch.from_numpy(gen.standard_normal((n, dim), dtype=np.float32)),
                   labels=torch.from_numpy(gen.integers(0, 8, size=n)), train_idx=perm[:cut[0]],
                   val_idx=perm[cut[0]:cut[1]], test_idx=perm[cut[1]:], num_classes=8, name="random")


def read_graph(folder: Path) -> None:
    for name in ("indptr.npy", "indices.npy"):
        int(np.load(folder / "graph" / name, mmap_mode="r").sum())


def main() -> None:
    parser = setup.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every variant")
    args = parser.parse_args()
    n, m = (200_000, 3_000_000) if args.quick else (2_000_000, 30_000_000)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(args.out)) as tmp:
        t0 = time.perf_counter()
        folder = save_folder(random_dataset(n, m, 16, args.seed), Path(tmp) / "ds")
        write_s = time.perf_counter() - t0
        copy = shutil.copytree(folder, Path(tmp) / "copy", copy_function=shutil.copyfile)
        variants = {"default": lambda: load_folder(folder), "copied": lambda: load_folder(copy),
                    "validate": lambda: load_folder(folder, validate=True), "read graph": lambda: read_graph(folder)}
        for f in variants.values():  # warm the page cache and the code paths
            f()
        times = {k: [] for k in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for k in order:
                t = time.perf_counter()
                variants[k]()
                times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["read graph"]
    rows = [[k, med[k], min(times[k]), med[k] / base] for k in variants]
    print(f"prepared folder of {n:,} vertices, {m:,} edges, 16 features ({args.rounds} interleaved rounds, "
          f"warm page cache; writing it took {write_s:.1f} s)")
    print(report.format_table(["load", "median s", "min s", "x read graph"], rows))
    report.save_json(report.output_stem(args, "bench_folder_checks"), {
        "num_nodes": n, "num_edges": m, "feature_dim": 16, "rounds": args.rounds, "write_s": write_s,
        "seconds": times, "median_s": med, "ratio_to_read_graph": {k: med[k] / base for k in med}})


if __name__ == "__main__":
    main()
