"""The CUDA/NCCL communication path, proven on the CPU (issue 18, defects 2, 3, 4, 7, 8, 9).

No GPU here: NCCL groups are fake groups, CUDA events are fake events, CuPy is a fake module, and the
hangs are real 2-rank gloo jobs whose blocking points look like NCCL's (``Work.wait()`` after
``async_op=True``; a collective in flight while the host blocks elsewhere). Workers are top-level
functions so that spawned ranks can import them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

import gsplit
from gsplit.comm import communicator as comm_mod
from gsplit.comm.communicator import Communicator

# gsplit.comm.waits and gsplit.runtime.timing are imported inside the tests that use them, so that every other
# test of this file also runs against code without them (and shows its defect there)
from gsplit.launcher import LaunchError, launch, report_progress

from fake_cuda import FakeEvent

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher's fault tests read /proc")


# ------------------------------------------------------------------------------------------------ defect 2
class _FakeBackend:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name


class _FakeGroup:
    """A process group as torch builds it for a backend string: one backend object per device type."""

    def __init__(self, per_device):
        self.per_device = per_device

    def _get_backend(self, device):
        if device.type not in self.per_device:
            raise RuntimeError(f"No backend type associated with device type {device.type}")
        return _FakeBackend(self.per_device[device.type])


# what torch 2.13 registers and reports for each way of initialising (get_backend is the old test's input)
BACKENDS = {
    "nccl": ({"cuda": "nccl"}, "nccl", "cuda:nccl", True),
    "gloo": ({"cpu": "gloo", "cuda": "gloo"}, "gloo", "cpu:gloo,cuda:gloo", False),
    "cpu:gloo,cuda:nccl": ({"cpu": "gloo", "cuda": "nccl"}, "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", True),
    "bare init_process_group()": ({"cpu": "gloo", "cuda": "nccl"}, "undefined", "cpu:gloo,cuda:nccl", True),
}


def _fake_world(monkeypatch, name_reported, config):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: name_reported)
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: config)


def _cuda_tensor_standin():
    return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))


@pytest.mark.parametrize("how", list(BACKENDS))
def test_cuda_tensors_go_over_nccl_whenever_the_group_serves_cuda_with_nccl(monkeypatch, how):
    per_device, name, config, nccl = BACKENDS[how]
    _fake_world(monkeypatch, name, config)
    comm = Communicator(_FakeGroup(per_device))
    want = torch.device("cuda", 0) if nccl else torch.device("cpu")
    # where a CUDA tensor's collective runs: on its GPU over NCCL, or staged through host memory
    assert comm._collective_device(_cuda_tensor_standin()) == want, how


@pytest.mark.parametrize("how", list(BACKENDS))
def test_without_get_backend_the_backend_configuration_decides(monkeypatch, how):
    per_device, name, config, nccl = BACKENDS[how]
    _fake_world(monkeypatch, name, config)
    group = types.SimpleNamespace()  # a group object of a torch without ProcessGroup._get_backend
    assert comm_mod.serves_cuda_with_nccl(group) is nccl, how


def test_a_real_gloo_group_does_not_serve_cuda_with_nccl(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert not comm_mod.serves_cuda_with_nccl()
        assert not Communicator().nccl_for_cuda
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ defect 3
def _assert_named_by_the_watchdog(err: LaunchError, progress_timeout: float, took: float) -> None:
    """The progress watchdog (not gloo's 25 s timeout, whose message differs) named rank 1, about
    ``progress_timeout`` after its last progress (the launch itself may start slowly on a busy machine)."""
    msg = str(err)
    assert err.rank == 1, msg
    assert "rank 1 made no progress for" in msg and "rank 0 is waiting in a collective" in msg, msg
    stalled_s = int(re.search(r"made no progress for (\d+) s", msg).group(1))
    assert stalled_s <= progress_timeout + 5, f"named {stalled_s} s after the last progress: {msg}"
    assert took < 120, f"named after {took:.0f} s"


def async_wait_worker(rank, world_size, hang_rank, at, seconds):
    """Iterations of an all-reduce waited for with async_op=True + Work.wait(); ``hang_rank`` computes for
    ``seconds`` in iteration ``at`` (outside any collective)."""
    t = torch.zeros(1)
    for it in range(8):
        if rank == hang_rank and it == at:
            time.sleep(seconds)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # the rank waits here, in C++, with no torch.distributed frame on its stack
        report_progress()
    return rank


def in_flight_worker(rank, world_size, hang_rank, at, seconds):
    """As NCCL does: the collective returns at once and the host blocks later on the device (here: polling
    the Work, as a ``.tolist()`` blocks on a stream), not in any torch.distributed call."""
    t = torch.zeros(1)
    for it in range(8):
        if rank == hang_rank and it == at:
            time.sleep(seconds)
        work = dist.all_reduce(t, async_op=True)
        from gsplit.comm import waits

        waits.track_in_flight(work)  # what Communicator does for every NCCL collective
        while not work.is_completed():
            time.sleep(0.01)
        report_progress()
    return rank


@linux_only
@pytest.mark.parametrize("worker", [async_wait_worker, pytest.param(in_flight_worker, marks=pytest.mark.slow)])
def test_a_hang_while_peers_wait_outside_torch_distributed_is_named(worker):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        # gloo's own timeout (25 s) would end it too, without naming the hang: the watchdog must come first
        launch(worker, 2, args=(1, 3, 300), devices="cpu", timeout=25, progress_timeout=2)
    _assert_named_by_the_watchdog(info.value, progress_timeout=2, took=time.monotonic() - start)


def prefetch_hang_worker(rank, world_size, hang_rank, at, seconds):
    """A prefetching loader; ``hang_rank`` computes for ``seconds`` in its training step ``at``. The other
    rank then waits in the prefetch queue while its thread waits in a collective for the hung rank's."""
    import test_loader

    graph, feats, labels = test_loader.small_problem(n=300, num_edges=1500, feat_dim=6, num_classes=4)
    owner = torch.arange(graph.num_nodes) % world_size
    loader = gsplit.DataLoader(graph, torch.arange(240), gsplit.NeighborSampler([3, 3], seed=1), partition=owner,
                               use_ddp=True, batch_size=20, features=feats, labels=labels, prefetch=True)
    for it, _ in enumerate(loader):
        if rank == hang_rank and it == at:
            time.sleep(seconds)
        report_progress()
    return rank


@linux_only
@pytest.mark.slow
def test_a_hang_while_peers_wait_in_the_prefetch_queue_is_named():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(prefetch_hang_worker, 2, args=(1, 2, 300), devices="cpu", timeout=25, progress_timeout=2)
    _assert_named_by_the_watchdog(info.value, progress_timeout=2, took=time.monotonic() - start)


def test_waiting_on_the_prefetch_thread_is_waiting_for_peers_when_that_thread_is():
    """The training thread in Producer.get (queue.get) waits for peers exactly while the prefetch thread does."""
    from gsplit.comm import waits
    from gsplit.minibatch.prefetch import Producer

    in_collective, release = threading.Event(), threading.Event()

    def prepare(epoch, work):
        with waits.waiting_for_peers():  # a collective of the loader's group, waiting for another rank
            in_collective.set()
            release.wait(10)
        return types.SimpleNamespace(it=work[0])

    producer = Producer(prepare, lambda e: [(0, torch.arange(3))], 0, torch.device("cpu"))
    producer.start()
    producer.grant(1)
    consumer_ident = []
    got = []
    consumer = threading.Thread(target=lambda: (consumer_ident.append(threading.get_ident()),
                                                got.append(producer.get())))
    consumer.start()
    assert in_collective.wait(10)
    deadline = time.monotonic() + 10
    while not waits.thread_waits_for_peers(consumer_ident[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waits.thread_waits_for_peers(consumer_ident[0])
    release.set()
    consumer.join(10)
    producer.stop()
    assert got and got[0].it == 0
    assert not waits.thread_waits_for_peers(consumer_ident[0])


def test_a_collective_in_flight_means_waiting_until_it_completes():
    from gsplit.comm import waits

    done = []
    work = types.SimpleNamespace(is_completed=lambda: bool(done))
    waits.track_in_flight(work)
    assert waits.waits_for_peers(threading.get_ident())
    done.append(True)
    assert not waits.waits_for_peers(threading.get_ident())


# ------------------------------------------------------------------------------------------------ defect 4
@pytest.fixture
def fake_cuda_events(monkeypatch):
    from gsplit.runtime import timing

    FakeEvent.log, FakeEvent.gpu_at = [], [0.0]
    monkeypatch.setattr(timing.torch.cuda, "current_stream", lambda device=None: "stream")

    def no_device_sync(*a, **k):
        raise AssertionError("torch.cuda.synchronize called: it waits for every stream of the device")

    monkeypatch.setattr(torch.cuda, "synchronize", no_device_sync)
    return FakeEvent


def test_step_timer_reads_gpu_steps_without_waiting(fake_cuda_events):
    from gsplit.runtime.timing import StepTimer

    timer = StepTimer(torch.device("cuda", 0), event_factory=FakeEvent)
    for k in range(3):
        timer.start()
        time.sleep(0.01)
        timer.stop(k)
        assert timer.ready() == []  # the GPU has not got there: nothing is read, nobody waits
    assert "synchronize" not in FakeEvent.log
    FakeEvent.gpu_at[0] = time.perf_counter()  # the GPU catches up on its own
    ready = timer.ready()
    assert [k for k, _ in ready] == [0, 1, 2] and all(0.009 < s < 1 for _, s in ready)
    timer.start()
    timer.stop(3)
    assert [k for k, _ in timer.finish()] == [3]
    assert FakeEvent.log.count("synchronize") == 1  # the one wait: at the end, on the last end event


def test_training_on_a_gpu_does_not_synchronise_the_device_per_iteration(monkeypatch, fake_cuda_events):
    from gsplit.run import trainer
    from gsplit.runtime.timing import StepTimer

    timers = []

    def gpu_timer(device):  # the CUDA timing path, with fake events, while the math runs on the CPU
        timers.append(StepTimer(torch.device("cuda", 0), event_factory=FakeEvent))
        return timers[-1]

    monkeypatch.setattr(trainer, "StepTimer", gpu_timer)
    ds = gsplit.datasets.load("synthetic", num_nodes=400, avg_degree=4, feature_dim=4, seed=0)
    cfg = trainer.TrainConfig(model="sage", fanouts=[3, 3], batch_size=40, hidden=8, epochs=2, eval_every=0,
                              device="cpu", max_iters=4)
    out = trainer.train_rank(0, 1, cfg, ds, None)
    assert len(timers) == 2  # one per epoch
    assert FakeEvent.log.count("synchronize") == 2  # once per epoch, none per iteration
    for epoch in out["epochs"]:
        per_it = epoch["ranks"][0]["per_iteration"]
        assert len(per_it) == 4 and all(r["train_s"] > 0 for r in per_it)
        assert epoch["train_s"] == pytest.approx(sum(r["train_s"] for r in per_it))


# ------------------------------------------------------------------------------------------------ defect 7
DEVICE_ID = "device_id" in inspect.signature(dist.init_process_group).parameters  # torch >= 2.3


def _recorder(calls):
    """Stands in for dist.init_process_group (same signature) and records its calls."""
    @functools.wraps(dist.init_process_group)
    def init(backend=None, **kw):
        calls.append((backend, kw))
    return init


def test_cuda_ranks_create_their_nccl_communicator_at_init(monkeypatch):
    launch_mod = sys.modules["gsplit.launch"]  # gsplit.launch, the function, shadows the module

    calls = []
    monkeypatch.setattr(dist, "init_process_group", _recorder(calls))
    launch_mod.init_process_group("nccl", torch.device("cuda", 3), rank=3, world_size=8)
    launch_mod.init_process_group("gloo", torch.device("cpu"), rank=0, world_size=2)
    assert calls[0] == ("nccl", {"rank": 3, "world_size": 8, **({"device_id": torch.device("cuda", 3)} if DEVICE_ID else {})})
    assert calls[1] == ("gloo", {"rank": 0, "world_size": 2})


def test_torchrun_ranks_pass_their_gpu_too(monkeypatch):
    from gsplit.launcher import torchrun

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "1")
    for name in torchrun.TORCHRUN_VARIABLES:
        if name != "LOCAL_RANK":
            monkeypatch.setenv(name, "2" if "SIZE" in name else "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", _recorder(calls))
    assert torchrun.init_from_env("auto") == torch.device("cuda", 1)
    assert calls == [("nccl", {"device_id": torch.device("cuda", 1)} if DEVICE_ID else {})]


class _CollectiveSpy:
    """Wraps the torch.distributed collectives: who issued each (thread) and when it ran."""

    def __init__(self, hold_s: float):
        self.hold_s, self.spans, self.lock = hold_s, [], threading.Lock()

    def wrap(self, fn):
        def spied(*args, **kwargs):
            t0 = time.perf_counter()
            time.sleep(self.hold_s)  # a collective that takes a while, so that overlaps are visible
            out = fn(*args, **kwargs)
            if kwargs.get("async_op") and out is not None:
                out.wait()
            with self.lock:
                self.spans.append((threading.current_thread().name, t0, time.perf_counter()))
            return out
        return spied


def overlap_worker(rank, world_size, pretend_nccl):
    """A prefetching loader and a training loop that runs collectives on the training group."""
    import test_loader

    spy = _CollectiveSpy(hold_s=0.004)
    for name in ("all_to_all_single", "all_reduce"):
        setattr(dist, name, spy.wrap(getattr(dist, name)))
    if pretend_nccl:  # the loader's group serves CUDA with NCCL; tensors stay on the CPU (gloo underneath)
        comm_mod.serves_cuda_with_nccl = lambda group=None: True
        Communicator._collective_device = lambda self, t: torch.device("cpu")
    graph, feats, labels = test_loader.small_problem(n=300, num_edges=1500, feat_dim=6, num_classes=4)
    owner = torch.arange(graph.num_nodes) % world_size
    loader = gsplit.DataLoader(graph, torch.arange(200), gsplit.NeighborSampler([3, 3], seed=1), partition=owner,
                               use_ddp=True, batch_size=20, features=feats, labels=labels, prefetch=True)
    flag = loader.sampling_comm.nccl_for_cuda if hasattr(loader.sampling_comm, "nccl_for_cuda") else None
    x = torch.ones(4)
    for _ in loader:  # the "training step": collectives of the training group on this thread
        for _ in range(4):
            loader.comm.all_reduce_(x)
    return {"spans": spy.spans, "flag": flag}


def _overlaps(spans):
    main = [(a, b) for name, a, b in spans if name == "MainThread"]
    side = [(a, b) for name, a, b in spans if name.startswith("gsplit-prefetch")]
    return [(m, s) for m in main for s in side if m[0] < s[1] and s[0] < m[1]]


@linux_only
def test_under_nccl_the_prefetch_thread_never_issues_collectives_while_training_does():
    per_rank = launch(overlap_worker, 2, args=(True,), devices="cpu", timeout=300)
    for r in per_rank:
        assert r["flag"] is True  # the loader saw its group as NCCL
        spans = r["spans"]
        assert any(n.startswith("gsplit-prefetch") for n, _, _ in spans) and any(n == "MainThread" for n, _, _ in spans)
        assert _overlaps(spans) == [], f"{len(_overlaps(spans))} overlapping collectives of the two threads"


# ------------------------------------------------------------------------------------------------ defect 8
def test_final_evaluation_runs_on_the_graph_the_loaders_use(monkeypatch):
    from gsplit.run import systems, trainer

    device_graphs, loader_graphs, eval_graphs = [], [], []

    def rank_graph(graph, device, uva=False):  # what .to(cuda) returns: another Graph object than dataset.graph
        device_graphs.append(gsplit.Graph.from_csc(graph.indptr.clone(), graph.indices.clone()))
        return device_graphs[-1]

    real_make_loader = systems.SplitSystem.make_loader
    real_inference = trainer.layerwise_inference
    monkeypatch.setattr(trainer, "rank_graph", rank_graph)
    monkeypatch.setattr(systems.SplitSystem, "make_loader", lambda self, cfg, ds, graph, *a, **k: (
        loader_graphs.append(graph), real_make_loader(self, cfg, ds, graph, *a, **k))[1])
    monkeypatch.setattr(trainer, "layerwise_inference", lambda model, graph, *a, **k: (
        eval_graphs.append(graph), real_inference(model, graph, *a, **k))[1])
    ds = gsplit.datasets.load("synthetic", num_nodes=300, avg_degree=4, feature_dim=4, seed=0)
    cfg = trainer.TrainConfig(model="sage", fanouts=[3, 3], batch_size=40, hidden=8, epochs=1, device="cpu",
                              max_iters=2)
    out = trainer.train_rank(0, 1, cfg, ds, None)
    assert "final_test_acc" in out
    assert len(device_graphs) == 1 and eval_graphs == device_graphs
    assert all(g is device_graphs[0] for g in loader_graphs) and loader_graphs


class _Exited(Exception):
    pass


def _run_rank_setup(monkeypatch, device: str, world_size: int):
    """Run a launched rank's entry point (gsplit.launcher.start._child_main) in this process, everything that would
    start a process group or end the process replaced by recorders; returns what it asked of torch."""
    from gsplit.launcher import start as launch_mod
    from gsplit.launcher import watch

    asked = {"threads": [], "init": [], "set_device": []}
    monkeypatch.setattr(launch_mod.os, "environ", {k: v for k, v in launch_mod.os.environ.items()
                                                   if k != "OMP_NUM_THREADS"})
    monkeypatch.setattr(launch_mod.os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.setattr(launch_mod, "_die_with_parent", lambda parent_pid, watch: None)
    monkeypatch.setattr(watch, "_WATCH", None)
    monkeypatch.setattr(dist.Work, "wait", dist.Work.wait)  # the rank wraps Work.wait: undo that afterwards
    monkeypatch.setattr(torch, "set_num_threads", asked["threads"].append)
    monkeypatch.setattr(torch.cuda, "set_device", asked["set_device"].append)
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: "store")
    monkeypatch.setattr(dist, "init_process_group", _recorder(asked["init"]))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)

    def exit_(code):
        raise _Exited(code)

    monkeypatch.setattr(launch_mod.os, "_exit", exit_)
    conn = types.SimpleNamespace(send_bytes=lambda b: None, close=lambda: None)
    with pytest.raises(_Exited):
        launch_mod._child_main(0, world_size, _return_rank, (), device, "nccl" if "cuda" in device else "gloo",
                               "127.0.0.1", 1, 60.0, conn, 1, [0.0] * 8,
                               launch_mod.LauncherState.now())
    return asked


def _return_rank(rank, world_size):
    return rank


@pytest.mark.parametrize("device", ["cuda:2", "cpu"])
def test_every_rank_gets_its_share_of_the_cores(monkeypatch, device):
    asked = _run_rank_setup(monkeypatch, device, world_size=8)
    assert asked["threads"] == [4], asked  # 32 cores, 8 ranks: GPU ranks too


@pytest.mark.skipif(not DEVICE_ID, reason="torch < 2.3 has no device_id")
def test_a_gpu_rank_creates_its_nccl_communicator_at_start(monkeypatch):
    asked = _run_rank_setup(monkeypatch, "cuda:2", world_size=8)
    (backend, kw), = asked["init"]
    assert backend == "nccl" and kw.get("device_id") == torch.device("cuda", 2), asked["init"]


def test_the_users_thread_setting_stands(monkeypatch):
    launch_mod = sys.modules["gsplit.launch"]  # gsplit.launch, the function, shadows the module

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    assert launch_mod.limit_threads(8) is None and set_to == []


def test_staging_through_host_memory_copies_no_uninitialised_buffer(monkeypatch):
    _fake_world(monkeypatch, "gloo", "cpu:gloo,cuda:gloo")
    fresh, copied_fresh = set(), []
    real_new_empty, real_empty, real_to = torch.Tensor.new_empty, torch.empty, torch.Tensor.to

    def new_empty(self, *a, **k):
        out = real_new_empty(self, *a, **k)
        fresh.add(out.data_ptr())
        return out

    def empty(*a, **k):
        out = real_empty(*a, **k)
        fresh.add(out.data_ptr())
        return out

    def to(self, *a, **k):
        if self.numel() and self.data_ptr() in fresh:
            copied_fresh.append(tuple(self.shape))
        return real_to(self, *a, **k)

    def all_to_all_single(output, input, out_splits=None, in_splits=None, group=None, async_op=False):
        fresh.discard(output.data_ptr())  # written by the collective from here on
        output.copy_(torch.arange(output.numel(), dtype=output.dtype).reshape(output.shape))
        return types.SimpleNamespace(wait=lambda: None, is_completed=lambda: True) if async_op else None

    monkeypatch.setattr(torch.Tensor, "new_empty", new_empty)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(dist, "all_to_all_single", all_to_all_single)
    comm = Communicator(_FakeGroup({"cpu": "gloo", "cuda": "gloo"}))
    # a device other than the tensor's, as for CUDA tensors over gloo
    monkeypatch.setattr(Communicator, "_collective_device", lambda self, t: torch.device("cpu", 0))
    x = torch.randn(5, 3)
    out = comm.all_to_all_rows(x, [2, 3], [4, 1])
    assert copied_fresh == [], f"uninitialised buffers copied between devices: {copied_fresh}"
    assert torch.equal(out, torch.arange(15, dtype=x.dtype).reshape(5, 3))


# ------------------------------------------------------------------------------------------------ defect 9
class _FakeCupy:
    """The parts of CuPy that gsplit.ops.cuda touches: a per-thread current device, streams, modules."""

    def __init__(self, current: int):
        self.current = [current]
        fake = self

        class Device:
            def __init__(self, index=None):
                self.id = fake.current[-1] if index is None else index

            def __enter__(self):
                fake.current.append(self.id)
                return self

            def __exit__(self, *exc):
                fake.current.pop()

        self.cuda = types.SimpleNamespace(Device=Device, ExternalStream=lambda ptr, device_id=-1: contextlib.nullcontext())


@pytest.fixture
def process_on_gpu0(monkeypatch):
    """A process whose current device is cuda:0 (CuPy and torch agree on it), with a fake CuPy."""
    from gsplit.ops import cuda

    fake = _FakeCupy(current=0)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current[-1])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    cuda._function_on.cache_clear() if hasattr(cuda, "_function_on") else cuda._function.cache_clear()
    yield fake
    cuda._function_on.cache_clear() if hasattr(cuda, "_function_on") else cuda._function.cache_clear()


def test_relabel_for_a_loader_on_cuda1_takes_its_kernel_arguments_on_cuda1(monkeypatch, process_on_gpu0):
    from gsplit.ops import cuda

    real_stream = cuda._torch_stream
    # the tensors are CPU stand-ins; the kernels' device is cuda:1 while the process's current device is 0
    monkeypatch.setattr(cuda, "_torch_stream", lambda device: real_stream(torch.device("cuda", 1)))
    checked_on = []

    def ptr(t):  # _ptr compares a tensor's GPU with torch.cuda.current_device(): record what it compares with
        checked_on.append(torch.cuda.current_device())
        return np.uint64(t.data_ptr() if t.numel() else 0)

    monkeypatch.setattr(cuda, "_ptr", ptr)
    monkeypatch.setattr(cuda, "_launch", lambda module, kernel, threads, args: None)
    cuda._relabel_kernel(torch.tensor([5, 2]), torch.tensor([9, 2, 7, 9]))
    assert checked_on and set(checked_on) == {1}, checked_on


def test_kernels_are_loaded_per_device(monkeypatch, process_on_gpu0):
    from gsplit.ops import cuda

    fake = process_on_gpu0
    monkeypatch.setattr(cuda, "_module", lambda name: types.SimpleNamespace(
        get_function=lambda kernel: (kernel, fake.current[-1])))
    with fake.cuda.Device(1):
        on1 = cuda._function("relabel.cu", "gsplit_relabel_lookup")
    on0 = cuda._function("relabel.cu", "gsplit_relabel_lookup")
    assert on1 == ("gsplit_relabel_lookup", 1) and on0 == ("gsplit_relabel_lookup", 0)


def test_cupy_launches_on_torchs_stream_through_the_stream_protocol_where_cupy_has_it():
    """CuPy 14 deprecates ExternalStream (a DeprecationWarning at every launch, seen on the H100): a CuPy with
    Stream.from_external gets torch's stream object; an older CuPy, or a torch stream without __cuda_stream__
    (torch < 2.8), the raw handle with its device."""
    from gsplit.ops import cuda

    calls = []
    external = lambda ptr, device_id=-1: calls.append(("ExternalStream", ptr, device_id))  # noqa: E731

    class Stream:
        @classmethod
        def from_external(cls, obj):
            calls.append(("from_external", obj))

    class TorchStream:  # what torch >= 2.8 gives: the protocol and the raw handle
        cuda_stream = 1234

        def __cuda_stream__(self):
            return (0, self.cuda_stream)

    new_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream, ExternalStream=external))
    old_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(ExternalStream=external))
    stream = TorchStream()
    cuda._cupy_stream(new_cupy, stream, 1)
    cuda._cupy_stream(old_cupy, stream, 1)
    cuda._cupy_stream(new_cupy, types.SimpleNamespace(cuda_stream=99), 0)  # an old torch's stream
    assert calls == [("from_external", stream), ("ExternalStream", 1234, 1), ("ExternalStream", 99, 0)]
