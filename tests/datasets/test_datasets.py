"""Tests for gsplit.datasets: synthetic generator, npz / edge-list loaders, OGB (offline), validation."""

import builtins
import gzip
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from gsplit.datasets import (
    NAMES,
    Dataset,
    load,
    load_edgelist,
    load_npz,
    load_ogb,
    make_synthetic,
    planetoid_split,
    random_split,
    synthetic_graph,
)
from gsplit.datasets import ogb as ogb_loader
from gsplit.datasets.synthetic import _symmetric_csc
from gsplit.data.graph import Graph

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _data_file(name: str) -> Path:
    p = DATA / name
    if not p.exists():
        pytest.skip(f"real data file {p} is absent (it lives in ../shared/data beside the repo)")
    return p


def _edge_set(g: Graph) -> set:
    dst = g.edge_dst()
    return set(zip(g.indices.tolist(), dst.tolist()))


def _assert_simple_symmetric(g: Graph):
    """Symmetric, no self-loops, no repeated edges, sources sorted within each destination."""
    a = g.to_scipy()
    assert (a != a.T).nnz == 0, "graph is not symmetric"
    assert a.diagonal().sum() == 0, "graph has self-loops"
    src, dst = g.indices, g.edge_dst()
    same_row = dst[1:] == dst[:-1]
    assert bool((src[1:][same_row] > src[:-1][same_row]).all()), "repeated or unsorted edges"


# ---------------------------------------------------------------------------------- synthetic
def test_synthetic_deterministic_for_a_seed():
    a = make_synthetic(num_nodes=3000, avg_degree=10, num_communities=8, feature_dim=16, num_classes=4, seed=5)
    b = make_synthetic(num_nodes=3000, avg_degree=10, num_communities=8, feature_dim=16, num_classes=4, seed=5)
    c = make_synthetic(num_nodes=3000, avg_degree=10, num_communities=8, feature_dim=16, num_classes=4, seed=6)
    for field in ("features", "labels", "train_idx", "val_idx", "test_idx", "communities"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.graph.indices, b.graph.indices)
    assert a.graph.fingerprint() != c.graph.fingerprint()
    assert not torch.equal(a.features, c.features)


def test_synthetic_sizes_symmetry_and_power_law():
    n, deg = 5000, 12
    g, comm = synthetic_graph(n, avg_degree=deg, num_communities=10, seed=0)
    assert g.num_nodes == n and comm.shape == (n,) and comm.dtype == torch.int64
    # avg_degree counts both directions; top-up rounds make up for dropped duplicates and self-loops
    assert abs(g.num_edges - n * deg) <= 0.01 * n * deg
    assert g.num_edges % 2 == 0
    _assert_simple_symmetric(g)
    d = g.in_degrees().double()
    assert d.max() > 6 * d.mean(), "degree distribution should be heavy-tailed"
    assert d.median() < d.mean(), "a power law has its median below its mean"


def test_synthetic_community_structure():
    k = 16
    g, comm = synthetic_graph(4000, avg_degree=10, num_communities=k, p_in=0.8, seed=1)
    intra = float((comm[g.indices] == comm[g.edge_dst()]).double().mean())
    assert intra > 0.7, intra            # p_in + (1 - p_in) / k ~ 0.81
    assert intra > 8 / k                 # >> 1 / num_communities
    g0, comm0 = synthetic_graph(4000, avg_degree=10, num_communities=k, p_in=0.0, seed=1)
    intra0 = float((comm0[g0.indices] == comm0[g0.edge_dst()]).double().mean())
    assert intra0 < 3 / k, intra0        # without planted structure edges ignore communities


def test_symmetric_csc_matches_graph_from_edges():
    g, _ = synthetic_graph(1500, avg_degree=8, num_communities=3, seed=2)
    src, dst = g.indices, g.edge_dst()
    keep = src < dst
    ref = Graph.from_edges(src[keep], dst[keep], num_nodes=1500, symmetric=True)
    assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.indices, ref.indices)
    pairs = np.array([0 * 4 + 1, 2 * 4 + 3], dtype=np.int64)  # edges {0,1}, {2,3} in a 4-vertex graph
    small = _symmetric_csc(pairs, 4)
    assert small.indptr.tolist() == [0, 1, 2, 3, 4] and small.indices.tolist() == [1, 0, 3, 2]


def _nearest_centroid_accuracy(x, ds):
    tr, te, c = ds.train_idx, ds.test_idx, ds.num_classes
    sums = torch.zeros(c, x.shape[1], dtype=x.dtype).index_add_(0, ds.labels[tr], x[tr])
    cent = sums / torch.bincount(ds.labels[tr], minlength=c).clamp(min=1)[:, None].to(x.dtype)
    pred = torch.cdist(x[te], cent).argmin(1)
    return float((pred == ds.labels[te]).double().mean())


def test_synthetic_features_predict_labels_and_neighbours_help():
    ds = make_synthetic(num_nodes=6000, avg_degree=12, num_communities=16, feature_dim=32, num_classes=4, seed=3)
    chance = 1 / ds.num_classes
    own = _nearest_centroid_accuracy(ds.features, ds)
    assert own > 2 * chance, own
    # one round of mean aggregation over neighbours (what a GNN layer does) must add information
    a = ds.graph.to_scipy().T.tocsr()  # a[dst, src]
    deg = np.maximum(np.asarray(a.sum(1)).ravel(), 1)
    agg = torch.from_numpy(((a @ ds.features.numpy()) / deg[:, None]).astype(np.float32))
    both = _nearest_centroid_accuracy(agg, ds)
    assert both > own + 0.1, (own, both)
    assert not ds.synthetic_features and not ds.synthetic_labels
    assert ds.labels.min() >= 0 and ds.labels.max() < ds.num_classes


def test_default_synthetic_via_load():
    ds = load("synthetic")
    assert isinstance(ds, Dataset) and ds.name == "synthetic"
    assert ds.num_nodes == 20_000 and ds.features.dtype == torch.float32 and ds.labels.dtype == torch.int64
    assert ds.train_idx.numel() + ds.val_idx.numel() + ds.test_idx.numel() == ds.num_nodes
    assert "20,000 vertices" in ds.describe() and "Dataset(name='synthetic'" in repr(ds)


def test_synthetic_rejects_bad_parameters():
    with pytest.raises(ValueError, match="num_classes"):
        make_synthetic(num_nodes=100, num_communities=4, num_classes=5)
    with pytest.raises(ValueError, match="power_law_exponent"):
        synthetic_graph(100, avg_degree=4, power_law_exponent=1.5)
    with pytest.raises(ValueError, match="p_in"):
        synthetic_graph(100, avg_degree=4, p_in=1.5)


# ---------------------------------------------------------------------------------- splits
def test_planetoid_split_counts_and_seed():
    labels = torch.arange(3000) % 7
    labels[::11] = -1  # unlabelled vertices never enter a split
    tr, va, te = planetoid_split(labels, 7, seed=4)
    assert torch.bincount(labels[tr], minlength=7).tolist() == [20] * 7
    assert va.numel() == 500 and te.numel() == 1000
    allidx = torch.cat([tr, va, te])
    assert allidx.unique().numel() == allidx.numel() and bool((labels[allidx] >= 0).all())
    tr2, _, _ = planetoid_split(labels, 7, seed=4)
    tr3, _, _ = planetoid_split(labels, 7, seed=5)
    assert torch.equal(tr, tr2) and not torch.equal(tr, tr3)
    with pytest.raises(ValueError, match="split='random'"):
        planetoid_split(torch.arange(200) % 2, 2)


def test_random_split_fractions():
    tr, va, te = random_split(1000, (0.5, 0.3, 0.2), seed=0)
    assert (tr.numel(), va.numel(), te.numel()) == (500, 300, 200)
    assert torch.cat([tr, va, te]).unique().numel() == 1000
    with pytest.raises(ValueError, match="fractions"):
        random_split(10, (0.8, 0.3, 0.1))


# ---------------------------------------------------------------------------------- npz
@pytest.mark.parametrize("fname, nodes, classes, feat_dim", [("cora.npz", 2708, 7, 1433),
                                                              ("citeseer.npz", 3312, 6, 3703)])
def test_npz_citation_graphs(fname, nodes, classes, feat_dim):
    path = _data_file(fname)
    ds = load(f"npz:{path}")
    assert ds.name == fname[:-4]
    assert ds.num_nodes == nodes and ds.num_classes == classes
    assert ds.features.shape == (nodes, feat_dim) and ds.features.dtype == torch.float32
    assert ds.train_idx.numel() == 20 * classes and ds.val_idx.numel() == 500 and ds.test_idx.numel() == 1000
    assert torch.bincount(ds.labels[ds.train_idx], minlength=classes).tolist() == [20] * classes
    _assert_simple_symmetric(ds.graph)
    assert not ds.synthetic_features and not ds.synthetic_labels
    if fname == "cora.npz":
        assert ds.num_edges == 10556  # the usual symmetric Cora edge count


def test_npz_random_split_and_normalisation():
    path = _data_file("cora.npz")
    ds = load_npz(path, split="random", split_seed=1, normalize_features=True)
    assert (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel()) == (1625, 542, 541)
    sums = ds.features.sum(1)
    assert torch.allclose(sums[sums > 0], torch.ones(1), atol=1e-5)
    with pytest.raises(ValueError, match="split must be"):
        load_npz(path, split="bogus")


def test_npz_written_by_test(tmp_path):
    import scipy.sparse as sp

    adj = sp.csr_matrix(np.array([[0, 1, 0], [0, 1, 1], [1, 0, 0]], dtype=np.float32))
    attr = sp.csr_matrix(np.array([[1, 0], [0, 2], [3, 3]], dtype=np.float32))
    p = tmp_path / "tiny.npz"
    np.savez(p, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=adj.shape,
             attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape,
             labels=np.array([0, 1, 1], dtype=np.int8))
    ds = load_npz(p, split="random", split_fractions=(1 / 3, 1 / 3, 1 / 3))
    assert _edge_set(ds.graph) == {(0, 1), (1, 0), (1, 2), (2, 1), (0, 2), (2, 0)}
    assert ds.features.tolist() == [[1, 0], [0, 2], [3, 3]]
    np.savez(p, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=adj.shape,
             attr_matrix=np.array([[1, 0], [np.nan, 2], [3, 3]], dtype=np.float32),
             labels=np.array([0, 1, 1], dtype=np.int8))
    with pytest.raises(ValueError, match="row 1"):
        load_npz(p, split="random")


# ---------------------------------------------------------------------------------- edge lists
_LINES = ["10,20", "20,30", "30,10", "30,30", "40,10", "20,10"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("header", [True, False], ids=["header", "noheader"])
@pytest.mark.parametrize("sep", [",", "\t", " "], ids=["csv", "tsv", "space"])
def test_edgelist_formats_parse_the_same(tmp_path, newline, header, sep):
    lines = ([f"src{sep}dst"] if header else []) + [ln.replace(",", sep) for ln in _LINES]
    p = tmp_path / "edges.txt"
    p.write_bytes((newline.join(lines) + newline).encode())
    ds = load(f"edgelist:{p}", seed=0, feature_dim=4, num_classes=3)
    assert ds.num_nodes == 4 and ds.node_ids.tolist() == [10, 20, 30, 40]
    # 10-20 (twice, both directions), 20-30, 30-10, 40-10; 30-30 dropped as a self-loop
    assert _edge_set(ds.graph) == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2), (3, 0), (0, 3)}
    assert ds.synthetic_features and ds.synthetic_labels
    assert ds.features.shape == (4, 4) and int(ds.labels.max()) < 3


def test_edgelist_large_ids_directed_and_comments(tmp_path):
    big = 10**14
    p = tmp_path / "edges.csv"
    p.write_text(f"# a comment\n{big + 7},{big}\n{big},5\n5,5\n\n{big + 7},5,0.25\n")
    ds = load_edgelist(p, symmetric=False, remove_self_loops=False)
    assert ds.node_ids.tolist() == [5, big, big + 7]
    # remapped ids: 5 -> 0, big -> 1, big+7 -> 2; the third column (a weight) is ignored
    assert _edge_set(ds.graph) == {(2, 1), (1, 0), (0, 0), (2, 0)}
    assert ds.meta["file_edges"] == 4


def test_edgelist_seeded_random_data_and_errors(tmp_path):
    p = tmp_path / "e.tsv"
    p.write_text("1\t2\n2\t3\n")
    a, b = load_edgelist(p, seed=3), load_edgelist(p, seed=3)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,x\n")
    with pytest.raises(ValueError, match="two integer columns"):
        load_edgelist(bad)
    one = tmp_path / "one.csv"
    one.write_text("17\n")
    with pytest.raises(ValueError, match="fewer than two fields"):
        load_edgelist(one)
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no edges"):
        load_edgelist(empty)


def test_edgelist_bio_pathways_real_file():
    path = _data_file("bio-pathways-network.csv")
    ds = load(f"edgelist:{path}")
    assert ds.num_nodes == 21557
    # 342,353 undirected lines, 3,717 of them self-loops: the rest in both directions
    assert ds.num_edges == 2 * (342353 - 3717)
    assert int(ds.node_ids.max()) > 10**8 and bool((ds.node_ids[1:] > ds.node_ids[:-1]).all())
    assert ds.synthetic_features and ds.synthetic_labels
    _assert_simple_symmetric(ds.graph)


# ---------------------------------------------------------------------------------- errors
def test_unknown_name_lists_accepted_names():
    with pytest.raises(ValueError) as e:
        load("cora")
    for n in NAMES:
        assert n in str(e.value)
    with pytest.raises(ValueError, match="no path"):
        load("npz:")
    with pytest.raises(ValueError, match="ogbn-mag is not supported"):
        load("ogbn-mag")
    with pytest.raises(ValueError, match="unknown OGB dataset"):
        load("ogbn-nope")
    with pytest.raises(TypeError, match="num_nodez"):
        load("synthetic", num_nodez=10)


def test_missing_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(f"npz:{tmp_path / 'nope.npz'}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(f"edgelist:{tmp_path / 'nope.csv'}")


def _tiny_parts(n=6):
    g = Graph.from_edges(torch.arange(n - 1), torch.arange(1, n), num_nodes=n, symmetric=True)
    return dict(graph=g, features=torch.zeros(n, 3), labels=torch.arange(n) % 2,
                train_idx=torch.tensor([0, 1]), val_idx=torch.tensor([2]), test_idx=torch.tensor([3]),
                num_classes=2, name="tiny")


def test_dataset_validation_errors():
    Dataset(**_tiny_parts())  # the valid baseline
    feats = torch.zeros(6, 3)
    feats[4, 1] = float("nan")
    with pytest.raises(ValueError, match="row 4"):
        Dataset(**{**_tiny_parts(), "features": feats})
    feats[4, 1] = float("inf")
    with pytest.raises(ValueError, match="row 4"):
        Dataset(**{**_tiny_parts(), "features": feats})
    with pytest.raises(ValueError, match=r"labels\[5\] = 7"):
        Dataset(**{**_tiny_parts(), "labels": torch.tensor([0, 1, 0, 1, 0, 7])})
    with pytest.raises(ValueError, match="id 9"):
        Dataset(**{**_tiny_parts(), "test_idx": torch.tensor([9])})
    with pytest.raises(ValueError, match="5 rows"):
        Dataset(**{**_tiny_parts(), "features": torch.zeros(5, 3)})
    with pytest.raises(ValueError, match="disjoint"):
        Dataset(**{**_tiny_parts(), "val_idx": torch.tensor([1])})
    with pytest.raises(ValueError, match="no label"):
        Dataset(**{**_tiny_parts(), "labels": torch.tensor([0, -1, 0, 1, 0, 1])})
    with pytest.raises(TypeError, match="float32"):
        Dataset(**{**_tiny_parts(), "features": torch.zeros(6, 3, dtype=torch.float64)})


# ---------------------------------------------------------------------------------- OGB, offline
def _write_csv_gz(path: Path, arr, fmt: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, np.asarray(arr), fmt=fmt, delimiter=",")


def _write_tiny_arxiv(root: Path, n=40, e=100, with_release=False):
    """A few dozen vertices in ogbn-arxiv's raw layout, so ogb processes it without downloading."""
    d = root / "ogbn_arxiv"
    rng = np.random.default_rng(0)
    edges = rng.integers(0, n, (e, 2))
    _write_csv_gz(d / "raw" / "edge.csv.gz", edges, "%d")
    _write_csv_gz(d / "raw" / "num-node-list.csv.gz", [[n]], "%d")
    _write_csv_gz(d / "raw" / "num-edge-list.csv.gz", [[e]], "%d")
    feats = rng.standard_normal((n, 8)).astype(np.float32)
    _write_csv_gz(d / "raw" / "node-feat.csv.gz", feats, "%.6f")
    labels = rng.integers(0, 40, (n, 1))
    _write_csv_gz(d / "raw" / "node-label.csv.gz", labels, "%d")
    _write_csv_gz(d / "raw" / "node_year.csv.gz", rng.integers(2000, 2020, (n, 1)), "%d")
    perm = rng.permutation(n)
    for kind, idx in (("train", perm[:20]), ("valid", perm[20:30]), ("test", perm[30:])):
        _write_csv_gz(d / "split" / "time" / f"{kind}.csv.gz", idx[:, None], "%d")
    if with_release:
        (d / "RELEASE_v1.txt").write_text("tiny test copy\n")
    return edges, feats, labels[:, 0], perm


@pytest.fixture
def offline(monkeypatch):
    """Fail loudly on any network connection or stdin prompt; returns the list of attempts."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted in an offline test")

    def no_stdin(*args, **kwargs):
        attempts.append(("input",) + args)
        raise EOFError("stdin prompt in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(builtins, "input", no_stdin)
    return attempts


@pytest.mark.parametrize("with_release", [False, True], ids=["no-release-file", "release-file"])
def test_ogb_offline_tiny_arxiv(tmp_path, offline, with_release):
    pytest.importorskip("ogb", reason="the ogb extra is not installed")
    edges, feats, labels, perm = _write_tiny_arxiv(tmp_path, with_release=with_release)
    ds = load("ogbn-arxiv", root=tmp_path, download=False)
    assert ds.name == "ogbn-arxiv" and ds.num_nodes == 40 and ds.num_classes == 40
    assert torch.allclose(ds.features, torch.from_numpy(feats), atol=1e-5)
    assert ds.labels.tolist() == labels.tolist()
    assert sorted(ds.train_idx.tolist()) == sorted(perm[:20].tolist())
    assert ds.val_idx.numel() == 10 and ds.test_idx.numel() == 10
    expected = {(int(s), int(d)) for s, d in edges if s != d} | {(int(d), int(s)) for s, d in edges if s != d}
    assert _edge_set(ds.graph) == expected  # made symmetric, self-loops and repeats dropped
    # second load goes through ogb's processed file (torch.load, which fails with weights_only=True)
    assert (tmp_path / "ogbn_arxiv" / "processed" / "data_processed").exists()
    again = load_ogb("ogbn-arxiv", root=tmp_path, download=False)
    assert torch.equal(again.graph.indices, ds.graph.indices) and torch.equal(again.features, ds.features)
    directed = load_ogb("ogbn-arxiv", root=tmp_path, download=False, symmetric=False, remove_self_loops=False)
    assert directed.num_edges == len({(int(s), int(d)) for s, d in edges})
    assert offline == [], f"network or stdin was touched: {offline}"
    # the stand-ins inside ogb are gone again
    import ogb.nodeproppred.dataset as ds_mod

    assert ds_mod.torch is torch and "input" not in vars(ds_mod) and "print" not in vars(ds_mod)


def test_ogb_missing_without_download(tmp_path, offline, monkeypatch):
    pytest.importorskip("ogb", reason="the ogb extra is not installed")
    with pytest.raises(FileNotFoundError, match="download=False"):
        load_ogb("ogbn-products", root=tmp_path, download=False)
    monkeypatch.setenv("GSPLIT_DATA", str(tmp_path / "envroot"))
    assert ogb_loader.default_root() == tmp_path / "envroot"
    with pytest.raises(FileNotFoundError, match="envroot"):
        load_ogb("ogbn-arxiv", download=False)
    assert offline == []


def test_ogb_missing_package_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ogb", None)
    monkeypatch.setitem(sys.modules, "ogb.nodeproppred", None)
    with pytest.raises(ImportError, match=r"pip install gsplit\[ogb\]"):
        load_ogb("ogbn-arxiv", download=False)
