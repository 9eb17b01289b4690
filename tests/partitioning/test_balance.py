"""Per-iteration balance (issue 20, item 6): each rank's compute in the training step, hook-free.

A rank's compute is its ``train_s`` minus the seconds inside the step's collectives (layer shuffles,
gradient all-reduce), so ``counters.iteration_balance`` can say how much of the waiting the map's edge
imbalance explains and how much is the ranks' different speed on the same work.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import gsplit
from gsplit.comm.communicator import Communicator
from gsplit.run.counters import iteration_balance
from gsplit.launcher import launch
from gsplit.run.trainer import TrainConfig, train_rank

WORLD = 2


def _rank(edges, train_s, step_collective_s):
    return {"per_iteration": [{"iteration": 0, "edges": edges, "train_s": train_s, "collective_s_by_tag": {},
                               "step_collective_s": step_collective_s}]}


def test_balance_splits_the_compute_gap_into_map_imbalance_and_the_rest():
    # compute 0.8 s and 0.4 s (mean 0.6, gap 0.2); edges 30+10 vs 10+10 (max/mean 40/30): 0.6 x 1/3 = 0.2
    # of the gap follows from the edges, none is noise
    b = iteration_balance([_rank([30, 10], 1.0, 0.2), _rank([10, 10], 1.0, 0.6)])
    assert b["transfer_s_by_tag"] == {} and b["wait_s_by_tag"] == {}
    rec = b["per_iteration"][0]
    assert rec["compute_s_max"] == pytest.approx(0.8) and rec["compute_s_mean"] == pytest.approx(0.6)
    assert rec["compute_s_max_over_mean"] == pytest.approx(0.8 / 0.6)
    assert rec["step_collective_s_max"] == pytest.approx(0.6) and rec["step_collective_s_mean"] == pytest.approx(0.4)
    assert rec["compute_gap_s"] == pytest.approx(0.2)
    assert rec["edges_gap_s"] == pytest.approx(0.6 * (40 / 30 - 1))
    assert rec["noise_gap_s"] == pytest.approx(0.0, abs=1e-12)
    # equal edges: the whole gap is the ranks' speed
    b = iteration_balance([_rank([10], 1.0, 0.2), _rank([10], 1.0, 0.6)])
    assert b["edges_gap_s"] == pytest.approx(0.0) and b["noise_gap_s"] == pytest.approx(0.2)
    assert b["compute_s_max_over_mean"] == pytest.approx(0.8 / 0.6)


def test_balance_takes_the_least_seconds_of_a_collective_as_its_transfer_and_the_rest_as_waiting():
    ranks = [_rank([10], 1.0, 0.5), _rank([10], 1.0, 0.5)]
    ranks[0]["per_iteration"][0]["collective_s_by_tag"] = {"shuffle/layer1/fwd": 0.30, "ids/layer0": 0.01}
    ranks[1]["per_iteration"][0]["collective_s_by_tag"] = {"shuffle/layer1/fwd": 0.10, "ids/layer0": 0.05}
    b = iteration_balance(ranks)
    assert b["transfer_s_by_tag"] == pytest.approx({"ids/layer0": 0.01, "shuffle/layer1/fwd": 0.10})
    assert b["wait_s_by_tag"] == pytest.approx({"ids/layer0": 0.02, "shuffle/layer1/fwd": 0.10})


def _all_reduce_seconds(rank, world_size):
    comm = Communicator()
    comm.all_reduce_(torch.ones(4))
    return dict(comm.traffic.seconds), dict(comm.traffic.calls)


def test_all_reduce_is_timed_like_the_all_to_alls():
    for seconds, calls in launch(_all_reduce_seconds, WORLD, devices="cpu", backend="gloo", timeout=300):
        assert calls == {"allreduce": 1} and seconds["allreduce"] > 0, (seconds, calls)


def _train(rank, world_size, ds, owner):
    cfg = TrainConfig(model="sage", fanouts=[4, 3], batch_size=16, hidden=8, epochs=1, system="split",
                      seed=5, eval_every=0, final_eval=False, device="cpu")
    return train_rank(rank, world_size, cfg, ds, owner)


def test_trainer_logs_each_ranks_step_collectives_and_compute_balance():
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    ds = dataclasses.replace(ds, train_idx=ds.train_idx[:160])
    owner = torch.randint(0, WORLD, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    out = launch(_train, WORLD, args=(ds, owner), devices="cpu", backend="gloo", timeout=300)
    epoch = out[0]["epochs"][0]
    ranks_its = [epoch["ranks"][r]["per_iteration"] for r in range(WORLD)]
    for r in range(WORLD):
        if "OMP_NUM_THREADS" not in os.environ:  # the launcher's share of the cores, logged per rank
            assert epoch["ranks"][r]["torch_threads"] == max(1, len(os.sched_getaffinity(0)) // WORLD)
        for it in ranks_its[r]:
            # the step's shuffles fwd + bwd and the gradient all-reduce, all inside the step
            assert 0 < it["step_collective_s"] <= it["train_s"], it
    balance = epoch["balance"]
    for k, rec in enumerate(balance["per_iteration"]):
        compute = [ranks_its[r][k]["train_s"] - ranks_its[r][k]["step_collective_s"] for r in range(WORLD)]
        assert rec["compute_s_max"] == pytest.approx(max(compute))
        assert rec["compute_gap_s"] == pytest.approx(max(compute) - sum(compute) / WORLD)
        assert rec["compute_gap_s"] == pytest.approx(rec["edges_gap_s"] + rec["noise_gap_s"])
    assert balance["compute_gap_s"] == pytest.approx(sum(r["compute_gap_s"] for r in balance["per_iteration"]))
