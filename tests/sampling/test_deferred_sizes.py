"""Split sampling with the sizes on the device (:mod:`gsplit.split.deferred`): the same blocks and shuffle plans as
the exact path, bit for bit, at 2 and 4 ranks; an overflowed slot on one rank sends every rank back to the exact
path; the padded ops equal the ops they stand for.

The deferred path is what a GPU with NCCL runs; here it is called directly, on CPU ranks over gloo (its
collectives and ops are device-generic).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gsplit
from gsplit import ops
from gsplit.comm.communicator import Communicator
from gsplit.launcher import launch
from gsplit.ops import counter_rng, torch_ops
from gsplit.split import deferred, local_targets, sp_sample

FANOUTS = [3, 4, 2]


def make_problem(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    n = 300
    src = torch.randint(0, n - 10, (1500,), generator=g)  # the last 10 vertices are isolated
    dst = torch.randint(0, n - 10, (1500,), generator=g)
    graph = gsplit.Graph.from_edges(src, dst, n, symmetric=True, remove_self_loops=True)
    return graph, torch.randperm(n, generator=g)


def _differ(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y))
    if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
        return any(_differ(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() != y.keys() or any(_differ(x[k], y[k]) for k in x)
    return x != y


def same_batch(a, b) -> list:
    """The fields in which two mini-batches differ (empty: identical)."""
    diff = [f"block{i}.overlap" for i, (x, y) in enumerate(zip(a.blocks, b.blocks)) if _differ(x.overlap, y.overlap)]
    if not torch.equal(a.input_nodes, b.input_nodes):
        diff.append("input_nodes")
    for i, (x, y) in enumerate(zip(a.blocks, b.blocks)):
        for f in ("src_nodes", "edge_src", "edge_dst", "edge_ids"):
            if not torch.equal(getattr(x, f), getattr(y, f)):
                diff.append(f"block{i}.{f}")
        if x.num_dst != y.num_dst:
            diff.append(f"block{i}.num_dst")
        p, q = x.shuffle_index, y.shuffle_index
        for f in ("send_counts", "recv_counts", "num_local", "num_mixed", "tag", "identity", "num_interior"):
            if getattr(p, f) != getattr(q, f):
                diff.append(f"block{i}.shuffle_index.{f}")
        for f in ("send_idx", "recv_pos"):
            if not torch.equal(getattr(p, f), getattr(q, f)):
                diff.append(f"block{i}.shuffle_index.{f}")
    return diff


def compare_paths(rank, world_size, exchange_inputs, replace, overlap):
    graph, perm = make_problem()
    owner = torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))
    sampler = gsplit.NeighborSampler(FANOUTS, replace=replace, seed=5)
    comm = Communicator()
    out = []
    for it in range(6):
        seeds = perm[(it * 24) % 240:(it * 24) % 240 + 24]
        applies = deferred.deferred_applies(sampler, graph, comm, exchange_inputs)
        exact = sp_sample(graph, seeds, owner, sampler, comm, epoch=1, iteration=it, exchange_inputs=exchange_inputs,
                          overlap=overlap)
        if not applies:
            out.append("no history")
            continue
        mine = local_targets(seeds, owner, rank)
        batch = deferred.sample_deferred(graph, mine, owner, sampler, comm, 1, it, exchange_inputs, overlap)
        out.append("overflow" if batch is None else same_batch(exact, batch))
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_deferred_sampling_equals_the_exact_path(world_size):
    for exchange_inputs, replace, overlap in ((True, False, False), (False, True, False), (True, False, True),
                                              (False, False, True)):
        per_rank = launch(compare_paths, world_size, args=(exchange_inputs, replace, overlap))
        assert per_rank[0][0] == "no history"  # the first iteration teaches the capacities
        for rank, results in enumerate(per_rank):
            assert results == per_rank[0], (rank, results, per_rank[0])  # every rank takes the same path
            compared = [r for r in results[1:] if r != "overflow"]
            assert len(compared) >= 2 and all(r == [] for r in compared), results


def overflow_everywhere(rank, world_size):
    """A batch 8 times the size of the learnt ones outgrows the slots: every rank must see it."""
    graph, perm = make_problem()
    owner = torch.arange(graph.num_nodes) % world_size
    sampler = gsplit.NeighborSampler(FANOUTS, seed=5)
    comm = Communicator()
    sp_sample(graph, perm[:4], owner, sampler, comm, iteration=0)
    # the same batch again fits the slots learnt from it
    small = deferred.sample_deferred(graph, local_targets(perm[:4], owner, rank), owner, sampler, comm, 0, 0)
    # only rank 0's targets grow: the others' slots overflow through what rank 0 asks them for
    big = perm[8:200] if rank == 0 else perm[8:200][:0]
    grown = deferred.sample_deferred(graph, local_targets(big, owner, rank), owner, sampler, comm, 0, 2)
    return small is None, grown is None


def test_an_overflow_on_one_rank_is_seen_by_every_rank():
    assert launch(overflow_everywhere, 2) == [(False, True), (False, True)]


@pytest.mark.parametrize("fanout,replace", [(3, False), (3, True), (1, False)])
def test_padded_sampler_equals_the_sampler(fanout, replace):
    graph, perm = make_problem()
    nodes = torch.cat([perm[:40], graph.num_nodes - 1 - torch.arange(3), torch.zeros(7, dtype=torch.int64)])
    key = counter_rng.stream_key(2, 0, 1, 0)
    want = torch_ops.sample_neighbors_torch(graph, nodes[:43], fanout, replace, key)
    src, dst, eids, count, bad = ops.sample_neighbors_padded(graph, nodes, torch.tensor(43), fanout, replace, key)
    n = int(count)
    assert src.numel() == 50 * fanout and int(bad) == 0
    for got, ref in zip((src[:n], dst[:n], eids[:n]), want):
        assert torch.equal(got, ref)
    bad_nodes = nodes.clone()
    bad_nodes[2] = graph.num_nodes
    assert int(ops.sample_neighbors_padded(graph, bad_nodes, torch.tensor(43), fanout, replace, key)[4]) == 1
    bad_nodes[2], bad_nodes[45] = 0, -1  # a bad id in the padding is not looked at
    assert int(ops.sample_neighbors_padded(graph, bad_nodes, torch.tensor(43), fanout, replace, key)[4]) == 0


def test_padded_relabel_equals_relabel():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        nd, ne = int(torch.randint(0, 12, (1,), generator=g)), int(torch.randint(0, 40, (1,), generator=g))
        dst = torch.randperm(50, generator=g)[:nd]
        src = torch.randint(0, 50, (ne,), generator=g)
        want_nodes, want_local = torch_ops.relabel(dst, src)
        # padding after both, with ids that must be ignored
        pad_dst = torch.cat([dst, torch.randint(0, 50, (5,), generator=g)])
        pad_src = torch.cat([src, torch.randint(0, 50, (7,), generator=g)])
        valid = torch.arange(ne + 7) < ne
        nodes, num, local = ops.relabel_padded(pad_dst, torch.tensor(nd), pad_src, valid, 50)
        assert torch.equal(nodes[:int(num)], want_nodes)
        assert torch.equal(local[:ne], want_local)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_padded_ops_on_a_gpu_wait_for_nothing_and_equal_the_cpu():
    """The layer's ops of the deferred path on CUDA tensors (the kernels where CuPy works), under the counter's GPU
    mode: no host sync, and the CPU's results."""
    from gsplit.ops.sync_counter import HostSyncCounter

    graph, perm = make_problem()
    dev = torch.device("cuda", torch.cuda.current_device())
    gpu_graph = graph.to(dev)
    nodes = torch.cat([perm[:60], torch.zeros(20, dtype=torch.int64)])
    key = counter_rng.stream_key(2, 0, 1, 0)
    want = ops.sample_neighbors_padded(graph, nodes, torch.tensor(60), 4, False, key)
    n = int(want[3])
    want_nodes, want_num, want_local = ops.relabel_padded(nodes, torch.tensor(60), want[0],
                                                          torch.arange(want[0].numel()) < n, graph.num_nodes)
    g_nodes, g_valid = nodes.to(dev), torch.tensor(60, device=dev)
    ops.sample_neighbors_padded(gpu_graph, g_nodes, g_valid, 4, False, key)  # first use: kernel compilation
    torch.cuda.synchronize()
    counter = HostSyncCounter()
    with counter:
        got = ops.sample_neighbors_padded(gpu_graph, g_nodes, g_valid, 4, False, key)
        edge_valid = torch.arange(got[0].numel(), device=dev) < got[3]
        nodes_out, num, local = ops.relabel_padded(g_nodes, g_valid, got[0], edge_valid, graph.num_nodes)
    assert counter.total == 0, counter.report()
    assert int(got[3]) == n and int(got[4]) == 0 and int(num) == int(want_num)
    for a, b in zip(got[:3], want[:3]):
        assert torch.equal(a[:n].cpu(), b[:n])
    assert torch.equal(nodes_out[:int(num)].cpu(), want_nodes[:int(want_num)])
    assert torch.equal(local[:n].cpu(), want_local[:n])
