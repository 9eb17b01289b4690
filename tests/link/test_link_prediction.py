"""Link prediction is exact: split training over 1-4 ranks and any partition map scores the same pairs and
negatives and computes the same loss, gradients and parameters as one process on the whole global
mini-batch of edges (SAGE/GAT/GCN, dot and MLP predictors, every ``exclude`` mode, uniform, global-uniform
and callable negatives, macrobatches, SplitParallel, an uneven last batch).

Each world size is one launch; every rank trains every (map, case) for a whole epoch inside it.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.link import as_edge_prediction_sampler, edge_endpoints, negative, pair_rows
from gsplit.link.exclude import ExcludingSampler, reduced_in_edges
from link_helpers import BATCH, NUM_TRAIN, make_problem, rank_worker, train_reference
from parity_helpers import rel_err


def check_world(world_size: int, per_rank) -> None:
    graph, feats, train_eids, reverse_eids = make_problem()
    refs = {}
    for (map_name, case), rank0 in per_rank[0].items():
        if case not in refs:
            refs[case] = train_reference(case, graph, feats, train_eids, reverse_eids, world_size)
        ref = refs[case]
        what = f"{case.name()} on the {map_name} map at world size {world_size}"
        iters = len(ref["losses"])
        assert len(rank0["losses"]) == iters, what
        assert ref["eids"][-1].numel() == NUM_TRAIN - (iters - 1) * BATCH * world_size < BATCH * world_size
        for it in range(iters):
            for kind in ("pos", "neg"):
                # every pair of the global mini-batch scored by exactly one rank, at its global position
                scored = sorted(p for r in per_rank for p in r[(map_name, case)][kind][it])
                assert scored == ref[kind][it], f"{what}: {kind} pairs of iteration {it} differ"
            for layer in range(len(ref["edges"][it])):
                edges = sorted(e for r in per_rank for e in r[(map_name, case)]["edges"][it][layer])
                assert edges == ref["edges"][it][layer], f"{what}: layer {layer} edges of iteration {it}"
            assert abs(rank0["losses"][it] - ref["losses"][it]) <= 1e-10 * abs(ref["losses"][it]), what
            for name, g_ref in ref["grads"][it].items():
                for r, res in enumerate(per_rank):
                    assert rel_err(res[(map_name, case)]["grads"][it][name], g_ref) < 1e-10, \
                        f"{what}: gradient of {name} on rank {r}, iteration {it}"
        for r, res in enumerate(per_rank):
            assert res[(map_name, case)]["scorers_ok"], f"{what}: rank {r} scored a pair whose source it does not own"
        for name, p_ref in ref["params"].items():
            assert rel_err(rank0["params"][name], p_ref) < 1e-10, f"{what}: parameter {name} drifted"


def test_one_rank_matches_the_reference():
    check_world(1, [rank_worker(0, 1)])


def test_two_ranks_match_the_reference():
    check_world(2, launch(rank_worker, 2))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3, 4])
def test_three_and_four_ranks_match_the_reference(world_size):
    check_world(world_size, launch(rank_worker, world_size))


# ---------------------------------------------------------------------- the reference itself, independently
def test_reference_pairs_negatives_and_exclusion():
    """The single-process mini-batch: positives are the edges' endpoints, Uniform's negatives keep the source,
    excluded edges (and reverses) appear in no block, and every other in-edge of a target can still be picked."""
    graph, _, train_eids, rev = make_problem()
    eids = train_eids[:9]
    s = as_edge_prediction_sampler(gsplit.NeighborSampler([-1, -1]), exclude="reverse_id", reverse_eids=rev,
                                   negative_sampler=negative.Uniform(3))
    _, pos, neg, blocks = s.sample(graph, eids, epoch=2, iteration=4)
    dst_all = graph.edge_dst()
    u, v = pos.global_edges()
    assert torch.equal(u, graph.indices[eids]) and torch.equal(v, dst_all[eids])
    nu, nv = neg.global_edges()
    assert torch.equal(nu, u.repeat_interleave(3)) and nv.numel() == 27
    excluded = torch.cat([eids, rev[eids]])
    for b in blocks:
        assert not torch.isin(b.edge_ids, excluded).any()
    # fanout -1: the top block holds every other in-edge of the targets
    top = blocks[-1]
    expected = torch.nonzero(torch.isin(dst_all, top.dst_nodes) & ~torch.isin(torch.arange(graph.num_edges),
                                                                                excluded)).squeeze(1)
    assert sorted(top.edge_ids.tolist()) == expected.tolist()
    # counter-based: the same call gives the same negatives; another iteration others
    again = s.sample(graph, eids, epoch=2, iteration=4).neg_pair_graph.global_edges()[1]
    other = s.sample(graph, eids, epoch=2, iteration=5).neg_pair_graph.global_edges()[1]
    assert torch.equal(again, nv) and not torch.equal(other, nv)


def test_excluding_sampler_picks_fanout_among_the_rest():
    """Exclusion comes before the picks (DGL's exclude_edges): a vertex keeps its full fanout when enough
    in-edges remain, and never picks an excluded one."""
    graph = gsplit.Graph.from_edges(torch.arange(1, 9), torch.zeros(8, dtype=torch.int64), 9)
    excluded = torch.tensor([0, 1, 2, 3, 4])
    s = ExcludingSampler(gsplit.NeighborSampler([2], seed=1), {0: reduced_in_edges(graph, excluded)})
    for it_seed in range(5):
        s.seed = it_seed
        picked = s.sample_neighbors(graph, torch.tensor([0, 3]), 0, 0, 0)
        assert picked.edge_ids.numel() == 2 and not torch.isin(picked.edge_ids, excluded).any()
    # all picks (fanout -1) of vertices with and without lost edges, in any order: every remaining in-edge,
    # grouped by destination in the given order, each destination's in CSC order
    graph, _, train_eids, rev = make_problem()
    excluded = torch.unique(torch.cat([train_eids[:15], rev[train_eids[:15]]]))
    s = ExcludingSampler(gsplit.NeighborSampler([-1]), {3: reduced_in_edges(graph, excluded)})
    nodes = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))[:70]
    got = s.sample_neighbors(graph, nodes, 0, 0, 3)
    want = [e for v in nodes.tolist() for e in range(int(graph.indptr[v]), int(graph.indptr[v + 1]))
            if e not in set(excluded.tolist())]
    assert got.edge_ids.tolist() == want
    assert torch.equal(got.src, graph.indices[got.edge_ids]) and bool((got.dst_index.diff() >= 0).all())


def test_global_uniform_avoids_edges_and_self_loops():
    graph, _, train_eids, _ = make_problem()
    zeros = torch.zeros(10, dtype=torch.int64)  # endpoints of the positives: GlobalUniform does not use them
    u, v = negative.GlobalUniform(4).sample(graph, train_eids[:10], zeros, zeros, key=11)
    assert u.numel() == 40 and bool((u != v).all())
    keys = set((graph.edge_dst() * graph.num_nodes + graph.indices).tolist())
    assert not any(int(b) * graph.num_nodes + int(a) in keys for a, b in zip(u, v))
    assert len(set(zip(u.tolist(), v.tolist()))) == 40


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here: the GPU generator's case runs where one is"))])
def test_callable_negatives_seed_and_restore_the_generator(device):
    """A DGL-protocol sampler draws the same pairs for the same counters (on a GPU graph from that GPU's
    generator) and leaves the caller's generator state as it was."""
    graph = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
    weights = torch.arange(1.0, 5.0, device=device)
    neg = negative.as_negative_sampler(
        lambda g, e: (e.repeat(3) % 4, weights.multinomial(3 * len(e), replacement=True)))
    eids = torch.tensor([0, 1])
    gen = torch.cuda if device == "cuda" else torch
    if device == "cuda":
        torch.zeros(1, device=device)  # CUDA in use, as in a rank that trains on its GPU
    before = gen.get_rng_state()
    a = neg.sample(graph, eids, eids, eids, key=11)
    after = gen.get_rng_state()
    b = neg.sample(graph, eids, eids, eids, key=11)
    assert torch.equal(before, after)
    assert torch.equal(a[1], b[1]) and a[1].device.type == device
    assert not all(torch.equal(neg.sample(graph, eids, eids, eids, key=k)[1], a[1]) for k in range(12, 16))


def test_metrics_match_ogb_definitions():
    from gsplit.link import hits_at_k, mrr
    pos = torch.tensor([3.0, 1.0, 2.0])
    neg = torch.tensor([[1.0, 2.0], [2.0, 3.0], [2.0, 0.0]])   # ranks 1, 3, 1.5 (a tie counts half)
    assert mrr(pos, neg) == pytest.approx((1 + 1 / 3 + 1 / 1.5) / 3)
    assert hits_at_k(pos, torch.tensor([2.5, 0.5]), 1) == pytest.approx(1 / 3)
    assert hits_at_k(pos, torch.tensor([0.5]), 2) == 1.0


# ---------------------------------------------------------------------- bad input: one clear line
def test_bad_input_says_what_is_wrong():
    graph, feats, train_eids, rev = make_problem()
    sampler = gsplit.NeighborSampler([2])
    es = as_edge_prediction_sampler(sampler, negative_sampler=negative.Uniform(1))
    with pytest.raises(ValueError, match=f"edge id {graph.num_edges} but the graph has {graph.num_edges} edges"):
        gsplit.DataLoader(graph, torch.tensor([0, graph.num_edges]), es, batch_size=2)
    with pytest.raises(ValueError, match="repeated edge ids"):
        gsplit.DataLoader(graph, torch.tensor([1, 1]), es, batch_size=2)
    with pytest.raises(ValueError, match="train_eids is empty"):
        gsplit.DataLoader(graph, torch.tensor([], dtype=torch.int64), es, batch_size=2)
    with pytest.raises(TypeError, match="integer edge ids"):
        gsplit.DataLoader(graph, torch.tensor([0.5]), es, batch_size=2)
    with pytest.raises(ValueError, match="exclude='reverse_id' needs reverse_eids"):
        as_edge_prediction_sampler(sampler, exclude="reverse_id")
    with pytest.raises(ValueError, match="exclude='both'; pass None, 'self' or 'reverse_id'"):
        as_edge_prediction_sampler(sampler, exclude="both")
    with pytest.raises(ValueError, match="reverse_eids has shape"):
        gsplit.DataLoader(graph, train_eids, as_edge_prediction_sampler(sampler, exclude="reverse_id",
                                                                        reverse_eids=rev[:3]), batch_size=2)
    for k in (0, 0.5, -2):
        with pytest.raises(ValueError, match="negative ratio k must be a whole number of at least 1"):
            negative.Uniform(k)
        with pytest.raises(ValueError, match="negative ratio k must be a whole number of at least 1"):
            negative.GlobalUniform(k)
    empty = gsplit.Graph.from_edges(torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), 5)
    with pytest.raises(ValueError, match="the graph has no edges"):
        gsplit.DataLoader(empty, torch.tensor([0]), es, batch_size=2)
    bad_neg = as_edge_prediction_sampler(sampler, negative_sampler=lambda g, e: (g.indices[e], e + 10_000))
    with pytest.raises(ValueError, match="negative sampler <lambda>'s dst contain id"):
        next(iter(gsplit.DataLoader(graph, train_eids, bad_neg, batch_size=2)))
    with pytest.raises(ValueError, match="h has 3 rows but the pair graph has"):
        _, pos, _, _ = next(iter(gsplit.DataLoader(graph, train_eids, es, batch_size=2)))
        pair_rows(torch.zeros(3, 2), pos)
    assert edge_endpoints(graph, train_eids[:1])[0].numel() == 1


def test_prefetch_and_no_negatives_yield_the_same_batches():
    """A prefetching loader yields the batches the inline one does; without a negative sampler the loader
    yields DGL's triple (input_nodes, pair_graph, blocks)."""
    graph, feats, train_eids, rev = make_problem()

    def epoch(prefetch, negatives):
        s = as_edge_prediction_sampler(gsplit.NeighborSampler([3, 2]), exclude="reverse_id", reverse_eids=rev,
                                       negative_sampler=negatives)
        loader = gsplit.DataLoader(graph, train_eids, s, batch_size=8, shuffle=True, features=feats,
                                   prefetch=prefetch)
        return [tuple(batch) for batch in loader]

    inline, ahead = epoch(False, negative.Uniform(2)), epoch(True, negative.Uniform(2))
    assert len(inline) == len(ahead) == (NUM_TRAIN + 7) // 8
    for (_, pos_a, neg_a, blocks_a), (_, pos_b, neg_b, blocks_b) in zip(inline, ahead):
        assert torch.equal(pos_a.src, pos_b.src) and torch.equal(neg_a.dst, neg_b.dst)
        assert all(torch.equal(a.edge_ids, b.edge_ids) for a, b in zip(blocks_a, blocks_b))
    triples = epoch(False, None)
    assert all(len(t) == 3 for t in triples)
    assert torch.equal(triples[0][1].edge_ids, inline[0][1].edge_ids)


def test_pyg_data_edge_ids_are_its_edge_index_columns():
    """A PyG Data in: train_eids and reverse_eids are edge_index columns; the pairs and the exclusion follow."""
    pyg_data = pytest.importorskip("torch_geometric.data")
    graph, feats, _, _ = make_problem()
    gen = torch.Generator().manual_seed(8)
    src, dst = graph.indices, graph.edge_dst()
    perm = torch.randperm(graph.num_edges, generator=gen)        # PyG's column order, not gsplit's
    edge_index = torch.stack([src[perm], dst[perm]])
    keys = {(int(u), int(v)): i for i, (u, v) in enumerate(edge_index.t().tolist())}
    reverse = torch.tensor([keys[(int(v), int(u))] for u, v in edge_index.t().tolist()])
    data = pyg_data.Data(edge_index=edge_index, x=feats, num_nodes=graph.num_nodes)
    train = torch.randperm(graph.num_edges, generator=gen)[:20]
    s = as_edge_prediction_sampler(gsplit.NeighborSampler([-1]), exclude="reverse_id", reverse_eids=reverse,
                                   negative_sampler=negative.Uniform(1))
    _, pos, _, blocks = next(iter(gsplit.DataLoader(data, train, s, batch_size=20)))
    u, v = pos.global_edges()
    assert torch.equal(u, edge_index[0, train]) and torch.equal(v, edge_index[1, train])
    excluded = {(int(a), int(b)) for a, b in edge_index[:, torch.cat([train, reverse[train]])].t().tolist()}
    picked = {(int(a), int(b)) for a, b in zip(blocks[0].src_nodes[blocks[0].edge_src].tolist(),
                                               blocks[0].dst_nodes[blocks[0].edge_dst].tolist())}
    assert picked and not picked & excluded
