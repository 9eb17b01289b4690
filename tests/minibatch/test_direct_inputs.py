"""Split ranks that read their input rows from the shared table (``input_features="direct"``) train exactly as
ranks that shuffle them (the paper's way, ``"shuffle"``), with one id exchange and one all-to-all fewer."""

from __future__ import annotations

import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, split_cross_entropy
from gsplit.sampling.block import ShuffleIndex
from gsplit.run.trainer import TrainConfig
from test_split_parity import BATCH, DROPOUT, FANOUTS, FEAT_DIM, ITERS, NUM_CLASSES, make_problem, reference, rel_err


def train_both_ways(rank, world_size, overlap):
    graph, feats, labels, train_idx = make_problem()
    owner = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(5)) % world_size
    out = {}
    for mode in ("shuffle", "direct"):
        torch.manual_seed(0)
        model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), dropout=DROPOUT).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner,
                            use_ddp=True, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats,
                            labels=labels, input_features=mode, overlap=overlap)
        assert loader.reads_inputs == (mode == "direct")
        loader.comm.traffic.reset()
        grads, inputs, srcs = [], [], []
        for it, (input_nodes, _, blocks) in enumerate(loader):
            if it == ITERS:
                break
            assert torch.equal(blocks[0].srcdata["feat"], feats[blocks[0].src_nodes])
            opt.zero_grad()
            loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"],
                                       blocks[-1])
            loss.backward()
            allreduce_gradients(model, loader.comm)
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            inputs.append(input_nodes.tolist())
            srcs.append(blocks[0].src_nodes.tolist())
            opt.step()
        out[mode] = {"grads": grads, "inputs": inputs, "srcs": srcs, "calls": dict(loader.comm.traffic.calls)}
    return out


@pytest.mark.parametrize("world_size,overlap", [(2, False), (3, False), (2, True)])
def test_direct_inputs_train_exactly_as_shuffled_ones(world_size, overlap):
    per_rank = launch(train_both_ways, world_size, args=(overlap,), devices="cpu")
    ref = reference("sage", world_size)
    for r, res in enumerate(per_rank):
        for it in range(ITERS):
            # the same blocks; a direct rank's inputs are its block's sources, a shuffling rank's its own rows
            assert res["direct"]["srcs"][it] == res["shuffle"]["srcs"][it]
            assert res["direct"]["inputs"][it] == res["direct"]["srcs"][it]
            for name, g_ref in ref["grads"][it].items():
                assert rel_err(res["direct"]["grads"][it][name], g_ref) < 1e-10, f"rank {r}: {name} at {it}"
                assert torch.equal(res["direct"]["grads"][it][name], res["shuffle"]["grads"][it][name])
    for it in range(ITERS):
        shuffled = [v for res in per_rank for v in res["shuffle"]["inputs"][it]]
        assert len(shuffled) == len(set(shuffled))  # shuffle: every row loaded by one rank only
    # per iteration: the bottom id exchange and the feature shuffle are gone, nothing else changed
    shuffle_calls, direct_calls = per_rank[0]["shuffle"]["calls"], per_rank[0]["direct"]["calls"]
    gone = {tag: n for tag, n in shuffle_calls.items() if direct_calls.get(tag, 0) != n}
    assert {"ids/layer0", "shuffle/layer0/fwd"} <= set(gone), gone
    assert all(tag.startswith(("ids/layer0", "shuffle/layer0")) and tag not in direct_calls for tag in gone), gone
    assert all(tag in shuffle_calls for tag in direct_calls)


def test_read_directly_plan_sends_nothing():
    index = ShuffleIndex.read_directly(4, rank=2, world_size=3, tag="shuffle/layer0")
    assert index.send_counts == [0, 0, 4] and index.recv_counts == [0, 0, 4]
    assert index.counts_to_others(2) == ([0, 0, 0], [0, 0, 0])
    assert index.send_idx.tolist() == index.recv_pos.tolist() == [0, 1, 2, 3] and index.num_local == index.num_mixed


def test_input_features_is_checked():
    graph, feats, labels, train_idx = make_problem()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    with pytest.raises(ValueError, match="input_features='sideways'; pass 'auto', 'direct' or 'shuffle'"):
        DataLoader(graph, train_idx, sampler, features=feats, input_features="sideways")
    with pytest.raises(ValueError, match="input_features"):
        TrainConfig(input_features="sideways")


@pytest.mark.parametrize("mode", ["auto", "direct", "shuffle"])
def test_one_rank_reads_its_inputs_directly(mode):
    """A single rank owns every row: whatever the mode, it reads its first block's sources from the table (no
    self-shuffle that would only permute a copy), with the same rows in the same order."""
    graph, feats, labels, train_idx = make_problem()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    loader = DataLoader(graph, train_idx, sampler, features=feats, input_features=mode, batch_size=16)
    assert loader.reads_inputs
    input_nodes, _, blocks = next(iter(loader))
    assert torch.equal(input_nodes, blocks[0].src_nodes)
    assert torch.equal(blocks[0].srcdata["feat"], feats[blocks[0].src_nodes])
    assert blocks[0].shuffle_index.counts_to_others(0) == ([0], [0])


def test_one_rank_split_makes_the_plain_samplers_blocks():
    """A single rank's split sampling keeps each frontier in its order (no sort), so its blocks are the
    single-process sampler's, every shuffle plan is the identity and ``gsplit.shuffle`` hands back its input
    as it is (no copy); overlap plans are not made (nothing to hide)."""
    graph, feats, labels, train_idx = make_problem()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    loader = DataLoader(graph, train_idx, sampler, features=feats, batch_size=16, overlap=True)
    assert not loader.overlap
    for it, (input_nodes, output_nodes, blocks) in zip(range(3), loader):
        ref = sampler.sample_layers(graph, output_nodes, 0, it).blocks
        for block, plain in zip(blocks, ref):
            assert block.overlap is None and block.shuffle_index.identity
            for name in ("src_nodes", "edge_src", "edge_dst"):
                assert torch.equal(getattr(block, name), getattr(plain, name)), name
            assert block.num_dst == plain.num_dst
            h = torch.randn(block.num_src_nodes(), 4)
            assert gsplit.shuffle(h, block) is h
        with pytest.raises(ValueError, match="h has 3 rows but block has"):
            gsplit.shuffle(torch.randn(3, 4), blocks[1])


@pytest.mark.parametrize("model_name", ["sage", "gat"])
def test_one_rank_split_training_equals_single_process_bit_for_bit(model_name):
    """With the plain sampler's blocks a single split rank computes exactly what one process does: the same
    losses and gradients, bit for bit (float64, dropout on), where other world sizes agree to rounding."""
    from test_split_parity import reference, train_steps

    graph, feats, labels, train_idx = make_problem()
    got = train_steps(model_name, graph, feats, labels, train_idx, torch.zeros(graph.num_nodes, dtype=torch.long), 1)
    ref = reference(model_name, 1)
    assert got["losses"] == ref["losses"]
    for it, (g, g_ref) in enumerate(zip(got["grads"], ref["grads"])):
        for name, value in g_ref.items():
            assert torch.equal(g[name], value), f"iteration {it}: {name}"
