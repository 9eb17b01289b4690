"""Deep residual models (gsplit.nn.DeepSAGE / DeepGCN, DeeperGCN res+ blocks) are split-exact like the others.

Split training over 1-4 ranks computes the losses, gradients and parameters of one process on the same mini-batches
(tests/minibatch/test_split_parity.py's problem and reference loop, here at 5 layers) and of whole-graph training
(tests/fullgraph/test_full_graph.py's), with vertex-keyed dropout, overlapped layers and recompute; one slow test
trains 16 layers. The model also works where the others do: layer-wise inference, model.pt, the memory estimate.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gsplit
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.fullgraph.loader import FullGraphLoader, check_split_safe, layer_dims, recompute_layers
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import DeepGCN, DeepSAGE, build_model, split_cross_entropy
from gsplit.sampling.batches import epoch_permutation
from parity_helpers import rel_err

import test_full_graph as fg
import test_split_parity as mb

DEEP = ("deep-sage", "deep-gcn")
FANOUTS = [2, -1, 2, 3, 2]   # five layers, one of them "all neighbours"
TOL = 1e-10                  # float64; the overlapped path differs from the plain one by rounding only (1e-12)


def new_model(name, num_layers, feat_dim):
    torch.manual_seed(0)
    model = build_model(name.replace("-recompute", ""), feat_dim, 8, mb.NUM_CLASSES, num_layers=num_layers,
                        dropout=mb.DROPOUT).double()
    return recompute_layers(model) if name.endswith("-recompute") else model


# ---------------------------------------------------------------------------------------------- mini-batch
def minibatch_steps(name, fanouts, owner, world_size, overlap):
    graph, feats, labels, train_idx = mb.make_problem()
    model = new_model(name, len(fanouts), mb.FEAT_DIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(fanouts, seed=3), partition=owner,
                        use_ddp=world_size > 1, batch_size=mb.BATCH, shuffle=True, ddp_seed=11, features=feats,
                        labels=labels, overlap=overlap)
    losses, grads = [], []
    for step, (_, _, blocks) in enumerate(loader):
        if step == mb.ITERS:
            break
        if overlap and world_size > 1:
            assert all(b.overlap is not None for b in blocks[:-1]), "the overlapped path must run"
        opt.zero_grad()
        loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        allreduce_gradients(model, loader.comm)
        losses.append(global_sum(loss, loader.comm))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def minibatch_reference(name, fanouts, world_size):
    """One process on the whole global mini-batch (test_split_parity's reference loop)."""
    graph, feats, labels, train_idx = mb.make_problem()
    model = new_model(name, len(fanouts), mb.FEAT_DIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(fanouts, seed=3)
    order = epoch_permutation(train_idx, 11, 0, True)
    gb = mb.BATCH * world_size
    losses, grads = [], []
    for it in range(mb.ITERS):
        seeds = order[it * gb:(it + 1) * gb]
        blocks = sampler.sample_blocks(graph, seeds, epoch=0, iteration=it)
        opt.zero_grad()
        loss = F.cross_entropy(model(blocks, feats[blocks[0].src_nodes]), labels[seeds])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def minibatch_worker(rank, world_size, fanouts=tuple(FANOUTS), models=DEEP):
    graph, _, _, train_idx = mb.make_problem()
    maps = mb.make_maps(graph, train_idx, world_size)
    maps.pop("gsplit", None)  # random and starved maps: the pre-sampled METIS map is test_split_parity's
    out = {}
    for map_name, owner in maps.items():
        for name in models:
            for overlap in ((False, True) if world_size > 1 else (False,)):
                out[(map_name, name, overlap)] = minibatch_steps(name, list(fanouts), owner, world_size, overlap)
    return out


def check_against(per_rank, world_size, reference, steps: int, what: str = "iteration"):
    """Every rank's losses, gradients and final parameters against one process's (``reference(name)``)."""
    refs = {}
    for key, rank0 in per_rank[0].items():
        name = key[1]
        ref = refs.setdefault(name, reference(name))
        case = f"{key} at world size {world_size}"
        assert len(rank0["losses"]) == steps, case
        for it in range(steps):
            assert abs(rank0["losses"][it] - ref["losses"][it]) <= TOL * abs(ref["losses"][it]), case
            for pname, g_ref in ref["grads"][it].items():
                for r, res in enumerate(per_rank):
                    err = rel_err(res[key]["grads"][it][pname], g_ref)
                    assert err < TOL, f"{case}: gradient of {pname} on rank {r} differs at {what} {it} ({err:.1e})"
        for pname, p_ref in ref["params"].items():
            assert rel_err(rank0["params"][pname], p_ref) < TOL, f"{case}: parameter {pname} drifted"


def check_minibatch(per_rank, world_size, fanouts=FANOUTS):
    check_against(per_rank, world_size, lambda name: minibatch_reference(name, fanouts, world_size), mb.ITERS)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_minibatch_split_training_matches_one_process(world_size):
    per_rank = [minibatch_worker(0, 1)] if world_size == 1 else launch(minibatch_worker, world_size)
    check_minibatch(per_rank, world_size)


# ---------------------------------------------------------------------------------------------- full graph
def fullgraph_steps(name, num_layers, loader):
    model = new_model(name, num_layers, fg.FEAT_DIM)
    loader.check_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], []
    for _ in range(fg.STEPS):
        for _, _, blocks in loader:
            opt.zero_grad()
            logits = loader.forward(model) if loader.full_graph.overlap_plan is not None else \
                model(blocks, blocks[0].srcdata["feat"])
            loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
            loss.backward()
            allreduce_gradients(model, loader.comm)
            losses.append(global_sum(loss, loader.comm))
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def fullgraph_reference(name, num_layers):
    graph, feats, labels, train_idx = fg.make_problem()
    model = new_model(name, num_layers, fg.FEAT_DIM)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    block = fg.whole_graph_block(graph)
    losses, grads = [], []
    for _ in range(fg.STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model([block] * num_layers, feats)[train_idx], labels[train_idx])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


FULL_CASES = (("deep-sage", False), ("deep-gcn", False), ("deep-sage-recompute", False), ("deep-sage", True),
              ("deep-gcn", True))
"""(model, overlap): plain, recompute, and the boundary-first overlapped forward (loader.forward)."""


def fullgraph_worker(rank, world_size, num_layers=5, cases=FULL_CASES):
    graph, feats, labels, train_idx = fg.make_problem()
    maps = fg.make_maps(graph, train_idx, world_size)
    out = {}
    for map_name, pmap in maps.items():
        loaders = {overlap: FullGraphLoader(graph, num_layers, partition=pmap, features=feats, labels=labels,
                                            train_idx=train_idx, overlap=overlap) for overlap in (False, True)}
        for name, overlap in cases:
            out[(map_name, name, overlap)] = fullgraph_steps(name, num_layers, loaders[overlap])
    return out


def check_fullgraph(per_rank, world_size, num_layers=5):
    check_against(per_rank, world_size, lambda name: fullgraph_reference(name, num_layers), fg.STEPS, "step")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_full_graph_split_training_matches_one_process(world_size):
    per_rank = [fullgraph_worker(0, 1)] if world_size == 1 else launch(fullgraph_worker, world_size)
    check_fullgraph(per_rank, world_size)


@pytest.mark.slow
def test_sixteen_layers_match_one_process_on_two_ranks():
    """GraNNDis's depth regime: 16 res+ layers, full-graph and mini-batch (fanout 2 per layer), two ranks."""
    fanouts = (2,) * 16
    check_minibatch(launch(minibatch_worker, 2, args=(fanouts, ("deep-sage",))), 2, list(fanouts))
    check_fullgraph(launch(fullgraph_worker, 2, args=(16, (("deep-sage", False), ("deep-gcn", True)))), 2, 16)


# ---------------------------------------------------------------------------------------------- the model itself
def test_res_plus_block_is_pre_activation_plus_the_destinations_input():
    """Layer i > 0 computes h_dst + conv(relu(norm(h))) (eval: no dropout); the first has no residual, the last a head."""
    graph, feats, _, _ = fg.make_problem()
    block = fg.whole_graph_block(graph)
    model = DeepSAGE(fg.FEAT_DIM, 8, 3, num_layers=3).double().eval()
    first, middle, last = model.layers
    h0 = first(block, feats)
    assert torch.allclose(h0, first.conv(block, first.encoder(feats)))
    h1 = middle(block, h0)
    assert torch.allclose(h1, h0 + middle.conv(block, torch.relu(middle.norm(h0))))
    out = last(block, h1)
    pre = h1 + last.conv(block, torch.relu(last.norm(h1)))
    assert torch.allclose(out, last.head(torch.relu(last.head_norm(pre))))
    assert torch.allclose(model([block] * 3, feats), out)
    assert [layer.residual for layer in model.layers] == [False, True, True]


def test_dropout_counts_steps_and_resumes_from_the_state_dict():
    graph, feats, _, _ = fg.make_problem()
    blocks = [fg.whole_graph_block(graph)] * 4
    a = new_model("deep-gcn", 4, fg.FEAT_DIM)
    first, second = a(blocks, feats), a(blocks, feats)
    assert a.step == 2 and not torch.allclose(first, second), "each step draws new dropout masks"
    b = new_model("deep-gcn", 4, fg.FEAT_DIM)
    b.load_state_dict(a.state_dict())
    assert b.step == 2 and all(layer._counter is b._counter for layer in b.layers)
    assert torch.equal(a(blocks, feats), b(blocks, feats)), "a reloaded model draws the masks of an uninterrupted run"


def test_layerwise_inference_equals_the_forward():
    graph, feats, _, _ = fg.make_problem()
    model = DeepGCN(fg.FEAT_DIM, 8, 3, num_layers=6, dropout=0.5).double().eval()
    expected = model([fg.whole_graph_block(graph)] * 6, feats)
    result = gsplit.layerwise_inference(model, graph, feats, batch_size=37)
    assert result.between == "model.between"
    assert rel_err(result.output, expected) < 1e-12


def test_split_safe_estimated_and_saved_like_the_others(tmp_path):
    from gsplit.run.model_io import load_model, save_model

    graph, feats, _, _ = fg.make_problem()
    for name in DEEP:
        model = build_model(name, fg.FEAT_DIM, 8, fg.NUM_CLASSES, num_layers=4, dropout=0.5).double()
        check_split_safe(model)  # LayerNorm, not BatchNorm
        dims = layer_dims(model)
        assert [d[:2] for d in dims] == [(fg.FEAT_DIM, 8), (8, 8), (8, 8), (8, fg.NUM_CLASSES)]
        spec = {"name": name, "in_feats": fg.FEAT_DIM, "hidden": 8, "num_classes": fg.NUM_CLASSES, "num_layers": 4,
                "dropout": 0.5, "heads": 4}
        save_model(tmp_path / f"{name}.pt", model, spec)
        loaded = load_model(tmp_path / f"{name}.pt").model.double()
        blocks = [fg.whole_graph_block(graph)] * 4
        assert type(loaded) is type(model) and torch.equal(loaded(blocks, feats), model.eval()(blocks, feats))


def test_memory_estimate_is_close_to_saved_tensors():
    """As tests/fullgraph's check for SAGE/GCN/GAT: within a factor 2 of what autograd keeps, plain and recompute."""
    graph, feats, labels, train_idx = fg.make_problem()
    loader = FullGraphLoader(graph, 6, features=feats, labels=labels, train_idx=train_idx)
    _, _, blocks = next(iter(loader))
    for name in ("deep-sage", "deep-gcn", "deep-sage-recompute"):
        model = new_model(name, 6, fg.FEAT_DIM)
        seen = {}

        def pack(t, seen=seen):
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(blocks, blocks[0].srcdata["feat"])
        est = loader.estimate_memory(model)
        est = est.activations + est.features
        measured = sum(seen.values())
        assert 0.5 * measured <= est <= 2 * measured, f"{name}: estimate {est} vs measured {measured}"


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="num_layers=0"):
        DeepSAGE(4, 8, 3, num_layers=0)
    with pytest.raises(ValueError, match="dropout=1"):
        DeepGCN(4, 8, 3, num_layers=2, dropout=1.0)
    with pytest.raises(ValueError, match="one width"):
        gsplit.nn.ResPlusLayer(gsplit.nn.SAGEConv(4, 8), index=1, residual=True)
