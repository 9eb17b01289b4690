import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gsplit import Graph


def test_from_edges_builds_csc_in_edges():
    g = Graph.from_edges([0, 1, 2, 2], [1, 2, 0, 1])
    assert g.num_nodes == 3 and g.num_edges == 4
    assert g.in_neighbors(1).tolist() == [0, 2]
    assert g.in_degrees().tolist() == [1, 2, 1]
    assert g.edge_dst().tolist() == [0, 1, 1, 2]


def test_symmetric_dedup_and_self_loops():
    g = Graph.from_edges([0, 0, 1, 1, 2], [1, 1, 0, 1, 0], symmetric=True, remove_self_loops=True)
    # 0<->1 given both ways and twice, 2->0: symmetric, deduplicated, self-loop 1->1 dropped
    assert sorted(zip(g.indices.tolist(), g.edge_dst().tolist())) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    dup = Graph.from_edges([0, 0], [1, 1])
    assert dup.num_edges == 2
    assert Graph.from_edges([0, 0], [1, 1], remove_duplicates=True).num_edges == 1


def test_isolated_vertices_and_num_nodes():
    g = Graph.from_edges([0], [1], num_nodes=5)
    assert g.num_nodes == 5 and g.in_degrees().tolist() == [0, 1, 0, 0, 0]


@pytest.mark.parametrize("src,dst,n,msg", [
    ([0, 5], [1, 2], 4, "vertex id 5"),
    ([0, -1], [1, 2], None, "negative"),
    ([0, 1], [1], None, "src has 2"),
    ([], [], 0, "at least one vertex"),
])
def test_bad_edge_lists(src, dst, n, msg):
    with pytest.raises(ValueError, match=msg):
        Graph.from_edges(src, dst, num_nodes=n)


def test_float_ids_rejected():
    with pytest.raises(TypeError):
        Graph.from_edges(np.array([0.5]), np.array([1.0]))


def test_from_csc_validation():
    with pytest.raises(ValueError, match="outside"):
        Graph.from_csc([0, 1, 2], [0, 7])
    with pytest.raises(ValueError, match="non-decreasing"):
        Graph.from_csc([0, 2, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        Graph.from_csc([0, 1, 3], [0, 1])


def test_from_scipy_matches_edges():
    m = sp.coo_matrix((np.ones(3), ([0, 1, 2], [1, 2, 0])), shape=(4, 4))
    g = Graph.from_scipy(m)
    assert g.num_nodes == 4
    assert sorted(zip(g.indices.tolist(), g.edge_dst().tolist())) == [(0, 1), (1, 2), (2, 0)]
    assert (g.to_scipy() != m.tocsc()).nnz == 0
    with pytest.raises(ValueError, match="square"):
        Graph.from_scipy(sp.coo_matrix((2, 3)))


def test_check_ids():
    g = Graph.from_edges([0], [1], num_nodes=3)
    g.check_ids(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="id 3 but the graph has 3 vertices"):
        g.check_ids(torch.tensor([3]), "seeds")


def test_save_load_mmap_roundtrip(tmp_path):
    g = Graph.from_edges(torch.randint(0, 50, (300,)), torch.randint(0, 50, (300,)), 50)
    g.save(tmp_path / "g")
    for mmap in (True, False):
        h = Graph.load(tmp_path / "g", mmap=mmap)
        assert torch.equal(h.indptr, g.indptr) and torch.equal(h.indices, g.indices)
        assert h.fingerprint() == g.fingerprint()
    with pytest.raises(FileNotFoundError):
        Graph.load(tmp_path / "nothing")


def test_fingerprint_changes_with_structure():
    a = Graph.from_edges([0, 1], [1, 2])
    b = Graph.from_edges([0, 2], [1, 1])
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == Graph.from_edges([1, 0], [2, 1]).fingerprint()  # edge order does not matter
