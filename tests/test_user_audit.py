"""What a new user and a fault audit still hit (issue 31): mistakes said before any work, damaged or
inconsistent files refused in one line, a full disk in one line, messages that say what to pass.

Each test says what the old main did instead.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.cli import main

DATA = ["--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "feature_dim=8", "-D", "num_classes=4"]


def _data():
    return gsplit.datasets.load("synthetic", num_nodes=1500, feature_dim=8, num_classes=4)


@pytest.fixture
def builds(monkeypatch):
    """The CLI's kernel preparations (recorded, not run)."""
    import gsplit.cli as cli

    calls = []
    monkeypatch.setattr(cli, "_prepare_kernels", lambda: calls.append("built"))
    return calls


# ---------------------------------------------------------------- finding 2: no build before the checks
def test_argument_mistakes_are_said_before_any_kernel_build(tmp_path, builds, capsys):
    """Fails on the old main: prepare built the kernels (22-27 s on a fresh environment) before it read
    --fanouts, train before it checked the --partition map, eval before it compared model and dataset."""
    from gsplit.model_io import save_model
    from gsplit.nn.models import build_model

    assert main(["prepare", *DATA, "--num-parts", "2", "--fanouts", "4,x", "--out", str(tmp_path / "p")]) == 2
    assert "4,x" in capsys.readouterr().err
    gsplit.partition(_data().graph, 3, method="random").save(tmp_path / "map3")
    assert main(["train", *DATA, "--num-ranks", "2", "--device", "cpu", "--partition", str(tmp_path / "map3")]) == 2
    assert "3 parts but the world size is 2" in capsys.readouterr().err
    spec = dict(name="sage", in_feats=5, hidden=8, num_classes=4, num_layers=2, dropout=0.0, heads=1)
    save_model(tmp_path / "model.pt", build_model(**spec), spec)
    assert main(["eval", "--checkpoint", str(tmp_path / "model.pt"), *DATA]) == 2
    assert "takes 5 input features" in capsys.readouterr().err
    assert builds == []
