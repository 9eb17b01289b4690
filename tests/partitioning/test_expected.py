"""Expected pre-sampling weights (presample(method="expected")) against exact enumeration and the sampler.

Two references:
* ``enumerate_expectations`` walks every outcome of the sampling process on a tiny graph (every batch of
  an epoch, every neighbour choice of every frontier vertex at every layer) and averages exactly, so
  the closed form must equal it to float precision wherever its one assumption (independence) holds:
  one layer with fixed targets, trees (undirected, fixed targets), forests with one training vertex
  per tree (random batches, short last batch included).
* 200 epochs of the real sampler (``method="sampled"``) on sparse random graphs, where independence
  holds approximately: every weight must agree within sampling error (tolerances below).
"""

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from gsplit.data.graph import Graph
from gsplit.partitioning import presample
from gsplit.partitioning.expected import batch_mixture, expected_presample, reverse_edges
from gsplit.sampling import NeighborSampler


# ---------------------------------------------------------------------------------------------- exact reference
def _choices(in_edges, fanout, replace):
    """Every pick of one frontier vertex with its probability: tuples of edge ids (with repeats when
    sampling with replacement)."""
    deg = len(in_edges)
    if deg == 0:
        return [((), 1.0)]
    if fanout == -1 or (not replace and deg <= fanout):
        return [(tuple(in_edges), 1.0)]
    if replace:
        return [(t, deg ** -fanout) for t in itertools.product(in_edges, repeat=fanout)]
    subsets = list(itertools.combinations(in_edges, fanout))
    return [(s, 1.0 / len(subsets)) for s in subsets]


def enumerate_expectations(g: Graph, train, fanouts, replace, batch_size):
    """Exact per-mini-batch expectations of what pre-sampling counts, averaged over an epoch's batches."""
    n, L = g.num_nodes, len(fanouts)
    indptr, src = g.indptr.tolist(), g.indices.tolist()
    in_edges = [list(range(indptr[v], indptr[v + 1])) for v in range(n)]
    levels = np.zeros((L + 1, n))
    loads = np.zeros((L, n))
    edges = np.zeros(g.num_edges)
    train = sorted(int(t) for t in train)
    for size, share in batch_mixture(len(train), batch_size):
        batches = list(itertools.combinations(train, size))  # a batch of `size` is a uniform subset
        for batch in batches:
            frontier = {frozenset(batch): share / len(batches)}  # distribution over frontier sets
            for v in batch:
                levels[L, v] += share / len(batches)
            for layer in reversed(range(L)):
                nxt = defaultdict(float)
                for front, prob in frontier.items():
                    order = sorted(front)
                    options = [_choices(in_edges[d], fanouts[layer], replace) for d in order]
                    for combo in itertools.product(*options):
                        p = prob * math.prod(c[1] for c in combo)
                        picked = [e for c in combo for e in c[0]]
                        for e in picked:
                            edges[e] += p
                        for d, c in zip(order, combo):
                            loads[layer, d] += p * len(c[0])
                        nxt[front | {src[e] for e in picked}] += p
                frontier = nxt
                for front, prob in frontier.items():
                    for v in front:
                        levels[layer, v] += prob
    return levels, loads, edges


def assert_exact(g, train, fanouts, replace, batch_size):
    levels, loads, edges = enumerate_expectations(g, train, fanouts, replace, batch_size)
    w = presample(g, torch.as_tensor(train), NeighborSampler(fanouts, replace=replace), batch_size, method="expected")
    np.testing.assert_allclose(w.level_vertex_weights.numpy(), levels, atol=1e-6)
    np.testing.assert_allclose(w.layer_edge_load.numpy(), loads, atol=1e-6)
    np.testing.assert_allclose(w.edge_weights.numpy(), edges, atol=1e-6)
    np.testing.assert_allclose(w.vertex_weights.numpy(), levels.sum(0), atol=1e-5)
    return w


def test_enumeration_reference_hand_checked():
    # path 0 - 1 - 2 - 3, target 0, one neighbour per layer, three layers: level 1 = {0, 1} u {2 w.p. 1/2}
    # (1 picks 0 or 2); level 0 adds 2 w.p. 1/4 more (1 picks it now) and 3 w.p. 1/4 (2 present, picks 3)
    g = Graph.from_edges([0, 1, 2], [1, 2, 3], symmetric=True)
    levels, loads, edges = enumerate_expectations(g, [0], [1, 1, 1], False, 1)
    assert levels.tolist() == [[1, 1, 0.75, 0.25], [1, 1, 0.5, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert loads[0].tolist() == [1, 1, 0.5, 0] and edges.sum() == pytest.approx(loads.sum())


# ---------------------------------------------------------------------------------------------- exact cases
@pytest.mark.parametrize("fanout,replace", [(1, False), (2, False), (2, True), (-1, False)])
def test_single_layer_with_fixed_targets_is_exact(fanout, replace):
    # a directed graph with a cycle, a vertex of in-degree 0 and a self loop; the batch holds every target
    g = Graph.from_edges([1, 2, 3, 0, 4, 2, 5, 5, 3], [0, 0, 0, 1, 1, 3, 3, 2, 3], num_nodes=6)
    assert_exact(g, [0, 1, 3], [fanout], replace, batch_size=3)


@pytest.mark.parametrize("fanouts,replace", [([1, 1, 1], False), ([2, 1, 2], False), ([1, 2, 1], True)])
def test_undirected_tree_with_fixed_targets_is_exact(fanouts, replace):
    # the messages leave out the edge back to the vertex they are sent to, which makes trees exact
    #       0
    #     / | \
    #    1  2  3
    #   / \     \
    #  4   5     6
    g = Graph.from_edges([0, 0, 0, 1, 1, 3], [1, 2, 3, 4, 5, 6], symmetric=True)
    assert_exact(g, [0, 5], fanouts, replace, batch_size=2)


def test_directed_tree_is_exact():
    # every vertex has one out-edge (child -> parent): its only way in is through its parent
    g = Graph.from_edges([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 3], num_nodes=7)
    assert_exact(g, [0], [1, 2, 1], False, batch_size=1)
    assert_exact(g, [0], [2, 1, 2], True, batch_size=1)


def test_forest_with_one_training_vertex_per_tree_is_exact_with_random_batches():
    # three trees, one training vertex each; batches of 2 from 3 targets: a full batch and a short one
    # per epoch, which the expectation must average as the sampled counts do (half each)
    g = Graph.from_edges([0, 0, 1, 3, 4, 6], [1, 2, 7, 4, 5, 8], num_nodes=9, symmetric=True)  # {0,1,2,7} {3,4,5} {6,8}
    assert batch_mixture(3, 2) == [(2, 0.5), (1, 0.5)]
    assert_exact(g, [0, 3, 8], [1, 2], False, batch_size=2)


def test_single_layer_counts_are_linear_and_exact_with_random_batches():
    # for one layer the edge counts and loads are linear in the target probabilities: exact for any
    # batch; level 0 is not (targets of one batch are not independent), and that is not asserted
    g = Graph.from_edges([1, 2, 3, 0, 4, 2, 5], [0, 0, 0, 1, 1, 3, 3], num_nodes=6)
    levels, loads, edges = enumerate_expectations(g, [0, 1, 3], [1], False, 2)
    w = presample(g, torch.tensor([0, 1, 3]), NeighborSampler([1]), 2, method="expected")
    np.testing.assert_allclose(w.edge_weights.numpy(), edges, atol=1e-6)
    np.testing.assert_allclose(w.layer_edge_load.numpy(), loads, atol=1e-6)
    np.testing.assert_allclose(w.level_vertex_weights[1].numpy(), levels[1], atol=1e-6)


# ---------------------------------------------------------------------------------------------- against the sampler
def sparse_random_graph(n, avg_degree, seed):
    rng = np.random.default_rng(seed)
    m = n * avg_degree // 2
    return Graph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), num_nodes=n, symmetric=True,
                            remove_self_loops=True)


@pytest.mark.parametrize("fanouts,replace", [([3, 3, 3], False), ([3, 3, 3], True), ([2, -1], False)])
def test_agrees_with_200_sampled_epochs(fanouts, replace):
    """Tolerance: a vertex's count at a level over N mini-batches is a sum of 0/1 indicators, so its
    mean has standard error at most sqrt(p (1 - p) / N) (less, in fact: within an epoch a target is in
    exactly one batch). An edge is counted at most ``L`` times per batch without replacement (``L *
    fanout`` with), so Var <= max * mean. Each value must lie within 5 standard errors (with 1,000
    vertices x 4 levels, a normal deviate passes 5 with probability ~1 - 2e-3 overall), plus 1e-4 for
    float32 rounding; and the mean of the standardised differences over all vertices of a level, which
    an independence bias would shift by several units (the simple recurrence without the reverse-edge
    correction gives -5 at the input level here), must stay within 0.25."""
    g = sparse_random_graph(1000, 6, seed=4)
    train = torch.from_numpy(np.random.default_rng(5).choice(1000, 100, replace=False))
    sampler = NeighborSampler(fanouts, replace=replace, seed=11)
    batch = 16  # 7 batches per epoch, the last one of 4 targets
    sampled = presample(g, train, sampler, batch, epochs=200, seed=2)
    expected = presample(g, train, sampler, batch, method="expected")
    N = sampled.num_batches
    assert N == 200 * 7 and expected.num_batches == 0 and expected.metadata["method"] == "expected"
    for level in range(len(fanouts) + 1):
        s = sampled.level_vertex_weights[level].double().numpy()
        e = expected.level_vertex_weights[level].double().numpy()
        se = np.sqrt(e * (1 - e) / N)
        assert np.all(np.abs(s - e) <= 5 * se + 1e-4), (level, np.abs(s - e).max())
        z = (s - e) / np.maximum(se, 1e-9)
        assert abs(z[se > 0].mean()) < 0.25, (level, z[se > 0].mean())
    top = len(fanouts)
    np.testing.assert_allclose(expected.level_vertex_weights[top].numpy(), sampled.level_vertex_weights[top].numpy(),
                               rtol=1e-5)  # each target is in exactly one batch per epoch: 1 / 7
    bound = len(fanouts) * (max(fanouts) if replace else 1)
    s, e = sampled.edge_weights.double().numpy(), expected.edge_weights.double().numpy()
    assert np.all(np.abs(s - e) <= 5 * np.sqrt(bound * e / N) + 1e-4), np.abs(s - e).max()
    s, e = sampled.layer_edge_load.double().numpy(), expected.layer_edge_load.double().numpy()
    cap = np.array([max(f, 1) if f > 0 else 50 for f in fanouts])[:, None]  # loads per batch <= fanout (deg for -1)
    assert np.all(np.abs(s - e) <= 5 * np.sqrt(cap * e / N) + 1e-4), np.abs(s - e).max()
    # every edge of a block is an in-edge of its destination: loads and edge weights have one total
    assert expected.layer_edge_load.sum().item() == pytest.approx(expected.edge_weights.sum().item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------- plumbing
def test_reverse_edges_general_and_symmetric():
    sym = Graph.from_edges([0, 1, 1, 3], [1, 2, 3, 0], symmetric=True)
    rev = reverse_edges(sym.indptr.numpy(), sym.indices.numpy())
    dst = sym.edge_dst().numpy()
    src = sym.indices.numpy()
    assert np.array_equal(src[rev], dst) and np.array_equal(dst[rev], src)
    # directed, unsorted in-edge lists: reverse where it exists, -1 elsewhere
    g = Graph.from_csc(torch.tensor([0, 2, 3, 4]), torch.tensor([2, 1, 0, 0]))  # 2->0, 1->0, 0->1, 0->2
    assert reverse_edges(g.indptr.numpy(), g.indices.numpy()).tolist() == [3, 2, 1, 0]
    g = Graph.from_csc(torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0]))  # 1->0, 0->2: no reverses
    assert reverse_edges(g.indptr.numpy(), g.indices.numpy()).tolist() == [-1, -1]


def test_expected_needs_a_neighbor_sampler_and_a_known_method():
    g = Graph.from_edges([0, 1], [1, 2], symmetric=True)

    class Custom:
        fanouts = [2]

        def sample_blocks(self, graph, seeds, epoch=0, iteration=0):
            return NeighborSampler([2]).sample_blocks(graph, seeds, epoch, iteration)

    with pytest.raises(ValueError, match="NeighborSampler, got Custom; pass method='sampled'"):
        presample(g, torch.tensor([0]), Custom(), 1, method="expected")
    with pytest.raises(ValueError, match="unknown pre-sampling method 'exact'"):
        presample(g, torch.tensor([0]), NeighborSampler([2]), 1, method="exact")
    with pytest.raises(ValueError, match="num_parts=0"):
        presample(g, torch.tensor([0]), NeighborSampler([2]), 1, num_parts=0, method="expected")
    w = expected_presample(g, torch.tensor([0, 1]), NeighborSampler([2]), batch_size=1)
    assert w.batch_size == 1 and w.epochs == 0 and w.fanouts == [2] and w.graph_fingerprint == g.fingerprint()
    assert w.vertex_weights.dtype == torch.float32 and w.edge_weights.shape == (g.num_edges,)


def test_num_parts_sets_the_global_batch():
    g = sparse_random_graph(200, 4, seed=1)
    train = torch.arange(0, 200, 3)
    s = NeighborSampler([3, 2])
    a = presample(g, train, s, batch_size=8, num_parts=4, method="expected")
    b = presample(g, train, s, batch_size=32, method="expected")
    assert a.batch_size == b.batch_size == 32
    assert torch.equal(a.level_vertex_weights, b.level_vertex_weights) and torch.equal(a.edge_weights, b.edge_weights)
    assert (a.metadata["num_parts"], a.metadata["batch_size_per_rank"]) == (4, 8)
    c = presample(g, train, s, batch_size=8, num_parts=4, epochs=1)
    d = presample(g, train, s, batch_size=32, epochs=1)
    assert torch.equal(c.edge_weights, d.edge_weights) and c.num_batches == d.num_batches == 3
