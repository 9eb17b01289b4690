"""The trainer's counters, for both systems, come from the code paths and say what the paper says.

One 2-rank launch trains one epoch with split parallelism and one with data parallelism through
``gsplit.run.trainer.train_rank``; the logs are checked against the single-process reference sampler:

* split: features of each input vertex loaded exactly once per iteration, each mini-batch edge and
  vertex computed exactly once (sums over ranks equal the reference mini-batch);
* data parallel: each rank's counts are its micro-batch's; the sums are at least split's, strictly
  more where micro-batches overlap;
* split traffic: the id exchange of each layer sends each rank's remote mixed-frontier rows, the
  forward shuffle sends back exactly the rows other ranks requested, the backward shuffle the
  gradients of the rows received; data parallelism sends nothing but gradients (not counted).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.sampling.batches import epoch_permutation, num_iterations
from gsplit.run.trainer import TrainConfig, train_rank

WORLD = 2
BATCH = 16            # per rank
FANOUTS = [4, 3]
HIDDEN = 8
SEED = 5
NUM_TRAIN = 7 * BATCH * WORLD + BATCH // 2   # the last global batch fills only part of rank 0's micro-batch


def make_dataset():
    ds = gsplit.datasets.make_synthetic(num_nodes=400, avg_degree=8, num_communities=4, feature_dim=6,
                                        num_classes=3, seed=1)
    return dataclasses.replace(ds, train_idx=ds.train_idx[:NUM_TRAIN])


def _both_systems(rank, world_size, ds, owner):
    """Rank body: one epoch of each system through the same trainer, in one process group."""
    logs = {}
    for system in ("split", "dp"):
        cfg = TrainConfig(model="sage", fanouts=FANOUTS, batch_size=BATCH, hidden=HIDDEN, epochs=1, system=system,
                          seed=SEED, eval_every=1, device="cpu",
                          input_features="shuffle")  # the paper's counters: every input row loaded once
        logs[system] = train_rank(rank, world_size, cfg, ds, owner if system == "split" else None)
    return logs


@pytest.fixture(scope="module")
def run():
    ds = make_dataset()
    owner = torch.randint(0, WORLD, (ds.num_nodes,), generator=torch.Generator().manual_seed(2))
    logs = launch(_both_systems, WORLD, args=(ds, owner), devices="cpu", backend="gloo", timeout=300)[0]
    sampler = gsplit.NeighborSampler(FANOUTS, seed=SEED)
    order = epoch_permutation(ds.train_idx, SEED, 0, True)
    gb = BATCH * WORLD
    iters = num_iterations(ds.train_idx.numel(), BATCH, WORLD)
    seeds = [order[it * gb:(it + 1) * gb] for it in range(iters)]
    refs = [sampler.sample_blocks(ds.graph, s, epoch=0, iteration=it) for it, s in enumerate(seeds)]
    micro = [[sampler.sample_blocks(ds.graph, s[r * BATCH:(r + 1) * BATCH], epoch=0, iteration=it)
              for r in range(WORLD)] for it, s in enumerate(seeds)]
    return {"ds": ds, "owner": owner, "logs": logs, "refs": refs, "micro": micro, "iters": iters}


def per_iteration(log, rank):
    return log["epochs"][0]["ranks"][rank]["per_iteration"]


def test_logs_are_json_and_hold_per_iteration_records_of_every_rank(run):
    assert run["iters"] == 8 and run["micro"][-1][1][-1].num_dst_nodes() == 0  # rank 1's last micro-batch is empty
    for system, log in run["logs"].items():
        again = json.loads(json.dumps(log))
        rec = again["epochs"][0]
        assert len(rec["ranks"]) == WORLD
        for r in range(WORLD):
            its = per_iteration(again, r)
            assert [i["iteration"] for i in its] == list(range(run["iters"])), system
            for i in its:
                assert min(i["sample_s"], i["load_s"], i["train_s"]) >= 0
                assert len(i["edges"]) == len(i["dst_vertices"]) == len(FANOUTS)
                assert isinstance(i["minor_faults"], int) and i["minor_faults"] >= 0
            assert rec["ranks"][r]["iterations"] == run["iters"]
            assert math.isclose(sum(i["train_s"] for i in its), rec["ranks"][r]["train_s"], rel_tol=1e-9)
        assert math.isfinite(rec["loss"]), f"{system}: loss {rec['loss']} (an empty micro-batch must not give NaN)"
        assert 0.0 <= rec["val_acc"] <= 1.0 and 0.0 <= rec["test_acc"] <= 1.0


def test_a_record_counts_the_pages_its_iteration_mapped_in():
    """``minor_faults`` of a per-iteration record: the pages mapped in fresh since the previous record (a fresh
    rank's first iterations fault its heap in, which can double them on a VM)."""
    from gsplit.run.counters import _faults_between
    from gsplit.runtime.resources import minor_page_faults

    before = minor_page_faults()
    if before is None:
        pytest.skip("no resource module on this platform")
    import mmap

    size = 64 << 20
    # an anonymous mapping of its own: fresh pages whatever the allocator keeps (a bytearray can reuse heap pages
    # a test before faulted in, once the process keeps its freed heap: gsplit.runtime.resources.keep_freed_heap)
    buf = mmap.mmap(-1, size)
    for offset in range(0, size, 4096):
        buf[offset] = 1
    assert _faults_between(before, minor_page_faults()) >= 8000  # 16,384 pages written
    assert _faults_between(None, before) is None and _faults_between(before, None) is None


def test_split_loads_each_feature_once_and_computes_each_edge_once(run):
    log = run["logs"]["split"]
    for it, ref in enumerate(run["refs"]):
        recs = [per_iteration(log, r)[it] for r in range(WORLD)]
        assert sum(x["input_rows"] for x in recs) == ref[0].num_src_nodes(), f"iteration {it}: features loaded"
        for layer, blk in enumerate(ref):
            assert sum(x["edges"][layer] for x in recs) == blk.num_edges(), f"iteration {it} layer {layer}"
            assert sum(x["dst_vertices"][layer] for x in recs) == blk.num_dst_nodes()
        assert sum(x["targets"] for x in recs) == ref[-1].num_dst_nodes()
    rec = log["epochs"][0]
    assert rec["input_rows"] == sum(ref[0].num_src_nodes() for ref in run["refs"])
    assert rec["edges"] == [sum(ref[l].num_edges() for ref in run["refs"]) for l in range(len(FANOUTS))]
    assert rec["dst_vertices"] == [sum(ref[l].num_dst_nodes() for ref in run["refs"]) for l in range(len(FANOUTS))]


def test_data_parallel_counts_its_micro_batches_and_repeats_work(run):
    log = run["logs"]["dp"]
    for it, blocks_per_rank in enumerate(run["micro"]):
        for r, blocks in enumerate(blocks_per_rank):
            x = per_iteration(log, r)[it]
            assert x["input_rows"] == blocks[0].num_src_nodes()
            assert x["edges"] == [b.num_edges() for b in blocks]
            assert x["dst_vertices"] == [b.num_dst_nodes() for b in blocks]
            assert x["traffic_rows"] == {}  # no sampling exchange, no shuffle
    dp, sp = log["epochs"][0], run["logs"]["split"]["epochs"][0]
    assert dp["input_rows"] > sp["input_rows"], "micro-batches overlap, so data parallelism loads more"
    assert all(d >= s for d, s in zip(dp["edges"], sp["edges"]))
    assert dp["edges"][0] > sp["edges"][0]
    assert dp["edges"][-1] == sp["edges"][-1]  # the top layer's edges belong to disjoint targets
    assert dp["traffic_bytes"] == 0


def _plain_tags(by_tag: dict) -> dict:
    """``shuffle/layerN/overlap/fwd`` counted as ``shuffle/layerN/fwd`` (the same rows, sent asynchronously)."""
    out = {}
    for tag, n in by_tag.items():
        key = tag.replace("/overlap/", "/")
        out[key] = out.get(key, 0) + n
    return dict(sorted(out.items()))


def mixed_frontiers(ref, owner):
    """Per layer and rank: the vertices of the rank's mixed frontier (its destinations and their sampled sources)."""
    out = []
    for blk in ref:
        dst = blk.dst_nodes[blk.edge_dst]
        src = blk.src_nodes[blk.edge_src]
        out.append([torch.unique(torch.cat([blk.dst_nodes[owner[blk.dst_nodes] == r], src[owner[dst] == r]]))
                    for r in range(WORLD)])
    return out


def test_split_traffic_equals_the_mixed_frontier_rows_exchanged(run):
    log, owner, ds = run["logs"]["split"], run["owner"], run["ds"]
    row_bytes = {0: ds.feature_dim * 4}  # float32 input features, then float32 hidden rows
    row_bytes.update({l: HIDDEN * 4 for l in range(1, len(FANOUTS))})
    totals = {}
    for it, ref in enumerate(run["refs"]):
        mixed = mixed_frontiers(ref, owner)
        for r in range(WORLD):
            # overlapped layers (gsplit train's default) count their asynchronous shuffles under .../overlap/...
            t_rows = _plain_tags(per_iteration(log, r)[it]["traffic_rows"])
            t_bytes = _plain_tags(per_iteration(log, r)[it]["traffic_bytes"])
            for layer in range(len(FANOUTS)):
                remote_in = int((owner[mixed[layer][r]] != r).sum())              # rows r receives
                asked_of_r = sum(int((owner[mixed[layer][j]] == r).sum()) for j in range(WORLD) if j != r)
                assert t_rows.get(f"ids/layer{layer}", 0) == remote_in, (it, r, layer)
                assert t_bytes.get(f"ids/layer{layer}", 0) == 8 * remote_in
                assert t_rows.get(f"shuffle/layer{layer}/fwd", 0) == asked_of_r, (it, r, layer)
                assert t_bytes.get(f"shuffle/layer{layer}/fwd", 0) == asked_of_r * row_bytes[layer]
                # the input features have no gradient; hidden rows send their gradients back to the owners
                bwd = 0 if layer == 0 else remote_in
                assert t_rows.get(f"shuffle/layer{layer}/bwd", 0) == bwd, (it, r, layer)
            for tag, n in t_rows.items():
                totals[tag] = totals.get(tag, 0) + n
    rec = log["epochs"][0]
    assert _plain_tags(rec["traffic_rows_by_tag"]) == dict(sorted(totals.items()))
    assert all(rec["traffic_rows_by_tag"][f"ids/layer{l}"] > 0 for l in range(len(FANOUTS)))
    assert rec["traffic_bytes"] == sum(rec["traffic_bytes_by_tag"].values()) > 0
    # summed over ranks, what the forward shuffles send is what the ranks received: their remote rows
    for layer in range(len(FANOUTS)):
        assert totals[f"shuffle/layer{layer}/fwd"] == totals[f"ids/layer{layer}"]
