"""Link prediction training and evaluation for ``gsplit train --task link``: one function per rank.

Each rank trains on the split loader's edge mini-batches (:mod:`gsplit.link`), sums gradients over the
ranks, and at the end computes every vertex's embedding by layer-wise inference over the message-passing
graph (split-parallel), from which validation and test pairs are scored: MRR against per-edge negatives and
Hits@K against shared negatives, as OGB's evaluators define them. Every rank gets the same numbers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from gsplit.run.checkpoint import load_checkpoint, prepare_checkpoint_dir, rng_state, save_checkpoint, set_rng_state
from gsplit.run.counters import EpochCounters
from gsplit.baselines.data_parallel import DataParallelLoader
from gsplit.comm.communicator import Communicator
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.minibatch.inference import gather_rows, layerwise_inference
from gsplit.launcher import report_progress, resolve_device
from gsplit.link import negative
from gsplit.link.edge_split import EdgeSplit
from gsplit.link.metrics import hits_at_k, mrr
from gsplit.link.sampler import as_edge_prediction_sampler
from gsplit.link.scoring import pair_rows, split_bce_with_logits
from gsplit.minibatch.loader import DataLoader
from gsplit.nn.models import build_model
from gsplit.ops import counter_rng
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

PREDICTORS = ("dot", "mlp")
SYSTEMS = ("split", "dp")
EVAL_EPOCH = 1 << 30
"""The epoch slot of the evaluation negatives' stream key: no training epoch reaches it."""


@dataclass
class LinkTrainConfig:
    """One link prediction run besides the data and the partition map."""

    model: str = "sage"
    system: str = "split"
    """``split`` (each global mini-batch split by the partition map) or ``dp`` (data parallelism, DGL's
    ``use_ddp=True``: each rank samples, loads and scores its own micro-batch of ``batch_size`` edges)."""
    fanouts: List[int] = field(default_factory=lambda: [15, 10, 5])
    batch_size: int = 512
    """Training edges per rank per iteration."""
    hidden: int = 128
    """Hidden and embedding size."""
    heads: int = 4
    dropout: float = 0.0
    epochs: int = 3
    lr: float = 0.003
    seed: int = 0
    neg_ratio: int = 1
    """Uniform negatives per positive edge."""
    exclude: Optional[str] = "reverse_id"
    """``None``, ``"self"`` or ``"reverse_id"`` (the latter only for an undirected graph)."""
    predictor: str = "dot"
    """``dot`` (``h[u] . h[v]``) or ``mlp`` (an MLP on ``h[u] * h[v]``)."""
    eval_negatives: int = 100
    """Per-edge negatives for MRR."""
    shared_negatives: int = 1000
    """Shared negative pairs for Hits@K."""
    hits_k: int = 50
    max_iters: int = 0
    device: str = "cpu"
    prefetch: bool = False
    macrobatch: int = 1
    checkpoint_dir: str = ""
    """Folder for a checkpoint at the end of every epoch (model, predictor, optimiser, position, RNG) and, at
    the end, ``model.pt`` (the GNN, marked ``task: link``) and ``predictor.pt``; ``""``: none."""
    resume: bool = False
    """Continue from the newest checkpoint in ``checkpoint_dir`` (a fresh start when there is none)."""
    checkpoint_every: int = 0
    """Also a checkpoint every this many iterations (steps), inside epochs; ``0``: at the end of epochs only."""
    edge_split: List[float] = field(default_factory=lambda: [0.05, 0.1])
    """The validation and test fractions the edges were split with (with ``seed``: the message-passing graph
    ``gsplit predict`` rebuilds from ``model.pt``)."""
    dataset_spec: Dict = field(default_factory=dict)
    """``{"name": ..., "options": {...}}``: how ``model.pt`` says to reload the dataset."""

    def __post_init__(self):
        if self.system not in SYSTEMS:
            raise ValueError(f"system={self.system!r}; link prediction trains with one of {list(SYSTEMS)}")
        if self.predictor not in PREDICTORS:
            raise ValueError(f"predictor={self.predictor!r}; choose one of {list(PREDICTORS)}")
        if isinstance(self.neg_ratio, bool) or int(self.neg_ratio) != self.neg_ratio or self.neg_ratio < 1:
            raise ValueError(f"neg_ratio={self.neg_ratio}; pass a whole number of negatives per positive, at least 1")
        if self.batch_size < 1 or self.epochs < 0 or self.hidden < 1:
            raise ValueError(f"batch_size, epochs and hidden must be positive, got {self.batch_size}, "
                             f"{self.epochs}, {self.hidden}")
        if isinstance(self.checkpoint_every, bool) or int(self.checkpoint_every) != self.checkpoint_every \
                or self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every={self.checkpoint_every}; pass iterations between checkpoints, or 0")
        if self.eval_negatives < 1 or self.shared_negatives < 1 or self.hits_k < 1:
            raise ValueError("eval_negatives, shared_negatives and hits_k must be at least 1")


def make_predictor(kind: str, hidden: int) -> Optional[nn.Module]:
    """``None`` for ``dot``; for ``mlp`` DGL's link prediction head: Linear-ReLU-Linear to one score."""
    if kind == "dot":
        return None
    return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def score_pairs(predictor: Optional[nn.Module], h_u: torch.Tensor, h_v: torch.Tensor) -> torch.Tensor:
    """Scores of pairs from their endpoints' rows (one score per row)."""
    return (h_u * h_v).sum(-1) if predictor is None else predictor(h_u * h_v).squeeze(-1)


def evaluation_negatives(split: EdgeSplit, cfg: LinkTrainConfig, full_graph) -> Dict[str, Tuple]:
    """Per kind of held-out edges: per-edge negative destinations ``[n, eval_negatives]`` (counter-based, the
    source kept: ogbl-citation2's), and ``shared_negatives`` pairs that are edges of no part of the graph."""
    out = {}
    shared_sampler = negative.GlobalUniform(1)  # one: it sorts the graph's edge keys once (seconds at 1.5M edges)
    for i, (name, (src, dst)) in enumerate((("val", split.val), ("test", split.test))):
        key = counter_rng.stream_key(cfg.seed, EVAL_EPOCH, i, negative.NEGATIVE_STREAM)
        _, per_edge = negative.Uniform(cfg.eval_negatives).sample(full_graph, src, src, dst, key)
        shared_key = counter_rng.stream_key(cfg.seed, EVAL_EPOCH, i + 2, negative.NEGATIVE_STREAM)
        shared = shared_sampler.sample(full_graph, torch.arange(cfg.shared_negatives),
                                                  torch.zeros(0), torch.zeros(0), shared_key)
        out[name] = (per_edge.view(src.numel(), cfg.eval_negatives), shared)
    return out


_EVAL_CHUNK_VALUES = 1 << 24
"""Embedding values (floats) the per-edge negatives of one evaluation chunk may hold: 64 MiB in float32."""


@torch.no_grad()
def evaluate_link(model, predictor, split: EdgeSplit, features: torch.Tensor, negatives: Dict[str, Tuple],
                  owner: Optional[torch.Tensor], comm: Communicator, device, hits_k: int) -> dict:
    """Validation and test MRR and Hits@K from layer-wise embeddings of every vertex (same on every rank)."""
    t0 = time.perf_counter()
    result = layerwise_inference(model, split.graph, features, partition=owner, group=comm, device=device)
    record = {}
    for name, (src, dst) in (("val", split.val), ("test", split.test)):
        if src.numel() == 0:
            continue
        per_edge, (neg_u, neg_v) = negatives[name]
        ids = torch.unique(torch.cat([src, dst, per_edge.reshape(-1), neg_u, neg_v]))
        rows = gather_rows(result, ids, comm)
        h = lambda x: rows[torch.searchsorted(ids, x.reshape(-1))].view(*x.shape, -1)  # noqa: E731
        pos = score_pairs(predictor, h(src), h(dst))
        # the per-edge negatives' embeddings in chunks of edges: all at once they are held-out edges x negatives x
        # hidden floats (3.8 GB for 10 % of a 100k-vertex graph's edges at 100 negatives, hidden 256)
        step = max(1, _EVAL_CHUNK_VALUES // max(1, per_edge.shape[1] * rows.shape[1]))
        neg = torch.cat([score_pairs(predictor, h(src[i:i + step]).unsqueeze(1).expand(-1, per_edge.shape[1], -1),
                                     h(per_edge[i:i + step])) for i in range(0, src.numel(), step)])
        shared = score_pairs(predictor, h(neg_u), h(neg_v))
        record[f"final_{name}_mrr"] = mrr(pos, neg)
        record[f"final_{name}_hits@{hits_k}"] = hits_at_k(pos, shared, hits_k)
    record["final_eval_s"] = time.perf_counter() - t0
    return record


def _resume(cfg: LinkTrainConfig, params: nn.Module, opt) -> Tuple[int, int, int]:
    """Load the newest checkpoint (a link prediction run's) into ``params`` and ``opt``; ``(epoch, iteration,
    step)``: the first iteration not done (0 after an epoch's end)."""
    ck = load_checkpoint(cfg.checkpoint_dir)
    if ck is None:
        log.warning("resume: no complete checkpoint in %s yet; starting from the beginning", cfg.checkpoint_dir)
        return 0, 0, 0
    if ck.run.get("task") != "link":
        raise ValueError(f"the checkpoint in {cfg.checkpoint_dir} is a node classification run's; resume it with "
                         "gsplit train (no --task link), or pass another folder")
    params.load_state_dict(ck.model)
    opt.load_state_dict(ck.optimizer)
    if ck.rng is not None:
        set_rng_state(ck.rng)
    return int(ck.counters["epoch"]), int(ck.counters.get("iteration", 0)), int(ck.counters["step"])


def _save_link_model(cfg: LinkTrainConfig, model, predictor, in_feats: int) -> None:
    """``model.pt`` (self-describing, ``train_config["task"] == "link"``) and, for an MLP, ``predictor.pt``."""
    from pathlib import Path

    from gsplit.runtime.io import atomic_write_bytes
    from gsplit.run.model_io import save_model

    spec = {"name": cfg.model, "in_feats": int(in_feats), "hidden": cfg.hidden, "num_classes": cfg.hidden,
            "num_layers": len(cfg.fanouts), "dropout": cfg.dropout, "heads": cfg.heads}
    folder = Path(cfg.checkpoint_dir)
    save_model(folder / "model.pt", model, spec, {**asdict(cfg), "task": "link"}, cfg.dataset_spec)
    if predictor is not None:
        import io

        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in predictor.state_dict().items()}, buf)
        atomic_write_bytes(folder / "predictor.pt", buf.getvalue())


def train_link_rank(rank: int, world_size: int, cfg: LinkTrainConfig, split: EdgeSplit, features: torch.Tensor,
                    full_graph, owner: Optional[torch.Tensor], report: Optional[Callable[[dict], None]] = None) -> dict:
    """Train link prediction on this rank; returns the run log (the same on every rank).

    Called as ``gsplit.launch(train_link_rank, n, args=(cfg, split, features, graph, owner))`` or directly with
    ``(0, 1, ...)`` for one process. ``full_graph`` (before the split) keeps evaluation negatives off every edge.
    """
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, features.shape[1], cfg.hidden, cfg.hidden, num_layers=len(cfg.fanouts),
                        dropout=cfg.dropout, heads=cfg.heads).to(device)
    predictor = make_predictor(cfg.predictor, cfg.hidden)
    params = nn.ModuleList([m for m in (model, predictor) if m is not None]).to(device)
    opt = torch.optim.Adam(params.parameters(), lr=cfg.lr)
    exclude = cfg.exclude
    if exclude == "reverse_id" and split.reverse_eids is None:
        raise ValueError("exclude='reverse_id' but the graph is directed (no reverse edge ids); pass exclude='self'")
    sampler = as_edge_prediction_sampler(NeighborSampler(cfg.fanouts, seed=cfg.seed), exclude=exclude,
                                         reverse_eids=split.reverse_eids if exclude == "reverse_id" else None,
                                         negative_sampler=negative.Uniform(cfg.neg_ratio))
    if cfg.system == "dp":  # each rank its own micro-batch; the mean loss of each, gradients averaged (DDP's)
        owner, scale = None, 1.0 / world_size
        loader = DataParallelLoader(split.graph, split.train_eids, sampler, device=device, use_ddp=world_size > 1,
                                    batch_size=cfg.batch_size, shuffle=True, ddp_seed=cfg.seed, features=features,
                                    macrobatch=cfg.macrobatch)
    else:  # the global mini-batch's mean loss, split: the ranks' shares add up to it
        scale = 1.0
        loader = DataLoader(split.graph, split.train_eids, sampler, partition=owner, device=device,
                            use_ddp=world_size > 1, batch_size=cfg.batch_size, shuffle=True, ddp_seed=cfg.seed,
                            features=features, prefetch=cfg.prefetch, macrobatch=cfg.macrobatch)
    comm = loader.comm
    history = []
    start_epoch, start_it, step = 0, 0, 0
    if cfg.resume:
        start_epoch, start_it, step = _resume(cfg, params, opt)
    if cfg.checkpoint_dir and rank == 0:
        prepare_checkpoint_dir(cfg.checkpoint_dir)
    run = {"task": "link", "config": asdict(cfg), "world_size": world_size}
    for epoch in range(start_epoch, cfg.epochs):
        first = start_it if epoch == start_epoch else 0  # a resumed epoch continues where its checkpoint was
        loader.set_epoch(epoch, first)
        t_epoch, local_loss, counts = time.perf_counter(), torch.zeros((), dtype=torch.float64), EpochCounters()
        for it, (_, pos, neg, blocks) in enumerate(loader, start=first):
            counts.add_iteration(loader.last_stats)  # the work this rank did: times, rows loaded, edges per layer
            t0 = time.perf_counter()
            opt.zero_grad()
            h = pair_rows(model(blocks, blocks[0].srcdata["feat"]), pos)
            loss = split_bce_with_logits(score_pairs(predictor, h[pos.src], h[pos.dst]),
                                         score_pairs(predictor, h[neg.src], h[neg.dst]), pos, neg) * scale
            loss.backward()
            allreduce_gradients(params, comm)
            opt.step()
            counts.train_s += time.perf_counter() - t0
            local_loss += loss.detach().double().cpu()
            step += 1
            done = it + 1 == len(loader) or bool(cfg.max_iters and it + 1 >= cfg.max_iters)
            if cfg.checkpoint_dir and rank == 0 and cfg.checkpoint_every and step % cfg.checkpoint_every == 0 \
                    and not done:  # the epoch's end saves below, once its record is out
                save_checkpoint(cfg.checkpoint_dir, params.state_dict(), opt.state_dict(),
                                {"epoch": epoch, "iteration": it + 1, "step": step}, rng=rng_state(), step=step,
                                run=run)
            report_progress()
            if done:
                break
        per_rank = comm.all_gather_object([counts.sample_s, counts.load_s, counts.train_s,
                                           time.perf_counter() - t_epoch, counts.input_rows,
                                           counts.edges or [0] * len(cfg.fanouts)])
        iters = counts.iterations
        record = {"epoch": epoch, "loss": global_sum(local_loss, comm) / max(iters, 1),
                  "epoch_s": max(r[3] for r in per_rank), "iterations": iters,  # the slowest rank's, as each part
                  "sample_s": max(r[0] for r in per_rank), "load_s": max(r[1] for r in per_rank),
                  "train_s": max(r[2] for r in per_rank),
                  # summed over ranks: the edges sampled (and computed) per layer and the input rows loaded
                  "input_rows": sum(r[4] for r in per_rank),
                  "edges": [sum(r[5][i] for r in per_rank) for i in range(len(cfg.fanouts))]}
        if first:  # the loss and times cover the iterations run after the resume only
            record.update(partial=True, first_iteration=first)
        history.append(record)
        if rank == 0 and report is not None:
            report(record)
        if cfg.checkpoint_dir and rank == 0:  # every rank holds the same parameters: rank 0 saves them
            save_checkpoint(cfg.checkpoint_dir, params.state_dict(), opt.state_dict(),
                            {"epoch": epoch + 1, "iteration": 0, "step": step}, rng=rng_state(), step=step, run=run)
    if cfg.checkpoint_dir and rank == 0:
        _save_link_model(cfg, model, predictor, features.shape[1])
    final = evaluate_link(model, predictor, split, features, evaluation_negatives(split, cfg, full_graph),
                          getattr(loader, "owner", owner), comm, device, cfg.hits_k)
    log.info("final link evaluation: %s", final)
    return {"task": "link", "config": asdict(cfg), "world_size": world_size, "device": str(device),
            "exclude": exclude, "train_edges": int(split.train_eids.numel()), "val_edges": int(split.val[0].numel()),
            "test_edges": int(split.test[0].numel()), "epochs": history, **final}
