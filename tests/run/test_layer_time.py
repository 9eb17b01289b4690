"""Per-layer compute time in the run log (issue 20, item 6): :class:`gsplit.runtime.timing.LayerClock`.

Each rank times every layer's forward and backward (waits for peers and shuffles left out) with marks in
``sp_forward``'s loops (plain and overlapped) and identity autograd nodes; ``counters.iteration_balance``
turns the ranks' times into max / mean per layer and the layer's gap, from the per-rank records gathered
once per epoch (no collective of its own). On a GPU the marks are CUDA events read without waiting.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import gsplit
from gsplit.run.counters import iteration_balance
from gsplit.launcher import launch
from gsplit.runtime.timing import LayerClock, layer_ends, layer_starts
from gsplit.run.trainer import TrainConfig, train_rank

from fake_cuda import FakeEvent

WORLD = 2
SLEEP = 0.02  # seconds the slow rank's layer 1 sleeps per part, forward and backward


def _fake_cuda(monkeypatch_setattr):
    FakeEvent.log, FakeEvent.gpu_at = [], [0.0]
    monkeypatch_setattr(torch.cuda, "current_stream", lambda device=None: "stream")


class _Clock:
    """A host clock that moves only when the test 'sleeps': the stretches are exact, however busy the machine
    (with real sleeps a loaded CI host stretched a 20 ms sleep to 74 ms)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock_time(monkeypatch):
    """``time.perf_counter`` (what LayerClock and FakeEvent stamp with) on a :class:`_Clock`; ``_sleep`` advances it."""
    fake = _Clock()
    monkeypatch.setattr(time, "perf_counter", fake.perf_counter)
    monkeypatch.setattr(_Sleepy, "sleep", staticmethod(fake.sleep))
    return fake


def _timed_step(clock):
    """Two 'layers' with known sleeps, forward and backward, and a wait between them that is nobody's."""
    x = torch.ones(4, requires_grad=True)
    h = layer_starts(clock, 0, x)
    _Sleepy.sleep(0.01)
    h = layer_ends(clock, 0, _Sleepy.apply(h * 2, 0.03))
    _Sleepy.sleep(0.02)  # a shuffle / a wait: booked to no layer
    h = layer_starts(clock, 1, h)
    _Sleepy.sleep(0.02)
    h = layer_ends(clock, 1, _Sleepy.apply(h * 3, 0.01))
    h.sum().backward()
    clock.mark(None)
    _Sleepy.sleep(0.02)  # the optimiser: no layer's
    clock.close("it")


class _Sleepy(torch.autograd.Function):
    """Identity whose backward sleeps (a layer's backward compute)."""

    sleep = staticmethod(time.sleep)  # the clock_time fixture makes it advance a fake clock

    @staticmethod
    def forward(ctx, h, seconds):
        ctx.seconds = seconds
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        _Sleepy.sleep(ctx.seconds)
        return grad, None


def test_layer_clock_books_each_stretch_to_its_layer_and_leaves_the_waits_out(clock_time):
    clock = LayerClock(torch.device("cpu"))
    _timed_step(clock)
    [(key, s)] = clock.ready()
    assert key == "it" and len(s.forward) == len(s.backward) == 2
    assert s.forward[0] == pytest.approx(0.01) and s.forward[1] == pytest.approx(0.02)
    assert s.backward[0] == pytest.approx(0.03) and s.backward[1] == pytest.approx(0.01)
    assert clock.ready() == [] and clock.finish() == []


def test_layer_clock_reads_gpu_marks_only_once_they_completed(monkeypatch, clock_time):
    _fake_cuda(monkeypatch.setattr)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("device-wide synchronize"))
    clock = LayerClock(torch.device("cuda", 0), event_factory=FakeEvent)
    _timed_step(clock)
    assert clock.ready() == []  # the GPU has not got there: nothing read, nobody waits
    assert "synchronize" not in FakeEvent.log and FakeEvent.log.count("record") >= 9
    FakeEvent.gpu_at[0] = time.perf_counter()
    [(_, s)] = clock.ready()
    assert s.backward[0] == pytest.approx(0.03)
    _timed_step(clock)
    [(_, s)] = clock.finish()  # the epoch's end: the one place it waits, on its own events
    assert s.forward[1] == pytest.approx(0.02) and "synchronize" in FakeEvent.log


# ------------------------------------------------------------------------------------------ in training
def _dataset():
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    return dataclasses.replace(ds, train_idx=ds.train_idx[:160])


def _slow_layer_one(model):
    """Make layer 1 of ``model`` sleep in each part's forward and backward (a rank slow in that layer)."""
    layer = model.layers[1]
    combine = layer.combine

    def slow_combine(block, sources):
        time.sleep(SLEEP)
        return _Sleepy.apply(combine(block, sources), SLEEP)

    layer.combine = slow_combine
    return model


def _train(rank, world_size, ds, owner, system, overlap, slow_rank):
    from gsplit.run import trainer

    if rank == slow_rank:
        build = trainer.build_model
        trainer.build_model = lambda *a, **k: _slow_layer_one(build(*a, **k))
    cfg = TrainConfig(model="sage", fanouts=[4, 3, 3], batch_size=16, hidden=8, epochs=1, system=system,
                      seed=5, eval_every=0, final_eval=False, device="cpu", overlap=overlap)
    return train_rank(rank, world_size, cfg, ds, owner)


def _run(system, overlap, slow_rank=-1):
    ds = _dataset()
    owner = torch.randint(0, WORLD, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    out = launch(_train, WORLD, args=(ds, owner, system, overlap, slow_rank), devices="cpu", backend="gloo",
                 timeout=300)
    return out[0]["epochs"][0]


@pytest.mark.parametrize("system,overlap", [("split", True), ("split", False), ("dp", False)])
def test_the_log_holds_each_layers_time_per_rank_and_its_balance(system, overlap):
    epoch = _run(system, overlap)
    ranks = epoch["ranks"]
    for r in ranks:
        its = r["per_iteration"]
        assert its
        for it in its:
            fwd, bwd = it["layer_fwd_s"], it["layer_bwd_s"]
            assert len(fwd) == len(bwd) == 3 and all(s > 0 for s in fwd + bwd), it
            # the layers' compute is part of the step (forward, loss, backward, all-reduce, optimiser)
            assert sum(fwd) + sum(bwd) <= it["train_s"], it
        for key in ("layer_fwd_s", "layer_bwd_s"):  # the epoch's counters are the iterations' sums
            assert r[key] == pytest.approx([sum(it[key][layer] for it in its) for layer in range(3)])
    b = epoch["balance"]
    for k, rec in enumerate(b["per_iteration"]):
        both = [[ranks[r]["per_iteration"][k]["layer_fwd_s"][layer] + ranks[r]["per_iteration"][k]["layer_bwd_s"][layer]
                 for r in range(WORLD)] for layer in range(3)]
        assert rec["layer_s_max"] == pytest.approx([max(t) for t in both])
        assert rec["layer_s_mean"] == pytest.approx([sum(t) / WORLD for t in both])
        for layer in range(3):
            assert rec["layer_s_max"][layer] >= rec["layer_s_mean"][layer] > 0
            assert rec["layer_fwd_s_max"][layer] >= rec["layer_fwd_s_mean"][layer]
            assert rec["layer_bwd_s_max"][layer] >= rec["layer_bwd_s_mean"][layer]
            assert rec["layer_gap_s"][layer] == pytest.approx(rec["layer_edges_gap_s"][layer]
                                                              + rec["layer_noise_gap_s"][layer])
    assert b["layer_gap_s"] == pytest.approx([sum(r["layer_gap_s"][layer] for r in b["per_iteration"])
                                              for layer in range(3)])
    assert all(x >= 1.0 for x in b["layer_s_max_over_mean"])


@pytest.mark.parametrize("overlap", [True, False])
def test_a_rank_slow_in_one_layer_shows_in_that_layers_gap(overlap):
    epoch = _run("split", overlap, slow_rank=1)
    b = epoch["balance"]
    iters = len(b["per_iteration"])
    parts = 2 if overlap else 1  # an overlapped layer combines two parts, each sleeping
    # rank 1 spends 2 x parts x SLEEP more in layer 1 per iteration: max - mean over 2 ranks is half of it
    expected = iters * parts * SLEEP
    assert b["layer_gap_s"][1] > 0.7 * expected, b["layer_gap_s"]
    assert b["layer_gap_s"][1] > 2 * max(b["layer_gap_s"][0], b["layer_gap_s"][2]), b["layer_gap_s"]
    # the sleep is rank 1's own slowness, not the map's edges
    assert b["layer_noise_gap_s"][1] > 0.5 * expected, b
    slow = [r["per_iteration"] for r in epoch["ranks"]][1]
    assert all(it["layer_fwd_s"][1] >= parts * SLEEP and it["layer_bwd_s"][1] >= parts * SLEEP for it in slow)


def _syncs(rank, world_size):
    """Host syncs of an overlapped forward + backward with and without a LayerClock on (fake) CUDA events."""
    from gsplit.minibatch.loader import DataLoader
    from gsplit.nn import build_model
    from gsplit.nn.split import split_cross_entropy
    from gsplit.ops.sync_counter import HostSyncCounter

    _fake_cuda(lambda obj, name, value: setattr(obj, name, value))
    ds = _dataset()
    owner = torch.randint(0, world_size, (ds.num_nodes,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([4, 3, 3], seed=3), partition=owner,
                        use_ddp=True, batch_size=16, shuffle=True, features=ds.features, labels=ds.labels,
                        overlap=True)
    _, _, blocks = next(iter(loader))
    out = {}
    for timed in (False, True):
        torch.manual_seed(0)
        model = build_model("sage", ds.features.shape[1], 8, ds.num_classes, num_layers=3, dropout=0.3)
        clock = LayerClock(torch.device("cuda", 0), event_factory=FakeEvent) if timed else None
        counter = HostSyncCounter(cpu_is_device=True)
        with counter:
            logits = model(blocks, blocks[0].srcdata["feat"], loader.comm, clock=clock)
            split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
            if clock is not None:
                clock.mark(None)
                clock.close(0)
                ready = clock.ready()
        out[timed] = [(e.kind, e.site) for e in counter.events]
    return out, FakeEvent.log.count("record"), "synchronize" in FakeEvent.log, ready


def test_timing_the_layers_adds_no_host_sync():
    """The marks are events recorded on the stream (fake ones here) and read with query(): the overlapped
    forward and backward make the same host syncs with the clock as without it, and none waits for them."""
    for rank, (out, records, synchronized, ready) in enumerate(launch(_syncs, WORLD, devices="cpu", backend="gloo",
                                                                      timeout=300)):
        assert out[True] == out[False], (rank, out)
        assert not [site for _, site in out[True] if "timing.py" in site], rank
        # forward: 2 marks per layer (+1 before each wait), backward: 2 per layer (+2 around each wait)
        assert records >= 12 and not synchronized and ready == [], (rank, records, synchronized, ready)


@pytest.mark.parametrize("model_name", ["sage", "gat", "gcn"])
@pytest.mark.parametrize("overlap", [True, False])
def test_timing_the_layers_changes_no_result(model_name, overlap):
    """The marks are identities: loss and gradients with a clock are bit-identical to those without."""
    from gsplit.comm.communicator import Communicator
    from gsplit.nn import build_model
    from gsplit.nn.split import split_cross_entropy
    from gsplit.split.split_sampling import sp_sample

    ds = _dataset()
    # sp_sample itself: a one-rank loader makes no overlap plans (nothing to hide), but the path is the same
    batch = sp_sample(ds.graph, ds.train_idx[:32], torch.zeros(ds.num_nodes, dtype=torch.long),
                      gsplit.NeighborSampler([4, 3, 3], seed=3), Communicator(), overlap=overlap)
    blocks = batch.blocks
    blocks[0].srcdata["feat"] = ds.features[blocks[0].src_nodes]
    blocks[-1].dstdata["label"] = ds.labels[batch.output_nodes]
    assert (blocks[0].overlap is not None) == overlap
    out = []
    for clock in (None, LayerClock(torch.device("cpu"))):
        torch.manual_seed(0)
        model = build_model(model_name, ds.features.shape[1], 8, ds.num_classes, num_layers=3, heads=2, dropout=0.3)
        loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"], clock=clock),
                                   blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*out))
    clock.close(0)
    [(_, s)] = clock.ready()
    assert len(s.forward) == len(s.backward) == 3 and all(x > 0 for x in s.forward + s.backward)
