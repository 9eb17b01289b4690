"""Making a host table GPU-readable never stalls: slow or refused registrations fall back, with one WARNING.

The GPU issue: `gsplit train` on a 2M-vertex dataset folder reached no iteration in 125 s, one host core busy,
while the split path registered the memory-mapped 1 GiB feature table (and with --uva the graph) with one
`cudaHostRegister` call per array. Here CuPy's runtime is a fake (tests/fake_cupy.py) whose registration takes
a set time per MiB or is refused, so what is tested is what gsplit asks for, how long it waits and what it
falls back to. The GPU-marked tests at the end check the same on a real GPU.
"""

import logging
import time

import numpy as np
import pytest
import torch

import gsplit
from fake_cupy import MIB, FakeRuntime
from gsplit.baselines import DataParallelLoader
from gsplit.data.feature_store import FeatureStore
from gsplit.ops import pinning
from gsplit.runtime.timing import timed_step
from kernel_emulation import build_emulation_lib, make_shim, patch_gpu_launches

READ_ONLY, MAPPED, PORTABLE = 8, 2, 1


@pytest.fixture
def small_budget(monkeypatch):
    """Registering may take 2 s per GiB, at least 0.3 s (the default is 3 s per GiB, at least 3 s)."""
    monkeypatch.setenv("GSPLIT_PIN_SECONDS_PER_GIB", "2")
    monkeypatch.setenv("GSPLIT_PIN_MIN_SECONDS", "0.3")
    monkeypatch.delenv("GSPLIT_PIN", raising=False)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _big_graph(edges: int = 8 << 20) -> gsplit.Graph:
    gen = torch.Generator().manual_seed(0)
    nodes = 1000
    indptr = torch.linspace(0, edges, nodes + 1).round().to(torch.int64)
    return gsplit.Graph.from_csc(indptr, torch.randint(0, nodes, (edges,), generator=gen), validate=False)


def test_a_slow_registration_is_undone_and_replaced_by_a_pinned_copy_within_its_budget(monkeypatch, small_budget,
                                                                                        caplog):
    """The stall on the CPU: registering takes 0.05 s per MiB, so the 64 MiB `indices` array of a --uva graph
    takes 3.2 s in one call (what main does: `Graph.pin_memory` blocks for all of it, and a 1 GiB feature
    table would block for 51 s). Now the first 16 MiB piece projects the whole beyond the budget (0.3 s): it is
    unregistered and the GPU reads a pinned copy, with one WARNING line saying so and why."""
    rt = FakeRuntime(seconds_per_mib=0.05).install(monkeypatch)
    g = _big_graph()
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO):
        pinned = g.pin_memory()
    assert time.monotonic() - t0 < 2.0  # main: 3.2 s in cudaHostRegister alone
    assert torch.equal(pinned.indices, g.indices) and torch.equal(pinned.indptr, g.indptr)
    assert rt.pinned(pinned.indices) and rt.pinned(pinned.indptr)
    assert pinned.indices.data_ptr() != g.indices.data_ptr()  # a copy
    assert not rt.pinned(g.indices) and list(rt.registered) == [g.indptr.data_ptr()]  # the slow piece undone
    [warning] = _warnings(caplog)
    assert "graph indices array is not pinned in place" in warning and "over its budget of 0 s" in warning
    assert "pinned copy instead" in warning
    assert any("readable by the GPU took" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    assert gsplit.ops.sample_cuda.graph_readable(pinned, torch.device("cuda", 0))


def test_a_refused_registration_leaves_nothing_registered(monkeypatch, small_budget, caplog):
    """The timed 16 MiB probe passes, the whole 40 MiB is refused (a locked-memory limit): nothing stays
    registered and the GPU reads a pinned copy."""
    rt = FakeRuntime(refuse_over=20 * MIB).install(monkeypatch)
    table = torch.randn(10 * MIB)  # 40 MiB
    with caplog.at_level(logging.WARNING):
        got = pinning.make_host_readable(table, "host feature table")
    assert got.how == "copied" and torch.equal(got.tensor, table) and "refused" in got.reason
    (p0, n0), (p1, n1) = [(c[1], c[2]) for c in rt.register_calls()]
    # the probe: 16 MiB ending on a page boundary; then the whole range from the same address
    assert p0 == p1 == table.data_ptr() and 16 * MIB <= n0 < 16 * MIB + 4096 and (p0 + n0) % 4096 == 0
    assert n1 == 40 * MIB
    assert ("unregister", table.data_ptr()) in rt.calls and not rt.registered
    assert len(_warnings(caplog)) == 1 and "cudaErrorMemoryAllocation" in _warnings(caplog)[0]


def test_without_memory_for_a_copy_the_cpu_gathers_with_one_warning(monkeypatch, small_budget, caplog):
    rt = FakeRuntime(refuse_after=0).install(monkeypatch)
    monkeypatch.setattr(pinning, "available_memory", lambda: 2 * MIB)
    table = torch.randn(MIB)
    with caplog.at_level(logging.WARNING):
        got = pinning.make_host_readable(table, "host feature table")
    assert got.tensor is None and got.how == "host-gather" and not rt.allocated
    [warning] = _warnings(caplog)
    assert "not readable by the GPU" in warning and "refused" in warning and "needs 0.00 GiB" in warning
    assert "CPU gathers" in warning


def test_the_copy_leaves_room_for_every_rank_of_the_host(monkeypatch, small_budget, caplog):
    """Ranks check the memory at about the same time: each must count the others' copies, or 8 ranks of a
    host would each take half of it (pinned memory cannot be swapped out)."""
    FakeRuntime(refuse_after=0).install(monkeypatch)
    monkeypatch.setattr(pinning, "available_memory", lambda: 40 * MIB)
    table = torch.randn(MIB)  # 4 MiB: one copy fits in half of 40 MiB, eight do not
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert pinning.make_host_readable(table, "table").how == "copied"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert pinning.make_host_readable(table, "table").how == "host-gather"
    assert "for each of the host's 8 ranks" in _warnings(caplog)[0]


def test_a_memory_mapped_table_is_never_registered_but_copied(monkeypatch, small_budget, caplog, tmp_path):
    """A prepared folder's features (np.load mmap_mode="c"): registering them would unshare every page."""
    rt = FakeRuntime().install(monkeypatch)
    data = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)
    np.save(tmp_path / "features.npy", data)
    mapped = torch.from_numpy(np.load(tmp_path / "features.npy", mmap_mode="c"))
    where = pinning.backing(mapped.data_ptr(), mapped.numel() * 4)
    assert (where.kind, where.path, where.private) == ("file", str(tmp_path / "features.npy"), True)
    with caplog.at_level(logging.INFO):
        got = pinning.make_host_readable(mapped, "host feature table")
    assert got.how == "copied" and "memory-mapped file" in got.reason
    assert not rt.register_calls() and not _warnings(caplog)  # the designed path: INFO, not a warning
    assert torch.equal(got.tensor, mapped) and rt.pinned(got.tensor)
    assert pinning.backing(got.tensor.data_ptr(), got.tensor.numel() * 4).kind != "file"
    assert np.array_equal(np.load(tmp_path / "features.npy"), data)  # the file is untouched
    assert not pinning.register_in_place(mapped)[0]  # asked directly, it refuses too


def test_in_place_registration_is_one_range_and_ends_with_the_storage(monkeypatch, small_budget):
    """One registration over the whole table, so CUDA can copy any part of it: the GPU run (H100) that
    registered a --uva graph in a 16 MiB piece and a 224 MiB piece then failed `graph.to("cuda")` with
    cudaErrorInvalidValue, since a copy may not span two registrations (FakeRuntime.copyable models that)."""
    rt = FakeRuntime().install(monkeypatch)
    table = torch.randn(10 * MIB)
    got = pinning.make_host_readable(table, "host feature table")
    assert got.how == "registered" and got.tensor is table
    # the timed probe (16 MiB to a page boundary, undone), then the whole range, read-only both times
    (_, p0, n0, f0), (_, p1, n1, f1) = rt.register_calls()
    assert p0 == p1 == table.data_ptr() and 16 * MIB <= n0 < 16 * MIB + 4096 and n1 == 40 * MIB
    assert f0 == f1 == PORTABLE | MAPPED | READ_ONLY
    assert rt.registered == {table.data_ptr(): 40 * MIB}
    assert rt.copyable(table) and rt.copyable(table[4 * MIB - 7:8 * MIB])  # across the old 16 MiB seam
    assert pinning.make_host_readable(table[5:], "view").how == "pinned"  # already readable: nothing to do
    view = table[100:]
    del table, got
    assert len(rt.registered) == 1  # a view keeps the storage alive
    del view
    assert not rt.registered


def test_without_read_only_support_anonymous_memory_is_pinned_writable(monkeypatch, small_budget):
    rt = FakeRuntime(read_only=False).install(monkeypatch)
    table = torch.randn(10 * MIB)
    assert pinning.make_host_readable(table, "table").how == "registered"
    rw = PORTABLE | MAPPED
    assert [c[3] for c in rt.register_calls()] == [rw | READ_ONLY, rw, rw]  # the whole range: what the probe used
    assert rt.copyable(table)


def test_the_graph_pinned_for_uva_can_still_be_copied_to_the_gpu(monkeypatch, small_budget):
    """`--uva` pins the dataset's graph in place; a later `graph.to("cuda")` of the same dataset (a dp or
    non-uva run in the same process, the GPU benchmark's next row) copies it: every array is one registration."""
    rt = FakeRuntime().install(monkeypatch)
    g = _big_graph()  # indices: 64 MiB
    pinned = g.pin_memory()
    assert pinned.indices is g.indices and pinned.indptr is g.indptr  # in place
    assert rt.copyable(g.indices) and rt.copyable(g.indptr) and len(rt.registered) == 2


@pytest.mark.parametrize("mode,how", [("off", "host-gather"), ("copy", "copied"), ("register", "registered")])
def test_the_strategy_can_be_chosen(monkeypatch, small_budget, mode, how):
    FakeRuntime().install(monkeypatch)
    monkeypatch.setenv("GSPLIT_PIN", mode)
    assert pinning.make_host_readable(torch.randn(1000), "table").how == how
    monkeypatch.setenv("GSPLIT_PIN", "sometimes")
    with pytest.raises(ValueError, match="GSPLIT_PIN='sometimes'.*auto, register, copy, off"):
        pinning.make_host_readable(torch.randn(1000), "table")


def test_cuda_pin_in_place_warns_with_the_reason(monkeypatch, small_budget, caplog, tmp_path):
    FakeRuntime().install(monkeypatch)
    np.save(tmp_path / "f.npy", np.ones((100, 8), dtype=np.float32))
    with caplog.at_level(logging.WARNING):
        assert not gsplit.ops.cuda.pin_in_place(torch.from_numpy(np.load(tmp_path / "f.npy", mmap_mode="c")))
    assert "copy-on-write" in caplog.text and "f.npy" in caplog.text


# ------------------------------------------------------------------------------------ setup steps say their time
def test_a_long_step_shows_progress_and_one_warning(caplog):
    with caplog.at_level(logging.INFO, logger="gsplit.runtime.timing"):
        with timed_step("pinning the test table", progress_after=0.05, every=0.05, warn_after=0.2) as step:
            step.update(1 << 30, 4 << 30)
            time.sleep(0.45)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("still pinning the test table") and "1.00 of 4.00 GiB, 25 %" in m for m in messages)
    assert len(_warnings(caplog)) == 1 and "pinning the test table has taken" in _warnings(caplog)[0]
    assert messages[-1].startswith("pinning the test table took 0.4")


def test_training_setup_steps_log_their_time(caplog):
    from gsplit.run.trainer import TrainConfig, train_rank

    ds = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0)
    cfg = TrainConfig(system="dp", epochs=1, max_iters=2, eval_every=0, fanouts=[4, 4], batch_size=64,
                      final_eval=False)
    with caplog.at_level(logging.INFO):
        train_rank(0, 1, cfg, ds, None)
    messages = [r.getMessage() for r in caplog.records]
    for step in ("setting up the training loader took", "setting up the evaluation loaders took"):
        assert any(m.startswith(step) for m in messages), step


# ------------------------------------------------------------------------------------ data parallel through the store
def _dp_problem():
    ds = gsplit.datasets.load("synthetic", num_nodes=1500, seed=1)
    return ds, gsplit.NeighborSampler([5, 3], seed=2)


def test_data_parallel_loads_through_a_feature_store_with_the_same_rows():
    ds, sampler = _dp_problem()
    idx = ds.train_idx[:300]
    ref = iter(DataParallelLoader(ds.graph, idx, sampler, batch_size=64, features=None, labels=ds.labels))
    for cache in (0, "1M"):
        loader = DataParallelLoader(ds.graph, idx, sampler, batch_size=64, features=ds.features, labels=ds.labels,
                                    cache_size=cache, cache_weights=None if not cache else torch.rand(1500))
        assert isinstance(loader.feature_store, FeatureStore) and loader.feature_store.mode == "cpu"
        for (inputs, outputs, blocks), (rin, rout, rblocks) in zip(loader, ref):
            assert torch.equal(inputs, rin) and torch.equal(outputs, rout)
            assert torch.equal(blocks[0].srcdata["feat"], ds.features[inputs])  # today's dp: features[ids]
            assert torch.equal(blocks[-1].dstdata["label"], ds.labels[outputs])
        ref = iter(DataParallelLoader(ds.graph, idx, sampler, batch_size=64, labels=ds.labels))
    assert loader.last_stats.cache_hits + loader.last_stats.cache_misses == inputs.numel()
    shared = DataParallelLoader(ds.graph, idx, sampler, batch_size=64, features=loader.feature_store)
    assert shared.feature_store is loader.feature_store
    with pytest.raises(ValueError, match="already set up"):
        DataParallelLoader(ds.graph, idx, sampler, features=loader.feature_store, cache_size="1M")


@pytest.fixture(scope="module")
def gather_lib(tmp_path_factory):
    return build_emulation_lib(tmp_path_factory.mktemp("gather_emu"), make_shim(["gather.cu"]), "libgather_emu.so")


def test_data_parallel_gathers_on_the_gpu_from_a_pinned_copy(monkeypatch, small_budget, gather_lib):
    """dp's GPU path with the gather kernel run on the CPU (kernel_emulation) reading a pinned copy of a
    memory-mapped table: the same rows as the host gather of today's dp."""
    launched = []
    rt = FakeRuntime().install(monkeypatch)
    patch_gpu_launches(monkeypatch, gather_lib, launched)
    ds, sampler = _dp_problem()
    monkeypatch.setenv("GSPLIT_PIN", "copy")
    loader = DataParallelLoader(ds.graph, ds.train_idx[:200], sampler, batch_size=64, features=ds.features)
    store = loader.feature_store
    readable = pinning.make_host_readable(store.features, "host feature table")
    assert readable.how == "copied" and rt.pinned(readable.tensor)
    store.mode, store._host_for_kernel = "uva", readable.tensor  # what the CUDA branch of FeatureStore sets
    for inputs, _, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"], ds.features[inputs])
    assert set(launched) == {"gsplit_gather_rows_16"}


# ------------------------------------------------------------------------------------ on a GPU
def _cupy_ready() -> bool:
    return torch.cuda.is_available() and gsplit.ops.cuda.cupy_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cupy_ready(), reason="needs a CUDA GPU and CuPy")
def test_gpu_store_over_a_dataset_folder_starts_fast_and_reads_the_right_rows(tmp_path):
    ds = gsplit.datasets.load("synthetic", num_nodes=200_000, feature_dim=128, seed=0)
    gsplit.datasets.save_folder(ds, tmp_path / "ds")
    folder = gsplit.datasets.load("folder:" + str(tmp_path / "ds"))
    t0 = time.monotonic()
    store = FeatureStore(folder.features, device="cuda", cache_size=0)
    assert time.monotonic() - t0 < 5.0
    assert store.mode == "uva" and store._host_for_kernel.data_ptr() != folder.features.data_ptr()
    ids = torch.randint(0, 200_000, (50_000,))
    assert torch.equal(store.gather(ids.cuda()).cpu(), ds.features[ids])
    pinned = folder.graph.pin_memory()
    assert gsplit.ops.sample_cuda.graph_readable(pinned, torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.gpu
@pytest.mark.skipif(not _cupy_ready(), reason="needs a CUDA GPU and CuPy")
def test_gpu_a_table_registered_in_place_can_still_be_copied_to_the_gpu():
    """On an H100, a --uva graph registered in two pieces failed `graph.to("cuda")` (cudaErrorInvalidValue);
    registered as one range, the whole table and any slice of it copy."""
    monkey = pytest.MonkeyPatch()
    monkey.delenv("GSPLIT_PIN", raising=False)
    try:
        table = torch.randn(12 * MIB)  # 48 MiB: more than the 16 MiB probe
        got = pinning.make_host_readable(table, "host feature table")
        assert got.how == "registered" and got.tensor is table
        assert torch.equal(table.to("cuda").cpu(), table)
        part = table[3 * MIB + 5: 9 * MIB]
        assert torch.equal(part.to("cuda", non_blocking=True).cpu(), part)
    finally:
        monkey.undo()
