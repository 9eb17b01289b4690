"""Macrobatches (``macrobatch=B``): B mini-batches sampled and loaded in one exchange train exactly as B = 1.

Every yielded mini-batch is the B = 1 one (same input nodes, blocks, shuffle plans and features), so losses,
gradients and parameters after several steps are equal bit for bit (float64), for split and data
parallelism, 1-4 ranks, SAGE/GAT/GCN with dropout; only the collectives differ: one id exchange per layer and
one feature shuffle per macrobatch. A run resumed from a checkpoint taken in the middle of a macrobatch ends
where an uninterrupted one ends.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import gsplit
from gsplit.baselines.data_parallel import DataParallelLoader
from gsplit.launcher import LaunchError, launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum
from gsplit.sampling.macrobatch import fit_macrobatch, macrobatch_groups, num_macrobatches
from gsplit.run.trainer import SYSTEMS, TrainConfig, train_rank
from test_collectives import CollectiveSpy
from test_split_parity import BATCH, DROPOUT, FANOUTS, FEAT_DIM, NUM_CLASSES, make_problem

MODELS = ("sage", "gat", "gcn")
FEATURE_SHUFFLE = "shuffle/layer0/fwd"
STEPS = 9  # more than an epoch at 2-4 ranks: full and partial macrobatches, and the next epoch's first


def batch_record(input_nodes, output_nodes, blocks) -> dict:
    """Everything a yielded mini-batch holds, to compare bit for bit."""
    plans = [None if b.shuffle_index is None else (b.shuffle_index.send_idx, b.shuffle_index.send_counts,
                                                    b.shuffle_index.recv_pos, b.shuffle_index.recv_counts)
             for b in blocks]
    return {"input_nodes": input_nodes, "output_nodes": output_nodes, "plans": plans,
            "blocks": [(b.src_nodes, b.edge_src, b.edge_dst, b.edge_ids, b.num_dst) for b in blocks],
            "feat": blocks[0].srcdata["feat"], "label": blocks[-1].dstdata["label"]}


def make_loader(system, graph, feats, labels, train_idx, owner, world_size, macrobatch, **options):
    common = dict(use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats, labels=labels,
                  macrobatch=macrobatch)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    if system == "dp":
        return DataParallelLoader(graph, train_idx, sampler, **common)
    return DataLoader(graph, train_idx, sampler, partition=owner, **common, **options)


def train(system, model_name, macrobatch, world_size, loads_union=None, **options) -> dict:
    """STEPS steps of SGD with dropout; per step the batch, the global loss and the gradients; the parameters."""
    graph, feats, labels, train_idx = make_problem()
    owner = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(5)) % world_size
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = make_loader(system, graph, feats, labels, train_idx, owner, world_size, macrobatch, **options)
    assert loader.macrobatch == macrobatch
    if loads_union is not None:  # what a GPU rank does (rows travel), on the CPU
        loader.loads_union = loads_union
    steps, rows = [], 0
    while len(steps) < STEPS:
        for input_nodes, output_nodes, blocks in loader:
            rows += loader.last_stats.input_rows
            opt.zero_grad()
            logits = model(blocks, blocks[0].srcdata["feat"])
            loss = SYSTEMS[system].loss(logits, blocks[-1].dstdata["label"], blocks[-1], world_size)
            loss.backward()
            allreduce_gradients(model, loader.comm)
            steps.append({"batch": batch_record(input_nodes, output_nodes, blocks),
                          "loss": global_sum(loss.detach(), loader.comm),
                          "grads": {n: p.grad.clone() for n, p in model.named_parameters()}})
            opt.step()
            if len(steps) == STEPS:
                break
    return {"steps": steps, "params": {n: p.detach().clone() for n, p in model.named_parameters()}, "rows": rows,
            "calls": dict(loader.comm.traffic.calls), "loads_union": loader.loads_union}


CASES = [("split", m, {"input_features": "shuffle"}) for m in MODELS] + \
        [("split", "sage", {"input_features": "direct", "overlap": True}),
         ("split", "gat", {"input_features": "direct", "loads_union": True}),
         ("split", "gcn", {"input_features": "shuffle", "prefetch": True})] + \
        [("dp", m, {}) for m in MODELS] + [("dp", "gcn", {"loads_union": True})]
"""Split: shuffled inputs (one feature all-to-all of the union), direct inputs (read batch by batch, or through the
union as a GPU would), prefetching; data parallelism (rows read batch by batch, or through the union)."""


def macrobatches_in(steps: int, world_size: int, size: int) -> int:
    """Macrobatches a loader prepares for ``steps`` steps, pass after pass (the last one cut short)."""
    _, _, _, train_idx = make_problem()
    per_epoch, total = -(-train_idx.numel() // (BATCH * world_size)), 0
    while steps > 0:
        total += num_macrobatches(0, min(steps, per_epoch), size)
        steps -= per_epoch
    return total


def both_sizes(rank, world_size, cases):
    return [{b: train(system, model, b, world_size, **options) for b in (1, 3)} for system, model, options in cases]


def assert_same(a, b, what):
    """Bit for bit: tensors with torch.equal, everything else with ==, recursively."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), what
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_same(a[k], b[k], f"{what}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


@pytest.mark.parametrize("world_size", [1, 2, pytest.param(3, marks=pytest.mark.slow),
                                        pytest.param(4, marks=pytest.mark.slow)])
def test_macrobatches_train_bit_for_bit_as_single_batches(world_size):
    cases = CASES if world_size > 1 else [c for c in CASES if not c[2].get("prefetch")]
    per_rank = launch(both_sizes, world_size, args=(cases,), devices="cpu") if world_size > 1 else \
        [both_sizes(0, 1, cases)]
    for r, results in enumerate(per_rank):
        for (system, model, options), res in zip(cases, results):
            case = f"{system} {model} {options} rank {r} of {world_size}"
            one, three = res[1], res[3]
            assert len(three["steps"]) == STEPS, case
            for it, (x, y) in enumerate(zip(one["steps"], three["steps"])):
                assert_same(x["batch"], y["batch"], f"{case}: the batch of step {it}")
                assert x["loss"] == y["loss"], f"{case}: the loss of step {it}"
                assert_same(x["grads"], y["grads"], f"{case}: the gradients of step {it}")
            assert_same(one["params"], three["params"], f"{case}: the parameters")
            if three["loads_union"]:  # a row several batches of a macrobatch need is loaded (and shuffled) once
                assert three["rows"] < one["rows"], (case, three["rows"], one["rows"])
            else:  # a CPU rank reading the table: each batch's rows when it is yielded
                assert three["rows"] == one["rows"], case
            if system == "split" and world_size > 1:
                # each macrobatch: one id exchange per exchanged layer and (shuffled inputs) one feature shuffle
                plain = lambda calls: {t: n for t, n in calls.items()  # noqa: E731
                                       if t.startswith("ids/") and not t.endswith("/overflow") or t == FEATURE_SHUFFLE}
                per_iteration, per_macrobatch = plain(one["calls"]), plain(three["calls"])
                assert per_iteration.keys() == per_macrobatch.keys(), case
                assert set(per_iteration.values()) == {STEPS}, case
                assert set(per_macrobatch.values()) == {macrobatches_in(STEPS, world_size, 3)}, case


def loader_passes(rank, world_size):
    """Per input mode and macrobatch size (1, 4): the collectives each ``next(loader)`` ran over an epoch (spied
    on ``torch.distributed`` itself), and the batches of a pass that starts at iteration 5."""
    graph, feats, labels, train_idx = make_problem()
    owner = torch.arange(graph.num_nodes) % world_size
    out = {}
    for input_features in ("shuffle", "direct"):
        for macrobatch in (1, 4):
            loader = make_loader("split", graph, feats, labels, train_idx, owner, world_size, macrobatch,
                                 input_features=input_features)
            spied, batches = [], iter(loader)
            while True:
                with CollectiveSpy() as spy:
                    if next(batches, None) is None:
                        break
                spied.append(spy.calls.get("all_to_all_single", 0))
            loader.set_epoch(1, 5)
            out[input_features, macrobatch] = {"spied": spied, "logged": dict(loader.comm.traffic.calls),
                                               "iterations": len(loader),
                                               "resumed": [batch_record(*batch) for batch in loader]}
    return out


@pytest.fixture(scope="module")
def two_rank_passes():
    return launch(loader_passes, 2, devices="cpu", timeout=180)


@pytest.mark.parametrize("input_features,exchanged", [("shuffle", 3 + 1), ("direct", 2)])
def test_a_macrobatch_exchanges_once_per_layer_and_shuffles_features_once(two_rank_passes, input_features,
                                                                          exchanged):
    """B = 4: the first batch of each macrobatch runs the id exchanges (one all-to-all per exchanged layer,
    plus one more per layer that outgrew its slots) and the feature shuffle of all four; the other three
    run no collective at all. B = 1 runs them every iteration."""
    for rank, out in enumerate(two_rank_passes):
        for macrobatch in (1, 4):
            res = out[input_features, macrobatch]
            n, spied = res["iterations"], res["spied"]
            logged = {tag: c for tag, c in res["logged"].items() if tag.startswith("ids/") or tag == FEATURE_SHUFFLE
                      or tag == FEATURE_SHUFFLE + "/overflow"}
            overflows = sum(c for tag, c in logged.items() if tag.endswith("/overflow"))
            assert len(spied) == n and sum(spied) == sum(logged.values()), (rank, res)
            assert sum(spied) == num_macrobatches(0, n, macrobatch) * exchanged + overflows, (rank, res)
            firsts = range(0, n, macrobatch)
            assert all(spied[it] >= exchanged for it in firsts), (rank, spied)
            assert all(spied[it] == 0 for it in range(n) if it not in firsts), (rank, spied)


def test_a_pass_starting_inside_a_macrobatch_yields_the_same_batches(two_rank_passes):
    """set_epoch(epoch, 5) with B = 4: a partial macrobatch (5, 6, 7), then whole ones; every batch the B = 1 one."""
    _, _, _, train_idx = make_problem()
    for rank, out in enumerate(two_rank_passes):
        for input_features in ("shuffle", "direct"):
            one, four = out[input_features, 1]["resumed"], out[input_features, 4]["resumed"]
            assert len(four) == len(one) == -(-train_idx.numel() // (2 * BATCH)) - 5
            assert_same(one, four, f"rank {rank}, {input_features}")


def test_macrobatches_are_aligned_to_iteration_numbers():
    pairs = [(it, torch.tensor([it])) for it in range(5, 14)]
    assert [[it for it, _ in g] for g in macrobatch_groups(iter(pairs), 4)] == [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
    assert num_macrobatches(5, 14, 4) == 3 and num_macrobatches(0, 8, 4) == 2 and num_macrobatches(3, 3, 4) == 0


# ---------------------------------------------------------------------------------------------- the trainer
class Stop(Exception):
    """Stands for the run being killed."""


def trainer_rank(rank, world_size, cfg, ds, owner, stop_after):
    """``train_rank``; with ``stop_after`` the run dies right after that many steps (after their checkpoint)."""
    if stop_after:
        import gsplit.run.trainer as trainer

        steps = []

        def report_progress():  # the trainer calls it after each step's checkpoint
            steps.append(1)
            if len(steps) == stop_after:
                raise Stop(f"killed after step {stop_after}")
        trainer.report_progress = report_progress
    train_rank(rank, world_size, cfg, ds, owner)
    model = torch.load(f"{cfg.checkpoint_dir}/model.pt", weights_only=True)["state_dict"] if rank == 0 else None
    return model


@pytest.mark.slow
def test_resume_in_the_middle_of_a_macrobatch_continues_exactly(tmp_path):
    """Two ranks, SAGE with dropout (overlapped) and Adam, 2 epochs of 5 iterations. Uninterrupted with B = 1 and
    B = 4, and with B = 4 killed after step 6 (checkpoint at step 6: epoch 1, iteration 1, inside the macrobatch
    of iterations 0-3) and resumed: the same final model, bit for bit."""
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    ds = dataclasses.replace(ds, train_idx=ds.train_idx[:160])
    owner = torch.randint(0, 2, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    base = TrainConfig(model="sage", fanouts=[4, 3], batch_size=16, hidden=8, epochs=2, system="split", seed=5,
                       eval_every=0, final_eval=False, device="cpu", dropout=0.3, checkpoint_every=3)

    def run(name, stop_after=0, **changes):
        cfg = dataclasses.replace(base, checkpoint_dir=str(tmp_path / name), **changes)
        return launch(trainer_rank, 2, args=(cfg, ds, owner, stop_after), devices="cpu", timeout=180)[0]

    single = run("single", macrobatch=1)
    whole = run("whole", macrobatch=4)
    assert_same(single, whole, "B = 4 against B = 1")
    with pytest.raises(LaunchError, match="killed after step 6"):
        run("killed", stop_after=6, macrobatch=4)
    resumed = run("killed", resume=True, macrobatch=4)
    assert_same(whole, resumed, "resumed at epoch 1, iteration 1")


# ---------------------------------------------------------------------------------------------- memory
def test_a_macrobatch_that_does_not_fit_is_lowered_with_one_warning(caplog):
    graph, feats, labels, train_idx = make_problem()
    with caplog.at_level(logging.WARNING, logger="gsplit.sampling.macrobatch"):
        loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), batch_size=BATCH,
                            features=feats, labels=labels, macrobatch=8, macrobatch_memory="60K")
    assert 1 <= loader.macrobatch < 8
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "macrobatch=8 needs about" in warnings[0].getMessage(), caplog.text
    assert f"using macrobatch={loader.macrobatch}" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), batch_size=BATCH,
                          features=feats, macrobatch=8, macrobatch_memory="1G").macrobatch == 8
    assert not caplog.records
    assert fit_macrobatch(3, lambda b: 10 ** 9, budget=1) == 1  # even one batch "too big": B = 1, as always


def test_a_huge_macrobatch_is_lowered_at_once():
    """B = 10**9 is lowered by bisection (a few dozen estimates), to the largest B that fits, not one by one."""
    calls = []

    def bytes_of(b):
        calls.append(b)
        return 1000 + 100 * b

    assert fit_macrobatch(10 ** 9, bytes_of, budget=1000 + 100 * 12345) == 12345
    assert len(calls) <= 40, len(calls)
    assert fit_macrobatch(10 ** 9, lambda b: 10 ** 9 * b, budget=1) == 1
    for size in range(1, 40):  # every answer is the largest that fits, as the one-by-one search gave
        for budget in (0, 250, 450, 1000, 10 ** 6):
            want = next((b for b in range(size, 0, -1) if b * 100 <= budget), 1)
            assert fit_macrobatch(size, lambda b: b * 100, budget) == want, (size, budget)


def lowering_warnings(rank, world_size, budgets):
    """The WARNING lines this rank's loader logged while lowering macrobatch=10**9 to ``budgets[rank]``."""
    graph, feats, labels, train_idx = make_problem()
    owner = torch.arange(graph.num_nodes) % world_size
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("gsplit.sampling.macrobatch")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        loader = make_loader("split", graph, feats, labels, train_idx, owner, world_size, 10 ** 9,
                             macrobatch_memory=budgets[rank])
    finally:
        logger.removeHandler(handler)
    return loader.macrobatch, [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_the_lowering_is_said_once_not_per_rank_and_the_ranks_agree():
    """Rank 1's budget is smaller (as default budgets, read at different moments, may be): both ranks use its
    size, since they exchange ids per macrobatch, and rank 0 alone says so."""
    alone = [lowering_warnings(0, 1, [budget])[0] for budget in ("200K", "100K")]
    assert 1 <= alone[1] < alone[0] < 10 ** 9, alone  # each budget alone gives its own size
    per_rank = launch(lowering_warnings, 2, args=(["200K", "100K"],), devices="cpu", timeout=180)
    smaller = alone[1]
    assert [size for size, _ in per_rank] == [smaller, smaller], (per_rank, alone)
    assert [len(w) for _, w in per_rank] == [1, 0], per_rank
    assert "macrobatch=1000000000 needs about" in per_rank[0][1][0]
    assert f"using macrobatch={smaller} " in per_rank[0][1][0]


def test_the_estimate_bounds_what_a_macrobatch_holds():
    """The bytes of a macrobatch's blocks and rows (measured on the tensors) stay below its estimate."""
    graph, feats, labels, train_idx = make_problem()
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), batch_size=BATCH, shuffle=True,
                        features=feats, labels=labels, macrobatch=4, macrobatch_memory="1G")
    macro = loader._prepare(0, list(loader.schedule.numbered_batches(0))[:4])
    held = sum(t.numel() * t.element_size() for t in set(macro.tensors()))
    from gsplit.sampling.macrobatch import macrobatch_bytes

    estimate = macrobatch_bytes(4, FANOUTS, BATCH, graph.num_nodes, graph.num_edges,
                                int(graph.in_degrees().max()), FEAT_DIM * 8)
    assert 0 < held <= estimate, (held, estimate)


def test_macrobatch_is_checked():
    graph, feats, labels, train_idx = make_problem()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=f"macrobatch={bad!r}; pass the number of mini-batches"):
            DataLoader(graph, train_idx, sampler, features=feats, macrobatch=bad)
    with pytest.raises(ValueError, match="macrobatch=0"):
        TrainConfig(macrobatch=0)
    with pytest.raises(ValueError, match="full-graph training"):
        TrainConfig(macrobatch=4, system="full")
