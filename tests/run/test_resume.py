"""A run killed mid-epoch and resumed from its checkpoint ends exactly where an uninterrupted run ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gsplit.run.checkpoint import load_checkpoint
from gsplit.runtime.io import read_run_log

ARGS = ["train", "--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "avg_degree=6", "-D", "feature_dim=8",
        "--num-ranks", "2", "--device", "cpu", "--fanouts", "4,3", "--batch-size", "32", "--hidden", "16",
        "--dropout", "0.3", "--method", "random", "--epochs", "12", "--checkpoint-every", "3"]
ITERS_PER_EPOCH = 15  # 900 training targets (60 % of 1500) / (32 x 2), rounded up


def gsplit_train(*extra, wait=True):
    cmd = [sys.executable, "-m", "gsplit.cli", *ARGS, *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


@pytest.mark.slow
def test_kill_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    whole = gsplit_train("--checkpoint", str(tmp_path / "whole"), "--log", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr[-2000:]

    ckdir = tmp_path / "killed"
    proc = gsplit_train("--checkpoint", str(ckdir), wait=False)
    deadline = time.monotonic() + 300
    step = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if (ckdir / "latest").exists():
            step = load_checkpoint(ckdir).step
            # past the first epoch, and early in one: two more checkpoints (every 3 steps) still fall inside
            # it, so a checkpoint written between this read and the kill does not end the epoch (the first GPU
            # run's faster host wrote the epoch's last one in that window)
            if step >= 9 and step % ITERS_PER_EPOCH in (3, 6):
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)  # no clean-up at all; the ranks die with their parent
    proc.wait(timeout=30)
    assert not (ckdir / "model.pt").exists()
    killed_at = load_checkpoint(ckdir).counters
    assert killed_at["iteration"] > 0, killed_at  # mid-epoch: the resume must skip the done iterations

    resumed = gsplit_train("--checkpoint", str(ckdir), "--resume", "--log", str(tmp_path / "resumed.jsonl"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)["state_dict"]  # self-describing file
    got = torch.load(ckdir / "model.pt", weights_only=True)["state_dict"]
    assert want.keys() == got.keys()
    for name in want:  # parameters, and the models' extra state (the dropout step counter)
        same = torch.equal(want[name], got[name]) if torch.is_tensor(want[name]) else want[name] == got[name]
        assert same, f"{name} differs after resuming at {killed_at}"
    # the loss trajectory: every epoch after the one the kill interrupted has the uninterrupted run's loss
    whole_loss = {e["epoch"]: e["loss"] for e in read_run_log(tmp_path / "whole.jsonl")["epochs"]}
    resumed_loss = {e["epoch"]: e["loss"] for e in read_run_log(tmp_path / "resumed.jsonl")["epochs"]}
    later = [e for e in resumed_loss if e > killed_at["epoch"]]
    assert later and all(resumed_loss[e] == whole_loss[e] for e in later), (whole_loss, resumed_loss)
    final = load_checkpoint(ckdir).counters
    assert final["step"] == 12 * ITERS_PER_EPOCH and final["epoch"] == 12, final


def test_resume_without_checkpoint_dir_is_refused():
    from gsplit.cli import main

    assert main(["train", "--resume", "--epochs", "1"]) == 2


# ---------------------------------------------------------------- a stop never loses (or repeats) a log record
TINY = ["train", "--dataset", "synthetic", "-D", "num_nodes=600", "-D", "avg_degree=6", "-D", "feature_dim=8",
        "--num-ranks", "1", "--fanouts", "4,3", "--batch-size", "128", "--hidden", "8", "--device", "cpu",
        "--epochs", "3"]


def _logged_epochs(log: Path) -> list:
    return [rec["epoch"] for rec in map(__import__("json").loads, log.read_text().splitlines())
            if rec.get("type") == "epoch"]


@pytest.mark.parametrize("stop_in", ["evaluate", "save_checkpoint"])
def test_a_stop_between_an_epoch_and_its_checkpoint_loses_no_record(tmp_path, monkeypatch, stop_in):
    """Ctrl-C during epoch 0's evaluation (its last step done), or while its checkpoint is being saved (its
    record written), then --resume: the log holds epochs 0, 1 and 2 exactly once each and reads complete."""
    import gsplit.run.trainer
    from gsplit.cli import main

    real = getattr(gsplit.run.trainer, stop_in)
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 1:  # the first evaluation / save: epoch 0's
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(gsplit.run.trainer, stop_in, interrupted)
    log, ck = tmp_path / "run.jsonl", tmp_path / "ck"
    assert main([*TINY, "--checkpoint", str(ck), "--log", str(log)]) == 130
    assert _logged_epochs(log) == ([] if stop_in == "evaluate" else [0])
    monkeypatch.undo()
    assert main([*TINY, "--checkpoint", str(ck), "--log", str(log), "--resume"]) == 0
    assert _logged_epochs(log) == [0, 1, 2]
    run = read_run_log(log)
    assert run["complete"] is True and [e["epoch"] for e in run["epochs"]] == [0, 1, 2]
    assert all("val_acc" in e for e in run["epochs"])


def test_resuming_a_finished_epoch_keeps_its_record_once(tmp_path):
    """A run stopped after epoch 1's checkpoint resumes at epoch 2: epochs 0 and 1 stay, 2 is added once."""
    from gsplit.cli import main

    log, ck = tmp_path / "run.jsonl", tmp_path / "ck"
    assert main([*TINY, "--epochs", "2", "--checkpoint", str(ck), "--log", str(log)]) == 0
    assert main([*TINY, "--checkpoint", str(ck), "--log", str(log), "--resume"]) == 0
    run = read_run_log(log)
    assert _logged_epochs(log) == [0, 1, 2] and run["complete"] is True
    assert sum(1 for line in log.read_text().splitlines() if '"type": "summary"' in line) == 1
