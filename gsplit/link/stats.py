"""How a partition map splits edge mini-batches: the blocks' cut and balance (as :func:`gsplit.split_stats`
measures node mini-batches) and the pairs' own: how evenly the ranks score pairs (a pair is scored by the
owner of its source) and how many pair rows cross ranks before scoring (:func:`gsplit.link.pair_rows`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from gsplit.data.graph import Graph
from gsplit.link.sampler import EdgePredictionSampler, as_edge_ids
from gsplit.partitioning.stats import SplitStats, block_split, stats_of_batches
from gsplit.sampling.batches import global_batches


@dataclass
class LinkSplitStats:
    """A map's split of edge mini-batches, averaged over the batches measured."""

    blocks: SplitStats
    """The blocks' cross-edge fraction and imbalances per layer (targets: the pairs' endpoints)."""
    pair_imbalance: float
    """max / mean over ranks of the pairs (positive and negative) each scores."""
    remote_pair_fraction: float
    """Fraction of pairs whose destination another rank owns (its row is exchanged before scoring)."""
    exchanged_rows: float
    """Rows the pair exchange moves per mini-batch, over all ranks (distinct per receiving rank)."""

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "blocks"}
        out["blocks"] = self.blocks.to_dict()
        return out


def _imbalance(owners: torch.Tensor, parts: int) -> float:
    """max / mean over ranks of the counts of ``owners`` (1.0 for none)."""
    if owners.numel() == 0:
        return 1.0
    counts = torch.bincount(owners, minlength=parts).double()
    return float(counts.max() / counts.mean())


def link_split_stats(graph: Graph, owner: torch.Tensor, edge_sampler: EdgePredictionSampler, train_eids,
                     batch_size: int, num_batches: int, seed: int = 0, method: str = "") -> LinkSplitStats:
    """Measure the owner map ``owner`` (one rank per vertex) on ``num_batches`` global edge mini-batches of
    ``batch_size`` edges (the loaders' order for ``seed``, epochs from 0), sampled by ``edge_sampler``.

    Example:
        >>> import gsplit
        >>> g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> s = gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([-1]),
        ...                                       negative_sampler=gsplit.negative_sampler.Uniform(1))
        >>> st = link_split_stats(g, torch.tensor([0, 0, 1, 1]), s, torch.arange(8), batch_size=4, num_batches=2)
        >>> 0 <= st.remote_pair_fraction <= 1, st.blocks.num_batches
        (True, 2)
    """
    train_eids = as_edge_ids(train_eids, graph)
    edge_sampler.check(graph)
    if int(batch_size) < 1 or int(num_batches) < 1:
        raise ValueError(f"batch_size={batch_size}, num_batches={num_batches}; both must be positive")
    owner = owner.to(torch.int64)
    parts = int(owner.max()) + 1
    rows = {"cross": [], "eimb": [], "vimb": [], "inimb": []}
    pair_imb, remote, moved = [], [], []
    epoch = 0
    while len(pair_imb) < num_batches:
        for it, eids in enumerate(global_batches(train_eids, int(batch_size), seed, epoch)):
            if len(pair_imb) == num_batches:
                break
            batch = edge_sampler.plan(graph, eids, epoch, it)
            mb = edge_sampler.node_sampler(graph, [batch]).sample_layers(graph, batch.seeds, epoch, it)
            for key, value in zip(("cross", "eimb", "vimb", "inimb"), block_split(mb.blocks, owner, parts)):
                rows[key].append(value)
            src = batch.pos[0] if batch.neg is None else torch.cat([batch.pos[0], batch.neg[0]])
            dst = batch.pos[1] if batch.neg is None else torch.cat([batch.pos[1], batch.neg[1]])
            scorer, dst_owner = owner[src], owner[dst]
            far = scorer != dst_owner
            pair_imb.append(_imbalance(scorer, parts))
            remote.append(float(far.double().mean()) if far.numel() else 0.0)
            moved.append(float(torch.unique(scorer[far] * graph.num_nodes + dst[far]).numel()))
        epoch += 1
    blocks = stats_of_batches(parts, method, int(batch_size), rows["cross"], rows["eimb"], rows["vimb"],
                              rows["inimb"])
    n = len(pair_imb)
    return LinkSplitStats(blocks=blocks, pair_imbalance=sum(pair_imb) / n, remote_pair_fraction=sum(remote) / n,
                          exchanged_rows=sum(moved) / n)
