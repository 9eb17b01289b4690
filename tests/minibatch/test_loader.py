"""DataLoader semantics that need no process group (world size 1) and its input checks."""

import pytest
import torch

import gsplit
from gsplit.baselines import DataParallelLoader
from gsplit.sampling.batches import epoch_permutation, num_iterations


def small_problem(n=120, num_edges=600, feat_dim=4, num_classes=3):
    """A seeded random symmetric graph with features and labels (also used by test_prefetch.py)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, n, (num_edges,), generator=g)
    dst = torch.randint(0, n, (num_edges,), generator=g)
    graph = gsplit.Graph.from_edges(src, dst, n, symmetric=True)
    feats = torch.randn(n, feat_dim, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    return graph, feats, labels


def test_world_one_yields_reference_batches():
    graph, feats, labels = small_problem()
    idx = torch.arange(0, 100)
    sampler = gsplit.NeighborSampler([3, 2], seed=4)
    loader = gsplit.DataLoader(graph, idx, sampler, batch_size=32, shuffle=True, ddp_seed=5,
                               features=feats, labels=labels)
    assert len(loader) == 4
    order = epoch_permutation(idx, 5, 0, True)
    for it, (input_nodes, output_nodes, blocks) in enumerate(loader):
        seeds = order[it * 32:(it + 1) * 32]
        ref = sampler.sample_blocks(graph, seeds, epoch=0, iteration=it)
        assert torch.equal(output_nodes, seeds)
        assert torch.equal(torch.sort(input_nodes).values, torch.sort(ref[0].src_nodes).values)
        assert torch.equal(blocks[0].srcdata["feat"], feats[blocks[0].src_nodes])
        assert torch.equal(blocks[-1].dstdata["label"], labels[seeds])
        for b, r in zip(blocks, ref):
            assert torch.equal(torch.sort(b.edge_ids).values, torch.sort(r.edge_ids).values)
        assert loader.last_stats.targets == seeds.numel()
        assert loader.last_stats.input_rows == ref[0].num_src_nodes()


def test_epochs_advance_and_set_epoch_repeats():
    graph, feats, labels = small_problem()
    loader = gsplit.DataLoader(graph, torch.arange(50), gsplit.NeighborSampler([2]), batch_size=10, shuffle=True)
    first = [o.tolist() for _, o, _ in loader]
    second = [o.tolist() for _, o, _ in loader]
    assert first != second, "a new pass must use a new epoch's order"
    loader.set_epoch(0)
    assert [o.tolist() for _, o, _ in loader] == first


def test_drop_last_and_len():
    assert num_iterations(10, 3, 1, False) == 4 and num_iterations(10, 3, 1, True) == 3
    assert num_iterations(10, 2, 2) == 3  # as DGL's use_ddp loader: ceil(ceil(10/2)/2)
    graph, _, _ = small_problem()
    loader = gsplit.DataLoader(graph, torch.arange(10), gsplit.NeighborSampler([2]), batch_size=3, drop_last=True)
    sizes = [o.numel() for _, o, _ in loader]
    assert sizes == [3, 3, 3] and len(loader) == 3


def test_data_parallel_loader_world_one_matches():
    graph, feats, labels = small_problem()
    sampler = gsplit.NeighborSampler([3, 2], seed=1)
    split = gsplit.DataLoader(graph, torch.arange(60), sampler, batch_size=16, shuffle=True, features=feats,
                              labels=labels)
    dp = DataParallelLoader(graph, torch.arange(60), sampler, batch_size=16, shuffle=True, features=feats,
                            labels=labels)
    for (i1, o1, b1), (i2, o2, b2) in zip(split, dp):
        assert torch.equal(o1, o2)
        assert torch.equal(torch.sort(i1).values, torch.sort(i2).values)
        assert torch.equal(b1[-1].dstdata["label"], b2[-1].dstdata["label"])


def test_loader_errors():
    graph, feats, labels = small_problem()
    s = gsplit.NeighborSampler([2])
    with pytest.raises(ValueError, match="id 500"):
        gsplit.DataLoader(graph, torch.tensor([1, 500]), s)
    with pytest.raises(ValueError, match="repeated"):
        gsplit.DataLoader(graph, torch.tensor([1, 1]), s)
    with pytest.raises(ValueError, match="batch_size=0"):
        gsplit.DataLoader(graph, torch.tensor([1]), s, batch_size=0)
    with pytest.raises(ValueError, match="features has 3 rows"):
        gsplit.DataLoader(graph, torch.tensor([1]), s, features=torch.zeros(3, 2))
    bad = feats.clone()
    bad[7, 1] = float("nan")
    with pytest.raises(ValueError, match="row 7"):
        gsplit.DataLoader(graph, torch.tensor([1]), s, features=bad)
    with pytest.raises(ValueError, match="2 parts but the world size is 1"):
        pmap = gsplit.PartitionMap.from_tensor(torch.arange(graph.num_nodes) % 2, 2, graph=graph)
        gsplit.DataLoader(graph, torch.tensor([1]), s, partition=pmap)
    other = gsplit.Graph.from_edges([0, 1], [1, 2], graph.num_nodes)
    with pytest.raises(ValueError, match="fingerprint|another graph|this graph"):
        pmap = gsplit.PartitionMap.from_tensor(torch.zeros(graph.num_nodes, dtype=torch.int64), 1, graph=other)
        gsplit.DataLoader(graph, torch.tensor([1]), s, partition=pmap)


def test_graphconv_symmetric_norm_refuses_split_blocks():
    from gsplit.nn import GraphConv
    from gsplit.sampling import ShuffleIndex

    graph, feats, _ = small_problem()
    block = gsplit.NeighborSampler([2]).sample_blocks(graph, torch.tensor([0, 1]))[0]
    GraphConv(4, 2, norm="both")(block, feats[block.src_nodes])  # fine on an unsplit block
    block.shuffle_index = ShuffleIndex(torch.zeros(0, dtype=torch.int64), [0], torch.zeros(0, dtype=torch.int64),
                                       [0], 0, block.num_src_nodes())
    with pytest.raises(ValueError, match="norm='right'"):
        GraphConv(4, 2, norm="both")(block, feats[block.src_nodes])
