"""Memory at Papers100M scale, proven on the CPU with spies: graph hashing (at most once per rank, never
of a device graph), no full-size temporary in the feature check, the graph pinned in place (no pinned
copy per rank), and one small owner array per device shared by a rank's loaders."""

import pytest
import torch

import gsplit
from gsplit.data import finite as finite_module
from gsplit.data.graph import Graph
from gsplit.ops import cuda as cuda_kernels
from gsplit.ops import pinning
from gsplit.partitioning.partition_map import PartitionMap, owner_tensor


def _graph(n=300, e=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edges(torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g), n)


@pytest.fixture
def hashes(monkeypatch):
    """Counts every structure hash (``Graph._hash_structure``) in this process."""
    calls = []
    real = Graph._hash_structure

    def counting(self):
        calls.append(self.device.type)
        return real(self)

    monkeypatch.setattr(Graph, "_hash_structure", counting)
    return calls


# ------------------------------------------------------------------ (a) fingerprint: at most one hash per rank
def test_moving_a_graph_keeps_its_fingerprint(hashes):
    g = _graph()
    fp = g.fingerprint()
    assert len(hashes) == 1
    for device in ("cpu", "meta"):  # "meta" stands for a GPU: its data cannot be read back at all
        assert g.to(device).fingerprint() == fp
    assert len(hashes) == 1, hashes


def test_owner_lookup_never_hashes_a_device_graph(hashes):
    """On main the owner lookup hashed the device graph by copying it back; a meta graph cannot even be copied."""
    g = _graph()
    pmap = PartitionMap.from_tensor(torch.arange(g.num_nodes) % 2, num_parts=2, graph=g)  # hashes g once
    on_device = g.to("meta")
    assert owner_tensor(pmap, on_device, 2).tolist() == pmap.assignment.tolist()
    assert owner_tensor(torch.arange(g.num_nodes) % 2, on_device, 2).tolist() == pmap.assignment.tolist()
    assert hashes == ["cpu"], hashes
    with pytest.raises(ValueError, match="fingerprint"):  # a map for another graph is still refused
        owner_tensor(pmap, _graph(seed=1), 2)


def test_owner_array_is_narrow_and_shared_when_already_narrow():
    g = _graph()
    owner = owner_tensor(torch.arange(g.num_nodes) % 3, g, 3)
    assert owner.dtype == torch.int8
    assert owner_tensor(owner, g, 3).data_ptr() == owner.data_ptr()  # no copy per loader
    assert owner_tensor(None, g, 1).dtype == torch.int8
    assert PartitionMap.from_tensor(torch.arange(g.num_nodes) % 300, num_parts=300).assignment.dtype == torch.int16


# ------------------------------------------------------------------ (b) the NaN check has no full-size temporary
def test_feature_check_reads_the_features_in_chunks(monkeypatch):
    ds = gsplit.datasets.load("synthetic", num_nodes=2000, avg_degree=4, feature_dim=16, seed=0)
    features = ds.features.clone()
    chunk_bytes = 100 * 16 * 4  # 100 rows
    monkeypatch.setattr(finite_module, "_CHECK_BYTES", chunk_bytes, raising=False)
    seen = []  # the elements of every tensor that the check scans (aminmax: every chunk; isfinite: a bad one)
    real_isfinite, real_aminmax = torch.isfinite, torch.aminmax
    monkeypatch.setattr(torch, "isfinite", lambda t: (seen.append(t.numel()), real_isfinite(t))[1])
    monkeypatch.setattr(torch, "aminmax", lambda t: (seen.append(t.numel()), real_aminmax(t))[1])
    gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([2]), batch_size=64, features=features,
                      labels=ds.labels)
    assert seen and max(seen) <= chunk_bytes // 4 < features.numel(), (max(seen), features.numel())
    assert sum(seen) >= features.numel()  # every row was read
    features[1537, 3] = float("inf")
    seen.clear()
    with pytest.raises(ValueError, match="features row 1537 holds NaN or inf"):
        gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([2]), batch_size=64, features=features,
                          labels=ds.labels)
    assert max(seen) <= chunk_bytes // 4


def test_features_that_turn_nan_after_loading_are_still_caught_by_the_loader():
    """The dataset checked its features when it was built; normalising them in place afterwards (a zero
    standard deviation) can make NaN, which the loader's own scan must still find."""
    ds = gsplit.datasets.load("synthetic", num_nodes=500, avg_degree=4, feature_dim=8, seed=0)
    ds.features[:, 5] = 0.0
    ds.features -= ds.features.mean(0)
    ds.features /= ds.features.std(0)  # column 5: 0 / 0
    with pytest.raises(ValueError, match="features row 0 holds NaN or inf"):
        gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([2]), batch_size=64, features=ds.features,
                          labels=ds.labels)


# ------------------------------------------------------------------ (c) the graph is pinned in place
@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA and CuPy "available"; every page-lock request recorded as (address, bytes) and refused as a copy."""
    registered = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_kernels, "cupy_available", lambda: True)
    monkeypatch.setattr(pinning, "register_in_place",
                        lambda t, policy=None, step=None, where=None:
                        (registered.append((t.data_ptr(), t.numel() * t.element_size())) or True, ""))

    def no_copy(self, *args, **kwargs):
        raise AssertionError("Tensor.pin_memory copies into torch's pinned allocator (rounded up to a power of two)")

    monkeypatch.setattr(torch.Tensor, "pin_memory", no_copy)
    return registered


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared-memory"])
def test_uva_pins_the_graph_in_place(fake_cuda, shared):
    g = _graph()
    if shared:  # what ranks started by gsplit.launch receive: the graph in one shared-memory segment per host
        g.indptr.share_memory_()
        g.indices.share_memory_()
    addresses = (g.indptr.data_ptr(), g.indices.data_ptr())
    pinned = g.pin_memory()
    assert pinned is g and (pinned.indptr.data_ptr(), pinned.indices.data_ptr()) == addresses
    assert fake_cuda == [(addresses[0], (g.num_nodes + 1) * 8), (addresses[1], g.num_edges * 8)]
    assert sum(b for _, b in fake_cuda) == (g.num_nodes + 1 + g.num_edges) * 8  # exact bytes, no rounding


def test_trainer_uva_keeps_one_host_graph(fake_cuda, monkeypatch):
    from gsplit.run.trainer import TrainConfig, rank_graph

    g = _graph()
    monkeypatch.setattr(Graph, "to", lambda self, device: pytest.fail(f"uva copied the graph to {device}"))
    assert rank_graph(g, torch.device("cuda", 0), uva=True) is g
    assert [a for a, _ in fake_cuda] == [g.indptr.data_ptr(), g.indices.data_ptr()]
    with pytest.raises(ValueError, match="uva=True.*device='cpu'"):
        TrainConfig(uva=True, device="cpu")


def test_cli_refuses_uva_without_a_gpu(capsys):
    from gsplit.cli import main

    assert main(["train", "--uva", "--device", "cpu", "--epochs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gsplit: error: --uva") and "--device is cpu" in err[0]


# ------------------------------------------------------------------ (d) one owner array per device, per rank
def _spy_rank(rank, world_size, cfg, ds, pmap):
    """Train as `gsplit train` does, recording every loader's owner array and every graph hash."""
    from gsplit.minibatch import loader as loader_module
    from gsplit.run.trainer import train_rank

    owners, hashed = [], []
    real_init, real_hash = loader_module.DataLoader.__init__, Graph._hash_structure

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        owners.append(self.owner)

    def hash_structure(self):
        hashed.append(self.device.type)
        return real_hash(self)

    loader_module.DataLoader.__init__ = init
    Graph._hash_structure = hash_structure
    train_rank(rank, world_size, cfg, ds, pmap)
    return {"dtypes": sorted({str(o.dtype) for o in owners}), "arrays": len({o.data_ptr() for o in owners}),
            "loaders": len(owners), "hashes": len(hashed)}


@pytest.mark.slow
def test_a_ranks_loaders_share_one_small_owner_array():
    from gsplit.run.trainer import TrainConfig

    ds = gsplit.datasets.load("synthetic", num_nodes=1500, avg_degree=4, feature_dim=8, seed=0)
    pmap = PartitionMap.from_tensor(torch.arange(ds.graph.num_nodes) % 2, num_parts=2, graph=ds.graph)
    ds.graph.__dict__.pop("_fingerprint")  # the ranks must compute it themselves: at most once each
    cfg = TrainConfig(fanouts=[3, 3], batch_size=64, hidden=8, epochs=1, max_iters=1, eval_every=0)
    for rank, seen in enumerate(gsplit.launch(_spy_rank, 2, args=(cfg, ds, pmap))):
        assert seen["loaders"] == 3 and seen["arrays"] == 1, (rank, seen)   # train, val, test: one array
        assert seen["dtypes"] == ["torch.int8"], (rank, seen)
        assert seen["hashes"] <= 1, (rank, seen)


# ------------------------------------------------------------------ the memory model counts what gsplit holds
def test_memory_model_counts_the_bytes_gsplit_holds(monkeypatch):
    """experiments/memory.py's model (the README's "Memory at scale") against the tensors of a real dataset."""
    import sys
    from pathlib import Path

    pytest.importorskip("psutil")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "experiments"))
    memory = pytest.importorskip("memory")
    ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=6, feature_dim=128, seed=0)
    owner = gsplit.partition(ds.graph, 8, method="random").assignment
    ids = ds.train_idx.numel() + ds.val_idx.numel() + ds.test_idx.numel()
    model = memory.memory_model(ds.graph.num_nodes, ds.graph.num_edges, 128, 8, ids, rank_process_bytes=0)
    held = [ds.graph.indptr, ds.graph.indices, ds.features, ds.labels, ds.train_idx, ds.val_idx, ds.test_idx, owner]
    assert model["totals"]["host_shared"] == sum(t.numel() * t.element_size() for t in held)
    graph_row = next(v for k, v in model["rank_gpu"].items() if k.startswith("graph copy"))
    assert graph_row == ds.graph.indptr.nbytes + ds.graph.indices.nbytes
    owner_row = next(v for k, v in model["rank_gpu"].items() if k.startswith("owner map"))
    assert owner_row == owner_tensor(owner, ds.graph, 8).nbytes  # the one narrow array per GPU
    sys.modules.pop("memory", None)
