"""Mixed-precision training: autocast steps, float16's scaler skipping the same steps on every rank, the
precision recorded by checkpoints and a resume at another precision refused."""

from __future__ import annotations

import json

import pytest
import torch

from gsplit.cli import main
from gsplit.comm import Communicator
from gsplit.comm.gradients import allreduce_gradients
from gsplit.launcher import launch
from gsplit.run.amp import MixedPrecision
from gsplit.run.trainer import TrainConfig


def test_a_bad_precision_is_one_clear_error():
    with pytest.raises(ValueError, match="precision 'fp8' is not supported; use one of fp32, bf16, fp16"):
        TrainConfig(precision="fp8")


def test_bf16_runs_the_products_in_bfloat16_and_keeps_float32_weights():
    amp = MixedPrecision("bf16", torch.device("cpu"))
    model = torch.nn.Linear(4, 3)
    with amp.autocast():
        out = model(torch.randn(5, 4))
        loss = out.float().square().mean()
    assert out.dtype == torch.bfloat16 and amp.scaler is None
    amp.backward(loss)
    assert model.weight.grad.dtype == torch.float32


def test_fp16_skips_a_step_with_inf_gradients_and_lowers_the_scale():
    amp = MixedPrecision("fp16", torch.device("cpu"))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scale = amp.scale
    with amp.autocast():
        loss = model(torch.full((2, 4), 6e4)).float().sum()  # float16 products overflow to inf
    amp.backward(loss)
    amp.step(opt)
    assert amp.settle() == 1 and amp.scale == scale / 2
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # the step was skipped
    opt.zero_grad()
    with amp.autocast():
        loss = model(torch.full((2, 4), 1e-3)).float().mean()  # scaled gradients at most 32768 / 2: finite
    amp.backward(loss)
    amp.step(opt)
    assert amp.settle() == 1 and not torch.equal(before[0], model.weight)  # this one was taken


def skip_worker(rank, world_size):
    """Rank 1 alone meets an inf gradient: after the all-reduce every rank sees it and skips the step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16", torch.device("cpu"))
    comm = Communicator()
    params = []
    for step in range(3):
        opt.zero_grad()
        with amp.autocast():
            x = torch.full((3, 4), 6e4 if (rank == 1 and step == 1) else 1e-3 * (1 + rank))
            loss = model(x).float().mean()  # scaled gradients within float16 except where x overflows
        amp.backward(loss)
        allreduce_gradients(model, comm)
        amp.step(opt)
        params.append([p.detach().clone() for p in model.parameters()])
    return {"skipped": amp.settle(), "scale": amp.scale, "params": params}


def test_fp16_ranks_skip_the_same_steps():
    per_rank = launch(skip_worker, 2)
    assert [r["skipped"] for r in per_rank] == [1, 1]
    assert per_rank[0]["scale"] == per_rank[1]["scale"]
    for step in range(3):
        for a, b in zip(per_rank[0]["params"][step], per_rank[1]["params"][step]):
            assert torch.equal(a, b), f"the ranks' models parted at step {step}"
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0]["params"][0], per_rank[0]["params"][1]))  # skipped


def _train(tmp_path, *extra):
    return main(["train", "-D", "num_nodes=600", "--fanouts", "4,4", "--batch-size", "64", "--epochs", "1",
                 "--num-ranks", "1", "--device", "cpu", "--checkpoint", str(tmp_path / "ck"),
                 "--log", str(tmp_path / "run.jsonl"), *extra])


def test_cli_fp16_logs_its_skipped_steps_and_a_resume_at_another_precision_is_refused(tmp_path, capsys):
    assert _train(tmp_path, "--precision", "fp16") == 0
    epochs = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()
              if '"epoch"' in line and '"loss_scale"' in line]
    assert epochs and epochs[-1]["loss_scale"] > 0 and epochs[-1]["skipped_steps"] >= 0
    capsys.readouterr()
    assert _train(tmp_path, "--resume", "--epochs", "2", "--precision", "bf16") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision fp16 -> bf16" in err[0], err
    assert _train(tmp_path, "--resume", "--epochs", "2", "--precision", "fp16") == 0  # the same one continues


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_warning_says_what_half_precision_costs_there(precision, monkeypatch, caplog):
    """Without native half-precision products the CPU warning names the slower path and autocast's added memory
    (it once said the memory saving stays, which holds only for half-precision features)."""
    from gsplit.run import amp

    monkeypatch.setattr(amp, "native_half_products", lambda dtype: False)
    with caplog.at_level("WARNING", logger="gsplit.run.amp"):
        MixedPrecision(precision, torch.device("cpu"))
    text = caplog.text
    assert f"--precision {precision} on a CPU without" in text and "add memory" in text and "--feature-dtype" in text
    caplog.clear()
    MixedPrecision("fp32", torch.device("cpu"))
    assert "on a CPU without" not in caplog.text
