"""Faults: whatever ends the launching process, no rank outlives it, and nothing is left behind.

A parent process (a small script) launches CPU ranks that loop in collectives forever and record their
pids and the rendezvous port; the test then ends the parent (SIGTERM, SIGHUP, SIGKILL, an exception)
and checks within 5 s that every rank is gone and the port is free. Workers are top-level functions of
this module so that spawned ranks can import them (pytest puts tests/ on sys.path).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.distributed as dist

from gsplit.launcher import LaunchError, launch, report_progress

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


# ---------------------------------------------------------------- workers (run inside the ranks)
def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def forever_worker(rank, world_size, outdir):
    out = Path(outdir)
    _write_atomic(out / f"rank{rank}.pid", str(os.getpid()))
    if rank == 0:
        _write_atomic(out / "port", os.environ["MASTER_PORT"])
    t = torch.zeros(1)
    while True:  # hold the gloo connections, as a training loop does
        dist.all_reduce(t)
        time.sleep(0.05)


def hang_worker(rank, world_size, hang_rank, at, seconds):
    """Iterations of an all-reduce; ``hang_rank`` sleeps ``seconds`` inside iteration ``at`` (not in a collective)."""
    t = torch.zeros(1)
    for it in range(8):
        if rank == hang_rank and it == at:
            time.sleep(seconds)
        dist.all_reduce(t)
        report_progress()
    return rank


def slow_everywhere_worker(rank, world_size):
    t = torch.zeros(1)
    for it in range(4):
        if it == 2:
            time.sleep(4)
        dist.all_reduce(t)
        report_progress()
    return rank


def freeze_worker(rank, world_size):
    t = torch.zeros(1)
    for it in range(1000):
        if rank == 1 and it == 3:
            os.kill(os.getpid(), signal.SIGSTOP)  # a frozen process: nothing of it runs any more
        dist.all_reduce(t)
        report_progress()
        time.sleep(0.01)
    return rank


# ---------------------------------------------------------------- helpers
PARENT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from pathlib import Path
    sys.path[:0] = [{root!r}, {tests!r}]  # this worktree's gsplit, and the workers below
    from test_faults import forever_worker
    from gsplit.launcher import launch

    if __name__ == "__main__":
        out, mode = Path(sys.argv[1]), sys.argv[2]
        if mode == "exception":
            def boom(signum, frame):
                raise RuntimeError("parent failed")
            signal.signal(signal.SIGUSR1, boom)
        launch(forever_worker, 2, args=(str(out),), devices="cpu", timeout=300)
""")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return "Z" not in state.split()[1]


def _listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    return True
    return False


def _start_parent(tmp_path: Path, mode: str, start_method: Optional[str] = None):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(ROOT), tests=str(Path(__file__).resolve().parent)))
    err = open(tmp_path / "parent.err", "w")
    env = dict(os.environ, **({"GSPLIT_START_METHOD": start_method} if start_method else {}))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), mode], cwd=ROOT, stderr=err,
                            start_new_session=True, env=env)
    deadline = time.monotonic() + 120
    files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid", tmp_path / "port"]
    while not all(f.exists() for f in files):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"parent did not start its ranks (rc {proc.poll()}): {(tmp_path / 'parent.err').read_text()}")
        time.sleep(0.1)
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
    return proc, pids, int((tmp_path / "port").read_text())


def _cleanup(proc, pids):
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
@pytest.mark.parametrize("how,expect_rc", [("SIGTERM", 128 + signal.SIGTERM), ("SIGHUP", 128 + signal.SIGHUP),
                                           ("SIGKILL", -signal.SIGKILL), ("exception", 1)])
def test_no_rank_outlives_its_parent(tmp_path, how, expect_rc, start_method):
    """Forked ranks' parent is the fork server, which multiprocessing keeps alive while any process it forked
    holds its pipe: before the ranks let go of it, a SIGKILLed launcher left server and ranks running."""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc, pids, port = _start_parent(tmp_path, "exception" if how == "exception" else "plain", start_method)
    try:
        assert all(_alive(p) for p in pids) and _listening(port)
        servers = {_parent_of(p) for p in pids} - {proc.pid}
        assert len(servers) == (start_method == "forkserver"), f"ranks' parents: {servers}, launcher {proc.pid}"
        pids = pids + sorted(servers)  # the fork server must not outlive the launcher either
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGUSR1 if how == "exception" else getattr(signal, how))
        while (any(_alive(p) for p in pids) or _listening(port)) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert not any(_alive(p) for p in pids), f"ranks {pids} still alive {took:.1f}s after {how} to the parent"
        assert not _listening(port), f"rendezvous port {port} still listening {took:.1f}s after {how}"
        rc = proc.wait(10)
        assert rc == expect_rc, (rc, (tmp_path / "parent.err").read_text())
    finally:
        _cleanup(proc, pids)
    err = (tmp_path / "parent.err").read_text()
    assert "leaked" not in err, err  # the resource tracker reports leaked semaphores / shared memory
    if how == "exception":
        assert "parent failed" in err
    ours = [e for e in set(os.listdir("/dev/shm")) - shm_before if any(str(p) in e for p in [proc.pid, *pids])] \
        if shm_before or os.path.isdir("/dev/shm") else []
    assert not ours, f"/dev/shm entries left behind: {ours}"
    with socket.socket() as s:  # the port can be listened on again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


# ---------------------------------------------------------------- hangs
def test_a_hung_rank_is_named_by_the_progress_watchdog():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(hang_worker, 2, args=(1, 3, 300), devices="cpu", timeout=300, progress_timeout=3)
    took = time.monotonic() - start
    assert took < 40, f"the hang was found after {took:.0f}s"
    err = info.value
    assert err.rank == 1, str(err)
    msg = str(err)
    assert "rank 1 made no progress for" in msg and "last at iteration 3" in msg, msg
    assert "rank 0 is waiting in a collective" in msg, msg


def test_a_legitimately_slow_step_is_not_killed():
    # 4 s inside one step on rank 0: its heartbeat keeps beating (1 s limit) and progress stalls < 10 s
    assert launch(hang_worker, 2, args=(0, 2, 4), devices="cpu", timeout=300, progress_timeout=10,
                  heartbeat_timeout=1) == [0, 1]


def test_ranks_that_all_compute_long_are_not_stopped():
    # both ranks spend 4 s in the same step (a long evaluation, say): nobody waits for anybody
    assert launch(slow_everywhere_worker, 2, devices="cpu", timeout=300, progress_timeout=1) == [0, 1]


def test_a_collective_timeout_blames_the_rank_that_hung_not_the_one_waiting():
    # no progress watchdog: gloo's own timeout fires on rank 0, which waited for rank 1
    with pytest.raises(LaunchError) as info:
        launch(hang_worker, 2, args=(1, 2, 300), devices="cpu", timeout=3, progress_timeout=0)
    err = info.value
    assert err.rank == 1, str(err)
    assert "while it was still running (not in a collective; progress last at iteration 2" in str(err), str(err)
    assert err.failures[0].rank == 1 and "hung: rank 0 failed in a collective" in err.failures[0].message
    assert any(f.rank == 0 and f.communication for f in err.failures[1:])


def test_a_frozen_rank_is_found_by_its_heartbeat():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(freeze_worker, 2, devices="cpu", timeout=300, progress_timeout=0, heartbeat_timeout=2)
    assert time.monotonic() - start < 40
    assert info.value.rank == 1 and "stopped responding: no heartbeat" in str(info.value)


def test_timeouts_are_validated():
    with pytest.raises(ValueError, match="timeout must be positive"):
        launch(hang_worker, 2, timeout=0)
    with pytest.raises(ValueError, match="progress_timeout must be positive"):
        launch(hang_worker, 2, progress_timeout=-1)
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        launch(hang_worker, 2, heartbeat_timeout=float("nan"))


# ---------------------------------------------------------------- atomic, verified files
def _small_map(num_parts=2, n=40):
    from gsplit.partitioning.partition_map import PartitionMap
    return PartitionMap.from_tensor(torch.arange(n) % num_parts, num_parts=num_parts)


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path, monkeypatch):
    import numpy as np
    from gsplit.runtime import io
    target = tmp_path / "a.npy"
    io.atomic_save_npy(target, np.arange(5))

    def dying_fsync(fd):
        raise OSError("disk gone")
    monkeypatch.setattr(io.os, "fsync", dying_fsync)
    with pytest.raises(OSError, match="disk gone"):
        io.atomic_save_npy(target, np.arange(100))
    monkeypatch.undo()
    assert np.load(target).tolist() == list(range(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]  # no temporary file left


def test_an_interrupted_map_write_is_detected_not_loaded_as_another_map(tmp_path, monkeypatch):
    from gsplit.runtime import io
    from gsplit.partitioning.partition_map import PartitionMap
    folder = tmp_path / "map"
    _small_map(2).save(folder)

    def die(*a, **k):
        raise KeyboardInterrupt  # the writer dies between assignment.npy and meta.json
    monkeypatch.setattr(io, "atomic_write_json", die)
    with pytest.raises(KeyboardInterrupt):
        _small_map(4).save(folder)
    monkeypatch.undo()
    with pytest.raises(ValueError) as info:
        PartitionMap.load(folder)
    msg = str(info.value)
    assert "incomplete partition map" in msg and "meta.json" in msg and "gsplit prepare" in msg
    assert "\n" not in msg


def test_map_files_are_checked_on_load(tmp_path):
    import json
    from gsplit.partitioning.partition_map import PartitionMap
    folder = tmp_path / "map"
    _small_map(2).save(folder)
    meta = json.loads((folder / "meta.json").read_text())

    del meta["num_parts"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"meta.json lacks the required key 'num_parts'; make the map again"):
        PartitionMap.load(folder)

    _small_map(2).save(folder)
    (folder / "assignment.npy").write_bytes(os.urandom(300))
    with pytest.raises(ValueError) as info:
        PartitionMap.load(folder)
    msg = str(info.value)
    assert str(folder / "assignment.npy") in msg and "not a valid .npy file" in msg and "pickle" not in msg

    _small_map(2).save(folder)
    data = (folder / "assignment.npy").read_bytes()
    (folder / "assignment.npy").write_bytes(data[: len(data) - 10])
    with pytest.raises(ValueError, match="assignment.npy"):
        PartitionMap.load(folder)

    _small_map(4).save(tmp_path / "four")  # a part id beyond the metadata's num_parts
    (folder / "assignment.npy").write_bytes((tmp_path / "four" / "assignment.npy").read_bytes())
    with pytest.raises(ValueError, match="holds part id 3 but .* says num_parts=2"):
        PartitionMap.load(folder)


def test_cli_reports_a_broken_map_in_one_line(tmp_path, capsys):
    import json
    from gsplit.cli import main
    folder = tmp_path / "map"
    _small_map(2, n=300).save(folder)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["num_parts"]
    (folder / "meta.json").write_text(json.dumps(meta))
    rc = main(["stats", "--dataset", "synthetic", "-D", "num_nodes=300", "--partition", str(folder)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gsplit: error:") and "num_parts" in err and len(err.strip().splitlines()) == 1


def test_graph_load_rejects_bad_arrays(tmp_path):
    import numpy as np
    from gsplit.data.graph import Graph
    folder = tmp_path / "g"
    Graph.from_edges([0, 1, 2], [1, 2, 0]).save(folder)
    good = np.load(folder / "indices.npy")

    np.save(folder / "indices.npy", np.array([0, -1, 2]))
    with pytest.raises(ValueError, match=r"indices.npy holds vertex id -1 outside \[0, 3\)"):
        Graph.load(folder)
    with pytest.raises(ValueError, match=r"indices.npy holds vertex id -1 outside \[0, 3\) at entry 1"):
        Graph.load(folder, validate=False)  # never skipped: native code would index with the id

    np.save(folder / "indices.npy", good)
    np.save(folder / "indptr.npy", np.array([0, 2, 1, 3]))
    with pytest.raises(ValueError, match=r"indptr.npy is not non-decreasing: entry 2 \(1\) < entry 1 \(2\)"):
        Graph.load(folder, mmap=False)

    np.save(folder / "indptr.npy", np.array([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"indptr.npy holds dtype float64, expected signed integers"):
        Graph.load(folder)

    (folder / "meta.json").unlink()
    with pytest.raises(ValueError, match="incomplete graph"):
        Graph.load(folder)


def test_presample_weights_round_trip_and_checks(tmp_path):
    import numpy as np
    from gsplit.data.graph import Graph
    from gsplit.partitioning.presample import presample
    from gsplit.partitioning.weights import PresampleWeights
    from gsplit.sampling.neighbor import NeighborSampler
    g = Graph.from_edges(torch.randint(0, 30, (200,)), torch.randint(0, 30, (200,)), 30)
    w = presample(g, torch.arange(10), NeighborSampler([3, 2]), batch_size=5, epochs=1)
    w.save(tmp_path / "w")
    back = PresampleWeights.load(tmp_path / "w")
    for name in ("vertex_weights", "edge_weights", "level_vertex_weights", "layer_edge_load"):
        assert torch.equal(getattr(back, name), getattr(w, name)), name
    assert (back.num_batches, back.fanouts) == (w.num_batches, w.fanouts)
    bad = w.vertex_weights.numpy().copy()
    bad[3] = np.nan
    np.save(tmp_path / "w" / "vertex_weights.npy", bad)
    with pytest.raises(ValueError, match="vertex_weights.npy holds negative or non-finite weights"):
        PresampleWeights.load(tmp_path / "w")


# ---------------------------------------------------------------- the run log
CLI_TINY = ["--dataset", "synthetic", "-D", "num_nodes=600", "-D", "avg_degree=6", "-D", "feature_dim=8",
            "--num-ranks", "1", "--fanouts", "4,3", "--batch-size", "128", "--hidden", "8", "--device", "cpu"]


@pytest.mark.parametrize("where", ["a directory", "an unwritable place"])
def test_a_bad_log_path_fails_before_any_work(tmp_path, capsys, where):
    from gsplit.cli import main
    path = tmp_path if where == "a directory" else Path("/proc/gsplit-cannot-write-here/run.jsonl")
    rc = main(["train", *CLI_TINY, "--log", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("gsplit: error:") and "--log file" in err and len(err.strip().splitlines()) == 1
    assert "loading dataset" not in out  # refused before the dataset was even loaded


def test_the_log_keeps_the_epochs_done_when_a_run_crashes(tmp_path, monkeypatch, capsys):
    import gsplit.run.trainer
    from gsplit.cli import main
    from gsplit.runtime.io import read_run_log
    calls = []
    real = gsplit.run.trainer.evaluate

    def failing_evaluate(*a, **k):
        calls.append(1)
        if len(calls) > 2:  # val and test of epoch 0 pass; epoch 1 crashes
            raise RuntimeError("simulated crash in epoch 1")
        return real(*a, **k)
    monkeypatch.setattr(gsplit.run.trainer, "evaluate", failing_evaluate)
    log = tmp_path / "run.jsonl"
    assert main(["train", *CLI_TINY, "--epochs", "3", "--log", str(log)]) == 1
    assert "simulated crash" in capsys.readouterr().err
    run = read_run_log(log)
    assert run["complete"] is False and [e["epoch"] for e in run["epochs"]] == [0]
    assert run["world_size"] == 1 and run["config"]["epochs"] == 3 and "val_acc" in run["epochs"][0]
    monkeypatch.undo()
    assert main(["train", *CLI_TINY, "--epochs", "2", "--log", str(log)]) == 0  # rewritten, not appended to
    run = read_run_log(log)
    assert run["complete"] is True and [e["epoch"] for e in run["epochs"]] == [0, 1] and run["wall_s"] > 0
    assert len(log.read_text().splitlines()) == 4  # run, 2 epochs, summary


# ---------------------------------------------------------------- no silent coercion in the CLI
@pytest.mark.parametrize("argv,msg", [
    (["train", "--lr", "nan"], "--lr must be a positive finite number, got nan"),
    (["train", "--lr", "-0.1"], "--lr must be"),
    (["train", "--dropout", "1.0"], "--dropout must be in [0, 1)"),
    (["train", "--dropout", "-0.5"], "--dropout must be in [0, 1)"),
    (["train", "--batch-size", "2.5"], "argument --batch-size: invalid int value: '2.5'"),
    (["train", "--batch-size", "-3"], "--batch-size must be positive"),
    (["train", "--hidden", "0"], "--hidden must be positive"),
    (["train", "--heads", "0"], "--heads must be positive"),
    (["train", "--epochs", "-1"], "--epochs must be >= 0"),
    (["train", "--max-iters", "-1"], "--max-iters must be >= 0"),
    (["train", "--seed", "-1"], "--seed must be >= 0"),
    (["train", "--timeout", "0"], "--timeout must be a positive finite number"),
    (["train", "--timeout", "inf"], "--timeout must be a positive finite number"),
    (["train", "--progress-timeout", "-5"], "--progress-timeout must be"),
    (["train", "--fanouts", "5,0"], "each fanout must be >= 1"),
    (["train", "--cache-size", "lots"], "not a size"),
    (["prepare", "--num-parts", "0", "--out", "x"], "--num-parts must be positive"),
    (["prepare", "--num-parts", "2", "--presample-epochs", "0", "--out", "x"], "--presample-epochs must be positive"),
    (["stats", "--partition", "x", "--num-batches", "0"], "--num-batches must be positive"),
    (["bench", "--batches", "0"], "--batches must be positive"),
    (["train", "--no-such-option"], "unrecognized arguments"),
])
def test_numeric_options_are_checked_before_any_work(argv, msg, capsys):
    from gsplit.cli import main
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith("gsplit: error:") and msg in err, err
    assert len(err.strip().splitlines()) == 1 and "loading dataset" not in out


def test_broken_data_files_give_one_line_naming_the_file(tmp_path, capsys):
    import numpy as np
    from gsplit.cli import main
    npz = tmp_path / "g.npz"
    np.savez(npz, adj_data=np.ones(4), adj_indices=np.arange(4), adj_indptr=np.arange(5), adj_shape=np.array([4, 4]))
    npz.write_bytes(npz.read_bytes()[:200])  # truncated download
    edges = tmp_path / "edges.txt"
    edges.write_bytes(b"0 1\n1 2\n\xff\xfe\x00\x81\x9f binary\n")
    for dataset, path in ((f"npz:{npz}", npz), (f"edgelist:{edges}", edges)):
        rc = main(["stats", "--dataset", dataset, "--partition", str(tmp_path / "nomap")])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("gsplit: error:") and str(path) in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_read_run_log_reads_old_single_object_logs_and_cut_lines(tmp_path):
    import json
    from gsplit.runtime.io import read_run_log
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"world_size": 2, "epochs": [{"epoch": 0, "ranks": [{"a": 1}]}]}, indent=1))
    assert read_run_log(old)["epochs"][0]["ranks"] == [{"a": 1}]
    cut = tmp_path / "cut.jsonl"  # a crash in the middle of writing the last line
    cut.write_text('{"type": "run", "world_size": 2}\n{"type": "epoch", "epoch": 0}\n{"type": "epo')
    log = read_run_log(cut)
    assert [e["epoch"] for e in log["epochs"]] == [0] and log["complete"] is False
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "run"}\nnot json\n{"type": "summary"}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_run_log(bad)


def test_train_warns_when_the_map_was_made_for_other_fanouts(tmp_path, capsys):
    from gsplit.cli import main
    parts = tmp_path / "parts"
    tiny = ["--dataset", "synthetic", "-D", "num_nodes=600", "-D", "avg_degree=6", "-D", "feature_dim=8"]
    assert main(["prepare", *tiny, "--num-parts", "2", "--fanouts", "4,3", "--batch-size", "64", "--method", "random",
                 "--out", str(parts)]) == 0
    capsys.readouterr()
    assert main(["train", *tiny, "--num-ranks", "2", "--fanouts", "5,4,3", "--batch-size", "32", "--epochs", "0",
                 "--hidden", "8", "--device", "cpu", "--partition", str(parts)]) == 0
    err = capsys.readouterr().err
    assert "gsplit: warning: partition map" in err and "fanouts [4, 3] (training uses [5, 4, 3])" in err, err
    assert "global batch 128 (training uses 64)" in err, err


# ---------------------------------------------------------------- issue 23: signals in METIS, saves, disks, losses
METIS_SCRIPT = textwrap.dedent("""
    import signal, sys
    import numpy as np
    import scipy.sparse as sp
    sys.path.insert(0, {root!r})
    from gsplit.cli import _stop_on_signal
    from gsplit.partitioning.metis import _load_metis, metis_part_kway
    signal.signal(signal.SIGTERM, _stop_on_signal)  # what `gsplit` installs for its whole run
    _load_metis()
    rng = np.random.default_rng(0)
    n, m = 300_000, 1_500_000
    a = sp.coo_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n)).tocsr()
    a = (a + a.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    vwgt = rng.integers(1, 10, size=(n, 2))
    print("start", flush=True)
    try:
        metis_part_kway(a.indptr, a.indices, 8, vwgt=vwgt)
    except SystemExit as e:
        print("stopped", flush=True)
        raise
    print("finished", flush=True)
""")


def _children(pid: int) -> list:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            out += [int(x) for x in f.read().split()]
    return out


@pytest.mark.slow
def test_sigterm_inside_metis_exits_143_cleanly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", METIS_SCRIPT.format(root=str(ROOT))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        time.sleep(1.0)  # METIS is running now (it takes several seconds on this graph)
        metis = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-2000:])
    assert "stopped" in out and "finished" not in out, out
    assert time.monotonic() - sent < 10
    time.sleep(0.5)
    assert not [p for p in metis if _alive(p)], "the METIS process outlived the run"


def slow_save_worker(rank, world_size, ckdir):
    """Iterations of an all-reduce; rank 0 saves a checkpoint that takes 5 s after the second one."""
    import gsplit.run.trainer as trainer

    real_save = trainer.save_checkpoint

    def slow_save(*args, **kwargs):
        time.sleep(5)
        return real_save(*args, **kwargs)

    trainer.save_checkpoint = slow_save
    cfg = trainer.TrainConfig(checkpoint_dir=ckdir)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    t = torch.zeros(1)
    for it in range(4):
        if rank == 0 and it == 2:
            trainer._save_checkpoint(cfg, model, opt, 0, it, it, run={}, reports=it)
        dist.all_reduce(t)  # the other rank waits here for rank 0's save
        report_progress()
    return rank


def test_a_slow_save_by_rank_0_is_not_reported_as_a_hang(tmp_path):
    assert launch(slow_save_worker, 2, args=(str(tmp_path),), devices="cpu", timeout=300, progress_timeout=2) == [0, 1]
    assert (tmp_path / "latest").exists()


def _in_private_mount(tmp_path: Path, mount: str, script: str, timeout: float = 1200):
    """Run ``script`` (python) with ``mount`` (a mount command for $D) in a private mount namespace (root).

    ``timeout`` bounds the whole script: above the sum of its commands' own timeouts (each set for a busy
    2-core machine, several times what the command takes alone), so a slow command fails as itself."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small or read-only file system")
    d = tmp_path / "mnt"
    d.mkdir()
    (tmp_path / "s.py").write_text(script)
    # GSPLIT_NO_EXTENSIONS: a first-use kernel build killed by a test's timeout would leave the shared
    # build folder locked (torch's FileBaton) for every later process
    shell = (f"{mount.replace('$D', str(d))} && cd {ROOT} && GSPLIT_NO_EXTENSIONS=1 PYTHONPATH={ROOT} "
             f"{sys.executable} {tmp_path / 's.py'} {d}")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=timeout)
    if "Operation not permitted" in proc.stderr and "mount" in proc.stderr:
        pytest.skip(f"mounting refused here: {proc.stderr.strip()[:200]}")
    return proc


FULL_DISK_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from gsplit.runtime.io import append_jsonl
    path = Path(sys.argv[1]) / "run.jsonl"
    n = 0
    try:
        while True:
            append_jsonl(path, {"type": "epoch", "epoch": n, "pad": "x" * 3000})
            n += 1
    except OSError as e:
        print("error", e)
    for i, line in enumerate(path.read_text().splitlines()):
        json.loads(line)  # every line whole
    print("lines", n)
""")


@pytest.mark.slow
def test_a_full_disk_under_the_log_does_not_tear_a_line(tmp_path):
    proc = _in_private_mount(tmp_path, "mount -t tmpfs -o size=20k tmpfs $D", FULL_DISK_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "No space left" in proc.stdout and "lines" in proc.stdout, proc.stdout


READ_ONLY_SCRIPT = textwrap.dedent("""
    import subprocess, sys
    d = sys.argv[1]
    for argv in (["prepare", "-D", "num_nodes=300", "--num-parts", "2", "--out", d + "/map"],
                 ["train", "-D", "num_nodes=300", "--num-ranks", "1", "--epochs", "1", "--checkpoint", d + "/ck"],
                 ["train", "-D", "num_nodes=300", "--num-ranks", "2", "--partition", d + "/map"],
                 ["train", "-D", "num_nodes=300", "--num-ranks", "1", "--log", d + "/run.jsonl"]):
        p = subprocess.run([sys.executable, "-m", "gsplit", *argv], capture_output=True, text=True, timeout=240)
        print(p.returncode, repr(p.stdout), repr(p.stderr))
""")


@pytest.mark.slow
def test_a_read_only_file_system_fails_before_any_work(tmp_path):
    proc = _in_private_mount(tmp_path, "mount -t tmpfs -o ro,size=1m tmpfs $D", READ_ONLY_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4, proc.stdout
    for line in lines:
        rc, out, err = line.split(" ", 2)
        assert rc == "2", line
        assert "loading dataset" not in out, line  # refused before the data were loaded
        assert err.startswith("'gsplit: error:") and "Read-only file system" in err and err.count("\\n") == 1, line


def test_an_exploding_loss_stops_the_run_naming_rank_and_iteration(capsys):
    from gsplit.cli import main

    rc = main(["train", "-D", "num_nodes=400", "-D", "feature_dim=8", "--fanouts", "3,2", "--batch-size", "32",
               "--hidden", "8", "--device", "cpu", "--num-ranks", "1", "--eval-every", "0", "--lr", "1e6",
               "--epochs", "3"])
    err = capsys.readouterr().err
    assert rc == 1
    line = err.split("gsplit: error:", 1)[1].splitlines()[0]
    assert "rank 0: the loss is" in line and "iteration" in line and "lower the learning rate" in line


def test_a_non_finite_loss_stops_train_rank():
    import gsplit
    from gsplit.run.trainer import TrainConfig, train_rank

    ds = gsplit.datasets.load("synthetic", num_nodes=300, feature_dim=8)
    ds.features.fill_(3e38)  # finite, but every layer overflows to inf
    cfg = TrainConfig(fanouts=[-1, -1], batch_size=256, hidden=8, epochs=1, eval_every=0, device="cpu")
    with pytest.raises(FloatingPointError, match=r"rank 0: the loss is (nan|inf) at epoch 0, iteration 0"):
        train_rank(0, 1, cfg, ds, None)


def test_an_empty_training_set_fails_in_train_rank():
    import gsplit
    from gsplit.run.trainer import TrainConfig, train_rank

    ds = gsplit.datasets.load("synthetic", num_nodes=300, feature_dim=8)
    ds.train_idx = ds.train_idx[:0]
    with pytest.raises(ValueError, match="no training vertices"):
        train_rank(0, 1, TrainConfig(fanouts=[2], hidden=8, epochs=1, device="cpu"), ds, None)


FULL_DISK_PREPARE = textwrap.dedent("""
    import subprocess, sys
    p = subprocess.run([sys.executable, "-m", "gsplit", "prepare", "-D", "num_nodes=20000", "--num-parts", "2",
                        "--method", "random", "--fanouts", "3,3", "--batch-size", "64", "--out", sys.argv[1] + "/map"],
                       capture_output=True, text=True, timeout=600)
    print(p.returncode)
    print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
    print("Traceback" in p.stderr)
""")


@pytest.mark.slow
def test_a_disk_that_fills_during_prepare_is_one_line(tmp_path):
    proc = _in_private_mount(tmp_path, "mount -t tmpfs -o size=16k tmpfs $D", FULL_DISK_PREPARE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, last, traceback = proc.stdout.strip().splitlines()
    assert rc == "1" and traceback == "False", proc.stdout
    assert last.startswith("gsplit: error: No space left on device") and "/map" in last, last


FULL_DISK_TRAIN = textwrap.dedent("""
    import subprocess, sys
    p = subprocess.run([sys.executable, "-m", "gsplit", "train", "-D", "num_nodes=3000", "-D", "feature_dim=64",
                        "--hidden", "256", "--num-ranks", "2", "--device", "cpu", "--epochs", "1", "--fanouts", "3,3",
                        "--batch-size", "256", "--eval-every", "0", "--checkpoint", sys.argv[1] + "/ck"],
                       capture_output=True, text=True, timeout=300)
    print(p.returncode)
    print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
    print("Traceback" in p.stderr)
""")


@pytest.mark.slow
def test_a_disk_that_fills_during_train_is_one_line_without_a_rank_traceback(tmp_path):
    """Fails on the old main: torch.save's RuntimeError (`unexpected pos`, raised while handling the OSError)
    came back from rank 0 with its traceback."""
    proc = _in_private_mount(tmp_path, "mount -t tmpfs -o size=64k tmpfs $D", FULL_DISK_TRAIN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rc, last, traceback = proc.stdout.strip().splitlines()
    assert rc == "1" and traceback == "False", proc.stdout
    assert last.startswith("gsplit: error: rank 0: No space left on device") and "/ck/step-" in last, last
