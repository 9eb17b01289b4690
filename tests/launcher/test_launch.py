"""The launcher: results in rank order, collectives work, failures surface promptly as LaunchError.

Ranks are spawned (or, in this suite by default, forked from a fork server: tests/conftest.py) processes that
unpickle the worker functions by module name, so the workers are top-level functions of this module (pytest
puts tests/ on sys.path, and both start methods pass sys.path on).
"""

import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist

from gsplit.launcher import LaunchError, RankFailure, current_device, launch, spawn, world_size as launched_world_size


# ---------------------------------------------------------------- workers (run inside the ranks)
def allreduce_worker(rank, world_size, base):
    t = torch.tensor([float(base + rank)])
    dist.all_reduce(t)
    return {"rank": rank, "world": world_size, "sum": t.item(), "backend": dist.get_backend(),
            "device": str(current_device()), "env_rank": os.environ["RANK"], "tensor": torch.arange(3) * rank}


def raise_on_rank1_worker(rank, world_size):
    if rank == 1:
        time.sleep(0.5)  # let rank 0 get stuck in the barrier first
        raise ValueError("boom")
    dist.barrier()  # blocks: rank 1 never arrives
    dist.barrier()
    return rank


def exit_on_rank1_worker(rank, world_size):
    if rank == 1:
        os._exit(3)
    dist.barrier()
    return rank


def stubborn_worker(rank, world_size):
    if rank == 1:
        time.sleep(0.5)
        raise ValueError("boom")
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops this rank
    time.sleep(300)  # not in a collective: it never learns that rank 1 failed
    return rank


def start_worker(rank, world_size):
    """How this rank started: its parent process, and a mark the test sets in the launcher's environment."""
    return {"parent": os.getppid(), "mark": os.environ.get("GSPLIT_TEST_MARK")}


def unpicklable_result_worker(rank, world_size):
    return lambda: rank


def listening_addresses_worker(rank, world_size):
    """Local addresses of the sockets listening on the rendezvous port, read from /proc while it is open."""
    port, found = int(os.environ["MASTER_PORT"]), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.rsplit(":", 1)
                if int(hexport, 16) == port and state == "0A":  # 0A: LISTEN
                    found.append((table.rsplit("/", 1)[1], addr))
    return found


def spawn_style_worker(rank, base):
    """torch.multiprocessing.spawn's convention: fn(rank, *args); the world size comes from gsplit."""
    t = torch.tensor([float(base + rank)])
    dist.all_reduce(t)
    return {"rank": rank, "world": launched_world_size(), "sum": t.item()}


def hang_in_teardown_worker(rank, world_size, hang_rank):
    """Return a result, then hang in the process-group teardown with the GIL held, as rank 0 of the DGL port
    did (pybind's dealloc of a gloo group joined a worker thread that waited for the GIL to free a tensor):
    here ``destroy_process_group`` is libc's ``sleep`` called through ``ctypes.PyDLL``, which keeps the GIL,
    so no Python code of the rank (handlers, the heartbeat thread) runs any more."""
    if rank == hang_rank:
        import ctypes

        libc = ctypes.PyDLL(None)

        def destroy_holding_the_gil(*args, **kwargs):
            libc.sleep(3600)

        dist.destroy_process_group = destroy_holding_the_gil
    return {"rank": rank, "returned_at": time.time()}


def destroy_after_collectives_worker(rank, world_size, rounds):
    """Destroy a gloo group right after its collective, ``rounds`` times: under torch 2.2 the destroy (GIL held)
    joined a worker thread that waited for the GIL to free the collective's tensors, in about 1 of 150 rounds."""
    for _ in range(rounds):
        group = dist.new_group([0, 1])
        for _ in range(3):
            t = torch.ones(100_000)
            out = torch.empty_like(t)
            dist.all_to_all_single(out, t, group=group, async_op=True).wait()
            del t, out
        dist.destroy_process_group(group)
    return rounds


def destroy_guard_worker(rank, world_size):
    return getattr(dist.destroy_process_group, "_gsplit_settles", False)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_two_cpu_ranks_allreduce_in_rank_order(start_method):
    out = launch(allreduce_worker, 2, args=(10,), devices="cpu", timeout=300, start_method=start_method)
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["world"] == 2 and o["sum"] == 21.0 and o["backend"] == "gloo" for o in out)
    assert [o["device"] for o in out] == ["cpu", "cpu"]
    assert [o["env_rank"] for o in out] == ["0", "1"]
    assert torch.equal(out[1]["tensor"], torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_failure_in_one_rank_stops_all_promptly(start_method):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(raise_on_rank1_worker, 2, devices="cpu", timeout=300, start_method=start_method)
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"launch took {elapsed:.1f}s to report the failure"
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.rank == 1
    msg = str(err)
    assert "rank 1" in msg and "ValueError: boom" in msg
    assert "raise_on_rank1_worker" in msg  # the child's traceback text is included
    assert err.failures[0].exc_type == "ValueError" and "boom" in err.child_traceback


def test_rank_dying_without_exception_reports_exit_code():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(exit_on_rank1_worker, 2, devices="cpu", timeout=300)
    assert time.monotonic() - start < 60
    err = info.value
    assert err.rank == 1 and err.exitcode == 3
    assert "rank 1" in str(err) and "exited with code 3" in str(err)


def test_rank_that_ignores_sigterm_is_killed():
    start = time.monotonic()
    with pytest.raises(LaunchError, match="boom") as info:
        launch(stubborn_worker, 2, devices="cpu")
    assert time.monotonic() - start < 60
    assert info.value.rank == 1 and len(info.value.failures) == 1


@pytest.mark.parametrize("hang_rank", [0, 1])
def test_a_rank_that_hangs_after_returning_its_result_is_ended_within_seconds(hang_rank, caplog):
    """Fails on the old main: the launcher gave ranks that had delivered their results 30 s to exit."""
    with caplog.at_level("WARNING", logger="gsplit.launch"):
        out = launch(hang_in_teardown_worker, 2, args=(hang_rank,), devices="cpu", timeout=300)
    waited = time.time() - max(o["returned_at"] for o in out)
    assert [o["rank"] for o in out] == [0, 1]  # every result kept
    assert waited < 10, f"the launch returned {waited:.1f}s after the last result"
    assert f"rank {hang_rank} delivered its result but its process-group teardown hung" in caplog.text


def test_ranks_settle_before_a_destroy_of_their_own():
    """User code's destroy_process_group() in a rank first lets gloo's workers free their last tensors."""
    assert launch(destroy_guard_worker, 2, devices="cpu", timeout=300) == [True, True]


@pytest.mark.slow
@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 3),
                    reason="the deadlock is torch 2.2's (the DGL environment's); torch 2.13 did not deadlock in 1000 rounds")
def test_destroying_a_gloo_group_right_after_its_collective_does_not_deadlock():
    """Fails on the old main under torch 2.2.1 (1000 rounds outside gsplit deadlocked twice before round 200;
    with gsplit's settle before the destroy, none in 1000): the real mechanism of the DGL port's hung exit."""
    assert launch(destroy_after_collectives_worker, 2, args=(300,), devices="cpu", timeout=300,
                  heartbeat_timeout=20) == [300, 300]


def test_forked_ranks_come_from_one_server_and_see_the_environment_of_their_launch(monkeypatch):
    """The fork server starts once per launching process, so it holds the environment of its first launch;
    each rank must still see the launcher's environment as it is at the call (the CLI sets variables for its
    ranks, a user's script may too)."""
    first = launch(start_worker, 2, devices="cpu", timeout=300, start_method="forkserver")
    monkeypatch.setenv("GSPLIT_TEST_MARK", "set after the server started")
    second = launch(start_worker, 2, devices="cpu", timeout=300, start_method="forkserver")
    servers = {o["parent"] for o in first + second}
    assert len(servers) == 1 and os.getpid() not in servers, f"ranks' parents {servers}, launcher {os.getpid()}"
    assert [o["mark"] for o in second] == ["set after the server started"] * 2
    spawned = launch(start_worker, 2, devices="cpu", timeout=300, start_method="spawn")
    assert {o["parent"] for o in spawned} == {os.getpid()} and [o["mark"] for o in spawned] == [o["mark"] for o in second]


def test_the_start_method_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.setenv("GSPLIT_START_METHOD", "spawn")
    assert {o["parent"] for o in launch(start_worker, 1, devices="cpu", timeout=300)} == {os.getpid()}
    assert {o["parent"] for o in launch(start_worker, 1, devices="cpu", timeout=300,
                                        start_method="forkserver")} != {os.getpid()}
    monkeypatch.setenv("GSPLIT_START_METHOD", "fork")
    with pytest.raises(ValueError, match=r"GSPLIT_START_METHOD='fork' is not a start method .*'spawn', 'forkserver'"):
        launch(start_worker, 1, devices="cpu")
    with pytest.raises(ValueError, match=r"start_method='threads' is not a start method"):
        launch(start_worker, 1, devices="cpu", start_method="threads")


def test_what_the_fork_server_imports_asks_nothing_of_cuda():
    """Forked GPU ranks work only if the server never initialised CUDA (a driver initialised before fork is
    unusable in the child: "Cannot re-initialize CUDA in forked subprocess"); even is_available() or
    device_count() initialise the driver on a GPU host. No GPU here, so the calls themselves are recorded."""
    import subprocess
    import sys

    from gsplit.launcher.start_method import SERVER_PRELOAD
    modules = ", ".join(m for m in SERVER_PRELOAD if m != "__main__")
    script = f"""if True:
        import torch
        calls = []
        for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device"):
            def record(*a, _name=name, _original=getattr(torch.cuda, name), **k):
                calls.append(_name)
                return _original(*a, **k)
            setattr(torch.cuda, name, record)
        import {modules}
        print(calls, torch.cuda.is_initialized())
    """
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "[] False", out.stdout


def test_unpicklable_result_is_an_error():
    with pytest.raises(LaunchError, match="cannot be pickled"):
        launch(unpicklable_result_worker, 1, devices="cpu")


def test_in_process_mode():
    seen = []
    # A local function is fine here: nothing is spawned or pickled.
    assert launch(lambda r, w, x: seen.append((r, w)) or x * 2, 1, args=(4,), spawn=False) == [8]
    assert seen == [(0, 1)]
    with pytest.raises(ValueError, match="only nprocs=1"):
        launch(allreduce_worker, 2, spawn=False)


def test_argument_errors():
    with pytest.raises(TypeError, match="top-level function"):
        launch(lambda r, w: r, 2, devices="cpu")
    with pytest.raises(ValueError, match="nprocs=0"):
        launch(allreduce_worker, 0)
    with pytest.raises(ValueError, match="devices has 1 entries but nprocs=2"):
        launch(allreduce_worker, 2, devices=["cpu"])
    with pytest.raises(ValueError, match="backend='nccl'"):
        launch(allreduce_worker, 2, backend="nccl", devices="cpu")


def test_helpers():
    assert current_device() == torch.device("cpu")
    f = RankFailure(2, -11, None, "died from SIGSEGV", "", 0.0, False)
    assert pickle.loads(pickle.dumps(f)) == f and f.describe().startswith("rank 2 died")


def test_busy_master_port_is_reported():
    import socket
    with socket.socket() as s:  # occupy the port the launcher must host the rendezvous on
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(RuntimeError, match="cannot host the rendezvous store"):
            launch(allreduce_worker, 2, args=(0,), devices="cpu", master_port=s.getsockname()[1])


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
def test_rendezvous_listens_on_loopback_only():
    found = launch(listening_addresses_worker, 2, devices="cpu")[0]
    assert found == [("tcp", "0100007F")], f"rendezvous listening sockets: {found} (want only 127.0.0.1)"


def test_spawn_calls_fn_as_torch_multiprocessing_spawn_does():
    out = spawn(spawn_style_worker, args=(10,), nprocs=2, devices="cpu", timeout=300)
    assert [o["rank"] for o in out] == [0, 1] and {o["world"] for o in out} == {2}
    assert all(o["sum"] == 21.0 for o in out)


def test_the_wrong_convention_is_refused_before_any_process_starts():
    with pytest.raises(TypeError, match=r"launch calls fn\(rank, world_size, \*args\).*use gsplit.spawn"):
        launch(spawn_style_worker, 2, args=(10, 11), devices="cpu")
    with pytest.raises(TypeError, match=r"spawn calls fn\(rank, \*args\).*use gsplit.launch"):
        spawn(allreduce_worker, args=(), nprocs=2, devices="cpu")
    with pytest.raises(ValueError, match="join=True"):
        spawn(spawn_style_worker, args=(1,), nprocs=2, join=False)


def test_default_devices_on_a_host_with_fewer_gpus_than_ranks(monkeypatch, caplog):
    """The first GPU run: on a one-GPU host ``launch(fn, 2)`` raised, so the suite's CPU tests failed there."""
    from gsplit.launcher.start import _resolve_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with caplog.at_level("WARNING", logger="gsplit.launcher.start"):
        assert _resolve_devices(2, None, None) == [torch.device("cpu")] * 2
    assert "2 ranks but 1 CUDA GPU(s): running CPU ranks over gloo" in caplog.text
    assert _resolve_devices(1, None, None) == [torch.device("cuda", 0)]
    assert _resolve_devices(2, "gloo", None) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="nprocs=2 but 1 GPU"):
        _resolve_devices(2, "nccl", None)
    with pytest.raises(ValueError, match="need one GPU each"):
        _resolve_devices(2, None, "cuda")
