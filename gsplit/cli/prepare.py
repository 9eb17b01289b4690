"""``gsplit prepare``: pre-sample, partition and write a partition map (optionally the dataset as a folder)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from gsplit.cli.common import (_load_dataset, _prepare_kernels, _print_full_graph_stats, _print_stats,
                               check_output_folder)
from gsplit.cli.options import (CliError, _add_dataset_args, _add_presample_args, _add_sampling_args,
                                check_dataset_options, parse_dataset_options, parse_fanouts)
from gsplit.runtime.io import atomic_write_json


class _StageProgress:
    """``prepare``'s progress callback: prints each message and, while a long stage runs, a tqdm bar of its
    elapsed seconds against the seconds estimated from measured per-edge costs, so tqdm shows the time left."""

    _STAGES = (("expected pre-sampling", "weights"), ("partitioning into", "partition"), ("split statistics", "stats"))
    _MIN_SECONDS = 2.0  # no bar for stages expected to be quicker

    def __init__(self, num_edges: int):
        self.num_edges = num_edges
        self._bar = None
        self._stop = None

    def __call__(self, message: str) -> None:
        self.close()
        print(message, flush=True)
        stage = next((s for prefix, s in self._STAGES if message.startswith(prefix)), None)
        if stage is None:
            return
        from gsplit.partitioning.prepare import estimated_stage_seconds

        total = estimated_stage_seconds(stage, self.num_edges)
        if total >= self._MIN_SECONDS:
            self._start(stage, total)

    def _start(self, stage: str, total: float) -> None:
        import threading
        from tqdm import tqdm

        bar = tqdm(total=round(total, 1), desc=f"  {stage} (time estimated from per-edge costs)",
                   bar_format="{desc}: {bar} {elapsed} elapsed, about {remaining} left", leave=False)
        stop, t0 = threading.Event(), time.perf_counter()

        def tick() -> None:
            while not stop.wait(0.5):  # past the estimate the bar stays full and "left" reads 00:00
                bar.n = min(round(time.perf_counter() - t0, 1), bar.total)
                bar.refresh()

        threading.Thread(target=tick, daemon=True).start()
        self._bar, self._stop = bar, stop

    def close(self) -> None:
        if self._bar is not None:
            self._stop.set()
            self._bar.close()
            self._bar = self._stop = None


def cmd_prepare_full_graph(args, ds) -> int:
    """``prepare --full-graph``: METIS balancing in-edges and vertices, minimising cut edges; no pre-sampling."""
    from gsplit.partitioning import full_graph_stats, partition_full_graph

    out = Path(args.out)
    print(f"partitioning into {args.num_parts} parts for full-graph training (in-edges and vertices balanced) ...",
          flush=True)
    pmap = partition_full_graph(ds.graph, args.num_parts, seed=args.seed)
    pmap.save(out)
    stats = full_graph_stats(ds.graph, pmap)
    atomic_write_json(out / "prepare.json", {"dataset": ds.name, "num_parts": args.num_parts, "method": pmap.method,
                                             "full_graph_stats": stats.to_dict(), "metadata": pmap.metadata})
    print(f"map written to {out} ({pmap.metadata['seconds']:.1f}s)")
    _print_full_graph_stats(stats)
    return 0


def _prepare_dataset(args, out: Path):
    """``prepare``'s dataset: as ``--dataset`` says or, with ``--dataset-out``, written there first (an edge
    list converted in chunks) and memory-mapped from there, as ``train --dataset folder:DIR`` will."""
    if not args.dataset_out:
        return _load_dataset(args)
    from gsplit import datasets
    from gsplit.datasets.chunked import convert_edgelist

    folder = check_output_folder(args.dataset_out, "--dataset-out")
    if folder.resolve() == out.resolve():
        raise CliError(f"--dataset-out {folder} is the --out folder; both write a meta.json: pass another folder "
                       f"(e.g. {out / 'dataset'})")
    t = time.perf_counter()
    # an edge list with its own features or labels files is read whole (the chunked converter makes random ones)
    files = {"features", "labels"} & set(parse_dataset_options(args.dataset_opts))
    converted = True  # by a chunked converter (float32), unless the last branch writes the loaded dataset
    if args.dataset.startswith("edgelist:") and not files:
        path = args.dataset.partition(":")[2]
        print(f"converting {path} into {folder} in chunks of {args.chunk_edges:,} edges ...", flush=True)
        rep = convert_edgelist(path, folder, chunk_edges=args.chunk_edges, **parse_dataset_options(args.dataset_opts))
        print(f"  {rep.num_nodes:,} vertices, {rep.num_edges:,} edges from {rep.file_edges:,} lines in {rep.chunks} "
              f"chunk(s) ({time.perf_counter() - t:.1f}s: "
              + ", ".join(f"{k} {v:.1f}s" for k, v in rep.seconds.items()) + ")", flush=True)
    elif args.dataset.startswith("ogbn-") and (source := _ogb_raw_folder(args)) is not None:
        from gsplit.datasets.chunked import convert_ogb

        opts = {k: v for k, v in parse_dataset_options(args.dataset_opts).items() if k in ("symmetric",
                                                                                         "remove_self_loops")}
        print(f"converting OGB's raw files in {source} into {folder} in chunks of {args.chunk_edges:,} edges ...",
              flush=True)
        rep = convert_ogb(source, folder, name=args.dataset, chunk_edges=args.chunk_edges, **opts)
        print(f"  {rep.num_nodes:,} vertices, {rep.num_edges:,} edges ({time.perf_counter() - t:.1f}s)", flush=True)
    else:
        converted = False
        ds = _load_dataset(args)  # in --feature-dtype already
        check_free_space(folder, dataset_bytes(ds), "--dataset-out")
        print(f"writing the dataset to {folder} ...", flush=True)
        datasets.save_folder(ds, folder)
        del ds  # from here on the dataset is the mapped folder: one copy, in the page cache
        print(f"  written ({time.perf_counter() - t:.1f}s)", flush=True)
    if converted and args.feature_dtype not in (None, "float32"):  # the chunked converters write float32
        print(f"  rewriting the features as {args.feature_dtype} ...", flush=True)
        datasets.folder.cast_folder_features(folder, args.feature_dtype)
    ds = datasets.load(f"folder:{folder}")
    print(f"  mapped {folder}: train with --dataset folder:{folder}", flush=True)
    return ds


def dataset_bytes(ds) -> int:
    """Bytes a prepared folder of ``ds`` takes (its arrays plus a header each; ``meta.json`` is small)."""
    tensors = [ds.graph.indptr, ds.graph.indices, ds.features, ds.labels, ds.train_idx, ds.val_idx, ds.test_idx,
               ds.node_ids, ds.communities]
    return sum(t.numel() * t.element_size() + 128 for t in tensors if t is not None)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use on ``folder``'s file system (its nearest existing parent)."""
    import os

    existing = next(p for p in (folder, *folder.parents) if p.exists())
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize


def check_free_space(folder: Path, need: int, option: str) -> None:
    """Refuse, before writing, a folder whose file system cannot hold ``need`` more bytes (files already there
    with the names written count as free: they are replaced)."""
    have = free_bytes(folder)
    replaced = sum(f.stat().st_size for f in folder.rglob("*.npy")) if folder.is_dir() else 0
    if need > have + replaced:
        raise CliError(f"the disk is full: writing the dataset to {option} {folder} needs {need / 2**20:,.1f} MiB but "
                       f"its file system has {have / 2**20:,.1f} MiB free; free space there or pass a folder on "
                       f"another file system")


def _ogb_raw_folder(args) -> Optional[Path]:
    """The unpacked OGB folder of ``--dataset ogbn-NAME`` (``-D root=``) when its raw files are there, else None."""
    from gsplit.datasets.ogb import default_root

    root = parse_dataset_options(args.dataset_opts).get("root")
    folder = (Path(str(root)).expanduser() if root else default_root()) / args.dataset.replace("-", "_")
    return folder if (folder / "raw" / "edge.csv.gz").is_file() else None


def _print_peak() -> None:
    from gsplit.runtime.resources import peak_rss_bytes

    peak = peak_rss_bytes()
    if peak is not None:
        print(f"peak memory of this process (VmHWM): {peak / 2**30:.2f} GiB", flush=True)


def cmd_prepare(args) -> int:
    check_dataset_options(args.dataset, parse_dataset_options(args.dataset_opts))
    out = check_output_folder(args.out, "--out")
    if args.chunk_edges < 1:
        raise CliError(f"--chunk-edges {args.chunk_edges}: pass a positive number of edges per chunk")
    from gsplit.partitioning.sparsify import check_entries_per_vertex

    try:
        args.metis_edges_per_vertex = check_entries_per_vertex(args.metis_edges_per_vertex)
    except ValueError as e:
        raise CliError(f"--metis-edges-per-vertex: {e}") from None
    if not args.full_graph:
        parse_fanouts(args.fanouts)  # a bad --fanouts is said before the dataset is read or kernels are built
    if args.task == "link":  # the map of a seeded edge split's message-passing graph (gsplit.cli.link_map)
        from gsplit.cli.link_map import cmd_prepare_link

        _prepare_kernels()
        return cmd_prepare_link(args, out)
    ds = _prepare_dataset(args, out)
    _prepare_kernels()
    try:
        return _prepare_map(args, ds, out)
    finally:
        _print_peak()


def _prepare_map(args, ds, out: Path) -> int:
    if args.full_graph:
        return cmd_prepare_full_graph(args, ds)
    fanouts = parse_fanouts(args.fanouts)
    from gsplit.partitioning import prepare_partition

    progress = _StageProgress(ds.graph.num_edges)
    try:
        prepared = prepare_partition(ds, args.num_parts, fanouts, args.batch_size, args.method, args.seed,
                                     args.presample_epochs, out, progress=progress, presample_method=args.presample,
                                     metis_edges_per_vertex=args.metis_edges_per_vertex)
    finally:
        progress.close()
    print(f"map written to {out}")
    r = prepared.report
    if r.get("metis_entries_in"):
        print(f"METIS saw {r['metis_entries']:,} of {r['metis_entries_in']:,} adjacency entries "
              f"(at most {r['metis_edges_per_vertex']:g} per vertex, each vertex's heaviest edges; "
              f"--metis-edges-per-vertex {args.metis_edges_per_vertex or 0})")
    print(f"peak host memory while preparing (this process + the METIS process, PSS): "
          f"{r['host_peak_mb'] / 1024:.2f} GiB (METIS's own pages {r['metis_private_peak_mb'] / 1024:.2f} GiB)")
    _print_stats(prepared.report["stats"])
    return 0


def add_parser(sub) -> None:
    """``gsplit prepare``'s options."""
    from gsplit.partitioning.budget import METIS_BOUNDS_WHEN_SHORT, METIS_EDGES_PER_VERTEX
    from gsplit.partitioning.strategies import METHODS

    p = sub.add_parser("prepare", help="pre-sample, partition and write a partition map")
    _add_dataset_args(p)
    _add_sampling_args(p)
    p.add_argument("--num-parts", type=int, required=True, help="number of GPUs/ranks")
    p.add_argument("--method", default="gsplit", choices=METHODS)
    _add_presample_args(p)
    p.add_argument("--out", required=True, help="folder for the map, its metadata and stats")
    p.add_argument("--dataset-out", help="also write the dataset as a folder of memory-mapped .npy files there "
                        "(an edgelist, or an ogbn-NAME whose raw files are unpacked: converted in chunks) and "
                        "prepare from it; train with --dataset folder:DIR")
    p.add_argument("--metis-edges-per-vertex", default=METIS_EDGES_PER_VERTEX,
                   help="bound METIS's input (and memory) to this many adjacency entries per vertex, each vertex's "
                        "heaviest edges, e.g. 8; 0: every edge; auto: every edge where the memory for it is "
                        f"available, else the largest of {'/'.join(f'{k:g}' for k in METIS_BOUNDS_WHEN_SHORT)} that fits "
                        f"(default {METIS_EDGES_PER_VERTEX})")
    p.add_argument("--chunk-edges", type=int, default=1 << 22,
                   help="edges per chunk when --dataset-out converts an edge list (default 4194304)")
    p.add_argument("--full-graph", action="store_true",
                   help="a map for full-graph training: METIS balancing in-edges and vertices per rank and "
                        "minimising cut edges, no pre-sampling (--method, --fanouts and --batch-size are not used)")
    from gsplit.cli.link_map import add_link_split_args

    add_link_split_args(p)
    p.set_defaults(func=cmd_prepare)
