"""The command line: prepare/stats/train on a tiny synthetic graph, and one-line errors."""

import json

import pytest

from gsplit.cli import main
from gsplit.io import read_run_log

TINY = ["--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "avg_degree=8", "-D", "feature_dim=16"]


def test_prepare_then_stats(tmp_path, capsys):
    out = tmp_path / "map"
    rc = main(["prepare", *TINY, "--num-parts", "2", "--fanouts", "5,3", "--batch-size", "64",
               "--presample-epochs", "2", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "prepare.json").read_text())
    assert report["num_parts"] == 2 and len(report["stats"]["cross_edge_fraction"]) == 2
    assert (out / "assignment.npy").exists() and (out / "vertex_weights.npy").exists()
    capsys.readouterr()
    assert main(["stats", *TINY, "--partition", str(out), "--num-batches", "3"]) == 0
    assert "cross-split edges" in capsys.readouterr().out


def test_stats_refuses_a_map_for_another_graph(tmp_path, capsys):
    out = tmp_path / "map"
    assert main(["prepare", *TINY, "--num-parts", "2", "--fanouts", "3", "--batch-size", "64",
                 "--method", "random", "--out", str(out)]) == 0
    capsys.readouterr()
    other = ["--dataset", "synthetic", "-D", "num_nodes=1600", "-D", "avg_degree=8", "-D", "feature_dim=16"]
    assert main(["stats", *other, "--partition", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsplit: error:") and len(err.strip().splitlines()) == 1


def test_train_single_rank_writes_log(tmp_path):
    log = tmp_path / "log.json"
    rc = main(["train", *TINY, "--num-ranks", "1", "--fanouts", "5,3", "--batch-size", "128", "--epochs", "2",
               "--hidden", "16", "--device", "cpu", "--log", str(log)])
    assert rc == 0
    result = read_run_log(log)
    assert len(result["epochs"]) == 2
    first = result["epochs"][0]
    for key in ("loss", "sample_s", "load_s", "train_s", "val_acc", "test_acc", "input_rows", "edges"):
        assert key in first, key


@pytest.mark.parametrize("argv,msg", [
    (["train", "--fanouts", "5,x"], "not a comma-separated list"),
    (["train", "--batch-size", "0"], "--batch-size must be positive"),
    (["train", "--dataset", "nope"], "unknown dataset name"),
    (["prepare", "--dataset", "npz:/nonexistent.npz", "--num-parts", "2", "--out", "x"], "nonexistent"),
    (["stats", "--partition", "/nonexistent-map"], ""),
    (["train", "-D", "num_nodes"], "not key=value"),
])
def test_bad_arguments_give_one_line(argv, msg, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("gsplit: error:") and msg in err
    assert "Traceback" not in err


def test_train_two_ranks_prepares_then_reuses_the_map(tmp_path, capsys):
    """The README's main job in small: 2 CPU ranks, the map prepared on the fly, saved, then reused."""
    parts = tmp_path / "parts"
    argv = ["train", *TINY, "--num-ranks", "2", "--fanouts", "5,3", "--batch-size", "64", "--epochs", "1",
            "--hidden", "16", "--device", "cpu", "--presample-epochs", "1", "--partition", str(parts),
            "--log", str(tmp_path / "log.json")]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "partitioning into 2 parts" in first and (parts / "assignment.npy").exists()
    assert main(argv) == 0
    assert "using partition map" in capsys.readouterr().out
    log = read_run_log(tmp_path / "log.json")
    assert log["world_size"] == 2 and len(log["epochs"][0]["ranks"]) == 2
    assert log["epochs"][0]["traffic_bytes"] > 0  # the ranks really shuffled rows
