"""Training memory that does not grow with the graph beyond the shared data (issue 19, item 1).

``gsplit train`` with a prepared map read every pre-sampling array (4 B per edge, 32 B per vertex at 3
layers: 740 MB at 8M vertices) into the launcher's private memory before every run, to keep the vertex
weights, which only a feature cache uses; and every rank built the ids of the vertices it owns ([N / ranks]
int64 and an [N] mask) to size a cache of zero rows.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import gsplit
import gsplit.cli as cli
from gsplit.data.feature_store import FeatureStore
from gsplit.partitioning import prepare_partition
from gsplit.partitioning.weights import PresampleWeights


class _Launched(BaseException):
    """Raised by the fake launcher with what the ranks would have got (BaseException: the CLI lets it pass)."""

    def __init__(self, args):
        super().__init__("launched")
        self.args = args


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("rankmem")
    ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=8, seed=1)
    gsplit.datasets.save_folder(ds, root / "ds")
    prepare_partition(gsplit.datasets.load_folder(root / "ds"), 2, [5, 5], 64, out=root / "map", stats_batches=0)
    assert (root / "map" / "edge_weights.npy").exists()
    return root


def _train(monkeypatch, root: Path, *extra):
    """Run ``gsplit train`` up to the launch of its 2 ranks; the files it read and the ranks' arguments."""
    read = []
    real_load = np.load

    def recording_load(file, *a, **k):
        read.append(Path(file).name)
        return real_load(file, *a, **k)

    def fake_launch(fn, n, args=(), **options):
        raise _Launched(args)

    monkeypatch.setattr(np, "load", recording_load)
    monkeypatch.setattr(gsplit, "launch", fake_launch)
    with pytest.raises(_Launched) as launched:
        cli.main(["train", "--dataset", f"folder:{root / 'ds'}", "--partition", str(root / "map"), "--num-ranks", "2",
                  "--fanouts", "5,5", "--batch-size", "64", "--epochs", "1", *extra])
    cfg, ds, owner, report, progress, cache_weights = launched.value.args
    return read, cache_weights


def test_train_without_cache_reads_no_presampling_weights(monkeypatch, prepared):
    read, cache_weights = _train(monkeypatch, prepared)
    assert cache_weights is None
    weights = {"vertex_weights.npy", "edge_weights.npy", "level_vertex_weights.npy", "layer_edge_load.npy"}
    assert not weights & set(read), f"the launcher read {sorted(weights & set(read))} but no cache uses them"
    assert "assignment.npy" in read  # the map itself is read


def test_train_with_cache_reads_only_vertex_weights(monkeypatch, prepared):
    read, cache_weights = _train(monkeypatch, prepared, "--cache-size", "1M")
    assert "vertex_weights.npy" in read
    assert not {"edge_weights.npy", "level_vertex_weights.npy", "layer_edge_load.npy"} & set(read)
    assert torch.equal(cache_weights, PresampleWeights.load(prepared / "map").vertex_weights)


def test_vertex_weights_checked_against_the_graph(prepared):
    other = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=8, seed=2).graph
    with pytest.raises(ValueError, match="fingerprint"):
        PresampleWeights.load_vertex_weights(prepared / "map", other)
    small = gsplit.datasets.load("synthetic", num_nodes=100, avg_degree=8, feature_dim=8, seed=2).graph
    with pytest.raises(ValueError, match="100 vertices"):
        PresampleWeights.load_vertex_weights(prepared / "map", small)


def test_feature_store_without_cache_builds_no_owned_ids(monkeypatch):
    """A rank without a cache holds no [N / ranks] owned ids (nor their [N] mask) for a cache of zero rows."""
    feats = torch.randn(1000, 4)
    owner = (torch.arange(1000) % 2).to(torch.int8)

    real = FeatureStore._owned

    def owned(self, owner, ids=True):
        assert not ids, "built the owned vertex ids for a cache of zero rows"
        return real(self, owner, ids)

    monkeypatch.setattr(FeatureStore, "_owned", owned)
    store = FeatureStore(feats, owner=owner, rank=1)
    assert store.cached_ids.numel() == 0
    assert torch.equal(store.gather(torch.tensor([3, 0])), feats[[3, 0]])
    with pytest.raises(ValueError, match="owner has shape"):  # the owner map is still checked
        FeatureStore(feats, owner=owner[:10], rank=1)
    monkeypatch.undo()
    cached = FeatureStore(feats, owner=owner, rank=1, cache_size=10 * 16, weights=torch.rand(1000))  # owned rows
    assert cached.cached_ids.numel() == 10 and bool((owner[cached.cached_ids] == 1).all())


def test_vertex_weights_refuse_nan(tmp_path, prepared):
    import shutil

    shutil.copytree(prepared / "map", tmp_path / "map")
    bad = np.load(tmp_path / "map" / "vertex_weights.npy")
    bad[3] = np.nan
    np.save(tmp_path / "map" / "vertex_weights.npy", bad)
    with pytest.raises(ValueError, match="vertex_weights.npy holds negative or non-finite weights"):
        PresampleWeights.load_vertex_weights(tmp_path / "map")
