"""Prepared dataset folders (issue 19, item 3): memory-mapped .npy files that ranks map instead of copying,
checks recorded by the writer, and the chunked edge-list conversion that writes them.

The rank workers are top-level functions: spawned ranks unpickle them by module name.
"""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gsplit
from gsplit.datasets import load_edgelist, load_folder, save_folder
from gsplit.datasets.chunked import convert_edgelist, convert_ogb
from gsplit.data.finite import first_non_finite_row, known_finite
from gsplit.run.trainer import TrainConfig, train_rank

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("features", "labels", "train_idx", "val_idx", "test_idx", "node_ids", "communities")


def _same(a, b):
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.graph.indices, b.graph.indices)
    for k in FIELDS:
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            assert torch.equal(x, y), k
    assert (a.num_classes, a.name, a.synthetic_features, a.synthetic_labels) == \
        (b.num_classes, b.name, b.synthetic_features, b.synthetic_labels)


def _mapped_file(t: torch.Tensor):
    """The file whose mapping holds ``t``'s first byte in this process, or None (anonymous memory, heap)."""
    addr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=16, seed=3)
    folder = save_folder(ds, tmp_path_factory.mktemp("prepared") / "ds")
    return ds, folder


# ---------------------------------------------------------------- the folder
def test_folder_round_trips_and_is_memory_mapped(synthetic):
    ds, folder = synthetic
    mapped = gsplit.datasets.load(f"folder:{folder}")
    _same(ds, mapped)
    assert _mapped_file(mapped.features) == str(folder / "features.npy")
    assert _mapped_file(mapped.graph.indices) == str(folder / "graph" / "indices.npy")
    assert not mapped.features.is_shared()
    # the writer checked the features: the reader skips the full scan (Dataset and the loaders)
    assert known_finite(mapped.features)
    assert load_folder(folder, mmap=False).features.is_shared() is False
    assert _mapped_file(load_folder(folder, mmap=False).features) is None


def _resident_bytes(path: Path) -> int:
    """Bytes of ``path``'s mappings in this process that are resident (faulted in by this process)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
                inside = len(head) > 5 and head[5] == str(path)
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def test_opening_the_folder_and_building_a_loader_reads_no_feature_pages(tmp_path):
    """The first epoch must not wait for the whole feature file: opening the folder, validating the dataset
    and building a loader fault in (almost) none of the features' pages; a full NaN scan would fault all."""
    ds = gsplit.datasets.load("synthetic", num_nodes=20000, avg_degree=4, feature_dim=64, seed=0)
    folder = save_folder(ds, tmp_path / "ds")
    size = (folder / "features.npy").stat().st_size
    mapped = load_folder(folder)
    loader = gsplit.DataLoader(mapped.graph, mapped.train_idx, gsplit.NeighborSampler([2]), batch_size=16,
                               features=mapped.features, labels=mapped.labels)
    assert _resident_bytes(folder / "features.npy") < size / 20
    next(iter(loader))  # reads its rows (and, through the kernel's fault-around, their neighbouring pages)
    scanned = load_folder(folder, validate=True)  # the full pass, for contrast: every page
    assert _resident_bytes(folder / "features.npy") >= size - 4096 and scanned.num_nodes == 20000


def test_writes_to_a_mapped_tensor_never_reach_the_file(synthetic):
    ds, folder = synthetic
    mapped = load_folder(folder)
    mapped.features[0].fill_(123.0)  # copy-on-write: this process's page only
    assert torch.equal(load_folder(folder).features[0], ds.features[0])


def test_recorded_check_skips_the_feature_scan_and_validate_true_runs_it(synthetic, tmp_path):
    ds, _ = synthetic
    folder = save_folder(ds, tmp_path / "ds")
    written = os.stat(folder / "features.npy")
    feats = np.load(folder / "features.npy", mmap_mode="r+")
    feats[7, 2] = np.nan  # damage behind the writer's back
    feats.flush()
    del feats
    with pytest.raises(ValueError, match="row 7"):  # the file's stamp (time, sampled blocks) no longer matches
        load_folder(folder)
    os.utime(folder / "features.npy", ns=(written.st_atime_ns, written.st_mtime_ns))  # damage no stamp can see
    lazy = load_folder(folder)  # trusts meta.json's checks: no full pass over the file
    assert first_non_finite_row(lazy.features) is None
    with pytest.raises(ValueError, match="row 7"):
        load_folder(folder, validate=True)


def test_folder_errors_name_the_file(synthetic, tmp_path):
    ds, _ = synthetic
    folder = save_folder(ds, tmp_path / "ds")
    np.save(folder / "labels.npy", np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="labels.npy has 5 entries, expected 3000"):
        load_folder(folder)
    (folder / "meta.json").unlink()
    with pytest.raises(ValueError, match="incomplete dataset folder"):
        load_folder(folder)


def test_folder_dataset_pickles_as_its_path_until_a_tensor_is_replaced(synthetic):
    ds, folder = synthetic
    mapped = gsplit.datasets.load(f"folder:{folder}")
    blob = pickle.dumps(mapped)
    assert len(blob) < 4096  # the path and the metadata, not 3000 x 16 floats
    again = pickle.loads(blob)
    _same(ds, again)
    assert again.meta["load"] == {"name": f"folder:{folder}", "options": {}}
    assert _mapped_file(again.features) == str(folder / "features.npy")
    mapped.features = mapped.features * 2  # no longer the file's data: pickled as tensors
    assert torch.equal(pickle.loads(pickle.dumps(mapped)).features, ds.features * 2)


# ---------------------------------------------------------------- ranks map the folder
def rank_memory(rank, world_size, ds):
    return {"features_file": _mapped_file(ds.features), "indices_file": _mapped_file(ds.graph.indices),
            "features_shared": ds.features.is_shared(), "indices_shared": ds.graph.indices.is_shared()}


@pytest.mark.slow
def test_launched_ranks_map_the_folder_instead_of_receiving_copies(synthetic):
    ds, folder = synthetic
    mapped = load_folder(folder)
    for info in gsplit.launch(rank_memory, 2, args=(mapped,), devices="cpu"):
        assert info == {"features_file": str(folder / "features.npy"),
                        "indices_file": str(folder / "graph" / "indices.npy"),
                        "features_shared": False, "indices_shared": False}
    # an in-memory dataset still travels through shared memory, as before
    for info in gsplit.launch(rank_memory, 2, args=(ds,), devices="cpu"):
        assert info["features_shared"] and info["features_file"] != str(folder / "features.npy")


@pytest.mark.slow
def test_training_on_the_folder_equals_training_in_memory(synthetic):
    ds, folder = synthetic
    pmap = gsplit.partition(ds.graph, 2, method="random", seed=0)
    cfg = TrainConfig(model="sage", fanouts=[5, 5], batch_size=64, hidden=16, dropout=0.0, epochs=1, max_iters=4,
                      lr=0.01, eval_every=1, device="cpu")
    runs = [gsplit.launch(train_rank, 2, args=(cfg, data, pmap.assignment, None), devices="cpu")[0]
            for data in (ds, load_folder(folder))]
    keys = ("loss", "val_acc", "test_acc")
    assert [[e.get(k) for k in keys] for e in runs[0]["epochs"]] == \
        [[e.get(k) for k in keys] for e in runs[1]["epochs"]]


# ---------------------------------------------------------------- chunked conversion
EDGES = """# an unsorted edge list with a header, repeats, self loops and sparse ids
src,dst
100,5
5,100
7,7
3,100
100,3
100,3
42,5
9,42
9,42
1000000000000,3
5,5
42,100
"""


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("remove_self_loops", [True, False])
def test_chunked_conversion_equals_the_one_shot_loader(tmp_path, symmetric, remove_self_loops):
    src = tmp_path / "edges.csv"
    src.write_text(EDGES)
    want = load_edgelist(src, symmetric=symmetric, remove_self_loops=remove_self_loops, feature_dim=8)
    for chunk in (1, 2, 5, 1000):  # 12 edges: chunks smaller than the edge count, and one chunk
        out = tmp_path / f"out{chunk}"
        rep = convert_edgelist(src, out, chunk_edges=chunk, symmetric=symmetric,
                               remove_self_loops=remove_self_loops, feature_dim=8)
        assert rep.chunks == -(-12 // chunk) and rep.file_edges == 12 and rep.peak_rss_bytes > 0
        got = load_folder(out)
        _same(want, got)
        assert got.meta["file_edges"] == 12
        assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # scratch files removed


def test_chunked_conversion_of_a_larger_random_list(tmp_path):
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 500, size=(4000, 2)) * 7  # sparse ids, many repeats and some self loops
    src = tmp_path / "edges.tsv"
    np.savetxt(src, edges, fmt="%d", delimiter="\t")
    want = load_edgelist(src)
    convert_edgelist(src, tmp_path / "out", chunk_edges=333)
    _same(want, load_folder(tmp_path / "out"))


@pytest.mark.slow
def test_cli_prepare_writes_a_folder_and_a_map_for_it(tmp_path):
    src = tmp_path / "edges.csv"
    rng = np.random.default_rng(1)
    np.savetxt(src, rng.integers(0, 400, size=(3000, 2)), fmt="%d", delimiter=",")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "gsplit", "prepare", "--dataset", f"edgelist:{src}",
                          "--dataset-out", str(tmp_path / "ds"), "--chunk-edges", "1000", "--out",
                          str(tmp_path / "map"), "--num-parts", "2", "--batch-size", "32", "--fanouts", "5,5",
                          "-D", "feature_dim=8"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "in 3 chunk(s)" in run.stdout and "peak memory of this process (VmHWM)" in run.stdout
    _same(load_edgelist(src, feature_dim=8), load_folder(tmp_path / "ds"))
    pmap = gsplit.PartitionMap.load(tmp_path / "map")
    pmap.check_graph(load_folder(tmp_path / "ds").graph)


@pytest.mark.parametrize("symmetric", [True, False])
def test_chunked_ogb_conversion_equals_load_ogb(tmp_path, symmetric):
    pytest.importorskip("ogb", reason="the ogb extra is not installed")
    from test_datasets import _write_tiny_arxiv  # ogbn-arxiv's raw layout, a few dozen vertices

    _write_tiny_arxiv(tmp_path)
    want = gsplit.datasets.load_ogb("ogbn-arxiv", root=tmp_path, download=False, symmetric=symmetric,
                                    remove_self_loops=symmetric)
    for chunk in (7, 10_000):  # 100 edges: many chunks, and one
        rep = convert_ogb(tmp_path / "ogbn_arxiv", tmp_path / f"out{chunk}", symmetric=symmetric,
                          remove_self_loops=symmetric, chunk_edges=chunk)
        assert rep.file_edges == 100 and rep.chunks == -(-100 // chunk)
        got = load_folder(tmp_path / f"out{chunk}")
        _same(want, got)
        assert got.meta["split"] == want.meta["split"] == "official (time)"


@pytest.mark.slow
def test_cli_prepare_converts_unpacked_ogb_files(tmp_path):
    pytest.importorskip("pandas", reason="parsing OGB's csv.gz files needs pandas (the ogb extra)")
    from test_datasets import _write_tiny_arxiv

    _write_tiny_arxiv(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "gsplit", "prepare", "--dataset", "ogbn-arxiv", "-D",
                          f"root={tmp_path}", "--dataset-out", str(tmp_path / "ds"), "--chunk-edges", "30", "--out",
                          str(tmp_path / "map"), "--num-parts", "2", "--batch-size", "8", "--fanouts", "3"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "converting OGB's raw files" in run.stdout
    got = load_folder(tmp_path / "ds")
    assert got.name == "ogbn-arxiv" and got.num_nodes == 40 and got.num_classes == 40
