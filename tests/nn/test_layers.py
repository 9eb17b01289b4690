"""SAGEConv, GATConv and GraphConv against naive loop/dense references on small sampled blocks."""

import pytest
import torch
from torch.func import functional_call

from gsplit.data.graph import Graph
from gsplit.nn.layers import GATConv, GraphConv, SAGEConv, edge_softmax
from gsplit.sampling import Block, NeighborSampler


# ---------------------------------------------------------------- fixtures / helpers
def _random_graph(n=40, m=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (m,), generator=g)
    dst = torch.randint(0, n, (m,), generator=g)
    # Vertex n-1 gets no in-edges: an isolated destination once sampled as a seed.
    keep = dst != n - 1
    return Graph.from_edges(src[keep], dst[keep], num_nodes=n, remove_duplicates=True)


def _sampled_block(replace=False, fanout=3):
    graph = _random_graph()
    seeds = torch.tensor([0, 5, 11, 17, 39])  # 39 has no in-edges
    blocks = NeighborSampler([fanout], replace=replace, seed=3).sample_blocks(graph, seeds, epoch=0, iteration=1)
    block = blocks[0]
    assert block.num_edges() > 0 and block.in_degrees()[-1] == 0
    return block


def _empty_edges_block(num_dst=3, num_src=5):
    return Block(src_nodes=torch.arange(num_src), num_dst=num_dst, edge_src=torch.zeros(0, dtype=torch.int64),
                 edge_dst=torch.zeros(0, dtype=torch.int64), edge_ids=torch.zeros(0, dtype=torch.int64))


def _in_lists(block):
    return [block.edge_src[block.edge_dst == v].tolist() for v in range(block.num_dst)]


def _ref_sage(layer, block, h):
    ws, wn = layer.fc_self.weight, layer.fc_neigh.weight
    rows = []
    for v, nbrs in enumerate(_in_lists(block)):
        neigh = h[nbrs].mean(0) if nbrs else torch.zeros(h.shape[1], dtype=h.dtype)
        rows.append(h[v] @ ws.T + neigh @ wn.T + layer.bias)
    return torch.stack(rows)


def _ref_gat(layer, block, h):
    H, D = layer.num_heads, layer.out_feats
    z = (h @ layer.fc.weight.T).view(-1, H, D)
    out = torch.zeros(block.num_dst, H, D, dtype=h.dtype)
    for v, nbrs in enumerate(_in_lists(block)):
        for k in range(H):
            if not nbrs:
                continue
            e = torch.stack([z[u, k] @ layer.attn_l[0, k] + z[v, k] @ layer.attn_r[0, k] for u in nbrs])
            a = torch.softmax(torch.nn.functional.leaky_relu(e, layer.negative_slope), 0)
            out[v, k] = sum(a[i] * z[u, k] for i, u in enumerate(nbrs))
    return out + layer.bias.view(1, H, D)


def _ref_gcn(layer, block, h, norm):
    A = torch.zeros(block.num_dst, block.num_src_nodes(), dtype=h.dtype)
    for s, d in zip(block.edge_src.tolist(), block.edge_dst.tolist()):
        A[d, s] += 1
    d_in = A.sum(1).clamp(min=1)
    d_out = A.sum(0).clamp(min=1)
    if norm == "both":
        A = A / d_in.sqrt()[:, None] / d_out.sqrt()[None, :]
    elif norm == "right":
        A = A / d_in[:, None]
    elif norm == "left":
        A = A / d_out[None, :]
    return A @ h @ layer.weight + layer.bias


def _randomize_bias(layer, seed=1):
    # Biases start at zero; make them nonzero so the references check where the bias goes.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g, dtype=layer.bias.dtype))


# ---------------------------------------------------------------- agreement with references
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (3, 5)])  # both sides of the project-first switch
def test_sage_mean_matches_reference(replace, in_feats, out_feats):
    torch.manual_seed(0)
    block = _sampled_block(replace=replace)
    layer = SAGEConv(in_feats, out_feats).double()
    _randomize_bias(layer)
    h = torch.randn(block.num_src_nodes(), in_feats, dtype=torch.float64)
    out = layer(block, h)
    assert out.shape == (block.num_dst, out_feats)
    torch.testing.assert_close(out, _ref_sage(layer, block, h))
    # The isolated destination gets only its self term: zero neighbour mean, no NaN.
    v = block.num_dst - 1
    torch.testing.assert_close(out[v], h[v] @ layer.fc_self.weight.T + layer.bias)


@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (3, 5)])
def test_sage_gcn_aggregator(in_feats, out_feats):
    torch.manual_seed(0)
    block = _sampled_block()
    layer = SAGEConv(in_feats, out_feats, aggregator="gcn").double()
    _randomize_bias(layer)
    h = torch.randn(block.num_src_nodes(), in_feats, dtype=torch.float64)
    ref = torch.stack([(h[v] + h[nbrs].sum(0)) / (len(nbrs) + 1) @ layer.fc_neigh.weight.T + layer.bias
                       for v, nbrs in enumerate(_in_lists(block))])
    torch.testing.assert_close(layer(block, h), ref)


@pytest.mark.parametrize("heads", [1, 3])
def test_gat_matches_reference(heads):
    torch.manual_seed(0)
    block = _sampled_block(replace=True)
    layer = GATConv(5, 4, num_heads=heads, negative_slope=0.1).double()
    _randomize_bias(layer)
    h = torch.randn(block.num_src_nodes(), 5, dtype=torch.float64)
    out = layer(block, h)
    assert out.shape == (block.num_dst, heads, 4)
    torch.testing.assert_close(out, _ref_gat(layer, block, h))
    # Isolated destination: bias only, no NaN.
    torch.testing.assert_close(out[-1], layer.bias.view(heads, 4))


@pytest.mark.parametrize("norm", ["both", "right", "left", "none"])
@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (3, 5)])
def test_gcn_matches_reference(norm, in_feats, out_feats):
    torch.manual_seed(0)
    block = _sampled_block(replace=True)
    layer = GraphConv(in_feats, out_feats, norm=norm).double()
    _randomize_bias(layer)
    h = torch.randn(block.num_src_nodes(), in_feats, dtype=torch.float64)
    out = layer(block, h)
    torch.testing.assert_close(out, _ref_gcn(layer, block, h, norm))
    torch.testing.assert_close(out[-1], layer.bias)


def test_activation_applied_last():
    torch.manual_seed(0)
    block = _sampled_block()
    h = torch.randn(block.num_src_nodes(), 4)
    for plain, act in [(SAGEConv(4, 3), SAGEConv(4, 3, activation=torch.relu)),
                       (GATConv(4, 3, 2), GATConv(4, 3, 2, activation=torch.relu)),
                       (GraphConv(4, 3), GraphConv(4, 3, activation=torch.relu))]:
        act.load_state_dict(plain.state_dict())
        ref = torch.relu(plain(block, h))
        assert (ref == 0).any() and (ref > 0).any()
        torch.testing.assert_close(act(block, h), ref)


# ---------------------------------------------------------------- edge softmax
def test_edge_softmax_stable_and_grouped():
    scores = torch.tensor([[1000.0, -1000.0], [999.0, -1001.0], [-5000.0, 3.0], [7.0, 7.0]])
    dst = torch.tensor([0, 0, 1, 1])
    a = edge_softmax(scores, dst, 3)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[:2], torch.softmax(scores[:2], 0))
    torch.testing.assert_close(a[2:], torch.softmax(scores[2:], 0))
    torch.testing.assert_close(edge_softmax(scores[:0], dst[:0], 2), scores[:0])


# ---------------------------------------------------------------- gradients
def _gradcheck_layer(layer, block, h):
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()]

    def f(x, *ps):
        return functional_call(layer, dict(zip(names, ps)), (block, x))

    assert torch.autograd.gradcheck(f, (h.requires_grad_(True), *params), eps=1e-6, atol=1e-5)


def _tiny_block():
    # dst 0 <- {1, 2, 2}, dst 1 <- {0}, dst 2 isolated; src 3 is an input-only vertex
    return Block(src_nodes=torch.tensor([10, 11, 12, 13]), num_dst=3, edge_src=torch.tensor([1, 2, 2, 0, 3]),
                 edge_dst=torch.tensor([0, 0, 0, 1, 1]), edge_ids=torch.arange(5))


@pytest.mark.parametrize("make", [lambda: SAGEConv(3, 2), lambda: SAGEConv(3, 2, aggregator="gcn"),
                                  lambda: SAGEConv(2, 3), lambda: GATConv(3, 2, num_heads=2),
                                  lambda: GraphConv(3, 2), lambda: GraphConv(2, 3, norm="right")],
                         ids=["sage", "sage-gcn", "sage-wide", "gat", "gcn", "gcn-right"])
def test_gradcheck(make):
    torch.manual_seed(0)
    layer = make().double()
    _randomize_bias(layer)
    block = _tiny_block()
    _gradcheck_layer(layer, block, torch.randn(4, layer.in_feats, dtype=torch.float64))


# ---------------------------------------------------------------- degenerate blocks
LAYERS = {
    "sage": (lambda: SAGEConv(4, 3), (3,)),
    "gat": (lambda: GATConv(4, 3, num_heads=2), (2, 3)),
    "gcn": (lambda: GraphConv(4, 3), (3,)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_block_without_edges(name):
    torch.manual_seed(0)
    make, tail = LAYERS[name]
    layer = make()
    _randomize_bias(layer)
    block = _empty_edges_block(num_dst=3, num_src=5)
    h = torch.randn(5, 4)
    out = layer(block, h)
    assert out.shape == (3, *tail) and torch.isfinite(out).all()
    if name == "sage":
        torch.testing.assert_close(out, h[:3] @ layer.fc_self.weight.T + layer.bias)
    else:  # no in-edges: aggregation is zero, only the bias remains
        torch.testing.assert_close(out, layer.bias.view(tail).expand_as(out))


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("num_src", [0, 2])
def test_block_without_destinations(name, num_src):
    make, tail = LAYERS[name]
    layer = make()
    block = _empty_edges_block(num_dst=0, num_src=num_src)
    h = torch.randn(num_src, 4, requires_grad=True)
    out = layer(block, h)
    assert out.shape == (0, *tail)
    out.sum().backward()  # the empty output still connects to the graph
    assert all(p.grad is not None and (p.grad == 0).all() for p in layer.parameters())


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_shape_errors(name):
    make, _ = LAYERS[name]
    layer = make()
    block = _tiny_block()
    with pytest.raises(ValueError, match=r"expected block.num_src_nodes\(\) = 4"):
        layer(block, torch.randn(3, 4))
    with pytest.raises(ValueError, match="in_feats=4 but h has 5 columns"):
        layer(block, torch.randn(4, 5))
    with pytest.raises(ValueError, match="2-D"):
        layer(block, torch.randn(4))


def test_bad_options():
    with pytest.raises(ValueError, match="aggregator='lstm'"):
        SAGEConv(3, 2, aggregator="lstm")
    with pytest.raises(ValueError, match="norm='sym'"):
        GraphConv(3, 2, norm="sym")
    with pytest.raises(ValueError, match="num_heads=0"):
        GATConv(3, 2, num_heads=0)


# ---------------------------------------------------------------- dtype, determinism, device
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_float32_matches_float64_and_is_deterministic(name):
    torch.manual_seed(0)
    make, _ = LAYERS[name]
    layer = make()
    block = _sampled_block()
    h = torch.randn(block.num_src_nodes(), 4)
    out32 = layer(block, h)
    assert out32.dtype == torch.float32
    assert torch.equal(out32, layer(block, h))
    out64 = layer.double()(block, h.double())
    torch.testing.assert_close(out32.double(), out64, atol=1e-5, rtol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    block = _sampled_block()
    h = torch.randn(block.num_src_nodes(), 4)
    layer = GATConv(4, 3, 2, feat_drop=0.5, attn_drop=0.5)
    ref = GATConv(4, 3, 2)
    ref.load_state_dict(layer.state_dict())
    layer.eval()
    torch.testing.assert_close(layer(block, h), ref(block, h))
    layer.train()
    assert not torch.allclose(layer(block, h), ref(block, h))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_cuda_matches_cpu(name):
    torch.manual_seed(0)
    make, _ = LAYERS[name]
    layer = make()
    block = _sampled_block()
    h = torch.randn(block.num_src_nodes(), 4)
    ref = layer(block, h)
    out = layer.to("cuda")(block.to("cuda"), h.cuda())
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="block.to"):
        layer(block, h.cuda())


def test_vertex_dropout_rate_scale_and_keying():
    from gsplit.nn import vertex_dropout

    ids = torch.arange(20000)
    h = torch.ones(ids.numel(), 16)
    out = vertex_dropout(h, ids, 0.3, seed=1, step=5, layer=2)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.7))
    # rows of the same vertex get the same mask wherever they appear; another step or layer changes it
    perm = torch.randperm(ids.numel())
    assert torch.equal(vertex_dropout(h, ids[perm], 0.3, 1, 5, 2), out[perm])
    assert not torch.equal(vertex_dropout(h, ids, 0.3, 1, 6, 2), out)
    assert not torch.equal(vertex_dropout(h, ids, 0.3, 1, 5, 1), out)
    # masks of different vertices are (nearly) independent: few pairs of rows coincide
    same = (kept[:-1] == kept[1:]).all(1).float().mean().item()
    assert same < 0.01
    assert torch.equal(vertex_dropout(h, ids, 0.0, 1, 5, 2), h)
    with pytest.raises(ValueError, match="p=1.0"):
        vertex_dropout(h, ids, 1.0, 1, 5, 2)
