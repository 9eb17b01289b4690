"""Full-graph training, split-parallel (gsplit.FullGraphLoader): exact against single-process full-graph training.

The reference builds one block of the whole graph straight from its CSC arrays (no sampler, no split
machinery) and trains on it with ``F.cross_entropy(logits[train_idx], labels[train_idx])``. Every world
size is one launch in which each rank trains every (map, model) case, as in tests/minibatch/test_split_parity.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gsplit
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.fullgraph.loader import (IGNORE_INDEX, FullGraphLoader, FullGraphMemoryError, check_split_safe, estimate_memory,
                              layer_dims, recompute_layers)
from gsplit.launcher import launch
from gsplit.nn import build_model, split_cross_entropy
from gsplit.nn.layers import GraphConv, SAGEConv
from gsplit.partitioning import full_graph_stats, partition_full_graph
from gsplit.sampling.block import Block
from parity_helpers import random_graph_problem, rel_err

NUM_NODES = 160
FEAT_DIM = 5
NUM_CLASSES = 3
LAYERS = 3
STEPS = 3
DROPOUT = 0.4
MODELS = ("sage", "gat", "gcn")


def make_problem():
    graph, feats, labels, gen = random_graph_problem(NUM_NODES, 500, FEAT_DIM, NUM_CLASSES, seed=5, isolated=12)
    train_idx = torch.randperm(NUM_NODES, generator=gen)[:70]
    return graph, feats, labels, train_idx


def make_maps(graph, train_idx, world_size):
    maps = {"random": torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(2))}
    if world_size > 1:
        maps["metis"] = partition_full_graph(graph, world_size, seed=1)
        starved = maps["random"].clone()
        starved[train_idx] = starved[train_idx] % (world_size - 1)  # the last rank owns no training vertex
        maps["starved"] = starved
    return maps


def whole_graph_block(graph) -> Block:
    """Every vertex, every in-edge, from the CSC arrays alone."""
    n = graph.num_nodes
    return Block(src_nodes=torch.arange(n), num_dst=n, edge_src=graph.indices.clone(), edge_dst=graph.edge_dst(),
                 edge_ids=torch.arange(graph.num_edges))


class DGLStyleNet(torch.nn.Module):
    """A user's model as in DGL's examples: layers called as layer(block, h), relu between; no gsplit calls."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([SAGEConv(FEAT_DIM, 8), GraphConv(8, 8, norm="right"),
                                           SAGEConv(8, NUM_CLASSES)])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


def new_model(name):
    torch.manual_seed(0)
    if name == "dglstyle":
        return DGLStyleNet().double()
    base = name.replace("-recompute", "").replace("-overlap", "")
    model = build_model(base, FEAT_DIM, 8, NUM_CLASSES, num_layers=LAYERS, heads=2, dropout=DROPOUT).double()
    return recompute_layers(model) if name.endswith("-recompute") else model


def reference(model_name):
    graph, feats, labels, train_idx = make_problem()
    model = new_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    block = whole_graph_block(graph)
    losses, grads = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        logits = model([block] * LAYERS, feats)
        loss = F.cross_entropy(logits[train_idx], labels[train_idx])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def train_split(model_name, loader):
    """STEPS epochs on the loader; gsplit's models with split_cross_entropy, the DGL-style one under SplitParallel."""
    model = new_model(model_name)
    loader.check_model(model)
    wrapped = gsplit.SplitParallel(model, loader) if model_name == "dglstyle" else None
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads, outputs = [], [], []
    for epoch in range(STEPS):
        for input_nodes, output_nodes, blocks in loader:
            opt.zero_grad()
            if model_name.endswith("-overlap"):  # boundary rows first, their shuffle overlapped (G3's order)
                logits = loader.forward(model)
                loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
                loss.backward()
                allreduce_gradients(model, loader.comm)
                losses.append(global_sum(loss, loader.comm))
            elif wrapped is not None:
                logits = wrapped(blocks, blocks[0].srcdata["feat"])
                loss = F.cross_entropy(logits, blocks[-1].dstdata["label"])  # the user's plain mean loss
                loss.backward()
                losses.append(wrapped.global_loss(loss))
            else:
                logits = model(blocks, blocks[0].srcdata["feat"])
                loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
                loss.backward()
                allreduce_gradients(model, loader.comm)
                losses.append(global_sum(loss, loader.comm))
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            outputs.append(output_nodes.tolist())
            opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "outputs": outputs}


ALL_MODELS = ("sage", "gat", "gcn", "dglstyle", "sage-recompute", "gat-recompute", "sage-overlap", "gat-overlap",
              "gcn-overlap")
QUICK = (("starved",), ("sage", "dglstyle", "gat-overlap"))
"""The fast two-rank case: a random map whose last rank owns no training vertex; plain, wrapped, overlapped."""


def rank_worker(rank, world_size, quick=False):
    graph, feats, labels, train_idx = make_problem()
    results = {}
    for map_name, pmap in make_maps(graph, train_idx, world_size).items():
        if quick and map_name not in QUICK[0]:
            continue
        loaders = {overlap: FullGraphLoader(graph, LAYERS, partition=pmap, features=feats, labels=labels,
                                            train_idx=train_idx, overlap=overlap) for overlap in (False, True)}
        for model_name in QUICK[1] if quick else ALL_MODELS:
            results[(map_name, model_name)] = train_split(model_name, loaders[model_name.endswith("-overlap")])
    return results


def check_against_reference(per_rank, world_size):
    refs = {}
    for (map_name, model_name), rank0 in per_rank[0].items():
        ref = refs.setdefault(model_name, reference(model_name))
        case = f"{model_name} on the {map_name} map at world size {world_size}"
        assert len(rank0["losses"]) == STEPS, case
        owned = sorted(v for r in per_rank for v in r[(map_name, model_name)]["outputs"][0])
        assert owned == list(range(NUM_NODES)), f"{case}: the ranks' vertices are not a partition of the graph"
        for step in range(STEPS):
            assert abs(rank0["losses"][step] - ref["losses"][step]) <= 1e-10 * abs(ref["losses"][step]), case
            for name, g_ref in ref["grads"][step].items():
                for r, res in enumerate(per_rank):
                    err = rel_err(res[(map_name, model_name)]["grads"][step][name], g_ref)
                    assert err < 1e-10, f"{case}: gradient of {name} on rank {r} differs at step {step} ({err:.2e})"
        for name, p_ref in ref["params"].items():
            assert rel_err(rank0["params"][name], p_ref) < 1e-10, f"{case}: parameter {name} drifted"


def test_one_process_matches_whole_graph_training():
    check_against_reference([rank_worker(0, 1)], 1)


def test_two_ranks_match_single_process():
    check_against_reference(launch(rank_worker, 2, args=(True,)), 2)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_map_and_model_matches_single_process(world_size):
    """Random, METIS and starved maps; SAGE, GAT, GCN, a DGL-style model under SplitParallel, recompute."""
    check_against_reference(launch(rank_worker, world_size), world_size)


# ---------------------------------------------------------------------------------------------- PyG
def pyg_worker(rank, world_size):
    from torch_geometric.nn import SAGEConv as PygSAGE

    from gsplit.interop.pyg import BlockConv

    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([BlockConv(PygSAGE(FEAT_DIM, 8)), BlockConv(PygSAGE(8, NUM_CLASSES))]).double()
    pmap = partition_full_graph(graph, world_size) if world_size > 1 else None
    loader = FullGraphLoader(graph, 2, partition=pmap, features=feats, labels=labels, train_idx=train_idx)
    _, _, blocks = next(iter(loader))
    logits = gsplit.sp_forward(layers, blocks[0].srcdata["feat"], blocks, between=lambda i, h, b: F.relu(h))
    split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
    allreduce_gradients(layers, loader.comm)
    return {n: p.grad for n, p in layers.named_parameters()}


@pytest.mark.slow
def test_pyg_layers_train_on_the_full_graph():
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import SAGEConv as PygSAGE

    from gsplit.interop.pyg import BlockConv

    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([BlockConv(PygSAGE(FEAT_DIM, 8)), BlockConv(PygSAGE(8, NUM_CLASSES))]).double()
    block = whole_graph_block(graph)
    logits = gsplit.sp_forward(layers, feats, [block, block], between=lambda i, h, b: F.relu(h))
    F.cross_entropy(logits[train_idx], labels[train_idx]).backward()
    for r, grads in enumerate(launch(pyg_worker, 2)):
        for n, p in layers.named_parameters():
            assert rel_err(grads[n], p.grad) < 1e-10, f"rank {r}: {n}"


# ---------------------------------------------------------------------------------------------- the batch itself
def test_batch_is_built_once_and_masks_non_training_labels():
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx)
    first = next(iter(loader))
    second = next(iter(loader))
    assert len(loader) == 1
    assert first.blocks[0] is second.blocks[0], "the blocks must be built once and reused every epoch"
    top = first.blocks[-1]
    assert top.num_edges() == graph.num_edges and top.num_dst_nodes() == NUM_NODES
    assert top.global_num_dst == train_idx.numel() == top.num_loss_rows
    label = top.dstdata["label"]
    is_train = torch.zeros(NUM_NODES, dtype=torch.bool)
    is_train[train_idx] = True
    assert torch.equal(label[is_train], labels[is_train]) and bool((label[~is_train] == IGNORE_INDEX).all())
    assert torch.equal(first.blocks[0].srcdata["feat"], feats[first.blocks[0].src_nodes])


def test_recompute_keeps_fewer_tensors_for_backward():
    """recompute_layers: the tensors saved for backward shrink (measured with saved-tensor hooks)."""
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx)
    _, _, blocks = next(iter(loader))

    def saved_bytes(model):
        total = []

        def pack(t):
            total.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"],
                                       blocks[-1])
        loss.backward()
        return sum(total)

    for name in ("sage", "gat"):
        plain, recomputed = saved_bytes(new_model(name)), saved_bytes(new_model(name + "-recompute"))
        # 0.65: since SAGE-mean's plain layer saves less itself (one [h_dst | mean] input, no degree column:
        # 138,120 -> 122,904 bytes here, issue 20), recompute's unchanged 76,808 bytes are 0.62 of it (0.56 before).
        assert recomputed < 0.65 * plain, f"{name}: {recomputed} saved bytes with recompute vs {plain} without"


def test_memory_estimate_is_close_to_saved_tensors():
    """The activation estimate stays within a factor 2 of the bytes autograd actually keeps."""
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx)
    _, _, blocks = next(iter(loader))
    for name in MODELS:
        model = new_model(name)
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(blocks, blocks[0].srcdata["feat"])
        est = loader.estimate_memory(model)
        est = est.activations + est.features  # the first layer keeps the features as its input rows
        measured = sum(seen.values())
        assert 0.5 * measured <= est <= 2 * measured, f"{name}: estimate {est} vs measured {measured}"


# ---------------------------------------------------------------------------------------------- errors
def test_map_for_another_graph_or_world_size_is_refused():
    graph, feats, labels, train_idx = make_problem()
    other, *_ = random_graph_problem(NUM_NODES + 1, 500, FEAT_DIM, NUM_CLASSES, seed=9, isolated=0)
    with pytest.raises(ValueError, match="partition map was made for a graph with 161 nodes"):
        FullGraphLoader(graph, LAYERS, partition=partition_full_graph(other, 1), features=feats)
    with pytest.raises(ValueError, match="partition map has 2 parts but the world size is 1"):
        FullGraphLoader(graph, LAYERS, partition=partition_full_graph(graph, 2), features=feats)


def test_layers_that_are_not_split_safe_are_refused():
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, 2, features=feats, labels=labels, train_idx=train_idx)

    class WithBatchNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([SAGEConv(FEAT_DIM, 4), SAGEConv(4, 3)])
            self.norm = torch.nn.BatchNorm1d(4)

    with pytest.raises(ValueError, match="BatchNorm1d.*its own vertices only"):
        loader.check_model(WithBatchNorm())

    class SymmetricGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([GraphConv(FEAT_DIM, 4, norm="both"), GraphConv(4, 3)])

    with pytest.raises(ValueError, match="GraphConv\\(norm='both'\\).*use norm='right'"):
        check_split_safe(SymmetricGCN())
    with pytest.raises(ValueError, match="the model has 3 layers but the loader was built for 2"):
        loader.check_model(new_model("sage"))


def test_graph_that_cannot_fit_is_refused_before_building(monkeypatch):
    graph, feats, labels, train_idx = make_problem()
    import gsplit.fullgraph.loader as fg

    built = []
    monkeypatch.setattr(fg, "_build", lambda *a, **k: built.append(1))
    with pytest.raises(FullGraphMemoryError, match=r"needs about 0\.00 GiB .* only 0\.00 GiB are available"):
        FullGraphLoader(graph, LAYERS, features=feats, memory_limit=1000)
    assert not built, "the blocks must not be built when they cannot fit"


def test_model_whose_activations_cannot_fit_is_refused():
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx, memory_limit=None)
    need = loader.estimate_memory(new_model("gat")).total
    loader.memory_limit = need - 1
    with pytest.raises(FullGraphMemoryError, match="recompute_layers"):
        loader.check_model(new_model("gat"))
    assert loader.estimate_memory(new_model("gat-recompute")).activations < \
        loader.estimate_memory(new_model("gat")).activations


# ---------------------------------------------------------------------------------------------- partition and stats
def test_full_graph_partition_balances_edges_and_cuts_fewer_edges_than_random():
    ds = gsplit.datasets.load("synthetic", num_nodes=3000, seed=0)
    pmap = partition_full_graph(ds.graph, 4, seed=0)
    stats = full_graph_stats(ds.graph, pmap)
    rand = full_graph_stats(ds.graph, gsplit.partition(ds.graph, 4, method="random"))
    assert pmap.method == "full-graph" and sum(stats.vertices) == 3000
    assert stats.edge_imbalance < 1.1 and stats.vertex_imbalance < 1.1, stats.to_dict()
    assert stats.cut_edges < 0.5 * rand.cut_edges, (stats.cut_edges, rand.cut_edges)
    assert sum(stats.halo_rows) == sum(stats.sent_rows)


def test_stats_count_halo_rows_and_cut_edges_by_hand():
    # path 0-1-2-3 (both directions), parts {0,1} {2,3}: edges 1->2 and 2->1 cross
    g = gsplit.Graph.from_edges([0, 1, 2], [1, 2, 3], symmetric=True)
    s = full_graph_stats(g, torch.tensor([0, 0, 1, 1]), 2)
    assert s.cut_edges == 2 and s.halo_rows == [1, 1] and s.sent_rows == [1, 1]
    assert s.in_edges == [3, 3] and s.vertices == [2, 2]
    est = estimate_memory(s, 0, feat_dim=4, dims=layer_dims(build_model("sage", 4, 8, 2, 2)))
    assert est.features == 3 * 4 * 4 and est.activations > 0


# ---------------------------------------------------------------------------------------------- harness and CLI
def harness_config():
    from gsplit.run.trainer import TrainConfig

    return TrainConfig(model="sage", system="full", fanouts=[-1, -1], hidden=16, epochs=3, lr=0.01, dropout=0.5,
                       device="cpu", final_eval=False)


@pytest.mark.slow
def test_harness_trains_full_graph_on_one_and_two_ranks_alike():
    """gsplit train --full-graph's harness: the same losses (float32, vertex dropout, Adam) at 1 and 2 ranks."""
    from gsplit.run.trainer import train_rank

    ds = gsplit.datasets.load("synthetic", num_nodes=1500, seed=0)
    one = train_rank(0, 1, harness_config(), ds, None)
    pmap = partition_full_graph(ds.graph, 2)
    two = launch(train_rank, 2, args=(harness_config(), ds, pmap.assignment))[0]
    losses1, losses2 = [e["loss"] for e in one["epochs"]], [e["loss"] for e in two["epochs"]]
    assert losses1[-1] < losses1[0], losses1
    for a, b in zip(losses1, losses2):
        assert abs(a - b) < 1e-5 * abs(a), (losses1, losses2)
    for name in ("val_acc", "test_acc"):
        assert abs(one["epochs"][-1][name] - two["epochs"][-1][name]) < 1e-9
    assert two["epochs"][-1]["traffic_bytes_by_tag"], "the shuffles of two ranks send rows"


def run_cli(argv, capsys):
    from gsplit.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prepare_and_stats_report_cut_edges_and_halo(tmp_path, capsys):
    data = ["-D", "num_nodes=2000"]
    code, out, err = run_cli(["prepare", "--full-graph", *data, "--num-parts", "2", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "halo rows" in out and "cut edges" in out
    assert gsplit.PartitionMap.load(tmp_path).method == "full-graph"
    code, out, err = run_cli(["stats", *data, "--partition", str(tmp_path), "--json", str(tmp_path / "s.json")],
                             capsys)
    assert code == 0, err
    assert "halo rows" in out and "in-edges" in out
    import json

    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["num_parts"] == 2 and len(saved["halo_rows"]) == 2 and saved["cut_edges"] > 0


def test_cli_refuses_full_graph_with_another_system(capsys):
    code, out, err = run_cli(["train", "--full-graph", "--system", "dp", "-D", "num_nodes=500"], capsys)
    assert code == 2 and "cannot be combined with --system dp" in err


def test_cli_refuses_a_graph_that_cannot_fit_before_starting_ranks(monkeypatch, capsys):
    import gsplit.fullgraph.loader as fg

    monkeypatch.setattr(fg, "available_memory", lambda device, ranks_sharing=1: 10_000)
    code, out, err = run_cli(["train", "--full-graph", "-D", "num_nodes=2000", "--num-ranks", "2", "--device", "cpu",
                              "--fanouts=-1,-1"], capsys)
    assert code == 2, (out, err)
    assert "needs about" in err and "--recompute" in err and "training gcn" not in out


def test_overlap_sends_boundary_rows_before_the_interior_computes(monkeypatch):
    """G3's order, forward and backward: the exchange starts before the interior rows compute and is waited
    for after; in backward the halo gradients are sent before the interior part's backward runs."""
    import gsplit.fullgraph.overlap as ov

    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx, overlap=True)
    plan = loader.full_graph.overlap_plan
    events = []
    start, wait = ov._Exchange.start, ov._Exchange.wait
    monkeypatch.setattr(ov._Exchange, "start", lambda self, *a: (events.append(("start", self.tag)), start(self, *a))[1])
    monkeypatch.setattr(ov._Exchange, "wait", lambda self: (events.append(("wait", self.tag)), wait(self))[1])
    model = new_model("sage")
    for i, layer in enumerate(model.layers):
        inner = layer.forward

        def forward(block, h, _inner=inner, _i=i):
            if block is plan.interior_blocks[_i]:
                events.append(("interior forward", _i))
                if h.requires_grad:
                    h.register_hook(lambda g: events.append(("interior backward", _i)))
            return _inner(block, h)

        layer.forward = forward
    logits = loader.forward(model)
    loss = split_cross_entropy(logits, loader.blocks[-1].dstdata["label"], loader.blocks[-1])
    loss.backward()
    at = {e: k for k, e in enumerate(events)}
    for i in range(LAYERS - 1):
        fwd, bwd = f"shuffle/layer{i + 1}/overlap/fwd", f"shuffle/layer{i + 1}/overlap/bwd"
        assert at[("start", fwd)] < at[("interior forward", i)] < at[("wait", fwd)], events
        assert at[("start", bwd)] < at[("wait", bwd)], events
    # layer 1's interior backward runs while the halo gradients of the exchange after it travel
    assert at[("start", "shuffle/layer2/overlap/bwd")] < at[("interior backward", 1)] < \
        at[("wait", "shuffle/layer2/overlap/bwd")], events
    # and the result is the plain forward's
    plain = new_model("sage")
    assert torch.allclose(plain(loader.blocks, loader.blocks[0].srcdata["feat"]), logits, rtol=1e-12, atol=1e-12)


def test_overlap_needs_the_plan():
    graph, feats, labels, train_idx = make_problem()
    loader = FullGraphLoader(graph, LAYERS, features=feats, labels=labels, train_idx=train_idx)
    with pytest.raises(ValueError, match="overlap=True"):
        loader.forward(new_model("sage"))


def test_cli_trains_full_graph_on_one_rank(tmp_path, capsys):
    code, out, err = run_cli(["train", "--full-graph", "-D", "num_nodes=600", "--num-ranks", "1", "--device", "cpu",
                              "--fanouts=-1,-1", "--hidden", "16", "--epochs", "2", "--recompute",
                              "--log", str(tmp_path / "run.jsonl")], capsys)
    assert code == 0, err
    assert "full-graph memory estimate" in out and "training sage with full on 1 rank" in out
    from gsplit.runtime.io import read_run_log

    log = read_run_log(tmp_path / "run.jsonl")
    assert log["config"]["system"] == "full" and log["config"]["recompute"] is True
    assert len(log["epochs"]) == 2 and log["complete"] and "final_val_acc" in log
