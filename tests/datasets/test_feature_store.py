"""FeatureStore: the per-rank feature cache (hottest owned rows on the device, misses from host memory)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gsplit
from gsplit import ops
from gsplit.ops import cuda as gpu
from gsplit.data.feature_store import CacheCounts, FeatureStore, parse_size
from gsplit.ops.cuda import gather_rows as gather_rows_kernel

from kernel_emulation import build_emulation_lib, make_shim, patch_gpu_launches


def _problem(n=200, dim=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    graph = gsplit.Graph.from_edges(torch.randint(0, n, (1500,), generator=g), torch.randint(0, n, (1500,), generator=g),
                                    n, remove_duplicates=True)
    feats = torch.randn(n, dim, generator=g).to(dtype)
    owner = torch.randint(0, 3, (n,), generator=g)
    weights = torch.rand(n, generator=g)
    weights[::7] = 0.5  # ties, which must be broken by vertex id
    return graph, feats, owner, weights


def _ids(n, seed=1, size=300):
    """Random ids with repeats, both ends of the range, in no order."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randint(0, n, (size,), generator=g), torch.tensor([0, n - 1, 0])])


# ------------------------------------------------------------------------------- sizes
def test_parse_size():
    assert parse_size("10G") == 10 * 2**30
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("0") == 0 and parse_size(0) == 0 and parse_size(None) == 0
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("64kb") == 64 * 1024
    assert parse_size(" 2 T ") == 2 * 2**40
    assert parse_size("123") == 123 and parse_size(np.int64(7)) == 7
    for bad in ("ten", "-1G", "5X", "", "1e9"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="negative"):
        parse_size(-5)


# ------------------------------------------------------------------------------- cache logic on the CPU
@pytest.mark.parametrize("with_owner", [False, True], ids=["world1", "owned-by-rank1"])
def test_every_cache_size_returns_the_right_rows(with_owner):
    graph, feats, owner, weights = _problem()
    own = owner if with_owner else None
    rank = 1 if with_owner else 0
    num_owned = int((owner == 1).sum()) if with_owner else graph.num_nodes
    row_bytes = feats.shape[1] * 4
    ids = _ids(graph.num_nodes)
    total = CacheCounts()
    for k in range(num_owned + 2):  # 0 rows ... every owned row, and a budget beyond it
        store = FeatureStore(feats, cache_size=k * row_bytes + (row_bytes - 1 if k % 2 else 0), weights=weights,
                             owner=own, rank=rank)
        assert store.num_cached == min(k, num_owned) and store.cache_bytes == store.num_cached * row_bytes
        assert store.mode == "cpu"
        rows, counts = store.gather_with_counts(ids)
        assert torch.equal(rows, feats[ids])
        cached = set(store.cached_ids.tolist())
        hits = sum(int(i) in cached for i in ids.tolist())
        assert (counts.hits, counts.misses) == (hits, ids.numel() - hits)
        assert counts.host_bytes == (ids.numel() - hits) * row_bytes
        assert torch.equal(store.is_cached(ids), torch.tensor([int(i) in cached for i in ids.tolist()]))
        assert store.counts == counts  # one call so far
        total += counts
    assert 0 < total.hits < total.hits + total.misses  # both paths were really exercised
    # the last store caches every owned row: exactly the ids of other ranks' vertices miss
    not_owned = int((owner[ids] != 1).sum()) if with_owner else 0
    assert store.misses == not_owned and store.bytes_from_host == not_owned * row_bytes
    assert not with_owner or not_owned > 0


def test_empty_ids_and_counters_accumulate_and_reset():
    graph, feats, owner, weights = _problem()
    store = FeatureStore(feats, cache_size="1K", weights=weights)
    empty = store.gather(torch.tensor([], dtype=torch.int64))
    assert empty.shape == (0, feats.shape[1]) and empty.dtype == feats.dtype
    store.gather(torch.tensor([1, 2, 3]))
    store.gather(torch.tensor([4, 5], dtype=torch.int32))
    assert store.hits + store.misses == 5
    store.reset_counts()
    assert store.counts == CacheCounts()


def test_only_owned_vertices_are_cached_and_never_on_two_ranks():
    graph, feats, owner, weights = _problem()
    for budget in ("0", 40 * 20, "1G"):
        per_rank = [FeatureStore(feats, cache_size=budget, weights=weights, owner=owner, rank=r) for r in range(3)]
        seen = set()
        for r, store in enumerate(per_rank):
            ids = set(store.cached_ids.tolist())
            assert all(int(owner[v]) == r for v in ids), f"rank {r} caches a vertex it does not own"
            assert not (ids & seen), "a vertex is cached on two ranks"
            seen |= ids
        if budget == "1G":  # enough room: every vertex cached exactly once over the ranks
            assert seen == set(range(graph.num_nodes))


def test_hottest_owned_vertices_first_ties_by_id():
    graph, feats, owner, weights = _problem()
    k = 10
    store = FeatureStore(feats, cache_size=k * feats.shape[1] * 4, weights=weights, owner=owner, rank=2)
    owned = [v for v in range(graph.num_nodes) if int(owner[v]) == 2]
    want = sorted(owned, key=lambda v: (-float(weights[v]), v))[:k]
    assert store.cached_ids.tolist() == want
    # ties: many vertices have weight 0.5; the lowest ids among them come first
    tied = FeatureStore(feats, cache_size=3 * feats.shape[1] * 4, weights=torch.ones(graph.num_nodes),
                        owner=owner, rank=2)
    assert tied.cached_ids.tolist() == owned[:3]


def test_in_degree_fallback_and_weight_formats():
    graph, feats, owner, weights = _problem()
    k = 12
    budget = k * feats.shape[1] * 4
    deg = graph.in_degrees()
    by_degree = FeatureStore(feats, cache_size=budget, graph=graph, owner=owner, rank=0)
    owned = [v for v in range(graph.num_nodes) if int(owner[v]) == 0]
    assert by_degree.cached_ids.tolist() == sorted(owned, key=lambda v: (-int(deg[v]), v))[:k]
    a = FeatureStore(feats, cache_size=budget, weights=weights.numpy(), owner=owner, rank=0)
    b = FeatureStore(feats, cache_size=budget, weights=weights.double(), owner=owner, rank=0)
    assert torch.equal(a.cached_ids, b.cached_ids)


def test_presample_weights_object_is_accepted():
    graph, feats, _, _ = _problem()
    sampler = gsplit.NeighborSampler([3, 2], seed=0)
    w = gsplit.presample(graph, torch.arange(0, 60), sampler, batch_size=16, epochs=1)
    store = FeatureStore(feats, cache_size=20 * feats.shape[1] * 4, weights=w)
    vw = w.vertex_weights
    assert float(vw[store.cached_ids].min()) >= float(vw[~store.is_cached(torch.arange(graph.num_nodes))].max())


@pytest.mark.parametrize("dtype,shape", [(torch.float16, (3,)), (torch.int64, (2,)), (torch.float64, (2, 3)),
                                         (torch.uint8, (5,))])
def test_dtypes_and_row_shapes(dtype, shape):
    n = 50
    feats = (torch.arange(n * int(np.prod(shape))) % 251).reshape((n,) + shape).to(dtype)
    store = FeatureStore(feats, cache_size=7 * feats[0].numel() * feats.element_size(), graph=_problem(n)[0])
    ids = _ids(n, size=40)
    out = store.gather(ids)
    assert out.dtype == dtype and torch.equal(out, feats[ids])
    assert 0 < store.hits < ids.numel()


def test_errors_say_what_is_wrong():
    graph, feats, owner, weights = _problem()
    with pytest.raises(ValueError, match="outside"):
        FeatureStore(feats, cache_size="1K", weights=weights).gather(torch.tensor([3, graph.num_nodes]))
    with pytest.raises(ValueError, match="outside"):
        FeatureStore(feats).gather(torch.tensor([-1]))
    with pytest.raises(ValueError, match="1-D integer"):
        FeatureStore(feats).gather(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="weights have shape"):
        FeatureStore(feats, cache_size="1K", weights=torch.ones(3))
    bad = weights.clone()
    bad[4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        FeatureStore(feats, cache_size="1K", weights=bad)
    with pytest.raises(ValueError, match="in-degree"):
        FeatureStore(feats, cache_size="1K")
    with pytest.raises(ValueError, match="owner has shape"):
        FeatureStore(feats, owner=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="not a size"):
        FeatureStore(feats, cache_size="lots")


# ------------------------------------------------------------------------------- the loader uses it
def test_loader_batches_do_not_depend_on_the_cache_and_count_hits():
    graph, feats, _, weights = _problem()
    sampler = gsplit.NeighborSampler([3, 2], seed=2)
    labels = torch.arange(graph.num_nodes)

    def run(**kw):
        loader = gsplit.DataLoader(graph, torch.arange(0, 120), sampler, batch_size=32, shuffle=True, features=feats,
                                   labels=labels, **kw)
        out = []
        for inp, outp, blocks in loader:
            s = loader.last_stats
            assert s.cache_hits + s.cache_misses == s.input_rows == inp.numel()
            out.append((inp, blocks[0].srcdata["feat"], blocks[-1].dstdata["label"], s.cache_hits))
        return loader, out

    _, plain = run()
    loader, cached = run(cache_size=60 * feats.shape[1] * 4, cache_weights=weights)
    assert loader.feature_store.num_cached == 60
    for (i1, f1, l1, h1), (i2, f2, l2, h2) in zip(plain, cached):
        assert torch.equal(i1, i2) and torch.equal(f1, f2) and torch.equal(l1, l2)
        assert h1 == 0 and h2 == int(loader.feature_store.is_cached(i2).sum())
    assert sum(h for *_, h in cached) > 0
    # a second loader shares the store (and its cache) instead of building another
    other = gsplit.DataLoader(graph, torch.arange(120, 200), sampler, batch_size=32, features=loader.feature_store)
    assert other.feature_store is loader.feature_store
    _, _, blocks = next(iter(other))
    assert torch.equal(blocks[0].srcdata["feat"], feats[blocks[0].src_nodes])
    with pytest.raises(ValueError, match="already set up"):
        gsplit.DataLoader(graph, torch.arange(5), sampler, features=loader.feature_store, cache_size="1M")
    with pytest.raises(ValueError, match="no features"):
        gsplit.DataLoader(graph, torch.arange(5), sampler, cache_size="1M")


# ------------------------------------------------------------------------------- the kernel, run on the CPU
# gather.cu run serially on the CPU (see kernel_emulation); gsplit.ops.cuda's launch path drives it.
@pytest.fixture(scope="module")
def gather_lib(tmp_path_factory):
    return build_emulation_lib(tmp_path_factory.mktemp("gather_emu"), make_shim(["gather.cu"]), "libgather_emu.so")


@pytest.fixture
def emulated(gather_lib, monkeypatch):
    """gsplit.ops.cuda's launches replaced by serial CPU runs of gather.cu; at most two blocks of 256 threads,
    so the grid-stride loop goes round several times. Returns the names of the kernels launched."""
    launched = []
    patch_gpu_launches(monkeypatch, gather_lib, launched)
    return launched


@pytest.mark.parametrize("dtype,shape,width", [
    (torch.float32, (8,), 16), (torch.float32, (6,), 8), (torch.float32, (5,), 4), (torch.float16, (3,), 1),
    (torch.float64, (2, 3), 16), (torch.uint8, (7,), 1)])
def test_emulated_gather_kernel(emulated, dtype, shape, width):
    n = 90
    g = torch.Generator().manual_seed(3)
    host = torch.randint(0, 100, (n,) + shape, generator=g).to(dtype)
    cached_ids = torch.tensor([5, 17, 3, 88, 40])
    cache = host[cached_ids].clone()
    ids = _ids(n, size=120)
    slot_of = torch.full((n,), -1, dtype=torch.int64)
    slot_of[cached_ids] = torch.arange(cached_ids.numel())
    slots = slot_of[ids]
    # make a cached row differ from its host row: proves hits are read from the cache
    cache[1] += 1
    want = host[ids].clone()
    want[slots == 1] = cache[1]
    out = torch.empty_like(want)
    gather_rows_kernel(cache, host, slots, ids, out)
    assert emulated == [f"gsplit_gather_rows_{width}"]
    assert torch.equal(out, want)


def test_emulated_store_in_uva_mode(emulated):
    """The whole store on its zero-copy path (forced on the CPU): same rows and counts as the CPU path."""
    graph, feats, owner, weights = _problem(n=120, dim=4)
    ids = _ids(120, size=150)
    for k in (0, 13, 120):
        ref = FeatureStore(feats, cache_size=k * 16, weights=weights)
        uva = FeatureStore(feats, cache_size=k * 16, weights=weights)
        uva.mode, uva._host_for_kernel = "uva", (feats if k < 120 else feats[:0])
        rows, counts = uva.gather_with_counts(ids)
        assert torch.equal(rows, feats[ids])
        assert counts == ref.gather_with_counts(ids)[1]
        with pytest.raises(ValueError, match="outside"):
            uva.gather(torch.tensor([0, 120]))
    assert emulated and set(emulated) == {"gsplit_gather_rows_16"}


def test_kernel_source_is_shipped():
    src = gpu.kernel_source("gather.cu")
    for width in (16, 8, 4, 1):
        assert f"void gsplit_gather_rows_{width}(" in src


# ------------------------------------------------------------------------------- on a GPU
def _cupy_ready() -> bool:
    return torch.cuda.is_available() and gpu.cupy_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cupy_ready(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 100), (torch.float32, 37), (torch.float16, 3)])
def test_gpu_uva_gather_equals_indexing(dtype, dim):
    n = 5000
    feats = torch.randn(n, dim).to(dtype)
    ids = torch.randint(0, n, (20_000,))
    cache = torch.empty((0, dim), dtype=dtype, device="cuda")
    host = feats.clone()
    assert gsplit.ops.cuda.pin_in_place(host)
    assert gsplit.ops.cuda.pin_in_place(host)  # a second registration of the same memory is fine
    out = torch.empty((ids.numel(), dim), dtype=dtype, device="cuda")
    ids_d = ids.cuda()
    gather_rows_kernel(cache, host, torch.full_like(ids_d, -1), ids_d, out)
    assert torch.equal(out.cpu(), feats[ids])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["uva", "host-gather"])
def test_gpu_cache_returns_right_rows(path, monkeypatch):
    if path == "uva" and not gpu.cupy_available():
        pytest.skip("needs CuPy for the zero-copy gather")
    if path == "host-gather":
        monkeypatch.setattr(gpu, "cupy_available", lambda: False)
    graph, feats, owner, weights = _problem(n=3000, dim=33)
    ids = _ids(3000, size=5000)
    for k in (0, 500, 3000):
        store = FeatureStore(feats, device="cuda", cache_size=k * 33 * 4, weights=weights, owner=owner, rank=1)
        assert store.mode == path and store.cache.is_cuda
        rows, counts = store.gather_with_counts(ids.cuda())
        assert rows.is_cuda and torch.equal(rows.cpu(), feats[ids])
        hits = int(store.is_cached(ids).sum())
        assert (counts.hits, counts.misses) == (hits, ids.numel() - hits)
        assert torch.equal(store.gather(ids).cpu(), feats[ids])  # CPU ids are accepted too
        with pytest.raises(ValueError, match="outside"):
            store.gather(torch.tensor([3000], device="cuda"))
    resident = FeatureStore(feats.cuda(), cache_size="1G", weights=weights)  # already on the GPU: no cache
    assert resident.mode == "resident" and resident.num_cached == 0
    assert torch.equal(resident.gather(ids).cpu(), feats[ids]) and resident.hits == ids.numel()
