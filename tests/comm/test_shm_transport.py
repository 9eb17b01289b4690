"""The shared-memory all-to-all (``GSPLIT_CPU_TRANSPORT=shm``, :mod:`gsplit.comm.shm`) gives gloo's results.

Real gloo launches of 2 and 3 CPU ranks: every exchange is done both ways (the Communicator with the
shared-memory transport, and ``torch.distributed.all_to_all_single`` on gloo) and compared exactly,
for random counts with zeros, growing and shrinking sizes (slot growth, both halves), several dtypes
and row widths, rows sent back the other way, the counted id exchange, and a whole split training run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gsplit
from gsplit.comm import shm
from gsplit.comm.communicator import Communicator
from gsplit.launcher import launch
from gsplit.run.trainer import TrainConfig, train_rank

pytestmark = pytest.mark.skipif(not shm.supported(), reason="the shm transport needs x86-64 Linux with /dev/shm")

DTYPES = [(torch.float32, (5,)), (torch.int64, ()), (torch.float16, (3, 2)), (torch.uint8, (7,)), (torch.float64, (1,))]


def _gloo(x, send, recv):
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send)
    return out


def _exchanges(rank, world, steps):
    os.environ[shm.ENV] = "shm"
    comm = Communicator()
    assert comm.transport == "shm"
    gen = torch.Generator().manual_seed(11)
    checked = 0
    for step in range(steps):
        dtype, tail = DTYPES[step % len(DTYPES)]
        scale = [0, 3, 40, 900, 5, 2000, 1][step % 7]  # grows, shrinks, grows again: both halves, new slots
        counts = torch.randint(0, scale + 1, (world, world), generator=gen)
        counts[torch.rand(world, world, generator=gen) < 0.3] = 0  # zeros, also a whole row or column now and then
        send, recv = counts[rank].tolist(), counts[:, rank].tolist()
        x = (torch.randn((sum(send),) + tail, generator=torch.Generator().manual_seed(100 * step + rank)) * 50)
        x = x.to(dtype)
        got = comm.all_to_all_rows(x, send, recv, tag="t")
        want = _gloo(x, send, recv)
        assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want), (step, rank)
        back = comm.all_to_all_rows(got, recv, send, tag="t/bwd")  # the other direction: x comes back
        assert torch.equal(back, x), (step, rank)
        checked += 2
    assert comm.transport == "shm" and comm._shm.k == checked
    # the counted id exchange (ids and counts in one buffer) over the same transport
    ids = torch.arange(10 * rank, 10 * rank + 7)
    dest = torch.tensor([0, 0, 1, 1, 1, world - 1, world - 1])
    got, sent, recvd = comm.all_to_all_counted(ids, dest, "ids")
    want = _gloo(ids, sent, recvd)
    assert torch.equal(got, want) and sent == torch.bincount(dest, minlength=world).tolist()
    dist.barrier()
    return sorted(p.name for p in Path("/dev/shm").glob(f"{comm._shm._token}*"))


@pytest.mark.parametrize("world", [2, 3])
def test_shm_all_to_all_equals_gloo_for_random_counts_dtypes_and_sizes(world):
    left = launch(_exchanges, world, args=(21,), devices="cpu", backend="gloo", timeout=300)
    assert left == [[]] * world  # every pair file was unlinked once both ends had mapped it


def test_transport_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv(shm.ENV, "shm")
    assert shm.requested()
    monkeypatch.setenv(shm.ENV, "gloo")
    assert not shm.requested()
    monkeypatch.setenv(shm.ENV, "tcp")
    with pytest.raises(ValueError, match="GSPLIT_CPU_TRANSPORT='tcp'"):
        shm.requested()
    monkeypatch.delenv(shm.ENV)
    assert Communicator().transport == "gloo"  # the default, and a world of one has nothing to move


def _train(rank, world, ds, owner, transport):
    os.environ[shm.ENV] = transport
    cfg = TrainConfig(model="sage", fanouts=[4, 3, 2], batch_size=16, hidden=8, epochs=2, system="split",
                      seed=5, eval_every=0, final_eval=False, device="cpu")
    log = train_rank(rank, world, cfg, ds, owner)
    return ([e["loss"] for e in log["epochs"]], log["transport"]) if rank == 0 else None


def test_split_training_over_shared_memory_equals_gloo():
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    ds = dataclasses.replace(ds, train_idx=ds.train_idx[:160])
    owner = torch.randint(0, 2, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    runs = {t: launch(_train, 2, args=(ds, owner, t), devices="cpu", backend="gloo", timeout=180)[0]
            for t in ("gloo", "shm")}
    assert runs["gloo"][1] == "gloo" and runs["shm"][1] == "shm", runs
    assert runs["shm"][0] == runs["gloo"][0], runs  # the same losses, bit for bit
