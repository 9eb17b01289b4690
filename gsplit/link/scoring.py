"""Scoring pairs on a split: the rows a rank's pairs need, and the loss over the global mini-batch's pairs.

A rank's model returns one row per vertex it owns (``blocks[-1].dst_nodes``). :func:`pair_rows` turns them
into its *pair rows* (its own rows, then the other ranks' rows its pairs need: one autograd-aware all-to-all
whose backward returns the gradients to their owners), so a predictor is written as in DGL::

    h = gsplit.link.pair_rows(model(blocks, x), pair_graph)      # the one added line
    u, v = pair_graph.edges();  pos = (h[u] * h[v]).sum(1)      # or an MLP on h[u] * h[v]
    u, v = neg_pair_graph.edges();  neg = (h[u] * h[v]).sum(1)
    loss = gsplit.link.split_bce_with_logits(pos, neg, pair_graph, neg_pair_graph)

:func:`split_bce_with_logits` is the rank's share of the global mean binary cross-entropy over every
positive and negative pair of the global mini-batch: summed over ranks (``gsplit.allreduce_gradients``, or
:class:`gsplit.SplitParallel`, which does not rescale link mini-batches) it is one process's
``F.binary_cross_entropy_with_logits(cat([pos, neg]), cat([ones, zeros]))``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from gsplit.comm.shuffle import shuffle_by
from gsplit.interop.dgl import pair_of  # imports no dgl
from gsplit.link.pairs import PairGraph


def _pairs(x) -> PairGraph:
    """The gsplit pair graph of a pair graph argument: itself, or the one a DGL pair graph was made from."""
    if isinstance(x, PairGraph):
        return x
    pair = pair_of(x)
    if pair is None:
        raise TypeError(f"expected a pair graph that gsplit.DataLoader yielded (gsplit.link.PairGraph or its DGL "
                        f"graph), got {type(x).__name__}")
    return pair


def pair_rows(h: torch.Tensor, pair_graph: PairGraph, group=None) -> torch.Tensor:
    """This rank's output rows ``h`` (one per ``blocks[-1]`` destination) -> its pair rows (one per
    ``pair_graph.num_nodes()``), which ``pair_graph.edges()`` and ``neg_pair_graph.edges()`` index. Every
    rank must call it for every mini-batch (it is a collective on more than one rank), also one with no pair.
    ``group``: as :func:`gsplit.shuffle`'s (default: the loader's).

    Example:
        >>> p = PairGraph(torch.tensor([0]), torch.tensor([1]), torch.tensor([4, 9]), torch.tensor([0]), 1)
        >>> pair_rows(torch.ones(2, 3), p).shape        # one rank: the rows are the pair rows
        torch.Size([2, 3])
    """
    pair_graph = _pairs(pair_graph)
    if any(pair_graph is p for p in getattr(h, "gsplit_pairs", ())):
        return h  # SplitParallel's output: the pair rows already
    index = pair_graph.shuffle_index
    if index is None:
        if h.shape[0] != pair_graph.num_nodes():
            raise ValueError(f"h has {h.shape[0]} rows but the pair graph has {pair_graph.num_nodes()} nodes; pass "
                             "the model's output for blocks[-1] (one row per destination) unchanged")
        return h
    if h.shape[0] != index.num_local:
        raise ValueError(f"h has {h.shape[0]} rows but this rank has {index.num_local} output rows "
                         "(blocks[-1].num_dst_nodes()); pass the model's output for blocks[-1] unchanged")
    return shuffle_by(h, index, group)


def split_bce_with_logits(pos_score: torch.Tensor, neg_score: Optional[torch.Tensor], pair_graph: PairGraph,
                          neg_pair_graph: Optional[PairGraph] = None) -> torch.Tensor:
    """This rank's share of the global mini-batch's mean binary cross-entropy (positives labelled 1, negatives
    0): ``sum over this rank's pairs / pairs of the global mini-batch``. For one rank it is the ordinary mean.

    Example:
        >>> p = PairGraph(torch.tensor([0]), torch.tensor([1]), torch.tensor([4, 9]), torch.tensor([0]), 1)
        >>> n = PairGraph(torch.tensor([0]), torch.tensor([0]), torch.tensor([4, 9]), torch.tensor([0]), 1)
        >>> float(split_bce_with_logits(torch.tensor([0.0]), torch.tensor([0.0]), p, n))  # doctest: +ELLIPSIS
        0.693...
    """
    pair_graph = _pairs(pair_graph)
    neg_pair_graph = None if neg_pair_graph is None else _pairs(neg_pair_graph)
    for p in (pair_graph, neg_pair_graph):  # a share already: SplitParallel must not rescale it
        if p is not None:
            p.split_loss = True
    pos_score = pos_score.reshape(-1)
    if pos_score.numel() != pair_graph.num_edges():
        raise ValueError(f"pos_score has {pos_score.numel()} scores but pair_graph has {pair_graph.num_edges()} "
                         "pairs; score every pair of pair_graph.edges()")
    total = pair_graph.global_num_pairs
    loss = F.binary_cross_entropy_with_logits(pos_score, torch.ones_like(pos_score), reduction="sum")
    if neg_score is not None:
        if neg_pair_graph is None:
            raise ValueError("neg_score is given without neg_pair_graph; pass both (the loader yields both)")
        neg_score = neg_score.reshape(-1)
        if neg_score.numel() != neg_pair_graph.num_edges():
            raise ValueError(f"neg_score has {neg_score.numel()} scores but neg_pair_graph has "
                             f"{neg_pair_graph.num_edges()} pairs; score every pair of neg_pair_graph.edges()")
        total += neg_pair_graph.global_num_pairs
        loss = loss + F.binary_cross_entropy_with_logits(neg_score, torch.zeros_like(neg_score), reduction="sum")
    return loss / max(int(total), 1)


def wrapper_pair_rows(out: torch.Tensor, pairs: tuple, group=None, replicas: int = 1):
    """:class:`gsplit.SplitParallel`'s output on a link mini-batch: ``(pair rows, pairs this rank scores)``.

    ``out`` (one row per ``blocks[-1]`` destination) becomes the pair rows of ``pairs`` (the top block's
    ``(pair_graph, neg_pair_graph)``), so DGL's ``pair_graph.ndata["h"] = model(blocks, x)`` works unchanged.
    The gradient of the pair rows is scaled for a loss that is the *mean over this rank's pairs* (DGL's
    ``F.binary_cross_entropy_with_logits(cat([pos, neg]), labels)``): by ``replicas * pairs here / pairs of
    the global mini-batch``, so the ranks' summed gradients are one process's on the whole mini-batch. When
    :func:`split_bce_with_logits` scored the batch (already a share) the factor is ``replicas`` alone (undoing
    DDP's averaging). The factor is read in the backward, after the loss was made. The result is marked, so
    :func:`pair_rows` returns it unchanged.

    Example:
        >>> p = PairGraph(torch.tensor([0]), torch.tensor([1]), torch.tensor([4, 9]), torch.tensor([0]), 1)
        >>> h, n = wrapper_pair_rows(torch.ones(2, 3, requires_grad=True), (p, None))
        >>> pair_rows(h, p) is h, n
        (True, 1)
    """
    pos, neg = pairs
    graphs = tuple(p for p in (pos, neg) if p is not None)
    local = sum(p.num_edges() for p in graphs)
    total = sum(int(p.global_num_pairs) for p in graphs)
    h = pair_rows(out, pos, group)
    if h is out:  # one rank: the pair rows are the output rows; mark a view, not the caller's tensor
        h = out.view_as(out)
    if h.requires_grad:
        def scale(grad):  # on the pair rows: only this rank's loss reaches them (the others' come back after)
            share = any(p.split_loss for p in graphs)
            factor = replicas if share else (replicas * local / total if total else 0.0)
            return grad if factor == 1 else grad * factor

        h.register_hook(scale)
    h.gsplit_pairs = graphs
    return h, local
