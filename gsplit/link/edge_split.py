"""A seeded split of a graph's edges into train / validation / test for link prediction, as OGB's link
datasets are split: the validation and test edges (and their reverses, for an undirected graph) are removed
from the message-passing graph, so a model never aggregates over an edge it is asked to predict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from gsplit.data.graph import Graph
from gsplit.link.sampler import reverse_edge_ids


@dataclass
class EdgeSplit:
    """The edges of a graph split for link prediction."""

    graph: Graph
    """The message-passing graph: every vertex, and the edges of neither the validation nor the test set."""
    train_eids: torch.Tensor
    """int64 edge ids (of ``graph``) of the training edges: all of its edges."""
    reverse_eids: Optional[torch.Tensor]
    """For an undirected graph, ``graph``'s reverse edge ids (for ``exclude="reverse_id"``); else ``None``."""
    val: Tuple[torch.Tensor, torch.Tensor]
    """``(src, dst)`` of the validation edges (one direction per undirected edge)."""
    test: Tuple[torch.Tensor, torch.Tensor]
    """``(src, dst)`` of the test edges."""
    undirected: bool
    """Whether every edge had its reverse (then pairs of directions were split together)."""


def split_edges(graph: Graph, val_fraction: float, test_fraction: float, seed: int = 0) -> EdgeSplit:
    """Split ``graph``'s edges (undirected ones as pairs of directions; self-loops stay in training) with a
    seeded permutation: ``test_fraction`` of them for testing, ``val_fraction`` for validation.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3, 4], [1, 2, 3, 4, 0], symmetric=True)
        >>> s = split_edges(g, 0.2, 0.2, seed=0)
        >>> s.graph.num_edges, s.val[0].numel(), s.test[0].numel(), s.undirected
        (6, 1, 1, True)
    """
    for name, f in (("validation", val_fraction), ("test", test_fraction)):
        if not 0 <= f < 1:
            raise ValueError(f"the {name} fraction of the edges is {f}; pass a fraction in [0, 1)")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"validation {val_fraction} + test {test_fraction} edges leave none for training; "
                         "pass fractions that sum to less than 1")
    if graph.num_edges == 0:
        raise ValueError("the graph has no edges, so there is nothing to predict; link prediction needs edges")
    src, dst = graph.indices, graph.edge_dst()
    try:
        reverse = reverse_edge_ids(graph)
        undirected = True
    except ValueError:
        reverse, undirected = None, False
    units = torch.nonzero(src < dst).squeeze(1) if undirected else torch.nonzero(src != dst).squeeze(1)
    order = units[torch.randperm(units.numel(), generator=torch.Generator().manual_seed(int(seed)))]
    n_test, n_val = round(test_fraction * units.numel()), round(val_fraction * units.numel())
    test, val = order[:n_test], order[n_test:n_test + n_val]
    held_out = torch.cat([test, val])
    if undirected:
        held_out = torch.cat([held_out, reverse.index_select(0, held_out)])
    keep = torch.ones(graph.num_edges, dtype=torch.bool)
    keep[held_out] = False
    if not bool(keep.any()):
        raise ValueError(f"no edge is left for training after holding out {n_val} validation and {n_test} test "
                         "edges; pass smaller fractions or a graph with more edges")
    train_graph = Graph.from_edges(src[keep], dst[keep], graph.num_nodes)
    return EdgeSplit(graph=train_graph, train_eids=torch.arange(train_graph.num_edges),
                     reverse_eids=reverse_edge_ids(train_graph) if undirected else None,
                     val=(src[val], dst[val]), test=(src[test], dst[test]), undirected=undirected)
