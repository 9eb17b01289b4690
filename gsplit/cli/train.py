"""``gsplit train``: train a GNN with split (or data) parallelism, on ranks this command starts or as one
rank of a torchrun job; checkpoints and their resume checks, the run log and the final report."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from gsplit.cli.common import (_load_dataset, _prepare_kernels, _print_full_graph_stats, _print_stats, _say,
                               check_output_folder, default_num_ranks)
from gsplit.cli.options import (CliError, _add_dataset_args, _add_presample_args, _add_sampling_args,
                                check_dataset_options, layer_fanouts, parse_dataset_options, parse_fanouts)
from gsplit.cli.report import EpochReport, tensorboard_writer
from gsplit.cli.full_hosts import (add_co_batch_args, add_host_mode_args, check_co_batch_args, check_co_batch_count,
                                   check_host_map, check_host_mode, co_batch_config, host_mode_config)
from gsplit.runtime.io import append_jsonl, check_writable, trim_run_log


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
    from gsplit.runtime.io import load_npy
    from gsplit.partitioning.weights import PresampleWeights

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
        from gsplit.run.checkpoint import CheckpointLock, prepare_checkpoint_dir

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
        from gsplit.run.checkpoint import load_checkpoint, remove_leftovers
        from gsplit.run.resume import compare_runs, run_record

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
        if latest.run.get("task") == "link":
            raise CliError(f"the checkpoint in {folder} ({where}) is a link prediction run's; resume it with "
                           "gsplit train --task link")
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
        from gsplit.run.resume import compare_runs, run_record

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
            from gsplit.run.resume import compare_runs, run_record

            saved = {k: v for k, v in self.saved.run.items() if k in ("partition",)}
            self._decide(compare_runs(saved, {"partition": run_record({}, 0, None, owner)["partition"]}))


def cmd_train(args) -> int:
    with contextlib.ExitStack() as closing:  # the checkpoint folder's lock, released however the run ends
        return _train(args, closing)


def _train(args, closing: contextlib.ExitStack) -> int:
    import gsplit
    from gsplit.data.feature_store import parse_size
    from gsplit.launcher.torchrun import init_from_env, started_by_torchrun
    from gsplit.run.systems import SYSTEMS
    from gsplit.run.model_io import check_model_spec
    from gsplit.run.trainer import TrainConfig, model_spec, train_rank

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda but CUDA is not available here (no GPU or a CPU-only torch); use --device cpu "
                       "or auto")
    if args.task == "link":  # link prediction: its own module (gsplit.cli.train_link)
        from gsplit.cli.train_link import cmd_train_link

        return cmd_train_link(args)
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
    torchrun = args.launcher == "torchrun" or (args.launcher == "auto" and started_by_torchrun())
    if torchrun:
        # torchrun started this process as one rank of the job: join it instead of spawning ranks
        device = init_from_env(args.device)
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
    args.fanouts = layer_fanouts(args.fanouts, args.layers, args.system == "full")
    fanouts = parse_fanouts(args.fanouts)
    if args.system == "full":
        fanouts = [-1] * len(fanouts)  # every in-edge: --fanouts gives the number of layers only
    ranks = ranks if torchrun else (args.num_ranks or default_num_ranks())
    parts = args.ranks_per_host or ranks  # one split group per host: the map has a part per rank of a host
    if ranks % parts:
        raise CliError(f"--ranks-per-host {args.ranks_per_host} does not divide the {ranks} ranks; pass a divisor")
    map_parts = check_host_mode(args, ranks, parts, torchrun)  # full-graph: parts of the map (ranks or hosts)
    check_co_batch_args(args)
    cfg = TrainConfig(model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                      heads=args.heads, dropout=args.dropout, epochs=args.epochs, lr=args.lr, system=args.system,
                      seed=args.seed, max_iters=args.max_iters, eval_every=args.eval_every, device=args.device,
                      cache_size=args.cache_size,
                      prefetch=args.prefetch, uva=args.uva, ranks_per_host=parts if parts != ranks else 0,
                      checkpoint_dir=args.checkpoint or "", checkpoint_every=args.checkpoint_every,
                      resume=args.resume, resume_anyway=args.resume_anyway, recompute=args.recompute,
                      overlap=args.overlap, input_features=args.input_features, macrobatch=args.macrobatch,
                      precision=args.precision, keep_epochs=1,  # every record goes to the log as its epoch ends
                      **host_mode_config(args), **co_batch_config(args))  # (memory stays flat)
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
    # before anything builds the model: a folder's meta.json with 10**10 classes, or a --hidden too large
    where, fix = _model_source(ds)
    check_model_spec(model_spec(cfg, ds), where, fix=fix)
    if guard is not None:
        guard.check_dataset(ds, args.model, args.hidden, args.heads, len(fanouts), args.dropout)
    if args.system == "full" and args.host_mode == "preload":
        check_host_map(args.partition, ds, map_parts, ranks)
    elif args.system == "full" and map_parts > 1:
        _check_given_map(args.partition, ds, map_parts)
    elif partitioned:
        _check_given_map(args.partition, ds, parts)  # every check before the build: a mistake is said at once
    _prepare_kernels()  # before partitioning and training: a first-use build is not timed as their work
    owner, cache_weights = None, None
    if args.system == "full":
        owner = _full_graph_map(args, ds, map_parts, torchrun)
        check_co_batch_count(args, ds, owner, map_parts)
        if args.host_mode != "preload":  # preload: each host's loader checks its share (the halo is known there)
            _check_full_graph_memory(args, ds, owner, map_parts)
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
        else:  # less what it logs again: every epoch is in the log exactly once, however the run stopped
            trim_run_log(args.log, int(resumed.get("resumed_from", {}).get("epoch", 0)))
        append_jsonl(args.log, {**_run_record(args, ds, ranks, cfg), **resumed})
    report = EpochReport(args.log, tensorboard_writer(args))
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


def _model_source(ds):
    """``(where, fix)`` of a model check: a dataset folder's meta.json (it gives the classes), else the options."""
    folder = ds.meta.get("folder")
    options = "or pass a smaller --hidden, --heads or fewer --fanouts"
    if folder:
        return f"{Path(folder) / 'meta.json'}", f"check its num_classes (a damaged or hand-edited file?) {options}"
    return f"dataset {ds.name!r} with these options", "pass a smaller --hidden, --heads or fewer --fanouts"


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
        what = "hosts (one part per host)" if args.host_mode == "preload" else "parts"
        print(f"partitioning into {parts} {what} for full-graph training ...", flush=True)
        pmap = gsplit.partition_full_graph(ds.graph, parts, seed=args.seed)
        if pdir is not None and not torchrun:
            pmap.save(pdir)
    _print_full_graph_stats(gsplit.full_graph_stats(ds.graph, pmap))
    return pmap.assignment


def _check_full_graph_memory(args, ds, owner, parts: int) -> None:
    """Refuse, before any rank starts, a full-graph run whose ranks cannot hold their share of the graph."""
    from gsplit.fullgraph.loader import available_memory, estimate_memory, layer_dims
    from gsplit.nn.models import build_model
    from gsplit.partitioning import full_graph_stats

    stats_owner = owner if owner is not None else torch.zeros(ds.graph.num_nodes, dtype=torch.int64)
    stats = full_graph_stats(ds.graph, stats_owner, parts)
    model = build_model(args.model, ds.features.shape[1], args.hidden, ds.num_classes,
                        num_layers=len(parse_fanouts(args.fanouts)), heads=args.heads)
    dims = layer_dims(model)
    on_gpu = torch.cuda.is_available() and args.device != "cpu"
    from gsplit.ops.aggregate import extension_available

    fused = not on_gpu and extension_available()
    need = [estimate_memory(stats, r, ds.features.shape[1], dims, 4, args.recompute, fused) for r in range(parts)]
    worst = max(range(parts), key=lambda r: need[r].total)
    if args.memory_limit is not None:
        from gsplit.data.feature_store import parse_size

        limit = parse_size(args.memory_limit, "--memory-limit")
    else:
        limit = available_memory("cuda" if on_gpu else "cpu", 1 if on_gpu else parts)
    print(f"full-graph memory estimate: {need[worst].describe()} on rank {worst} "
          f"(the largest of {parts}; {'recompute' if args.recompute else 'activations kept'})", flush=True)
    if args.co_batches is not None and args.co_batches > 1:
        print(f"full-graph training in {args.co_batches} co-batches (--co-batches)", flush=True)
        return
    if limit is not None and need[worst].total > limit and args.co_batches is None:
        from gsplit.fullgraph.cobatch import co_batch_estimate

        # the smallest co-batches hold one target each: the one of the target with most in-edges must fit
        train = ds.train_idx.to(torch.int64)
        widest = train[ds.graph.in_degrees()[train].argmax()].view(1)
        one = co_batch_estimate(ds.graph, widest, stats_owner, parts, len(dims), ds.features.shape[1], dims,
                                dtype_bytes=4, recompute=args.recompute, fused_attention=fused)
        if one.total > limit:
            raise CliError(f"full-graph training needs about {need[worst].total / 2**30:.2f} GiB on rank {worst}, and "
                           f"even a co-batch of one target (vertex {int(widest)}) {one.total / 2**30:.4f} GiB, but "
                           f"{limit / 2**30:.4f} GiB are available per rank; use more ranks, --recompute, a smaller "
                           f"--hidden, or mini-batch training (leave out --full-graph)")
        print(f"the whole graph does not fit the {limit / 2**20:.1f} MiB per rank: the ranks train it in co-batches "
              "(the count is printed with the first epoch)", flush=True)
        return
    if limit is not None and need[worst].total > limit:
        raise CliError(f"full-graph training needs about {need[worst].total / 2**30:.2f} GiB on rank {worst} but "
                       f"{limit / 2**30:.2f} GiB are available per rank; use more ranks, co-batches (leave out "
                       f"--co-batches 1), --recompute, a smaller --hidden, or mini-batch training")


def _finish_log(args, result: dict, ds, t0: float) -> None:
    """The summary record that marks the run complete (the epochs are in the log already)."""
    result["dataset"] = ds.name
    result["wall_s"] = time.perf_counter() - t0
    if args.log:
        append_jsonl(args.log, {"type": "summary", **{k: v for k, v in result.items() if k != "epochs"}})
        print(f"log written to {args.log} (JSON Lines; read it with gsplit.runtime.io.read_run_log)")


def _train_torchrun(args, cfg, ds, owner, cache_weights, rank: int, ranks: int, t0: float, report) -> int:
    """One rank of a torchrun job: same map everywhere, host groups, train, rank 0 writes the log."""
    from gsplit.comm import hosts as multihost
    from gsplit.run.systems import SYSTEMS
    from gsplit.run.trainer import train_rank

    if owner is not None:  # a map made or read differently on some host would split wrongly, silently
        digest = hashlib.sha256(owner.to(torch.int64).numpy().tobytes()).hexdigest()
        multihost.check_same_everywhere([digest], None, "the partition map")
    hosts = multihost.host_groups() if cfg.ranks_per_host and SYSTEMS[args.system].splits_by_host(cfg) else None
    result = train_rank(rank, ranks, cfg, ds, owner, report if rank == 0 else None, rank == 0, cache_weights,
                        hosts=hosts)
    if rank == 0:
        _finish_log(args, result, ds, t0)
        _report_final(result, report)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def _run_record(args, ds, ranks: int, cfg) -> dict:
    """The log's first record: everything needed to run it again (dataset and its options, every option,
    seeds, versions, the command line)."""
    from gsplit.run.model_io import json_safe, versions

    spec = ds.meta.get("load", {"name": args.dataset, "options": parse_dataset_options(args.dataset_opts)})
    return {"type": "run", "dataset": ds.name, "world_size": ranks, "config": asdict(cfg),
            "dataset_spec": json_safe(spec), "seed": cfg.seed, "options": json_safe({k: v for k, v in vars(args).items() if not callable(v)}),
            "versions": versions(), "command": "gsplit " + " ".join(sys.argv[1:])}


def _report_final(result: dict, report: "EpochReport") -> None:
    """Print the final layer-wise accuracy (and send it to TensorBoard)."""
    accs = [f"{name} {result[f'final_{name}_acc']:.4f}" for name in ("val", "test") if f"final_{name}_acc" in result]
    if accs:
        print(f"final accuracy (layer-wise inference over the whole graph): {'  '.join(accs)}", flush=True)
    if report.tensorboard is not None:
        epochs = result.get("epochs") or [{"epoch": -1}]  # the run keeps its last record only (keep_epochs)
        report.tensorboard.final(result, step=int(epochs[-1]["epoch"]) + 1)
        report.tensorboard.close()


def _add_train_extras(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write loss, accuracy and the per-epoch time breakdown as TensorBoard scalars to DIR "
                        "(needs pip install tensorboard)")


def add_parser(sub) -> None:
    """``gsplit train``'s options."""
    # the choices come from the library's own lists, so a new method, model or system appears here by itself
    from gsplit.nn.models import MODELS
    from gsplit.partitioning.strategies import METHODS
    from gsplit.run.systems import SYSTEMS

    p = sub.add_parser("train", help="train a GNN with split (or data) parallelism")
    _add_dataset_args(p)
    _add_sampling_args(p)
    p.set_defaults(fanouts=None)  # 15,10,5 unless --layers says otherwise (layer_fanouts)
    p.add_argument("--model", default="sage", choices=sorted(MODELS),
                   help="GNN model; deep-sage and deep-gcn are deep residual models (DeeperGCN res+ blocks with "
                        "LayerNorm) for tens of layers, e.g. --model deep-sage --layers 28")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="layers of the model (default: one per fanout); --fanouts then holds one fanout for every "
                        "layer (e.g. --fanouts 5) or N of them; full-graph training needs no --fanouts")
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
                   help="device memory per rank for its hottest features (split: owned ones; dp: any), e.g. 10G "
                        "or 512M (default 0: no cache); ordered by the partition folder's vertex_weights.npy, else "
                        "in-degree")
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
    p.add_argument("--macrobatch", type=int, default=1, metavar="B",
                   help="split and dp: sample B consecutive mini-batches together, exchange their ids and load the "
                        "union of their input rows once, then train on them one by one (the same steps as B = 1; "
                        "lowered with a warning where B does not fit in memory); default 1")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="mixed precision: the layers under torch.autocast in bfloat16 or float16 (fp16 with a "
                        "gradient scaler; skipped steps alike on every rank), weights and optimiser in float32; "
                        "default fp32")
    p.add_argument("--uva", action="store_true",
                   help="GPUs: keep the graph in host memory, pinned (in place once per host; a memory-mapped graph "
                        "as a pinned copy per rank), and sample it from the GPUs (UVA) instead of copying it to every "
                        "GPU; for graphs too large for each GPU")
    p.add_argument("--full-graph", action="store_true",
                   help="full-graph training, split-parallel: every epoch one step over all vertices and all "
                        "in-edges (the loss over the training vertices); --fanouts gives the number of layers only; "
                        "the map is --partition's or a new full-graph one (gsplit prepare --full-graph)")
    add_host_mode_args(p)
    add_co_batch_args(p)
    p.add_argument("--recompute", action="store_true",
                   help="recompute every layer in backward instead of keeping its intermediates (less memory)")
    # --log-file: under torchrun, whose own parser takes --log for an ambiguous abbreviation of its --log-dir
    p.add_argument("--log", "--log-file", dest="log",
                   help="append every number here as JSON Lines, one record per epoch as it finishes (read with "
                        "gsplit.runtime.io.read_run_log); alias --log-file, since torchrun's own parser takes --log")
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
    from gsplit.cli.train_link import add_link_args

    add_link_args(p)
    p.set_defaults(func=cmd_train)
