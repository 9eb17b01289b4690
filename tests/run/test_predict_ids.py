"""Predictions speak the user's ids: a dataset whose loader renumbered its vertices (an edge list's ids, ~1e12
or 1-based) keeps the originals (``Dataset.node_ids``, ``node_ids.npy`` in a prepared folder), ``gsplit predict``
writes them, and ``--ids`` takes them (an unknown id is one line)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

import gsplit
from gsplit.cli import main
from gsplit.run.model_io import save_model
from gsplit.nn.models import build_model
from gsplit.run.predict import evaluate_model

RUN = ["--num-ranks", "1", "--device", "cpu"]


def _edge_list(path, first_id: int, n: int = 120, seed: int = 0):
    """A ring plus random chords over ids first_id, first_id + 7, ... (not 0..n-1): the file's own ids."""
    rng = np.random.default_rng(seed)
    ids = first_id + 7 * np.arange(n, dtype=np.int64) if first_id > 1 else np.arange(1, n + 1, dtype=np.int64)
    src = np.concatenate([ids, rng.choice(ids, 3 * n)])
    dst = np.concatenate([np.roll(ids, 1), rng.choice(ids, 3 * n)])
    path.write_text("".join(f"{s},{d}\n" for s, d in zip(src, dst)))
    return ids


def _model(tmp_path, ds):
    spec = dict(name="sage", in_feats=ds.feature_dim, hidden=8, num_classes=ds.num_classes, num_layers=2,
                dropout=0.0, heads=1)
    torch.manual_seed(0)
    path = tmp_path / "model.pt"
    save_model(path, build_model(**spec), spec)
    return path


def _read_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [int(r["vertex"]) for r in rows], [int(r["prediction"]) for r in rows]


@pytest.mark.parametrize("first_id", [10 ** 12, 1], ids=["ids~1e12", "1-based"])
@pytest.mark.parametrize("how", ["load", "convert"])
def test_predict_writes_and_reads_the_files_own_ids(tmp_path, capsys, first_id, how):
    """Fails on the old main: predict wrote 0..n-1 (a 1-based list came out off by one, ~1e12 ids lost)."""
    edges = tmp_path / "edges.csv"
    file_ids = _edge_list(edges, first_id)
    if how == "convert":
        folder = tmp_path / "DS"
        gsplit.datasets.convert_edgelist(edges, folder)
        dataset = f"folder:{folder}"
    else:
        dataset = f"edgelist:{edges}"
    ds = gsplit.datasets.load(dataset)
    assert sorted(ds.node_ids.tolist()) == sorted(file_ids.tolist())
    model = _model(tmp_path, ds)
    # the reference: predictions by vertex index, and which file id each index is
    ref = evaluate_model(model, ds, {}, predict_ids=torch.arange(ds.num_nodes), device="cpu").predictions.argmax(1)
    by_file_id = dict(zip(ds.node_ids.tolist(), ref.tolist()))

    out = tmp_path / "all.csv"
    assert main(["predict", "--checkpoint", str(model), "--dataset", dataset, *RUN, "--out", str(out)]) == 0
    assert "vertex ids: those of" in capsys.readouterr().out
    vertices, preds = _read_csv(out)
    assert sorted(vertices) == sorted(file_ids.tolist())  # the file's ids, none of 0..n-1 unless the file has it
    assert dict(zip(vertices, preds)) == by_file_id

    asked = [int(file_ids[5]), int(file_ids[-1]), int(file_ids[0])]  # any order, the file's ids
    (tmp_path / "ids.txt").write_text("".join(f"{v}\n" for v in asked))
    out = tmp_path / "some.npz"
    assert main(["predict", "--checkpoint", str(model), "--dataset", dataset, *RUN, "--ids",
                 str(tmp_path / "ids.txt"), "--out", str(out)]) == 0
    got = np.load(out)
    assert got["ids"].tolist() == asked and got["prediction"].tolist() == [by_file_id[v] for v in asked]
    capsys.readouterr()

    unknown = int(file_ids.max()) + 1
    (tmp_path / "bad.txt").write_text(f"{asked[0]}\n{unknown}\n")
    assert main(["predict", "--checkpoint", str(model), "--dataset", dataset, *RUN, "--ids",
                 str(tmp_path / "bad.txt"), "--out", str(tmp_path / "bad.csv")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"1 of 2 ids are not vertices" in err[0] and str(unknown) in err[0], err


def test_eval_ids_take_the_files_own_ids(tmp_path, capsys):
    edges = tmp_path / "edges.csv"
    file_ids = _edge_list(edges, 1)
    ds = gsplit.datasets.load(f"edgelist:{edges}")
    model = _model(tmp_path, ds)
    (tmp_path / "ids.txt").write_text(f"{file_ids[-1]}\n")  # n: a vertex of a 1-based list, not of 0..n-1
    assert main(["eval", "--checkpoint", str(model), "--dataset", f"edgelist:{edges}", *RUN, "--ids",
                 str(tmp_path / "ids.txt")]) == 0
    assert "(1 vertices)" in capsys.readouterr().out


def test_a_dataset_that_kept_its_numbering_maps_ids_to_themselves():
    ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
    assert ds.node_ids is None
    assert ds.vertices([3, 1]).tolist() == [3, 1] and ds.source_ids(torch.tensor([3, 1])).tolist() == [3, 1]
    with pytest.raises(ValueError):
        ds.vertices([300])
