"""gsplit.run.checkpoint alone: round trip, exact resume of a small training loop, crashes mid-save, pruning."""

import random

import numpy as np
import pytest
import torch

from gsplit.run import checkpoint as ckpt
from gsplit.run.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))


def _step(model, opt, it):
    """One step whose data and dropout masks come from the global generators (what a resume must restore)."""
    x = torch.randn(16, 4) + float(np.random.rand()) + random.random()
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def test_no_checkpoint_yet(tmp_path):
    assert load_checkpoint(tmp_path / "none") is None


def test_resume_continues_exactly(tmp_path):
    torch.manual_seed(1); np.random.seed(1); random.seed(1)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    straight = [_step(model, opt, it) for it in range(10)]
    final = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(1); np.random.seed(1); random.seed(1)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    first = [_step(model, opt, it) for it in range(4)]
    save_checkpoint(tmp_path, model.state_dict(), opt.state_dict(), {"step": 4, "epoch": 0, "iteration": 4},
                    rng=rng_state())
    for _ in range(3):  # what the crashed run did after the save: must not leak into the resume
        _step(model, opt, 0)

    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ck = load_checkpoint(tmp_path)
    model.load_state_dict(ck.model)
    opt.load_state_dict(ck.optimizer)
    set_rng_state(ck.rng)
    assert ck.step == 4 and ck.counters == {"step": 4, "epoch": 0, "iteration": 4}
    rest = [_step(model, opt, it) for it in range(ck.counters["iteration"], 10)]
    assert first + rest == straight  # the loss trajectory, exactly
    for k, v in model.state_dict().items():
        assert torch.equal(v, final[k]), k


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = _model()
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 1})
    for target in ("atomic_write_bytes", "atomic_write_json"):  # dies before the pointer / before meta.json
        def die(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(ckpt, target, die)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path, model.state_dict(), None, {"step": 2})
        monkeypatch.undo()
        ck = load_checkpoint(tmp_path)
        assert ck.step == 1 and ck.counters == {"step": 1}
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 2})  # the interrupted step is written again
    assert load_checkpoint(tmp_path).step == 2


def test_keep_prunes_old_steps_and_stale_future_ones(tmp_path):
    model = _model()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, model.state_dict(), None, {"step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000003", "step-000000004"]
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 3}, keep=2)  # resumed from step 2's timeline
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000003"]
    assert load_checkpoint(tmp_path).step == 3


def test_broken_checkpoints_give_one_line(tmp_path):
    model = _model()
    folder = save_checkpoint(tmp_path, model.state_dict(), None, {"step": 5})
    (folder / "state.pt").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError) as info:
        load_checkpoint(tmp_path)
    assert "state.pt is damaged" in str(info.value) and "\n" not in str(info.value)
    (folder / "meta.json").unlink()
    with pytest.raises(ValueError, match="incomplete checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("../../etc")
    with pytest.raises(ValueError, match="not a step folder name"):
        load_checkpoint(tmp_path)


def test_rng_state_round_trip():
    state = rng_state()
    a = (random.random(), float(np.random.rand()), torch.rand(3))
    set_rng_state(state)
    b = (random.random(), float(np.random.rand()), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_flipped_bytes_inside_a_tensor_are_caught_by_the_checksum(tmp_path):
    model = _model()
    folder = save_checkpoint(tmp_path, model.state_dict(), None, {"step": 1})
    data = bytearray((folder / "state.pt").read_bytes())
    data[len(data) // 2: len(data) // 2 + 8] = b"\x7f" * 8
    (folder / "state.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="state.pt is damaged: its sha256") as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def test_a_pointer_to_a_missing_step_names_the_newest_complete_one(tmp_path):
    model = _model()
    for step in (1, 2):
        save_checkpoint(tmp_path, model.state_dict(), None, {"step": step})
    (tmp_path / "latest").write_text("step-000000005\n")
    with pytest.raises(ValueError, match="step-000000005, which does not exist; point it at the newest complete one "
                                         r"\(step-000000002\)"):
        load_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000001", "step-000000002"]


def test_pruning_counts_only_complete_folders(tmp_path):
    model = _model()
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 1}, keep=2)
    (tmp_path / "step-000000002").mkdir()  # an interrupted save: no meta.json
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 3}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000001", "step-000000003"]


def test_leftovers_are_removed_but_the_named_step_is_kept(tmp_path):
    model = _model()
    folder = save_checkpoint(tmp_path, model.state_dict(), None, {"step": 1})
    (folder / ".state.pt.x1.tmp").write_bytes(b"partial")
    (tmp_path / ".latest.x2.tmp").write_bytes(b"partial")
    (tmp_path / "step-000000002").mkdir()
    assert ckpt.remove_leftovers(tmp_path) == 3
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-000000001"] and load_checkpoint(tmp_path).step == 1
    (folder / ".state.pt.x3.tmp").write_bytes(b"partial")  # a save of the same step cleans its folder too
    save_checkpoint(tmp_path, model.state_dict(), None, {"step": 1})
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_run_record_is_kept_in_meta_json(tmp_path):
    save_checkpoint(tmp_path, _model().state_dict(), None, {"step": 1}, run={"config": {"lr": 0.1}, "world_size": 2})
    ck = load_checkpoint(tmp_path, state=False)
    assert ck.run == {"config": {"lr": 0.1}, "world_size": 2} and ck.model is None


LOCK_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from gsplit.run.checkpoint import CheckpointLock
CheckpointLock({d!r}).acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_the_lock_excludes_a_second_writer_and_dies_with_its_holder(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER.format(root=root, d=str(tmp_path))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"in use by another gsplit run \\(pid {holder.pid} holds"):
            ckpt.CheckpointLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: no clean-up runs; the kernel drops the lock
        holder.wait()
    with ckpt.CheckpointLock(tmp_path):
        pass
