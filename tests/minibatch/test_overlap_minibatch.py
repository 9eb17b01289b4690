"""Overlapped layers in split-parallel mini-batch training (gsplit.minibatch.overlap) equal the plain split path.

Every rank trains the same steps twice, with a plain loader and with ``overlap=True``, on the same
partition map: the sampled edges are the same, the losses agree to rounding and so do the gradients
(float64, relative 1e-12: the two parts of a layer multiply fewer rows by the weights than the whole
layer, and a BLAS product's row may change in the last bit with the row count; gradients of weights and
of input rows read by both parts are sums of two partial sums). The overlapped path must really overlap:
one asynchronous all-to-all per layer but the last, forward and backward, counted under its own tag.
"""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy
from gsplit.sampling.block import Block

# the parity tests' problem (a small graph with isolated vertices, float64 features) and sizes
from test_split_parity import BATCH, DROPOUT, FANOUTS, FEAT_DIM, ITERS, NUM_CLASSES, make_problem

TOL = 1e-12


def make_maps(graph, train_idx, world_size):
    maps = {"random": torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))}
    if world_size > 1:
        starved = maps["random"].clone()
        starved[train_idx] = starved[train_idx] % (world_size - 1)  # the last rank owns no target
        maps["starved"] = starved
        # everything on rank 0 but the targets' own vertices: rank 0's rows are nearly all interior
        lopsided = torch.zeros(graph.num_nodes, dtype=torch.long)
        lopsided[train_idx[: 2 * BATCH]] = torch.arange(2 * BATCH) % world_size
        maps["lopsided"] = lopsided
    return maps


def train(model_name, graph, feats, labels, train_idx, owner, world_size, overlap):
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner,
                        use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats,
                        labels=labels, overlap=overlap)
    comm = loader.comm
    out = {"losses": [], "grads": [], "edges": [], "calls": [], "parts": []}
    for step, (_, _, blocks) in enumerate(loader):
        if step == ITERS:
            break
        if loader.overlap:  # a single rank makes no plans (nothing to hide): its batches run the plain path
            out["parts"].append([(b.overlap.num_interior, b.overlap.boundary_block.num_dst) for b in blocks[:-1]])
        before = dict(comm.traffic.calls)
        opt.zero_grad()
        loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        out["calls"].append({t: n - before.get(t, 0) for t, n in comm.traffic.calls.items() if n != before.get(t, 0)})
        allreduce_gradients(model, comm)
        out["losses"].append(global_sum(loss, comm))
        out["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()})
        out["edges"].append([sorted(b.edge_ids.tolist()) for b in blocks])
        opt.step()
    return out


def rank_worker(rank, world_size, models=("sage", "gat", "gcn")):
    graph, feats, labels, train_idx = make_problem()
    results = {}
    for map_name, owner in make_maps(graph, train_idx, world_size).items():
        for model_name in models:
            results[(map_name, model_name)] = {
                overlap: train(model_name, graph, feats, labels, train_idx, owner, world_size, overlap)
                for overlap in (False, True)}
    return results


def rel_err(a, b, floor=1e-4):
    return float((a - b).norm() / b.norm().clamp_min(floor))


def check(per_rank, world_size):
    layers = len(FANOUTS)
    for case_key in per_rank[0]:
        case = f"{case_key[1]} on the {case_key[0]} map at world size {world_size}"
        for r, res in enumerate(per_rank):
            plain, over = res[case_key][False], res[case_key][True]
            for it in range(ITERS):
                assert over["edges"][it] == plain["edges"][it], f"{case}: rank {r} sampled other edges"
                assert abs(over["losses"][it] - plain["losses"][it]) <= TOL * abs(plain["losses"][it]), case
                for name, g in plain["grads"][it].items():
                    err = rel_err(over["grads"][it][name], g)
                    assert err < TOL, f"{case}: gradient of {name} on rank {r} differs at iteration {it} ({err:.1e})"
                calls = over["calls"][it]
                if world_size == 1:  # no collective at all, overlapped or not
                    assert calls == plain["calls"][it] == {}, (calls, plain["calls"][it])
                    continue
                for i in range(1, layers):
                    for way in ("fwd", "bwd"):
                        assert calls.get(f"shuffle/layer{i}/overlap/{way}") == 1, f"{case}: {calls}"
                    # the layer shuffles all went asynchronous: no blocking shuffle of layer i is left
                    assert f"shuffle/layer{i}/fwd" not in calls and f"shuffle/layer{i}/bwd" not in calls, calls
                # the plain path issued its blocking shuffles, the same number of collectives
                assert sum(calls.values()) == sum(plain["calls"][it].values()), (calls, plain["calls"][it])
    return per_rank


def test_one_rank_overlap_equals_plain():
    per_rank = check([rank_worker(0, 1)], 1)
    assert per_rank[0][("random", "sage")][True]["parts"] == [], "one rank has no shuffle to overlap: no plans"


def test_two_ranks_overlap_equals_plain():
    per_rank = check(launch(rank_worker, 2), 2)
    parts = [p for r in per_rank for key, res in r.items() for p in res[True]["parts"]]
    flat = [pair for it in parts for pair in it]
    # the maps give both kinds of part and both empty kinds, so each case below was exercised
    assert any(ni > 0 and nb > 0 for ni, nb in flat), flat
    assert any(nb == 0 for _, nb in flat), "no layer without boundary rows was exercised"
    assert any(ni == 0 for ni, _ in flat), "no layer without interior rows was exercised"


@pytest.mark.slow
def test_three_ranks_overlap_equals_plain():
    check(launch(rank_worker, 3), 3)


# ---------------------------------------------------------------------------------------------- units
def test_parts_split_the_block_destinations_and_edges():
    """Outside any process group: the plan's two blocks are the block's destinations and edges, split."""
    from gsplit.comm.communicator import Communicator
    from gsplit.split.split_sampling import sp_sample

    graph, _, _, train_idx = make_problem()
    owner = torch.zeros(graph.num_nodes, dtype=torch.long)
    batch = sp_sample(graph, train_idx[:20], owner, gsplit.NeighborSampler(FANOUTS, seed=3), Communicator(),
                      overlap=True)
    plain = sp_sample(graph, train_idx[:20], owner, gsplit.NeighborSampler(FANOUTS, seed=3), Communicator())
    assert batch.blocks[-1].overlap is None
    for b, p in zip(batch.blocks, plain.blocks):
        assert sorted(b.edge_ids.tolist()) == sorted(p.edge_ids.tolist())
        if b.overlap is None:
            continue
        ib, bb = b.overlap.interior_block, b.overlap.boundary_block
        assert torch.equal(ib.dst_nodes, b.dst_nodes[:ib.num_dst])
        assert torch.equal(bb.dst_nodes, b.dst_nodes[ib.num_dst:])
        assert torch.equal(bb.src_nodes, b.src_nodes) and torch.equal(ib.src_nodes, b.src_nodes)
        global_edges = lambda blk: sorted(zip(blk.src_nodes[blk.edge_src].tolist(),  # noqa: E731
                                              blk.dst_nodes[blk.edge_dst].tolist()))
        assert sorted(global_edges(ib) + global_edges(bb)) == global_edges(b)
        # a moved block keeps its plan, its parts re-cut from the moved edges (views on a GPU too)
        moved = b.to("cpu")
        assert moved.overlap.boundary_block.dst_start == ib.num_dst
        assert torch.equal(moved.overlap.boundary_block.edge_ids, bb.edge_ids)


@pytest.mark.parametrize("n_own,n_int,n_kept_boundary", [(50, 20, 7), (30, 0, 5), (30, 30, 0), (40, 12, 0),
                                                         (40, 12, 28), (0, 0, 0)])
def test_assembly_fields_equal_a_sort_of_the_kept_rows(n_own, n_int, n_kept_boundary):
    """The plan's assembly fields (a scatter and a prefix-sum compaction) are those a sort of the kept rows gives:
    each interior row's place, then the kept boundary rows in row order with theirs."""
    from gsplit.minibatch.overlap import _assembly_fields, _kept_places

    g = torch.Generator().manual_seed(n_own + n_int + n_kept_boundary)
    boundary = n_int + torch.randperm(n_own - n_int, generator=g)[:n_kept_boundary]
    keep_idx = torch.cat([torch.arange(n_int), boundary])[torch.randperm(n_int + n_kept_boundary, generator=g)]
    keep_pos = torch.randperm(3 * n_own + 1, generator=g)[:keep_idx.numel()]
    fields = _assembly_fields(keep_idx, keep_pos, n_int, n_own)
    kept, order = torch.sort(keep_idx)
    assert not (_kept_places(keep_idx, n_own)[:n_int] < 0).any()
    assert torch.equal(fields["interior_pos"], keep_pos[order[:n_int]])
    assert torch.equal(fields["keep_boundary_idx"], kept[n_int:] - n_int)
    assert torch.equal(fields["keep_boundary_pos"], keep_pos[order[n_int:]])
    if n_int:  # an interior row that is not kept shows (plan_overlap refuses such a plan: not sp_sample's)
        places = _kept_places(keep_idx[keep_idx != n_int - 1], n_own)
        assert (places[:n_int] < 0).nonzero().flatten().tolist() == [n_int - 1]


def test_plan_refuses_blocks_sampled_without_overlap():
    from gsplit.minibatch.overlap import plan_overlap

    idx = gsplit.ShuffleIndex(send_idx=torch.arange(1), send_counts=[1], recv_pos=torch.arange(1), recv_counts=[1],
                              num_local=1, num_mixed=1)
    b = Block(src_nodes=torch.tensor([0]), num_dst=1, edge_src=torch.tensor([0]), edge_dst=torch.tensor([0]),
              edge_ids=torch.tensor([0]), shuffle_index=idx)
    with pytest.raises(ValueError, match="overlap=True"):
        plan_overlap([b, b], 0)


# ---------------------------------------------------------------------------------------------- trainer
def _train_both(rank, world_size, ds, owner):
    from gsplit.run.trainer import TrainConfig, train_rank

    logs = {}
    for overlap, prefetch in ((False, False), (True, True)):
        cfg = TrainConfig(model="gat", fanouts=[4, 3, 2], batch_size=16, hidden=8, epochs=1, system="split", seed=5,
                          eval_every=0, final_eval=False, device="cpu", heads=2, max_iters=4, overlap=overlap,
                          prefetch=prefetch)
        logs[overlap] = train_rank(rank, world_size, cfg, ds, owner)
    return logs


def test_trainer_overlaps_when_asked_and_logs_the_overlapped_collectives():
    """``TrainConfig(overlap=True)`` (``gsplit train --overlap``), with prefetch: same loss, and every
    iteration's ``collectives`` counts the asynchronous shuffles in place of the blocking ones."""
    import dataclasses

    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    ds = dataclasses.replace(ds, train_idx=ds.train_idx[:160])
    owner = torch.randint(0, 2, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    out = launch(_train_both, 2, args=(ds, owner))
    for rank, logs in enumerate(out):
        plain, over = (logs[k]["epochs"][0] for k in (False, True))
        assert over["loss"] == pytest.approx(plain["loss"], rel=1e-5)  # float32
        for p_it, o_it in zip(plain["ranks"][rank]["per_iteration"], over["ranks"][rank]["per_iteration"]):
            tags = o_it["collectives_by_tag"]
            assert {t for t in tags if "/overlap/" in t} == {f"shuffle/layer{i}/overlap/{w}" for i in (1, 2)
                                                             for w in ("fwd", "bwd")}, tags
            # the layer shuffles (not layer 0's: the feature shuffle) all went asynchronous
            assert not any(t.startswith(("shuffle/layer1/", "shuffle/layer2/")) and "/overlap/" not in t
                           for t in tags), tags
            assert o_it["collectives"] == p_it["collectives"], (tags, p_it["collectives_by_tag"])


# ---------------------------------------------------------------------------------------------- host syncs
def _syncs(rank, world_size):
    """Host-device syncs of forward + backward, plain and overlapped (CPU tensors stand for device ones)."""
    from gsplit.ops.sync_counter import HostSyncCounter

    graph, feats, labels, train_idx = make_problem()
    owner = torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))
    out = {}
    for overlap in (False, True):
        loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                            batch_size=BATCH, shuffle=True, features=feats, labels=labels, overlap=overlap)
        _, _, blocks = next(iter(loader))
        torch.manual_seed(0)
        model = build_model("gat", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2, dropout=DROPOUT)
        counter = HostSyncCounter(cpu_is_device=True)
        with counter:
            logits = model(blocks, blocks[0].srcdata["feat"].float())
            split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
        out[overlap] = [(e.kind, e.site) for e in counter.events]
    return out


def test_overlapped_forward_and_backward_add_no_host_sync():
    """Sizes come from the plan (python ints): between starting an all-to-all and waiting for it nothing
    is read from the device, so on NCCL the host never blocks in the overlapped layers."""
    for rank, out in enumerate(launch(_syncs, 2)):
        assert len(out[True]) <= len(out[False]), (rank, out)
        assert not [site for _, site in out[True] if "overlap.py" in site], (rank, out[True])


def test_boundary_rows_are_sent_before_the_interior_computes(monkeypatch):
    """G3's order, forward and backward (one process: the exchanges still start and wait): each layer's
    all-to-all starts before its interior part computes and is waited for after it; in backward the
    gradients start back before the interior part's backward runs, which ends before the wait."""
    from gsplit.comm.communicator import Communicator
    from gsplit.minibatch.overlap import AsyncRows
    from gsplit.split.split_sampling import sp_sample

    graph, feats, labels, train_idx = make_problem()
    owner = torch.zeros(graph.num_nodes, dtype=torch.long)
    blocks = sp_sample(graph, train_idx[:20], owner, gsplit.NeighborSampler(FANOUTS, seed=3), Communicator(),
                       overlap=True).blocks
    events = []
    start, wait = AsyncRows.start, AsyncRows.wait
    monkeypatch.setattr(AsyncRows, "start", lambda self, rows, s, r, tag: (events.append(("start", tag)),
                                                                           start(self, rows, s, r, tag))[1])
    monkeypatch.setattr(AsyncRows, "wait", lambda self: (events.append(("wait", self.tag)), wait(self))[1])
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), dropout=DROPOUT).double()
    for i, layer in enumerate(model.layers[:-1]):
        inner = layer.combine

        def combine(block, sources, _inner=inner, _i=i):
            if block is blocks[_i].overlap.interior_block:
                events.append(("interior forward", _i))
                # views read by the interior part only: their gradients are complete after its backward
                sources = tuple(t.view_as(t) for t in sources)
                sources[0].register_hook(lambda g: events.append(("interior backward", _i)))
            return _inner(block, sources)

        layer.combine = combine
    x = feats[blocks[0].src_nodes].requires_grad_()
    model(blocks, x).sum().backward()
    at = {e: k for k, e in enumerate(events)}
    for i in range(len(FANOUTS) - 1):
        fwd, bwd = f"shuffle/layer{i + 1}/overlap/fwd", f"shuffle/layer{i + 1}/overlap/bwd"
        assert at[("start", fwd)] < at[("interior forward", i)] < at[("wait", fwd)], events
        assert at[("start", bwd)] < at[("interior backward", i)] < at[("wait", bwd)], events


def test_trainer_default_follows_the_measurement():
    """On for SAGE and GCN, off for GAT (experiments/README.md, "Overlapped layers"); an explicit choice wins."""
    from gsplit.run.trainer import TrainConfig

    assert TrainConfig(model="sage").overlap and TrainConfig(model="gcn").overlap
    assert not TrainConfig(model="gat").overlap
    assert TrainConfig(model="gat", overlap=True).overlap and not TrainConfig(model="sage", overlap=False).overlap


def test_recomputed_layers_run_the_plain_path(monkeypatch):
    """Layers under recompute_layers recompute their forward in backward; overlapped parts would bypass it."""
    from gsplit.comm.communicator import Communicator
    from gsplit.fullgraph.loader import recompute_layers
    from gsplit.minibatch.overlap import AsyncRows
    from gsplit.split.split_sampling import sp_sample

    graph, feats, _, train_idx = make_problem()
    blocks = sp_sample(graph, train_idx[:20], torch.zeros(graph.num_nodes, dtype=torch.long),
                       gsplit.NeighborSampler(FANOUTS, seed=3), Communicator(), overlap=True).blocks
    starts = []
    start = AsyncRows.start
    monkeypatch.setattr(AsyncRows, "start", lambda self, *a: (starts.append(a[-1]), start(self, *a))[1])
    for recompute in (False, True):
        starts.clear()
        model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS)).double()
        if recompute:
            recompute_layers(model)
        model(blocks, feats[blocks[0].src_nodes]).sum().backward()
        assert len(starts) == (0 if recompute else 2 * (len(FANOUTS) - 1)), (recompute, starts)


def _placed_against_copied(rank, world_size, extensions=True):
    """One overlapped step of each model twice on the same blocks: the models' ``between`` (which takes ``place``,
    so the interior rows are written straight into the next layer's input, and at two ranks the boundary rows in
    send order) and the same step behind a wrapper without it (the rows copied in by the assembly and gathered
    for the send). ``extensions=False``: the torch fallbacks, the ops a CUDA rank runs (``place_rows``, torch's
    SAGE concatenation with its ones column)."""
    import os

    from gsplit.minibatch import overlap
    from gsplit.nn.forward import sp_forward

    if not extensions:
        os.environ["GSPLIT_NO_EXTENSIONS"] = "1"  # this worker process only
    graph, feats, labels, train_idx = make_problem()
    owner = make_maps(graph, train_idx, world_size)["random"]
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                        batch_size=BATCH, shuffle=True, features=feats, labels=labels, overlap=True)
    _, _, blocks = next(iter(loader))
    modes, assemble = [], overlap._Assemble.apply
    # (placed, in_send_order) of every assembly; this process only
    overlap._Assemble.apply = lambda *args: (modes.append(tuple(args[6:8])), assemble(*args))[1]
    out = {}
    for name in ("sage", "gat", "gcn"):
        torch.manual_seed(0)
        model = build_model(name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2, dropout=DROPOUT)
        model = model.double().train()
        model.step = 1
        for placed in (True, False):
            between = model.between if placed else (lambda i, h, block: model.between(i, h, block))
            model.zero_grad()
            logits = model.output(sp_forward(model.layers, blocks[0].srcdata["feat"], blocks, between=between,
                                             group=loader.comm))
            loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
            loss.backward()
            out[(name, placed)] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return out, modes


@pytest.mark.parametrize("extensions", [True, False])
def test_placed_interior_rows_have_the_bits_of_the_copied_ones(extensions):
    """Writing an overlapped layer's interior rows straight to their places (``between(..., place=...)``), and at
    two ranks its boundary rows in send order, computes exactly what copying them does: the same loss and
    gradients, bit for bit (float64, dropout on), with the compiled kernels and with the torch fallbacks."""
    for out, modes in launch(_placed_against_copied, 2, args=(extensions,)):
        # both paths ran, per model and layer: placed with the boundary rows in send order, and copied
        assert modes == ([(True, True)] * 2 + [(False, False)] * 2) * 3, modes
        for name in ("sage", "gat", "gcn"):
            (loss_p, grads_p), (loss_c, grads_c) = out[(name, True)], out[(name, False)]
            assert torch.equal(loss_p, loss_c), name
            assert all(torch.equal(grads_p[k], grads_c[k]) for k in grads_c), name
