"""PyG interop: Data in, torch_geometric.nn layers on gsplit blocks (split-parallel = one process), fanout order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pyg = pytest.importorskip("torch_geometric", reason="torch_geometric is not installed (pip install 'gsplit[pyg]')")
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.nn import GATConv, GCNConv, SAGEConv  # noqa: E402

import gsplit  # noqa: E402
from gsplit.interop.pyg import BlockConv, block_inputs, from_pyg, to_pyg  # noqa: E402
from gsplit.launcher import launch  # noqa: E402
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy  # noqa: E402
from gsplit.sampling.batches import epoch_permutation  # noqa: E402
from parity_helpers import random_graph_problem, rel_err  # noqa: E402

NUM_NODES = 160
FEAT_DIM = 6
NUM_CLASSES = 3
BATCH = 10            # per rank
ITERS = 2
NUM_NEIGHBORS = [4, -1]   # PyG order: 4 neighbours of each seed, then all neighbours of those
DDP_SEED = 11


def make_problem():
    # the last 10 vertices are isolated
    graph, feats, labels, g = random_graph_problem(NUM_NODES, 700, FEAT_DIM, NUM_CLASSES, seed=3, isolated=10)
    train_idx = torch.randperm(NUM_NODES, generator=g)[:100]
    return graph, feats, labels, train_idx


class PygModel(nn.Module):
    """A two-layer PyG model in gsplit's (blocks, x) convention, shuffling by hand between layers."""

    def __init__(self, kind: str):
        super().__init__()
        if kind == "sage":
            convs = [SAGEConv(FEAT_DIM, 8), SAGEConv(8, NUM_CLASSES)]
        else:
            convs = [GATConv(FEAT_DIM, 4, heads=2, add_self_loops=False),
                     GATConv(8, NUM_CLASSES, heads=1, add_self_loops=False)]
        self.layers = nn.ModuleList([BlockConv(c) for c in convs])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            if i > 0:
                h = gsplit.shuffle(torch.relu(h), block)
            h = layer(block, h)
        return h


def make_model(kind):
    torch.manual_seed(0)
    return PygModel(kind).double()


def make_maps(graph, train_idx, world_size):
    rand = torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))
    starved = rand.clone()
    starved[train_idx] = 0  # rank 1 owns no target, only inner vertices
    return {"random": rand, "starved": starved}


def train_split(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    out = {}
    for map_name, owner in make_maps(graph, train_idx, world_size).items():
        for kind in ("sage", "gat"):
            model = make_model(kind)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            loader = gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler.from_pyg(NUM_NEIGHBORS, seed=2),
                                       partition=owner, use_ddp=True, batch_size=BATCH, shuffle=True,
                                       ddp_seed=DDP_SEED, features=feats, labels=labels)
            losses, grads = [], []
            for step, (_, _, blocks) in enumerate(loader):
                if step == ITERS:
                    break
                assert all(b.shuffle_index is not None for b in blocks)  # really split blocks
                opt.zero_grad()
                logits = model(blocks, blocks[0].srcdata["feat"])
                loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
                loss.backward()
                allreduce_gradients(model, loader.comm)
                losses.append(global_sum(loss, loader.comm))
                grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
                opt.step()
            out[(map_name, kind)] = {"losses": losses, "grads": grads}
    return out


def train_reference(kind, world_size):
    """Single process on each whole global mini-batch, plain PyG semantics: no split, no shuffle."""
    graph, feats, labels, train_idx = make_problem()
    model = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(NUM_NEIGHBORS[::-1], seed=2)
    order = epoch_permutation(train_idx, DDP_SEED, 0, True)
    losses, grads = [], []
    for it in range(ITERS):
        seeds = order[it * BATCH * world_size:(it + 1) * BATCH * world_size]
        blocks = reference_blocks(sampler, graph, seeds, it)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(blocks, feats[blocks[0].src_nodes]), labels[seeds])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads}


def reference_blocks(sampler, graph, seeds, iteration=0):
    """The single-process blocks of ``seeds`` (the one place that reads ``sample_blocks``' return value)."""
    return sampler.sample_blocks(graph, seeds, epoch=0, iteration=iteration)


def test_pyg_layers_split_parallel_match_single_process():
    per_rank = launch(train_split, 2)
    for (map_name, kind), rank0 in per_rank[0].items():
        ref = train_reference(kind, 2)
        case = f"PyG {kind} on the {map_name} map, 2 ranks"
        assert len(rank0["losses"]) == ITERS, case
        for it in range(ITERS):
            assert abs(rank0["losses"][it] - ref["losses"][it]) <= 1e-10 * abs(ref["losses"][it]), case
            for name, g in ref["grads"][it].items():
                assert float(g.norm()) > 0, f"{case}: {name} has no gradient, the comparison would be empty"
                for r in per_rank:
                    err = rel_err(r[(map_name, kind)]["grads"][it][name], g)
                    assert err <= 1e-10, f"{case}, iteration {it}, {name}: rel. err {err:.2e}"


def test_pyg_neighbor_order_is_reversed():
    assert gsplit.NeighborSampler.from_pyg([25, 10, 5]).fanouts == [5, 10, 25]
    s = gsplit.NeighborSampler.from_pyg([3, -1], replace=True, seed=4)
    assert (s.fanouts, s.replace, s.seed) == ([-1, 3], True, 4)


def small_data():
    """A directed graph (direction matters), float64 features, [N, 1] labels, boolean masks."""
    g = torch.Generator().manual_seed(0)
    n = 30
    edge_index = torch.randint(0, n, (2, 90), generator=g)
    y = torch.randint(0, 4, (n, 1), generator=g)
    y[5] = -1  # an unlabelled vertex, in no split
    masks = torch.zeros(3, n, dtype=torch.bool)
    masks[torch.randint(0, 3, (n,), generator=g), torch.arange(n)] = True
    masks[:, 5] = False
    return Data(x=torch.randn(n, 5, generator=g, dtype=torch.float64), y=y, edge_index=edge_index,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def test_from_pyg_round_trip():
    data = small_data()
    ds = from_pyg(data, name="toy")
    n = data.num_nodes
    assert ds.num_nodes == n and ds.num_classes == 4 and ds.name == "toy"
    # edges keep their direction: edge_index[0] -> edge_index[1] is an in-edge of edge_index[1]
    got = sorted(zip(ds.graph.indices.tolist(), ds.graph.edge_dst().tolist()))
    assert got == sorted(zip(data.edge_index[0].tolist(), data.edge_index[1].tolist()))
    assert ds.features.dtype == torch.float32 and torch.equal(ds.features, data.x.float())
    assert torch.equal(ds.labels, data.y.squeeze(1))
    for what in ("train", "val", "test"):
        assert torch.equal(getattr(ds, f"{what}_idx"), getattr(data, f"{what}_mask").nonzero().squeeze(1))
    back = to_pyg(ds)
    assert torch.equal(back.edge_index, torch.stack([ds.graph.indices, ds.graph.edge_dst()]))
    again = from_pyg(back)
    assert torch.equal(again.graph.indptr, ds.graph.indptr) and torch.equal(again.graph.indices, ds.graph.indices)
    for what in ("train", "val", "test"):
        assert torch.equal(getattr(back, f"{what}_mask"), getattr(data, f"{what}_mask"))
        assert torch.equal(getattr(again, f"{what}_idx"), getattr(ds, f"{what}_idx"))
    # id tensors instead of masks are accepted too
    data.train_mask = data.train_mask.nonzero().squeeze(1)
    assert torch.equal(from_pyg(data).train_idx, ds.train_idx)


def test_from_pyg_errors_say_what_to_do():
    data = small_data()
    data.val_mask = torch.stack([data.val_mask, data.val_mask], 1)
    with pytest.raises(ValueError, match=r"pick one split, e.g. data.val_mask\[:, 0\]"):
        from_pyg(data)
    data = small_data()
    data.x = None
    with pytest.raises(ValueError, match="data.x is None"):
        from_pyg(data)


def test_block_conv_on_full_block_equals_pyg_on_the_graph():
    """Direction and aggregation: a BlockConv on the block of all in-edges is PyG's layer on edge_index."""
    data = small_data()
    ds = from_pyg(data)
    block = reference_blocks(gsplit.NeighborSampler([-1]), ds.graph, torch.arange(ds.num_nodes))[0]
    x = data.x
    torch.manual_seed(0)
    for conv in (SAGEConv(5, 3), GATConv(5, 2, heads=2, add_self_loops=False),
                 GCNConv(5, 3, normalize=False, aggr="mean")):
        conv = conv.double()
        expected = conv(x, data.edge_index)
        got = BlockConv(conv)(block, x[block.src_nodes])
        assert rel_err(got, expected[block.dst_nodes]) <= 1e-12, type(conv).__name__
    (h_src, h_dst), edge_index, size = block_inputs(block, x)
    assert size == (ds.num_nodes, ds.num_nodes) and h_dst.shape[0] == size[1]
    with pytest.raises(ValueError, match="source nodes"):
        block_inputs(block, x[:3])


def test_gcnconv_with_normalize_refuses_split_blocks():
    graph, feats, labels, train_idx = make_problem()
    loader = gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler([3]), batch_size=20, features=feats)
    _, _, blocks = next(iter(loader))
    assert blocks[0].shuffle_index is not None  # gsplit's loader yields split blocks even on one rank
    x = blocks[0].srcdata["feat"]
    with pytest.raises(ValueError, match="normalize=False with a mean aggregation"):
        BlockConv(GCNConv(FEAT_DIM, 3).double())(blocks[0], x)
    # the same layer without source-degree normalisation runs, and so does GCNConv(normalize=True) on a
    # block that is not split (the single-process reference), where PyG's own semantics apply
    assert BlockConv(GCNConv(FEAT_DIM, 3, normalize=False, aggr="mean").double())(blocks[0], x).shape == \
        (blocks[0].num_dst_nodes(), 3)
    plain = reference_blocks(gsplit.NeighborSampler([3]), graph, train_idx[:20])[0]
    assert BlockConv(GCNConv(FEAT_DIM, 3).double())(plain, feats[plain.src_nodes]).shape == (20, 3)


class PygStack(nn.Module):
    """The README's PyG model: BlockConv layers plus ``between``, so layer-wise inference can run it."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([BlockConv(SAGEConv(5, 8)), BlockConv(GATConv(8, 3, heads=1, add_self_loops=False))])

    def between(self, i, h, block):
        return h.relu()

    def forward(self, blocks, x):
        return gsplit.sp_forward(self.layers, x, blocks, between=self.between)


def test_layerwise_inference_runs_pyg_models():
    data = small_data()
    ds = from_pyg(data)
    torch.manual_seed(0)
    model = PygStack().double()
    res = gsplit.layerwise_inference(model, ds.graph, data.x, batch_size=4)
    conv1, conv2 = model.layers[0].conv, model.layers[1].conv
    with torch.no_grad():
        expected = conv2(conv1(data.x, data.edge_index).relu(), data.edge_index)  # PyG alone, full graph
    assert torch.equal(res.nodes, torch.arange(ds.num_nodes))
    assert rel_err(res.output, expected) <= 1e-12


# ------------------------------------------------------------------------------------- PyG users' habits
class ReadmeSage(nn.Module):
    """The README's PyG model, as written there (shuffles itself with sp_forward; no split_aware flag)."""

    def __init__(self, d, hidden, c):
        super().__init__()
        self.layers = torch.nn.ModuleList([BlockConv(SAGEConv(d, hidden)), BlockConv(SAGEConv(hidden, c))])

    def between(self, i, h, block):
        return h.relu()

    def forward(self, blocks, x):
        return gsplit.sp_forward(self.layers, x, blocks, between=self.between)


def readme_model_worker(rank, *_):
    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = ReadmeSage(FEAT_DIM, 8, NUM_CLASSES).double()
    loader = gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler.from_pyg(NUM_NEIGHBORS, seed=2),
                               partition=make_maps(graph, train_idx, 2)["random"], use_ddp=True, batch_size=BATCH,
                               shuffle=True, ddp_seed=DDP_SEED, features=feats, labels=labels)
    wrapped = gsplit.SplitParallel(model, loader)
    _, _, blocks = next(iter(loader))
    loss = torch.nn.functional.cross_entropy(wrapped(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
    loss.backward()
    return wrapped.global_loss(loss), {n: p.grad.clone() for n, p in wrapped.module.named_parameters()}


def test_readme_pyg_model_runs_under_split_parallel():
    """Fails on the old main: SplitParallel shuffled the rows sp_forward had already shuffled."""
    per_rank = launch(readme_model_worker, 2)
    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = ReadmeSage(FEAT_DIM, 8, NUM_CLASSES).double()
    seeds = epoch_permutation(train_idx, DDP_SEED, 0, True)[:2 * BATCH]
    blocks = reference_blocks(gsplit.NeighborSampler(NUM_NEIGHBORS[::-1], seed=2), graph, seeds)
    loss = torch.nn.functional.cross_entropy(model(blocks, feats[blocks[0].src_nodes]), labels[seeds])
    loss.backward()
    for global_loss, grads in per_rank:
        assert abs(global_loss - loss.item()) <= 1e-10 * abs(loss.item())
        for n, p in model.named_parameters():
            assert rel_err(grads[n], p.grad) <= 1e-10, n


def test_minibatch_answers_pyg_habits():
    graph, feats, labels, train_idx = make_problem()
    loader = gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler([3, 3]), batch_size=20, features=feats,
                               labels=labels)
    batch = next(iter(loader))
    assert batch.batch_size == batch.output_nodes.numel() == 20
    assert batch.x is batch.blocks[0].srcdata["feat"] and batch.y is batch.blocks[-1].dstdata["label"]
    with pytest.raises(AttributeError, match=r"output_nodes are the targets.*blocks\[0\]\.src_nodes"):
        batch.n_id
    with pytest.raises(AttributeError, match="BlockConv"):
        batch.edge_index
    with pytest.raises(AttributeError, match="'MiniBatch' object has no attribute 'nonsense'"):
        batch.nonsense
    no_feats = next(iter(gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler([3]), batch_size=4)))
    with pytest.raises(KeyError, match=r"give the loader features="):
        no_feats.x


class BareStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([SAGEConv(FEAT_DIM, 8), SAGEConv(8, NUM_CLASSES)])   # not wrapped

    def forward(self, blocks, x):
        return self.layers[1](blocks[1], self.layers[0](blocks[0], x).relu())


def test_bare_pyg_layer_errors_name_blockconv():
    graph, feats, labels, train_idx = make_problem()
    loader = gsplit.DataLoader(graph, train_idx, gsplit.NeighborSampler([3, 3]), batch_size=20, features=feats,
                               labels=labels)
    _, _, blocks = next(iter(loader))
    model = BareStack().double()
    with pytest.raises(TypeError, match=r"wrap it: gsplit.interop.pyg.BlockConv\(SAGEConv\(...\)\)"):
        gsplit.SplitParallel(model, loader)(blocks, blocks[0].srcdata["feat"])
    with pytest.raises(TypeError, match=r"BlockConv\(SAGEConv"):
        gsplit.layerwise_inference(model, graph, feats, between=torch.relu)
    with pytest.raises(TypeError, match=r"BlockConv\(SAGEConv"):
        gsplit.sp_forward(model.layers, blocks[0].srcdata["feat"], blocks)


def test_pyg_data_is_accepted_as_the_graph(caplog):
    data = small_data()
    data.y = data.y.squeeze(1).clamp(min=0)
    ds = from_pyg(data)
    sampler = gsplit.NeighborSampler.from_pyg([3, 2])
    weights = gsplit.presample(data, ds.train_idx, sampler, batch_size=4, num_parts=2, method="expected")
    assert torch.equal(weights.vertex_weights,
                       gsplit.presample(ds.graph, ds.train_idx, sampler, 4, num_parts=2, method="expected").vertex_weights)
    pmap = gsplit.partition(data, 2, weights=weights)
    pmap.check_graph(ds.graph)
    # the loader takes x and y from the Data
    batch = next(iter(gsplit.DataLoader(data, data.train_mask, sampler, batch_size=5)))
    assert torch.equal(batch.x, data.x[batch.blocks[0].src_nodes])
    assert torch.equal(batch.y, data.y[batch.output_nodes])
    torch.manual_seed(0)
    model = PygStack().double()
    res = gsplit.layerwise_inference(model, data, batch_size=4)   # features: data.x
    assert torch.equal(res.output, gsplit.layerwise_inference(model, ds.graph, data.x, batch_size=4).output)
    with pytest.raises(TypeError, match=r"graph is a Dataset; pass its .graph"):
        gsplit.presample(ds, ds.train_idx, sampler, batch_size=4)
    with pytest.raises(TypeError, match="must be a gsplit.Graph, a DGLGraph or a torch_geometric Data, got dict"):
        gsplit.DataLoader({"edge_index": data.edge_index}, data.train_mask, sampler, batch_size=4)


def test_pyg_order_fanouts_warn_with_a_pyg_data(caplog):
    """A PyG user's NeighborSampler([25, 10]) would silently run reversed; with a Data it warns."""
    data = small_data()
    with caplog.at_level("WARNING", logger="gsplit.interop.pyg"):
        gsplit.DataLoader(data, data.train_mask, gsplit.NeighborSampler([3, 2]), batch_size=5)
    assert "NeighborSampler.from_pyg([3, 2])" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gsplit.interop.pyg"):
        gsplit.DataLoader(data, data.train_mask, gsplit.NeighborSampler.from_pyg([3, 2]), batch_size=5)
        gsplit.DataLoader(data, data.train_mask, gsplit.NeighborSampler([3, 3]), batch_size=5)
    assert caplog.text == ""
