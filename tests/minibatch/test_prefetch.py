"""DataLoader(prefetch=True): the next mini-batch is sampled and loaded in a background thread, on a
process group of its own, and the results are exactly those of prefetch=False."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.comm import allreduce_gradients, global_sum, group_of
from gsplit.nn import split_cross_entropy
import test_loader
from test_split_parity import (BATCH, DROPOUT, FANOUTS, FEAT_DIM, ITERS, NUM_CLASSES, make_maps, make_problem,
                               reference, rel_err)

REPO = Path(__file__).resolve().parents[2]


def _prefetch_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("gsplit-prefetch") and t.is_alive()]


def summarize(batch):
    """Everything a batch carries, as CPU tensors: ids, blocks (edges, shuffle indices), features, labels."""
    input_nodes, output_nodes, blocks = batch
    out = {"input_nodes": input_nodes.cpu(), "output_nodes": output_nodes.cpu()}
    for i, b in enumerate(blocks):
        for name in ("src_nodes", "edge_src", "edge_dst", "edge_ids"):
            out[f"{i}.{name}"] = getattr(b, name).cpu()
        out[f"{i}.num_dst"] = b.num_dst
        out[f"{i}.global_num_dst"] = b.global_num_dst
        for k, v in list(b.srcdata.items()) + list(b.dstdata.items()):
            out[f"{i}.data.{k}"] = v.cpu()
        if b.shuffle_index is not None:
            s = b.shuffle_index
            out[f"{i}.shuffle"] = (s.send_idx.cpu(), s.send_counts, s.recv_pos.cpu(), s.recv_counts, s.num_local,
                                   s.num_mixed, s.tag)
    return out


def assert_same(a, b, where=""):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def stats_of(loader):
    s = loader.last_stats
    return (s.input_rows, s.edges, s.dst_vertices, s.targets, s.cache_hits, s.cache_misses, s.host_bytes)


def small_problem():
    return test_loader.small_problem(n=300, num_edges=1500, feat_dim=6, num_classes=4)


def passes(loader, epochs=2, delay=0.0):
    out = []
    for _ in range(epochs):
        epoch = []
        for batch in loader:
            epoch.append((summarize(batch), stats_of(loader)))
            time.sleep(delay)
        out.append(epoch)
    return out


# ------------------------------------------------------------------------------- world size 1
@pytest.mark.parametrize("cache", ["0", "600"])
def test_world_one_prefetch_yields_the_same_batches(cache):
    graph, feats, labels = small_problem()
    sampler = gsplit.NeighborSampler([4, 3], seed=2)
    kw = dict(batch_size=40, shuffle=True, ddp_seed=3, features=feats, labels=labels, cache_size=cache)
    plain = DataLoader(graph, torch.arange(0, 250), sampler, **kw)
    pre = DataLoader(graph, torch.arange(0, 250), sampler, prefetch=True, **kw)
    assert pre.sampling_comm is pre.comm  # nothing to communicate at world size 1
    want, got = passes(plain), passes(pre)
    assert len(got[0]) == len(plain) == 7
    assert_same(got, want)
    assert not _prefetch_threads()


class RecordingSampler(gsplit.NeighborSampler):
    """Records which thread sampled which iteration, and can fail at one iteration."""

    def __init__(self, *args, fail_at=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at = fail_at
        self.calls = []

    def sample_neighbors(self, graph, nodes, layer, epoch, iteration):
        self.calls.append((epoch, iteration, threading.current_thread().name))
        if iteration == self.fail_at:
            raise KeyError(f"sampler exploded at iteration {iteration}")
        return super().sample_neighbors(graph, nodes, layer, epoch, iteration)


def test_prefetch_runs_ahead_by_one_batch_in_its_thread():
    graph, feats, labels = small_problem()
    sampler = RecordingSampler([3], seed=1)
    loader = DataLoader(graph, torch.arange(200), sampler, batch_size=20, features=feats, prefetch=True)
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 10
    while not any(i == 1 for _, i, _ in sampler.calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time enough to run further ahead, if it wrongly would
    iterations = sorted({i for _, i, _ in sampler.calls})
    assert iterations == [0, 1], f"prepared {iterations} while the consumer holds batch 0; expected one ahead"
    assert {name for *_, name in sampler.calls} == {"gsplit-prefetch-rank0"}
    it.close()
    assert not _prefetch_threads()


def test_exception_in_the_thread_reaches_the_consumer():
    graph, feats, labels = small_problem()
    loader = DataLoader(graph, torch.arange(200), RecordingSampler([3], seed=1, fail_at=2), batch_size=20,
                        features=feats, prefetch=True)
    got = []
    with pytest.raises(KeyError, match="exploded at iteration 2") as info:
        for _, output_nodes, _ in loader:
            got.append(output_nodes)
    assert len(got) == 2  # the batches before the failure were delivered
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "in sample_neighbors" in frames and "in _run" in frames, "the thread's frames belong in the traceback"
    assert not _prefetch_threads()


def test_early_break_and_abandoned_iterators_are_clean():
    graph, feats, labels = small_problem()
    sampler = gsplit.NeighborSampler([3, 2], seed=5)
    kw = dict(batch_size=30, shuffle=True, features=feats, labels=labels)
    want = passes(DataLoader(graph, torch.arange(240), sampler, **kw), epochs=4)
    loader = DataLoader(graph, torch.arange(240), sampler, prefetch=True, **kw)
    for k, _ in enumerate(loader):  # epoch 0: break
        if k == 1:
            break
    assert not _prefetch_threads(), "break left the prefetching thread running"
    it = iter(loader)  # epoch 1: abandoned after two batches, never closed
    next(it), next(it)
    assert len(_prefetch_threads()) == 1
    got2 = passes(loader, epochs=1)  # epoch 2: a new pass first finishes the abandoned one
    assert_same(got2[0], want[2])
    assert not _prefetch_threads()
    del it
    loader.set_epoch(0)
    assert_same(passes(loader, epochs=1)[0], want[0])


def test_interpreter_exit_with_an_unfinished_pass_is_clean():
    script = textwrap.dedent("""
        import torch, gsplit
        g = gsplit.Graph.from_edges(torch.arange(100), (torch.arange(100) + 1) % 100, 100, symmetric=True)
        loader = gsplit.DataLoader(g, torch.arange(100), gsplit.NeighborSampler([2]), batch_size=10,
                                   features=torch.randn(100, 3), prefetch=True)
        IT = iter(loader)      # kept alive in a global until the interpreter exits
        next(IT)
        print("done")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0 and res.stdout.strip() == "done", res.stderr


# ------------------------------------------------------------------------------- two ranks
def batches_worker(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    owner = make_maps(graph, train_idx, world_size)["gsplit"]
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    kw = dict(partition=owner, use_ddp=True, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats,
              labels=labels, cache_size=30 * FEAT_DIM * 8)
    plain = DataLoader(graph, train_idx, sampler, **kw)
    want = passes(plain)
    # rank 1 consumes slowly, so the two ranks' threads run at different points of their iterations
    pre = DataLoader(graph, train_idx, sampler, prefetch=True, **kw)
    got = passes(pre, delay=0.03 * rank)
    # early break in epoch 0 (different timing per rank), then a full epoch 1: the loader's group must
    # still pair the ranks' collectives correctly
    brk = DataLoader(graph, train_idx, sampler, prefetch=True, **kw)
    for k, _ in enumerate(brk):
        time.sleep(0.05 * (1 - rank))
        if k == 1:
            break
    after_break = passes(brk, epochs=1)
    return {"want": want, "got": got, "after_break": after_break,
            "traffic_plain": plain.comm.traffic.snapshot(), "traffic_pre": pre.comm.traffic.snapshot(),
            "traffic_pre_group": pre.sampling_comm.traffic.snapshot(),
            "separate_group": pre.sampling_comm is not pre.comm and pre.sampling_comm.group is not pre.comm.group,
            "index_comm_is_training": all(group_of(b.shuffle_index) is pre.comm for b in next(iter(pre))[2]),
            "cached": pre.feature_store.cached_ids, "threads": _prefetch_threads()}


def test_two_ranks_prefetch_yields_the_same_batches():
    per_rank = launch(batches_worker, 2)
    cached = [set(r["cached"].tolist()) for r in per_rank]
    assert cached[0] and cached[1] and not (cached[0] & cached[1]), "a feature is cached on two ranks"
    for rank, r in enumerate(per_rank):
        assert r["separate_group"] and r["index_comm_is_training"]
        assert_same(r["got"], r["want"], f"rank {rank}")
        assert_same(r["after_break"][0], r["want"][1], f"rank {rank} after break")
        assert not r["threads"]
        # the training communicator counts what the consumed batches sent, whichever group carried it
        assert r["traffic_pre"] == r["traffic_plain"], f"rank {rank}"
        assert any(tag.startswith("ids/") for tag in r["traffic_pre"]["rows"])
        assert r["traffic_pre_group"]["rows"].keys() <= r["traffic_plain"]["rows"].keys()


def train_steps(model_name, graph, feats, labels, train_idx, owner, world_size, **loader_kw):
    """ITERS training steps (then an early break), as test_split_parity.train_steps, with loader options."""
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner,
                        use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats,
                        labels=labels, **loader_kw)
    losses, grads = [], []
    for step, (_, _, blocks) in enumerate(loader):
        if step == ITERS:
            break
        opt.zero_grad()
        loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        allreduce_gradients(model, loader.comm)
        losses.append(global_sum(loss, loader.comm))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def train_worker(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    maps = make_maps(graph, train_idx, world_size)
    out = {}
    for map_name in ("gsplit", "starved"):
        for model_name in ("sage", "gat"):
            for prefetch in (False, True):
                out[(map_name, model_name, prefetch)] = train_steps(
                    model_name, graph, feats, labels, train_idx, maps[map_name], world_size, prefetch=prefetch,
                    cache_size=40 * FEAT_DIM * 8 if prefetch else 0)
    out["threads"] = _prefetch_threads()
    return out


def test_two_ranks_training_with_prefetch_matches_without_and_the_reference():
    per_rank = launch(train_worker, 2)
    for map_name in ("gsplit", "starved"):
        for model_name in ("sage", "gat"):
            ref = reference(model_name, 2)
            for rank, res in enumerate(per_rank):
                plain, pre = res[(map_name, model_name, False)], res[(map_name, model_name, True)]
                case = f"{model_name} on the {map_name} map, rank {rank}"
                assert pre["losses"] == plain["losses"], case  # same collectives, same order: bit-identical
                for it in range(ITERS):
                    assert abs(pre["losses"][it] - ref["losses"][it]) <= 1e-10 * abs(ref["losses"][it]), case
                    for name, g in pre["grads"][it].items():
                        assert torch.equal(g, plain["grads"][it][name]), f"{case}: {name} at iteration {it}"
                        assert rel_err(g, ref["grads"][it][name]) < 1e-10, f"{case}: {name} at iteration {it}"
    assert not any(r["threads"] for r in per_rank)


# ------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_prefetch_on_a_side_stream_yields_the_same_batches():
    graph, feats, labels = test_loader.small_problem(n=3000, num_edges=15000, feat_dim=6, num_classes=4)
    sampler = gsplit.NeighborSampler([10, 5], seed=2)
    kw = dict(batch_size=256, shuffle=True, features=feats, labels=labels, device="cuda", cache_size=500 * 6 * 4)
    want = passes(DataLoader(graph, torch.arange(2500), sampler, **kw))
    loader = DataLoader(graph, torch.arange(2500), sampler, prefetch=True, **kw)
    got = []
    for _ in range(2):
        epoch = []
        for batch in loader:
            # work on the consumer's stream while the thread fills the next batch on its own
            x = batch[2][0].srcdata["feat"]
            for _ in range(20):
                x = torch.tanh(x @ torch.ones(6, 6, device="cuda") / 6)
            epoch.append((summarize(batch), stats_of(loader)))
        got.append(epoch)
    assert_same(got, want)


def trainer_worker(rank, world_size, ds, owner):
    """The training harness twice in one launch: without, then with cache and prefetch."""
    from gsplit.run.trainer import TrainConfig, train_rank

    logs = {}
    for fast in (False, True):
        cfg = TrainConfig(model="sage", fanouts=[4, 4], batch_size=64, hidden=16, dropout=0.5, epochs=2, lr=0.01,
                          device="cpu", max_iters=3, eval_every=2, cache_size="8K" if fast else "0",
                          prefetch=fast, input_features="shuffle")  # the cache serves the shuffled way
        logs[fast] = train_rank(rank, world_size, cfg, ds, owner, cache_weights=ds.graph.in_degrees())
    return logs


def test_trainer_with_cache_and_prefetch_logs_the_same_run():
    """``gsplit train --cache-size --prefetch`` at 2 ranks: same losses, accuracy and traffic as without."""
    ds = gsplit.datasets.load("synthetic", num_nodes=1500, avg_degree=8, feature_dim=8, seed=2)
    pmap = gsplit.partition(ds.graph, 2, method="random", seed=0)
    logs = launch(trainer_worker, 2, args=(ds, pmap.assignment))[0]
    for e0, e1 in zip(logs[False]["epochs"], logs[True]["epochs"]):
        for key in ("loss", "input_rows", "traffic_rows_by_tag", "traffic_bytes_by_tag"):
            assert e0[key] == e1[key], key
        for r0, r1 in zip(e0["ranks"], e1["ranks"]):
            assert [i["traffic_rows"] for i in r0["per_iteration"]] == [i["traffic_rows"] for i in r1["per_iteration"]]
        assert e0.get("test_acc") == e1.get("test_acc") and e0.get("val_acc") == e1.get("val_acc")
        assert e0["cache_hits"] == 0 and 0 < e1["cache_hits"] < e1["input_rows"]
        assert e1["cache_hits"] + e1["cache_misses"] == e1["input_rows"]
    assert "test_acc" in logs[True]["epochs"][-1]


CLI_TINY = ["--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "avg_degree=8", "-D", "feature_dim=16"]


def test_cli_train_with_cache_and_prefetch(tmp_path, capsys):
    from gsplit.runtime.io import read_run_log

    from gsplit.cli import main

    log = tmp_path / "log.json"
    rc = main(["train", *CLI_TINY, "--num-ranks", "1", "--fanouts", "5,3", "--batch-size", "128", "--epochs", "1",
               "--hidden", "16", "--device", "cpu", "--cache-size", "32K", "--prefetch", "--log", str(log)])
    assert rc == 0
    result = read_run_log(log)
    assert result["config"]["prefetch"] is True and result["config"]["cache_size"] == "32K"
    epoch = result["epochs"][0]
    assert 0 < epoch["cache_hits"] < epoch["input_rows"] and "wait_s" in epoch
    capsys.readouterr()
    assert main(["train", *CLI_TINY, "--num-ranks", "1", "--cache-size", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsplit: error:") and "not a size" in err and "Traceback" not in err
