"""Data-parallel link prediction (``system="dp"``, ``gsplit train --task link --system dp``): each rank samples
and scores its own slice of the global mini-batch's edges, as DGL's ``use_ddp=True`` loader does."""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.baselines.data_parallel import DataParallelLoader
from gsplit.cli import main
from gsplit.link import negative
from gsplit.link.edge_split import split_edges
from gsplit.link.train import LinkTrainConfig, train_link_rank


def _problem(num_nodes=400):
    ds = gsplit.datasets.load("synthetic", num_nodes=num_nodes, seed=2, feature_dim=6)
    return ds, split_edges(ds.graph, 0.05, 0.1, seed=0)


def _sampler(split, k=2):
    return gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([4, 3], seed=3), exclude="reverse_id",
                                             reverse_eids=split.reverse_eids, negative_sampler=negative.Uniform(k))


def test_micro_batches_share_the_global_batch_s_pairs_and_exclude_their_own_edges():
    _, split = _problem()
    s = _sampler(split)
    eids = torch.randperm(split.train_eids.numel(), generator=torch.Generator().manual_seed(1))[:50]
    whole = s.plan(split.graph, eids, 2, 7)
    parts = [s.plan_slice(split.graph, eids, 2, 7, r * 32, (r + 1) * 32) for r in range(2)]  # 32 + 18 edges
    assert [p.eids.numel() for p in parts] == [32, 18]
    for i in range(2):
        assert torch.equal(torch.cat([p.pos[i] for p in parts]), whole.pos[i])
        assert torch.equal(torch.cat([p.neg[i] for p in parts]), whole.neg[i])   # k = 2 per edge, in edge order
    for p in parts:  # only its own edges and their reverses, not the other rank's
        want = torch.unique(torch.cat([p.eids, split.reverse_eids[p.eids]]))
        assert torch.equal(p.excluded, want)
        assert torch.equal(p.seeds, torch.unique(torch.cat([*p.pos, *p.neg])))
    empty = s.plan_slice(split.graph, eids, 2, 7, 64, 96)    # a rank past the end of an uneven last batch
    assert empty.eids.numel() == 0 and empty.neg[0].numel() == 0 and empty.seeds.numel() == 0


def test_one_rank_dp_yields_the_split_loader_s_batches():
    ds, split = _problem()
    kw = dict(batch_size=48, shuffle=True, features=ds.features)
    dp = DataParallelLoader(split.graph, split.train_eids, _sampler(split), **kw)
    sp = gsplit.DataLoader(split.graph, split.train_eids, _sampler(split), **kw)
    for n, (a, b) in enumerate(zip(dp, sp)):
        for x, y in ((a.pair_graph, b.pair_graph), (a.neg_pair_graph, b.neg_pair_graph)):
            assert all(torch.equal(p, q) for p, q in zip(x.global_edges(), y.global_edges()))
        for x, y in zip(a.blocks, b.blocks):
            assert torch.equal(x.edge_ids, y.edge_ids) and torch.equal(x.src_nodes, y.src_nodes)
        assert torch.equal(a.blocks[0].srcdata["feat"], b.blocks[0].srcdata["feat"])
        assert dp.last_stats.input_rows == a.input_nodes.numel() > 0
        if n == 3:
            break


def test_dp_trains_on_two_ranks():
    """One rank of dp is split's one rank (the same losses); on two ranks every rank reports the same numbers,
    the loss falls, and the counters add up the ranks' work."""
    ds, split = _problem()
    cfg = dict(fanouts=[4, 3], hidden=8, epochs=3, neg_ratio=2, eval_negatives=20, hits_k=10, max_iters=6,
               lr=0.01)
    one_dp = train_link_rank(0, 1, LinkTrainConfig(system="dp", batch_size=64, **cfg), split, ds.features,
                             ds.graph, None)
    one_split = train_link_rank(0, 1, LinkTrainConfig(batch_size=64, **cfg), split, ds.features, ds.graph, None)
    assert [e["loss"] for e in one_dp["epochs"]] == [e["loss"] for e in one_split["epochs"]]
    two = gsplit.launch(train_link_rank, 2, args=(LinkTrainConfig(system="dp", batch_size=32, **cfg), split,
                                                  ds.features, ds.graph, None))
    losses = [e["loss"] for e in two[0]["epochs"]]
    assert losses[-1] < losses[0], losses
    for key in ("final_val_mrr", "final_test_mrr", "final_test_hits@10"):
        assert two[0][key] == two[1][key] and 1 / 21 <= two[0]["final_test_mrr"] <= 1, key
    first = two[0]["epochs"][0]
    assert first["input_rows"] > 0 and len(first["edges"]) == 2 and min(first["edges"]) > 0
    assert two[0]["config"]["system"] == "dp"


def test_dp_from_the_command_line(tmp_path, capsys):
    log = tmp_path / "run.jsonl"
    argv = ["train", "--task", "link", "--dataset", "synthetic", "-D", "num_nodes=600", "-D", "feature_dim=6",
            "--fanouts", "4,3", "--hidden", "8", "--batch-size", "64", "--epochs", "1", "--device", "cpu",
            "--eval-negatives", "20", "--hits-k", "10", "--num-ranks", "2", "--system", "dp", "--max-iters", "3",
            "--log", str(log)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "link prediction with dp on 2 rank(s)" in out and "partition map" not in out
    assert "final test: MRR" in out


def test_unknown_system_is_refused():
    with pytest.raises(ValueError, match="system='full'; link prediction trains with one of"):
        LinkTrainConfig(system="full")
