"""Full-graph split training at a given precision equals one process at it (the bounds and why:
``tests/minibatch/test_precision_parity.py``'s module doc): half-precision features to float64 rounding
(1e-10), bfloat16 autocast within 1e-2 on the first step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gsplit.fullgraph import FullGraphLoader
from gsplit.launcher import launch
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy
from test_full_graph import LAYERS, STEPS, make_maps, make_problem, new_model, whole_graph_block
from parity_helpers import rel_err

AUTOCAST_BOUND = 1e-2
CASES = {  # name: (feature dtype, model dtype, autocast dtype, bound, steps compared)
    "bf16 features": (torch.bfloat16, torch.float64, None, 1e-10, STEPS),
    "fp16 features": (torch.float16, torch.float64, None, 1e-10, STEPS),
    "bf16 features, bf16 autocast": (torch.bfloat16, torch.float32, torch.bfloat16, AUTOCAST_BOUND, 1),
}
MODELS = ("sage", "gat", "gcn", "gat-overlap")


def _autocast(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)


def reference(name, fdt, mdt, ac):
    graph, feats, labels, train_idx = make_problem()
    model = new_model(name).to(mdt)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    block = whole_graph_block(graph)
    losses, grads = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        with _autocast(ac):
            loss = F.cross_entropy(model([block] * LAYERS, feats.to(fdt))[train_idx], labels[train_idx])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads}


def rank_worker(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    pmap = make_maps(graph, train_idx, world_size)["metis" if world_size > 1 else "random"]
    out = {}
    for case, (fdt, mdt, ac, _, _) in CASES.items():
        loaders = {o: FullGraphLoader(graph, LAYERS, partition=pmap, features=feats.to(fdt), labels=labels,
                                      train_idx=train_idx, overlap=o) for o in (False, True)}
        for name in MODELS:
            loader = loaders[name.endswith("-overlap")]
            model = new_model(name).to(mdt)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            losses, grads = [], []
            for _ in range(STEPS):
                for _, _, blocks in loader:
                    assert blocks[0].srcdata["feat"].dtype == fdt
                    opt.zero_grad()
                    with _autocast(ac):
                        logits = loader.forward(model) if name.endswith("-overlap") else model(
                            blocks, blocks[0].srcdata["feat"])
                        loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
                    loss.backward()
                    allreduce_gradients(model, loader.comm)
                    losses.append(global_sum(loss.double(), loader.comm))
                    grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
                    opt.step()
            out[(case, name)] = {"losses": losses, "grads": grads}
    return out


def check(per_rank, world_size):
    for case, (fdt, mdt, ac, bound, steps) in CASES.items():
        for name in MODELS:
            ref = reference(name, fdt, mdt, ac)
            what = f"full graph, {name}, {case}, {world_size} ranks"
            for step in range(steps):
                got = per_rank[0][(case, name)]
                assert abs(got["losses"][step] - ref["losses"][step]) <= bound * abs(ref["losses"][step]), what
                for n, g in ref["grads"][step].items():
                    for r, res in enumerate(per_rank):
                        err = rel_err(res[(case, name)]["grads"][step][n].to(g.dtype), g)
                        assert err < bound, f"{what}: gradient of {n} on rank {r} at step {step}: {err:.2e}"


def test_two_ranks_at_a_precision_match_one_process():
    check(launch(rank_worker, 2), 2)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_more_ranks_at_a_precision_match_one_process(world_size):
    check([rank_worker(0, 1)] if world_size == 1 else launch(rank_worker, world_size), world_size)
