"""Peak host memory of one full-graph training epoch: gsplit (its compiled CPU kernels, or the plain-torch path
that GPUs run) against torch-geometric's full-batch GraphSAGE, each in a fresh process.

The GPU benchmark saw gsplit's full-graph SAGE peak at 1.55x torch-geometric's device memory on an H100
(2026-11-27); on the CPU the plain-torch path (``gsplit-torch``: the compiled kernels switched off, as on a GPU)
shows the same excess, so this script measures it where no GPU is needed. SAGE, 3 layers, hidden 256, 128-d
features, dropout 0.5, one optimiser step per epoch (``harness.runs.full_graph_step``, the models the GPU
benchmark times); the figure is the process's peak RSS (``VmHWM``) during
two epochs less its RSS before the model was built.

    python experiments/full_graph_memory.py                      # 50k vertices, ~1 min on 2 cores
    python experiments/full_graph_memory.py --checkout ../old    # the same, importing gsplit from another checkout
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from harness import memory, report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from harness.rounds import checkout_env, run_command
import torch

SYSTEMS = ("gsplit", "gsplit-torch", "pyg")
HIDDEN, LAYERS, EPOCHS = 256, 3, 2


def worker(system: str, nodes: int, seed: int) -> None:
    """One system's epochs in this process; prints one JSON line."""
    import gsplit

    if system == "gsplit-torch":
        import gsplit.ops.aggregate as aggregate

        aggregate._use_extension = lambda *tensors: None  # the path a GPU runs: gather + index_add_
    ds = gsplit.datasets.load("synthetic", num_nodes=nodes, feature_dim=128, seed=seed)
    before = memory.status_kb("VmRSS") * 1024
    step = runs.full_graph_step("pyg" if system == "pyg" else "gsplit", ds, torch.device("cpu"), HIDDEN, LAYERS)
    t0 = time.perf_counter()
    for _ in range(EPOCHS):
        step()
    print(json.dumps({"system": system, "epoch_s": (time.perf_counter() - t0) / EPOCHS, "edges": ds.graph.num_edges,
                      "peak_growth_GiB": (memory.vm_hwm() - before) / 2**30}), flush=True)


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "full_graph_memory")
    p.add_sized("--nodes", quick=5_000, full=50_000, type=int, help="vertices (default 50000; quick 5000)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"any of {', '.join(SYSTEMS)}")
    p.add_argument("--checkout", default=None, help="import gsplit from this checkout (e.g. an older commit's)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.nodes, args.seed)
        return
    env = checkout_env(args.checkout) if args.checkout else None
    rows = []
    for system in args.systems.split(","):
        if system not in SYSTEMS:
            raise SystemExit(f"--systems names {system!r}; use any of {', '.join(SYSTEMS)}")
        done = run_command([sys.executable, __file__, "--worker", system, "--nodes", args.nodes, "--seed", args.seed],
                           env=env, timeout=1800)
        rows.append(json.loads([line for line in done.output.splitlines() if line.startswith("{")][-1]))
    pyg = next((r["peak_growth_GiB"] for r in rows if r["system"] == "pyg"), None)
    table = report.format_table(["system", "peak growth GiB", "x pyg", "epoch s"],
                                [[r["system"], r["peak_growth_GiB"], r["peak_growth_GiB"] / pyg if pyg else "-",
                                  r["epoch_s"]] for r in rows])
    print(table)
    report.save_json(report.output_stem(args, suffix="_quick" if args.quick else ""),
                     {"nodes": args.nodes, "edges": rows[0]["edges"], "checkout": args.checkout, "rows": rows,
                      "table": table})


if __name__ == "__main__":
    main()
