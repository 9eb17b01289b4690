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
