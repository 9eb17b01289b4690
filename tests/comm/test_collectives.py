"""Collectives per iteration: counted by a spy on ``torch.distributed`` in real 2-rank gloo launches.

Every collective is a point where the faster ranks wait for the slowest (issue 20). Split sampling
sends each layer's ids with their counts in one all-to-all (``Communicator.all_to_all_counted``);
a second one runs only when a pair of ranks outgrows the slot size learnt from earlier iterations.
The trainer logs the collectives of every iteration, and the balance of the ranks' work per layer.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.distributed as dist

import gsplit
from gsplit.comm.communicator import Communicator
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.run.trainer import TrainConfig, train_rank

WORLD = 2
FANOUTS = [4, 3, 2]
SPIED = ("all_to_all_single", "all_reduce", "all_gather_object", "barrier", "broadcast", "all_gather")


class CollectiveSpy:
    """Counts every call of the ``torch.distributed`` collectives gsplit uses (in this process)."""

    def __init__(self):
        self.calls = collections.Counter()
        self._originals = {}

    def __enter__(self):
        for name in SPIED:
            original = getattr(dist, name)
            self._originals[name] = original

            def spy(*args, _name=name, _original=original, **kwargs):
                self.calls[_name] += 1
                return _original(*args, **kwargs)
            setattr(dist, name, spy)
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def make_problem():
    g = torch.Generator().manual_seed(3)
    n = 600
    src = torch.randint(0, n, (4800,), generator=g)
    dst = torch.randint(0, n, (4800,), generator=g)
    graph = gsplit.Graph.from_edges(src, dst, n, symmetric=True, remove_self_loops=True)
    return graph, torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g), \
        torch.randperm(n, generator=g)[:320]


def _sampling_collectives(rank, world_size):
    """Per iteration: the collectives of sampling alone, and of sampling plus the feature load."""
    graph, feats, labels, train_idx = make_problem()
    owner = torch.arange(graph.num_nodes) % world_size
    sampler = gsplit.NeighborSampler(FANOUTS, seed=1)
    out = {}
    for name, kw in (("ids only", {}), ("ids and features", {"features": feats, "labels": labels})):
        loader = DataLoader(graph, train_idx, sampler, partition=owner, use_ddp=True, batch_size=32,
                            shuffle=True, **kw)
        per_iteration = []
        batches = iter(loader)
        while True:
            with CollectiveSpy() as spy:
                if next(batches, None) is None:
                    break
            per_iteration.append(dict(spy.calls))
        out[name] = {"spied": per_iteration, "logged": dict(getattr(loader.comm.traffic, "calls", {}))}
    return out


def test_split_sampling_runs_one_collective_per_layer():
    """After the first iteration (which learns the slot sizes), one all-to-all per layer, and one more for
    the features: labels cost none (each rank reads its own targets' labels). Main: a count exchange and
    an id exchange per layer, 2 per layer."""
    for rank, out in enumerate(launch(_sampling_collectives, WORLD, devices="cpu", backend="gloo", timeout=300)):
        layers = len(FANOUTS)
        for name, extra in (("ids only", 0), ("ids and features", 1)):
            spied = out[name]["spied"]
            assert len(spied) == 5, (rank, name)
            # the first iteration has no slot sizes yet: every layer overflows into a second exchange
            assert spied[0] == {"all_to_all_single": 2 * layers + extra}, (rank, name, spied[0])
            for it, calls in enumerate(spied[1:], start=1):
                assert calls == {"all_to_all_single": layers + extra}, (rank, name, it, spied)
            logged = out[name]["logged"]
            assert sum(logged.values()) == sum(c["all_to_all_single"] for c in spied), (rank, logged)
            assert all(logged[f"ids/layer{layer}/overflow"] == 1 for layer in range(layers)), logged


def _counted_exchanges(rank, world_size, sizes):
    """Exchange ``sizes[k][dest]`` ids from this rank to each destination, through the one-collective path
    and through the plain path (count exchange + all-to-all); both results and the spied calls."""
    comm = Communicator()
    results = []
    for k, per_dest in enumerate(sizes[rank]):
        dest = torch.repeat_interleave(torch.arange(world_size), torch.tensor(per_dest))
        ids = torch.arange(dest.numel()) * 10 + rank + 1000 * k
        with CollectiveSpy() as spy:
            got, sent, recv = comm.all_to_all_counted(ids, dest, tag="ids/t")
        want_sent, want_recv = comm.exchange_count_lists(torch.tensor(per_dest))
        want = comm.all_to_all_rows(ids, want_sent, want_recv)
        results.append({"equal": torch.equal(got, want) and got.dtype == want.dtype,
                        "counts": (sent, recv) == (want_sent, want_recv), "calls": spy.total})
    return results


def test_counted_exchange_equals_the_plain_one_and_overflows_only_when_needed():
    """Slots follow the counts: the first exchange and any pair's growth beyond 1.25x its recent maximum
    take a second all-to-all on EVERY rank (also where this rank's own pairs fit), else one."""
    sizes = {0: [[3, 5], [3, 5], [2, 6], [3, 4], [3, 20], [0, 0], [3, 5]],
             1: [[4, 4], [5, 4], [4, 4], [4, 9], [4, 4], [0, 0], [0, 1]]}
    # capacity = ceil(1.25 * max of the pair's last counts). k=0: no slots yet, overflow; k=1: 1->0 sends
    # 5 <= ceil(1.25 * 4) = 5, fits; k=2: 0->1 sends 6 <= 7, fits; k=3: 1->1 (its own slot) sends 9 > 5;
    # k=4: 0->1 sends 20 > ceil(1.25 * 6) = 8, and rank 1, whose pairs fit, joins the second exchange
    want_calls = [2, 1, 1, 2, 2, 1, 1]
    for rank, results in enumerate(launch(_counted_exchanges, WORLD, args=(sizes,), devices="cpu",
                                          backend="gloo", timeout=300)):
        assert all(r["equal"] and r["counts"] for r in results), (rank, results)
        assert [r["calls"] for r in results] == want_calls, (rank, results)


def _train(rank, world_size, ds, owner, model, input_features="auto"):
    cfg = TrainConfig(model=model, fanouts=FANOUTS[:2], batch_size=16, hidden=8, epochs=1, system="split",
                      seed=5, eval_every=0, final_eval=False, device="cpu", heads=2, input_features=input_features)
    with CollectiveSpy() as spy:
        log = train_rank(rank, world_size, cfg, ds, owner)
    return {"log": log, "spied": dict(spy.calls)}


@pytest.mark.parametrize("input_features", ["shuffle", "auto"])
def test_trainer_logs_the_collectives_of_every_iteration_and_the_balance_per_layer(input_features):
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    ds = dataclasses.replace(ds, train_idx=ds.train_idx[:160])
    owner = torch.randint(0, WORLD, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    out = launch(_train, WORLD, args=(ds, owner, "sage", input_features), devices="cpu", backend="gloo",
                 timeout=300)
    # CPU ranks read their inputs directly under "auto": no bottom id exchange, no feature shuffle
    exchanged = 0 if input_features == "auto" else 1
    epoch = out[0]["log"]["epochs"][0]
    layers = 2
    for rank, r in enumerate(out):
        its = epoch["ranks"][rank]["per_iteration"]
        # every collective of training is one of the iterations', but the epoch's loss sum and counter gather
        assert sum(it["collectives"] for it in its) + 2 == r["spied"]["all_to_all_single"] + \
            r["spied"]["all_reduce"] + r["spied"].get("all_gather_object", 0), (rank, r["spied"])
        # steady state: ids (1 per layer), features 1, shuffles fwd + bwd (layers - 1 each), gradients 1
        # (+ one per layer whose ids outgrew their slots: every layer in iteration 0, which has no slot sizes
        # yet, and, with these tiny batches, now and then later); main: 2 per layer for the ids, always
        steady = (layers - 1 + exchanged) + exchanged + 2 * (layers - 1) + 1
        overflows = [sum(n for tag, n in it["collectives_by_tag"].items() if tag.endswith("/overflow")) for it in its]
        assert [it["collectives"] for it in its] == [steady + k for k in overflows], its
        assert overflows[0] == layers - 1 + exchanged and sum(overflows[1:]) <= len(its) // 2, overflows
        assert set(its[1]["collective_s_by_tag"]) == {t for t in its[1]["collectives_by_tag"] if t != "allreduce"}
    balance = epoch["balance"]
    ranks_its = [epoch["ranks"][r]["per_iteration"] for r in range(WORLD)]
    assert len(balance["per_iteration"]) == len(ranks_its[0])
    for k, rec in enumerate(balance["per_iteration"]):
        edges = [[ranks_its[r][k]["edges"][layer] for r in range(WORLD)] for layer in range(layers)]
        assert rec["edges_max"] == [max(e) for e in edges]
        assert rec["edges_mean"] == [sum(e) / WORLD for e in edges]
        assert all(ratio >= 1.0 for ratio in rec["edges_max_over_mean"])
        assert rec["train_s_max"] == max(ranks_its[r][k]["train_s"] for r in range(WORLD))
    assert len(balance["edges_max_over_mean"]) == layers
