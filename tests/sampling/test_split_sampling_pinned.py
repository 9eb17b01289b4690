"""Split sampling's batches are pinned: the faster id exchange (issue 20) samples exactly what the original did.

``reference_exchange_ids`` below is ``gsplit.split.split_sampling.exchange_ids`` as it was before issue 20's
changes (an argsort by owner, a gather of the owners, ``unique`` of the requests and ``searchsorted`` of
every request in the new frontier), kept here as the reference. Every rank samples the same iterations
once through the library's exchange and once through the reference, and every block must be identical:
vertices, edges (their order too), edge ids, and the shuffle plan (send rows, receive positions, counts,
sizes, interior split), for world sizes 1 to 3, with and without overlap ordering, on maps that give
some rank nothing to request or to own.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit import ops
from gsplit.comm.communicator import Communicator
from gsplit.launcher import launch
from gsplit.ops import sample_cpu
from gsplit.sampling.block import ShuffleIndex
from gsplit.split import split_sampling

FANOUTS = [4, -1, 3]
NUM_NODES = 300
ITERS = 4
BATCH = 40


def reference_exchange_ids(ids, owner, comm, tag, num_nodes=None, interior_first=False):
    """The exchange before issue 20 (commit 26a9732), unchanged but for this docstring."""
    if comm.world_size == 1:
        frontier, order = torch.sort(ids, stable=True)
        counts = [ids.numel()]
        index = ShuffleIndex(send_idx=torch.argsort(order), send_counts=counts, recv_pos=torch.arange(
            ids.numel(), device=ids.device), recv_counts=list(counts), num_local=frontier.numel(),
            num_mixed=ids.numel(), tag=f"shuffle/{tag}",
            num_interior=frontier.numel() if interior_first else None)
        return frontier, index
    order = torch.argsort(owner, stable=True)
    requested, requests_sent, requests_received = comm.all_to_all_counted(ids[order], owner[order],
                                                                          tag=f"ids/{tag}")
    frontier = ops.unique_ids(requested, num_nodes)
    send_idx = torch.searchsorted(frontier, requested)
    num_interior = None
    if interior_first:
        frontier, send_idx, num_interior = split_sampling._interior_first(frontier, send_idx, requests_received,
                                                                          comm.rank)
    index = ShuffleIndex(send_idx=send_idx, send_counts=requests_received,
                         recv_pos=order, recv_counts=requests_sent, num_local=frontier.numel(),
                         num_mixed=ids.numel(), tag=f"shuffle/{tag}", num_interior=num_interior)
    return frontier, index


def make_graph():
    g = torch.Generator().manual_seed(11)
    connected = NUM_NODES - 25  # isolated vertices: empty neighbourhoods and frontiers that stop growing
    src = torch.randint(0, connected, (1500,), generator=g)
    dst = torch.randint(0, connected, (1500,), generator=g)
    return gsplit.Graph.from_edges(src, dst, NUM_NODES, symmetric=True, remove_self_loops=True)


def make_maps(world_size):
    g = torch.Generator().manual_seed(5)
    maps = {"random": torch.randint(0, world_size, (NUM_NODES,), generator=g),
            "one owner": torch.zeros(NUM_NODES, dtype=torch.long)}  # the other ranks request and own nothing
    if world_size > 2:
        skewed = maps["random"].clone()
        skewed[skewed == 1] = 0  # rank 1 owns nothing, the others do
        maps["skewed"] = skewed
    return maps


def plan_fields(index):
    if index is None:
        return None
    return (index.send_idx, list(index.send_counts), index.recv_pos, list(index.recv_counts), index.num_local,
            index.num_mixed, index.tag, index.num_interior)


def batch_fields(batch):
    """Everything a split batch fixes, as plain values and CPU tensors."""
    return [batch.input_nodes, batch.output_nodes] + [
        (b.src_nodes, b.num_dst, b.edge_src, b.edge_dst, b.edge_ids, b.layer, plan_fields(b.shuffle_index))
        for b in batch.blocks]


def sample_both(rank, world_size):
    """Per (map, overlap, iteration): the batch through the library's exchange and through the reference."""
    graph = make_graph()
    targets = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(2))[:BATCH * world_size * ITERS]
    sampler = gsplit.NeighborSampler(FANOUTS, seed=9)
    comm = Communicator()
    out = []
    library = split_sampling.exchange_ids
    searchsorted, calls = torch.searchsorted, []

    def counted_searchsorted(*a, **k):
        calls.append(1)
        return searchsorted(*a, **k)

    def library_counting(*a, **k):  # the library's exchange, counting its searchsorted calls
        torch.searchsorted = counted_searchsorted
        try:
            return library(*a, **k)
        finally:
            torch.searchsorted = searchsorted
    for name, owner in make_maps(world_size).items():
        for overlap in (False, True):
            for it in range(ITERS):
                seeds = targets[it * BATCH * world_size:(it + 1) * BATCH * world_size]
                split_sampling.exchange_ids = library_counting
                try:
                    got = split_sampling.sp_sample(graph, seeds, owner, sampler, comm, epoch=1, iteration=it,
                                                   overlap=overlap)
                finally:
                    split_sampling.exchange_ids = library
                split_sampling.exchange_ids = reference_exchange_ids
                try:
                    want = split_sampling.sp_sample(graph, seeds, owner, sampler, comm, epoch=1, iteration=it,
                                                    overlap=overlap)
                finally:
                    split_sampling.exchange_ids = library
                out.append(((name, overlap, it), batch_fields(got), batch_fields(want)))
    return out, len(calls)


def assert_same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_split_batches_equal_the_reference_exchange(world_size):
    per_rank = (launch(sample_both, world_size, devices="cpu", backend="gloo", timeout=300) if world_size > 1
                else [sample_both(0, 1)])
    remote = 0
    for rank, (cases, searchsorted_calls) in enumerate(per_rank):
        edges = 0
        assert len(cases) == len(make_maps(world_size)) * 2 * ITERS
        for case, got, want in cases:
            assert_same(got, want, f"rank {rank}, case {case}")
            blocks = got[2:]
            if case[0] == "random":  # every rank owns vertices: its layers have edges
                edges += sum(b[2].numel() for b in blocks)
            remote += sum(sum(b[6][1]) - b[6][1][rank] for b in blocks)  # ids this rank's owners were asked for
        # the new frontier and each request's row come from one relabel pass, not unique + searchsorted
        # (13 ms for 90k requests on one core, most of the exchange's own time): fails on the original
        if sample_cpu.extension() is not None:  # the torch fallback still searches
            assert searchsorted_calls == 0, (rank, searchsorted_calls)
        assert edges > 0, rank
    assert (remote > 0) == (world_size > 1)  # the ranks did exchange ids


@pytest.mark.parametrize("num_nodes", [None, 1000, 10**9])
def test_unique_inverse_equals_unique_and_searchsorted_on_every_path(num_nodes, monkeypatch):
    """The compiled pass (dense table, or hash table where the graph is large against the ids), the torch
    fallback, and the sort of distinct ids all give ``unique`` and each id's place in it."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 1000, (5000,), generator=g)
    distinct = torch.randperm(1000, generator=g)[:300]
    for use_extension in (True, False):
        if not use_extension:
            monkeypatch.setattr(sample_cpu, "extension", lambda: None)
        for x, is_distinct in ((ids, False), (distinct, True), (ids[:0], False)):
            uniq, where = ops.unique_inverse(x, num_nodes, distinct=is_distinct)
            want = torch.unique(x)
            assert torch.equal(uniq, want), (use_extension, x.numel())
            assert torch.equal(where, torch.searchsorted(want, x)), (use_extension, x.numel())
