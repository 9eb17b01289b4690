"""Cooperative batching (gsplit.fullgraph.cobatch): full-graph training in co-batches of target chunks, whose
gradients accumulate into one step per epoch, equals single-process full-graph training (float64, 1e-10), on one
host and on several preloading hosts; the count is chosen from the memory estimate; bad counts are refused.

The reference is tests/fullgraph/test_full_graph.py's single-process training on one block of the whole graph
(dropout on: every co-batch of an epoch draws the masks of one step).
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.fullgraph.cobatch import (CoBatchLoader, check_co_batches, co_batch_estimate, co_batch_targets,
                                      full_graph_loader, same_step)
from gsplit.fullgraph.loader import FullGraphMemoryError, estimate_memory, layer_dims
from gsplit.launcher import launch
from gsplit.nn import split_cross_entropy
from gsplit.partitioning import full_graph_stats, partition_full_graph
from parity_helpers import rel_err
from test_full_graph import LAYERS, STEPS, make_problem, new_model, reference

MODELS = ("sage", "gcn")


def train_co_batches(model_name, loader, world):
    """STEPS epochs, each the loader's co-batches with gradients accumulated, one all-reduce and one step."""
    model = new_model(model_name)
    loader.check_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads, targets = [], [], []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = 0.0
        for k, (_, output_nodes, blocks) in enumerate(loader):
            same_step(model, k)
            logits = model(blocks, blocks[0].srcdata["feat"])
            part = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
            part.backward()
            loss += global_sum(part, world)
            targets.append(output_nodes.tolist())
        allreduce_gradients(model, world)
        losses.append(loss)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "targets": targets}


def one_host_worker(rank, world_size, co_batches=(2, 5), models=MODELS):
    graph, feats, labels, train_idx = make_problem()
    owner = partition_full_graph(graph, world_size, seed=1).assignment if world_size > 1 else \
        torch.zeros(graph.num_nodes, dtype=torch.int64)
    results = {}
    for n in co_batches:
        loader = CoBatchLoader(graph, LAYERS, targets=train_idx, partition=owner, num_co_batches=n, features=feats,
                               labels=labels)
        assert len(loader) == n
        for name in models:
            results[(n, name)] = train_co_batches(name, loader, loader.comm)
    return results


def check(per_rank, world_size, expect_targets):
    for case in per_rank[0]:
        ref = reference(case[-1])
        what = f"{case} at world size {world_size}"
        # every training vertex is the target of exactly one co-batch of an epoch, on one rank
        epoch = sorted(v for r in per_rank for t in r[case]["targets"][:len(r[case]["targets"]) // STEPS] for v in t)
        assert epoch == expect_targets(case), what
        for step in range(STEPS):
            for r, res in enumerate(per_rank):
                assert abs(res[case]["losses"][step] - ref["losses"][step]) <= 1e-10 * abs(ref["losses"][step]), what
                for n, g_ref in ref["grads"][step].items():
                    err = rel_err(res[case]["grads"][step][n], g_ref)
                    assert err < 1e-10, f"{what}: gradient of {n} on rank {r} at step {step} ({err:.2e})"


def training_vertices(case):
    return sorted(make_problem()[3].tolist())


def test_one_process_in_co_batches_equals_full_graph_training():
    check([one_host_worker(0, 1, models=MODELS + ("gat",))], 1, training_vertices)


def test_two_ranks_of_one_host_in_co_batches_equal_one_process():
    check(launch(one_host_worker, 2, args=((3,),)), 2, training_vertices)


# ---------------------------------------------------------------------------------------------- across hosts
def preload_worker(rank, world_size, ranks_per_host, co_batches):
    graph, feats, labels, train_idx = make_problem()
    host, world = gsplit.host_groups(ranks_per_host=ranks_per_host)
    hmap = partition_full_graph(graph, world_size // ranks_per_host, seed=1)
    model = new_model("sage")
    results = {}
    for name in MODELS:
        loader = full_graph_loader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx,
                                   dims=layer_dims(model), co_batches=co_batches, host_map=hmap, group=host,
                                   replica_group=world, seed=1)
        assert isinstance(loader, CoBatchLoader) and len(loader) == co_batches
        results[("preload", name)] = train_co_batches(name, loader, world)
    return results


@pytest.mark.parametrize("hosts,ranks_per_host", [(2, 2), (3, 1)], ids=["2x2", "3x1"])
def test_preloading_hosts_in_co_batches_equal_one_process(hosts, ranks_per_host):
    # each training vertex is the target of one co-batch of its own host, on one of the host's ranks
    check(launch(preload_worker, hosts * ranks_per_host, args=(ranks_per_host, 3)), hosts * ranks_per_host,
          training_vertices)


# ---------------------------------------------------------------------------------------------- the count
def test_co_batches_are_chosen_from_the_memory_budget():
    graph, feats, labels, train_idx = make_problem()
    dims = layer_dims(new_model("sage"))
    owner = torch.zeros(graph.num_nodes, dtype=torch.int64)
    whole = estimate_memory(full_graph_stats(graph, owner, 1), 0, feats.shape[1], dims, dtype_bytes=8)
    kw = dict(features=feats, labels=labels, train_idx=train_idx, dims=dims, dtype_bytes=8)
    fits = full_graph_loader(graph, LAYERS, memory_limit=whole.total, **kw)
    assert isinstance(fits, gsplit.FullGraphLoader) and fits.co_batch_choice.num_co_batches == 1
    # a budget below the whole graph's estimate: the fewest co-batches whose largest fits it
    limit = int(whole.total * 0.9)
    chosen = full_graph_loader(graph, LAYERS, memory_limit=limit, **kw)
    n = chosen.co_batch_choice.num_co_batches
    assert isinstance(chosen, CoBatchLoader) and len(chosen) == n > 1
    assert chosen.co_batch_choice.estimate.total <= limit
    fewer = max(co_batch_estimate(graph, c, owner, 1, LAYERS, feats.shape[1], dims, dtype_bytes=8).total
                for c in co_batch_targets(graph, train_idx, n // 2, seed=0))
    assert fewer > limit  # half as many co-batches would not have fit
    with pytest.raises(FullGraphMemoryError, match="does not fit even in 70 co-batches"):
        full_graph_loader(graph, LAYERS, memory_limit=1000, **kw)


def test_co_batches_cover_the_targets_once_and_keep_neighbours_together():
    graph, _, _, train_idx = make_problem()
    chunks = co_batch_targets(graph, train_idx, 4)
    assert [c.numel() for c in chunks] == [18, 18, 17, 17]
    assert sorted(torch.cat(chunks).tolist()) == sorted(train_idx.tolist())


@pytest.mark.parametrize("n,msg", [(0, "co_batches=0; pass at least 1"),
                                   (71, "co_batches=71 but there are only 70 training vertices")])
def test_bad_co_batch_counts_are_refused(n, msg):
    with pytest.raises(ValueError, match=msg):
        check_co_batches(n, 70)
