"""Where the GPU path samples, and that training on a GPU really runs the CUDA sampling kernel.

The CPU tests check the decision rule; the ``gpu`` ones count kernel launches during training (a GPU run
with the graph left on the host used to sample on the CPU and time CPU sampling as GPU sampling).
"""

import pytest
import torch

import gsplit
from gsplit import ops
from gsplit.ops import cuda


def test_host_graph_that_is_not_pinned_is_sampled_on_the_host():
    g = gsplit.Graph.from_edges([0, 1, 2], [1, 2, 0])
    assert ops.sampling_device(g, torch.device("cpu")) == torch.device("cpu")
    assert ops.sampling_device(g, torch.device("cuda", 0)) == torch.device("cpu")


def test_loader_samples_where_the_rule_says():
    ds = gsplit.datasets.load("synthetic", num_nodes=500, avg_degree=4, feature_dim=4, seed=0)
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([3, 3]), batch_size=32,
                               features=ds.features, labels=ds.labels)
    assert loader.sample_device == torch.device("cpu")
    input_nodes, output_nodes, blocks = next(iter(loader))
    assert blocks[0].srcdata["feat"].shape[0] == blocks[0].num_src_nodes()


def _gpu_with_kernels() -> bool:
    return torch.cuda.is_available() and cuda.cupy_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_with_kernels(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("system", ["split", "dp"])
def test_training_on_the_gpu_samples_with_the_kernel(monkeypatch, system):
    from gsplit.run.trainer import TrainConfig, train_rank

    launched = []
    real = cuda._launch
    monkeypatch.setattr(cuda, "_launch", lambda module, kernel, *a: (launched.append(kernel), real(module, kernel, *a)))
    ds = gsplit.datasets.load("synthetic", num_nodes=2000, avg_degree=8, feature_dim=16, seed=1)
    cfg = TrainConfig(model="sage", fanouts=[5, 5], batch_size=100, hidden=16, epochs=1, eval_every=0,
                      system=system, device="cuda", max_iters=3)
    train_rank(0, 1, cfg, ds, None)
    assert launched.count("gsplit_sample_fill") >= 3 * 2, launched[:20]  # 3 iterations x 2 layers


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_with_kernels(), reason="needs a CUDA GPU and CuPy")
def test_pinned_host_graph_is_sampled_on_the_gpu():
    g = gsplit.Graph.from_edges(torch.randint(0, 300, (3000,)), torch.randint(0, 300, (3000,)), 300).pin_memory()
    dev = torch.device("cuda", torch.cuda.current_device())
    assert ops.sampling_device(g, dev) == dev
    blocks = gsplit.NeighborSampler([4, 4]).sample_blocks(g.to("cpu"), torch.arange(10))
    got = gsplit.NeighborSampler([4, 4]).sample_blocks(g, torch.arange(10, device=dev))
    for a, b in zip(blocks, got):
        assert b.src_nodes.is_cuda and torch.equal(a.src_nodes, b.src_nodes.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_with_kernels(), reason="needs a CUDA GPU and CuPy")
def test_pinning_is_undone_when_the_tensor_dies():
    """GPU-NOTES suspect 2: a freed, still-registered range reused by a new tensor must not read stale pages."""
    from gsplit.data.feature_store import FeatureStore

    for _ in range(5):
        t = torch.randn(1 << 16, 64)
        assert cuda.pin_in_place(t)
        del t
    feats = torch.randn(1 << 16, 64)
    store = FeatureStore(feats, device="cuda", cache_size=0)
    ids = torch.randint(0, feats.shape[0], (5000,))
    assert torch.equal(store.gather(ids).cpu(), feats[ids])
