"""CUDA kernels in kernels/: they compile, and they pick exactly the edges the torch sampler picks.

Three levels, so that machines without a GPU still test the kernel source itself:
- every .cu compiles with nvcc for sm_90 (when nvcc is on PATH);
- the kernels run serially on the CPU (g++ with a tiny shim for the CUDA built-ins they use) under
  the real wrappers of gsplit.ops.cuda, and are compared with NeighborSampler / relabel;
- on a GPU with CuPy (marked ``gpu``), the Python wrappers in gsplit.ops.cuda are compared with the CPU.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from gsplit import ops
from gsplit.ops import cuda as gpu
from gsplit.ops import sample_cuda
from gsplit.data.graph import Graph
from gsplit.ops import counter_rng
from gsplit.sampling import NeighborSampler
from gsplit.ops.torch_ops import relabel

from kernel_emulation import KERNEL_DIR, build_emulation_lib, make_shim, patch_gpu_launches

CU_FILES = sorted(KERNEL_DIR.glob("*.cu"))

FANOUTS = [1, 3, 10, 25, 250, -1]


def _graph(num_nodes=300, num_edges=3000, seed=0) -> Graph:
    """Random graph with a hub (vertex 0, in-degree ~200) and vertices without in-edges (>= 290)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes - 10, num_edges)
    hub_src = rng.choice(num_nodes, 200, replace=False)
    src = np.concatenate([src, hub_src])
    dst = np.concatenate([dst, np.zeros(200, dtype=np.int64)])
    return Graph.from_edges(src, dst, num_nodes, remove_duplicates=True)


def _nodes(num_nodes=300, n=500, seed=1) -> torch.Tensor:
    """Unsorted destinations with repeats, the hub and in-degree-0 vertices included."""
    rng = np.random.default_rng(seed)
    nodes = np.concatenate([rng.integers(0, num_nodes, n), [0, 295, 0, 299, 17]])
    return torch.from_numpy(rng.permutation(nodes))


def _reference(graph, nodes, fanout, replace, seed, epoch, iteration, layer=0):
    fanouts = [5] * layer + [fanout]
    out = NeighborSampler(fanouts, replace=replace, seed=seed).sample_neighbors(graph, nodes, layer, epoch, iteration)
    return out.src, out.dst_index, out.edge_ids


def test_reference_picks_are_real_samples():
    """Guards the comparisons below: the reference really subsamples, so equality is not vacuous."""
    g = _graph()
    nodes = torch.tensor([0])
    src, dst_index, eids = _reference(g, nodes, 10, False, 0, 0, 0)
    assert eids.numel() == 10 and torch.unique(eids).numel() == 10
    src2, _, _ = _reference(g, nodes, 10, False, 0, 0, 1)
    assert not torch.equal(src, src2)


# ------------------------------------------------------------------------------- nvcc compiles
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_kernel_compiles_with_nvcc(cu, tmp_path):
    """Device-only compile (front end + ptxas), warnings as errors; NVRTC compiles the same code."""
    text = cu.read_text()
    # CuPy compiles with NVRTC, which has no host headers: the kernels must include nothing.
    includes = [ln for ln in text.splitlines() if ln.lstrip().startswith("#include")]
    assert not includes, f"{cu.name} includes {includes}; NVRTC has no host headers, keep kernels self-contained"
    assert 'extern "C" __global__' in text
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    res = subprocess.run(
        [nvcc, "-cubin", "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", "-o", str(tmp_path / "k.cubin"), str(cu)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"nvcc failed on {cu.name}:\n{res.stderr}"
    assert (tmp_path / "k.cubin").stat().st_size > 0


def test_kernel_dir_has_the_kernels_the_wrappers_launch():
    names = {p.name for p in CU_FILES}
    assert {"sample.cu", "relabel.cu"} <= names
    assert (KERNEL_DIR / "__init__.py").is_file()
    src = gpu.kernel_source("sample.cu")
    for k in ("gsplit_sample_count", "gsplit_sample_fill", "gsplit_sample_all"):
        assert f"void {k}(" in src
    src = gpu.kernel_source("relabel.cu")
    for k in ("gsplit_relabel_insert_dst", "gsplit_relabel_insert_src", "gsplit_relabel_assign", "gsplit_relabel_lookup"):
        assert f"void {k}(" in src
    with pytest.raises(FileNotFoundError, match="nope.cu"):
        gpu.kernel_source("nope.cu")


def test_compile_kernels_names_every_cuda_file_with_one_of_its_kernels():
    """`compile_kernels` (the GPU benchmark's start phase, a warm-up for users) loads every .cu file."""
    assert set(gpu.KERNEL_MODULES) == {p.name for p in CU_FILES}
    for name, kernel in gpu.KERNEL_MODULES.items():
        assert f"void {kernel}(" in gpu.kernel_source(name), (name, kernel)


# ------------------------------------------------------------------------------- kernels on the CPU
# The kernels run serially on the CPU (see kernel_emulation): built as a shared library, they replace
# CuPy's launches under gsplit.ops.cuda's own wrappers, which checks the wrappers' argument lists and
# orchestration as well as the kernels. Only sample.cu and relabel.cu need atomics; serial runs make
# them plain read-modify-writes.
_ATOMICS = r"""
static unsigned long long atomicCAS(unsigned long long* a, unsigned long long cmp, unsigned long long val) {
    unsigned long long old = *a;
    if (old == cmp) *a = val;
    return old;
}
static unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    unsigned long long old = *a;
    *a = old + v;
    return old;
}
"""


@pytest.fixture(scope="module")
def kernel_lib(tmp_path_factory):
    shim = make_shim(["sample.cu", "relabel.cu"], extra=_ATOMICS)
    return build_emulation_lib(tmp_path_factory.mktemp("emu"), shim, "libgsplit_kernels_emu.so")


@pytest.fixture
def emulated(kernel_lib, monkeypatch):
    """gsplit.ops.cuda with its CuPy launches replaced by serial CPU runs of the same kernels."""
    patch_gpu_launches(monkeypatch, kernel_lib)
    return gpu


@pytest.mark.parametrize("replace", [False, True], ids=["without", "with-replacement"])
@pytest.mark.parametrize("fanout", FANOUTS)
def test_emulated_kernel_matches_cpu_sampler(emulated, fanout, replace):
    g, nodes = _graph(), _nodes()
    for seed, epoch, iteration, layer in [(0, 0, 0, 0), (7, 3, 11, 2)]:
        key = counter_rng.stream_key(seed, epoch, iteration, layer)
        got = sample_cuda._sample_kernel(g, nodes, fanout, replace, key)
        want = _reference(g, nodes, fanout, replace, seed, epoch, iteration, layer)
        for name, a, b in zip(("src", "dst_index", "edge_ids"), got, want):
            assert torch.equal(a, b), f"{name} differs for fanout={fanout} replace={replace} seed={seed}"


def test_emulated_kernel_rejects_out_of_range_ids(emulated):
    g = _graph()
    with pytest.raises(ValueError, match=r"outside \[0, 300\)"):
        sample_cuda._sample_kernel(g, torch.tensor([1, g.num_nodes, 2]), 5, False, 123)
    with pytest.raises(ValueError, match="outside"):
        sample_cuda._sample_kernel(g, torch.tensor([-1]), -1, False, 123)


def test_emulated_kernel_empty_and_edgeless(emulated):
    g = Graph.from_edges([0], [1], num_nodes=4)
    for nodes, replace in [(torch.tensor([2, 3, 0]), False), (torch.tensor([2, 0]), True), (torch.tensor([], dtype=torch.int64), True)]:
        got = sample_cuda._sample_kernel(g, nodes, 5, replace, 99)
        assert all(t.numel() == 0 and t.dtype == torch.int64 for t in got)
    src, dst_index, eids = sample_cuda._sample_kernel(g, torch.tensor([3, 1, 1]), -1, False, 99)
    assert src.tolist() == [0, 0] and dst_index.tolist() == [1, 2] and eids.tolist() == [0, 0]


@pytest.mark.parametrize("case", ["sampled", "no-dst", "all-new", "repeats", "no-src"])
def test_emulated_relabel_matches_torch(emulated, case):
    rng = np.random.default_rng(3)
    if case == "sampled":
        g, nodes = _graph(), torch.unique(_nodes())
        dst = nodes[torch.randperm(nodes.numel(), generator=torch.Generator().manual_seed(0))]
        src = _reference(g, dst, 10, False, 0, 0, 0)[0]
    elif case == "no-dst":
        dst, src = torch.tensor([], dtype=torch.int64), torch.from_numpy(rng.integers(0, 50, 300))
    elif case == "all-new":
        dst, src = torch.tensor([1000, 5]), torch.tensor([3, 9, 3, 1 << 40])
    elif case == "repeats":
        dst, src = torch.tensor([4, 2, 8]), torch.tensor([2, 2, 8, 4, 4, 2])
    else:
        dst, src = torch.tensor([4, 2, 8]), torch.tensor([], dtype=torch.int64)
    src_nodes, src_local = emulated._relabel_kernel(dst, src)
    want_nodes, want_local = relabel(dst, src)
    assert torch.equal(src_nodes, want_nodes)
    assert torch.equal(src_local, want_local)
    assert torch.equal(src_nodes[src_local], src)


def test_emulated_relabel_rejects_negative_ids(emulated):
    with pytest.raises(ValueError, match="negative"):
        emulated._relabel_kernel(torch.tensor([3, -1]), torch.tensor([3, 4]))


# ------------------------------------------------------------------------------- wrappers, no GPU
def test_cupy_available_is_a_bool():
    assert isinstance(gpu.cupy_available(), bool)


def test_relabel_gpu_falls_back_on_cpu():
    dst, src = torch.tensor([5, 2]), torch.tensor([9, 2, 7, 9])
    src_nodes, src_local = ops.relabel(dst, src)
    assert src_nodes.tolist() == [5, 2, 7, 9] and src_local.tolist() == [3, 1, 2, 3]


@pytest.mark.parametrize("replace", [False, True])
def test_sample_neighbors_gpu_falls_back_on_cpu(replace):
    g, nodes = _graph(), _nodes()
    key = counter_rng.stream_key(1, 2, 3, 0)
    got = ops.sample_neighbors(g, nodes, 10, replace, key)
    want = _reference(g, nodes, 10, replace, 1, 2, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_sample_neighbors_gpu_rejects_bad_arguments():
    g = _graph()
    with pytest.raises(ValueError, match="fanout = 0"):
        ops.sample_neighbors(g, torch.tensor([0]), 0, False, 1)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        ops.sample_neighbors(g, torch.tensor([0]), 3, False, -1)


# ------------------------------------------------------------------------------- on a GPU
def _gpu_ready() -> bool:
    return torch.cuda.is_available() and gpu.cupy_available()


gpu_ready = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA GPU and CuPy")


def _big_graph(num_nodes=20_000, seed=0) -> Graph:
    """Skewed in-degrees (a few hubs with thousands of in-edges) and some vertices without in-edges."""
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.zipf(1.6, 300_000) - 1, num_nodes - 1)
    dst = rng.permutation(num_nodes)[dst]
    src = rng.integers(0, num_nodes, dst.size)
    return Graph.from_edges(src, dst, num_nodes, remove_duplicates=True)


@pytest.fixture(scope="module")
def big_case():
    g = _big_graph()
    rng = np.random.default_rng(5)
    nodes = torch.from_numpy(rng.integers(0, g.num_nodes, 5000))
    hubs = torch.topk(g.in_degrees(), 3).indices
    return g, torch.cat([nodes, hubs, hubs[:1]])


@pytest.mark.gpu
@gpu_ready
@pytest.mark.parametrize("where", ["device", "pinned"])
@pytest.mark.parametrize("replace", [False, True], ids=["without", "with-replacement"])
@pytest.mark.parametrize("fanout", [1, 5, 15, 40, -1])
def test_gpu_sampling_matches_cpu(big_case, fanout, replace, where):
    g, nodes = big_case
    graph = g.to("cuda") if where == "device" else g.pin_memory()
    for seed, epoch, iteration, layer in [(0, 0, 0, 0), (3, 1, 42, 1)]:
        key = counter_rng.stream_key(seed, epoch, iteration, layer)
        got = ops.sample_neighbors(graph, nodes.cuda(), fanout, replace, key)
        want = _reference(g, nodes, fanout, replace, seed, epoch, iteration, layer)
        for name, a, b in zip(("src", "dst_index", "edge_ids"), got, want):
            assert a.is_cuda
            assert torch.equal(a.cpu(), b), f"{name} differs (fanout={fanout}, replace={replace}, {where})"


@pytest.mark.gpu
@gpu_ready
def test_gpu_compile_kernels_loads_every_file():
    seconds = gpu.compile_kernels(torch.device("cuda", torch.cuda.current_device()))
    assert set(seconds) == set(gpu.KERNEL_MODULES) and all(s >= 0 for s in seconds.values())


@pytest.mark.gpu
@gpu_ready
def test_gpu_sampling_rejects_out_of_range_ids(big_case):
    g, _ = big_case
    with pytest.raises(ValueError, match="outside"):
        ops.sample_neighbors(g.to("cuda"), torch.tensor([0, g.num_nodes], device="cuda"), 5, False, 1)


@pytest.mark.gpu
@gpu_ready
def test_gpu_sampling_runs_on_torch_stream(big_case):
    """Launches go to torch's current stream: results are right without an explicit synchronise."""
    g, nodes = big_case
    graph, key = g.to("cuda"), counter_rng.stream_key(0, 0, 0, 0)
    want = _reference(g, nodes, 10, False, 0, 0, 0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the graph was copied on the default stream
    with torch.cuda.stream(stream):
        got = ops.sample_neighbors(graph, nodes.to("cuda", non_blocking=True), 10, False, key)
        got = [t.cpu() for t in got]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
@gpu_ready
def test_gpu_launches_do_not_warn(big_case):
    """CuPy 14 warns at every ExternalStream (60-97 warnings per GPU test file on the H100): launches wrap
    torch's stream through the stream protocol instead."""
    import warnings

    if not hasattr(torch.cuda.Stream, "__cuda_stream__"):
        pytest.skip("this torch's streams have no __cuda_stream__ (torch < 2.8): CuPy 14 can only wrap the raw handle")
    g, nodes = big_case
    graph = g.to("cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops.sample_neighbors(graph, nodes.cuda(), 10, False, counter_rng.stream_key(0, 0, 0, 0))
        torch.cuda.synchronize()
    assert not [w for w in caught if "ExternalStream" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.gpu
@gpu_ready
def test_gpu_relabel_matches_torch(big_case):
    g, nodes = big_case
    dst = torch.unique(nodes)
    dst = dst[torch.randperm(dst.numel())]
    src = _reference(g, dst, 15, False, 0, 0, 0)[0]
    want_nodes, want_local = relabel(dst, src)
    for run in (gpu.relabel, ops.relabel):  # the kernel, and the default (plain torch on a GPU)
        got_nodes, got_local = run(dst.cuda(), src.cuda())
        assert torch.equal(got_nodes.cpu(), want_nodes)
        assert torch.equal(got_local.cpu(), want_local)
    empty_nodes, empty_local = gpu.relabel(dst.cuda(), src[:0].cuda())
    assert torch.equal(empty_nodes.cpu(), dst) and empty_local.numel() == 0


@pytest.mark.gpu
@gpu_ready
def test_gpu_sample_blocks_match_cpu(big_case):
    """The whole single-process mini-batch on the GPU equals the CPU one (whatever path it dispatches to)."""
    g, nodes = big_case
    seeds = torch.unique(nodes)[:512]
    sampler = NeighborSampler([10, 5, -1], seed=4)
    cpu_blocks = sampler.sample_blocks(g, seeds, epoch=1, iteration=2)
    gpu_blocks = sampler.sample_blocks(g.to("cuda"), seeds.cuda(), epoch=1, iteration=2)
    for a, b in zip(cpu_blocks, gpu_blocks):
        for name in ("src_nodes", "edge_src", "edge_dst", "edge_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
