"""Pair graphs: the positive and negative pairs a rank scores, and the rows it needs to score them.

A global mini-batch of edges has positive pairs (its edges) and negative pairs; their endpoints are the
mini-batch's targets, split by the partition map like any targets. **A pair is scored by the rank that owns
its source endpoint** ``u``: that rank computed ``h[u]``; ``h[v]`` may belong to another rank. Each rank's
*pair rows* are its own output rows (``blocks[-1].dst_nodes``, in order) followed by the rows of the other
ranks' vertices its pairs need, grouped by owner and in id order; one all-to-all (a
:class:`~gsplit.sampling.ShuffleIndex`, applied by :func:`gsplit.link.pair_rows`) brings them. The plan is
computed by every rank from the global mini-batch alone, without a collective. ``pair_graph.edges()`` are
local indices into the pair rows, as DGL's pair graphs index the output nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, List, Optional, Tuple

import torch

from gsplit.sampling.block import Block, ShuffleIndex


@dataclass(eq=False)
class PairGraph:
    """The pairs one rank scores (DGL's ``pair_graph`` / ``neg_pair_graph`` of one rank's split).

    Example:
        >>> p = PairGraph(src=torch.tensor([0]), dst=torch.tensor([1]), nodes=torch.tensor([4, 9]),
        ...               pair_ids=torch.tensor([0]), global_num_pairs=1)
        >>> [t.tolist() for t in p.edges()], p.num_nodes(), p.num_edges()
        ([[0], [1]], 2, 1)
    """

    src: torch.Tensor
    """int64 local index (into the pair rows) of each pair's source ``u``; ``u`` is owned by this rank."""
    dst: torch.Tensor
    """int64 local index (into the pair rows) of each pair's destination ``v``."""
    nodes: torch.Tensor
    """int64 global ids of the pair rows: this rank's output rows, then the rows received from other ranks."""
    pair_ids: torch.Tensor
    """int64 position of each pair among the global mini-batch's pairs (positives and negatives apart)."""
    global_num_pairs: int
    """Pairs of this kind in the whole global mini-batch (over all ranks): the loss's denominator."""
    edge_ids: Optional[torch.Tensor] = None
    """Positive pairs: the graph edge id of each pair (DGL's ``pair_graph.edata[dgl.EID]``); else ``None``."""
    shuffle_index: Optional[ShuffleIndex] = None
    """Output rows -> pair rows (shared by a batch's positive and negative pair graphs); ``None`` when the pair
    rows are the output rows (one rank)."""
    num_output_rows: int = 0
    """This rank's output rows (the first ``num_output_rows`` pair rows)."""
    split_loss: bool = False
    """Set by :func:`gsplit.link.split_bce_with_logits`: the loss over these pairs is already this rank's share
    of the global mean, which :class:`gsplit.SplitParallel` then does not rescale."""

    def edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(u, v)`` local indices into the pair rows, as DGL's ``pair_graph.edges()``."""
        return self.src, self.dst

    def num_nodes(self) -> int:
        """Pair rows (DGL's ``pair_graph.num_nodes()``)."""
        return int(self.nodes.numel())

    def num_edges(self) -> int:
        """Pairs this rank scores."""
        return int(self.src.numel())

    def global_edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(u, v)`` as global vertex ids."""
        return self.nodes.index_select(0, self.src), self.nodes.index_select(0, self.dst)

    def to(self, device, non_blocking: bool = False) -> "PairGraph":
        mv = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(self, src=mv(self.src), dst=mv(self.dst), nodes=mv(self.nodes), pair_ids=mv(self.pair_ids),
                       edge_ids=mv(self.edge_ids),
                       shuffle_index=None if self.shuffle_index is None else
                       self.shuffle_index.to(device, non_blocking))

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from (t for t in (self.src, self.dst, self.nodes, self.pair_ids, self.edge_ids) if t is not None)
        if self.shuffle_index is not None:
            yield from self.shuffle_index.tensors()


@dataclass
class LinkMiniBatch:
    """One rank's split of a global mini-batch of edges; unpacks as DGL's
    ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` (``(input_nodes, pair_graph, blocks)`` without a
    negative sampler, as in DGL).

    Example:
        >>> p = PairGraph(torch.tensor([0]), torch.tensor([0]), torch.tensor([3]), torch.tensor([0]), 1)
        >>> b = LinkMiniBatch(torch.tensor([3]), torch.tensor([3]), p, None, [])
        >>> len(tuple(b))
        3
    """

    input_nodes: torch.Tensor
    """As :class:`~gsplit.MiniBatch`'s: the vertices whose input features this rank loaded."""
    output_nodes: torch.Tensor
    """This rank's targets (``blocks[-1].dst_nodes``): the endpoints of the mini-batch's pairs it owns."""
    pair_graph: PairGraph
    """The positive pairs this rank scores."""
    neg_pair_graph: Optional[PairGraph]
    """The negative pairs this rank scores (``None`` without a negative sampler)."""
    blocks: List[Block]
    """One block per layer, index 0 = the input layer."""

    def __iter__(self):
        yield self.input_nodes
        yield self.pair_graph
        if self.neg_pair_graph is not None:
            yield self.neg_pair_graph
        yield self.blocks

    def __getitem__(self, i):
        return tuple(self)[i]

    def __len__(self) -> int:
        return 3 if self.neg_pair_graph is None else 4

    def pair_graphs(self) -> List[PairGraph]:
        return [p for p in (self.pair_graph, self.neg_pair_graph) if p is not None]

    def to(self, device, non_blocking: bool = False) -> "LinkMiniBatch":
        pos = self.pair_graph.to(device, non_blocking)
        neg = None
        if self.neg_pair_graph is not None:
            neg = replace(self.neg_pair_graph.to(device, non_blocking), shuffle_index=pos.shuffle_index)
        blocks = [b.to(device, non_blocking) for b in self.blocks]
        if blocks:
            blocks[-1].pairs = (pos, neg)
        return LinkMiniBatch(self.input_nodes.to(device, non_blocking=non_blocking),
                             self.output_nodes.to(device, non_blocking=non_blocking), pos, neg, blocks)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.input_nodes
        yield self.output_nodes
        for p in self.pair_graphs():
            yield from p.tensors()
        for b in self.blocks:
            yield from b.tensors()


def split_pairs(pos: Tuple[torch.Tensor, torch.Tensor], neg: Optional[Tuple[torch.Tensor, torch.Tensor]],
                edge_ids: torch.Tensor, owner: torch.Tensor, output_nodes: torch.Tensor, rank: int,
                world_size: int) -> Tuple[PairGraph, Optional[PairGraph]]:
    """This rank's positive and negative :class:`PairGraph` of a global mini-batch (pairs as global ids,
    identical on every rank), given the owner map and this rank's (sorted) output rows.

    Example:
        >>> owner = torch.tensor([0, 1, 0, 1])
        >>> p, _ = split_pairs((torch.tensor([0, 1]), torch.tensor([1, 2])), None, torch.tensor([5, 6]), owner,
        ...                    torch.tensor([0, 2]), rank=0, world_size=2)
        >>> p.nodes.tolist(), [t.tolist() for t in p.edges()], p.pair_ids.tolist()
        ([0, 2, 1], [[0], [2]], [0])
    """
    all_src = pos[0] if neg is None else torch.cat([pos[0], neg[0]])
    all_dst = pos[1] if neg is None else torch.cat([pos[1], neg[1]])
    n_out = output_nodes.numel()
    if world_size == 1:
        nodes, index = output_nodes, None
        src_local = torch.searchsorted(output_nodes, all_src)
        dst_local = torch.searchsorted(output_nodes, all_dst)
        mine = torch.arange(all_src.numel(), device=all_src.device)
    else:
        scorer = owner.index_select(0, all_src).to(torch.int64)
        dst_owner = owner.index_select(0, all_dst).to(torch.int64)
        num_nodes = owner.numel()
        # the remote rows each rank's pairs need, keyed owner * N + id: grouped by owner, id order within
        needs = [torch.unique(dst_owner[(scorer == j) & (dst_owner != j)] * num_nodes
                              + all_dst[(scorer == j) & (dst_owner != j)]) for j in range(world_size)]
        index = _exchange_plan(needs, output_nodes, rank, world_size, num_nodes)
        remote = needs[rank] % num_nodes
        nodes = torch.cat([output_nodes, remote])
        mine = torch.nonzero(scorer == rank).squeeze(1)
        src_local = torch.searchsorted(output_nodes, all_src.index_select(0, mine))
        d, d_owner = all_dst.index_select(0, mine), dst_owner.index_select(0, mine)
        own = d_owner == rank
        dst_local = torch.where(own, torch.searchsorted(output_nodes, d),
                                n_out + torch.searchsorted(needs[rank], d_owner * num_nodes + d))
    num_pos = pos[0].numel()
    is_pos = mine < num_pos
    pos_rows, neg_rows = torch.nonzero(is_pos).squeeze(1), torch.nonzero(~is_pos).squeeze(1)
    pos_ids = mine.index_select(0, pos_rows)
    pair_graph = PairGraph(src=src_local.index_select(0, pos_rows), dst=dst_local.index_select(0, pos_rows),
                           nodes=nodes, pair_ids=pos_ids, global_num_pairs=num_pos,
                           edge_ids=edge_ids.index_select(0, pos_ids), shuffle_index=index, num_output_rows=n_out)
    if neg is None:
        return pair_graph, None
    neg_graph = PairGraph(src=src_local.index_select(0, neg_rows), dst=dst_local.index_select(0, neg_rows),
                          nodes=nodes, pair_ids=mine.index_select(0, neg_rows) - num_pos,
                          global_num_pairs=neg[0].numel(), shuffle_index=index, num_output_rows=n_out)
    return pair_graph, neg_graph


def _exchange_plan(needs: List[torch.Tensor], output_nodes: torch.Tensor, rank: int, world_size: int,
                   num_nodes: int) -> ShuffleIndex:
    """The shuffle from this rank's output rows to its pair rows; ``needs[j]``: rank ``j``'s remote rows as
    sorted ``owner * N + id`` keys. Rank ``r`` receives its needs grouped by owner (id order within) after
    its own rows, and sends ``j`` the rows of ``needs[j]`` it owns, in the same order."""
    n_out = output_nodes.numel()
    device = output_nodes.device
    send_idx, send_counts = [], []
    for j in range(world_size):
        if j == rank:
            part = torch.arange(n_out, device=device)
        else:
            lo, hi = torch.searchsorted(needs[j], torch.tensor([rank * num_nodes, (rank + 1) * num_nodes],
                                                                device=needs[j].device)).tolist()
            part = torch.searchsorted(output_nodes, needs[j][lo:hi] - rank * num_nodes)
        send_idx.append(part)
        send_counts.append(int(part.numel()))
    mine = needs[rank]
    bounds = torch.searchsorted(mine, torch.arange(world_size + 1, device=mine.device) * num_nodes).tolist()
    recv_pos, recv_counts = [], []
    for i in range(world_size):
        if i == rank:
            part = torch.arange(n_out, device=device)
        else:
            part = n_out + torch.arange(bounds[i], bounds[i + 1], device=device)
        recv_pos.append(part)
        recv_counts.append(int(part.numel()))
    return ShuffleIndex(send_idx=torch.cat(send_idx), send_counts=send_counts, recv_pos=torch.cat(recv_pos),
                        recv_counts=recv_counts, num_local=n_out, num_mixed=n_out + mine.numel(),
                        tag="shuffle/pairs")
