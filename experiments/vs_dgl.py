"""Issue 10: gsplit (split and data-parallel) against DGL on the same machine, side by side.

Three systems train the same model on the same graph with the same ranks, batch size per rank, fanouts
and hidden size, all on CPU ranks over gloo:

* ``dgl``: DGL 2.1's own multi-GPU GraphSAGE example logic (``dgl.dataloading.DataLoader(use_ddp=True)``,
  ``dgl.nn`` layers, ``DistributedDataParallel``) run by ``experiments/dgl_peer.py`` under ``.venv-dgl``
  (build it with ``./dev dgl-env``: DGL needs torch 2.2, gsplit torch >= 2.4, so they never share a venv);
* ``split``: ``gsplit train --system split`` with a partition map prepared once per world size
  (``gsplit prepare``, outside the timing);
* ``dp``: ``gsplit train --system dp``, gsplit's data-parallel baseline;
* ``dgl-1proc`` and ``gsplit-1proc`` (issue 20, item 2): what a CPU user runs without any multi-process
  setup, ONE process with every core (``torch.get_num_threads()`` is logged per run) and the global
  batch (``ranks x batch-size`` targets per iteration): ``dgl_peer.py --ranks 1`` (a plain model and
  loader, no process group, no DDP) and ``gsplit train --num-ranks 1 --system dp``. They are compared
  with the multi-process runs of the same ``ranks`` (same global batch); the table's ratios are to DGL's
  multi-process epoch. ``--systems dgl,split,dp`` leaves them out;
* ``dgl-keepheap`` (not in the default): ``dgl`` with glibc keeping freed memory for reuse, as gsplit's CPU
  ranks do (``gsplit.runtime.resources.keep_freed_heap``): how much of a gap is the allocator setting;
* ``split-plain`` (issue 20, item 4): ``split`` with ``--no-overlap`` (every layer's shuffle blocking), so
  that the overlap's effect is measured in the same rounds (``split`` follows ``gsplit train``'s default:
  overlapped for SAGE and GCN, not for GAT, where the two rows are then the same configuration);
* ``split-shm`` (issue 20, item 5): ``split`` with ``GSPLIT_CPU_TRANSPORT=shm``, its all-to-alls through
  shared memory instead of gloo's loopback sockets (``gsplit.comm.shm``);
* ``split-shuffle``: ``split`` with ``--input-features shuffle``: each rank loads the input rows it owns and
  shuffles them (the paper's way), where ``split`` (``auto``) reads every input row it needs from the shared
  table on CPU ranks;
* ``split-prefetch`` (not in the default): ``split`` with ``--prefetch``: the next mini-batch sampled and loaded
  in a background thread (on its own process group) while one trains;
* ``split-bf16``, ``dp-bf16``, ``split-bf16feat``, ``dp-bf16feat`` (issue 54, not in the default): ``split`` / ``dp``
  with ``--feature-dtype bfloat16 --precision bf16`` (features and autocast), or the features alone;
* ``split-mbB``, ``dp-mbB``, ``split-shuffle-mbB``, ``split-prefetch-mbB``, ``split-shm-mbB`` (issue 33,
  ``--macrobatch 4,16`` adds them after their base system): the same with ``--macrobatch B``: B mini-batches
  sampled and loaded in one exchange, then trained one by one (the same steps). Every gsplit run also reports its
  collectives per iteration (rank 0's log) and every run the peak private memory of its largest process (a rank;
  ``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup`` sampled every second by
  ``gsplit.runtime.resources.HostMemoryMeter``).

Each run is its own process (``python -m gsplit.cli train`` from this checkout, the same as
``.venv/bin/gsplit train`` in the main checkout) with ``--epochs 2``; the second epoch is reported (the
first is warm-up). The systems run interleaved: every round runs every (model, ranks) with all three
systems, in reverse order on odd rounds, so that drifts of the machine's load hit all three alike;
times are medians over rounds. Counters (edges per layer, input feature rows) come from each system's
own logs: gsplit's JSON log and ``dgl_peer.py``'s ``block.num_edges()`` / ``input_nodes.numel()``.

The dataset is gsplit's synthetic graph (``gsplit.datasets.load("synthetic", num_nodes=..., seed=...)``),
exported once as ``.npy`` files for the DGL side; gsplit's runs generate the same graph from the same
options. Scratch files (the export, partition maps, per-run logs) go to ``OUT/scratch/vs_dgl/``
(git-ignored); the table, JSON and PNG to ``OUT/vs_dgl[_quick].{json,png}``.

    ./dev dgl-env                                   # once: .venv-dgl with DGL 2.1.0 + torch 2.2.1
    python experiments/vs_dgl.py --quick            # smoke test, about a minute
    python experiments/vs_dgl.py                    # 3 rounds, SAGE and GAT, 2 and 4 ranks
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads

from gsplit.runtime.io import read_run_log
from gsplit.runtime.resources import HostMemoryMeter, keep_freed_heap_env

SYSTEMS = ("dgl", "split", "dp", "split-plain", "dgl-1proc", "gsplit-1proc", "split-shm", "split-shuffle",
           "dgl-keepheap", "split-prefetch", "split-bf16", "dp-bf16", "split-bf16feat", "dp-bf16feat")
"""The compared systems, in the order of even rounds."""
NOT_BY_DEFAULT = ("dgl-keepheap", "split-prefetch", "split-bf16", "dp-bf16", "split-bf16feat", "dp-bf16feat")
"""Systems run only when ``--systems`` names them."""
LABELS = {"dgl": "DGL", "split": "split", "dp": "dp", "split-plain": "split no-overlap", "dgl-1proc": "DGL 1proc",
          "gsplit-1proc": "gsplit 1proc", "split-shm": "split-shm", "split-shuffle": "split shuffled inputs",
          "dgl-keepheap": "DGL kept heap", "split-prefetch": "split prefetch", "split-bf16": "split bf16",
          "dp-bf16": "dp bf16", "split-bf16feat": "split bf16 features", "dp-bf16feat": "dp bf16 features"}
"""Column names of the main table."""

BF16, BF16_FEATURES = ["--feature-dtype", "bfloat16", "--precision", "bf16"], ["--feature-dtype", "bfloat16"]

ONE_PROCESS = ("dgl-1proc", "gsplit-1proc")
"""Systems that train in one process with every core and the global batch of ``ranks`` processes."""

SPLIT_VARIANTS = {"split": [], "split-plain": ["--no-overlap"], "split-shm": [],
                  "split-shuffle": ["--input-features", "shuffle"], "split-prefetch": ["--prefetch"],
                  "split-bf16": BF16, "split-bf16feat": BF16_FEATURES}
DP_VARIANTS = {"dp-bf16": BF16, "dp-bf16feat": BF16_FEATURES}
"""``gsplit train --system split`` (``dp``) runs and the arguments each adds (``split-shm`` differs by environment)."""

DGL_KEEP_HEAP_ENV = keep_freed_heap_env()
"""``dgl-keepheap``: DGL's ranks with the glibc setting gsplit's CPU ranks make at start
(``gsplit.runtime.resources.keep_freed_heap``, by ``mallopt``; glibc reads the same from these variables): the allocator's
share of a difference, measured apart from the libraries' own work."""

MACROBATCH_BASES = ("split", "dp", "split-shuffle", "split-prefetch", "split-shm")
"""Systems ``--macrobatch`` adds ``-mbB`` variants of."""


def macrobatch_of(system: str):
    """``(base system, B)`` of a system name: ``"split-mb16"`` -> ``("split", 16)``; others have B = 1.

    Example:
        >>> macrobatch_of("dp-mb4"), macrobatch_of("split-shuffle")
        (('dp', 4), ('split-shuffle', 1))
    """
    base, sep, size = system.rpartition("-mb")
    return (base, int(size)) if sep and base in MACROBATCH_BASES and size.isdigit() else (system, 1)


def label(system: str) -> str:
    base, size = macrobatch_of(system)
    return LABELS[base] if size == 1 else f"{LABELS[base]} B={size}"


def parse_args(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0], name="vs_dgl")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="vertices of the synthetic graph (default 100000; quick 20000)")
    p.add_argument("-D", dest="dataset_opts", action="append", default=[], metavar="KEY=VALUE",
                   help="more options of the synthetic dataset, given to both sides (e.g. -D avg_degree=20)")
    p.add_sized("--rounds", quick=1, full=3, type=int, help="interleaved rounds (default 3; quick 1)")
    p.add_sized("--ranks", quick=[2], full=[2, 4], type=setup.int_list,
                help="comma-separated world sizes (default 2,4; quick 2)")
    p.add_argument("--models", default="sage,gat", help="comma-separated: sage, gat")
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in NOT_BY_DEFAULT),
                   help=f"comma-separated subset of {', '.join(SYSTEMS)} (default all but {', '.join(NOT_BY_DEFAULT)})")
    p.add_argument("--macrobatch", default="", help="comma-separated macrobatch sizes > 1: adds BASE-mbB after each "
                   f"BASE of {', '.join(MACROBATCH_BASES)} in --systems")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="GAT heads (hidden / heads per head)")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is reported")
    p.add_argument("--max-iters", type=int, default=-1, help="iterations per epoch (default all; quick 3)")
    p.add_argument("--method", default="gsplit", choices=["gsplit", "node", "edge", "random"],
                   help="split's partition method")
    p.add_sized("--presample-epochs", quick=1, full=5, type=int,
                help="for the gsplit/node map (default 5; quick 1)")
    setup.add_dgl_python(p)
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.systems = [s for s in args.systems.split(",") if s]
    args.max_iters = (3 if args.quick else 0) if args.max_iters < 0 else args.max_iters
    for m in args.models:
        if m not in ("sage", "gat"):
            raise SystemExit(f"--models: unknown model {m!r}; use sage and/or gat")
    for s in args.systems:
        if macrobatch_of(s)[0] not in SYSTEMS:
            raise SystemExit(f"--systems: unknown system {s!r}; use a subset of {','.join(SYSTEMS)} (or BASE-mbB "
                             f"for BASE in {', '.join(MACROBATCH_BASES)})")
    sizes = setup.int_list(args.macrobatch)
    if any(b < 2 for b in sizes):
        raise SystemExit(f"--macrobatch {args.macrobatch}: pass sizes above 1 (B = 1 is the base system)")
    args.systems = [v for s in args.systems
                    for v in [s] + ([f"{s}-mb{b}" for b in sizes] if s in MACROBATCH_BASES else [])]
    if args.epochs < 1 or args.rounds < 1 or min(args.ranks) < 2:
        raise SystemExit(f"--epochs {args.epochs}, --rounds {args.rounds}, --ranks {args.ranks}: need epochs >= 1, "
                         "rounds >= 1 and at least 2 ranks")
    return args


def dataset_options(args) -> dict:
    """Keyword arguments of ``datasets.load("synthetic", ...)``, the same ``-D`` options ``gsplit train`` gets."""
    from gsplit.cli.options import parse_dataset_options

    return {"num_nodes": args.nodes, "seed": args.seed, **parse_dataset_options(args.dataset_opts)}


def dash_d(opts: dict) -> list:
    return [x for k, v in opts.items() for x in ("-D", f"{k}={v}")]


def tag(opts: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in sorted(opts.items())).replace("_", "").replace(".", "p")


def export_dataset(ds, folder: Path, opts: dict) -> Path:
    """Write the ``.npy`` files ``dgl_peer.py`` reads (CSC in-edges, features, labels, train_idx)."""
    meta = {"name": ds.name, "options": opts, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
            "num_classes": ds.num_classes, "train": int(ds.train_idx.numel())}
    return setup.export_arrays(folder, {"indptr": ds.graph.indptr, "indices": ds.graph.indices,
                                        "features": ds.features, "labels": ds.labels, "train_idx": ds.train_idx}, meta)


def run(cmd, log_file: Path, timeout: float, env=None) -> float:
    """Run ``cmd`` from the repository root with its output in ``log_file``; its wall time, or an error."""
    return rounds.run_command(cmd, log=log_file, timeout=timeout, env=env, cwd=setup.REPO).seconds


def prepare_map(args, opts, world: int, scratch: Path) -> dict:
    """``gsplit prepare`` once per world size (reused when the same map was prepared before)."""
    pdir = scratch / (f"map-{tag(opts)}-w{world}-{args.method}-p{args.presample_epochs}-b{args.batch_size}"
                      f"-f{args.fanouts.replace(',', '_')}-s{args.seed}")
    if not (pdir / "prepare.json").exists():
        shutil.rmtree(pdir, ignore_errors=True)
        cmd = setup.GSPLIT_CLI + ["prepare", "--dataset", "synthetic", *dash_d(opts), "--fanouts", args.fanouts,
                                  "--batch-size", args.batch_size, "--seed", args.seed, "--num-parts", world,
                                  "--method", args.method, "--presample-epochs", args.presample_epochs, "--out", pdir]
        wall = run(cmd, scratch / f"prepare-w{world}.log", args.timeout)
        print(f"  partition map for {world} ranks ({args.method}) prepared in {wall:.1f}s: {report.rel(pdir)}",
              flush=True)
    prep = report.read_json(pdir / "prepare.json")
    return {"dir": str(pdir), "method": prep["method"], "presample_epochs": prep["presample_epochs"],
            "presample_s": prep["presample_s"], "partition_s": prep["partition_s"],
            "cross_edge_fraction": prep["stats"].get("cross_edge_fraction")}


def run_system(system: str, model: str, world: int, args, opts, data_dir: Path, maps: dict, scratch: Path,
               rnd: int) -> dict:
    """One training run; returns the reported (last) epoch's record in a common form."""
    log = scratch / f"r{rnd}-{model}-w{world}-{system}.json"
    system, macrobatch = macrobatch_of(system)
    processes = 1 if system in ONE_PROCESS else world
    batch = args.batch_size * world // processes  # one process takes the global batch of `world` ranks
    common_args = ["--fanouts", args.fanouts, "--batch-size", batch, "--hidden", args.hidden,
                   "--heads", args.heads, "--dropout", args.dropout, "--lr", args.lr, "--epochs", args.epochs,
                   "--seed", args.seed, "--model", model]
    if args.max_iters:
        common_args += ["--max-iters", args.max_iters]
    dgl = system.startswith("dgl")
    if dgl:
        cmd = [args.dgl_python, setup.REPO / "experiments" / "dgl_peer.py", "--data", data_dir, "--ranks",
               processes, "--json", log, *common_args]
    else:
        gsplit_system = ("split" if system in SPLIT_VARIANTS else "dp" if system in DP_VARIANTS
                         else {"gsplit-1proc": "dp"}.get(system, system))
        cmd = setup.GSPLIT_CLI + ["train", "--dataset", "synthetic", *dash_d(opts), "--num-ranks", processes,
                        "--system", gsplit_system, "--device", "cpu", "--log", log, "--eval-every", "0",
                        *common_args]
        if gsplit_system == "split":
            cmd += ["--partition", maps[world]["dir"]]
        cmd += SPLIT_VARIANTS.get(system, []) + DP_VARIANTS.get(system, [])
        if macrobatch > 1:
            cmd += ["--macrobatch", macrobatch]
    env = (rounds.peer_env(**(DGL_KEEP_HEAP_ENV if system == "dgl-keepheap" else {})) if dgl else
           {**os.environ, "GSPLIT_CPU_TRANSPORT": "shm" if system == "split-shm" else "gloo"})
    load_before = report.load_average()
    with HostMemoryMeter(interval_s=1.0) as meter:
        wall = run(cmd, log.with_suffix(".log"), args.timeout, env=env)
    doc = read_run_log(log)  # gsplit's JSON Lines log; the DGL peer's single JSON object reads the same
    rec = doc["epochs"][-1]
    iterations = rec["iterations"] if dgl else max(r["iterations"] for r in rec["ranks"])
    threads = [r.get("torch_threads") for r in rec["ranks"]]
    collectives = [it["collectives"] for it in rec["ranks"][0].get("per_iteration", [])] if not dgl else []
    out = {"system": system if macrobatch == 1 else f"{system}-mb{macrobatch}", "macrobatch": macrobatch,
           "collectives_per_iteration": statistics.fmean(collectives) if collectives else None,
           "peak_private_mb": max((c["private"] for c in meter.children_peak.values()), default=0) / 2**20,
           "model": model, "ranks": world, "processes": processes, "batch_per_process": batch,
           "torch_threads": threads, "transport": doc.get("transport"), "load_average_before": load_before,
           "load_average_after": report.load_average(),
           "round": rnd, "epoch": rec["epoch"],
           "epoch_s": rec["epoch_s"], "sample_s": rec["sample_s"], "load_s": rec.get("load_s"),
           "train_s": rec["train_s"], "iterations": iterations, "edges": rec["edges"],
           "dst_vertices": rec.get("dst_vertices"), "input_rows": rec["input_rows"], "loss": rec["loss"],
           "traffic_bytes": rec.get("traffic_bytes", 0), "process_wall_s": wall,
           "first_epoch_s": doc["epochs"][0]["epoch_s"], "log": report.rel(log)}
    if dgl:
        out.update(dgl=doc["dgl"], torch=doc["torch"], threads_per_rank=doc["threads_per_rank"],
                   dgl_threads=[r.get("dgl_threads") for r in rec["ranks"]])
    return out


def median_of(runs, key):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def summarise(runs, args) -> list:
    """One entry per (model, ranks, system): median times over rounds, counters of the last round."""
    out = []
    for model in args.models:
        for world in args.ranks:
            for system in args.systems:
                rs = [r for r in runs if (r["model"], r["ranks"], r["system"]) == (model, world, system)]
                if not rs:
                    continue
                last = rs[-1]
                # against DGL's epoch of the same round (same model and ranks), then the median over rounds
                dgl = {r["round"]: r["epoch_s"] for r in runs if (r["model"], r["ranks"], r["system"]) ==
                       (model, world, "dgl")}
                ratios = [r["epoch_s"] / dgl[r["round"]] for r in rs if r["round"] in dgl]
                out.append({"model": model, "ranks": world, "system": system, "rounds": len(rs),
                            "over_dgl_by_round": ratios, "over_dgl": statistics.median(ratios) if ratios else None,
                            "macrobatch": last.get("macrobatch", 1),
                            "collectives_per_iteration": last.get("collectives_per_iteration"),
                            "peak_private_mb": max(r.get("peak_private_mb", 0) for r in rs),
                            **{k: median_of(rs, k) for k in ("epoch_s", "sample_s", "load_s", "train_s")},
                            "epoch_s_all": [r["epoch_s"] for r in rs], "iterations": last["iterations"],
                            "processes": last["processes"], "batch_per_process": last["batch_per_process"],
                            "torch_threads": last["torch_threads"],
                            "load_average_1min_all": [r["load_average_before"][0] if r["load_average_before"]
                                                      else None for r in rs],
                            "edges": last["edges"], "edges_total": sum(last["edges"]),
                            "input_rows": last["input_rows"], "traffic_bytes": last["traffic_bytes"]})
    return out


def tables(summary, args):
    by = {(s["model"], s["ranks"], s["system"]): s for s in summary}
    fmt = lambda x, f=".2f": "-" if x is None else format(x, f)  # noqa: E731
    rows = []
    others = [s for s in args.systems if s != "dgl"]
    for model in args.models:
        for world in args.ranks:
            got = {s: by.get((model, world, s)) for s in set(args.systems) | {"dgl", "split", "dp"}}
            ratio = lambda s: fmt(got[s]["over_dgl"]) if got[s] else "-"  # noqa: E731
            phases = lambda s: ("/".join(fmt(got[s][k]) for k in ("sample_s", "load_s", "train_s"))  # noqa: E731
                                if got[s] else "-")
            rows.append([model, world, *[fmt(got[s]["epoch_s"]) if got[s] else "-" for s in args.systems],
                         *[ratio(s) for s in others], phases("split"), phases("dp"),
                         "/".join(fmt(got[s]["edges_total"] / 1e6, ".3f") if got[s] else "-" for s in SYSTEMS[:3]),
                         "/".join(fmt(got[s]["input_rows"] / 1e3, ".1f") if got[s] else "-" for s in SYSTEMS[:3])])
    main = report.format_table(["model", "ranks", *[f"{label(s)} s" for s in args.systems],
                                *[f"{label(s)}/DGL" for s in others],
                                "split sample/load/fwd-bwd s", "dp sample/load/fwd-bwd s",
                                "edges M DGL/split/dp", "feature rows k DGL/split/dp"], rows)
    detail = report.format_table(
        ["model", "ranks", "system", "processes x threads", "rounds", "epoch s (median)", "all rounds s",
         "/DGL (median of rounds)", "load avg 1 min", "sample s", "load s", "fwd-bwd s", "iterations",
         "edges per layer", "feature rows", "collectives/it", "peak private MB"],
        [[s["model"], s["ranks"], s["system"], f"{s['processes']} x {'/'.join(map(str, s['torch_threads']))}",
          s["rounds"], fmt(s["epoch_s"]), " ".join(fmt(x) for x in s["epoch_s_all"]), fmt(s["over_dgl"], ".3f"),
          " ".join(fmt(x, ".1f") for x in s["load_average_1min_all"]), fmt(s["sample_s"]),
          "(in sample)" if s["system"].startswith("dgl") else fmt(s["load_s"]), fmt(s["train_s"]), s["iterations"],
          " ".join(f"{e:,}" for e in s["edges"]), s["input_rows"], fmt(s["collectives_per_iteration"], ".1f"),
          fmt(s["peak_private_mb"], ".0f")] for s in summary])
    return main, detail


def plot(summary, args, stem: Path) -> None:
    fig, axes = report.figure(len(args.models) + 2)
    by = {(s["model"], s["ranks"], s["system"]): s for s in summary}
    groups = [f"{w} ranks" for w in args.ranks]
    for ax, model in zip(axes, args.models):
        series = {s: [by[(model, w, s)]["epoch_s"] if (model, w, s) in by else 0.0 for w in args.ranks]
                  for s in args.systems}
        report.bar_panel(ax, groups, series, "epoch time s (median over rounds)", f"{model.upper()}: epoch time")
    combos = [(m, w) for m in args.models for w in args.ranks]
    labels = [f"{m} {w}r" for m, w in combos]
    for ax, key, ylabel in ((axes[-2], "edges_total", "edges computed per epoch"),
                            (axes[-1], "input_rows", "feature rows loaded per epoch")):
        series = {s: [by[(m, w, s)][key] if (m, w, s) in by else 0 for m, w in combos] for s in args.systems}
        report.bar_panel(ax, labels, series, ylabel, ylabel.replace(" per epoch", ""))
    report.save_figure(fig, stem)


def main(argv=None) -> int:
    args = parse_args(argv)
    if any(s.startswith("dgl") for s in args.systems):
        setup.check_python(args.dgl_python, "or pass --dgl-python, or leave dgl out of --systems")
    stem = report.output_stem(args)
    scratch = setup.scratch(args.out, "vs_dgl")
    opts = dataset_options(args)

    t = time.perf_counter()
    ds = setup.load_named("synthetic", **opts)
    data_dir = export_dataset(ds, scratch / f"data-{tag(opts)}", opts)
    info = setup.describe_dataset(ds)
    print(f"synthetic {opts}: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges, {ds.train_idx.numel():,} train; "
          f"exported for DGL to {report.rel(data_dir)} ({time.perf_counter() - t:.1f}s)", flush=True)
    del ds
    maps = ({w: prepare_map(args, opts, w, scratch) for w in args.ranks}
            if set(SPLIT_VARIANTS) & {macrobatch_of(s)[0] for s in args.systems} else {})

    runs = []
    cores = report.cpu_cores()
    configs = [(m, w) for m in args.models for w in args.ranks]
    for rnd, order in rounds.orders(args.systems, args.rounds):
        for model, world in configs:
            for system in order:
                r = run_system(system, model, world, args, opts, data_dir, maps, scratch, rnd)
                runs.append(r)
                # after every run: a run stopped part-way (timeout, Ctrl-C) keeps what it measured; the last save
                # below replaces this with the summary and tables
                report.save_json(stem, {"experiment": "gsplit vs DGL (issue 10)", "partial": True, "dataset": info,
                                        "dataset_options": opts, "settings": report.settings(args), "maps": maps,
                                        "runs": runs}, announce=False)
                if system in ONE_PROCESS and r["torch_threads"] != [cores]:
                    print(f"warning: {system} ran with {r['torch_threads']} torch threads, not the host's {cores} "
                          "cores (OMP_NUM_THREADS set?)", flush=True)
                load = "" if r["load_s"] is None else f" / load {r['load_s']:.2f}"
                print(f"round {rnd} {model} {world} ranks {system:>12} ({r['processes']} x "
                      f"{'/'.join(map(str, r['torch_threads']))} threads): epoch {r['epoch_s']:.2f}s (sample "
                      f"{r['sample_s']:.2f}{load} / fwd-bwd {r['train_s']:.2f}), {r['iterations']} it, "
                      f"{sum(r['edges']):,} edges, {r['input_rows']:,} rows  [process {r['process_wall_s']:.0f}s]",
                      flush=True)

    summary = summarise(runs, args)
    main_table, detail_table = tables(summary, args)
    head = (f"synthetic {args.nodes:,} vertices, batch {args.batch_size}/rank, fanouts {args.fanouts}, hidden "
            f"{args.hidden} (GAT {args.heads} heads), epoch {args.epochs - 1} of each run"
            f"{f' ({args.max_iters} iterations)' if args.max_iters else ''}, median of {args.rounds} round(s); "
            "DGL's sample includes its feature loading; the 1proc systems run one process with every core "
            "and the global batch of `ranks` processes; ratios are to DGL's multi-process epoch")
    print(f"\n{head}\n{main_table}\n\n{detail_table}")
    report.save_json(stem, {"experiment": "gsplit vs DGL (issue 10)", "dataset": info, "dataset_options": opts,
                            "settings": report.settings(args),
                            "maps": maps, "runs": runs, "summary": summary, "table": main_table,
                            "detail_table": detail_table, "heading": head})
    plot(summary, args, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
