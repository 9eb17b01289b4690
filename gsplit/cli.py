"""``gsplit prepare | train | stats | bench | eval | predict | plot``: the command line.

The CLI is the only part that prints; the library logs. Bad arguments end with one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from gsplit.io import append_jsonl, atomic_write_json, check_writable, file_error_line
from gsplit.launch import LaunchInterrupted

log = logging.getLogger("gsplit.cli")


class CliError(Exception):
    """A user mistake the CLI reports in one line."""


# ---------------------------------------------------------------------------- argument helpers
def parse_fanouts(text: str) -> List[int]:
    try:
        fanouts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--fanouts {text!r} is not a comma-separated list of integers; e.g. --fanouts 15,10,5")
    if not fanouts:
        raise CliError("--fanouts is empty; pass one fanout per layer, e.g. --fanouts 15,10,5")
    bad = [f for f in fanouts if f < 1 and f != -1]
    if bad:
        raise CliError(f"--fanouts {text!r} holds {bad[0]}; each fanout must be >= 1 (or -1: all neighbours)")
    return fanouts


def _parse_scalar(value: str) -> object:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            continue
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def parse_dataset_options(pairs: List[str]) -> Dict[str, object]:
    """``-D key=value`` pairs, values parsed as int, float, bool, a list of numbers (``0.6,0.2,0.2``) or
    left as strings."""
    opts: Dict[str, object] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise CliError(f"-D {pair!r} is not key=value; e.g. -D num_nodes=100000")
        key, value = pair.split("=", 1)
        parsed = _parse_scalar(value)
        if isinstance(parsed, str) and "," in value:
            items = [_parse_scalar(v.strip()) for v in value.split(",")]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
                parsed = items
        opts[key.strip().replace("-", "_")] = parsed
    return opts


def check_dataset_options(dataset: str, opts: Dict[str, object]) -> None:
    """Refuse ``-D`` options the dataset does not take, or whose value has the wrong type (before loading)."""
    from gsplit import datasets

    names = datasets.option_names(dataset)
    unknown = sorted(set(opts) - set(names))
    if unknown:
        raise CliError(f"-D {', '.join(unknown)}: not an option of dataset {dataset!r}; it accepts {', '.join(names)}")
    defaults = datasets.option_defaults(dataset)
    for key, value in opts.items():
        default = defaults.get(key)
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(default, float):
            ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        elif isinstance(default, (tuple, list)):
            ok, kind = isinstance(value, list), "a comma-separated list of numbers"
        else:
            continue
        if not ok:
            raise CliError(f"-D {key}={value if not isinstance(value, list) else ','.join(map(str, value))}: "
                           f"{key} takes {kind} (default {default}); e.g. -D {key}="
                           f"{','.join(map(str, default)) if isinstance(default, (tuple, list)) else default}")


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="synthetic",
                   help="synthetic (default), npz:PATH, edgelist:PATH, folder:PATH (gsplit prepare --dataset-out) "
                        "or ogbn-NAME")
    p.add_argument("-D", dest="dataset_opts", action="append", metavar="KEY=VALUE",
                   help="dataset option, repeatable (e.g. -D num_nodes=100000 -D avg_degree=20)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per layer from the input up (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration (default 1024)")
    p.add_argument("--seed", type=int, default=0)


def _add_presample_args(p: argparse.ArgumentParser) -> None:
    from gsplit.partitioning.presample import PRESAMPLE_METHODS

    p.add_argument("--presample", default="expected", choices=PRESAMPLE_METHODS,
                   help="pre-sampling weights: expected (closed form, default) or sampled (run the sampler)")
    p.add_argument("--presample-epochs", type=int, default=10, help="epochs of --presample sampled (default 10)")


def _load_dataset(args):
    from gsplit import datasets

    opts = parse_dataset_options(args.dataset_opts)
    check_dataset_options(args.dataset, opts)
    print(f"loading dataset {args.dataset} {opts if opts else ''}".rstrip(), flush=True)
    t = time.perf_counter()
    ds = datasets.load(args.dataset, **opts)
    print(f"  {ds.describe()} ({time.perf_counter() - t:.1f}s)", flush=True)
    return ds


# ---------------------------------------------------------------------------- prepare
def _say(message: str) -> None:
    print(message, flush=True)


def _print_stats(stats: dict) -> None:
    print(f"{'layer':>6} {'cross-split edges':>18} {'edge imbalance':>15} {'vertex imbalance':>17}")
    for layer, (cross, imb, vimb) in enumerate(zip(stats["cross_edge_fraction"], stats["edge_imbalance"],
                                                   stats["vertex_imbalance"])):
        print(f"{layer:>6} {cross:>18.3f} {imb:>15.3f} {vimb:>17.3f}")
    print(f"input-feature imbalance {stats['input_imbalance']:.3f}")


def check_output_folder(path: str, option: str) -> Path:
    """Check, before the work that fills it, that files can be written in folder ``path``.

    A folder that has to be created for the check is removed again, so that a run stopped before its
    output (a later check, too little memory) leaves nothing behind; the writers create it themselves.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CliError(f"{option} {p} is a file, not a folder; pass a folder path (it is created if absent)")
    created = [d for d in [p, *p.parents] if not d.exists()]  # deepest first
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-test.{os.getpid()}.tmp"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise CliError(f"cannot write into {option} {p} ({e.strerror or e}); pass a folder on a writable file "
                       f"system") from None
    finally:
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
    return p


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


def _print_full_graph_stats(stats) -> None:
    """Per rank: vertices, in-edges, halo rows (received per layer), rows sent per layer; cut and balance."""
    print(f"{'rank':>5} {'vertices':>10} {'in-edges':>11} {'halo rows':>10} {'sent rows':>10}")
    for r in range(stats.num_parts):
        print(f"{r:>5} {stats.vertices[r]:>10} {stats.in_edges[r]:>11} {stats.halo_rows[r]:>10} {stats.sent_rows[r]:>10}")
    print(f"cut edges {stats.cut_edges} of {stats.num_edges} ({stats.cut_fraction:.3f}); imbalance (max/mean): "
          f"vertices {stats.vertex_imbalance:.3f}, in-edges {stats.edge_imbalance:.3f}, halo {stats.halo_imbalance:.3f}")


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
    if args.dataset.startswith("edgelist:"):
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
        ds = _load_dataset(args)
        print(f"writing the dataset to {folder} ...", flush=True)
        datasets.save_folder(ds, folder)
        del ds  # from here on the dataset is the mapped folder: one copy, in the page cache
        print(f"  written ({time.perf_counter() - t:.1f}s)", flush=True)
    ds = datasets.load(f"folder:{folder}")
    print(f"  mapped {folder}: train with --dataset folder:{folder}", flush=True)
    return ds


def _ogb_raw_folder(args) -> Optional[Path]:
    """The unpacked OGB folder of ``--dataset ogbn-NAME`` (``-D root=``) when its raw files are there, else None."""
    from gsplit.datasets.ogb import default_root

    root = parse_dataset_options(args.dataset_opts).get("root")
    folder = (Path(str(root)).expanduser() if root else default_root()) / args.dataset.replace("-", "_")
    return folder if (folder / "raw" / "edge.csv.gz").is_file() else None


def _print_peak() -> None:
    from gsplit.resources import peak_rss_bytes

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


def cmd_stats(args) -> int:
    import gsplit

    if args.json:
        check_writable(args.json, "--json file")
    ds = _load_dataset(args)
    pmap = gsplit.PartitionMap.load(args.partition)
    if args.full_graph or pmap.method == "full-graph":
        stats = gsplit.full_graph_stats(ds.graph, pmap)
        print(f"{pmap!r}\nfull-graph training (every layer over all in-edges):")
        _print_full_graph_stats(stats)
        if args.json:
            atomic_write_json(args.json, stats.to_dict())
        return 0
    fanouts = parse_fanouts(args.fanouts) if args.fanouts else list(pmap.fanouts or [15, 10, 5])
    global_batch = (args.batch_size or pmap.batch_size or 1024) * pmap.num_parts  # the map stores targets per rank
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    stats = gsplit.split_stats(ds.graph, pmap, sampler, ds.train_idx, global_batch,
                               num_batches=args.num_batches, seed=args.seed)
    print(f"{pmap!r}")
    _print_stats(stats.to_dict())
    if args.json:
        atomic_write_json(args.json, stats.to_dict())
    return 0


# ---------------------------------------------------------------------------- train
def print_epoch(record: dict) -> None:
    """Per-epoch line printed from rank 0 (picklable, so it can cross into the rank processes)."""
    acc = "  ".join(f"{k[:-4]} acc {record[k]:.4f}" for k in ("val_acc", "test_acc") if k in record)
    print(f"epoch {record['epoch']:>3}  loss {record['loss']:.4f}  time {record['epoch_s']:.2f}s "
          f"(sample {record['sample_s']:.2f} / load {record['load_s']:.2f} / fwd-bwd {record['train_s']:.2f})  "
          f"{acc}", flush=True)


class EpochReport:
    """Rank 0's per-epoch callback: print the epoch line and, with a log file, append the record to it.

    Picklable (it crosses into the rank processes). Appending as epochs finish keeps the epochs done
    when a later one crashes.
    """

    def __init__(self, log_path: Optional[str] = None, tensorboard=None):
        self.log_path = log_path
        """JSON Lines file to append ``{"type": "epoch", ...}`` records to; None: print only."""
        self.tensorboard = tensorboard
        """A :class:`gsplit.plot.TensorBoardWriter` for the same numbers (``--tensorboard``), or None."""

    def __call__(self, record: dict) -> None:
        print_epoch(record)
        if self.log_path:
            append_jsonl(self.log_path, {"type": "epoch", **record})
        if self.tensorboard is not None:
            self.tensorboard.epoch(record)


def default_num_ranks() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def _map_mismatch(pmap, fanouts: List[int], batch_size: int) -> str:
    """How a partition map's pre-sampling settings differ from the training run's ("" when they match);
    ``batch_size`` is targets per rank, as the map stores it."""
    diffs = []
    if pmap.fanouts is not None and list(pmap.fanouts) != list(fanouts):
        diffs.append(f"fanouts {pmap.fanouts} (training uses {fanouts})")
    if pmap.batch_size is not None and int(pmap.batch_size) != int(batch_size):
        diffs.append(f"global batch {pmap.batch_size * pmap.num_parts} (training uses {batch_size * pmap.num_parts})")
    return ("was made for " + " and ".join(diffs)) if diffs else ""


def _saved_vertex_weights(pdir: Path, graph) -> Optional[torch.Tensor]:
    """The pre-sampling vertex weights saved next to a partition map (checked), or None if there are none."""
    from gsplit.io import load_npy
    from gsplit.partitioning.presample import PresampleWeights

    if (pdir / "presample.json").exists():  # the vertex weights alone: the per-edge ones are METIS's
        return PresampleWeights.load_vertex_weights(pdir, graph)
    if (pdir / "vertex_weights.npy").exists():  # older gsplit wrote this array alone
        return torch.from_numpy(load_npy(pdir / "vertex_weights.npy", "run `gsplit prepare` again", kind="f",
                                         length=graph.num_nodes).astype(np.float32))
    return None


class ResumeGuard:
    """The parent's side of ``--checkpoint``/``--resume``: the folder is made, checked and locked, and a
    resume is checked against the checkpoint's run record in three steps (configuration before the
    data is loaded, the dataset and the model's fit after, the partition map last), all before any
    rank starts. Allowed changes are said in one line each; refused ones raise :class:`CliError`."""

    def __init__(self, args, config: dict, world_size: int, writer: bool):
        from gsplit.checkpoint import CheckpointLock, prepare_checkpoint_dir

        self.args, self.config, self.world_size = args, config, world_size
        self.lock = None
        self.saved = None
        """The checkpoint to resume (its state loaded and checked), None for a fresh start."""
        folder = prepare_checkpoint_dir(args.checkpoint, probe=writer)
        if writer:  # one writer per folder; the kernel drops the lock when this process ends, however
            self.lock = CheckpointLock(folder).acquire()
        try:
            self._check(folder, writer)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let another run write the folder (also done by the kernel when this process ends)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _check(self, folder: Path, writer: bool) -> None:
        from gsplit.checkpoint import load_checkpoint, remove_leftovers
        from gsplit.resume import compare_runs, run_record

        args = self.args
        if writer:
            remove_leftovers(folder)
        latest = load_checkpoint(folder, state=False)
        if latest is None:
            if args.resume:
                _say(f"gsplit: resume: no complete checkpoint in {folder} yet; starting from the beginning")
            return
        where = f"step {latest.step}, epoch {latest.counters.get('epoch')}, iteration {latest.counters.get('iteration')}"
        if not args.resume:
            raise CliError(f"--checkpoint {folder} already holds a checkpoint ({where}); pass --resume to continue "
                           f"it, or another folder for a new run")
        if not latest.run and not args.resume_anyway:
            raise CliError(f"the checkpoint in {folder} ({where}) records no run settings (an older gsplit wrote "
                           f"it), so this run cannot be checked against it; pass --resume-anyway to resume it")
        self._decide(compare_runs(latest.run, run_record(self.config, self.world_size)))
        self.saved = load_checkpoint(folder)  # the checksum and the file, before any rank reads them
        _say(f"gsplit: resume: from {self.saved.path} ({where})")

    def _decide(self, check) -> None:
        why = check.verdict(self.args.resume_anyway)
        if why:
            raise CliError(why)
        for note in check.notes:
            _say(f"gsplit: resume: {note}")
        for change in check.refused:
            _say(f"gsplit: resume: --resume-anyway: continuing with {change}" +
                 (" (applied to the restored optimiser)" if change.startswith("--lr") else ""))

    def check_dataset(self, ds, model: str, hidden: int, heads: int, num_layers: int, dropout: float) -> None:
        """The dataset's fingerprint and the saved model's fit, after loading, before partitioning."""
        if self.saved is None:
            return
        from gsplit.nn.models import build_model
        from gsplit.resume import compare_runs, run_record

        if self.saved.run:
            saved = {k: v for k, v in self.saved.run.items() if k in ("dataset",)}
            self._decide(compare_runs(saved, {"dataset": run_record({}, 0, ds)["dataset"]}))
        probe = build_model(model, ds.features.shape[1], hidden, ds.num_classes, num_layers=num_layers,
                            dropout=dropout, heads=heads)
        want = probe.state_dict()
        for name, value in self.saved.model.items():
            if name not in want:
                raise CliError(f"the checkpoint in {self.args.checkpoint} holds {name!r}, which this model has not; "
                               f"resume with the checkpoint's --model, --hidden, --heads and --fanouts")
            if torch.is_tensor(value) and value.shape != want[name].shape:
                raise CliError(f"the checkpoint in {self.args.checkpoint} holds {name} of shape {list(value.shape)}, "
                               f"this model's is {list(want[name].shape)}; resume with the checkpoint's --model, "
                               f"--hidden, --heads, --fanouts and dataset")
        absent = sorted(set(want) - set(self.saved.model))
        if absent:
            raise CliError(f"the checkpoint in {self.args.checkpoint} lacks {absent[0]!r} of this model; resume with "
                           f"the checkpoint's --model, --hidden, --heads and --fanouts")

    def check_map(self, owner) -> None:
        """Say when the partition map differs from the checkpoint's (allowed: the same steps)."""
        if self.saved is not None and self.saved.run and owner is not None:
            from gsplit.resume import compare_runs, run_record

            saved = {k: v for k, v in self.saved.run.items() if k in ("partition",)}
            self._decide(compare_runs(saved, {"partition": run_record({}, 0, None, owner)["partition"]}))


def cmd_train(args) -> int:
    with contextlib.ExitStack() as closing:  # the checkpoint folder's lock, released however the run ends
        return _train(args, closing)


def _train(args, closing: contextlib.ExitStack) -> int:
    import gsplit
    from gsplit.comm import hosts as multihost
    from gsplit.feature_store import parse_size
    from gsplit.trainer import SYSTEMS, TrainConfig, train_rank

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda but CUDA is not available here (no GPU or a CPU-only torch); use --device cpu "
                       "or auto")
    if args.resume_anyway:
        args.resume = True
        if not args.checkpoint:
            raise CliError("--resume-anyway needs --checkpoint DIR: the folder to resume from")
    if args.log:  # before any work: a bad path must not surface after the whole run
        check_writable(args.log, "--log file")
    check_dataset_options(args.dataset, parse_dataset_options(args.dataset_opts))
    if args.partition:
        pdir = Path(args.partition)
        if pdir.exists() and not pdir.is_dir():
            raise CliError(f"--partition {pdir} is a file, not a folder; pass the folder `gsplit prepare --out` wrote "
                           f"(or a new folder to save the map made on the fly)")
    torchrun = args.launcher == "torchrun" or (args.launcher == "auto" and multihost.started_by_torchrun())
    if torchrun:
        # torchrun started this process as one rank of the job: join it instead of spawning ranks
        device = multihost.init_from_env(args.device)
        rank, ranks = torch.distributed.get_rank(), torch.distributed.get_world_size()
        args.ranks_per_host = int(os.environ["LOCAL_WORLD_SIZE"])
        if args.num_ranks and args.num_ranks != ranks:
            raise CliError(f"--num-ranks {args.num_ranks} but torchrun started {ranks} ranks; leave --num-ranks out")
        print(f"rank {rank} of {ranks} (host {os.environ.get('GROUP_RANK', '?')}, local rank "
              f"{os.environ['LOCAL_RANK']} of {args.ranks_per_host}) on {device}", flush=True)
    if args.full_graph:
        if args.system not in ("split", "full"):
            raise CliError(f"--full-graph trains split-parallel; it cannot be combined with --system {args.system}")
        args.system = "full"
    fanouts = parse_fanouts(args.fanouts)
    if args.system == "full":
        fanouts = [-1] * len(fanouts)  # every in-edge: --fanouts gives the number of layers only
    ranks = ranks if torchrun else (args.num_ranks or default_num_ranks())
    parts = args.ranks_per_host or ranks  # one split group per host: the map has a part per rank of a host
    if ranks % parts:
        raise CliError(f"--ranks-per-host {args.ranks_per_host} does not divide the {ranks} ranks; pass a divisor")
    if args.system == "full" and parts != ranks:
        raise CliError(f"full-graph training runs in one split group (one host), but {ranks} ranks make "
                       f"{ranks // parts} hosts of {parts}; leave --ranks-per-host out or run on one host")
    cfg = TrainConfig(model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                      heads=args.heads, dropout=args.dropout, epochs=args.epochs, lr=args.lr, system=args.system,
                      seed=args.seed, max_iters=args.max_iters, eval_every=args.eval_every, device=args.device,
                      cache_size=args.cache_size,
                      prefetch=args.prefetch, uva=args.uva, ranks_per_host=parts if parts != ranks else 0,
                      checkpoint_dir=args.checkpoint or "", checkpoint_every=args.checkpoint_every,
                      resume=args.resume, resume_anyway=args.resume_anyway, recompute=args.recompute,
                      overlap=args.overlap, input_features=args.input_features)
    partitioned = SYSTEMS[args.system].partitioned and parts > 1
    if partitioned and args.partition and not (Path(args.partition) / "meta.json").exists() and not torchrun:
        check_output_folder(args.partition, "--partition")  # the map made on the fly is saved there
    guard = ResumeGuard(args, asdict(cfg), ranks, writer=not torchrun or rank == 0) if args.checkpoint else None
    if guard is not None:
        closing.callback(guard.release)
    ds = _load_dataset(args)
    if ds.train_idx.numel() == 0:
        raise CliError(f"dataset {ds.name} has no training vertices: nothing to train; check its split options "
                       f"(e.g. -D split_fractions=0.6,0.2,0.2)")
    if guard is not None:
        guard.check_dataset(ds, args.model, args.hidden, args.heads, len(fanouts), args.dropout)
    if (partitioned or args.system == "full") and parts > 1:
        _check_given_map(args.partition, ds, parts)  # every check before the build: a mistake is said at once
    _prepare_kernels()  # before partitioning and training: a first-use build is not timed as their work
    owner, cache_weights = None, None
    if args.system == "full":
        owner = _full_graph_map(args, ds, parts, torchrun)
        _check_full_graph_memory(args, ds, owner, parts)
    elif partitioned:
        pdir = Path(args.partition) if args.partition else None
        if pdir is not None and (pdir / "meta.json").exists():
            pmap = gsplit.PartitionMap.load(pdir)
            pmap.check_graph(ds.graph)
            pmap.check_world_size(parts)
            print(f"using partition map {pdir} ({pmap.method}, {pmap.num_parts} parts)")
            made_for = _map_mismatch(pmap, fanouts, args.batch_size)
            if made_for:
                print(f"gsplit: warning: partition map {pdir} {made_for}; it still works, but its split is tuned "
                      f"for other mini-batches: run `gsplit prepare` again for these settings", file=sys.stderr)
        else:
            from gsplit.partitioning import prepare_partition

            if torchrun and pdir is not None:  # many writers of one folder would race: each rank keeps its own
                print(f"no map in {pdir}: every rank makes one in memory (prepare it once with gsplit prepare "
                      f"--num-parts {parts} --out {pdir})", flush=True)
            prepared = prepare_partition(ds, parts, fanouts, args.batch_size, args.method, args.seed,
                                         args.presample_epochs, None if torchrun else pdir, progress=_say,
                                         presample_method=args.presample)
            pmap = prepared.pmap
            _print_stats(prepared.report["stats"])
            if prepared.weights is not None:
                cache_weights = prepared.weights.vertex_weights
        owner = pmap.assignment
        if cache_weights is None and pdir is not None and parse_size(cfg.cache_size):  # only a cache reads them
            cache_weights = _saved_vertex_weights(pdir, ds.graph)
        if parse_size(cfg.cache_size):
            print("feature cache ordered by " + ("pre-sampling frequency" if cache_weights is not None
                                                else "in-degree (no pre-sampling weights for this map)"))
    if guard is not None:
        guard.check_map(owner)
    hosts_text = f" = {ranks // parts} hosts x {parts}" if parts != ranks else ""
    print(f"training {args.model} with {args.system} on {ranks} rank(s){hosts_text} "
          f"({'GPUs' if torch.cuda.is_available() and args.device != 'cpu' else 'CPU processes over gloo'})",
          flush=True)
    if args.log and (not torchrun or rank == 0):  # under torchrun every rank runs this; rank 0 writes
        resumed = {} if guard is None or guard.saved is None else {"resumed_from": dict(guard.saved.counters)}
        if not args.resume:  # a new run starts the log afresh; a resumed one appends to its run's log
            Path(args.log).write_bytes(b"")
        append_jsonl(args.log, {**_run_record(args, ds, ranks, cfg), **resumed})
    report = EpochReport(args.log, _tensorboard(args))
    t = time.perf_counter()
    if torchrun:
        return _train_torchrun(args, cfg, ds, owner, cache_weights, rank, ranks, t, report)
    if ranks == 1:
        result = train_rank(0, 1, cfg, ds, owner, report, True, cache_weights)
    else:
        backend = None if args.device != "cpu" else "gloo"
        result = gsplit.launch(train_rank, ranks, args=(cfg, ds, owner, report, True, cache_weights),
                               backend=backend, timeout=args.timeout, progress_timeout=args.progress_timeout)[0]
    _finish_log(args, result, ds, t)
    _report_final(result, report)
    return 0


def _check_given_map(partition: Optional[str], ds, parts: int) -> None:
    """Refuse a ``--partition`` map made for another graph or number of parts (no-op without a saved map)."""
    import gsplit

    if partition and (Path(partition) / "meta.json").exists():
        pmap = gsplit.PartitionMap.load(partition)
        pmap.check_graph(ds.graph)
        pmap.check_world_size(parts)


def _full_graph_map(args, ds, parts: int, torchrun: bool):
    """The owner tensor for ``train --full-graph``: the map in --partition, else a new full-graph map."""
    import gsplit

    if parts == 1:
        return None
    pdir = Path(args.partition) if args.partition else None
    if pdir is not None and (pdir / "meta.json").exists():
        pmap = gsplit.PartitionMap.load(pdir)
        pmap.check_graph(ds.graph)
        pmap.check_world_size(parts)
        print(f"using partition map {pdir} ({pmap.method}, {pmap.num_parts} parts)")
    else:
        print(f"partitioning into {parts} parts for full-graph training ...", flush=True)
        pmap = gsplit.partition_full_graph(ds.graph, parts, seed=args.seed)
        if pdir is not None and not torchrun:
            pmap.save(pdir)
    _print_full_graph_stats(gsplit.full_graph_stats(ds.graph, pmap))
    return pmap.assignment


def _check_full_graph_memory(args, ds, owner, parts: int) -> None:
    """Refuse, before any rank starts, a full-graph run whose ranks cannot hold their share of the graph."""
    from gsplit.fullgraph import available_memory, estimate_memory, layer_dims
    from gsplit.nn.models import build_model
    from gsplit.partitioning import full_graph_stats

    stats = full_graph_stats(ds.graph, owner if owner is not None else torch.zeros(ds.graph.num_nodes,
                                                                                   dtype=torch.int64), parts)
    model = build_model(args.model, ds.features.shape[1], args.hidden, ds.num_classes,
                        num_layers=len(parse_fanouts(args.fanouts)), heads=args.heads)
    dims = layer_dims(model)
    on_gpu = torch.cuda.is_available() and args.device != "cpu"
    from gsplit.ops.aggregate import extension_available

    fused = not on_gpu and extension_available()
    need = [estimate_memory(stats, r, ds.features.shape[1], dims, 4, args.recompute, fused) for r in range(parts)]
    worst = max(range(parts), key=lambda r: need[r].total)
    limit = available_memory("cuda" if on_gpu else "cpu", 1 if on_gpu else parts)
    print(f"full-graph memory estimate: {need[worst].describe()} on rank {worst} "
          f"(the largest of {parts}; {'recompute' if args.recompute else 'activations kept'})", flush=True)
    if limit is not None and need[worst].total > limit:
        raise CliError(f"full-graph training needs about {need[worst].total / 2**30:.2f} GiB on rank {worst} but "
                       f"{limit / 2**30:.2f} GiB are available per rank; use more ranks, --recompute, a smaller "
                       f"--hidden, or mini-batch training (leave out --full-graph)")


def _finish_log(args, result: dict, ds, t0: float) -> None:
    """The summary record that marks the run complete (the epochs are in the log already)."""
    result["dataset"] = ds.name
    result["wall_s"] = time.perf_counter() - t0
    if args.log:
        append_jsonl(args.log, {"type": "summary", **{k: v for k, v in result.items() if k != "epochs"}})
        print(f"log written to {args.log} (JSON Lines; read it with gsplit.io.read_run_log)")


def _train_torchrun(args, cfg, ds, owner, cache_weights, rank: int, ranks: int, t0: float, report) -> int:
    """One rank of a torchrun job: same map everywhere, host groups, train, rank 0 writes the log."""
    from gsplit.comm import hosts as multihost
    from gsplit.trainer import SYSTEMS, train_rank

    if owner is not None:  # a map made or read differently on some host would split wrongly, silently
        digest = hashlib.sha256(owner.to(torch.int64).numpy().tobytes()).hexdigest()
        multihost.check_same_everywhere([digest], None, "the partition map")
    hosts = multihost.host_groups() if cfg.ranks_per_host and SYSTEMS[args.system].partitioned else None
    result = train_rank(rank, ranks, cfg, ds, owner, report if rank == 0 else None, rank == 0, cache_weights,
                        hosts=hosts)
    if rank == 0:
        _finish_log(args, result, ds, t0)
        _report_final(result, report)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    import gsplit
    from gsplit.sampling.bench import time_sampler

    ds = _load_dataset(args)
    fanouts = parse_fanouts(args.fanouts)
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    res = time_sampler(ds.graph, ds.train_idx, sampler, args.batch_size, args.batches)
    print(f"sampler: {res['ms_per_batch']:.1f} ms per batch of {args.batch_size} (median of {args.batches}), "
          f"{res['edges_per_s'] / 1e6:.2f} M sampled edges/s")
    return 0


# ---------------------------------------------------------------------------- reproduce and reuse a run
def _version_text() -> str:
    import gsplit

    return f"gsplit {gsplit.__version__} (torch {torch.__version__}, python {sys.version.split()[0]})"


def _prepare_kernels() -> None:
    """Build or load the compiled CPU kernels now, before any timed work, and say how it went, once."""
    from gsplit import ops

    if os.environ.get("GSPLIT_NO_EXTENSIONS"):
        return
    print("preparing the compiled CPU kernels (the first build takes about a minute, then they are cached) ...",
          flush=True)
    report = ops.prepare_kernels()
    if report.ready:
        state = "built" if report.seconds > 3 else "loaded from the cache"
        print(f"  compiled CPU kernels {', '.join(report.ready)} {state} in {report.seconds:.1f}s", flush=True)
    for name, reason in report.failed.items():
        print(f"gsplit: warning: compiled CPU kernel {name} is unavailable ({reason}); running the plain-torch "
              f"kernels instead (same results, slower)", file=sys.stderr, flush=True)
    if report.failed:  # the ranks (spawned: they inherit the environment) neither retry nor warn again
        os.environ["GSPLIT_SKIP_EXTENSIONS"] = ",".join(report.failed)


def _run_record(args, ds, ranks: int, cfg) -> dict:
    """The log's first record: everything needed to run it again (dataset and its options, every option,
    seeds, versions, the command line)."""
    from gsplit.model_io import json_safe, versions

    spec = ds.meta.get("load", {"name": args.dataset, "options": parse_dataset_options(args.dataset_opts)})
    return {"type": "run", "dataset": ds.name, "world_size": ranks, "config": asdict(cfg),
            "dataset_spec": json_safe(spec), "seed": cfg.seed, "options": json_safe({k: v for k, v in vars(args).items() if not callable(v)}),
            "versions": versions(), "command": "gsplit " + " ".join(sys.argv[1:])}


def _tensorboard(args):
    """``--tensorboard DIR``'s writer (checked importable before any work), or None."""
    folder = getattr(args, "tensorboard", None)
    if not folder:
        return None
    from gsplit.plot import TensorBoardWriter

    TensorBoardWriter.check_available()
    return TensorBoardWriter(folder)


def _report_final(result: dict, report: "EpochReport") -> None:
    """Print the final layer-wise accuracy (and send it to TensorBoard)."""
    accs = [f"{name} {result[f'final_{name}_acc']:.4f}" for name in ("val", "test") if f"final_{name}_acc" in result]
    if accs:
        print(f"final accuracy (layer-wise inference over the whole graph): {'  '.join(accs)}", flush=True)
    if report.tensorboard is not None:
        report.tensorboard.final(result, step=len(result.get("epochs", [])))
        report.tensorboard.close()


def _add_train_extras(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write loss, accuracy and the per-epoch time breakdown as TensorBoard scalars to DIR "
                        "(needs pip install tensorboard)")


def _add_reuse_commands(sub) -> None:
    for name, what in (("eval", "accuracy of a trained model (--checkpoint DIR) by split-parallel layer-wise "
                                "inference"),
                       ("predict", "a trained model's predictions for any vertices, written to a file")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--checkpoint", required=True, metavar="DIR",
                       help="the --checkpoint folder of a finished gsplit train run (its model.pt) or a model file")
        p.add_argument("--dataset", default=None,
                       help="dataset to run on (default: the one model.pt was trained on, with its -D options)")
        p.add_argument("-D", dest="dataset_opts", action="append", metavar="KEY=VALUE",
                       help="dataset option with --dataset, repeatable")
        if name == "eval":
            p.add_argument("--split", default="val,test",
                           help="comma-separated vertex sets to score: train, val, test, all")
            p.add_argument("--ids", metavar="FILE",
                           help="also score these vertices: .npy of ids or a boolean mask, or a text file, one id "
                                "a line")
        else:
            p.add_argument("--ids", metavar="FILE",
                           help="vertices to predict: .npy of ids or a boolean mask, or a text file, one id a line "
                                "(default: every vertex)")
            p.add_argument("--out", required=True, metavar="FILE",
                           help=".csv (vertex,prediction), .npy (predicted class per vertex of --ids) or .npz "
                                "(ids, prediction, logits)")
        p.add_argument("--num-ranks", type=int, default=None,
                       help="ranks that split the inference (default: all GPUs, else 2 CPU processes)")
        p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the layers run")
        p.add_argument("--batch-size", type=int, default=4096, help="vertices per rank per inference chunk")
        p.set_defaults(func=cmd_eval if name == "eval" else cmd_predict)
    p = sub.add_parser("plot", help="draw a run log's loss, accuracy and per-epoch time breakdown to a PNG")
    p.add_argument("log", help="the run log of gsplit train --log")
    p.add_argument("--out", default=None, help="PNG file (default: the log's path with .png)")
    p.set_defaults(func=cmd_plot)


def _read_ids(path: str, num_nodes: int) -> torch.Tensor:
    from gsplit.graph import as_vertex_ids
    from gsplit.io import load_npy

    if not Path(path).is_file():
        raise CliError(f"--ids {path}: no such file")
    if path.endswith(".npy"):
        arr = load_npy(Path(path), "pass a .npy of vertex ids or a boolean mask")
    else:
        try:
            arr = np.loadtxt(path, dtype=np.int64, ndmin=1)
        except ValueError as e:
            raise CliError(f"--ids {path}: not one integer vertex id a line ({e})") from e
    return as_vertex_ids(torch.from_numpy(np.asarray(arr)), num_nodes, f"--ids {path}")


def _model_and_dataset(args):
    from gsplit import datasets
    from gsplit.model_io import describe, load_model
    from gsplit.predict import check_model_fits

    mf = load_model(args.checkpoint)
    print(f"model {args.checkpoint}: {describe(mf)}", flush=True)
    if args.dataset is not None:
        ds = _load_dataset(args)
    else:
        if args.dataset_opts:
            raise CliError("-D needs --dataset (without it the dataset and options come from model.pt)")
        spec = mf.dataset
        if not spec.get("name"):
            raise CliError(f"{args.checkpoint} does not say which dataset it was trained on; pass --dataset")
        print(f"loading dataset {spec['name']} {spec.get('options') or ''} (from model.pt)".rstrip(), flush=True)
        ds = datasets.load(spec["name"], **spec.get("options", {}))
    check_model_fits(mf.spec, ds, warn=False)  # before the kernels are prepared (evaluate_model warns)
    return mf, ds


def _run_inference(args, ds, id_sets, predict_ids=None):
    from gsplit.predict import evaluate_model

    ranks = args.num_ranks or default_num_ranks()
    _prepare_kernels()
    print(f"layer-wise inference on {ranks} rank(s)", flush=True)
    path = args.checkpoint if not Path(args.checkpoint).is_dir() else str(Path(args.checkpoint) / "model.pt")
    return evaluate_model(path, ds, id_sets, predict_ids, num_ranks=ranks, device=args.device,
                          batch_size=args.batch_size)


def cmd_eval(args) -> int:
    mf, ds = _model_and_dataset(args)
    all_sets = {"train": ds.train_idx, "val": ds.val_idx, "test": ds.test_idx,
                "all": torch.arange(ds.num_nodes)}
    names = [s.strip() for s in args.split.split(",") if s.strip()]
    bad = [s for s in names if s not in all_sets]
    if bad:
        raise CliError(f"--split {args.split}: unknown set(s) {bad}; use train, val, test, all")
    id_sets = {s: all_sets[s] for s in names}
    if args.ids:
        id_sets[args.ids] = _read_ids(args.ids, ds.num_nodes)
    empty = [s for s, ids in id_sets.items() if not ids.numel()]
    if len(empty) == len(id_sets):
        raise CliError(f"every vertex set asked for is empty ({empty}) on dataset {ds.name}")
    res = _run_inference(args, ds, id_sets)
    for name, ids in id_sets.items():
        text = f"{res.accuracy[name]:.4f}" if name in res.accuracy else "(empty set)"
        print(f"{name} accuracy {text}  ({ids.numel()} vertices)")
    print(f"({res.seconds:.1f}s)")
    return 0


def cmd_predict(args) -> int:
    out = Path(args.out)
    if out.suffix not in (".csv", ".npy", ".npz"):
        raise CliError(f"--out {args.out}: write .csv, .npy or .npz")
    check_writable(out, "--out file")
    mf, ds = _model_and_dataset(args)
    ids = _read_ids(args.ids, ds.num_nodes) if args.ids else torch.arange(ds.num_nodes)
    res = _run_inference(args, ds, {}, predict_ids=ids)
    logits = res.predictions
    pred = logits.argmax(1)
    from gsplit.io import atomic_write_bytes

    if out.suffix == ".csv":
        atomic_write_bytes(out, "vertex,prediction\n" + "".join(f"{v},{p}\n" for v, p in zip(ids.tolist(), pred.tolist())))
    else:
        import io

        buf = io.BytesIO()
        if out.suffix == ".npy":
            np.save(buf, pred.numpy())
        else:
            np.savez(buf, ids=ids.numpy(), prediction=pred.numpy(), logits=logits.numpy())
        atomic_write_bytes(out, buf.getvalue())
    print(f"predictions of {ids.numel()} vertices written to {out} ({res.seconds:.1f}s)")
    return 0


def cmd_plot(args) -> int:
    from gsplit.plot import plot_run

    src = Path(args.log)
    if not src.is_file():
        raise CliError(f"{args.log}: no such run log (write one with gsplit train --log FILE)")
    out = Path(args.out) if args.out else src.with_suffix(".png")
    check_writable(out, "--out file")
    panels = plot_run(src, out)
    print(f"{', '.join(panels)} of {src} drawn to {out}")
    return 0


# Help for the options whose add_argument has none (kept apart so that the option lines stay short).
_HELP = {
    "seed": "seed of the model's initialisation, the global order of the targets and the sampler",
    "method": "partition method: gsplit (pre-sampled weights + METIS), node, edge or random",
    "model": "GNN model", "hidden": "hidden features per layer", "heads": "attention heads of GAT's hidden layers",
    "dropout": "dropout between layers (vertex-keyed: split training equals one process)",
    "epochs": "passes over the training vertices", "lr": "Adam learning rate",
    "system": "split (gsplit's split parallelism) or dp (the data-parallel baseline)",
    "device": "auto (this rank's GPU when there is one, else CPU), cpu or cuda",
    "partition": "partition folder (gsplit prepare --out)", "fanouts": "fanouts (default: the map's)",
    "num_batches": "mini-batches to measure", "batches": "mini-batches to time",
}


def _document_defaults(parser: argparse.ArgumentParser) -> None:
    """Give every option of every subcommand a help line that shows its default (argparse's %(default)s)."""
    parsers = [parser] + [a.choices[name] for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                          for name in a.choices]
    for p in parsers:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if action.help is None:
                action.help = _HELP.get(action.dest)
            if action.help is None or action.help == argparse.SUPPRESS:
                continue
            if action.required:
                if "required" not in action.help:
                    action.help += " (required)"
            elif "default" not in action.help:
                default = action.default
                shown = "off" if default is False else ("none" if default is None else "%(default)s")
                action.help += f" (default: {shown})"


# ---------------------------------------------------------------------------- entry point
class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is a :class:`CliError` (one line, exit 2) like every other user mistake."""

    def error(self, message):
        raise CliError(message)


def _positive(v) -> bool:
    return v >= 1


def _non_negative(v) -> bool:
    return v >= 0


def _finite_positive(v) -> bool:
    return math.isfinite(v) and v > 0


def _finite_non_negative(v) -> bool:
    return math.isfinite(v) and v >= 0


# Every numeric option, checked in this process before any data is loaded or any rank starts.
_NUMBER_RULES = {
    "batch_size": (_positive, "must be positive"),
    "num_parts": (_positive, "must be positive"),
    "presample_epochs": (_positive, "must be positive"),
    "hidden": (_positive, "must be positive"),
    "heads": (_positive, "must be positive"),
    "num_batches": (_positive, "must be positive"),
    "batches": (_positive, "must be positive"),
    "epochs": (_non_negative, "must be >= 0"),
    "num_ranks": (_positive, "must be >= 1 (leave it out for all GPUs, else 2 CPU ranks)"),
    "max_iters": (_non_negative, "must be >= 0 (0: whole epochs)"),
    "eval_every": (_non_negative, "must be >= 0 (0: no evaluation)"),
    "seed": (_non_negative, "must be >= 0"),
    "lr": (_finite_positive, "must be a positive finite number"),
    "dropout": (lambda v: 0 <= v < 1, "must be in [0, 1) (a probability of dropping; 1 would drop everything)"),
    "timeout": (_finite_positive, "must be a positive finite number of seconds"),
    "progress_timeout": (_finite_non_negative, "must be a finite number of seconds >= 0 (0 disables it)"),
    "checkpoint_every": (_non_negative, "must be >= 0 (0: at the end of every epoch)"),
    "ranks_per_host": (_non_negative, "must be >= 0 (0: one host)"),
}


def check_numbers(args) -> None:
    """Raise :class:`CliError` for the first numeric option outside its range (NaN included)."""
    for name, (ok, rule) in _NUMBER_RULES.items():
        value = getattr(args, name, None)
        if value is not None and not ok(value):
            raise CliError(f"--{name.replace('_', '-')} {rule}, got {value}")
    if isinstance(getattr(args, "fanouts", None), str):
        parse_fanouts(args.fanouts)
    if getattr(args, "resume", False) and not getattr(args, "checkpoint", None):
        raise CliError("--resume needs --checkpoint DIR: the folder to resume from")
    if getattr(args, "uva", False) and (args.device == "cpu" or not torch.cuda.is_available()):
        raise CliError("--uva samples a pinned host graph from the GPUs, but "
                       + ("--device is cpu" if args.device == "cpu" else "this machine has no CUDA GPU")
                       + "; leave --uva out")
    if getattr(args, "cache_size", None) is not None:
        from gsplit.feature_store import parse_size
        parse_size(args.cache_size)


def build_parser() -> argparse.ArgumentParser:
    # the choices come from the library's own lists, so a new method, model or system appears here by itself
    from gsplit.nn.models import MODELS
    from gsplit.partitioning.metis import METHODS
    from gsplit.trainer import SYSTEMS

    parser = _Parser(prog="gsplit", description="split-parallel GNN training")
    parser.add_argument("-v", "--verbose", action="store_true", help="log library messages")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", required=True)

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
    from gsplit.partitioning.metis import METIS_BOUNDS_WHEN_SHORT, METIS_EDGES_PER_VERTEX

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
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train a GNN with split (or data) parallelism")
    _add_dataset_args(p)
    _add_sampling_args(p)
    p.add_argument("--model", default="sage", choices=sorted(MODELS))
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--num-ranks", type=int, default=None, help="ranks (default: all GPUs, else 2 CPU processes)")
    p.add_argument("--system", default="split", choices=sorted(SYSTEMS))
    p.add_argument("--partition", help="partition folder; prepared on the fly (and saved here) when absent")
    p.add_argument("--method", default="gsplit", choices=METHODS)
    _add_presample_args(p)
    p.add_argument("--max-iters", type=int, default=0, help="stop each epoch after this many iterations")
    p.add_argument("--eval-every", type=int, default=1,
                   help="validation/test accuracy every this many epochs (default 1; 0: no evaluation at all, "
                        "also no final layer-wise evaluation: for timing runs)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--cache-size", default="0",
                   help="split: device memory per rank for its hottest owned features, e.g. 10G or 512M "
                        "(default 0: no cache); ordered by the partition folder's vertex_weights.npy, else in-degree")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="save checkpoints (model, optimiser, position, RNG) here, atomically, and the trained model "
                        "as DIR/model.pt at the end")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="a checkpoint every N iterations (default 0: at the end of every epoch)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint DIR; the remaining steps equal an "
                        "uninterrupted run's")
    p.add_argument("--resume-anyway", action="store_true",
                   help="with --resume: continue also when settings differ from the checkpoint's in a way that "
                        "changes the remaining steps (a new --lr is applied); a model that does not fit is still "
                        "refused")
    p.add_argument("--prefetch", action="store_true",
                   help="split: sample and load the next mini-batch in a background thread while one trains")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="split: overlapped layers: compute the rows other ranks need first and shuffle them while "
                        "the rest of the layer computes (forward and backward); same results up to rounding; "
                        "--no-overlap: a blocking shuffle before every layer (default: on for sage and gcn, off "
                        "for gat, as measured on CPU ranks)")
    p.add_argument("--input-features", choices=("auto", "direct", "shuffle"), default="auto",
                   help="split: how a rank gets its first layer's input rows: 'shuffle' loads the rows it owns and "
                        "sends them where they are needed (each row loaded once: GPUs, caches); 'direct' reads every "
                        "row it needs from the feature table every rank holds (no bottom id exchange, no feature "
                        "shuffle); auto (default): direct for CPU ranks without a cache, else shuffle")
    p.add_argument("--uva", action="store_true",
                   help="GPUs: keep the graph in host memory, pinned once per host, and sample it from the GPUs "
                        "(UVA) instead of copying it to every GPU; for graphs too large for each GPU")
    p.add_argument("--full-graph", action="store_true",
                   help="full-graph training, split-parallel: every epoch one step over all vertices and all "
                        "in-edges (the loss over the training vertices); --fanouts gives the number of layers only; "
                        "the map is --partition's or a new full-graph one (gsplit prepare --full-graph)")
    p.add_argument("--recompute", action="store_true",
                   help="recompute every layer in backward instead of keeping its intermediates (less memory)")
    # --log-file: under torchrun, whose own parser takes --log for an ambiguous abbreviation of its --log-dir
    p.add_argument("--log", "--log-file", dest="log",
                   help="append every number here as JSON Lines, one record per epoch as it finishes (read with "
                        "gsplit.io.read_run_log); alias --log-file, since torchrun's own parser takes --log")
    p.add_argument("--launcher", default="auto", choices=["auto", "gsplit", "torchrun"],
                   help="auto (default): join the torchrun job when torchrun started this process, else start "
                        "--num-ranks ranks on this host")
    p.add_argument("--ranks-per-host", type=int, default=0,
                   help="split: ranks of one split group (host); hosts are data-parallel replicas. Set from "
                        "LOCAL_WORLD_SIZE under torchrun; with the gsplit launcher it simulates hosts")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds a collective may wait before the job fails (default 1800, as DDP)")
    p.add_argument("--progress-timeout", type=float, default=600,
                   help="stop the job when a rank made no training progress for this many seconds and name it "
                        "(default 600; 0 disables)")
    _add_train_extras(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("stats", help="cross-split edges and load imbalance of a partition map")
    _add_dataset_args(p)
    p.add_argument("--partition", required=True)
    p.add_argument("--fanouts", default=None)
    p.add_argument("--batch-size", type=int, default=None, help="targets per rank (default: the map's)")
    p.add_argument("--num-batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the stats here")
    p.add_argument("--full-graph", action="store_true",
                   help="full-graph statistics (cut edges, halo rows per rank, balance); the default for a map "
                        "made with prepare --full-graph")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("bench", help="time the sampler on a dataset")
    _add_dataset_args(p)
    _add_sampling_args(p)
    p.add_argument("--batches", type=int, default=20)
    p.set_defaults(func=cmd_bench)
    _add_reuse_commands(sub)
    _document_defaults(parser)
    return parser


def _values_that_look_like_options(argv: List[str]) -> List[str]:
    """``--fanouts -1,5`` as ``--fanouts=-1,5``: argparse takes a value starting with ``-`` for an option
    unless it is a plain negative number, and -1 (all neighbours) is a documented fanout."""
    out: List[str] = []
    it = iter(argv)
    for a in it:
        if a == "--fanouts":
            value = next(it, None)
            if value is not None and value.startswith("-") and value[1:2].isdigit():
                out.append(f"--fanouts={value}")
                continue
            out.append(a)
            if value is not None:
                out.append(value)
            continue
        out.append(a)
    return out


def _stop_on_signal(signum, frame):
    from gsplit.launch import LaunchInterrupted as Stop

    raise Stop(signum)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = _values_that_look_like_options(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except CliError as e:
        print(f"gsplit: error: {e} (see gsplit --help)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    previous = {}
    if _in_main_thread():  # SIGTERM/SIGHUP anywhere (loading, METIS, a save) exit 128 + signal, cleanly
        for s in (getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)):
            previous[s] = signal.signal(s, _stop_on_signal)
    try:
        check_numbers(args)
        return args.func(args)
    except (CliError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"gsplit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gsplit: interrupted", file=sys.stderr)
        return 130
    except LaunchInterrupted as e:  # SIGTERM / SIGHUP: the ranks are already stopped
        print(f"gsplit: {e}", file=sys.stderr)
        return e.code
    except (RuntimeError, FloatingPointError, OSError) as e:  # LaunchError and friends name the failing rank
        # a full disk or a vanished folder, here or in a rank: one line with the file and the fix, no traceback
        print(f"gsplit: error: {file_error_line(e) or e}", file=sys.stderr)
        return 1
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
