"""Prepare's peak memory (issue 19, item 2): METIS's input built in chunks, equal to the one-shot build,
and METIS's own memory (in its forked process) reported."""

import tracemalloc

import numpy as np
import pytest
import torch

import gsplit
import gsplit.partitioning.metis as metis
from gsplit.graph import Graph


def _graphs():
    ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=4, seed=2)
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 500, 6000), rng.integers(0, 500, 6000)
    return {"symmetric": ds.graph,
            "symmetric with self loops": Graph.from_edges(src, dst, num_nodes=500, symmetric=True),
            "directed": Graph.from_edges(src, dst, num_nodes=500, remove_duplicates=True)}


@pytest.mark.parametrize("name", ["symmetric", "symmetric with self loops", "directed"])
@pytest.mark.parametrize("drop_zero", [True, False])
def test_chunked_symmetrize_equals_scipy(monkeypatch, name, drop_zero):
    g = _graphs()[name]
    w = torch.rand(g.num_edges, dtype=torch.float32, generator=torch.Generator().manual_seed(1))
    w[::3] = 0  # some edges never sampled: dropped with drop_zero (only where the reverse is 0 too without)
    monkeypatch.setattr(metis, "_CHUNK", 97, raising=False)  # many chunks, rows split across them
    got = metis.symmetrize(g, w, drop_zero=drop_zero)
    indptr, src = g.indptr.numpy(), g.indices.numpy()
    dst = np.repeat(np.arange(g.num_nodes), np.diff(indptr))
    want = metis._symmetrize_scipy(g.num_nodes, src, dst, w.numpy().astype(np.float64), drop_zero)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    q_small = metis.to_metis_weights(got[2])
    monkeypatch.setattr(metis, "_CHUNK", 1 << 30, raising=False)
    np.testing.assert_array_equal(q_small, metis.to_metis_weights(got[2]))


def test_metis_input_peak_is_bounded_per_edge(monkeypatch):
    """The old build held a destination per edge, float64 copies of the weights and unchunked scaling
    temporaries at once (~55 B per edge measured by tracemalloc); chunked it stays near the arrays it returns."""
    g = gsplit.datasets.load("synthetic", num_nodes=20000, avg_degree=15, feature_dim=4, seed=0).graph
    w = torch.rand(g.num_edges, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    w[::5] = 0
    monkeypatch.setattr(metis, "_CHUNK", 1 << 14, raising=False)
    metis.symmetrize(g, w, drop_zero=True)  # warm-up: first-call allocations of scipy/numpy
    tracemalloc.start()
    try:
        xadj, adjncy, data = metis.symmetrize(g, w, drop_zero=True)
        metis.to_metis_weights(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_edge = peak / g.num_edges
    assert per_edge < 40, f"building METIS's input peaked at {per_edge:.1f} B per edge"


def test_partition_reports_metis_process_memory():
    ds = gsplit.datasets.load("synthetic", num_nodes=2000, feature_dim=4, seed=0)
    pmap = gsplit.partition(ds.graph, 2, method="edge", train_idx=ds.train_idx)
    meta = pmap.metadata
    assert meta["metis_child_peak_rss_mb"] >= meta["metis_child_start_rss_mb"] > 0
