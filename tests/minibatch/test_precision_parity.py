"""Split training stays exact at a given precision: bfloat16/float16 features and autocast layers.

Two claims, each against one process on the whole mini-batch at the same precision:

* **Half-precision features** (stored, cached, gathered and shuffled in bfloat16 or float16) change only the
  stored values, each rounded once; the model upcasts them exactly at its first layer. So split training on
  them equals one process on the same rounded features to float64 rounding (1e-10, the bound of
  ``test_split_parity``): every row travels bit for bit.
* **Autocast** (bfloat16 matrix products, float32 master weights): ranks compute the rows they own with the
  same kernels, but a weight's gradient is a sum over rows, which split training forms as per-rank partial
  products (each rounded to bfloat16 by autocast: 8 significant bits, relative spacing 2^-8 ≈ 3.9e-3) summed
  in float32 by the all-reduce, where one process rounds the whole product once; and a product's rows are
  blocked differently for a rank's rows than for the whole batch. So the gradients of the first step (same
  parameters on both sides) differ by about one bfloat16 spacing: 3.3e-3 at most here (SAGE/GAT/GCN, 2 ranks,
  2026-11-28), about half the distance between bfloat16 and float32 training of the same batch. The bound is
  1e-2 (2.5 spacings); a split bug (a row lost or doubled, a wrong loss scale) moves gradients by O(1). Only
  the first step is compared under autocast: after an SGD step the parameters themselves differ by that
  rounding and the runs drift apart as any two bfloat16 runs do.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy
from gsplit.sampling.batches import epoch_permutation
from test_split_parity import BATCH, FANOUTS, FEAT_DIM, NUM_CLASSES, make_maps, make_problem, rel_err

ITERS = 2
AUTOCAST_BOUND = 1e-2  # see the module doc: 2.5 bfloat16 spacings (measured: at most 3.3e-3)


def _model(name: str, dtype: torch.dtype):
    torch.manual_seed(0)
    return build_model(name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2, dropout=0.4).to(dtype)


def _autocast(precision):
    return torch.autocast("cpu", dtype=precision) if precision is not None else torch.autocast("cpu", enabled=False)


def split_steps(name, feats, owner, world_size, model_dtype, precision, macrobatch=1):
    """ITERS split steps; returns the global losses and every step's gradients."""
    graph, _, labels, train_idx = make_problem()
    model = _model(name, model_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner,
                        use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats,
                        labels=labels, macrobatch=macrobatch)
    losses, grads = [], []
    for step, (_, _, blocks) in enumerate(loader):
        if step == ITERS:
            break
        assert blocks[0].srcdata["feat"].dtype == feats.dtype  # the rows travelled in the stored dtype
        opt.zero_grad()
        with _autocast(precision):
            logits = model(blocks, blocks[0].srcdata["feat"])
            loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        allreduce_gradients(model, loader.comm)
        losses.append(global_sum(loss.double(), loader.comm))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads}


def reference(name, feats, world_size, model_dtype, precision):
    """One process on the whole global mini-batch at the same precision."""
    graph, _, labels, train_idx = make_problem()
    model = _model(name, model_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    order = epoch_permutation(train_idx, 11, 0, True)
    gb = BATCH * world_size
    losses, grads = [], []
    for it in range(ITERS):
        seeds = order[it * gb:(it + 1) * gb]
        blocks = sampler.sample_blocks(graph, seeds, epoch=0, iteration=it)
        opt.zero_grad()
        with _autocast(precision):
            loss = torch.nn.functional.cross_entropy(model(blocks, feats[blocks[0].src_nodes]), labels[seeds])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads}


CASES = {  # name: (feature dtype, model dtype, autocast dtype, bound)
    "bf16 features": (torch.bfloat16, torch.float64, None, 1e-10),
    "fp16 features": (torch.float16, torch.float64, None, 1e-10),
    "bf16 features, bf16 autocast": (torch.bfloat16, torch.float32, torch.bfloat16, AUTOCAST_BOUND),
}


def rank_worker(rank, world_size, models, macrobatch):
    graph, feats, _, train_idx = make_problem()
    owner = make_maps(graph, train_idx, world_size)["gsplit" if world_size > 1 else "random"]
    return {(case, name): split_steps(name, feats.to(fdt), owner, world_size, mdt, ac, macrobatch)
            for case, (fdt, mdt, ac, _) in CASES.items() for name in models}


def check(per_rank, world_size, models):
    _, feats, _, _ = make_problem()
    for case, (fdt, mdt, ac, bound) in CASES.items():
        for name in models:
            ref = reference(name, feats.to(fdt), world_size, mdt, ac)
            what = f"{name}, {case}, {world_size} ranks"
            for it in range(ITERS if ac is None else 1):  # autocast: the first step (see the module doc)
                got = per_rank[0][(case, name)]
                assert abs(got["losses"][it] - ref["losses"][it]) <= bound * abs(ref["losses"][it]), what
                for n, g in ref["grads"][it].items():
                    for r, res in enumerate(per_rank):
                        err = rel_err(res[(case, name)]["grads"][it][n].to(g.dtype), g)
                        assert err < bound, f"{what}: gradient of {n} on rank {r} at iteration {it}: {err:.2e}"


@pytest.mark.parametrize("world_size", [1, 2])
def test_split_at_a_precision_equals_one_process(world_size):
    models = ("sage", "gat", "gcn")
    per_rank = [rank_worker(0, 1, models, 1)] if world_size == 1 else launch(rank_worker, world_size,
                                                                               args=(models, 1))
    check(per_rank, world_size, models)


@pytest.mark.slow
@pytest.mark.parametrize("world_size,macrobatch", [(3, 1), (4, 1), (2, 2), (4, 2)])
def test_split_at_a_precision_equals_one_process_more_ranks_and_macrobatches(world_size, macrobatch):
    models = ("sage", "gat", "gcn")
    check(launch(rank_worker, world_size, args=(models, macrobatch)), world_size, models)

