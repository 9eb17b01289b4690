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
from gsplit.fullgraph.cobatch import (CoBatchLoader, check_co_batches, choose_co_batches, co_batch_estimate,
                                      co_batch_targets, same_step)
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


def one_host_worker(rank, world_size, co_batches=(2, 5)):
    graph, feats, labels, train_idx = make_problem()
    owner = partition_full_graph(graph, world_size, seed=1).assignment if world_size > 1 else \
        torch.zeros(graph.num_nodes, dtype=torch.int64)
    results = {}
    for n in co_batches:
        loader = CoBatchLoader(graph, LAYERS, targets=train_idx, partition=owner, num_co_batches=n, features=feats,
                               labels=labels)
        assert len(loader) == n
        for name in MODELS:
            results[(n, name)] = train_co_batches(name, loader, loader.comm)
    return results


def check(per_rank, world_size, expect_targets):
    for case, rank0 in per_rank[0].items():
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
    check([one_host_worker(0, 1)], 1, training_vertices)


def test_two_ranks_of_one_host_in_co_batches_equal_one_process():
    check(launch(one_host_worker, 2, args=((3,),)), 2, training_vertices)
