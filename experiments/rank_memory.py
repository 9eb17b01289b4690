"""What a training rank holds beyond the shared data, and whether it grows with the graph at fixed batches.

Issue 19 asks that a host hold one graph + one feature table + a per-rank part that depends on the batch,
not on the graph. On synthetic graphs of fixed degree the batch itself grows with the graph (fewer repeated
vertices), so this separates the two: the graph is ``k`` disjoint copies of one synthetic graph (written as a
prepared folder, memory-mapped by the ranks) and the training targets lie in copy 0 only, so every rank
samples exactly the same batches for ``k = 1`` and ``k = 4`` while the graph, features, owner map and every
per-vertex array grow 4x. Each of 2 CPU ranks records its own memory (``/proc/self/smaps_rollup``:
``Anonymous`` is its private heap, unaffected by other processes on a shared machine) when it starts, after
its loaders are built and after iterations 1, 5 and 19 (with the next batch loaded), with the distinct input rows of its split.

    python experiments/rank_memory.py                    # 200k-vertex base, k = 1 and 4 (~2 min)
    python experiments/rank_memory.py --nodes 50000 --copies 1,2,4
    python experiments/rank_memory.py --quick            # 20k-vertex base, k = 1 and 2

Writes ``results/rank_memory.json`` (``--out``: another path; ``_quick`` with ``--quick``) and prints a table.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit import datasets
from gsplit.datasets.base import Dataset
from gsplit.data.graph import Graph
from gsplit.runtime.resources import smaps_rollup_kb
from gsplit.run.trainer import TrainConfig, train_rank

MB = 1 << 20


def copies(base: Dataset, k: int) -> Dataset:
    """``k`` disjoint copies of ``base``'s graph and features; the splits stay those of copy 0."""
    g = base.graph
    n, e = g.num_nodes, g.num_edges
    indptr = torch.cat([g.indptr[:-1] + i * e for i in range(k)] + [torch.tensor([k * e])])
    indices = torch.cat([g.indices + i * n for i in range(k)])
    return Dataset(graph=Graph.from_csc(indptr, indices), features=base.features.repeat(k, 1),
                   labels=base.labels.repeat(k), train_idx=base.train_idx.clone(), val_idx=base.val_idx.clone(),
                   test_idx=base.test_idx.clone(), num_classes=base.num_classes, name=f"copies{k}")


def _anon_mb() -> float:
    fields = smaps_rollup_kb(os.getpid()) or {}
    return round(fields.get("Anonymous", 0) / 1024, 1)


def measured_rank(rank: int, world_size: int, cfg: TrainConfig, dataset, owner, out: str) -> dict:
    """``train_rank`` with this rank's private memory recorded at its steps (written to ``out.RANK.json``)."""
    from gsplit.minibatch import loader as loader_module

    marks = [{"step": "start", "anon_mb": _anon_mb()}]
    original_iter = loader_module.DataLoader.__iter__

    def counted_iter(self):
        for i, batch in enumerate(original_iter(self), start=1):
            if i in (2, 6, 20):  # iteration i - 1 trained, batch i sampled and loaded (the loop may stop at 20)
                marks.append({"step": f"iteration {i - 1} done", "anon_mb": _anon_mb(),
                              "input_rows": self.last_stats.input_rows})
            yield batch

    original_init = loader_module.DataLoader.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        built = sum(m["step"].endswith("loader built") for m in marks)
        name = ("train", "val", "test")[built] if built < 3 else str(built)
        marks.append({"step": f"{name} loader built", "anon_mb": _anon_mb()})

    loader_module.DataLoader.__init__ = init
    loader_module.DataLoader.__iter__ = counted_iter
    result = train_rank(rank, world_size, cfg, dataset, owner)
    report.write_json(f"{out}.{rank}.json", marks)
    return result if rank == 0 else {}


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "rank_memory")
    p.add_sized("--nodes", quick=20_000, full=200_000, type=int,
                help="vertices of the base graph (default 200000; quick 20000)")
    p.add_sized("--copies", quick=[1, 2], full=[1, 4], type=setup.int_list,
                help="numbers of disjoint copies to compare (default 1,4; quick 1,2)")
    args = p.parse_args(argv)
    base = setup.load_named("synthetic", args.nodes, args.seed, avg_degree=15, feature_dim=128)
    owner0 = (torch.arange(args.nodes) % 2).to(torch.int8)  # the same split of every copy
    cfg = TrainConfig(fanouts=[15, 10, 5], batch_size=1024, epochs=1, max_iters=20, eval_every=0, device="cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.copies:
            folder = Path(tmp) / f"copies{k}"
            datasets.save_folder(copies(base, k), folder)
            ds = datasets.load_folder(folder)
            marks_file = str(Path(tmp) / f"marks{k}")
            gsplit.launch(measured_rank, 2, args=(cfg, ds, owner0.repeat(k), marks_file), backend="gloo")
            for rank in (0, 1):
                marks = report.read_json(f"{marks_file}.{rank}.json")
                rows.append({"copies": k, "num_nodes": ds.graph.num_nodes, "num_edges": ds.graph.num_edges,
                             "rank": rank, "marks": marks})
    steps = [m["step"] for m in rows[0]["marks"]]
    cell = lambda m: f"{m['anon_mb']} MB" + (f" {m['input_rows']}" if "input_rows" in m else "")  # noqa: E731
    table = report.format_table(["copies", "vertices", "rank"] + steps,
                                [[r["copies"], r["num_nodes"], r["rank"]] + [cell(m) for m in r["marks"]] +
                                 [""] * (len(steps) - len(r["marks"])) for r in rows])
    print(table)
    print("private memory: Anonymous of /proc/self/smaps_rollup; after the MB: distinct input rows")
    report.save_json(report.output_stem(args, suffix="_quick" if args.quick else ""),
                     {"base_nodes": args.nodes, "config": vars(cfg), "rows": rows, "table": table})


if __name__ == "__main__":
    main()
