"""Many hosts: data parallelism across hosts, split parallelism within each, equals single-process training
on the union of the hosts' mini-batches.

One launch of 4 ranks plays 2 "hosts" of 2 ranks (split groups [0, 1] and [2, 3], built by
``gsplit.host_groups(ranks_per_host=2)``); every rank trains whole epochs whose last iteration is
uneven: the second host gets a short slice in one case and nothing at all in the other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gsplit
from gsplit.cli import main
from gsplit.runtime.io import read_run_log
from gsplit.launcher import launch
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy
from gsplit.sampling.batches import epoch_permutation
from parity_helpers import random_graph_problem, rel_err

REPO = Path(__file__).resolve().parents[2]
NUM_NODES = 240
FEAT_DIM = 6
NUM_CLASSES = 3
BATCH = 12               # per rank
RANKS_PER_HOST = 2
HOSTS = 2
FANOUTS = [3, -1, 2]
DROPOUT = 0.4
# targets -> last iteration: 130 = 2 * 48 + 34 (host 0 gets 24, host 1 gets 10); 150 = 3 * 48 + 6 (host 1: none)
CASES = {"short last slice": 130, "empty host": 150}
MODELS = ("sage", "gat")
WRAPPED = "sage in SplitParallel"
PREFETCHED = "sage with prefetch"


def make_problem():
    graph, feats, labels, g = random_graph_problem(NUM_NODES, 900, FEAT_DIM, NUM_CLASSES, seed=7, isolated=20)
    order = torch.randperm(NUM_NODES, generator=g)
    owner = torch.randint(0, RANKS_PER_HOST, (NUM_NODES,), generator=torch.Generator().manual_seed(1))
    return graph, feats, labels, order, owner


def new_model(name):
    torch.manual_seed(0)
    return build_model(name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2, dropout=DROPOUT).double()


def hybrid_epoch(name, num_targets, host, world, wrapper=False, prefetch=False):
    """One epoch of hybrid training: the explicit recipe (split_cross_entropy + allreduce_gradients over
    every rank), or with ``wrapper`` the SplitParallel one (mean loss, DDP over every rank); ``prefetch``
    samples in a background thread on a group of the host's own."""
    graph, feats, labels, order, owner = make_problem()
    model = new_model(name)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    loader = gsplit.DataLoader(graph, order[:num_targets], sampler, partition=owner, use_ddp=True, batch_size=BATCH,
                               shuffle=True, ddp_seed=11, features=feats, labels=labels, group=host,
                               replica_group=world, prefetch=prefetch)
    net = gsplit.SplitParallel(model, loader) if wrapper else model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = {"losses": [], "grads": [], "targets": [], "replica": loader.replica_rank,
           "num_replicas": loader.num_replicas, "len": len(loader)}
    for _, output_nodes, blocks in loader:
        opt.zero_grad()
        logits = net(blocks, blocks[0].srcdata["feat"])
        if wrapper:
            loss = torch.nn.functional.cross_entropy(logits, blocks[-1].dstdata["label"])
            loss.backward()
            out["losses"].append(net.global_loss(loss))
        else:
            loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
            loss.backward()
            allreduce_gradients(model, world)
            out["losses"].append(global_sum(loss, world))
        out["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()})
        out["targets"].append(output_nodes.tolist())
        opt.step()
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def worker(rank, *args):
    del args  # the world size, with launch's fn(rank, world_size) convention
    assert dist.get_world_size() == RANKS_PER_HOST * HOSTS
    host, world = gsplit.host_groups(ranks_per_host=RANKS_PER_HOST)
    results = {(case, name): hybrid_epoch(name, n, host, world) for case, n in CASES.items() for name in MODELS}
    for case, n in CASES.items():
        results[(case, WRAPPED)] = hybrid_epoch("sage", n, host, world, wrapper=True)
        results[(case, PREFETCHED)] = hybrid_epoch("sage", n, host, world, prefetch=True)
    return results


def reference(name, num_targets):
    """One process, no split machinery: the union mini-batch of every iteration."""
    graph, feats, labels, order, _ = make_problem()
    model = new_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    perm = epoch_permutation(order[:num_targets], 11, 0, True)
    gb = BATCH * RANKS_PER_HOST * HOSTS
    out = {"losses": [], "grads": [], "batches": []}
    for it in range((num_targets + gb - 1) // gb):
        seeds = perm[it * gb:(it + 1) * gb]
        blocks = sampler.sample_blocks(graph, seeds, epoch=0, iteration=it)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(blocks, feats[blocks[0].src_nodes]), labels[seeds])
        loss.backward()
        out["losses"].append(float(loss.detach()))
        out["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()})
        out["batches"].append(seeds.tolist())
        opt.step()
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def test_two_hosts_of_two_ranks_match_single_process_on_the_union():
    per_rank = launch(worker, RANKS_PER_HOST * HOSTS)
    for case, num_targets in CASES.items():
        for name in MODELS + (WRAPPED, PREFETCHED):
            ref = reference(name.split()[0], num_targets)
            what = f"{name}, {case}"
            runs = [r[(case, name)] for r in per_rank]
            assert [r["replica"] for r in runs] == [0, 0, 1, 1], what
            assert all(r["num_replicas"] == HOSTS and r["len"] == len(ref["losses"]) for r in runs), what
            for it, seeds in enumerate(ref["batches"]):
                # the hosts' targets are disjoint and make up the union mini-batch
                got = [v for r in runs for v in r["targets"][it]]
                assert sorted(got) == sorted(seeds) and len(got) == len(set(got)), f"{what}: iteration {it}"
                host1 = runs[2]["targets"][it] + runs[3]["targets"][it]
                assert sorted(host1) == sorted(seeds[BATCH * RANKS_PER_HOST:]), f"{what}: host 1's slice"
                for r, run in enumerate(runs):
                    assert abs(run["losses"][it] - ref["losses"][it]) <= 1e-10 * abs(ref["losses"][it]), what
                    for n, g_ref in ref["grads"][it].items():
                        assert rel_err(run["grads"][it][n], g_ref) <= 1e-10, f"{what}: grad {n}, rank {r}, it {it}"
            last = ref["batches"][-1]
            assert len(last) < BATCH * RANKS_PER_HOST * HOSTS  # the uneven case really ran
            for r, run in enumerate(runs):
                for n, p_ref in ref["params"].items():
                    assert rel_err(run["params"][n], p_ref) <= 1e-10, f"{what}: parameter {n} on rank {r}"
    # the empty-host case: host 1 owned no target in the last iteration and still ran it
    runs = [r[("empty host", "sage")] for r in per_rank]
    assert runs[2]["targets"][-1] == [] and runs[3]["targets"][-1] == []


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_two_nodes(cwd: Path, gsplit_args: list) -> list:
    """``python -m gsplit ARGS`` as two torchrun nodes of 2 CPU ranks on loopback; their outputs, after checking
    that both exited 0."""
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    port = str(_free_port())
    nodes = [subprocess.Popen([str(torchrun), "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "2",
                               "--master-addr", "127.0.0.1", "--master-port", port, "-m", "gsplit", *gsplit_args],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)[-3000:]
    return outputs


@pytest.mark.slow
def test_torchrun_two_nodes_train_like_the_simulated_hosts(tmp_path):
    """Two real torchrun invocations (``--nnodes 2``, 2 CPU ranks each) run ``gsplit train``; rank 0's log
    equals the one of ``--num-ranks 4 --ranks-per-host 2`` started by gsplit.launch on the same map."""
    tiny = ["--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "avg_degree=8", "-D", "feature_dim=16"]
    common = ["--fanouts", "5,3", "--batch-size", "32", "--epochs", "1", "--hidden", "16", "--device", "cpu",
              "--partition", str(tmp_path / "parts")]
    assert main(["prepare", *tiny, "--num-parts", "2", "--fanouts", "5,3", "--batch-size", "32",
                 "--method", "random", "--out", str(tmp_path / "parts")]) == 0
    outputs = torchrun_two_nodes(tmp_path, ["train", *tiny, *common, "--log-file", str(tmp_path / "torchrun.json")])
    assert "2 hosts x 2" in outputs[0]
    assert main(["train", *tiny, *common, "--num-ranks", "4", "--ranks-per-host", "2",
                 "--log", str(tmp_path / "launch.json")]) == 0
    got, want = (read_run_log(tmp_path / f"{name}.json") for name in ("torchrun", "launch"))
    assert (got["world_size"], got["hosts"], got["ranks_per_host"]) == (4, 2, 2)
    e_got, e_want = got["epochs"][0], want["epochs"][0]
    assert e_got["loss"] == pytest.approx(e_want["loss"], rel=1e-9)
    assert e_got["traffic_bytes_by_tag"] == e_want["traffic_bytes_by_tag"]
    assert e_got["split_group_bytes"] > 0 and e_got["gradient_bytes"] > 0
    assert [r["rank"] for r in e_got["ranks"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("argv,msg", [
    (["--num-ranks", "4", "--ranks-per-host", "3"], "does not divide the 4 ranks"),
    (["--launcher", "torchrun"], "start the ranks with torchrun"),
])
def test_cli_refuses_bad_host_layouts(argv, msg, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    tiny = ["--dataset", "synthetic", "-D", "num_nodes=300", "-D", "feature_dim=4"]
    assert main(["train", *tiny, "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsplit: error:") and msg in err, err
