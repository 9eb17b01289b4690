"""``gsplit train --full-graph`` across hosts: one split group spanning every host (``--host-mode span``) and
shared preloading (``--host-mode preload``) train like one process; bad host options get one line.

Hosts are simulated with ``--ranks-per-host`` (consecutive blocks of the ranks gsplit.launch starts) and, in the
slow test, with two real torchrun invocations on loopback, as tests/launcher/test_multihost.py does.
"""

from __future__ import annotations


import pytest

from test_multihost import torchrun_two_nodes  # tests/launcher/, on the path (conftest)

from gsplit.cli import main
from gsplit.runtime.io import read_run_log

TINY = ["--dataset", "synthetic", "-D", "num_nodes=500", "-D", "avg_degree=4", "-D", "feature_dim=8"]
COMMON = ["--full-graph", "--fanouts", "5,5", "--epochs", "2", "--hidden", "16", "--device", "cpu", "--dropout", "0"]


def run(tmp_path, name, *argv):
    log = tmp_path / f"{name}.json"
    assert main(["train", *TINY, *COMMON, *argv, "--log", str(log)]) == 0
    return read_run_log(log)


def same_losses(got, want, what):
    # float32 training: the sums run in another order over other ranks, so equal up to rounding
    for e_got, e_want in zip(got["epochs"], want["epochs"]):
        assert e_got["loss"] == pytest.approx(e_want["loss"], rel=1e-5), what
    assert got["final_test_acc"] == pytest.approx(want["final_test_acc"], abs=1e-9), what


def test_preload_on_two_simulated_hosts_trains_like_one_process(tmp_path):
    one = run(tmp_path, "one", "--num-ranks", "1")
    pre = run(tmp_path, "preload", "--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload")
    assert (pre["world_size"], pre["hosts"], pre["ranks_per_host"]) == (4, 2, 2)
    same_losses(pre, one, "preload, 2 hosts x 2")
    # every layer's shuffle stayed inside a host, and each host computed its halo again (redundant edges)
    epoch = pre["epochs"][0]
    assert epoch["cross_host_bytes"] == 0 and epoch["inside_host_bytes"] == epoch["split_group_bytes"] > 0
    assert sum(one["epochs"][0]["edges"]) < sum(epoch["edges"])


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "span"],
                                  ["--num-ranks", "3", "--ranks-per-host", "1", "--host-mode", "span"],
                                  ["--num-ranks", "3", "--ranks-per-host", "1", "--host-mode", "preload"]],
                         ids=["span-2x2", "span-3x1", "preload-3x1"])
@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_every_host_mode_and_model_trains_like_one_process(tmp_path, argv, model):
    one = run(tmp_path, "one", "--num-ranks", "1", "--model", model, "--heads", "2")
    got = run(tmp_path, "hosts", *argv, "--model", model, "--heads", "2")
    same_losses(got, one, f"{model} {' '.join(argv)}")
    assert got["hosts"] == int(argv[1]) // int(argv[3])
    epoch = got["epochs"][0]
    assert epoch["cross_host_bytes"] + epoch["inside_host_bytes"] == epoch["split_group_bytes"]
    if argv[-1] == "span":  # every layer's shuffle crosses hosts; with one rank per host all of it does
        assert epoch["cross_host_bytes"] > 0
        assert (epoch["inside_host_bytes"] == 0) == (argv[3] == "1")
    else:
        assert epoch["cross_host_bytes"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["span", "preload"])
def test_torchrun_two_nodes_train_the_full_graph_like_one_process(tmp_path, mode):
    """Two torchrun invocations (``--nnodes 2``, 2 CPU ranks each) on loopback run ``gsplit train --full-graph``."""
    outputs = torchrun_two_nodes(tmp_path, ["train", *TINY, *COMMON, "--host-mode", mode,
                                            "--log-file", str(tmp_path / "torchrun.json")])
    assert "2 hosts x 2" in outputs[0]
    got = read_run_log(tmp_path / "torchrun.json")
    assert (got["world_size"], got["hosts"], got["ranks_per_host"]) == (4, 2, 2)
    same_losses(got, run(tmp_path, "one", "--num-ranks", "1"), f"torchrun, {mode}")


def test_co_batches_train_like_one_process_and_are_printed(tmp_path, capsys):
    """Cooperative batching: forced on one host and on two preloading hosts, and chosen from --memory-limit."""
    one = run(tmp_path, "one", "--num-ranks", "1")
    assert "co_batches" not in one["epochs"][0]
    forced = run(tmp_path, "forced", "--num-ranks", "1", "--co-batches", "3")
    hosts = run(tmp_path, "hosts", "--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload",
                "--co-batches", "2")
    auto = run(tmp_path, "auto", "--num-ranks", "2", "--memory-limit", "150K")
    for got, n, what in ((forced, 3, "forced"), (hosts, 2, "2 preloading hosts"), (auto, None, "auto")):
        same_losses(got, one, what)
        assert all(e["co_batches"] == (n or auto["epochs"][0]["co_batches"]) for e in got["epochs"]), what
    assert auto["epochs"][0]["co_batches"] > 1
    out = capsys.readouterr().out
    assert "3 co-batches" in out and "does not fit the 0.1 MiB per rank" in out


def test_co_batches_resume_after_an_epoch_like_an_uninterrupted_run(tmp_path):
    """A checkpoint every step (every epoch: its co-batches are one step), dropout on, resumed for a third epoch;
    all three epochs as the whole graph at once trains them."""
    argv = ["--num-ranks", "1", "--co-batches", "3", "--dropout", "0.3"]
    whole = run(tmp_path, "whole", *argv, "--epochs", "3")
    run(tmp_path, "first", *argv, "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "1")
    resumed = run(tmp_path, "resumed", *argv, "--epochs", "3", "--checkpoint", str(tmp_path / "ck"), "--resume")
    assert [e["epoch"] for e in resumed["epochs"]] == [2]
    assert resumed["epochs"][0]["loss"] == pytest.approx(whole["epochs"][2]["loss"], rel=1e-6)
    # and the co-batches drew the dropout masks of the whole graph's step
    same_losses(whole, run(tmp_path, "plain", "--num-ranks", "1", "--dropout", "0.3", "--epochs", "3"), "dropout")


@pytest.mark.slow
def test_torchrun_two_nodes_train_co_batches_like_one_process(tmp_path):
    """Two torchrun nodes of 2 CPU ranks on loopback, each host its share in 2 co-batches."""
    torchrun_two_nodes(tmp_path, ["train", *TINY, *COMMON, "--host-mode", "preload", "--co-batches", "2",
                                  "--log-file", str(tmp_path / "torchrun.json")])
    got = read_run_log(tmp_path / "torchrun.json")
    assert got["hosts"] == 2 and got["epochs"][0]["co_batches"] == 2
    same_losses(got, run(tmp_path, "one", "--num-ranks", "1"), "torchrun, preload, co-batches")


@pytest.mark.parametrize("argv,msg", [
    (["--num-ranks", "1", "--co-batches", "0"], "--co-batches 0; pass at least 1"),
    (["--num-ranks", "1", "--co-batches", "301"], "--co-batches 301 but the graph has only 300 training vertices"),
    (["--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload", "--co-batches", "200"],
     "trains only"),
    (["--num-ranks", "1", "--memory-limit", "lots"], "--memory-limit"),
    (["--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload", "--external-hops", "0"],
     "--external-hops 0; pass at least 1"),
    (["--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload", "--external-fanout", "0"],
     "--external-fanout 0; pass at least 1"),
    (["--num-ranks", "2", "--host-mode", "preload"], "it was not started by torchrun"),
    (["--num-ranks", "2", "--ranks-per-host", "2", "--host-mode", "preload"], "this job has one"),
    (["--num-ranks", "4", "--ranks-per-host", "2", "--external-hops", "1"], "add it"),
])
def test_bad_host_options_get_one_line(argv, msg, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["train", *TINY, *COMMON, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsplit: error:") and msg in err and err.count("\n") == 1, err


def test_preload_without_full_graph_is_refused(capsys):
    assert main(["train", *TINY, "--device", "cpu", "--host-mode", "preload"]) == 2
    assert "add --full-graph" in capsys.readouterr().err
    assert main(["train", *TINY, "--device", "cpu", "--co-batches", "2"]) == 2
    assert "--co-batches and --memory-limit are full-graph training's; add --full-graph" in capsys.readouterr().err


def test_a_host_map_for_another_host_count_is_refused(tmp_path, capsys):
    assert main(["prepare", *TINY, "--full-graph", "--num-parts", "3", "--out", str(tmp_path / "hosts")]) == 0
    capsys.readouterr()
    argv = ["--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", "preload", "--partition", str(tmp_path / "hosts")]
    assert main(["train", *TINY, *COMMON, *argv]) == 2
    err = capsys.readouterr().err
    assert "holds a map of 3 parts" in err and "--num-parts 2" in err and err.count("\n") == 1, err
