"""Host-device syncs: the counter itself, and the budget of one split iteration (loader + model).

On a GPU every ``.tolist()``, ``nonzero``, boolean-mask index, ``bincount`` or pageable copy makes the
host wait until the device has drained its queue. :class:`gsplit.ops.sync_counter.HostSyncCounter`
counts them per call site; with ``cpu_is_device=True`` it runs here, CPU tensors standing for device
tensors and the loader's host tables (features, labels, targets) for host memory.

The iteration runs the code a GPU run runs: ``GSPLIT_NO_EXTENSIONS=1`` (aggregation by the torch ops a
CUDA tensor takes) and, where a C++ compiler exists, sampling and relabelling by the CUDA kernels'
own wrappers (``gsplit.ops.cuda``) over the kernels compiled for the CPU (``kernel_emulation``); without
a compiler, by the plain-torch sampler that a GPU without CuPy runs.
"""

from __future__ import annotations

import collections
import os
import shutil

import pytest
import torch

import gsplit
from gsplit import ops
from gsplit.comm.gradients import allreduce_gradients
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model, split_cross_entropy
from gsplit.nn.dropout import _SALT, dropout_bank, vertex_dropout
from gsplit.ops import aggregate
from gsplit.ops.sync_counter import HostSyncCounter

NUM_LAYERS = 3
FANOUTS = [4, 3, 2]
BATCH = 16

SYNC_CALLS = {
    "item": lambda x, m: x.sum().item(),
    "tolist": lambda x, m: x.tolist(),
    "cpu": lambda x, m: x.cpu(),
    "numpy": lambda x, m: x.numpy(),
    "__bool__": lambda x, m: bool(x.sum()),
    "__int__": lambda x, m: int(x.sum()),
    "__float__": lambda x, m: float(x.sum()),
    "__index__": lambda x, m: [0, 1, 2][x[1]],
    "nonzero": lambda x, m: x.nonzero(),
    "torch.nonzero": lambda x, m: torch.nonzero(m),
    "where(cond)": lambda x, m: torch.where(m),
    "bool-mask getitem": lambda x, m: x[m],
    "bool-mask setitem": lambda x, m: x.__setitem__(m, 0),
    "masked_select": lambda x, m: torch.masked_select(x, m),
    "bincount": lambda x, m: torch.bincount(x),
    "unique": lambda x, m: torch.unique(x),
    "repeat_interleave": lambda x, m: torch.repeat_interleave(x, x),
    "tensor from values": lambda x, m: torch.tensor([x[0], x[1]]),
    "tensor of Python values on the device": lambda x, m: torch.tensor([1, 2], device=x.device),
}
"""Each of these forces one sync on CUDA and must count exactly once."""

NO_SYNC_CALLS = {
    "arithmetic": lambda x, m: (x * 2 + 1).sum(),
    "index_select": lambda x, m: x.index_select(0, x[:2]),
    "nonzero_static": lambda x, m: torch.nonzero_static(m, size=2),
    "repeat_interleave with output_size": lambda x, m: torch.repeat_interleave(x, x, output_size=15),
    "index_add_": lambda x, m: torch.zeros(6, dtype=x.dtype).index_add_(0, x, x),
    "shape": lambda x, m: x.shape[0] + x.numel(),
}


@pytest.mark.parametrize("name", list(SYNC_CALLS))
def test_counter_counts_each_sync_call_once(name):
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        x = torch.arange(6, device="cpu")         # a factory naming a device: a device tensor
        mask = x > 3
        SYNC_CALLS[name](x, mask)
    assert counter.total == 1, counter.report()
    assert counter.events[0].site.startswith(f"tests/ops/test_host_syncs.py:"), counter.report()


@pytest.mark.parametrize("name", list(NO_SYNC_CALLS))
def test_counter_ignores_calls_without_sync(name):
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        x = torch.arange(6, device="cpu")
        NO_SYNC_CALLS[name](x, x > 3)
    assert counter.total == 0, counter.report()


@pytest.mark.parametrize("machine_has_gpu", [False, True])
def test_counter_tells_host_from_device_tensors(machine_has_gpu, monkeypatch):
    # stand-in runs count alike on a machine with a GPU (the first GPU run found them counting differently)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: machine_has_gpu)
    table = torch.arange(10.0)
    counter = HostSyncCounter(cpu_is_device=True, host=[table])
    with counter:
        ids = torch.arange(3, device="cpu")
        host_ids = ids.cpu()                      # 1: a device-to-host read
        rows = table[host_ids] * 2                # host work: free
        rows.tolist()                             # a host tensor: free
        moved = rows.to(ids.device)               # 2: a blocking copy from pageable memory
        rows.to(ids.device, non_blocking=True)    # asynchronous: free (pinned on a GPU)
        moved.tolist()                            # 3: a device tensor again
        host_ids.new_zeros(2).tolist()            # made from a host tensor: free
    assert [e.kind for e in counter.events] == ["cpu", "pageable copy", "tolist"], counter.report()


def test_counter_sees_python_backward():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            g.tolist()
            return 2 * g

    counter = HostSyncCounter(cpu_is_device=True)
    x = torch.ones(3, requires_grad=True)
    with counter:
        Twice.apply(x).sum().backward()
    assert counter.total == 1 and "(backward)" in counter.events[0].site, counter.report()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_counter_names_the_line():
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        torch.arange(3, device="cpu").tolist()
    assert counter.by_site() == {f"tests/ops/test_host_syncs.py:{test_counter_names_the_line.__code__.co_firstlineno + 3} "
                                 "(test_counter_names_the_line): tolist": 1}


# ------------------------------------------------------------------------ one split iteration
def make_problem(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    n = 400
    src = torch.randint(0, n, (2400,), generator=g)
    dst = torch.randint(0, n, (2400,), generator=g)
    graph = gsplit.Graph.from_edges(src, dst, n, symmetric=True, remove_self_loops=True)
    feats = torch.randn(n, 8, generator=g)
    labels = torch.randint(0, 4, (n,), generator=g)
    train_idx = torch.randperm(n, generator=g)[:200]
    return graph, feats, labels, train_idx


def use_kernel_emulation(lib_path: str) -> None:
    """Route sampling and relabelling through gsplit.ops.cuda's wrappers over the kernels built for the CPU
    (in this process; a spawned rank calls it itself)."""
    import contextlib
    import ctypes

    import numpy as np
    from kernel_emulation import SerialKernel

    from gsplit.ops import cuda, sample_cuda

    lib = ctypes.CDLL(lib_path)
    cuda._function = lambda module, kernel: SerialKernel(lib, kernel)
    cuda._torch_stream = lambda device: contextlib.nullcontext()
    cuda._ptr = lambda t: np.uint64(t.data_ptr() if t.numel() else 0)
    cuda._MAX_BLOCKS = 2
    ops.sample_neighbors = sample_cuda.sample_neighbors
    ops.relabel = lambda dst_nodes, src, num_nodes=None: cuda.relabel(dst_nodes, src)
    ops.sample_neighbors_padded = sample_cuda.sample_neighbors_padded


def count_iteration(rank: int, world_size: int, model_name: str, lib_path=None, overlap: bool = False,
                    sizes_on_device: bool = False):
    """Syncs of one split iteration on this rank: the loader's batch, forward, loss, backward, gradient sum.

    ``sizes_on_device``: split sampling keeps its sizes on the device (:mod:`gsplit.split.deferred`, what a GPU
    with NCCL runs; a spawned rank switches it on for itself), and the iteration counted is the second, after
    the first has taught the id exchanges their slot capacities."""
    os.environ["GSPLIT_NO_EXTENSIONS"] = "1"
    if lib_path is not None:
        use_kernel_emulation(lib_path)
    if sizes_on_device:
        from gsplit.split import deferred
        deferred.sizes_on_device = lambda device, comm: comm.world_size > 1
    graph, feats, labels, train_idx = make_problem()
    owner = torch.arange(graph.num_nodes) % world_size
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=1), partition=owner,
                        use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, features=feats, labels=labels,
                        overlap=overlap)
    torch.manual_seed(0)
    model = build_model(model_name, 8, 8, 4, num_layers=NUM_LAYERS, heads=2, dropout=0.4)
    host = [loader.features, loader.labels, loader.schedule.indices]
    if hasattr(loader, "_host_owner"):
        # a GPU loader keeps its own host copy of the owner map (here the CPU one is also the "device" one)
        loader._host_owner = loader._host_owner.clone()
        host.append(loader._host_owner)
    counter = HostSyncCounter(cpu_is_device=True, host=host)
    batches = (batch for _ in range(2) for batch in loader)  # 4 ranks: the warm-up may reach the next epoch
    with counter:  # the warm-up too, so that the counter knows the host tensors it makes (the epoch's order)
        for _ in range(WARM_UP if sizes_on_device else 0):
            next(batches)
        warm_up = len(counter.events)
        _, _, blocks = next(batches)
        logits = model(blocks, blocks[0].srcdata["feat"])
        loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        allreduce_gradients(model, loader.comm)
    return [(e.kind, e.site) for e in counter.events[warm_up:]]


WARM_UP = 1
"""Iterations before the counted one when split sampling keeps its sizes on the device: the first (exact)
teaches the id exchanges their slot capacities."""


@pytest.fixture(scope="module")
def kernel_lib_path(tmp_path_factory):
    """The CUDA kernels built for the CPU, or None without a C++ compiler (then the torch sampler runs)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return None
    from kernel_emulation import build_emulation_lib, make_shim
    from test_kernels import _ATOMICS

    tmp = tmp_path_factory.mktemp("emu")
    build_emulation_lib(tmp, make_shim(["sample.cu", "relabel.cu"], extra=_ATOMICS), "libsync_emu.so")
    return str(tmp / "libsync_emu.so")


def report(events) -> str:
    counts = collections.Counter(f"{site}: {kind}" for kind, site in events)
    return f"{len(events)} syncs\n" + "\n".join(f"{n:4d}  {k}" for k, n in counts.most_common())


UNAVOIDABLE = {
    "sample size": ("(_sample_kernel)", "(sample_neighbors_torch)"),
    "relabel size": ("(_relabel_kernel)", "(relabel)", "(_relabel_dense)"),
    "count exchange": ("(exchange_count_lists)", "(all_to_all_counted)"),  # the counts that came with the ids
    "frontier size": ("(unique_ids)",),
    "feature load": ("(gather_with_counts)",),
    "sampled sizes": ("(_read_sizes)",),  # split sampling with its sizes on the device: all of them, once
}
"""What may still wait, by the function it happens in: output sizes of sampling and relabelling, the
count exchange (split sizes of the all-to-all), the size of the union of the ids other ranks ask for (a
nonzero or unique) and the feature store's one read (its own module, not part of this budget's fixes)."""


def budget(world_size: int) -> dict:
    """Syncs allowed per 3-layer iteration: one per layer for each size the host must know."""
    per_layer = {"sample size": 1, "relabel size": 1}
    if world_size > 1:  # with one rank nothing is exchanged and the frontier is the relabelled ids
        per_layer.update({"count exchange": 1, "frontier size": 1})
    return {**{k: n * NUM_LAYERS for k, n in per_layer.items()}, "feature load": 1}


SIZES_ON_DEVICE_BUDGET = {"sampled sizes": 1, "feature load": 1}
"""Syncs allowed per iteration when split sampling keeps its sizes on the device (any world size > 1): one read
of every layer's sizes after the last layer, and the feature store's."""


def check_budget(events, world_size: int, allowed: dict = None) -> collections.Counter:
    """Every sync is an unavoidable one, and none of them exceeds its budget; returns the counts by step."""
    text = report(events)
    by_step = collections.Counter()
    for kind, site in events:
        step = next((name for name, funcs in UNAVOIDABLE.items() if site.endswith(funcs)), None)
        assert step is not None, f"an avoidable host-device sync at {site} ({kind}):\n{text}"
        by_step[step] += 1
    allowed = budget(world_size) if allowed is None else allowed
    for step, n in by_step.items():
        assert n <= allowed.get(step, 0), f"{step}: {n} syncs, budget {allowed.get(step, 0)}:\n{text}"
    assert len(events) <= sum(allowed.values()), text
    return by_step


def _count_one_rank(monkeypatch, model_name, lib_path, overlap=False):
    """:func:`count_iteration` on one rank in this process, what it patches undone afterwards."""
    import test_host_syncs  # the module's globals, so monkeypatch undoes what use_kernel_emulation sets

    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    from gsplit.ops import cuda
    for name in ("_function", "_torch_stream", "_ptr", "_MAX_BLOCKS"):
        monkeypatch.setattr(cuda, name, getattr(cuda, name))
    for name in ("sample_neighbors", "sample_neighbors_padded", "relabel"):
        monkeypatch.setattr(ops, name, getattr(ops, name))
    return test_host_syncs.count_iteration(0, 1, model_name, lib_path, overlap=overlap)


@pytest.mark.parametrize("model_name", ["sage", "gat"])
def test_one_rank_iteration_stays_within_the_sync_budget(model_name, kernel_lib_path, monkeypatch):
    events = _count_one_rank(monkeypatch, model_name, kernel_lib_path)
    by_step = check_budget(events, 1)
    # exactly at the budget: 2 per layer (sample and relabel sizes) + at most the feature store's read;
    # main had 25 (SAGE) / 22 (GAT), among them bincounts, a boolean mask and pageable copies
    assert {k: n for k, n in by_step.items() if k != "feature load"} == \
        {k: n for k, n in budget(1).items() if k != "feature load"}, report(events)


def test_one_rank_with_overlap_on_waits_as_the_plain_path(kernel_lib_path, monkeypatch):
    """``overlap=True`` (gsplit train's default for SAGE) on one rank makes no overlap plans, whose sizes cost a
    host read per layer (two more syncs per iteration before): nothing to hide without a shuffle."""
    check_budget(_count_one_rank(monkeypatch, "sage", kernel_lib_path, overlap=True), 1)


def test_two_rank_iteration_stays_within_the_sync_budget(kernel_lib_path, monkeypatch):
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")  # inherited by the spawned ranks
    for model_name in ("sage", "gat"):
        per_rank = launch(count_iteration, 2, args=(model_name, kernel_lib_path))
        for rank, events in enumerate(per_rank):
            by_step = check_budget(events, 2)
            # exactly at the budget: 4 per layer (sample, relabel, count exchange, frontier) + at most the
            # feature store's read; main had 31 (SAGE) / 28 (GAT) on rank 0
            assert {k: n for k, n in by_step.items() if k != "feature load"} == \
                {k: n for k, n in budget(2).items() if k != "feature load"}, report(events)


@pytest.mark.parametrize("world_size", [2, 4])
def test_split_iteration_with_sizes_on_the_device_waits_at_most_twice(world_size, kernel_lib_path, monkeypatch):
    """Split sampling as a GPU with NCCL runs it (:mod:`gsplit.split.deferred`): sampling, relabelling, the id
    exchanges and the union of the requests of every layer chained on the device, their sizes read once; with
    the feature store's read, 2 syncs per iteration at any world size (the exact path: 13 at 2 ranks)."""
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")
    # SAGE overlapped (gsplit train's default for it: frontiers interior first, overlap plans), GAT plain
    for model_name, overlap in (("sage", True), ("gat", False)):
        per_rank = launch(count_iteration, world_size, args=(model_name, kernel_lib_path, overlap, True))
        for rank, events in enumerate(per_rank):
            by_step = check_budget(events, world_size, SIZES_ON_DEVICE_BUDGET)
            assert by_step["sampled sizes"] == 1 and len(events) <= 2, report(events)


def test_dropout_masks_cost_no_syncs():
    """The bank is drawn on the host (the same masks on every device type) and copied without a wait."""
    h = torch.ones(50, 6)
    ids = torch.arange(100, 150)
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        out = vertex_dropout(h, ids, 0.4, seed=3, step=2, layer=1)
    assert counter.total == 0, counter.report()
    # the same vertex gets the same mask wherever it is, and the drop rate is p
    assert torch.equal(vertex_dropout(h[10:20], ids[10:20], 0.4, 3, 2, 1), out[10:20])
    big = vertex_dropout(torch.ones(20000, 8), torch.arange(20000), 0.4, 3, 2, 1)
    assert abs((big == 0).float().mean().item() - 0.4) < 0.01


def test_relu_dropout_on_the_gpu_path_costs_no_syncs_and_equals_the_cpu_kernel(monkeypatch):
    """A CUDA tensor takes the unfused ops of relu_vertex_dropout (the compiled kernel is CPU-only); run here with
    the kernel off, that path must wait for nothing and give the fused CPU kernel's values and gradient, so a GPU
    rank drops and scales what a CPU rank does."""
    from gsplit.nn.dropout import relu_vertex_dropout
    from gsplit.ops import aggregate

    h = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    ids, w = torch.randperm(1000)[:300], torch.randn(300, 16, dtype=torch.float64)
    fused = relu_vertex_dropout(h, ids, 0.4, seed=3, step=2, layer=1)
    monkeypatch.setenv("GSPLIT_NO_EXTENSIONS", "1")  # what _use_extension answers for a CUDA tensor
    assert aggregate._use_extension(h) is None
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        plain = relu_vertex_dropout(h, ids, 0.4, seed=3, step=2, layer=1)
    assert counter.total == 0, counter.report()
    assert "ReluDropoutRows" not in type(plain.grad_fn).__name__
    assert torch.equal(plain, fused)
    assert torch.equal(torch.autograd.grad((plain * w).sum(), h)[0], torch.autograd.grad((fused * w).sum(), h)[0])


def test_gat_scores_on_the_gpu_path_take_the_unfused_ops_and_wait_for_nothing():
    """A tensor off the CPU (here the meta device, which has no data: a kernel call or a host read would fail)
    must take the unfused `(z * attn).sum(-1)`, as a CUDA tensor does, forward and backward, without a sync; and
    that path gives the CPU kernel's values and gradients to rounding."""
    from gsplit.ops import aggregate

    z = torch.randn(50, 4, 8, dtype=torch.float64, device="meta", requires_grad=True)
    attn = torch.randn(1, 4, 8, dtype=torch.float64, device="meta", requires_grad=True)
    assert aggregate._use_extension(z, attn) is None
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        out = aggregate.gat_scores(z, attn)
        gz, ga = torch.autograd.grad(out.sum(), (z, attn))
    assert counter.total == 0, counter.report()
    assert out.shape == (50, 4) and gz.shape == z.shape and ga.shape == attn.shape
    assert "GATScores" not in type(out.grad_fn).__name__
    zc = torch.randn(50, 4, 8, dtype=torch.float64, requires_grad=True)
    ac = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 4, dtype=torch.float64)
    fused = aggregate.gat_scores(zc, ac)
    plain = (zc * ac).sum(-1)
    torch.testing.assert_close(fused, plain)
    for a, b in zip(torch.autograd.grad((fused * w).sum(), (zc, ac)), torch.autograd.grad((plain * w).sum(), (zc, ac))):
        torch.testing.assert_close(a, b)


def test_dropout_bank_is_the_device_generic_integer_draw():
    """The CPU bank (the compiled kernel where it builds) is counter_rng.keep_cells, the torch integer ops that
    make it on a GPU: the same masks on every device type (the first GPU run found a CUDA run's differing)."""
    from gsplit.ops import counter_rng

    h = torch.ones(3, 5)
    key = counter_rng.stream_key(4 ^ _SALT, 7, 2, 1)
    want = counter_rng.keep_cells(key, 64 * 5, counter_rng.keep_threshold(0.3)).view(64, 5).to(h.dtype)
    assert torch.equal(dropout_bank(h, 0.3, seed=4, step=7, layer=2, bank_rows=64), want)
    many = ops.keep_cells(key, 200_000, counter_rng.keep_threshold(0.3))
    assert torch.equal(many, counter_rng.keep_cells(key, 200_000, counter_rng.keep_threshold(0.3)))
    assert abs(many.double().mean().item() - 0.7) < 0.005


def test_dropout_bank_on_a_gpu_waits_for_nothing():
    """What a GPU runs for the bank (torch's integer ops on device ids), on the CPU stand-in: no host sync."""
    from gsplit.ops import counter_rng

    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        keep = counter_rng.keep_cells(counter_rng.stream_key(1, 2, 3, 1), 4096 * 8, counter_rng.keep_threshold(0.5),
                                      device="cpu")
    assert counter.total == 0, counter.report()
    assert keep.dtype == torch.bool and keep.numel() == 4096 * 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dropout_bank_is_the_same_on_cuda():
    h = torch.ones(3, 256)
    assert torch.equal(dropout_bank(h.cuda(), 0.4, 4, 7, 2).cpu(), dropout_bank(h, 0.4, 4, 7, 2))


def test_degrees_match_bincount_without_syncs():
    index = torch.tensor([0, 0, 3, 3, 3, 1])
    counter = HostSyncCounter(cpu_is_device=True)
    with counter:
        got = aggregate.degrees(index, 6)
        mean = aggregate.copy_u_mean_torch(torch.ones(6, 2), torch.arange(6), index, 6)
    assert counter.total == 0, counter.report()
    assert torch.equal(got, torch.bincount(index, minlength=6))
    assert mean[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_plain_torch_sampler_and_relabel_wait_once_each():
    from gsplit.ops import torch_ops
    from gsplit.ops import counter_rng

    graph, _, _, _ = make_problem()
    key = counter_rng.stream_key(0, 0, 0, 0)
    for fanout, num_nodes in ((4, None), (-1, graph.num_nodes)):
        counter = HostSyncCounter(cpu_is_device=True)
        with counter:
            nodes = torch.arange(0, 40, 3, device="cpu")
            src, _, _ = torch_ops.sample_neighbors_torch(graph, nodes, fanout, False, key)
            torch_ops.relabel(nodes, src, num_nodes)
        assert counter.total == 2, counter.report()


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and ops.cuda.cupy_available()), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("model_name", ["sage", "gat"])
def test_gpu_iteration_stays_within_the_sync_budget(model_name):
    """The same budget with real CUDA tensors and kernels: the counter's GPU mode, no stand-in."""
    graph, feats, labels, train_idx = make_problem()
    device = torch.device("cuda", torch.cuda.current_device())
    loader = DataLoader(graph.to(device), train_idx, gsplit.NeighborSampler(FANOUTS, seed=1), device=device,
                        batch_size=BATCH, shuffle=True, features=feats, labels=labels)
    torch.manual_seed(0)
    model = build_model(model_name, 8, 8, 4, num_layers=NUM_LAYERS, heads=2, dropout=0.4).to(device)
    batches = iter(loader)
    next(batches)  # first use: kernel compilation, allocator and pinned-memory pools warm up
    counter = HostSyncCounter()
    with counter:
        _, _, blocks = next(batches)
        logits = model(blocks, blocks[0].srcdata["feat"])
        split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
    events = [(e.kind, e.site) for e in counter.events]
    # the feature store's own reads depend on its mode (1 through UVA, up to 4 gathering on the host)
    store = [e for e in events if "feature_store.py:" in e[1]]
    assert len(store) <= 4, report(events)
    check_budget([e for e in events if e not in store], 1)


class _FakeCudaCopies:
    """Stands in for CUDA copies on a machine without one: records pin_memory and .to(cuda) calls."""

    def __init__(self, monkeypatch):
        self.pinned, self.copies = [], []
        real_to = torch.Tensor.to

        def pin_memory(t):
            pinned = t.clone()
            self.pinned.append(pinned)
            return pinned

        def to(t, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
                self.copies.append({"pinned": any(t is p for p in self.pinned),
                                    "non_blocking": kwargs.get("non_blocking", False)})
                with torch._C.DisableTorchFunction():  # a new tensor that a counter takes for a device one
                    return t.clone()
            return real_to(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "to", to)


def test_host_tensors_go_to_a_gpu_pinned_and_asynchronously(monkeypatch):
    from gsplit.ops.torch_ops import to_device

    fake = _FakeCudaCopies(monkeypatch)
    labels = torch.tensor([3, 1, 2])
    out = to_device(labels, torch.device("cuda", 0))
    assert len(fake.pinned) == 1 and fake.copies == [{"pinned": True, "non_blocking": True}]
    assert out.tolist() == [3, 1, 2]


def test_host_counts_for_nccl_go_pinned_and_come_back_in_one_read(monkeypatch):
    """The count exchange with host counts on a CUDA backend: one pinned asynchronous copy up, one read back."""
    import torch.distributed as dist

    from gsplit.comm.communicator import Communicator

    fake = _FakeCudaCopies(monkeypatch)
    comm = Communicator()
    comm.rank, comm.world_size = 0, 2
    monkeypatch.setattr(Communicator, "_collective_device", lambda self, t: torch.device("cuda", 0))
    monkeypatch.setattr(dist, "all_to_all_single", lambda out, inp, group=None: out.copy_(inp.flip(0) * 10))
    counter = HostSyncCounter(cpu_is_device=True)
    send = torch.tensor([4, 6])
    counter.mark_host(send)
    with counter:
        sent, received = comm.exchange_count_lists(send)
    assert (sent, received) == ([4, 6], [60, 40])
    assert fake.copies == [{"pinned": True, "non_blocking": True}]
    assert counter.total == 1 and counter.events[0].kind == "tolist", counter.report()
