"""gsplit.ops.aggregate: the compiled CPU kernels and the plain-torch fallback against float64 references.

Both paths are tested in every run: ``"compiled"`` calls the public dispatching functions (which use the
C++ extension on CPU; skipped with a reason when it cannot be built here), ``"torch"`` calls the
``*_torch`` fallbacks directly.
"""

import pytest
import torch

from gsplit.ops import aggregate as agg

DTYPES = [torch.float64, torch.float32]
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def _require_extension():
    if not agg.extension_available():
        pytest.skip("the C++ extension is not built here (no compiler/ninja, or GSPLIT_NO_EXTENSIONS set)")


SUM = {"compiled": agg.copy_u_sum, "torch": agg.copy_u_sum_torch}
MEAN = {"compiled": agg.copy_u_mean, "torch": agg.copy_u_mean_torch}
GAT = {"compiled": agg.gat_aggregate, "torch": agg.gat_aggregate_torch}
IMPLS = ["compiled", "torch"]


def _edges(num_src, num_dst, num_edges, seed=0, isolated=(0,)):
    """Destination-grouped random edges with repeated sources and destinations without edges."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([v for v in range(num_dst) if v not in isolated and v != num_dst - 1], dtype=torch.int64)
    dst = allowed[torch.randint(0, allowed.numel(), (num_edges,), generator=g)] if num_edges else allowed[:0]
    dst = torch.sort(dst).values
    src = torch.randint(0, max(num_src // 3, 1), (num_edges,), generator=g)  # few sources: many repeats
    return src, dst


CASES = {  # name: (num_src, num_dst, num_edges)
    "random": (40, 12, 150),
    "no_edges": (5, 3, 0),
    "no_dst": (4, 0, 0),
    "no_rows": (0, 0, 0),
}


def _ref_sum(x, src, dst, nd):
    x = x.double()
    return x.new_zeros((nd,) + tuple(x.shape[1:])).index_add_(0, dst, x.index_select(0, src))


def _ref_gat(z, el, er, src, dst, nd, slope):
    """Row-by-row float64 reference: a dense softmax per destination and head."""
    z, el, er = z.double(), el.double(), er.double()
    out = z.new_zeros((nd,) + tuple(z.shape[1:]))
    for v in range(nd):
        u = src[dst == v]
        if u.numel() == 0:
            continue
        a = torch.softmax(torch.nn.functional.leaky_relu(el[u] + er[v], slope), 0)  # [deg, H]
        out[v] = (a.unsqueeze(-1) * z[u]).sum(0)
    return out


def _grads(fn, inputs, weight):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    if not out.requires_grad:  # e.g. a reference over no edges: nothing depends on the inputs
        return out, tuple(torch.zeros_like(t) for t in inputs)
    return out, torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


# ---------------------------------------------------------------------------- sum and mean
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
def test_copy_u_matches_reference(impl, dtype, case, mean):
    if impl == "compiled":
        _require_extension()
    ns, nd, ne = CASES[case]
    src, dst = _edges(ns, nd, ne)
    torch.manual_seed(1)
    x = torch.randn(ns, 6, dtype=dtype)
    w = torch.randn(nd, 6, dtype=torch.float64)
    fn = (MEAN if mean else SUM)[impl]
    out, (gx,) = _grads(lambda x: fn(x, src, dst, nd), [x], w.to(dtype))
    assert out.dtype == dtype and out.shape == (nd, 6)
    deg = torch.bincount(dst, minlength=nd).clamp(min=1).double().unsqueeze(1)
    ref = _ref_sum(x, src, dst, nd) / (deg if mean else 1)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    # d/dx of sum(w * out) = sum over each source's edges of w[dst] (/ deg[dst] for the mean)
    wd = w / (deg if mean else 1)
    gref = torch.zeros(ns, 6, dtype=torch.float64).index_add_(0, src, wd.index_select(0, dst))
    torch.testing.assert_close(gx.double(), gref, **TOL[dtype])
    if nd:
        empty = torch.bincount(dst, minlength=nd) == 0
        assert empty.any() and (out[empty] == 0).all()  # destinations without edges get exact zeros


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mean", [False, True], ids=["sum", "mean"])
def test_copy_u_gradcheck(impl, mean):
    if impl == "compiled":
        _require_extension()
    src, dst = _edges(9, 5, 14, seed=3)
    x = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    fn = (MEAN if mean else SUM)[impl]
    assert torch.autograd.gradcheck(lambda x: fn(x, src, dst, 5), (x,))


def test_torch_path_keeps_no_per_edge_rows_for_backward_and_has_the_same_gradient_bits():
    """The GPU path (plain torch) held each layer's [E, F] messages from forward to backward, because torch's
    index_add_ saves its source: full-graph SAGE peaked at 1.55x torch-geometric's memory on an H100. Now only
    the indices are kept, and the gradient is the very same gather, bit for bit (float32 on the CPU)."""
    src, dst = _edges(300, 80, 5000, seed=5)
    x = torch.randn(300, 16, requires_grad=True)
    weight = torch.randn(80, 16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = agg.copy_u_sum_torch(x, src, dst, 80)
    assert (5000, 16) not in saved and all(len(shape) == 1 for shape in saved), saved  # indices only
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    x2 = x.detach().clone().requires_grad_(True)
    ref = x2.new_zeros((80, 16)).index_add_(0, dst, x2.index_select(0, src))  # torch's own autograd
    (grad_ref,) = torch.autograd.grad((ref * weight).sum(), x2)
    assert torch.equal(out, ref) and torch.equal(grad, grad_ref)
    z, el, er = torch.randn(300, 2, 8), torch.randn(300, 2), torch.randn(80, 2)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        agg.gat_aggregate_torch(z.requires_grad_(), el.requires_grad_(), er.requires_grad_(), src, dst, 80)
    assert saved.count((5000, 2, 8)) == 1, saved  # z's gathered rows, for the product's backward; not twice


def test_torch_path_double_backward():
    src, dst = _edges(9, 5, 14, seed=3)
    x = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: agg.copy_u_mean_torch(x, src, dst, 5) ** 2, (x,))


def test_compiled_sum_equals_fallback_and_is_deterministic():
    _require_extension()
    src, dst = _edges(3000, 800, 20000, seed=5)
    x = torch.randn(3000, 33)
    w = torch.randn(800, 33)
    out, (gx,) = _grads(lambda x: agg.copy_u_sum(x, src, dst, 800), [x], w)
    out2, (gx2,) = _grads(lambda x: agg.copy_u_sum(x, src, dst, 800), [x], w)
    assert torch.equal(out, out2) and torch.equal(gx, gx2)  # fixed summation order, whatever the threads do
    ref, (gref,) = _grads(lambda x: agg.copy_u_sum_torch(x, src, dst, 800), [x], w)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gref, rtol=1e-5, atol=1e-5)


def test_compiled_rejects_ungrouped_or_out_of_range_edges():
    _require_extension()
    x = torch.randn(4, 2)
    with pytest.raises(ValueError, match="not grouped by destination"):
        agg.copy_u_sum(x, torch.tensor([0, 1, 2]), torch.tensor([1, 0, 1]), 2)
    with pytest.raises(ValueError, match=r"edge_dst\[1\] = 5 is outside"):
        agg.copy_u_sum(x, torch.tensor([0, 1]), torch.tensor([0, 5]), 2)
    with pytest.raises(ValueError, match=r"edge_src\[0\] = 4 is outside"):
        agg.copy_u_sum(x, torch.tensor([4]), torch.tensor([0]), 1)


@pytest.mark.parametrize("fn", [agg.copy_u_sum, agg.copy_u_sum_torch])
def test_bad_edge_shapes(fn):
    with pytest.raises(ValueError, match="equal length"):
        fn(torch.randn(3, 2), torch.tensor([0, 1]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="num_dst = -1"):
        fn(torch.randn(3, 2), torch.tensor([0]), torch.tensor([0]), -1)


def test_no_extensions_variable_selects_the_fallback(monkeypatch):
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    assert not agg.extension_available()
    # The fallback does not need grouped edges; the compiled kernel would refuse these.
    out = agg.copy_u_sum(torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1, 0]), torch.tensor([1, 0, 1]), 2)
    assert out.flatten().tolist() == [2.0, 2.0]


def test_other_dtypes_use_the_fallback():
    src, dst = _edges(10, 4, 12)
    x = torch.randn(10, 3).to(torch.bfloat16)
    torch.testing.assert_close(agg.copy_u_sum(x, src, dst, 4), agg.copy_u_sum_torch(x, src, dst, 4))


# ---------------------------------------------------------------------------- GAT
def _gat_inputs(ns, nd, H, D, dtype, seed=2, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(ns, H, D, generator=g, dtype=torch.float64).to(dtype),
            (scale * torch.randn(ns, H, generator=g, dtype=torch.float64)).to(dtype),
            (scale * torch.randn(nd, H, generator=g, dtype=torch.float64)).to(dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_gat_matches_reference(impl, dtype, case):
    if impl == "compiled":
        _require_extension()
    ns, nd, ne = CASES[case]
    H, D, slope = 3, 4, 0.2
    src, dst = _edges(ns, nd, ne)
    z, el, er = _gat_inputs(ns, nd, H, D, dtype)
    w = torch.randn(nd, H, D, dtype=torch.float64)
    out, grads = _grads(lambda z, el, er: GAT[impl](z, el, er, src, dst, nd, slope), [z, el, er], w.to(dtype))
    assert out.dtype == dtype and out.shape == (nd, H, D)
    ref, ref_grads = _grads(lambda z, el, er: _ref_gat(z, el, er, src, dst, nd, slope),
                            [z.double(), el.double(), er.double()], w)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    for g, gr in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), torch.zeros_like(gr) if gr is None else gr, **TOL[dtype])


@pytest.mark.parametrize("impl", IMPLS)
def test_gat_gradcheck(impl):
    if impl == "compiled":
        _require_extension()
    src, dst = _edges(8, 5, 16, seed=4)
    z, el, er = (t.requires_grad_(True) for t in _gat_inputs(8, 5, 2, 3, torch.float64))
    assert torch.autograd.gradcheck(lambda z, el, er: GAT[impl](z, el, er, src, dst, 5, 0.1), (z, el, er))


@pytest.mark.parametrize("impl", IMPLS)
def test_gat_stable_for_large_scores(impl):
    if impl == "compiled":
        _require_extension()
    src, dst = _edges(30, 6, 60, seed=6)
    z, el, er = _gat_inputs(30, 6, 2, 3, torch.float32, scale=1000.0)
    out = GAT[impl](z, el, er, src, dst, 6, 0.2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _ref_gat(z, el, er, src, dst, 6, 0.2), rtol=1e-4, atol=1e-4)


def test_gat_dropout_only_on_the_fallback():
    src, dst = _edges(30, 6, 60, seed=7)
    z, el, er = _gat_inputs(30, 6, 2, 3, torch.float64)
    plain = agg.gat_aggregate_torch(z, el, er, src, dst, 6, 0.2)
    dropped = agg.gat_aggregate_torch(z, el, er, src, dst, 6, 0.2, attn_drop=torch.nn.Dropout(0.5))
    assert not torch.allclose(plain, dropped)
    with pytest.raises(ValueError, match="gat_aggregate expects z"):
        agg.gat_aggregate(z[:, 0], el, er, src, dst, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    src, dst = _edges(40, 12, 150)
    x = torch.randn(40, 5)
    torch.testing.assert_close(agg.copy_u_mean(x.cuda(), src.cuda(), dst.cuda(), 12).cpu(),
                               agg.copy_u_mean(x, src, dst, 12), rtol=1e-5, atol=1e-5)
    z, el, er = _gat_inputs(40, 12, 2, 3, torch.float32)
    torch.testing.assert_close(agg.gat_aggregate(z.cuda(), el.cuda(), er.cuda(), src.cuda(), dst.cuda(), 12).cpu(),
                               agg.gat_aggregate(z, el, er, src, dst, 12), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- ReLU and row-drawn dropout, fused
def _unfused_relu_dropout_rows(h, rows, mask, scale):
    return torch.relu(h) * (mask * scale).index_select(0, rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows_n", [37, 0])
@pytest.mark.parametrize("bool_mask", [False, True])
def test_relu_dropout_rows_has_the_bits_of_the_unfused_ops(dtype, rows_n, bool_mask):
    """The fused kernel (one pass forward, one backward, only its output kept) equals ReLU, the gather of the
    scaled mask rows and the product, value for value forward and in the gradient, signed zeros and infinities
    included; a NaN stays NaN forward (the models' between-layer step relies on it: split parity compares bits).
    A bool mask (the bank as drawn, what gsplit's models pass) gives the bits of its 0/1 float copy."""
    _require_extension()
    g = torch.Generator().manual_seed(1)
    h = torch.randn(rows_n, 24, generator=g, dtype=dtype)
    if rows_n:
        h[0, :4] = torch.tensor([0.0, -0.0, float("inf"), -float("inf")], dtype=dtype)
        h[1, 0] = float("nan")
    h = h.t().contiguous().t()  # a non-contiguous view: the kernel takes its contiguous copy
    mask = (torch.rand(5, 24, generator=g) < 0.5).to(dtype)
    rows = torch.randint(0, 5, (rows_n,), generator=g)
    weight = torch.randn(rows_n, 24, generator=g, dtype=dtype)
    given = mask.bool() if bool_mask else mask
    fused, (g_fused,) = _grads(lambda x: agg.relu_dropout_rows(x, rows, given, 1 / 0.7), [h], weight)
    plain, (g_plain,) = _grads(lambda x: _unfused_relu_dropout_rows(x, rows, mask, 1 / 0.7), [h], weight)
    assert "ReluDropoutRows" in type(fused.grad_fn).__name__  # the kernel ran
    assert torch.equal(fused.isnan(), plain.isnan()) and torch.equal(fused.nan_to_num(7.0), plain.nan_to_num(7.0))
    finite = ~fused.isnan()  # a NaN output passes its gradient as a kept cell (documented)
    assert torch.equal(g_fused[finite], g_plain[finite])
    assert torch.equal(g_fused[~finite], (weight * torch.tensor(1 / 0.7, dtype=dtype))[~finite])


def test_relu_dropout_rows_keeps_only_its_output_for_backward():
    """Less memory than the unfused ops, which keep ReLU's output and the gathered [n, F] mask rows."""
    _require_extension()
    h = torch.randn(1000, 32, requires_grad=True)
    mask, rows = (torch.rand(64, 32) < 0.5).float(), torch.randint(0, 64, (1000,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        agg.relu_dropout_rows(h, rows, mask, 2.0)
    assert saved == [1000 * 32]


def test_relu_dropout_rows_falls_back_off_the_kernel_and_checks_its_inputs(monkeypatch):
    h, rows, mask = torch.tensor([[-1.0, 2.0]]), torch.tensor([0]), torch.tensor([[1.0, 1.0]])
    with pytest.raises(ValueError, match=r"h \[n, F\], rows \[n\] and mask \[R, F\]; got h \(2, 3\), rows \(1,\)"):
        agg.relu_dropout_rows(torch.ones(2, 3), torch.tensor([0]), torch.ones(4, 3), 2.0)
    with pytest.raises(ValueError, match="mask \\(4, 2\\)"):
        agg.relu_dropout_rows(torch.ones(2, 3), torch.tensor([0, 1]), torch.ones(4, 2), 2.0)
    if agg.extension_available():
        with pytest.raises(ValueError, match="the mask must hold only 0 and 1"):
            agg.relu_dropout_rows(h, rows, torch.tensor([[0.5, 1.0]]), 2.0)
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    out = agg.relu_dropout_rows(h.requires_grad_(), rows, mask, 2.0)
    assert out.tolist() == [[0.0, 4.0]] and "ReluDropoutRows" not in type(out.grad_fn).__name__


def test_models_between_layers_is_relu_then_vertex_dropout():
    """gsplit's models apply ReLU and dropout in one fused step; it must equal the two one after the other."""
    from gsplit.nn.dropout import relu_vertex_dropout, vertex_dropout

    h = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    ids = torch.randperm(1000)[:300]
    a = relu_vertex_dropout(h, ids, 0.5, seed=2, step=3, layer=1)
    b = vertex_dropout(torch.relu(h), ids, 0.5, seed=2, step=3, layer=1)
    assert torch.equal(a, b)
    w = torch.randn(300, 16, dtype=torch.float64)
    assert torch.equal(torch.autograd.grad((a * w).sum(), h)[0], torch.autograd.grad((b * w).sum(), h)[0])
    with pytest.raises(ValueError, match="dropout p=1.5"):
        relu_vertex_dropout(h, ids, 1.5, 0, 1, 0)
    with pytest.raises(ValueError, match="h has 300 rows but 2 vertex ids"):
        relu_vertex_dropout(h, ids[:2], 0.5, 0, 1, 0)


# ---------------------------------------------------------------------------- GAT's score halves
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [5000, 3, 0])
def test_gat_scores_equal_the_unfused_product_and_sum(dtype, n):
    """The kernel's scores and attention-vector gradient equal ``(z * attn).sum(-1)``'s to rounding (another
    fixed summation order); the gradient of z is one product per cell, the unfused ops' bits. 5000 rows span
    several of the kernel's blocks of partial sums."""
    _require_extension()
    g = torch.Generator().manual_seed(3)
    z = torch.randn(n, 4, 24, generator=g, dtype=dtype)
    attn = torch.randn(1, 4, 24, generator=g, dtype=dtype)
    weight = torch.randn(n, 4, generator=g, dtype=dtype)
    fused, (gz, ga) = _grads(agg.gat_scores, [z, attn], weight)
    plain, (gz_plain, ga_plain) = _grads(lambda a, b: (a * b).sum(-1), [z, attn], weight)
    assert "GATScores" in type(fused.grad_fn).__name__  # the kernel ran
    assert fused.shape == (n, 4)
    torch.testing.assert_close(fused, plain, **TOL[dtype])
    assert torch.equal(gz, gz_plain)
    # the attention gradient sums n products: both orders are within rounding of the float64 sum (the unfused one
    # is no closer to it in float32: compare each with the exact value, to a bound of that sum's size)
    terms = weight.double().unsqueeze(-1) * z.double()
    exact, size = terms.sum(0, keepdim=True), terms.abs().sum(0, keepdim=True)
    eps = torch.finfo(dtype).eps
    for got in (ga, ga_plain):
        assert ((got.double() - exact).abs() <= 4 * eps * size + 1e-300).all()


def test_gat_scores_do_not_depend_on_the_thread_count():
    _require_extension()
    z = torch.randn(9000, 2, 16, dtype=torch.float32)
    attn = torch.randn(2, 16, requires_grad=True)
    weight = torch.randn(9000, 2)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            attn.grad = None
            out = agg.gat_scores(z, attn)
            (out * weight).sum().backward()
            results.append((out, attn.grad.clone()))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_gat_scores_gradient_only_where_asked_and_bad_shapes_say_so(monkeypatch):
    z = torch.randn(6, 2, 3, dtype=torch.float64, requires_grad=True)
    attn = torch.randn(1, 2, 3, dtype=torch.float64)  # a constant: only z's gradient is computed
    (agg.gat_scores(z, attn) ** 2).sum().backward()
    torch.testing.assert_close(z.grad, 2 * (z * attn).sum(-1, keepdim=True).detach() * attn)
    assert torch.autograd.gradcheck(agg.gat_scores, (z.detach().requires_grad_(), attn.requires_grad_()))
    with pytest.raises(ValueError, match=r"z \[n, H, D\] and attn \[1, H, D\] or \[H, D\].*got z \(6, 2, 3\), attn \(1, 3, 2\)"):
        agg.gat_scores(z, torch.ones(1, 3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"got z \(6, 6\)"):
        agg.gat_scores(z.detach().view(6, 6), attn)
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    out = agg.gat_scores(z, attn)
    assert "GATScores" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, (z * attn).sum(-1))


# ------------------------------------------------------------------ one gradient for the parts of a layer
def _parts(num_src, num_dst, num_edges, cut, seed=0):
    """A destination-grouped block's edges and destinations cut at destination ``cut`` into two parts, each as
    (edge_src, edge_dst relative to the part, num_dst, dst_start): an overlapped layer's interior and boundary."""
    src, dst = _edges(num_src, num_dst, num_edges, seed=seed, isolated=())
    first = dst < cut
    return [(src[first], dst[first], cut, 0), (src[~first], dst[~first] - cut, num_dst - cut, cut)]


AGGREGATIONS = {
    "sum": lambda x, s, d, nd, d0, share: agg.copy_u_sum(x, s, d, nd, share),
    "mean": lambda x, s, d, nd, d0, share: agg.copy_u_mean(x, s, d, nd, share),
    "self_and_mean": lambda x, s, d, nd, d0, share: agg.self_and_mean(x, s, d, nd, d0, share),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(AGGREGATIONS))
@pytest.mark.parametrize("order", ["first part first", "second part first"])
def test_shared_source_grad_has_the_bits_of_two_gradients_added(dtype, kind, order):
    """Two parts of one layer's destinations over the same sources (as an overlapped layer computes them): with a
    SharedSourceGrad the first backward makes the gradient and the second adds into it, in either order; the bits
    equal autograd adding the two parts' full gradients, and a second backward (retain_graph) starts afresh."""
    _require_extension()
    fn = AGGREGATIONS[kind]
    x = torch.randn(60, 16, dtype=dtype, generator=torch.Generator().manual_seed(2))
    parts = _parts(60, 20, 300, cut=14)  # the first 14 destinations' rows are sources 0..13 (self_and_mean)
    weights = [torch.randn(nd, 16 * (2 if kind == "self_and_mean" else 1), dtype=dtype) for _, _, nd, _ in parts]

    def grads(share):
        xs = x.clone().requires_grad_()
        # autograd runs the backward of the part made last first
        made = [1, 0] if order == "first part first" else [0, 1]
        terms = {i: (fn(xs, *parts[i], share) * weights[i]).sum() for i in made}
        loss = terms[0] + terms[1]
        g1 = torch.autograd.grad(loss, xs, retain_graph=True)[0]
        g2 = torch.autograd.grad(loss, xs)[0]
        return g1, g2

    plain, plain_again = grads(None)
    shared, shared_again = grads(agg.SharedSourceGrad())
    assert torch.equal(shared, plain) and torch.equal(shared_again, plain_again)
    assert shared.abs().sum() > 0


def test_shared_source_grad_counts_only_parts_that_need_a_gradient_and_checks_shapes():
    """Sources that need no gradient register nothing (their backward never runs); two parts over different
    source tensors are refused with the shapes."""
    _require_extension()
    src, dst = torch.tensor([0, 1]), torch.tensor([0, 0])
    share = agg.SharedSourceGrad()
    agg.copy_u_sum(torch.randn(3, 4), src, dst, 1, source_grad=share)
    assert share.parts == 0
    agg.copy_u_sum(torch.randn(3, 4, requires_grad=True), src, dst, 1, source_grad=share)
    assert share.parts == 1
    with pytest.raises(ValueError, match=r"aggregates \(5, 4\) source rows but another \(3, 4\)"):
        agg.copy_u_sum(torch.randn(5, 4, requires_grad=True), src, dst, 1, source_grad=share)


def test_overlapped_layer_passes_one_shared_gradient_to_both_parts(monkeypatch):
    """gsplit.minibatch.overlap gives both parts of a SAGE layer the same SharedSourceGrad (a layer whose combine takes
    none, GAT's, gets none)."""
    from gsplit.nn.layers import GATConv, GraphConv, SAGEConv
    from gsplit.minibatch.overlap import _takes

    assert _takes(SAGEConv(4, 4).combine, "source_grad") and _takes(GraphConv(4, 4).combine, "source_grad")
    assert not _takes(GATConv(4, 2, num_heads=2).combine, "source_grad")
    assert not _takes(len, "place")  # a builtin without a signature (and no weak reference): the plain assembly


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bool_mask", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_relu_dropout_rows_placed_equals_the_rows_placed_after(dtype, bool_mask, compiled, monkeypatch):
    """``place=(num_rows, pos)`` writes row i to row pos[i] of a new tensor: the rows and the gradient (read from the
    rows pos of the whole gradient) have the bits of the unplaced op followed by a copy to those places, NaN and
    signed zeros included; the fallback (no kernel) places with gsplit.ops.rows.place_rows."""
    if compiled:
        _require_extension()
    else:
        monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    g = torch.Generator().manual_seed(3)
    h = torch.randn(30, 16, generator=g, dtype=dtype)
    h[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")], dtype=dtype)
    mask = (torch.rand(6, 16, generator=g) < 0.5).to(dtype)
    given = mask.bool() if bool_mask else mask
    rows = torch.randint(0, 6, (30,), generator=g)
    pos = torch.randperm(45, generator=g)[:30]
    weight = torch.randn(45, 16, generator=g, dtype=dtype)[pos]  # the loss reads only the placed rows

    def placed(x):
        return agg.relu_dropout_rows(x, rows, given, 1 / 0.6, place=(45, pos)).index_select(0, pos)

    out, (g_placed,) = _grads(placed, [h], weight)
    ref, (g_ref,) = _grads(lambda x: agg.relu_dropout_rows(x, rows, given, 1 / 0.6), [h], weight)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0))
    assert torch.equal(g_placed, g_ref)
    made = agg.relu_dropout_rows(h, rows, given, 1 / 0.6, place=(45, pos))
    assert made.shape == (45, 16)
    if compiled:
        assert "Placed" in type(agg.relu_dropout_rows(h.requires_grad_(), rows, given, 2.0, place=(45, pos)).grad_fn
                                ).__name__
        with pytest.raises(IndexError, match=r"an index is outside \[0, 45\)"):
            agg.relu_dropout_rows(h, rows, given, 2.0, place=(45, pos + 20))
