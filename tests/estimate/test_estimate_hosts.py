"""``gsplit estimate --hosts``: full-graph training across hosts predicted (gsplit/estimate/hosts.py): the terms move
the right way, the bytes are those a run counts, bad inputs get one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import gsplit
from gsplit.cli import main as cli_main
from gsplit.estimate.hosts import HostModeWork, measure_host_modes, predict_host_mode
from gsplit.estimate.links import INTER_LINKS, get_inter_link, get_link
from gsplit.estimate.model import ModelShape
from gsplit.estimate.profiles import get_device
from gsplit.runtime.io import read_run_log

H100, NVLINK = get_device("h100"), get_link("nvlink4")
SHAPE = ModelShape("sage", 128, 64, 16, 3)


@pytest.fixture(scope="module")
def works():
    graph = gsplit.datasets.load("synthetic", num_nodes=4000, seed=0).graph
    return graph, measure_host_modes(graph, hosts=2, gpus_per_host=4, num_layers=3, external_hops=1,
                                     external_fanout=5)


def test_the_counts_are_the_graphs_maps_and_shares(works):
    graph, w = works
    span, pre, eas = w["span"], w["preload"], w["preload-eas"]
    # span: every vertex and edge once; preload: each host computes its halo again
    assert sum(span.vertices) == graph.num_nodes and sum(span.in_edges) == graph.num_edges
    assert sum(pre.in_edges) > graph.num_edges and sum(pre.vertices) == sum(pre.share_vertices)
    assert sum(pre.halo_vertices) > 0 and sum(span.halo_vertices) == 0
    # nothing of preload crosses hosts; span's rows across hosts are a part of its rows
    assert sum(pre.recv_cross) == sum(pre.sent_cross) == 0
    assert 0 < sum(span.sent_cross) < sum(span.sent_rows) and sum(span.sent_rows) == sum(span.recv_rows)
    # expansion-aware sampling bounds the halo
    assert sum(eas.in_edges) < sum(pre.in_edges) and sum(eas.halo_vertices) <= sum(pre.halo_vertices)


def test_a_slower_network_hurts_span_more_than_preload(works):
    _, w = works
    fast, slow = get_inter_link("ib-ndr"), get_inter_link("eth-25g")
    delta = {m: predict_host_mode(w[m], SHAPE, H100, NVLINK, slow).epoch_s
             - predict_host_mode(w[m], SHAPE, H100, NVLINK, fast).epoch_s for m in ("span", "preload")}
    assert delta["span"] > 0 and delta["preload"] >= 0
    assert delta["span"] > 10 * delta["preload"]  # preload only pays it in the gradient all-reduce
    # more ports per host: span's shuffles across hosts shrink
    one, eight = (predict_host_mode(w["span"], SHAPE, H100, NVLINK, slow, nics=n) for n in (1, 8))
    assert eight.terms["shuffles across hosts"] < one.terms["shuffles across hosts"]


def test_a_bigger_halo_hurts_preload(works):
    _, w = works
    pre = w["preload"]
    big = replace(pre, vertices=[2 * v for v in pre.vertices], in_edges=[2 * e for e in pre.in_edges],
                  recv_rows=[2 * r for r in pre.recv_rows], sent_rows=[2 * s for s in pre.sent_rows])
    link = get_inter_link("ib-hdr")
    small, large = (predict_host_mode(x, SHAPE, H100, NVLINK, link) for x in (pre, big))
    assert large.epoch_s > small.epoch_s and large.memory_per_gpu > small.memory_per_gpu
    assert large.terms["forward"] > small.terms["forward"]
    # and the measured one: the exact halo costs more than the bounded one
    assert predict_host_mode(w["preload-eas"], SHAPE, H100, NVLINK, link).epoch_s < small.epoch_s


def test_terms_add_up_and_the_bytes_follow_the_rows():
    w = HostModeWork("span", 2, 2, vertices=[10] * 4, in_edges=[50] * 4, recv_rows=[4, 4, 4, 4],
                     recv_cross=[1, 2, 3, 0], sent_rows=[4, 4, 4, 4], sent_cross=[2, 2, 1, 1], num_nodes=40,
                     num_edges=200)
    p = predict_host_mode(w, ModelShape("sage", 8, 32, 4, 3), H100, NVLINK, get_inter_link("ib-edr"))
    assert sum(p.terms.values()) == pytest.approx(p.epoch_s)
    shuffles = 2 * 2  # layers 1 and 2, forward and backward, 32 floats a row
    assert p.cross_host_bytes == 6 * shuffles * 32 * 4 and p.inside_host_bytes == 10 * shuffles * 32 * 4


def test_every_inter_link_names_its_source():
    for name, link in INTER_LINKS.items():
        assert link.source and 0 < link.efficiency <= 1 and link.latency_s > 0, name
    assert {l.gbit_s for l in INTER_LINKS.values()} == {25, 32, 100, 200, 400}


TINY = ["--dataset", "synthetic", "-D", "num_nodes=500", "-D", "avg_degree=4", "-D", "feature_dim=8"]


@pytest.mark.parametrize("mode", ["span", pytest.param("preload", marks=pytest.mark.slow)])
def test_the_predicted_bytes_are_what_a_run_counts(tmp_path, mode):
    """2 simulated hosts x 2 CPU ranks: the run log's cross_host_bytes and inside_host_bytes per epoch equal the
    model's, counted on the same graph with the same maps."""
    log = tmp_path / "run.json"
    assert cli_main(["train", *TINY, "--full-graph", "--fanouts", "5,5,5", "--epochs", "1", "--hidden", "16",
                     "--device", "cpu", "--num-ranks", "4", "--ranks-per-host", "2", "--host-mode", mode,
                     "--log", str(log)]) == 0
    epoch = read_run_log(log)["epochs"][0]
    ds = gsplit.datasets.load("synthetic", num_nodes=500, avg_degree=4, feature_dim=8)
    work = measure_host_modes(ds.graph, 2, 2, 3)[mode]
    p = predict_host_mode(work, ModelShape("sage", 8, 16, ds.num_classes, 3), H100, NVLINK, get_inter_link("ib-hdr"))
    assert (p.cross_host_bytes, p.inside_host_bytes) == (epoch["cross_host_bytes"], epoch["inside_host_bytes"])
    assert p.edges_per_layer * 3 == sum(epoch["edges"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["span", "preload"])
def test_the_predicted_bytes_are_what_two_torchrun_nodes_count(tmp_path, mode):
    """Two real torchrun invocations on loopback (``--nnodes 2``, 2 CPU ranks each): the bytes across and inside
    hosts of the run log's epoch are the model's."""
    from test_multihost import torchrun_two_nodes  # tests/launcher/, on the path (conftest)

    torchrun_two_nodes(tmp_path, ["train", *TINY, "--full-graph", "--fanouts", "5,5,5", "--epochs", "1", "--hidden",
                                  "16", "--device", "cpu", "--host-mode", mode, "--log-file",
                                  str(tmp_path / "torchrun.json")])
    got = read_run_log(tmp_path / "torchrun.json")
    assert (got["world_size"], got["hosts"]) == (4, 2)
    epoch = got["epochs"][0]
    ds = gsplit.datasets.load("synthetic", num_nodes=500, avg_degree=4, feature_dim=8)
    p = predict_host_mode(measure_host_modes(ds.graph, 2, 2, 3)[mode], ModelShape("sage", 8, 16, ds.num_classes, 3),
                          H100, NVLINK, get_inter_link("ib-hdr"))
    assert (p.cross_host_bytes, p.inside_host_bytes) == (epoch["cross_host_bytes"], epoch["inside_host_bytes"])
    assert (p.cross_host_bytes > 0) == (mode == "span")


@pytest.mark.parametrize("argv, message", [
    (["--hosts", "1", "--inter-link", "ib-hdr"], "--hosts must be at least 2, got 1"),
    (["--hosts", "2"], "--hosts 2 needs --inter-link"),
    (["--inter-link", "ib-hdr"], "--inter-link is an option of full-graph training across hosts; add --hosts"),
    (["--external-hops", "1"], "--external-hops is an option of full-graph training across hosts"),
    (["--hosts", "2", "--inter-link", "ib-hdr", "--external-hops", "0"], "--external-hops 0; pass at least 1"),
    (["--hosts", "2", "--inter-link", "ib-hdr", "--external-fanout", "0"], "--external-fanout 0; pass at least 1"),
    (["--hosts", "2", "--inter-link", "ib-xdr"], "invalid choice: 'ib-xdr'"),
    (["--hosts", "2", "--inter-link", "eth-25g", "--nics-per-host", "0"], "--nics-per-host must be at least 1"),
    (["--hosts", "2", "--inter-link", "eth-25g", "--layers", "0"], "--layers must be at least 1, got 0"),
    (["--hosts", "2", "--inter-link", "eth-25g", "--dataset", "synthetic", "--partition", "p"],
     "--partition with --hosts"),
])
def test_bad_host_input_is_one_error_line(capsys, argv, message):
    args = ["estimate", "--gpus", "4", *argv] + ([] if "--dataset" in argv else ["--nodes", "2000"])
    rc = cli_main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and message in lines[0], err


def test_gsplit_estimate_hosts_prints_every_mode_and_a_choice(capsys, tmp_path):
    rc = cli_main(["estimate", "--gpus", "2", "--hosts", "2", "--inter-link", "eth-25g", "--nodes", "20000",
                   "--avg-degree", "8", "--feature-dim", "32", "--classes", "5", "--hidden", "32", "--layers", "3",
                   "--sample-nodes", "4000", "--external-hops", "1", "--external-fanout", "10",
                   "--json", str(tmp_path / "h.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    header = next(line for line in out.splitlines() if line.strip().startswith("mode"))
    assert "s/epoch" in header and "across GiB" in header and "GiB/GPU" in header
    rows = {line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in
            ("span", "preload", "preload-eas")}
    assert rows == {"span", "preload", "preload-eas"}
    assert "choose: " in out and "counts scaled by 5" in out and "2 hosts x 2 h100 over nvlink4" in out
    saved = json.loads((tmp_path / "h.json").read_text())
    assert saved["choice"] in ("span", "preload", "either") and saved["scale"] == pytest.approx(5.0)


@pytest.mark.slow
def test_the_predicted_bytes_and_edges_are_host_modes_measured_ones():
    """experiments/results/host_modes.json (2 hosts x 2 CPU ranks, synthetic 50k, SAGE 3 layers, hidden 64):
    every mode's counted bytes across and inside hosts and edges per layer, predicted to the byte."""
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "experiments/results/host_modes.json").read_text())
    settings = doc["settings"]
    ds = gsplit.datasets.load("synthetic", num_nodes=settings["nodes"], seed=settings["seed"])
    works = measure_host_modes(ds.graph, 2, 2, settings["layers"], settings["external_hops"],
                               settings["external_fanout"], seed=settings["seed"])
    shape = ModelShape(settings["model"], ds.feature_dim, settings["hidden"], ds.num_classes, settings["layers"])
    names = {"span": "span (one split group)", "preload": "preload, exact halo",
             "preload-eas": f"preload, m={settings['external_hops']} k={settings['external_fanout']}"}
    for mode, work in works.items():
        p = predict_host_mode(work, shape, H100, NVLINK, get_inter_link("ib-hdr"))
        measured = next(r for r in doc["results"] if r["dataset"] == "synthetic-50k" and r["mode"] == names[mode])
        assert (p.cross_host_bytes, p.inside_host_bytes, p.edges_per_layer) == (
            measured["cross_host_bytes"], measured["inside_host_bytes"], measured["edges_per_layer"]), mode
