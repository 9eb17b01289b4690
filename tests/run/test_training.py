"""End-to-end training through the harness: real data (Cora) reaches the expected accuracy."""

from pathlib import Path

import pytest
import torch

import gsplit
from gsplit.run.trainer import TrainConfig, train_rank

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def cora():
    path = DATA / "cora.npz"
    if not path.exists():
        pytest.skip(f"real data not found at {path} (it exists in CI and on developer machines only)")
    return gsplit.datasets.load(f"npz:{path}")  # Planetoid-style split: 20 per class, 500 val, 1000 test


def cora_config(batch_size):
    return TrainConfig(model="sage", fanouts=[10, 10], batch_size=batch_size, hidden=64, dropout=0.5, epochs=40,
                       lr=0.01, seed=0, eval_every=40, device="cpu")


@pytest.mark.slow
def test_sage_on_cora_two_ranks_matches_one_rank():
    ds = cora()
    assert ds.train_idx.numel() == 140
    one = train_rank(0, 1, cora_config(batch_size=140), ds, None)
    pmap = gsplit.partition(ds.graph, 2, method="random", seed=0)
    # 70 targets per rank x 2 ranks: the same global mini-batch of 140 as the single rank
    two = gsplit.launch(train_rank, 2, args=(cora_config(batch_size=70), ds, pmap.assignment, None))[0]
    acc1, acc2 = one["epochs"][-1]["test_acc"], two["epochs"][-1]["test_acc"]
    assert acc2 >= 0.75, f"2-rank split training reached only {acc2:.3f} test accuracy on Cora"
    assert abs(acc1 - acc2) <= 0.01, f"1 rank {acc1:.3f} vs 2 ranks {acc2:.3f}"


def test_two_rank_harness_both_systems_learn():
    """A quick 2-rank run of both systems on a tiny synthetic graph: loss falls, the log is complete."""
    ds = gsplit.datasets.load("synthetic", num_nodes=2000, avg_degree=8, feature_dim=16, seed=1)
    pmap = gsplit.partition(ds.graph, 2, method="random", seed=0)
    for system in ("split", "dp"):
        cfg = TrainConfig(model="sage", fanouts=[5, 5], batch_size=100, hidden=32, dropout=0.0, epochs=3, lr=0.01,
                          system=system, device="cpu")
        log = gsplit.launch(train_rank, 2, args=(cfg, ds, pmap.assignment, None))[0]
        losses = [e["loss"] for e in log["epochs"]]
        assert losses[-1] < losses[0], f"{system}: loss did not fall: {losses}"
        assert log["epochs"][-1]["test_acc"] > 0.3, system  # 8 classes: chance is 0.125
        assert len(log["epochs"][0]["ranks"]) == 2
