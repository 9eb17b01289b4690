"""Prepare's peak memory (issue 19, item 2): METIS's input built in chunks, equal to the one-shot build,
and METIS's own memory (in its forked process) reported."""

import sys
import tracemalloc

import numpy as np
import pytest
import torch

import gsplit
import gsplit.partitioning.metis as metis
from gsplit.data.graph import Graph


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


def _heap_holes_then_metis(conn) -> None:
    """In a process of its own (the test's process keeps its peak RSS): leave ~175 MiB freed inside the C heap,
    then run METIS; sends the RSS before and METIS's process's RSS at its start (MB)."""
    from gsplit.runtime.resources import process_status_kb

    xadj, adjncy = np.array([0, 1, 3, 5, 6]), np.array([1, 0, 2, 1, 3, 2])
    metis.metis_part_kway(xadj, adjncy, 2)  # warm-up: METIS loaded, first-call allocations done
    arrays = [np.ones(64 * 1024 // 8) for _ in range(3200)]  # 200 MiB of heap blocks (below the mmap threshold)
    keep = arrays[::8]  # every 8th stays alive: the freed blocks between them are holes, not the heap's top
    del arrays
    before_mb = process_status_kb("VmRSS") / 1024
    memory: dict = {}
    metis.metis_part_kway(xadj, adjncy, 2, memory=memory)
    conn.send((before_mb, memory["metis_child_start_rss_mb"], len(keep)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="METIS runs in a forked child on Linux only")
def test_freed_heap_is_returned_before_metis_forks():
    """Temporaries freed inside the C heap (held in place by live neighbours, so the heap cannot shrink from
    its top) used to stay resident in the parent and, through the fork, in METIS's process: at 1M vertices
    118 MB of the host's peak. Now the heap is trimmed first, so METIS's process starts without them."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_heap_holes_then_metis, args=(send,))
    proc.start()
    before_mb, child_start_mb, _ = receive.recv()
    proc.join()
    freed_mb = 200 * 7 / 8
    assert child_start_mb < before_mb - 0.75 * freed_mb, \
        f"METIS's process started with {child_start_mb} MB, the parent held {before_mb:.0f} MB with {freed_mb:.0f} " \
        "MB of it freed"


@pytest.mark.parametrize("name", ["symmetric", "symmetric with self loops", "directed"])
def test_per_edge_ids_of_the_weights_stage_are_int32(name):
    """The expected weights' per-edge index arrays (reverse edge, destination) and METIS's reverse ids are
    int32 below 2^31 edges: 8 of the weights stage's bytes per edge fewer, same values."""
    from gsplit.partitioning.expected import _EdgeView, reverse_edges

    g = _graphs()[name]
    indptr, src = g.indptr.numpy(), g.indices.numpy()
    rev = reverse_edges(indptr, src)
    assert rev.dtype == np.int32
    dst = np.repeat(np.arange(g.num_nodes), np.diff(indptr))
    has = rev >= 0
    # the reverse of u -> d is an edge d -> u (a repeated edge may point at either copy)
    np.testing.assert_array_equal(src[rev[has]], dst[has])
    np.testing.assert_array_equal(dst[rev[has]], src[has])
    view = _EdgeView(g, 3)
    assert view.dst.dtype == torch.int32 and view.rev.dtype == torch.int32
    np.testing.assert_array_equal(view.dst.numpy(), dst)
