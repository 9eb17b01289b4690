"""Full-graph training across hosts with shared preloading (gsplit.fullgraph.preload): exact with the full halo.

Several "hosts" are simulated as in tests/launcher/test_multihost.py: one launch whose ranks are cut into
consecutive host groups (``gsplit.host_groups(ranks_per_host=G)``). Each host trains its inner vertices plus
their L-hop halo over its own ranks; gradients are summed over every rank. The reference is
tests/fullgraph/test_full_graph.py's single-process training on one block of the whole graph.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.fullgraph.hosts import check_halo_options, host_subgraph
from gsplit.fullgraph.preload import PreloadLoader
from gsplit.launcher import launch
from gsplit.nn import split_cross_entropy
from gsplit.partitioning import partition_full_graph
from gsplit.sampling.block import Block
from parity_helpers import random_graph_problem, rel_err
from test_full_graph import FEAT_DIM, LAYERS, NUM_NODES, STEPS, make_problem, new_model, reference, whole_graph_block

MODELS = ("sage", "gcn", "gat")


def host_map(graph, hosts):
    return partition_full_graph(graph, hosts, seed=1)


def preload_worker(rank, world_size, ranks_per_host, models=MODELS, overlap=False, empty_host=False):
    graph, feats, labels, train_idx = make_problem()
    host, world = gsplit.host_groups(ranks_per_host=ranks_per_host)
    hmap = torch.zeros(graph.num_nodes, dtype=torch.int64) if empty_host else \
        host_map(graph, world_size // ranks_per_host)
    loader = PreloadLoader(graph, LAYERS, host_map=hmap, group=host,
                           replica_group=world, features=feats, labels=labels, train_idx=train_idx, overlap=overlap)
    results = {"host": loader.host, "inner": loader.share.num_inner, "halo": loader.share.num_halo,
               "rows": loader.blocks[-1].num_loss_rows}
    for name in models:
        model = new_model(name)
        loader.check_model(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses, grads = [], []
        for _ in range(STEPS):
            for _, output_nodes, blocks in loader:
                opt.zero_grad()
                logits = loader.forward(model) if overlap else model(blocks, blocks[0].srcdata["feat"])
                loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
                loss.backward()
                allreduce_gradients(model, world)
                losses.append(global_sum(loss, world))
                grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
                opt.step()
        results[name] = {"losses": losses, "grads": grads, "outputs": output_nodes.tolist()}
    return results


def check(per_rank, hosts, ranks_per_host, models=MODELS, empty_host=False):
    graph, _, _, train_idx = make_problem()
    hmap = torch.zeros(graph.num_nodes, dtype=torch.int64) if empty_host else host_map(graph, hosts).assignment
    assert [r["host"] for r in per_rank] == [r // ranks_per_host for r in range(hosts * ranks_per_host)]
    # the loss rows are the training vertices, each counted by its own host only
    assert sum(r["rows"] for r in per_rank) == train_idx.numel()
    for h in range(hosts):
        assert per_rank[h * ranks_per_host]["inner"] == int((hmap == h).sum())
    for name in models:
        ref = reference(name)
        for h in range(hosts):  # a host's ranks cover its share, each vertex once
            outs = sorted(v for r in per_rank[h * ranks_per_host:(h + 1) * ranks_per_host] for v in r[name]["outputs"])
            assert len(outs) == len(set(outs)) == per_rank[h * ranks_per_host]["inner"] + \
                per_rank[h * ranks_per_host]["halo"]
        for step in range(STEPS):
            for r, res in enumerate(per_rank):
                case = f"{name}, {hosts} hosts x {ranks_per_host}, rank {r}, step {step}"
                assert abs(res[name]["losses"][step] - ref["losses"][step]) <= 1e-10 * abs(ref["losses"][step]), case
                for n, g_ref in ref["grads"][step].items():
                    assert rel_err(res[name]["grads"][step][n], g_ref) < 1e-10, f"{case}: gradient of {n}"


def test_two_hosts_of_two_ranks_equal_one_process():
    check(launch(preload_worker, 4, args=(2,)), hosts=2, ranks_per_host=2)


def test_three_hosts_of_one_rank_equal_one_process():
    check(launch(preload_worker, 3, args=(1,)), hosts=3, ranks_per_host=1)


def test_a_host_without_vertices_still_runs_every_step():
    check(launch(preload_worker, 4, args=(2, ("sage",), False, True)), hosts=2, ranks_per_host=2, models=("sage",),
          empty_host=True)


@pytest.mark.slow
def test_overlapped_forward_on_a_host_share():
    check(launch(preload_worker, 4, args=(2, ("sage", "gat"), True)), hosts=2, ranks_per_host=2, models=("sage", "gat"))


# ---------------------------------------------------------------------------------------------- the share itself
def share_block(share) -> Block:
    g = share.graph
    return Block(src_nodes=share.nodes, num_dst=g.num_nodes, edge_src=g.indices.clone(), edge_dst=g.edge_dst(),
                 edge_ids=share.edge_ids)


def sparse_problem():
    """Few edges: a host's 3-hop halo is a part of the other hosts' vertices, not all of them."""
    graph, feats, labels, _ = random_graph_problem(NUM_NODES, 150, FEAT_DIM, 3, seed=9, isolated=4)
    return graph, feats, labels, None


@pytest.mark.parametrize("problem", [make_problem, sparse_problem])
@pytest.mark.parametrize("name", MODELS)
def test_full_halo_gives_the_inner_vertices_their_whole_graph_outputs(name, problem):
    graph, feats, _, _ = problem()
    hmap = host_map(graph, 3).assignment
    model = new_model(name).eval()
    whole = model([whole_graph_block(graph)] * LAYERS, feats)
    covered = halo = 0
    for h in range(3):
        share = host_subgraph(graph, hmap, h, LAYERS)
        out = model([share_block(share)] * LAYERS, feats[share.nodes])
        inner = share.inner
        assert torch.allclose(out[inner], whole[share.nodes[inner]], rtol=1e-12, atol=1e-12), f"host {h}"
        assert share.hops.max() <= LAYERS
        # a vertex L hops out is an input only: it keeps no in-edge
        assert bool((share.graph.in_degrees()[share.hops == LAYERS] == 0).all())
        covered += share.num_inner
        halo += share.num_halo
    assert covered == NUM_NODES
    if problem is sparse_problem:
        assert halo < 2 * NUM_NODES  # not every other host's vertex is in the halo: the pruning is tested


def test_expansion_aware_sampling_bounds_the_halo_deterministically():
    graph, _, _, _ = make_problem()
    hmap = host_map(graph, 2).assignment
    full = host_subgraph(graph, hmap, 0, LAYERS)
    a = host_subgraph(graph, hmap, 0, LAYERS, external_hops=1, external_fanout=2, seed=4)
    b = host_subgraph(graph, hmap, 0, LAYERS, external_hops=1, external_fanout=2, seed=4)
    assert torch.equal(a.nodes, b.nodes) and torch.equal(a.edge_ids, b.edge_ids)
    assert int(a.hops.max()) == 1 and a.num_inner == full.num_inner and a.num_halo <= full.num_halo
    # external vertices keep at most 2 in-edges from external vertices; inner vertices keep all of theirs
    dst = a.graph.edge_dst()
    ext = (a.hops[dst] > 0) & (a.hops[a.graph.indices] > 0)
    assert int(torch.bincount(dst[ext], minlength=a.nodes.numel()).max()) <= 2
    deg = graph.in_degrees()
    assert torch.equal(a.graph.in_degrees()[a.inner], deg[a.nodes[a.inner]])
    wide = host_subgraph(graph, hmap, 0, LAYERS, external_hops=LAYERS, external_fanout=2, seed=4)
    other = host_subgraph(graph, hmap, 0, LAYERS, external_hops=LAYERS, external_fanout=2, seed=5)
    assert wide.num_halo <= full.num_halo and wide.graph.num_edges < full.graph.num_edges
    assert not torch.equal(wide.edge_ids, other.edge_ids)  # the seed picks


@pytest.mark.parametrize("hops,fanout,msg", [(0, None, "external_hops=0"), (1, 0, "external_fanout=0")])
def test_bad_halo_options_are_refused(hops, fanout, msg):
    with pytest.raises(ValueError, match=msg):
        check_halo_options(LAYERS, hops, fanout)


def test_resuming_with_another_halo_bound_is_refused():
    from gsplit.run.resume import compare_runs

    check = compare_runs({"config": {"external_hops": None}}, {"config": {"external_hops": 1}})
    assert check.refused == ["--external-hops None -> 1"]
