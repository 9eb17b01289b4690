"""Pieces shared by the tests that compare split-parallel training with single-process training."""

from __future__ import annotations

import torch

import gsplit


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-4) -> float:
    """Relative error; ``floor`` keeps gradients that are zero up to rounding from dividing by ~1e-18."""
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def random_graph_problem(num_nodes: int, num_edges: int, feat_dim: int, num_classes: int, seed: int,
                         isolated: int):
    """A symmetric random graph whose last ``isolated`` vertices have no edges, float64 features, labels.

    Returns ``(graph, feats, labels, gen)``; ``gen`` is the generator that drew them, for the caller's
    further draws (targets, orders), so each test's problem stays the same as when it drew them itself.
    """
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes - isolated, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes - isolated, (num_edges,), generator=gen)
    graph = gsplit.Graph.from_edges(src, dst, num_nodes, symmetric=True, remove_self_loops=True)
    feats = torch.randn(num_nodes, feat_dim, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    return graph, feats, labels, gen
