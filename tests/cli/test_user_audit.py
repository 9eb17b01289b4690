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
    """The CLI's kernel preparations (recorded, not run): every command builds through gsplit.ops.prepare_kernels."""
    from gsplit import ops
    from gsplit.ops.cpu_ext import BuildReport

    calls = []
    monkeypatch.delenv("GSPLIT_NO_EXTENSIONS", raising=False)
    monkeypatch.setattr(ops, "prepare_kernels", lambda: calls.append("built") or BuildReport([], {}, 0.0))
    return calls


# ---------------------------------------------------------------- finding 2: no build before the checks
def test_argument_mistakes_are_said_before_any_kernel_build(tmp_path, builds, capsys):
    """Fails on the old main: prepare built the kernels (22-27 s on a fresh environment) before it read
    --fanouts, train before it checked the --partition map, eval before it compared model and dataset."""
    from gsplit.run.model_io import save_model
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


# ---------------------------------------------------------------- findings 8 and 9: model files
def _model_file(path, **changes):
    from gsplit.run.model_io import save_model
    from gsplit.nn.models import build_model

    spec = dict(name="sage", in_feats=8, hidden=16, num_classes=4, num_layers=2, dropout=0.0, heads=1, **changes)
    torch.manual_seed(0)
    save_model(path, build_model(**spec), spec, dataset={"name": "synthetic", "options": {
        "num_nodes": 1500, "feature_dim": 8, "num_classes": 4}})
    return path


def _flip_bytes_inside_a_tensor(path, count=8):
    """Flip ``count`` bytes in the middle of the largest tensor stored in a torch zip file."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    for i in range(start, start + count):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gsplit: error: "), err
    return lines[0]


def test_a_damaged_model_file_is_refused_in_one_line(tmp_path, capsys):
    """Fails on the old main: model.pt carried no checksum; with 8 bytes flipped inside a tensor `gsplit eval`
    exited 0 with another accuracy."""
    path = _model_file(tmp_path / "model.pt")
    _flip_bytes_inside_a_tensor(path)
    assert main(["eval", "--checkpoint", str(path), "--num-ranks", "1", "--device", "cpu"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "is damaged" in line and str(path) in line and "retrain" in line


def test_a_model_file_whose_description_does_not_fit_its_weights_is_refused_in_one_line(tmp_path, capsys):
    """Fails on the old main: torch's multi-line `size mismatch` error, exit 1."""
    path = _model_file(tmp_path / "model.pt")
    obj = torch.load(path, weights_only=True)
    obj["model"]["hidden"] = 32
    torch.save(obj, path)
    assert main(["eval", "--checkpoint", str(path), "--num-ranks", "1", "--device", "cpu"]) == 2
    line = _one_error_line(capsys.readouterr().err)  # the digest covers the description: changed
    assert "has been changed since it was written" in line and "--trust-model" in line
    assert main(["eval", "--checkpoint", str(path), "--num-ranks", "1", "--device", "cpu", "--trust-model"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "do not fit the model its description builds" in line and "in the file but" in line


def test_a_model_file_without_its_description_is_refused_in_one_line(tmp_path, capsys):
    """Fails on the old main: a raw `KeyError: 'model'` traceback."""
    path = _model_file(tmp_path / "model.pt")
    obj = torch.load(path, weights_only=True)
    del obj["model"]
    torch.save(obj, path)
    assert main(["eval", "--checkpoint", str(path), "--num-ranks", "1", "--device", "cpu"]) == 2
    assert "without its 'model'" in _one_error_line(capsys.readouterr().err)


def test_a_model_with_more_classes_than_the_dataset_is_said(tmp_path, caplog):
    """Fails on the old main: an 8-class model evaluated on a 4-class dataset ran without a word."""
    path = _model_file(tmp_path / "model.pt", **{})
    obj = torch.load(path, weights_only=True)
    from gsplit.run.model_io import save_model
    from gsplit.nn.models import build_model

    spec = dict(obj["model"], num_classes=8)
    save_model(path, build_model(**spec), spec, dataset=obj["dataset"])
    with caplog.at_level("WARNING"):
        assert main(["eval", "--checkpoint", str(path), "--num-ranks", "1", "--device", "cpu"]) == 0
    said = [r.getMessage() for r in caplog.records if "predicts 8 classes" in r.getMessage()]
    assert len(said) == 1 and "but dataset 'synthetic' has 4" in said[0]


# ---------------------------------------------------------------- finding 10: replaced files in a dataset folder
@pytest.fixture
def folder(tmp_path):
    return gsplit.datasets.save_folder(_data(), tmp_path / "ds")


def test_an_unsorted_indptr_in_a_prepared_folder_is_refused_by_default(folder, capsys):
    """Fails on the old main: a replaced indptr.npy that is no longer sorted trained silently (exit 0)."""
    import numpy as np

    ptr = np.load(folder / "graph" / "indptr.npy")
    ptr[10], ptr[11] = ptr[11] + 5, ptr[10]
    np.save(folder / "graph" / "indptr.npy", ptr)
    assert main(["train", "--dataset", f"folder:{folder}", "--num-ranks", "1", "--device", "cpu", "--epochs", "1",
                 "--fanouts", "3,3", "--batch-size", "64", "--hidden", "8", "--eval-every", "0"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "graph/indptr.npy is not non-decreasing" in line


def test_an_indptr_that_does_not_end_at_the_edge_count_is_refused_naming_the_file(folder):
    """(Passes on main since the first issue-31 merge: kept so that the end check stays.)"""
    import numpy as np

    ptr = np.load(folder / "graph" / "indptr.npy")
    edges = int(ptr[-1])
    ptr[-1] = edges - 3
    np.save(folder / "graph" / "indptr.npy", ptr)
    with pytest.raises(ValueError, match=rf"graph/indptr.npy runs from 0 to {edges - 3} but must run from 0 to the "
                                         rf"{edges} entries of indices.npy; write it again"):
        gsplit.datasets.load(f"folder:{folder}")


def test_an_out_of_range_id_in_a_prepared_folder_is_refused_naming_the_file(folder):
    """Fails on the old main: the sampler caught it later, without naming the file."""
    import numpy as np

    idx = np.load(folder / "graph" / "indices.npy")
    idx[len(idx) // 3] = 1500  # one past the last vertex
    np.save(folder / "graph" / "indices.npy", idx)
    with pytest.raises(ValueError, match=r"graph/indices.npy holds vertex id 1500 outside \[0, 1500\)"):
        gsplit.datasets.load(f"folder:{folder}")


def test_an_untouched_or_copied_folder_skips_the_feature_scan_but_never_the_id_pass(folder, tmp_path, monkeypatch):
    """The default check stays cheap: files as written, or copied (new times, same blocks), skip the feature
    scan; the id pass runs on every load (issue 49: a stamp restored by hand let an id out of range reach
    scipy and corrupt memory; the pass is cheap next to reading the graph)."""
    import shutil

    import gsplit.data.graph as graph_module
    from gsplit.datasets.base import known_finite

    passes = []
    real = graph_module._check_loaded_ids
    monkeypatch.setattr(graph_module, "_check_loaded_ids", lambda *a: passes.append(1) or real(*a))
    ds = gsplit.datasets.load_folder(folder)
    assert passes == [1] and known_finite(ds.features)
    copy = shutil.copytree(folder, tmp_path / "copy", copy_function=shutil.copyfile)   # new modification times
    ds = gsplit.datasets.load_folder(copy)
    assert passes == [1, 1] and known_finite(ds.features)
    assert ds.num_edges == _data().num_edges


# ---------------------------------------------------------------- finding 5b: the epoch line's parts and total
@pytest.mark.parametrize("system", ["full", "split"])
def test_no_part_of_an_epoch_exceeds_its_total_when_the_first_sample_waits(system, monkeypatch):
    """Fails on the old main for ``full``: the blocks' build (before the first epoch; with kernel builds or
    waits for the other ranks 23 s) was booked as the first epoch's sample time but not in its total:
    `time 0.15s (sample 23.01 / ...)`. Now it is the log's ``setup_s``."""
    import time

    import gsplit.fullgraph.loader
    import gsplit.minibatch.loader
    from gsplit.run.trainer import TrainConfig, train_rank

    module = gsplit.fullgraph.loader if system == "full" else gsplit.minibatch.loader
    name = "sp_sample" if system == "full" else "sp_sample_many"
    real, calls = getattr(module, name), []

    def slow_first(*args, **kwargs):  # a first sample that waits, as for a kernel build or a late rank
        if not calls:
            time.sleep(0.5)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow_first)
    cfg = TrainConfig(system=system, epochs=2, fanouts=[3, 3], batch_size=256, hidden=8, device="cpu", eval_every=0)
    log = train_rank(0, 1, cfg, _data(), None)
    assert calls
    for record in log["epochs"]:
        for part in ("sample_s", "load_s", "wait_s", "train_s"):
            assert record[part] <= record["epoch_s"], (part, record[part], record["epoch_s"])
    waited = log["setup_s"] if system == "full" else log["epochs"][0]["epoch_s"]
    assert waited >= 0.5


# ---------------------------------------------------------------- finding 5a: a build inside a user's script
def test_a_kernel_build_inside_a_users_script_says_one_warning(monkeypatch, tmp_path, caplog):
    """What a script that never calls prepare_kernels meets at its first sampled batch: the first use
    (``cpu_ext.load``) compiles and says so in one WARNING (what, how long, where cached); a second use loads
    it silently. Fails if the line is logged below WARNING (a script's default logging shows nothing else)
    or repeated per call."""
    from pathlib import Path

    import torch.utils.cpp_extension as ext

    from gsplit.ops import cpu_ext

    monkeypatch.delenv("GSPLIT_NO_EXTENSIONS", raising=False)
    monkeypatch.delenv("GSPLIT_SKIP_EXTENSIONS", raising=False)
    monkeypatch.setenv("GSPLIT_EXTENSION_DIR", str(tmp_path))

    def fake_compile(name, sources, build_directory, **kwargs):
        (Path(build_directory) / f"{name}.so").write_bytes(b"library")
        return "module"

    monkeypatch.setattr(ext, "load", fake_compile)
    monkeypatch.setattr(cpu_ext, "_import_library", lambda name, library: "module")
    cpu_ext._build.cache_clear()
    cpu_ext._build_or_none.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert cpu_ext.load("gsplit_user_script_ext", ["sample_cpu.cpp"]) == "module"
            assert cpu_ext.load("gsplit_user_script_ext", ["sample_cpu.cpp"]) == "module"
    finally:
        cpu_ext._build.cache_clear()
        cpu_ext._build_or_none.cache_clear()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    said = warnings[0].getMessage()
    assert "building the compiled CPU kernel gsplit_user_script_ext" in said and str(tmp_path) in said


# ---------------------------------------------------------------- finding 7: six small ones
class _DglStyleSage(torch.nn.Module):
    """DGL's example SAGE in shape: no between, relu in the forward."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([gsplit.nn.SAGEConv(8, 8), gsplit.nn.SAGEConv(8, 4)])

    def forward(self, blocks, x):
        h = torch.relu(self.layers[0](blocks[0], x))
        return self.layers[1](blocks[1], h)


def test_an_inferred_between_is_said_once_where_a_script_sees_it(monkeypatch, caplog):
    """Fails on the old main: what layer-wise inference inferred was logged at INFO only (a script with
    default logging saw nothing) and the result did not say it."""
    from gsplit.minibatch import inference

    monkeypatch.setattr(inference, "_INFERRED_SAID", set(), raising=False)
    ds, model = _data(), _DglStyleSage()
    with caplog.at_level("WARNING"):
        first = gsplit.layerwise_inference(model, ds.graph, ds.features, batch_size=500)
        again = gsplit.layerwise_inference(model, ds.graph, ds.features, batch_size=500)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "_DglStyleSage" in said[0] and "relu between layers" in said[0], said
    assert first.between == again.between == "inferred: relu between layers"
    assert gsplit.layerwise_inference(model, ds.graph, ds.features, between=torch.relu).between == "given"
    assert gsplit.layerwise_inference(gsplit.nn.SAGE(8, 8, 4), ds.graph, ds.features).between == "model.between"


def test_a_map_made_for_a_loader_without_one_is_said_once_per_job(monkeypatch, caplog):
    """Fails on the old main: every loader made without partition= said it at WARNING (DGL's example makes
    a training and a validation loader: two lines); now the first says it, later ones log at INFO."""
    from gsplit.partitioning import auto
    from gsplit.sampling.neighbor import NeighborSampler

    class RankZeroOfTwo:  # what rank 0 of a 2-rank group sees; rank 1 never logs
        rank, world_size = 0, 2

        def all_gather_object(self, obj):
            return [obj, obj]

    monkeypatch.setattr(auto, "_SAID", set(), raising=False)
    ds = _data()
    with caplog.at_level("WARNING"):
        for targets in (ds.train_idx, ds.val_idx):
            pmap = auto.default_partition(ds.graph, targets, NeighborSampler([3, 3]), 64, RankZeroOfTwo())
            assert pmap.num_parts == 2
    said = [r.getMessage() for r in caplog.records if "no partition map was given" in r.getMessage()]
    assert len(said) == 1, said


def test_a_pyg_attention_layer_with_its_default_self_loops_says_what_to_change(caplog):
    """Fails on the old main: BlockConv(GATConv(...)) with PyG's default add_self_loops=True trained silently
    on self-loops the sampler never picked, where the docs build it with add_self_loops=False."""
    pyg_nn = pytest.importorskip("torch_geometric.nn", reason="torch_geometric is not installed")
    from gsplit.interop.pyg import BlockConv

    with caplog.at_level("WARNING"):
        BlockConv(pyg_nn.GATConv(8, 4, heads=2))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "GATConv(..., add_self_loops=False)" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING"):
        for conv in (pyg_nn.GATConv(8, 4, add_self_loops=False), pyg_nn.SAGEConv(8, 4),
                     pyg_nn.GCNConv(8, 4, normalize=False, aggr="mean")):
            BlockConv(conv)
    assert caplog.records == []


def test_pyg_loader_keywords_get_the_dataloader_spelling():
    """Fails on the old main: `DataLoader.__init__() got an unexpected keyword argument 'input_nodes'`,
    which does not say where the targets go."""
    ds = _data()
    sampler = gsplit.NeighborSampler([3, 3])
    with pytest.raises(TypeError, match=r"input_nodes=, a PyG NeighborLoader keyword; pass the targets positionally "
                                        r"as indices: DataLoader\(graph, indices, sampler"):
        gsplit.DataLoader(ds.graph, input_nodes=ds.train_idx, sampler=sampler, batch_size=64)
    with pytest.raises(TypeError, match=r"NeighborSampler.from_pyg\(num_neighbors\)"):
        gsplit.DataLoader(ds.graph, ds.train_idx, num_neighbors=[3, 3], batch_size=64)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):   # any other keyword: Python's
        gsplit.DataLoader(ds.graph, ds.train_idx, sampler, bogus=1)
    assert len(gsplit.DataLoader(ds.graph, ds.train_idx, sampler, batch_size=64)) > 0


def test_training_without_training_vertices_says_how_to_pass_the_split():
    """Fails on the old main: a DGL graph without masks (from_dgl) was refused with `train_idx is empty ...
    check its split options`, which from_dgl has none of. (tests/interop/test_dgl_interop.py checks from_dgl itself.)"""
    import dataclasses

    from gsplit.run.trainer import TrainConfig, train_rank

    empty = torch.zeros(0, dtype=torch.int64)
    bare = dataclasses.replace(_data(), train_idx=empty, name="dgl", meta={"source": "dgl.DGLGraph"})
    with pytest.raises(ValueError, match=r"no training vertices .*from_dgl\(g, train_idx=\.\.\., val_idx=\.\.\., "
                                         r"test_idx=\.\.\.\).*or set g.ndata\['train_mask'\]"):
        train_rank(0, 1, TrainConfig(fanouts=[2], device="cpu"), bare, None)
    with pytest.raises(ValueError, match=r"set data.train_mask .* before from_pyg\(data\)"):
        train_rank(0, 1, TrainConfig(fanouts=[2], device="cpu"),
                   dataclasses.replace(bare, meta={"source": "torch_geometric.data.Data"}), None)


# ---------------------------------------------------------------- finding 11: a full disk during training
def test_a_checkpoint_that_fills_the_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """Fails on the old main: torch.save on a full disk raises `RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos` while handling the OSError, so the run ended in the rank's traceback
    (tests/cli/test_faults.py has the same on a real 64 KiB file system with 2 ranks, where root may mount one)."""
    import errno
    import io

    import gsplit.run.checkpoint

    real_save = torch.save

    def save_on_a_full_disk(obj, f, *args, **kwargs):   # what torch.save does when a write hits ENOSPC
        if not isinstance(f, io.BytesIO):   # a file on disk (model.pt goes through a buffer first)
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 8000 vs 7952")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(gsplit.run.checkpoint.torch, "save", save_on_a_full_disk)
    rc = main(["train", *DATA, "--num-ranks", "1", "--device", "cpu", "--epochs", "1", "--fanouts", "3,3",
               "--batch-size", "256", "--hidden", "8", "--eval-every", "0", "--checkpoint", str(tmp_path / "ck")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    line = _one_error_line("\n".join(x for x in err.splitlines() if not x.startswith("epoch ")))  # not tqdm's bar
    assert "No space left on device" in line and str(tmp_path / "ck") in line and "state.pt" in line
    assert "free space on that file system" in line
