import itertools

import numpy as np
import pytest
import scipy.stats
import torch

from gsplit import Graph, NeighborSampler
from gsplit.ops import counter_rng, relabel


def star_graph(deg):
    """Vertex 0 has in-edges from 1..deg."""
    return Graph.from_edges(torch.arange(1, deg + 1), torch.zeros(deg, dtype=torch.int64), deg + 1)


def random_graph(n=400, m=4000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edges(torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g), n)


def test_mix64_matches_python_reference():
    vals = [0, 1, 2**63 - 1, -(2**63), 123456789, -5]
    got = counter_rng.mix64(torch.tensor(vals, dtype=torch.int64)).tolist()
    want = [counter_rng._signed(counter_rng.mix64_int(v & ((1 << 64) - 1))) for v in vals]
    assert got == want


def test_picks_distinct_and_bounded():
    g = random_graph()
    s = NeighborSampler([5])
    nodes = torch.arange(g.num_nodes)
    out = s.sample_neighbors(g, nodes, 0, 0, 0)
    counts = torch.bincount(out.dst_index, minlength=g.num_nodes)
    assert torch.equal(counts, torch.clamp(g.in_degrees(), max=5))
    pairs = out.edge_ids.tolist()
    assert len(pairs) == len(set(pairs)), "an edge was picked twice without replacement"
    # each picked edge really is an in-edge of its destination
    assert torch.equal(g.edge_dst()[out.edge_ids], nodes[out.dst_index])
    assert torch.equal(g.indices[out.edge_ids], out.src)


def test_uniform_without_replacement():
    """Every 3-subset of a vertex's 6 in-edges is equally likely (chi-square over the 20 subsets)."""
    g = star_graph(6)
    s = NeighborSampler([3], seed=5)
    counts = {c: 0 for c in itertools.combinations(range(6), 3)}
    trials = 4000
    for t in range(trials):
        out = s.sample_neighbors(g, torch.tensor([0]), 0, 0, t)
        counts[tuple(sorted(out.edge_ids.tolist()))] += 1
    obs = np.array(list(counts.values()))
    p = scipy.stats.chisquare(obs).pvalue
    assert p > 1e-4, f"subset frequencies are not uniform: {obs}"


def test_uniform_per_position_with_replacement_and_large_degree():
    g = star_graph(50)
    s = NeighborSampler([10], replace=True, seed=1)
    hits = torch.zeros(50)
    for t in range(600):
        out = s.sample_neighbors(g, torch.tensor([0]), 0, 1, t)
        assert out.edge_ids.numel() == 10
        hits += torch.bincount(out.edge_ids, minlength=50)
    assert scipy.stats.chisquare(hits.numpy()).pvalue > 1e-4


def test_reproducible_and_independent_of_order_and_grouping():
    g = random_graph()
    s = NeighborSampler([4], seed=9)
    nodes = torch.randperm(g.num_nodes)[:100]

    def as_set(out, nodes):
        return set(zip(nodes[out.dst_index].tolist(), out.edge_ids.tolist()))

    ref = as_set(s.sample_neighbors(g, nodes, 0, 2, 3), nodes)
    assert ref == as_set(s.sample_neighbors(g, nodes, 0, 2, 3), nodes)
    perm = nodes[torch.randperm(100)]
    assert ref == as_set(s.sample_neighbors(g, perm, 0, 2, 3), perm)
    a, b = nodes[:37], nodes[37:]
    assert ref == as_set(s.sample_neighbors(g, a, 0, 2, 3), a) | as_set(s.sample_neighbors(g, b, 0, 2, 3), b)
    # another iteration, epoch or seed changes the picks
    assert ref != as_set(s.sample_neighbors(g, nodes, 0, 2, 4), nodes)
    assert ref != as_set(NeighborSampler([4], seed=10).sample_neighbors(g, nodes, 0, 2, 3), nodes)


def test_fanout_all_neighbours():
    g = random_graph()
    out = NeighborSampler([-1]).sample_neighbors(g, torch.tensor([3, 7]), 0, 0, 0)
    want = torch.cat([torch.arange(g.indptr[3], g.indptr[4]), torch.arange(g.indptr[7], g.indptr[8])])
    assert torch.equal(out.edge_ids, want)


def test_sample_blocks_structure():
    g = random_graph()
    s = NeighborSampler([5, 3, 2])
    seeds = torch.tensor([5, 1, 9, 100])
    blocks = s.sample_blocks(g, seeds, epoch=0, iteration=0)
    assert [b.layer for b in blocks] == [0, 1, 2]
    assert torch.equal(blocks[-1].dst_nodes, seeds)
    for lower, upper in zip(blocks[:-1], blocks[1:]):
        assert torch.equal(lower.dst_nodes, upper.src_nodes)  # a layer's outputs feed the next one
    for b in blocks:
        assert torch.equal(b.src_nodes[: b.num_dst], b.dst_nodes)
        assert torch.unique(b.src_nodes).numel() == b.num_src_nodes()
        # local edges point at the right global edges
        assert torch.equal(b.src_nodes[b.edge_src], g.indices[b.edge_ids])
        assert torch.equal(b.dst_nodes[b.edge_dst], g.edge_dst()[b.edge_ids])
        assert bool((b.edge_dst[1:] >= b.edge_dst[:-1]).all())


def test_relabel():
    src_nodes, local = relabel(torch.tensor([9, 4]), torch.tensor([4, 7, 1, 7, 9]))
    assert src_nodes.tolist() == [9, 4, 1, 7]
    assert torch.equal(src_nodes[local], torch.tensor([4, 7, 1, 7, 9]))


@pytest.mark.parametrize("fanouts,msg", [([], "empty"), ([5, -2], "fanouts\\[1\\] = -2"), ([0], "fanouts\\[0\\] = 0")])
def test_bad_fanouts(fanouts, msg):
    with pytest.raises(ValueError, match=msg):
        NeighborSampler(fanouts)


def test_bad_seeds():
    g = random_graph()
    s = NeighborSampler([2])
    with pytest.raises(ValueError, match="id 400"):
        s.sample_blocks(g, torch.tensor([400]))
    with pytest.raises(ValueError, match="repeated"):
        s.sample_blocks(g, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="layer=3"):
        s.sample_neighbors(g, torch.tensor([1]), 3, 0, 0)


def test_dense_and_sorted_relabel_agree():
    g = torch.Generator().manual_seed(3)
    dst = torch.randperm(1000, generator=g)[:50]
    src = torch.randint(0, 1000, (400,), generator=g)
    dense = relabel(dst, src, num_nodes=1000)          # small graph: dense tables
    by_sort = relabel(dst, src)                        # no num_nodes: sort-based
    assert torch.equal(dense[0], by_sort[0]) and torch.equal(dense[1], by_sort[1])
    assert torch.equal(dense[0][: dst.numel()], dst)
