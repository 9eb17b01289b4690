"""The training harness shared by ``gsplit train`` and the experiments: one function per rank.

The same loop trains with split parallelism (``system="split"``, :class:`gsplit.DataLoader`), data
parallelism (``system="dp"``, :class:`gsplit.baselines.DataParallelLoader`) or full-graph split
parallelism (``system="full"``, :class:`gsplit.FullGraphLoader`): same models, same data, same
launcher, same counters. Every number in the returned log comes from the code path itself. What differs
between the systems is :mod:`gsplit.run.systems`; the counters and their balance over ranks :mod:`gsplit.run.counters`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch
from tqdm.auto import tqdm

from gsplit.run.divergence import LossWatch
from gsplit.run.checkpoint import load_checkpoint, prepare_checkpoint_dir, rng_state, save_checkpoint, set_rng_state
from gsplit.comm.communicator import Communicator, TrafficCounter
from gsplit.comm.gradients import GRADIENT_TAG, allreduce_gradients, global_sum
from gsplit.comm.hosts import group_ranks, host_groups
from gsplit.fullgraph.cobatch import same_step
from gsplit.fullgraph.hosts import check_halo_options
from gsplit.run.counters import (EpochCounters, _book_layer_time, _book_train_time, _collective_seconds, _faults_between,
                             _sum_tags, iteration_balance)
from gsplit.data.feature_store import parse_size
from gsplit.data.precision import autocast_dtype
from gsplit.run.amp import MixedPrecision
from gsplit.data.graph import Graph
from gsplit.interop.dgl import SPLIT_FIX  # imports no dgl
from gsplit.run.model_io import check_model_spec, save_model
from gsplit.minibatch.inference import accuracy, layerwise_inference
from gsplit.launcher import report_progress, resolve_device
from gsplit.nn.models import build_model
from gsplit.runtime.resources import keep_freed_heap, minor_page_faults
from gsplit.run.resume import run_record
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.run.systems import SYSTEMS
from gsplit.runtime.timing import LayerClock, StepTimer, timed_step

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Everything one training run needs besides the data and the partition map."""

    model: str = "sage"
    """``sage``, ``gat``, ``gcn``, or the deep residual ``deep-sage`` / ``deep-gcn`` (:data:`gsplit.nn.MODELS`)."""
    fanouts: List[int] = field(default_factory=lambda: [15, 10, 5])
    """Neighbours per layer from the input layer up (also fixes the number of layers)."""
    batch_size: int = 1024
    """Targets per rank per iteration (DGL's ``use_ddp=True`` meaning)."""
    hidden: int = 128
    """Hidden feature size."""
    heads: int = 4
    """Attention heads of GAT's hidden layers."""
    dropout: float = 0.5
    """Dropout between layers."""
    epochs: int = 3
    """Passes over the training targets."""
    lr: float = 0.003
    """Adam learning rate."""
    system: str = "split"
    """``split`` (gsplit), ``dp`` (data-parallel baseline) or ``full`` (full-graph training, split-parallel)."""
    seed: int = 0
    """Seed of the model's initialisation, the global order and the sampler."""
    eval_every: int = 1
    """Evaluate validation/test accuracy every this many epochs (0: never)."""
    max_iters: int = 0
    """Stop each epoch after this many iterations (0: whole epoch); for quick benchmarks."""
    device: str = "auto"
    """``auto`` (this rank's GPU when there is one, else CPU), ``cpu`` or ``cuda``."""
    log_iterations: bool = True
    """Keep every iteration's counters in the log (``ranks[r]["per_iteration"]``), not only epoch sums."""
    cache_size: str = "0"
    """Split only: device memory per rank for the cache of its hottest owned input features (``"10G"``,
    ``"512M"``, bytes; ``"0"``: none)."""
    prefetch: bool = False
    """Split only: sample and load the next mini-batch in a background thread while one trains."""
    uva: bool = False
    """On GPUs: keep the graph in host memory, pinned in place once per host, and sample it from the GPUs
    through UVA, instead of a whole copy of it on every GPU (26 GB each at Papers100M scale)."""
    final_eval: bool = True
    """After the last epoch, compute validation/test accuracy by layer-wise full-graph inference (all
    in-edges, no sampling): ``final_val_acc`` / ``final_test_acc`` in the run log. Skipped when
    ``eval_every`` is 0 (never evaluate)."""
    ranks_per_host: int = 0
    """Split only, several hosts: the ranks of one host (its split group, ``G``); hosts are data-parallel
    replicas of each other and ``batch_size * world_size`` targets make one global mini-batch. ``0``:
    every rank is in one split group. ``gsplit train`` under torchrun sets it to ``LOCAL_WORLD_SIZE``;
    with ``gsplit.launch`` on one machine it simulates hosts (consecutive blocks of ranks)."""
    checkpoint_dir: str = ""
    """Folder for checkpoints (model, optimiser, position, counters, RNG; see :mod:`gsplit.run.checkpoint`) and,
    at the end, the trained model (``model.pt``); ``""``: none."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many iterations (0: at the end of every epoch), when ``checkpoint_dir``."""
    resume: bool = False
    """Continue from the newest checkpoint in ``checkpoint_dir`` (a fresh start when there is none): the
    remaining steps are those an uninterrupted run takes."""
    resume_anyway: bool = False
    """With ``resume``: continue also when the run's settings differ from the checkpoint's in a way that
    changes the remaining steps (``gsplit train --resume-anyway``); a new ``lr`` is then applied to the
    restored optimiser. The CLI checks the differences before any rank starts (:mod:`gsplit.run.resume`)."""
    max_loss: float = 1e4
    """Stop the run when a rank's loss on an iteration exceeds this (cross-entropy of a sane model is
    around ln(classes): this much means the model diverged, e.g. a too large ``lr``); a non-finite loss
    always stops it. 0: only non-finite losses stop it."""
    recompute: bool = False
    """Recompute every layer in backward instead of keeping its intermediates (:func:`gsplit.recompute_layers`):
    less memory, more compute; for full-graph training above all."""
    overlap: Optional[bool] = None
    """Split only: overlapped layers (:mod:`gsplit.minibatch.overlap`): each layer computes the rows other ranks need
    first and shuffles them while it computes the rest, forward and backward; same results up to rounding.
    ``None`` (default): on for ``sage`` and ``gcn``, off for ``gat``, as measured on 2 CPU ranks
    (``experiments/README.md``, "Overlapped layers"): SAGE and GCN iterations got faster, GAT's slower
    (its split kernels' backward costs more than the waiting it saves)."""

    input_features: str = "auto"
    """Split only: how a rank gets its first layer's input rows (:class:`gsplit.DataLoader`'s ``input_features``):
    ``"shuffle"`` (load the rows it owns, then an all-to-all), ``"direct"`` (read every row it needs from the
    table every rank holds: no bottom id exchange, no feature shuffle) or ``"auto"`` (direct for CPU ranks
    without a cache, else shuffle)."""

    keep_epochs: int = 0
    """Epoch records :func:`train_rank` keeps and returns in its log's ``epochs``: the last this many (0: all of
    them, for scripts that read the returned log). A record holds every rank's counters (per iteration with
    ``log_iterations``), so keeping all of them grows a rank, and the launcher that receives the log, by each
    epoch's records; ``gsplit train`` keeps 1, since it streams every record to its log as the epoch ends."""

    macrobatch: int = 1
    """Split and dp: sample and load this many consecutive mini-batches together, then train on them one by one
    (:mod:`gsplit.sampling.macrobatch`): one id exchange per layer and one load of the union of their input rows
    per macrobatch; the same steps as 1 (lowered, with a warning, where its estimated memory does not fit)."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16``: the dtype the layers' products run in under ``torch.autocast``
    (:mod:`gsplit.run.amp`; fp16 with a gradient scaler). Master weights and the optimiser stay float32."""

    host_mode: str = "span"
    """Full-graph training on several hosts (``ranks_per_host``): ``"span"``: one split group of every rank of every
    host (every layer's shuffle crosses hosts); ``"preload"``: shared preloading (:class:`gsplit.fullgraph.PreloadLoader`):
    the map has one part per host, each host trains its vertices plus their halo over its own ranks and only the
    gradient all-reduce crosses hosts. Both equal one-process full-graph training (``preload`` with the full halo)."""
    external_hops: Optional[int] = None
    """``host_mode="preload"``: keep only halo vertices at most this many hops outside the host (expansion-aware
    sampling, :mod:`gsplit.fullgraph.hosts`); ``None``: the full halo of one hop per layer (exact)."""
    external_fanout: Optional[int] = None
    """``host_mode="preload"``: each halo vertex keeps at most this many in-edges from other halo vertices, picked by
    a hash of the seed and the edge id; ``None``: all of them."""
    co_batches: Optional[int] = None
    """Full-graph training: train each host's share in this many co-batches of its training vertices, gradients
    accumulated into one step per epoch (cooperative batching, :mod:`gsplit.fullgraph.cobatch`); 1: the share at
    once; ``None``: the fewest that fit ``memory_limit`` by the memory estimate (1 where the share fits)."""
    memory_limit: Optional[str] = None
    """Full-graph training: the memory budget per rank (``"2G"``) that the estimate is held against; ``None``: the
    GPU's free memory, or the host's available memory shared by its CPU ranks."""

    def __post_init__(self):
        if self.system not in SYSTEMS:
            raise ValueError(f"system={self.system!r}; choose one of {sorted(SYSTEMS)}")
        if self.batch_size < 1 or self.epochs < 0 or self.hidden < 1:
            raise ValueError(f"batch_size, epochs and hidden must be positive, got {self.batch_size}, "
                             f"{self.epochs}, {self.hidden}")
        parse_size(self.cache_size)  # a bad size fails here, before any rank starts
        if self.input_features not in ("auto", "direct", "shuffle"):
            raise ValueError(f"input_features={self.input_features!r}; choose 'auto', 'direct' or 'shuffle'")
        if self.overlap is None:  # the measured default (see the field); the log records what ran
            self.overlap = self.model.lower() != "gat"
        if self.macrobatch < 1 or (self.macrobatch > 1 and self.system == "full"):
            raise ValueError(f"macrobatch={self.macrobatch} with system={self.system!r}; pass 1 or more mini-batches "
                             "per macrobatch (full-graph training has one batch per epoch: leave it at 1)")
        autocast_dtype(self.precision)  # a bad name fails here, before any rank starts
        if self.keep_epochs < 0:
            raise ValueError(f"keep_epochs={self.keep_epochs}; pass how many epoch records to keep, or 0 for all")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every={self.checkpoint_every}; pass iterations between checkpoints, or 0")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume=True needs checkpoint_dir: the folder to resume from")
        if self.host_mode not in ("span", "preload"):
            raise ValueError(f"host_mode={self.host_mode!r}; choose 'span' or 'preload'")
        if self.host_mode == "preload" and (self.system != "full" or not self.ranks_per_host):
            raise ValueError(f"host_mode='preload' is full-graph training across hosts, but system={self.system!r} "
                             f"and ranks_per_host={self.ranks_per_host}; pass system='full' and the ranks of one host")
        if (self.external_hops is not None or self.external_fanout is not None) and self.host_mode != "preload":
            raise ValueError("external_hops and external_fanout bound the halo of host_mode='preload'; pass that too")
        if self.host_mode == "preload":
            check_halo_options(len(self.fanouts), self.external_hops, self.external_fanout)
        if (self.co_batches is not None or self.memory_limit is not None) and self.system != "full":
            raise ValueError("co_batches and memory_limit are full-graph training's; pass system='full' too")
        if self.co_batches is not None and self.co_batches < 1:
            raise ValueError(f"co_batches={self.co_batches}; pass at least 1 (1: the share at once), or None for "
                             "the automatic choice")
        if self.memory_limit is not None:
            parse_size(self.memory_limit, "memory_limit")
        if self.uva and self.device == "cpu":
            raise ValueError("uva=True samples a pinned host graph from the GPUs, but device='cpu'; use "
                             "device='cuda' or 'auto' on a GPU host, or uva=False")
        if self.ranks_per_host < 0:
            raise ValueError(f"ranks_per_host={self.ranks_per_host}; pass the ranks of one host, or 0 for one host")
        if not (self.max_loss >= 0):
            raise ValueError(f"max_loss={self.max_loss}; pass a positive loss limit, or 0 to stop only on NaN/inf")


@torch.no_grad()
def evaluate(model, loader, comm: Communicator, job_comm: Optional[Communicator] = None) -> float:
    """Accuracy over the loader's targets, summed over ranks (every rank gets the same number).

    ``comm`` is the split group the model shuffles on; ``job_comm`` (default ``comm``) the ranks whose
    counts are summed: every rank of every host when hosts split their own slices.
    """
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    for _, _, blocks in loader:
        logits = model(blocks, blocks[0].srcdata["feat"], comm)
        labels = blocks[-1].dstdata["label"]
        counted = labels >= 0  # full-graph blocks label the vertices outside the evaluated set -100
        correct[0] += float((logits.argmax(1)[counted] == labels[counted]).sum())
        correct[1] += int(counted.sum())
    model.train()
    (job_comm or comm).all_reduce_(correct)
    return float(correct[0] / correct[1].clamp_min(1))


def final_evaluation(cfg: TrainConfig, model, dataset, owner: Optional[torch.Tensor], comm: Communicator,
                     device: torch.device, graph=None) -> dict:
    """Validation and test accuracy of the trained model by layer-wise full-graph inference, over all ranks.

    ``graph``: the graph the rank's loaders use (on its GPU when it computes on one; default
    ``dataset.graph``), so that the neighbourhoods are gathered where the layers run.

    ``split``: split-parallel over the training partition map (each rank computes the vertices it owns).
    ``dp`` has no partition map; its ranks split the work the same way over contiguous ranges of vertex
    ids. Both equal single-process inference, so the numbers do not depend on the system or the map,
    only on the model. Every rank gets the same numbers.
    """
    t0 = time.perf_counter()
    graph = dataset.graph if graph is None else graph
    part = SYSTEMS[cfg.system].inference_map(owner, graph.num_nodes, comm.world_size)
    # chunks of layerwise_inference's default 4096 owned vertices: no backward to keep, so larger
    # chunks than the training batch mean fewer collectives for the same memory
    result = layerwise_inference(model, graph, dataset.features, partition=part, group=comm, device=device)
    record = {f"final_{name}_acc": accuracy(result, dataset.labels, idx, group=comm)
              for name, idx in (("val", dataset.val_idx), ("test", dataset.test_idx)) if idx.numel()}
    record["final_eval_s"] = time.perf_counter() - t0
    log.info("final layer-wise evaluation: %s", record)
    return record


@dataclass
class TrainPosition:
    """Where training stands: the next iteration to run and the optimiser steps taken so far."""

    epoch: int = 0
    """Epoch of the next iteration."""
    iteration: int = 0
    """Iteration within that epoch (0: its start)."""
    step: int = 0
    """Optimiser steps taken (iterations trained) since the start of the run."""


def model_spec(cfg: TrainConfig, dataset) -> dict:
    """``build_model``'s arguments for ``cfg`` on ``dataset`` (what model.pt records).

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, feature_dim=8, num_classes=3)
        >>> model_spec(TrainConfig(fanouts=[4, 3], hidden=16), ds)["num_classes"]
        3
    """
    return {"name": cfg.model, "in_feats": int(dataset.features.shape[1]), "hidden": cfg.hidden,
            "num_classes": int(dataset.num_classes), "num_layers": len(cfg.fanouts), "dropout": cfg.dropout,
            "heads": cfg.heads}


def _save_model(cfg: TrainConfig, model, dataset) -> None:
    """``checkpoint_dir/model.pt``, self-describing (:mod:`gsplit.run.model_io`): architecture, training options,
    how to reload the dataset, versions and weights; ``gsplit eval`` / ``gsplit.run.model_io.load_model`` read it."""
    spec = model_spec(cfg, dataset)
    save_model(Path(cfg.checkpoint_dir) / "model.pt", model, spec, asdict(cfg),
               dataset.meta.get("load", {"name": dataset.name}))


@contextlib.contextmanager
def _expected_work(reports: int, interval_s: float = 1.0):
    """Keep reporting progress (``reports``: this rank's count so far) while the block runs.

    Rank 0 saves checkpoints alone while the other ranks wait for it in the next collective: without
    this, the launcher's progress watchdog would take a slow save (a big model, a slow disk) for a hang.
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            report_progress(reports)

    thread = threading.Thread(target=beat, name="gsplit-save-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _save_checkpoint(cfg: TrainConfig, model, opt, epoch: int, iteration: int, step: int, run: dict,
                     reports: int = 0, amp: Optional[MixedPrecision] = None) -> None:
    """Rank 0 saves what an exact resume needs: every rank holds the same model and optimiser state."""
    # the vertex-dropout step counter is in model.state_dict() (the models' extra state)
    counters = {"epoch": epoch, "iteration": iteration, "step": step}
    if amp is not None:  # the precision and float16's loss scale: a resume continues with both
        counters["amp"] = amp.state_dict()
    with _expected_work(reports):
        save_checkpoint(cfg.checkpoint_dir, model.state_dict(), opt.state_dict(), counters, step=step,
                        rng=rng_state(), run=run)


def _resume(cfg: TrainConfig, model, opt, amp: Optional[MixedPrecision] = None) -> TrainPosition:
    """Load the newest checkpoint into ``model`` and ``opt``; the position to continue from (the start if none)."""
    ck = load_checkpoint(cfg.checkpoint_dir)
    if ck is None:  # a new folder, or the first save was interrupted: TrainConfig.resume's fresh start
        log.warning("resume: no complete checkpoint in %s yet; starting from the beginning", cfg.checkpoint_dir)
        return TrainPosition()
    model.load_state_dict(ck.model)
    if ck.optimizer is not None:
        opt.load_state_dict(ck.optimizer)
        if cfg.resume_anyway:  # the user chose the new settings: a restored optimiser must not keep the old lr
            for group in opt.param_groups:
                group["lr"] = cfg.lr
    if ck.rng is not None:
        set_rng_state(ck.rng)
    saved_amp = ck.counters.get("amp", {"precision": "fp32"})  # written before precisions: float32
    if amp is not None and (saved_amp.get("precision") == amp.precision or not cfg.resume_anyway):
        amp.load_state_dict(saved_amp)  # another precision: refused in one line (unless resume_anyway)
    log.info("resumed from %s at epoch %d, iteration %d (step %d)", cfg.checkpoint_dir, ck.counters["epoch"],
             ck.counters["iteration"], ck.counters["step"])
    return TrainPosition(int(ck.counters["epoch"]), int(ck.counters["iteration"]), int(ck.counters["step"]))


def _hosts(cfg: TrainConfig, world_size: int, hosts: Optional[Tuple]) -> Optional[Tuple]:
    """``(host_group, world_group)`` when split training spans several hosts, else ``None``."""
    if not SYSTEMS[cfg.system].splits_by_host(cfg):
        return None  # data parallelism, or one full-graph split group spanning every host
    if hosts is not None:
        return hosts
    if cfg.ranks_per_host and cfg.ranks_per_host != world_size:
        return host_groups(cfg.ranks_per_host)
    return None


def rank_graph(graph: Graph, device: torch.device, uva: bool = False) -> Graph:
    """The graph a rank samples and evaluates on: with ``uva`` on a GPU, the host graph pinned in place
    (:meth:`Graph.pin_memory`: one copy per host, read by the GPUs over PCIe); else on a GPU a copy on the
    rank's GPU, so that sampling runs there instead of on the host CPU (a 1M-vertex / 20M-edge graph takes
    160 MB); on the CPU the graph itself.

    Example:
        >>> g = Graph.from_edges([0, 1], [1, 0])
        >>> rank_graph(g, torch.device("cpu")) is g
        True
    """
    if uva and device.type == "cuda":
        return graph.pin_memory()  # logs its own time (gsplit.ops.pinning)
    if device.type != "cuda":
        return graph
    with timed_step(f"copying the {_gib(graph.indptr, graph.indices):.2f} GiB graph to {device}", logger=log):
        return graph.to(device)


def _gib(*tensors: torch.Tensor) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def train_rank(rank: int, world_size: int, cfg: TrainConfig, dataset, owner: Optional[torch.Tensor],
               report: Optional[Callable[[dict], None]] = None, progress: bool = False,
               cache_weights=None, hosts: Optional[Tuple] = None) -> dict:
    """Train on this rank; returns the run log on rank 0 and this rank's counters elsewhere.

    Called as ``gsplit.launch(train_rank, n, args=(cfg, dataset, owner, ...))``, or directly as
    ``train_rank(0, 1, cfg, dataset, None)`` for one process.

    ``report(epoch_record)`` is called on rank 0 after every epoch (the CLI prints with it);
    ``progress=True`` shows a progress bar of the iterations on rank 0 (the CLI turns it on).
    ``cache_weights`` (e.g. pre-sampling vertex weights) choose what ``cfg.cache_size`` caches; default
    in-degree. ``hosts``: ``(host_group, world_group)`` from :func:`gsplit.host_groups` when the job
    spans several hosts (the CLI passes it under torchrun); without it ``cfg.ranks_per_host`` makes them.
    ``owner`` then has one part per rank of a host.

    An epoch record's ``sample_s``, ``load_s``, ``wait_s`` and ``train_s`` (each the slowest rank's) are
    measured inside the interval its ``epoch_s`` measures, so none exceeds it (with ``prefetch`` sampling
    and loading overlap training: their sum may). Work done once before the first epoch (setting up the
    training loader; for full-graph training building the blocks, with any kernel build or wait for the
    other ranks) is the log's ``setup_s``, not part of any epoch.
    """
    if dataset.train_idx.numel() == 0:
        fix = {"dgl.DGLGraph": SPLIT_FIX, "torch_geometric.data.Data": "set data.train_mask (a boolean mask or vertex "
               "ids) before from_pyg(data)"}.get(dataset.meta.get("source"), "check its split options")
        raise ValueError(f"dataset {dataset.name!r} has no training vertices (train_idx is empty): nothing to train; "
                         f"{fix}, or pass dataclasses.replace(dataset, train_idx=ids)")
    device = resolve_device(cfg.device)
    if device.type == "cpu":  # also one process and torchrun ranks (gsplit.launch sets it for its CPU ranks)
        keep_freed_heap()
    system = SYSTEMS[cfg.system]
    sampler = NeighborSampler(cfg.fanouts, seed=cfg.seed)
    # a size nobody can allocate (10**10 classes in a folder's meta.json) is refused before build_model tries
    check_model_spec(model_spec(cfg, dataset), f"dataset {dataset.name!r}" + (
        f" ({dataset.meta['folder']}/meta.json)" if "folder" in dataset.meta else ""))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, dataset.features.shape[1], cfg.hidden, dataset.num_classes,
                        num_layers=len(cfg.fanouts), dropout=cfg.dropout, heads=cfg.heads).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # split parallelism's options: the data-parallel and full-graph loaders ignore them (see their make_loader)
    split_options = {"cache_size": cfg.cache_size, "cache_weights": cache_weights, "prefetch": cfg.prefetch,
                     "input_features": cfg.input_features, "macrobatch": cfg.macrobatch}
    if cfg.overlap and cfg.system == "split":
        split_options["overlap"] = True
    graph = rank_graph(dataset.graph, device, cfg.uva)
    hosts = _hosts(cfg, world_size, hosts)
    group_options = {} if hosts is None else {"group": hosts[0], "replica_group": hosts[1]}
    # full-graph training chooses between the whole share and co-batches of it by the model's memory estimate
    model_option = {"model": model} if cfg.system == "full" else {}
    with timed_step("setting up the training loader", logger=log) as setup:
        train_loader = system.make_loader(cfg, dataset, graph, dataset.train_idx, owner, device, sampler, True,
                                          **split_options, **group_options, **model_option)
        setup_s = setup.seconds  # outside every epoch (full-graph: the blocks' build), so in none of their times
    # evaluation reads the same feature cache, and does not prefetch (no backward to hide behind)
    model = system.prepare_model(cfg, model, train_loader)
    eval_options = {"features": getattr(train_loader, "feature_store", dataset.features),
                    "input_features": cfg.input_features, **group_options}
    comm = train_loader.comm
    if cfg.ranks_per_host:  # rows the split group sends to other hosts, counted apart (torchrun numbers hosts' ranks
        comm.set_hosts([r // cfg.ranks_per_host for r in group_ranks(comm)])  # consecutively, as host_groups does)
    # every rank of the job: gradients, the logged loss, accuracy counts and the per-rank counters. Its own
    # Communicator, so that its traffic (the gradient all-reduce) is counted apart from the split group's.
    job_comm = Communicator(hosts[1] if hosts is not None else comm.group)
    # one owner array per device: the evaluation loaders share the training loader's (already checked)
    eval_owner = getattr(train_loader, "owner", owner)
    with timed_step("setting up the evaluation loaders", logger=log):
        eval_loaders = {name: system.make_loader(cfg, dataset, graph, idx, eval_owner, device, sampler, False,
                                                 **eval_options)
                        for name, idx in (("val", dataset.val_idx), ("test", dataset.test_idx)) if idx.numel()}
    history = []
    if cfg.checkpoint_dir and rank == 0:  # before any work: model.pt and every save go here
        prepare_checkpoint_dir(cfg.checkpoint_dir)
    run = run_record(asdict(cfg), world_size, dataset, owner) if cfg.checkpoint_dir and rank == 0 else {}
    reports = 0  # report_progress calls of this rank (what the watchdog shows while rank 0 saves)
    amp = MixedPrecision(cfg.precision, device)
    position = _resume(cfg, model, opt, amp) if cfg.resume else TrainPosition()
    resumed_at = (position.epoch, position.iteration)
    loss_watch = LossWatch(cfg, rank, device)
    # co-batches (cooperative batching): an epoch's batches are one step, their gradients accumulated
    accumulate = bool(getattr(train_loader, "accumulates", False))
    for epoch in range(position.epoch, cfg.epochs):
        counters = EpochCounters()
        comm.traffic.reset()
        comm.cross_host.reset()
        job_comm.traffic.reset()
        train_loader.set_epoch(epoch, position.iteration if epoch == position.epoch else 0)
        # this rank's share of the summed loss; one all-reduce per epoch, not one per iteration
        local_loss, t_epoch = torch.zeros((), dtype=torch.float64, device=device), time.perf_counter()
        traffic_before, job_before = comm.traffic.snapshot(seconds=True), job_comm.traffic.snapshot()
        # GPU: CUDA events on the current stream, read once complete; no per-iteration device synchronise
        timer = StepTimer(device)
        clock = LayerClock(device)  # each layer's forward and backward, read as the timer's steps are
        batches = train_loader
        if progress and rank == 0:
            # tqdm's default lock is a multiprocessing semaphore, which a rank leaving with os._exit (see
            # gsplit.launch) would leak; one process needs only a thread lock.
            tqdm.set_lock(threading.RLock())
            batches = tqdm(train_loader, desc=f"epoch {epoch}", unit="it", leave=False, dynamic_ncols=True)
        faults_before = minor_page_faults()
        save_at_end = False
        steps = 0  # optimiser steps of this epoch (with co-batches one, whatever the batches)
        first_it = position.iteration if epoch == position.epoch else 0
        for it, (_, _, blocks) in enumerate(batches, start=first_it):
            stats = train_loader.last_stats
            counters.add_iteration(stats)
            # the epoch ends here: its last iteration, or the last one --max-iters lets it run
            done = it + 1 == len(train_loader) or bool(cfg.max_iters and it + 1 >= cfg.max_iters)
            stepped = not accumulate or done
            if cfg.log_iterations:  # hook-free per-rank compute time: the step's time minus its collectives'
                step_collective_s = _collective_seconds(comm, job_comm)
            timer.start()
            if not accumulate or it == first_it:
                opt.zero_grad()
            if accumulate:
                same_step(model, it - first_it)  # one step: the dropout masks of one full-graph forward
            with amp.autocast():
                logits = model(blocks, blocks[0].srcdata["feat"], comm, clock=clock)
                loss = system.loss(logits, blocks[-1].dstdata["label"], blocks[-1], world_size)
            amp.backward(loss)
            clock.mark(None)  # layer 0's backward ends here (its input, the features, has no gradient)
            if stepped:
                allreduce_gradients(model, job_comm)
                amp.step(opt)  # fp16: unscaled after the all-reduce, so every rank skips the same steps
                steps += 1
            timer.stop(len(counters.per_iteration) if cfg.log_iterations else None)
            clock.close(len(counters.per_iteration) if cfg.log_iterations else None)
            if cfg.log_iterations:
                step_collective_s = _collective_seconds(comm, job_comm) - step_collective_s
            loss_watch.push(loss, epoch, it, position.step + 1)
            if cfg.log_iterations:  # the id exchanges of this iteration ran in the loader, its shuffles here
                traffic_now, job_now = comm.traffic.snapshot(seconds=True), job_comm.traffic.snapshot()
                delta = TrafficCounter.delta(traffic_now, traffic_before)
                calls = _sum_tags([delta["calls"], TrafficCounter.delta(job_now, job_before)["calls"]])
                traffic_before, job_before = traffic_now, job_now
                faults_now = minor_page_faults()  # one reading ends this iteration's count and starts the next's
                # train_s is filled in once the step's end event is reached (at the latest at the epoch's end)
                counters.per_iteration.append({"iteration": it, **asdict(stats), "train_s": 0.0,
                                               "layer_fwd_s": [], "layer_bwd_s": [],
                                               "traffic_rows": delta["rows"], "traffic_bytes": delta["bytes"],
                                               "collectives": sum(calls.values()), "collectives_by_tag": calls,
                                               "collective_s_by_tag": delta["seconds"],
                                               "step_collective_s": step_collective_s,
                                               "gradient_bytes": job_comm.traffic.bytes[GRADIENT_TAG]
                                               - counters.gradient_bytes,
                                               "minor_faults": _faults_between(faults_before, faults_now)})
                faults_before = faults_now
            counters.gradient_bytes = job_comm.traffic.bytes[GRADIENT_TAG]
            _book_train_time(counters, timer.ready())
            _book_layer_time(counters, clock.ready())
            local_loss += loss.detach().to(torch.float64)
            position.step += int(stepped)
            # with co-batches only a whole epoch is saved: the gradients accumulated before its end are not
            if cfg.checkpoint_dir and rank == 0 and stepped and (position.step % cfg.checkpoint_every == 0
                                                                 if cfg.checkpoint_every else done):
                if done:  # it claims the whole epoch: saved once the epoch's record is out (below), so that a
                    save_at_end = True  # stop in between never leaves an epoch done but absent from the log
                else:
                    _save_checkpoint(cfg, model, opt, epoch, it + 1, position.step, run, reports, amp)
            report_progress()  # the launcher's progress watchdog (gsplit.launch) names a rank that stops here
            reports += 1
            if cfg.max_iters and it + 1 >= cfg.max_iters:
                break
        _book_train_time(counters, timer.finish())  # waits for the epoch's last step on the current stream
        _book_layer_time(counters, clock.finish())
        epoch_s = time.perf_counter() - t_epoch
        traffic = comm.traffic.snapshot()
        hosts_bytes = {"cross_host_bytes": sum(comm.cross_host.bytes.values())} if cfg.ranks_per_host else {}
        counters.traffic_rows, counters.traffic_bytes = traffic["rows"], traffic["bytes"]
        loss_watch.flush()
        loss_sum = global_sum(local_loss, job_comm)
        record = {"epoch": epoch, "loss": loss_sum / max(steps, 1), "epoch_s": epoch_s}
        if accumulate:  # the co-batches of each host (the largest), with their step
            record["co_batches"] = max(job_comm.all_gather_object(len(train_loader)))
        if amp.scaler is not None:  # float16: the steps skipped so far (inf/nan gradients) and the loss scale
            record.update(skipped_steps=amp.settle(), loss_scale=amp.scale)
        if epoch == resumed_at[0] and resumed_at[1] > 0:  # resumed mid-epoch: only the iterations after it
            record.update(partial=True, first_iteration=resumed_at[1], iterations=counters.iterations)
        if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0:
            for name, loader in eval_loaders.items():
                with amp.autocast():
                    record[f"{name}_acc"] = evaluate(model, loader, comm, job_comm)
        per_rank = job_comm.all_gather_object({"rank": rank, "epoch_s": epoch_s,
                                               "torch_threads": torch.get_num_threads(), **asdict(counters),
                                               **hosts_bytes})
        record["ranks"] = per_rank
        for phase in ("sample_s", "load_s", "wait_s", "train_s", "epoch_s"):
            record[phase] = max(r[phase] for r in per_rank)  # the slowest rank sets the pace
        for count in ("input_rows", "cache_hits", "cache_misses"):
            record[count] = sum(r[count] for r in per_rank)
        record["edges"] = [sum(r["edges"][layer] for r in per_rank) for layer in range(len(cfg.fanouts))] \
            if counters.edges else []
        record["dst_vertices"] = [sum(r["dst_vertices"][layer] for r in per_rank)
                                  for layer in range(len(cfg.fanouts))] if counters.dst_vertices else []
        record["traffic_bytes"] = sum(sum(r["traffic_bytes"].values()) for r in per_rank)
        # within a split group (one host) vs the gradient all-reduce over every rank (across hosts)
        record["split_group_bytes"] = record["traffic_bytes"]
        record["gradient_bytes"] = sum(r["gradient_bytes"] for r in per_rank)
        if hosts_bytes:  # of the split group's bytes: to ranks on other hosts, and inside hosts
            record["cross_host_bytes"] = sum(r["cross_host_bytes"] for r in per_rank)
            record["inside_host_bytes"] = record["split_group_bytes"] - record["cross_host_bytes"]
        record["traffic_rows_by_tag"] = _sum_tags(r["traffic_rows"] for r in per_rank)
        record["traffic_bytes_by_tag"] = _sum_tags(r["traffic_bytes"] for r in per_rank)
        if cfg.log_iterations:
            record["balance"] = iteration_balance(per_rank)
        history.append(record)
        if cfg.keep_epochs and len(history) > cfg.keep_epochs:  # the older ones went to report() already
            del history[:-cfg.keep_epochs]
        if rank == 0 and report is not None:
            report(record)
        if save_at_end:  # after the record (see above); evaluation changed neither model nor optimiser
            _save_checkpoint(cfg, model, opt, epoch + 1, 0, position.step, run, reports, amp)
    if cfg.checkpoint_dir and rank == 0:  # the trained model, whatever the checkpoint schedule
        _save_model(cfg, model, dataset)
    # a preload run's map has a part per host, not per rank of the split group: the evaluation's ranges then
    with amp.autocast():
        final = final_evaluation(cfg, model, dataset, None if cfg.host_mode == "preload" else owner, comm, device,
                                 graph=graph) if cfg.final_eval and cfg.eval_every else {}
    num_hosts = train_loader.num_replicas if hosts is not None else \
        (world_size // cfg.ranks_per_host if cfg.ranks_per_host else 1)
    return {"config": asdict(cfg), "world_size": world_size, "hosts": num_hosts,
            "ranks_per_host": world_size // num_hosts, "device": str(device), "transport": comm.transport,
            "setup_s": setup_s, "epochs": history, **final}
