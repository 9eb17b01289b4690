"""Layer-wise full-graph inference: split-parallel over any world size and map equals one process.

The reference is the model's own ``forward`` on one block holding every vertex and every edge, used
for every layer: no chunks, no split, no layer-wise code. Each world size is one launch in which
every rank runs every (model, map, chunk size) case.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.minibatch.inference import InferenceResult, accuracy, gather_rows, layerwise_inference
from gsplit.launcher import launch
from gsplit.nn import build_model
from parity_helpers import random_graph_problem, rel_err

NUM_NODES = 150
FEAT_DIM = 5
NUM_CLASSES = 3
NUM_LAYERS = 3
MODELS = ("sage", "gat", "gcn")
CHUNKS = (7, 1000)   # smaller than every rank's owned set, and larger than the whole graph


def make_problem():
    # the last 10 vertices have no edges
    graph, feats, labels, g = random_graph_problem(NUM_NODES, 500, FEAT_DIM, NUM_CLASSES, seed=5, isolated=10)
    eval_ids = torch.randperm(NUM_NODES, generator=g)[:40]
    return graph, feats, labels, eval_ids


def make_model(name):
    torch.manual_seed(0)
    # dropout > 0: inference must switch it off (eval mode) on every rank
    return build_model(name, FEAT_DIM, 8, NUM_CLASSES, num_layers=NUM_LAYERS, heads=2, dropout=0.4).double()


def make_maps(graph, world_size):
    rand = torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))
    maps = {"random": rand,
            # contiguous id ranges: every rank's vertices are one block of ids (unbalanced neighbourhoods)
            "ranges": torch.arange(graph.num_nodes) * world_size // graph.num_nodes}
    if world_size > 1:
        maps["starved"] = rand % (world_size - 1)  # the last rank owns no vertex at all
        maps["map"] = gsplit.PartitionMap.from_tensor(rand, num_parts=world_size)  # a PartitionMap object
    return maps


def full_block(graph):
    """One block holding every vertex (as source and destination) and every edge."""
    return gsplit.NeighborSampler([-1]).sample_blocks(graph, torch.arange(graph.num_nodes))[0]


def reference(name):
    graph, feats, labels, eval_ids = make_problem()
    model = make_model(name).eval()
    with torch.no_grad():
        return model([full_block(graph)] * NUM_LAYERS, feats)


def rank_worker(rank, world_size):
    graph, feats, labels, eval_ids = make_problem()
    out = {}
    for map_name, pmap in make_maps(graph, world_size).items():
        for name in MODELS:
            model = make_model(name)
            for chunk in CHUNKS:
                res = layerwise_inference(model, graph, feats, partition=pmap,
                                          batch_size=chunk)
                assert model.training, "inference must restore the model's training mode"
                out[(map_name, name, chunk)] = {
                    "nodes": res.nodes, "output": res.output,
                    "gathered": gather_rows(res, eval_ids),
                    "acc": accuracy(res, labels, eval_ids),
                    "acc_mask": accuracy(res, labels, torch.isin(torch.arange(NUM_NODES), eval_ids)),
                }
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_split_inference_equals_single_process(world_size):
    per_rank = [rank_worker(0, 1)] if world_size == 1 else launch(rank_worker, world_size)
    graph, feats, labels, eval_ids = make_problem()
    refs = {name: reference(name) for name in MODELS}
    maps = make_maps(graph, world_size)
    for (map_name, name, chunk), rank0 in per_rank[0].items():
        case = f"{name}, {map_name} map, chunk {chunk}, world size {world_size}"
        ref = refs[name]
        assert ref.shape == (NUM_NODES, NUM_CLASSES)
        owner = maps[map_name]
        owner = owner.assignment.long() if isinstance(owner, gsplit.PartitionMap) else owner
        full = torch.full_like(ref, float("nan"))
        for r, res in enumerate(per_rank):
            got = res[(map_name, name, chunk)]
            # each rank holds exactly the vertices it owns, sorted
            assert torch.equal(got["nodes"], (owner == r).nonzero().squeeze(1)), case
            assert got["output"].shape == (got["nodes"].numel(), NUM_CLASSES), case
            full[got["nodes"]] = got["output"]
            assert rel_err(got["gathered"], ref[eval_ids], floor=1e-12) <= 1e-10, case
        assert not torch.isnan(full).any(), case
        assert rel_err(full, ref, floor=1e-12) <= 1e-10, f"{case}: rel. err {rel_err(full, ref, floor=1e-12):.2e}"
        expected_acc = float((ref[eval_ids].argmax(1) == labels[eval_ids]).double().mean())
        for res in per_rank:
            assert res[(map_name, name, chunk)]["acc"] == pytest.approx(expected_acc, abs=1e-12), case
            assert res[(map_name, name, chunk)]["acc_mask"] == pytest.approx(expected_acc, abs=1e-12), case
    if world_size > 1:
        assert per_rank[-1][("starved", "sage", 7)]["nodes"].numel() == 0  # the case was really there


def test_inference_refuses_models_without_the_protocol():
    graph, feats, _, _ = make_problem()

    class Flat(torch.nn.Module):
        def forward(self, blocks, x):
            return x

    with pytest.raises(TypeError, match="no non-empty `layers`"):
        layerwise_inference(Flat(), graph, feats)

    class NoBetween(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([gsplit.nn.SAGEConv(FEAT_DIM, 4), gsplit.nn.SAGEConv(4, 2)])

    with pytest.raises(TypeError, match="no `between"):
        layerwise_inference(NoBetween(), graph, feats.float())
    # saying what runs between the layers makes it work
    model = NoBetween()
    res = layerwise_inference(model, graph, feats.float(), between=lambda i, h, block: torch.relu(h))
    full = full_block(graph)
    with torch.no_grad():
        expected = model.layers[1](full, torch.relu(model.layers[0](full, feats.float())))
    assert torch.allclose(res.output, expected, atol=1e-6)


def test_inference_errors_name_the_bad_argument():
    graph, feats, _, _ = make_problem()
    model = make_model("sage")
    with pytest.raises(ValueError, match="batch_size=0"):
        layerwise_inference(model, graph, feats, batch_size=0)
    with pytest.raises(ValueError, match="part id 1 outside"):
        layerwise_inference(model, graph, feats, partition=torch.ones(NUM_NODES, dtype=torch.int64))
    with pytest.raises(ValueError, match="features has shape"):
        layerwise_inference(model, graph, feats[:10])
    # a layer that needs whole-mini-batch source degrees refuses inference blocks (they are split blocks)
    gcn_both = torch.nn.Module()
    gcn_both.layers = torch.nn.ModuleList([gsplit.nn.GraphConv(FEAT_DIM, 2, norm="both")])
    with pytest.raises(ValueError, match="norm='right'"):
        layerwise_inference(gcn_both, graph, feats.float(), between=None)
    res = InferenceResult(nodes=torch.tensor([0, 2]), output=torch.zeros(2, 3), num_nodes=3)
    with pytest.raises(ValueError, match="outside"):
        gather_rows(res, torch.tensor([3]))


def _train_both_systems(rank, world_size, ds, owner):
    from gsplit.run.trainer import TrainConfig, train_rank

    logs = []
    for system in ("split", "dp"):
        cfg = TrainConfig(model="gat", fanouts=[4, 4], batch_size=64, hidden=8, heads=2, epochs=0, system=system,
                          device="cpu")
        logs.append(train_rank(rank, world_size, cfg, ds, owner))
    return logs


def test_train_records_final_layerwise_accuracy():
    """``gsplit train``'s final evaluation, split and data parallel on 2 ranks, equals one process's inference.

    With ``epochs=0`` the model is its seeded initialisation, which the test rebuilds alike.
    """
    ds = gsplit.datasets.load("synthetic", num_nodes=600, avg_degree=6, feature_dim=8, seed=2)
    owner = gsplit.partition(ds.graph, 2, method="random", seed=0).assignment
    split_log, dp_log = launch(_train_both_systems, 2, args=(ds, owner))[0]
    torch.manual_seed(0)
    model = build_model("gat", ds.feature_dim, 8, ds.num_classes, num_layers=2, heads=2, dropout=0.5)
    ref = layerwise_inference(model, ds.graph, ds.features, batch_size=10_000)
    for name, idx in (("val", ds.val_idx), ("test", ds.test_idx)):
        expected = accuracy(ref, ds.labels, idx)
        for system, log in (("split", split_log), ("dp", dp_log)):
            # float32: a row computed in a different batch may round differently; allow one flipped argmax
            assert abs(log[f"final_{name}_acc"] - expected) <= 1.0 / idx.numel() + 1e-12, (system, name)
    assert split_log["final_eval_s"] > 0


class DglStyle(torch.nn.Module):
    """A DGL-style model: layers called in its forward's loop, an activation between them, no ``between``."""

    def __init__(self, act, heads=False):
        super().__init__()
        if heads:
            self.layers = torch.nn.ModuleList([gsplit.nn.GATConv(FEAT_DIM, 3, num_heads=2),
                                               gsplit.nn.GATConv(6, NUM_CLASSES, num_heads=2)])
        else:
            self.layers = torch.nn.ModuleList([gsplit.nn.SAGEConv(FEAT_DIM, 6), gsplit.nn.SAGEConv(6, 6),
                                               gsplit.nn.SAGEConv(6, NUM_CLASSES)])
        self.act, self.heads = act, heads
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, blocks, x):
        h = x
        for l, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if self.heads:
                h = h.flatten(1) if l != len(self.layers) - 1 else h.mean(1)
            if l != len(self.layers) - 1:
                h = self.dropout(self.act(h))
        return h


@pytest.mark.parametrize("act,heads", [(torch.relu, False), (torch.nn.functional.elu, False), (torch.relu, True)])
def test_inference_infers_what_runs_between_the_layers(act, heads, caplog):
    """DGL's example classes have no ``between``: it is read off their forward (fails on the old main)."""
    graph, feats, _, _ = make_problem()
    torch.manual_seed(0)
    model = DglStyle(act, heads).double()
    with caplog.at_level("INFO", logger="gsplit.minibatch.inference"):
        res = layerwise_inference(model, graph, feats, batch_size=7)
    assert "from its forward" in caplog.text
    full = full_block(graph)
    model.eval()
    with torch.no_grad():
        expected = model([full] * len(model.layers), feats)   # the model's own forward on the whole graph
    assert rel_err(res.output, expected) <= 1e-12
    # an activation given as a function of h, and a wrapped model, give the same rows
    if not heads:
        given = layerwise_inference(gsplit.SplitParallel(model), graph, feats, between=act)
        assert rel_err(given.output, expected) <= 1e-12
    assert torch.equal(res[torch.tensor([3, 1])], res.output[torch.tensor([3, 1])])   # pred[nid]
