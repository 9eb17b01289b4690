"""Scaling guards: inputs that cannot fit fail before allocating, prepare's long stages show the time left,
and experiments/scale.py's cost fit (issue 19, items 1 and 5)."""

import sys
from pathlib import Path

import pytest
import torch

import gsplit.runtime.resources as resources
from gsplit import cli, datasets
from gsplit.datasets import synthetic
from gsplit.partitioning import prepare as prepare_mod
from gsplit.partitioning.budget import prepare_peak_bytes
from gsplit.partitioning.prepare import estimated_stage_seconds, prepare_partition
from gsplit.runtime.resources import InsufficientMemoryError, require_memory

GIB = 1 << 30


@pytest.fixture
def little_memory(monkeypatch):
    """The host reports 1 GiB available."""
    monkeypatch.delenv("GSPLIT_SKIP_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(resources, "available_memory", lambda: 1 * GIB)


def test_available_memory_is_positive_and_below_total():
    import psutil

    assert 0 < resources.available_memory() <= psutil.virtual_memory().total


def test_require_memory_names_need_and_availability(little_memory):
    require_memory(GIB // 2, "half a GiB")  # fits
    with pytest.raises(InsufficientMemoryError, match=r"a big table needs about 4.0 GiB .* only 1.0 GiB is available"):
        require_memory(4 * GIB, "a big table")


def test_skip_variable_lets_work_through(little_memory, monkeypatch):
    monkeypatch.setenv("GSPLIT_SKIP_MEMORY_CHECK", "1")
    require_memory(100 * GIB, "anything")


def test_synthetic_estimate_grows_with_edges_and_features():
    base = synthetic.synthetic_peak_bytes(1_000_000, 15, 128)
    # at least the graph (int64 CSC) and the features it returns
    assert base >= (1_000_001 + 15_000_000) * 8 + 1_000_000 * 128 * 4
    assert synthetic.synthetic_peak_bytes(2_000_000, 15, 128) > 1.9 * base - (160 << 20)
    assert synthetic.synthetic_peak_bytes(1_000_000, 30, 128) > base
    assert synthetic.synthetic_peak_bytes(1_000_000, 15, 0) < base


def test_synthetic_too_big_fails_before_generating(little_memory, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("generation started before the memory check")

    monkeypatch.setattr(synthetic, "synthetic_graph", must_not_run)
    with pytest.raises(InsufficientMemoryError, match=r"synthetic dataset of 16,000,000 vertices.* needs about \d+\.\d GiB"):
        synthetic.make_synthetic(num_nodes=16_000_000, feature_dim=128)


def test_synthetic_graph_alone_checked_too(little_memory):
    with pytest.raises(InsufficientMemoryError, match="synthetic graph of 100,000,000 vertices"):
        synthetic.synthetic_graph(100_000_000, 15)


def test_small_synthetic_still_generates(little_memory):
    ds = synthetic.make_synthetic(num_nodes=2000, feature_dim=16)
    assert ds.num_nodes == 2000


def test_prepare_checks_memory_before_presampling(monkeypatch):
    ds = datasets.load("synthetic", num_nodes=3000, avg_degree=10)
    need = prepare_peak_bytes(ds.graph.num_nodes, ds.graph.num_edges)
    monkeypatch.delenv("GSPLIT_SKIP_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(resources, "available_memory", lambda: need - 1)

    def must_not_run(*a, **k):
        raise AssertionError("pre-sampling started before the memory check")

    monkeypatch.setattr(prepare_mod, "presample", must_not_run)
    with pytest.raises(InsufficientMemoryError, match=f"{ds.graph.num_edges:,} edges"):
        prepare_partition(ds, 2, [5, 5], batch_size=64)
    monkeypatch.setattr(resources, "available_memory", lambda: need)  # exactly enough: it runs (and pre-samples)
    with pytest.raises(AssertionError, match="pre-sampling started"):
        prepare_partition(ds, 2, [5, 5], batch_size=64)


def test_cli_prepare_too_big_is_one_error_line_exit_2(little_memory, tmp_path, capsys):
    code = cli.main(["prepare", "--dataset", "synthetic", "-D", "num_nodes=50000000", "-D", "feature_dim=128",
                     "--num-parts", "4", "--out", str(tmp_path / "map")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("gsplit: error: a synthetic dataset of 50,000,000 vertices")
    assert "GiB of host memory" in err[0] and "1.0 GiB is available" in err[0]
    assert not (tmp_path / "map").exists()


def test_stage_seconds_linear_in_edges():
    assert estimated_stage_seconds("partition", 2_000_000) == pytest.approx(2 * estimated_stage_seconds("partition", 1_000_000))
    with pytest.raises(KeyError):
        estimated_stage_seconds("nope", 1)


def test_cli_stage_progress_shows_time_left(capsys):
    progress = cli.prepare._StageProgress(num_edges=100_000_000)  # METIS estimate: well over the 2 s threshold
    progress("partitioning into 4 parts with method gsplit ...")
    assert progress._bar is not None
    assert progress._bar.total == pytest.approx(estimated_stage_seconds("partition", 100_000_000), abs=0.1)
    progress("  partitioning: 1.0s (CPU 1.0s)")  # the stage's end closes its bar
    assert progress._bar is None
    small = cli.prepare._StageProgress(num_edges=1000)  # quick stages get no bar
    small("split statistics on 20 sampled mini-batches ...")
    assert small._bar is None
    out = capsys.readouterr()
    assert "partitioning into 4 parts" in out.out and "  partitioning: 1.0s" in out.out
    assert "about" in out.err and "left" in out.err


def test_cli_prepare_small_runs_with_progress(tmp_path, capsys):
    code = cli.main(["prepare", "--dataset", "synthetic", "-D", "num_nodes=2000", "--num-parts", "2",
                     "--fanouts", "5,5", "--batch-size", "64", "--out", str(tmp_path / "map")])
    assert code == 0
    assert (tmp_path / "map" / "prepare.json").exists()
    assert "partitioning into 2 parts" in capsys.readouterr().out


def _scale_module():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
    try:
        import scale
    finally:
        sys.path.pop(0)
    return scale


def test_scale_fit_recovers_linear_costs():
    scale = _scale_module()
    rows = []
    for n in (1000, 4000, 16000):
        e = 15 * n
        rows.append({"prepare": {"num_nodes": n, "num_edges": e, "process_peak_rss_mb": (100 * n + 50 * e) / (1 << 20),
                                 "stages": {"metis": {"wall_s": 2e-6 * e}, "stats": {"wall_s": 1e-6 * e}}}})
    costs = scale.fit(rows)
    assert costs["s_per_edge"]["metis"] == pytest.approx(2e-6)
    assert costs["s_per_edge"]["stats"] == pytest.approx(1e-6)
    # vertices and edges are collinear at a fixed degree: only their combination per edge is determined
    assert costs["peak_bytes"]["per_edge_all_in"] == pytest.approx(50 + 100 / 15)


def test_scale_stage_meter_records_peak_of_a_stage():
    scale = _scale_module()
    meter = scale.StageMeter()
    meter.start("alloc")
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB touched
    del block
    meter.stop()
    s = meter.stages["alloc"]
    if meter.resettable:
        assert s["peak_rss_mb"] - s["rss_before_mb"] >= 60
    assert s["wall_s"] >= 0
