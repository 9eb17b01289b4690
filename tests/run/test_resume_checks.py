"""--checkpoint / --resume through the CLI: what a resume accepts, says, refuses, and never deletes.

One rank in this process (fast); one test starts two CPU ranks. Every refusal must be one
``gsplit: error:`` line with exit code 2, before any rank starts.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from gsplit.run.checkpoint import load_checkpoint
from gsplit.cli import main
from gsplit.runtime.io import read_run_log

# 400 vertices, 60 % train = 240 targets, batch 32: 8 iterations per epoch on one rank
BASE = ["train", "--dataset", "synthetic", "-D", "num_nodes=400", "-D", "feature_dim=8", "--fanouts", "3,2",
        "--batch-size", "32", "--hidden", "8", "--device", "cpu", "--eval-every", "0", "--method", "random"]


def run(capsys, *extra, ranks=1):
    rc = main([*BASE, "--num-ranks", str(ranks), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gsplit: error:"), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture()
def saved(tmp_path, capsys):
    """A finished one-epoch run with a checkpoint (the epoch end) in tmp_path/ck."""
    ck = tmp_path / "ck"
    rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck))
    assert rc == 0, err
    return ck


def test_max_iters_saves_and_writes_model_pt(tmp_path, capsys):
    ck = tmp_path / "new" / "ck"  # a folder that does not exist yet
    rc, _, err = run(capsys, "--epochs", "2", "--max-iters", "2", "--checkpoint", str(ck))
    assert rc == 0, err
    assert (ck / "model.pt").is_file()
    c = load_checkpoint(ck)
    assert c.step == 4 and c.counters["epoch"] == 2 and c.counters["iteration"] == 0, c.counters


def test_resume_without_a_complete_checkpoint_starts_afresh(tmp_path, capsys):
    ck = tmp_path / "ck"
    (ck / "step-000000003").mkdir(parents=True)  # the first save was killed: no meta.json, no latest
    (ck / "step-000000003" / "state.pt").write_bytes(b"half")
    rc, out, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck), "--resume")
    assert rc == 0, err
    assert "no complete checkpoint" in out and "starting from the beginning" in out
    assert load_checkpoint(ck).step == 8


@pytest.mark.parametrize("extra,needle", [
    (["--lr", "0.1"], "--lr 0.003 -> 0.1"),
    (["--batch-size", "16"], "--batch-size 32 -> 1 x 16"),
    (["-D", "seed=1"], "another dataset"),
    (["--dropout", "0.1"], "--dropout 0.5 -> 0.1"),
    (["--fanouts", "4,2"], "--fanouts 3,2 -> 4,2"),
    (["--system", "dp"], "--system split -> dp"),
])
def test_a_change_of_the_run_is_refused_in_one_line(saved, capsys, extra, needle):
    rc, out, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume", *extra)
    line = one_line_error(rc, err, needle, "--resume-anyway")
    assert "training" not in out  # refused before any rank started
    assert load_checkpoint(saved).step == 8  # and nothing was written


@pytest.mark.parametrize("extra,needle", [
    (["--hidden", "16"], "--hidden 8 -> 16"),
    (["--model", "gat"], "--model sage -> gat"),
    (["--fanouts", "3,2,2"], "2 layers -> 3"),
    (["-D", "feature_dim=4"], "feature width 8 -> 4"),
])
def test_a_model_that_cannot_load_is_refused_even_with_resume_anyway(saved, capsys, extra, needle):
    rc, _, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume-anyway", *extra)
    one_line_error(rc, err, needle, "cannot be loaded")


def test_resume_anyway_applies_a_new_lr_and_says_so(saved, capsys):
    rc, out, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume-anyway", "--lr", "0.05")
    assert rc == 0, err
    assert "continuing with --lr 0.003 -> 0.05 (applied to the restored optimiser)" in out
    assert load_checkpoint(saved).optimizer["param_groups"][0]["lr"] == 0.05


def test_allowed_changes_are_said(saved, capsys):
    rc, out, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume", "--prefetch")
    assert rc == 0, err
    assert "gsplit: resume: --epochs 1 -> 2" in out
    assert load_checkpoint(saved).step == 16


@pytest.mark.slow
def test_another_world_size_with_the_same_global_batch_is_allowed_and_said(saved, capsys):
    rc, out, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume", "--batch-size", "16",
                       ranks=2)
    assert rc == 0, err
    assert "the same global mini-batch of 32" in out and "another partition map" not in out
    rc, _, err = run(capsys, "--epochs", "3", "--checkpoint", str(saved), "--resume", ranks=2)
    one_line_error(rc, err, "global mini-batch 32 -> 64")


def test_a_damaged_checkpoint_is_one_line_before_any_rank(saved, capsys):
    state = saved / "step-000000008" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2: len(data) // 2 + 8] = b"\xff" * 8  # inside a tensor: torch would load it silently
    state.write_bytes(bytes(data))
    rc, out, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume")
    one_line_error(rc, err, "state.pt is damaged", "sha256")
    assert "training" not in out


def test_a_latest_pointer_to_a_missing_step_deletes_nothing(tmp_path, capsys):
    ck = tmp_path / "ck"
    rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck), "--checkpoint-every", "3")
    assert rc == 0, err
    kept = sorted(p.name for p in ck.glob("step-*"))
    assert kept == ["step-000000003", "step-000000006"]
    (ck / "latest").write_text("step-000000009\n")  # names a folder that is not there
    rc, out, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck), "--resume")
    one_line_error(rc, err, "step-000000009, which does not exist", "echo step-000000006 >")
    assert sorted(p.name for p in ck.glob("step-*")) == kept


def test_a_new_run_into_a_folder_with_a_checkpoint_is_refused(saved, capsys):
    rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(saved))
    one_line_error(rc, err, "already holds a checkpoint", "--resume")
    assert load_checkpoint(saved).step == 8


def test_one_writer_per_folder(tmp_path, capsys):
    from gsplit.run.checkpoint import CheckpointLock

    ck = tmp_path / "ck"
    ck.mkdir()
    with CheckpointLock(ck):  # another run holds it
        rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck))
        one_line_error(rc, err, "in use by another gsplit run")
    rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck))  # released: free again
    assert rc == 0, err


def test_resume_appends_to_the_log_and_logs_the_resumed_epoch_once(tmp_path, capsys):
    ck, log = tmp_path / "ck", tmp_path / "run.jsonl"
    rc, _, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck), "--checkpoint-every", "3", "--log", str(log))
    assert rc == 0, err
    first = log.read_text()
    (ck / "latest").write_text("step-000000003\n")  # as if the run had been killed after step 3
    shutil.rmtree(ck / "step-000000006")
    rc, out, err = run(capsys, "--epochs", "1", "--checkpoint", str(ck), "--resume", "--log", str(log))
    assert rc == 0, err
    text = log.read_text()
    assert text.startswith(first.splitlines()[0] + "\n")  # appended to the run's log, not started afresh
    records = [json.loads(line) for line in text.splitlines()]
    # epoch 0 is trained (and logged) again from iteration 3: the stopped run's record of it and its summary
    # are dropped, so that the epoch is in the log once (a stop after a record but before its checkpoint)
    assert [r["type"] for r in records] == ["run", "run", "epoch", "summary"]
    assert records[1]["resumed_from"]["step"] == 3
    assert records[2]["partial"] is True and records[2]["first_iteration"] == 3 and records[2]["iterations"] == 5
    assert len(read_run_log(log)["epochs"]) == 1


def test_leftovers_of_interrupted_saves_are_removed_at_startup(saved, capsys):
    (saved / ".latest.abc.tmp").write_bytes(b"x")
    (saved / "step-000000008" / ".state.pt.abc.tmp").write_bytes(b"x" * 100)
    (saved / "step-000000009").mkdir()  # a save killed before its meta.json
    rc, _, err = run(capsys, "--epochs", "2", "--checkpoint", str(saved), "--resume")
    assert rc == 0, err
    assert not list(saved.rglob("*.tmp")) and not (saved / "step-000000009").exists()
