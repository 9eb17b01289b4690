"""``model.pt`` is checked whole: its digest covers the description and the weights, a file without it (or with
the weights-only digest of version 1) loads only when trusted, and a description that cannot build its model is
refused in one line naming the file before anything is allocated (also a dataset folder's ``num_classes``)."""

from __future__ import annotations

import json
import pickle
import zipfile

import pytest
import torch

import gsplit
from gsplit.cli import main
from gsplit.run.model_io import check_model_spec, load_model, save_model, state_digest
from gsplit.nn.models import build_model

SPEC = dict(name="sage", in_feats=8, hidden=16, num_classes=4, num_layers=2, dropout=0.0, heads=1)
DATASET = {"name": "synthetic", "options": {"num_nodes": 600, "feature_dim": 8, "num_classes": 4}}
EVAL = ["--num-ranks", "1", "--device", "cpu"]


def _model_file(path, spec=SPEC):
    torch.manual_seed(0)
    save_model(path, build_model(**spec), spec, dataset=DATASET)
    return path


def _edit(path, change):
    obj = torch.load(path, weights_only=True)
    change(obj)
    torch.save(obj, path)
    return path


def _weight(obj) -> str:
    return next(k for k, v in obj["state_dict"].items() if torch.is_tensor(v) and v.is_floating_point())


def _one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gsplit: error: "), lines
    return lines[0]


def test_one_byte_of_the_description_changed_is_refused(tmp_path, capsys):
    """Fails on the old main: num_nodes 600 -> 601 in the pickled description (torch checks no CRC) loaded
    with rc 0 and was scored on another graph. Here: the byte itself, in the zip's data.pkl."""
    path = _model_file(tmp_path / "model.pt")
    with zipfile.ZipFile(path) as zf:  # the description is pickled: 600 is a BININT2, find it in data.pkl
        pkl = next(i for i in zf.infolist() if i.filename.endswith("data.pkl"))
    raw = bytearray(path.read_bytes())
    data = bytearray(zipfile.ZipFile(path).read(pkl.filename))
    needle = pickle.dumps(600, protocol=2)[2:-1]  # the opcode and bytes of the int 600
    off = data.find(needle)
    assert off > 0
    start = raw.find(bytes(data[:64]))  # stored uncompressed: the pickle lies in the file as is
    raw[start + off + 1] += 1  # 600 -> 601
    path.write_bytes(bytes(raw))
    assert torch.load(path, weights_only=True)["dataset"]["options"]["num_nodes"] == 601
    with pytest.raises(ValueError, match="has been changed since it was written"):
        load_model(path)
    assert main(["eval", "--checkpoint", str(path), *EVAL]) == 2
    line = _one_line(capsys)
    assert str(path) in line and "--trust-model" in line


@pytest.mark.parametrize("what", ["weights", "training options", "versions"])
def test_any_part_changed_is_refused_and_loads_when_trusted(tmp_path, caplog, what):
    def change(obj):
        if what == "weights":
            name = _weight(obj)
            obj["state_dict"][name] = obj["state_dict"][name] + 1
        elif what == "training options":
            obj["train_config"]["lr"] = 1.0
        else:
            obj["versions"]["gsplit"] = "0.0.1"
    path = _edit(_model_file(tmp_path / "model.pt"), change)
    with pytest.raises(ValueError, match="damaged or has been changed"):
        load_model(path)
    with caplog.at_level("WARNING"):
        assert load_model(path, trust=True).spec == SPEC
    assert "does not match its digest" in caplog.text


def test_a_file_without_its_digest_is_refused_unless_trusted(tmp_path, capsys):
    """Fails on the old main: state_sha256 removed and the weights changed loaded without a word."""
    def change(obj):
        del obj["state_sha256"]
        name = _weight(obj)
        obj["state_dict"][name] = obj["state_dict"][name] * 2
    path = _edit(_model_file(tmp_path / "model.pt"), change)
    assert main(["eval", "--checkpoint", str(path), *EVAL]) == 2
    line = _one_line(capsys)
    assert "carries no digest" in line and "--trust-model" in line and str(path) in line
    assert main(["eval", "--checkpoint", str(path), *EVAL, "--trust-model"]) == 0


def test_a_version_1_file_needs_trust_and_its_weights_are_still_checked(tmp_path):
    """A model file of the previous format (weights-only digest) is refused with what to do, loads when trusted,
    and is still refused when its weights do not match that digest."""
    def old_form(obj):
        obj["version"] = 1
        obj["state_sha256"] = state_digest(obj["state_dict"])
    path = _edit(_model_file(tmp_path / "model.pt"), old_form)
    with pytest.raises(ValueError, match="older gsplit .model-file version 1. whose digest covers the weights only"):
        load_model(path)
    assert load_model(path, trust=True).spec == SPEC

    def damage(obj):
        name = _weight(obj)
        obj["state_dict"][name] = obj["state_dict"][name] + 1
    _edit(path, damage)
    with pytest.raises(ValueError, match="is damaged: its weights do not match"):
        load_model(path, trust=True)


@pytest.mark.parametrize("change,message", [
    ({"hidden": 10 ** 12}, "holds .* parameters .* more than the"),
    ({"num_classes": 10 ** 10}, "holds .* parameters .* more than the"),
    ({"hidden": 1e12}, "hidden is 1000000000000.0; it must be a positive integer"),
    ({"num_layers": 0}, "num_layers is 0; it must be a positive integer"),
    ({"dropout": 2}, "dropout is 2"),
    ({"name": "mlp"}, "model 'mlp' is not one of"),
    ({"residual": True}, r"options build_model does not take: \['residual'\]"),
])
def test_a_description_that_cannot_build_its_model_is_refused_before_any_allocation(tmp_path, capsys, monkeypatch,
                                                                                       change, message):
    """Fails on the old main: hidden 1e12 or 10**10 classes went to build_model (a 640 GB allocation)."""
    import gsplit.nn.models as models

    path = _edit(_model_file(tmp_path / "model.pt"), lambda obj: obj["model"].update(change))
    built = []
    real = models.build_model
    monkeypatch.setattr(models, "build_model", lambda *a, **k: built.append(torch.empty(0).device) or real(*a, **k))
    with pytest.raises(ValueError, match=message):
        load_model(path, trust=True)  # trusted: the description is checked all the same
    assert all(d == torch.device("meta") for d in built), built  # only the meta-device probe ran
    assert main(["eval", "--checkpoint", str(path), *EVAL, "--trust-model"]) == 2
    line = _one_line(capsys)
    assert str(path) in line


def test_check_model_spec_counts_parameters_on_the_meta_device():
    check_model_spec(SPEC, "x")  # fits
    with pytest.raises(ValueError, match="x: a sage model .* 4 classes .* more than the 0.0 GiB"):
        check_model_spec(SPEC, "x", memory=100)


def test_a_folder_whose_num_classes_cannot_be_built_is_refused_naming_its_meta_json(tmp_path, capsys):
    """Fails on the old main: num_classes 10**10 in a prepared folder's meta.json: a 640 GB allocation."""
    ds = gsplit.datasets.load("synthetic", num_nodes=600, avg_degree=6, feature_dim=8, seed=0)
    folder = gsplit.datasets.save_folder(ds, tmp_path / "DS")
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    train = ["train", "--dataset", f"folder:{folder}", "--fanouts", "4,3", "--batch-size", "64", "--hidden", "16",
             "--epochs", "1", "--num-ranks", "1", "--device", "cpu"]
    # the folder's own check bounds num_classes (one output per class) before any model is described
    for value, says in ((10 ** 10, "num_classes=10000000000 must be an integer from 1 to"),
                        (1e10, "num_classes=10000000000.0 must be an integer from 1 to")):
        meta_path.write_text(json.dumps(dict(meta, num_classes=value)))
        assert main(train) == 2
        line = _one_line(capsys)
        assert str(meta_path) in line and says in line, line
