"""The compiled CPU sampler and relabel (kernels/sample_cpu.cpp) against the plain-torch reference.

Every result of the extension must equal :mod:`gsplit.ops.torch_ops` exactly: the same edges (source,
destination index, edge id, in the same order) and the same local numbering. The torch functions stay
the fallback, so the dispatch tests check that ``GSPLIT_NO_EXTENSIONS=1`` really runs them. Tests that
need the extension are skipped, with the reason, where it cannot be built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gsplit import ops
from gsplit.data.graph import Graph
from gsplit.ops import sample_cpu, torch_ops
from gsplit.ops import counter_rng
from gsplit.sampling import NeighborSampler

# Fanouts around every branch of the C++ code: 1, small ones (insertion sort), the bitmap's word
# boundaries, and 250; -1 takes every in-edge.
FANOUTS = list(range(1, 21)) + [31, 32, 33, 63, 64, 65, 100, 128, 200, 250, -1]

# In-degrees that the graph below gives to vertices 0..7: around the 64-bit words of Floyd's bitmap
# and around its limit (kBitmapMaxDegree = 1024, beyond which the picks are scanned and sorted).
SPECIAL_DEGREES = [1500, 1025, 1024, 300, 65, 64, 63, 250]


@pytest.fixture(scope="module")
def ext():
    mod = sample_cpu.extension()
    if mod is None:
        pytest.skip("the C++ sampler extension cannot be built here (or GSPLIT_NO_EXTENSIONS is set); "
                    "the torch fallback is what runs")
    return mod


def _graph(num_nodes=2000, num_edges=20_000, seed=0) -> Graph:
    """Random in-edges, vertices 0..7 with SPECIAL_DEGREES in-edges, and vertices >= num_nodes - 20 with none."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(0, num_nodes, num_edges)]
    dst = [rng.integers(8, num_nodes - 20, num_edges)]
    for v, d in enumerate(SPECIAL_DEGREES):
        src.append(rng.choice(num_nodes, d, replace=False))
        dst.append(np.full(d, v))
    return Graph.from_edges(np.concatenate(src), np.concatenate(dst), num_nodes, remove_duplicates=True)


def _nodes(num_nodes=2000, n=1500, seed=1) -> torch.Tensor:
    """Unsorted destinations with repeats, the special-degree vertices and ones without in-edges."""
    rng = np.random.default_rng(seed)
    extra = list(range(len(SPECIAL_DEGREES))) * 2 + [num_nodes - 1, num_nodes - 5, num_nodes - 1]
    return torch.from_numpy(rng.permutation(np.concatenate([rng.integers(0, num_nodes, n), extra])))


@pytest.fixture(scope="module")
def graph():
    g = _graph()
    degrees = g.in_degrees()
    assert degrees[: len(SPECIAL_DEGREES)].tolist() == SPECIAL_DEGREES  # the cases below are really there
    assert int((degrees == 0).sum()) >= 20
    return g


def _assert_same(got, want, what):
    for name, a, b in zip(("src", "dst_index", "edge_ids"), got, want):
        assert a.dtype == torch.int64, f"{name} is {a.dtype} for {what}"
        assert torch.equal(a, b), f"{name} differs from the torch sampler for {what}"


# ------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("replace", [False, True], ids=["without", "with-replacement"])
def test_sampler_equals_torch_for_every_fanout(ext, graph, replace):
    nodes = _nodes()
    for fanout in FANOUTS:
        for seed, epoch, iteration, layer in [(0, 0, 0, 0), (7, 3, 11, 2)]:
            key = counter_rng.stream_key(seed, epoch, iteration, layer)
            got = sample_cpu.sample_neighbors(ext, graph, nodes, fanout, replace, key)
            want = torch_ops.sample_neighbors_torch(graph, nodes, fanout, replace, key)
            _assert_same(got, want, f"fanout={fanout} replace={replace} seed={seed}")


def test_sampler_really_subsamples_hubs(ext, graph):
    """Guards the comparisons: picks from the 1500-in-edge hub are a proper, key-dependent subset."""
    hub = torch.tensor([0])
    a = sample_cpu.sample_neighbors(ext, graph, hub, 15, False, counter_rng.stream_key(0, 0, 0, 0))
    b = sample_cpu.sample_neighbors(ext, graph, hub, 15, False, counter_rng.stream_key(0, 0, 1, 0))
    assert a[2].numel() == 15 and torch.unique(a[2]).numel() == 15
    assert bool((a[2][1:] > a[2][:-1]).all())  # CSC order
    assert not torch.equal(a[2], b[2])


def test_sampler_empty_and_edgeless(ext):
    g = Graph.from_edges([0], [1], num_nodes=4)
    for nodes, replace in [(torch.tensor([2, 3, 0]), False), (torch.tensor([2, 0]), True),
                           (torch.tensor([], dtype=torch.int64), True), (torch.tensor([], dtype=torch.int64), False)]:
        for fanout in (1, 5, -1):
            got = sample_cpu.sample_neighbors(ext, g, nodes, fanout, replace, 99)
            assert all(t.numel() == 0 and t.dtype == torch.int64 for t in got)
    got = sample_cpu.sample_neighbors(ext, g, torch.tensor([3, 1, 1]), -1, False, 99)
    assert [t.tolist() for t in got] == [[0, 0], [1, 2], [0, 0]]


def test_sampler_takes_int32_nodes(ext, graph):
    nodes = _nodes()
    key = counter_rng.stream_key(2, 0, 0, 1)
    got = sample_cpu.sample_neighbors(ext, graph, nodes.to(torch.int32), 10, False, key)
    _assert_same(got, torch_ops.sample_neighbors_torch(graph, nodes, 10, False, key), "int32 nodes")


def test_sampler_rejects_out_of_range_ids(ext, graph):
    with pytest.raises(ValueError, match=r"id 2000 .*outside \[0, 2000\)"):
        sample_cpu.sample_neighbors(ext, graph, torch.tensor([1, 2000, 2]), 5, False, 123)
    with pytest.raises(ValueError, match=r"id -1 .*outside \[0, 2000\)"):
        sample_cpu.sample_neighbors(ext, graph, torch.tensor([-1, 3]), -1, False, 123)


def test_sampler_result_does_not_depend_on_threads(ext):
    """Large enough for every parallel loop to split; the output must not change with the thread count."""
    rng = np.random.default_rng(5)
    n = 30_000
    g = Graph.from_edges(rng.integers(0, n, 600_000), rng.integers(0, n, 600_000), n)
    nodes = torch.from_numpy(rng.integers(0, n, 20_000))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            key = counter_rng.stream_key(0, 1, 2, 0)
            sampled = [sample_cpu.sample_neighbors(ext, g, nodes, f, False, key) for f in (10, -1)]
            relabelled = sample_cpu.relabel(ext, torch.unique(nodes), sampled[0][0], n)
            hashed = sample_cpu.relabel(ext, torch.unique(nodes), sampled[0][0], None)
            results.append([t for out in sampled for t in out] + list(relabelled) + list(hashed))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


# ------------------------------------------------------------------------------- relabel
def _relabel_cases(graph):
    rng = np.random.default_rng(3)
    nodes = torch.unique(_nodes())
    dst = nodes[torch.randperm(nodes.numel(), generator=torch.Generator().manual_seed(0))]
    sampled = torch_ops.sample_neighbors_torch(graph, dst, 10, False, counter_rng.stream_key(0, 0, 0, 0))[0]
    return {
        "sampled": (dst, sampled),
        "no-dst": (torch.tensor([], dtype=torch.int64), torch.from_numpy(rng.integers(0, 50, 300))),
        "all-new": (torch.tensor([1999, 5]), torch.tensor([3, 9, 3, 64, 63, 0])),
        "repeats": (torch.tensor([4, 2, 8]), torch.tensor([2, 2, 8, 4, 4, 2])),
        "no-src": (torch.tensor([4, 2, 8]), torch.tensor([], dtype=torch.int64)),
        "nothing": (torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)),
        "src-in-dst": (torch.tensor([7, 1, 1999]), torch.tensor([1999, 7, 7])),
    }


@pytest.mark.parametrize("case", ["sampled", "no-dst", "all-new", "repeats", "no-src", "nothing", "src-in-dst"])
@pytest.mark.parametrize("table", ["dense", "hash"])
def test_relabel_equals_torch(ext, graph, case, table):
    dst, src = _relabel_cases(graph)[case]
    num_nodes = graph.num_nodes if table == "dense" else None
    src_nodes, src_local = sample_cpu.relabel(ext, dst, src, num_nodes)
    for torch_num_nodes in (None, graph.num_nodes):  # torch's sort path and its dense path
        want_nodes, want_local = torch_ops.relabel(dst, src, torch_num_nodes)
        assert torch.equal(src_nodes, want_nodes)
        assert torch.equal(src_local, want_local)
    assert torch.equal(src_nodes[src_local], src)
    assert src_local.dtype == torch.int64 and src_nodes.dtype == torch.int64


def test_relabel_hash_takes_ids_beyond_any_graph(ext):
    dst, src = torch.tensor([1000, 5]), torch.tensor([3, 9, 3, 1 << 40, 5])
    src_nodes, src_local = sample_cpu.relabel(ext, dst, src, None)
    assert src_nodes.tolist() == [1000, 5, 3, 9, 1 << 40] and src_local.tolist() == [2, 3, 2, 4, 1]


def test_relabel_rejects_bad_ids(ext):
    with pytest.raises(ValueError, match="negative"):
        sample_cpu.relabel(ext, torch.tensor([3, -1]), torch.tensor([3, 4]), None)
    with pytest.raises(ValueError, match="negative"):
        sample_cpu.relabel(ext, torch.tensor([3]), torch.tensor([3, -4]), None)
    with pytest.raises(ValueError, match=r"id 10 .*outside \[0, 10\)"):
        sample_cpu.relabel(ext, torch.tensor([3]), torch.tensor([3, 10]), 10)
    with pytest.raises(ValueError, match=r"id -2 .*outside \[0, 10\)"):
        sample_cpu.relabel(ext, torch.tensor([-2]), torch.tensor([3]), 10)


# ------------------------------------------------------------------------------- dispatch
def _spy(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_dispatch_uses_the_extension_on_cpu(ext, graph, monkeypatch):
    ext_samples = _spy(monkeypatch, sample_cpu, "sample_neighbors")
    ext_relabels = _spy(monkeypatch, sample_cpu, "relabel")
    torch_samples = _spy(monkeypatch, torch_ops, "sample_neighbors_torch")
    torch_relabels = _spy(monkeypatch, torch_ops, "relabel")
    src, _, _ = ops.sample_neighbors(graph, _nodes(), 10, False, counter_rng.stream_key(0, 0, 0, 0))
    ops.relabel(torch.unique(_nodes()), src, graph.num_nodes)  # dense table
    ops.relabel(torch.tensor([1, 2]), torch.tensor([2, 3]), graph.num_nodes)  # tiny batch: hash table
    ops.relabel(torch.tensor([1, 2]), torch.tensor([2, 3]))
    assert len(ext_samples) == 1 and len(ext_relabels) == 3
    assert not torch_samples and not torch_relabels


def test_no_extensions_switch_runs_the_torch_fallback(graph, monkeypatch):
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    assert sample_cpu.extension() is None
    torch_calls = _spy(monkeypatch, torch_ops, "sample_neighbors_torch")
    torch_relabels = _spy(monkeypatch, torch_ops, "relabel")
    src, dst_index, eids = ops.sample_neighbors(graph, torch.tensor([0, 1999]), 10, False, 5)
    assert torch_calls and eids.numel() == 10 and dst_index.tolist() == [0] * 10
    src_nodes, src_local = ops.relabel(torch.tensor([0]), src, graph.num_nodes)
    assert torch_relabels and torch.equal(src_nodes[src_local], src)


@pytest.mark.parametrize("replace", [False, True])
def test_mini_batches_equal_with_and_without_the_extension(ext, graph, monkeypatch, replace):
    """The whole layer loop: every block identical whichever implementation runs."""
    sampler = NeighborSampler([5, 10, 25], replace=replace, seed=3)
    seeds = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(1))[:300]
    with_ext = sampler.sample(graph, seeds, epoch=1, iteration=4)
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    without = sampler.sample(graph, seeds, epoch=1, iteration=4)
    assert torch.equal(with_ext.input_nodes, without.input_nodes)
    for a, b in zip(with_ext.blocks, without.blocks):
        assert torch.equal(a.src_nodes, b.src_nodes)
        assert a.num_dst_nodes() == b.num_dst_nodes()
        for x, y in zip(a.edges(), b.edges()):
            assert torch.equal(x, y)
        assert torch.equal(a.edge_ids, b.edge_ids)


def test_a_failed_build_is_remembered_and_returns_none(monkeypatch):
    from gsplit.ops import cpu_ext

    calls = []
    real = cpu_ext._build

    def counting_build(name, sources):
        calls.append(name)
        return real(name, sources)

    monkeypatch.setattr(cpu_ext, "_build", counting_build)
    monkeypatch.delenv("GSPLIT_NO_EXTENSIONS", raising=False)  # the switch would skip the attempt
    cpu_ext._build_or_none.cache_clear()
    try:
        for _ in range(3):
            assert cpu_ext.load("gsplit_test_missing", ["no_such_kernel.cpp"]) is None
        assert calls == ["gsplit_test_missing"]  # one attempt, not one per call
    finally:
        cpu_ext._build_or_none.cache_clear()


def test_a_lock_file_left_by_a_killed_build_does_not_hang_the_next_one(monkeypatch, tmp_path, caplog):
    """torch's cpp_extension waits forever while a ``lock`` file from a killed build exists; gsplit's
    builders hold a kernel lock, remove such a leftover and build."""
    import fcntl

    import torch.utils.cpp_extension as ext

    from gsplit.ops import cpu_ext

    monkeypatch.setenv("GSPLIT_EXTENSION_DIR", str(tmp_path))
    build_dir = cpu_ext.build_folder("gsplit_fake_ext", ("sample_cpu.cpp",))
    build_dir.mkdir(parents=True)
    (build_dir / "lock").write_text("")                     # what a SIGKILLed build leaves behind
    seen = {}

    def fake_load(name, sources, build_directory, **kwargs):
        seen["stale_lock"] = (Path(build_directory) / "lock").exists()
        with open(Path(build_directory).with_name(Path(build_directory).name + ".lock"), "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["held"] = False
            except BlockingIOError:
                seen["held"] = True
        return "module"

    monkeypatch.setattr(ext, "load", fake_load)
    with caplog.at_level("WARNING", logger="gsplit.ops.cpu_ext"):
        assert cpu_ext._build.__wrapped__("gsplit_fake_ext", ("sample_cpu.cpp",)) == "module"
    assert seen == {"stale_lock": False, "held": True}
    assert "interrupted build" in caplog.text


def test_two_environments_with_the_same_torch_share_one_build(monkeypatch, tmp_path, caplog):
    """Fails on the old main: every process handed cpp_extension the sources where its gsplit lived, and
    ninja's file held those paths and the environment's torch headers, so a second virtual environment
    with the same torch (or an installed copy next to a checkout) rewrote it and recompiled, about 45 s
    on every switch. Now a finished build is loaded from its folder without cpp_extension, and a build
    compiles copies of the sources kept there; only the sources' content, the flags and the torch/Python
    ABI choose the folder."""
    import shutil

    import torch.utils.cpp_extension as ext

    from gsplit.ops import cpu_ext

    monkeypatch.setenv("GSPLIT_EXTENSION_DIR", str(tmp_path / "cache"))
    source = cpu_ext.kernel_path("sample_cpu.cpp")
    checkouts = [tmp_path / "clone" / "kernels", tmp_path / "site-packages" / "gsplit" / "_kernels"]
    for d in checkouts:
        d.mkdir(parents=True)
        shutil.copy(source, d / "sample_cpu.cpp")
    compiled, imported = [], []

    def fake_load(name, sources, build_directory, **kwargs):   # what cpp_extension leaves: the library
        compiled.append(list(sources))
        (Path(build_directory) / f"{name}.so").write_bytes(b"library")
        return "module"

    monkeypatch.setattr(ext, "load", fake_load)
    monkeypatch.setattr(cpu_ext, "_import_library", lambda name, library: imported.append(library) or "module")
    folders = []
    with caplog.at_level("WARNING", logger="gsplit.ops.cpu_ext"):
        for where in checkouts + checkouts:  # one environment, the other, and back: as many processes
            monkeypatch.setattr(cpu_ext, "kernel_path", lambda name, where=where: where / name)
            assert cpu_ext._build.__wrapped__("gsplit_fake_ext", ("sample_cpu.cpp",)) == "module"
            folders.append(cpu_ext.build_folder("gsplit_fake_ext", ("sample_cpu.cpp",)))
    assert len(compiled) == 1 and len(imported) == 3, (compiled, imported)
    assert len(set(folders)) == 1
    assert compiled[0] == [str(folders[0] / "src" / "sample_cpu.cpp")]   # a copy: no installation's path
    assert (folders[0] / "src" / "sample_cpu.cpp").read_bytes() == source.read_bytes()
    said = [r.getMessage() for r in caplog.records if "building the compiled CPU kernel" in r.getMessage()]
    assert len(said) == 1 and str(folders[0]) in said[0]   # said once, with where it caches
    (checkouts[0] / "sample_cpu.cpp").write_bytes(source.read_bytes() + b"\n// changed\n")
    monkeypatch.setattr(cpu_ext, "kernel_path", lambda name: checkouts[0] / name)
    assert cpu_ext.build_folder("gsplit_fake_ext", ("sample_cpu.cpp",)) != folders[0]  # new sources: new build
