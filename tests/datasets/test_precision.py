"""Half-precision features: stored, memory-mapped, cached, gathered and counted in bfloat16/float16."""

from __future__ import annotations

import json

import pytest
import torch

import gsplit
from gsplit.cli import main
from gsplit.data.feature_store import FeatureStore
from gsplit.data.precision import cast_features, check_range, feature_dtype, model_input
from gsplit.datasets.folder import cast_folder_features, load_folder, save_folder
from gsplit.fullgraph.loader import estimate_memory
from gsplit.partitioning.stats import full_graph_stats


@pytest.fixture(scope="module")
def ds():
    return gsplit.datasets.load("synthetic", num_nodes=1500, seed=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cast_rounds_each_value_to_nearest_and_upcast_is_exact(ds, dtype):
    half = cast_features(ds.features, dtype)
    assert half.dtype == dtype and torch.equal(half, ds.features.to(dtype))
    up = model_input(half, [torch.nn.Linear(ds.feature_dim, 2)])
    assert up.dtype == torch.float32 and torch.equal(up.to(dtype), half)  # no value changed by the upcast
    # each value within half an ulp of the float32 one: relative 2^-8 (bf16: 8 significant bits), 2^-11 (fp16: 11)
    rel = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    assert bool(((up - ds.features).abs() <= rel * ds.features.abs() + 1e-7).all())


def test_bad_dtype_and_float16_overflow_are_one_clear_error():
    with pytest.raises(ValueError, match="feature dtype 'int8' is not supported; use one of float32, bfloat16"):
        feature_dtype("int8")
    x = torch.zeros(5, 3)
    x[3, 1] = -7e4
    with pytest.raises(ValueError, match=r"features row 3 holds -70000.0, beyond float16's range \(65504\)"):
        cast_features(x, "float16")
    check_range(x, "bfloat16")  # bfloat16 has float32's range
    assert torch.isfinite(cast_features(x, "bfloat16")).all()


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_folder_stores_half_features_memory_mapped(ds, tmp_path, name):
    half = gsplit.datasets.load("synthetic", num_nodes=1500, seed=0, feature_dtype=name)
    assert half.meta["load"]["options"]["feature_dtype"] == name  # how to load it again
    d = save_folder(half, tmp_path / "ds")
    assert json.loads((d / "meta.json").read_text())["feature_dtype"] == name
    f32 = save_folder(ds, tmp_path / "f32")
    # half the bytes on disk (and in the page cache): 2 per value, plus the same .npy header
    assert (d / "features.npy").stat().st_size - 128 == ((f32 / "features.npy").stat().st_size - 128) // 2
    back = load_folder(d)
    assert back.features.dtype == half.features.dtype and torch.equal(back.features, half.features)
    # mapped, not read: the tensor's storage is the file's map, and a same-dtype load keeps it (pickles as a path)
    same = gsplit.datasets.load(f"folder:{d}", feature_dtype=name)
    assert same._folder_source.matches(same)


def test_chunked_folders_are_rewritten_in_the_dtype(ds, tmp_path):
    d = save_folder(ds, tmp_path / "ds")
    cast_folder_features(d, "float16")
    back = load_folder(d)  # the stamp was renewed: no "not as written" rescan, and the values are fp16's
    assert back.features.dtype == torch.float16 and torch.equal(back.features, ds.features.half())


def test_a_folder_whose_file_disagrees_with_its_meta_is_refused(ds, tmp_path):
    d = save_folder(ds, tmp_path / "ds")
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "feature_dtype": "bfloat16"}))
    with pytest.raises(ValueError, match=r"features.npy holds float32 of width 64; meta.json's feature_dtype bfloat16 .*expect uint16"):
        load_folder(d)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_feature_store_caches_and_gathers_half_rows(ds, dtype):
    feats = ds.features.to(dtype)
    owner = torch.arange(ds.num_nodes) % 2
    store = FeatureStore(feats, cache_size=200 * ds.feature_dim * 2, owner=owner, rank=0, graph=ds.graph)
    assert store.row_bytes == ds.feature_dim * 2 and store.cached_ids.numel() == 200  # twice the rows per byte
    ids = torch.randperm(ds.num_nodes)[:300]
    out = store.gather(ids)
    assert out.dtype == dtype and torch.equal(out, feats[ids])
    assert store.counts.host_bytes == store.counts.misses * ds.feature_dim * 2


def test_memory_estimates_count_the_feature_dtype():
    g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
    s = full_graph_stats(g, torch.tensor([0, 0, 1, 1]), 2)
    f32 = estimate_memory(s, 0, feat_dim=16, dims=[(16, 8, 1)])
    bf16 = estimate_memory(s, 0, feat_dim=16, dims=[(16, 8, 1)], feature_bytes=2)
    assert bf16.features * 2 == f32.features
    # the first layer's float32 copy of the rows is kept for backward: the activations grow by it
    assert bf16.activations - f32.activations == 4 * 16 * 4
    from gsplit.estimate.model import ModelShape
    from gsplit.estimate.setting import memory_per_gpu
    from gsplit.estimate.work import IterationWork, LayerWork
    w = IterationWork("dp", 1, [LayerWork([10], [2], [5], [0], [0])], input_rows=[5], targets=[2])
    full = memory_per_gpu([w], ModelShape("sage", 4, 4, 2, 1), graph_bytes=0)
    half = memory_per_gpu([w], ModelShape("sage", 4, 4, 2, 1, feature_bytes=2), graph_bytes=0)
    assert (full.features, half.features) == (80, 40)


def test_cli_refuses_a_bad_dtype_and_a_float16_overflow_in_one_line(tmp_path, capsys):
    assert main(["prepare", "--num-parts", "2", "--out", str(tmp_path / "m"), "--feature-dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "int8" in err and "invalid choice" in err and len(err.splitlines()) == 1
    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
    ds.features[7, 2] = 1e6
    save_folder(ds, tmp_path / "big")
    code = main(["prepare", "--dataset", f"folder:{tmp_path / 'big'}", "--num-parts", "2", "--out",
                 str(tmp_path / "m"), "--dataset-out", str(tmp_path / "out"), "--feature-dtype", "float16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "features row 7 holds 1000000.0, beyond float16's range" in err[0]


def test_cli_refuses_a_float16_folder_holding_inf_at_prepare_time_in_one_line(tmp_path, capsys):
    """A float16 folder whose values overflowed before gsplit saw it (written by another tool, or edited after
    gsplit wrote it, its meta.json still saying finite): prepare names the file and the row, in one line."""
    import numpy as np

    small = gsplit.datasets.load("synthetic", num_nodes=300, seed=0, feature_dtype="float16")
    folder = save_folder(small, tmp_path / "f16")
    table = np.load(folder / "features.npy", mmap_mode="r+")
    assert table.dtype == np.float16
    with np.errstate(over="ignore"):
        table[7, 2] = np.float16(60000) * np.float16(2)  # float16 arithmetic overflows to inf
    table.flush()
    del table
    code = main(["prepare", "--dataset", f"folder:{folder}", "--num-parts", "2", "--method", "random",
                 "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "features.npy: features row 7 contains NaN or inf" in err[0]


@pytest.mark.parametrize("flag, value", [("--feature-dtype", "int8"), ("--precision", "fp8")])
def test_cli_train_refuses_a_bad_dtype_or_precision_in_one_line(tmp_path, capsys, flag, value):
    code = main(["train", "-D", "num_nodes=300", "--epochs", "1", "--num-ranks", "1", "--device", "cpu", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{flag}: invalid choice: '{value}'" in err[0], err


def test_train_converts_the_features_once(tmp_path, capsys):
    code = main(["train", "-D", "num_nodes=800", "--fanouts", "4,4", "--batch-size", "64", "--epochs", "1",
                 "--num-ranks", "1", "--device", "cpu", "--feature-dtype", "bfloat16", "--log", str(tmp_path / "r.jsonl")])
    assert code == 0
    head = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert head["dataset_spec"]["options"]["feature_dtype"] == "bfloat16"  # eval/predict reload it so


def test_split_parallel_and_inference_take_half_features(ds):
    """A user's DGL-style model under SplitParallel, and layer-wise inference, get the rows upcast exactly."""
    from gsplit.nn.layers import SAGEConv

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([SAGEConv(ds.feature_dim, 8), SAGEConv(8, ds.num_classes)])

        def forward(self, blocks, x):
            return self.layers[1](blocks[1], torch.relu(self.layers[0](blocks[0], x)))

    torch.manual_seed(0)
    net = Net()
    blocks = gsplit.NeighborSampler([3, 3]).sample_blocks(ds.graph, torch.arange(20))
    half = ds.features.to(torch.bfloat16)
    x = half[blocks[0].src_nodes]
    wrapped = gsplit.SplitParallel(net)
    assert torch.equal(wrapped(blocks, x), net(blocks, x.float()))
    model = gsplit.nn.SAGE(ds.feature_dim, 8, ds.num_classes, num_layers=2)
    got = gsplit.layerwise_inference(model, ds.graph, half, batch_size=500)
    want = gsplit.layerwise_inference(model, ds.graph, half.float(), batch_size=500)
    assert torch.equal(got.output, want.output)
