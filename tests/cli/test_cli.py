"""The command line: prepare/stats/train on a tiny synthetic graph, and one-line errors."""

import json

import pytest

from gsplit.cli import main
from gsplit.runtime.io import read_run_log

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


def _one_line(rc, capsys, *needles):
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gsplit: error:"), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_inputs_known_before_the_work_are_one_line(tmp_path, capsys):
    a_file = tmp_path / "f.txt"
    a_file.write_text("hello\n")
    _one_line(main(["train", "-D", "num_nodes=abc"]), capsys, "-D num_nodes=abc", "integer")
    _one_line(main(["train", "--num-ranks", "0"]), capsys, "--num-ranks must be >= 1")
    _one_line(main(["train", "--partition", str(a_file)]), capsys, f"--partition {a_file} is a file")
    _one_line(main(["prepare", "--num-parts", "2", "--out", str(a_file)]), capsys, f"--out {a_file} is a file")
    _one_line(main(["train", "--log", "/proc/version"]), capsys, "/proc/version")
    _one_line(main(["train", "--checkpoint", str(a_file)]), capsys, "is a file, not a folder")
    line = _one_line(main(["train", "--dataset", f"npz:{a_file}"]), capsys, "is not an .npz archive")
    assert "pickle" not in line
    _one_line(main(["train", "-D", "split_fractions=0,0.5,0.5", "-D", "num_nodes=300"]), capsys,
              "no training vertices")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_a_gpu_fails_before_any_work(capsys):
    _one_line(main(["train", "--device", "cuda", "-D", "num_nodes=300"]), capsys, "--device cuda", "not available")


def test_negative_fanouts_and_list_options_parse(tmp_path, capsys):
    rc = main(["train", *TINY, "--num-ranks", "1", "--fanouts", "-1,3", "--batch-size", "256", "--epochs", "1",
               "--max-iters", "1", "--hidden", "8", "--device", "cpu", "--eval-every", "0",
               "-D", "split_fractions=0.5,0.25,0.25"])
    assert rc == 0, capsys.readouterr().err


def test_bad_map_metadata_and_npz_entries_name_the_file(tmp_path, capsys):
    import numpy as np

    out = tmp_path / "map"
    assert main(["prepare", *TINY, "--num-parts", "2", "--fanouts", "3", "--method", "random", "--out", str(out)]) == 0
    capsys.readouterr()
    meta = json.loads((out / "meta.json").read_text())
    meta["fanouts"] = "abc"
    (out / "meta.json").write_text(json.dumps(meta))
    _one_line(main(["stats", *TINY, "--partition", str(out)]), capsys, str(out / "meta.json"), "fanouts='abc'")
    bad = tmp_path / "bad.npz"
    np.savez(bad, adj_data=np.ones(2), adj_indices=np.array([1, 7]), adj_indptr=np.array([0, 1, 2]),
             adj_shape=np.array([2, 2]), labels=np.array([0, 1]))
    _one_line(main(["train", "--dataset", f"npz:{bad}"]), capsys, str(bad), "adj_indices holds 7", "write it again")


def test_deep_model_with_layers_trains_full_graph_and_evaluates_from_model_pt(tmp_path, capsys):
    """gsplit train --model deep-sage --layers N: N layers (no --fanouts for the full graph), model.pt rebuilt by eval."""
    ck = tmp_path / "ck"
    rc = main(["train", *TINY, "--model", "deep-sage", "--layers", "6", "--full-graph", "--num-ranks", "1",
               "--hidden", "16", "--epochs", "2", "--device", "cpu", "--checkpoint", str(ck),
               "--log", str(tmp_path / "log.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "training deep-sage with full" in out
    log = read_run_log(tmp_path / "log.json")
    assert log["config"]["model"] == "deep-sage" and log["config"]["fanouts"] == [-1] * 6
    import torch

    saved = torch.load(ck / "model.pt", weights_only=False)
    assert saved["model"]["name"] == "deep-sage" and saved["model"]["num_layers"] == 6
    assert main(["eval", "--checkpoint", str(ck)]) == 0
    test_line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("test accuracy")][0]
    assert float(test_line.split()[2]) == pytest.approx(log["final_test_acc"], abs=1e-4)


def test_layers_with_one_fanout_repeats_it_and_a_mismatch_is_one_line(tmp_path, capsys):
    log = tmp_path / "log.json"
    assert main(["train", *TINY, "--model", "deep-gcn", "--layers", "4", "--fanouts", "3", "--num-ranks", "1",
                 "--batch-size", "128", "--epochs", "1", "--max-iters", "2", "--hidden", "16", "--device", "cpu",
                 "--eval-every", "0", "--log", str(log)]) == 0
    assert read_run_log(log)["config"]["fanouts"] == [3, 3, 3, 3]
    capsys.readouterr()
    _one_line(main(["train", "--model", "deep-sage", "--layers", "28", "--fanouts", "5,5"]), capsys,
              "--layers 28", "has 2 values")
    _one_line(main(["train", "--model", "deep-sage", "--layers", "28"]), capsys, "--layers 28 needs --fanouts")
