"""Kernels behind one dispatch point: callers ask for "sample", "relabel", "unique", "gather rows" or
"aggregate" (:mod:`gsplit.ops.aggregate`: sum / mean / GAT attention over a block's edges).

This package decides, per call, which implementation runs: the CUDA kernels of ``kernels/*.cu`` through
CuPy (:mod:`gsplit.ops.cuda`; the sampler :mod:`gsplit.ops.sample_cuda`) when the inputs are on a GPU and CuPy works (sampling and the feature gather;
relabelling runs plain torch there, measured as fast or faster on an H100); for CPU inputs the C++
sampler and relabel of ``kernels/sample_cpu.cpp`` (:mod:`gsplit.ops.sample_cpu`) when that extension
builds; else plain torch (:mod:`gsplit.ops.torch_ops`, CPU or CUDA). Every implementation returns exactly the same result, so
the choice only changes speed. Nothing outside this package imports the implementations' private
helpers.
"""

from __future__ import annotations

from typing import Optional, TYPE_CHECKING, Tuple

import torch

from gsplit.ops import aggregate, cpu_ext, cuda, rows, sample_cpu, sample_cuda, torch_ops
from gsplit.ops.aggregate import copy_u_mean, copy_u_sum, edge_softmax, gat_aggregate
from gsplit.ops import counter_rng

if TYPE_CHECKING:  # annotations only: the graph imports these kernels to pin itself
    from gsplit.data.graph import Graph

__all__ = ["prepare_kernels", "sample_neighbors", "sample_neighbors_padded", "relabel", "relabel_padded", "keep_cells", "unique_ids", "unique_inverse",
           "sampling_device", "copy_u_sum", "copy_u_mean", "gat_aggregate", "edge_softmax", "aggregate", "cuda",
           "sample_cpu", "sample_cuda", "torch_ops"]

sampling_device = sample_cuda.sampling_device


def prepare_kernels() -> "cpu_ext.BuildReport":
    """Build (or load from the cache) the compiled CPU kernels now: the sampler and the aggregations.

    ``gsplit train`` calls it before any rank starts, so a first-use build (tens of seconds) is neither
    timed as part of the first epoch nor repeated by every rank, and its outcome is said once; library
    users may call it the same way. See :func:`gsplit.ops.cpu_ext.prebuild`.

    Example:
        >>> report = prepare_kernels()
        >>> set(report.ready) | set(report.failed) <= {"gsplit_sample_cpu", "gsplit_aggregate"}
        True
    """
    from gsplit.ops import cpu_ext

    return cpu_ext.prebuild([(sample_cpu.NAME, sample_cpu.SOURCES),
                             (aggregate._EXT_NAME, aggregate._EXT_SOURCES)])


def sample_neighbors(graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick in-edges of ``nodes`` for one layer with the stream ``key``; ``(src, dst_index, edge_ids)``.

    The result is on ``nodes``' device, grouped by destination in ``nodes`` order, each destination's
    edges in graph (CSC) order. CUDA ``nodes`` run the CUDA kernel when CuPy is installed and the graph
    is on their GPU or pinned in host memory; otherwise the sampler runs where the graph is: on the CPU
    the compiled one of :mod:`gsplit.ops.sample_cpu` when it builds, else the torch sampler.

    Example:
        >>> from gsplit.ops import counter_rng
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> src, dst_index, eids = sample_neighbors(g, torch.tensor([0, 2]), 1, False, counter_rng.stream_key(0, 0, 0, 0))
        >>> dst_index.tolist()
        [0, 1]
    """
    fanout = int(fanout)
    if fanout < -1 or fanout == 0:
        raise ValueError(f"fanout = {fanout}; pass a positive number of neighbours or -1 for all")
    if not 0 <= int(key) < 1 << 64:
        raise ValueError(f"key = {key} is not an unsigned 64-bit integer; use counter_rng.stream_key(...)")
    nodes = nodes.to(torch.int64)
    if nodes.is_cuda and cuda.cupy_available() and sample_cuda.graph_readable(graph, nodes.device):
        return sample_cuda.sample_neighbors(graph, nodes, fanout, bool(replace), int(key))
    out = _sample_where_graph_is(graph, nodes.to(graph.device), fanout, bool(replace), int(key))
    if nodes.device == graph.device:
        return out
    return tuple(t.to(nodes.device) for t in out)  # type: ignore[return-value]


def sample_neighbors_padded(graph: Graph, nodes: torch.Tensor, num_valid: torch.Tensor, fanout: int, replace: bool,
                            key: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_neighbors` of ``nodes[:num_valid]`` (``num_valid`` a 0-d tensor on their device) with no host
    read: ``(src, dst_index, edge_ids, count, bad)``, buffers of ``nodes.numel() * fanout`` entries whose first
    ``count`` are the edges :func:`sample_neighbors` returns, and ``bad`` (0-d) set when a valid node is no vertex.
    ``fanout`` > 0 (the bound). The CUDA kernels where :func:`sample_neighbors` would run them, else torch ops
    (:func:`gsplit.ops.torch_ops.sample_neighbors_padded`); the graph on ``nodes``' device or readable from it.

    Example:
        >>> from gsplit.ops import counter_rng
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> out = sample_neighbors_padded(g, torch.tensor([0, 2, 0]), torch.tensor(2), 1, False,
        ...                               counter_rng.stream_key(0, 0, 0, 0))
        >>> int(out[3]), out[1][:2].tolist()
        (2, [0, 1])
    """
    if nodes.is_cuda and cuda.cupy_available() and sample_cuda.graph_readable(graph, nodes.device):
        return sample_cuda.sample_neighbors_padded(graph, nodes, num_valid, fanout, bool(replace), int(key))
    return torch_ops.sample_neighbors_padded(graph, nodes, num_valid, fanout, bool(replace), int(key))


relabel_padded = torch_ops.relabel_padded


def _sample_where_graph_is(graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int):
    if graph.device.type == "cpu":
        ext = sample_cpu.extension()
        if ext is not None:
            return sample_cpu.sample_neighbors(ext, graph, nodes, fanout, replace, key)
    return torch_ops.sample_neighbors_torch(graph, nodes, fanout, replace, key)


def relabel(dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: Optional[int] = None
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Local numbering of a block: ``src_nodes = dst_nodes ++ sorted(new ids in src)`` and ``src_local``.

    ``src_nodes[src_local] == src``; ``dst_nodes`` must be unique. On a GPU plain torch runs: on an H100 it
    took 0.36 / 0.38 / 0.47 ms for 15k / 121k / 966k sampled edges against 0.38 / 0.56 / 0.46 ms for the
    hash-table kernel (:func:`gsplit.ops.cuda.relabel`, kept for explicit use; ``experiments/gpu_bench.py``);
    on the CPU the compiled relabel of
    :mod:`gsplit.ops.sample_cpu` when it builds (a dense per-vertex table given ``num_nodes`` and a
    batch that is not tiny against the graph, else a hash table); else :func:`gsplit.ops.torch_ops.relabel`.

    Example:
        >>> relabel(torch.tensor([9, 4]), torch.tensor([4, 7, 1]))
        (tensor([9, 4, 1, 7]), tensor([1, 3, 2]))
    """
    if dst_nodes.device.type == "cpu" and src.device.type == "cpu":
        ext = sample_cpu.extension()
        if ext is not None:
            dense = num_nodes is not None and num_nodes <= _DENSE_RELABEL_FACTOR * (dst_nodes.numel() + src.numel())
            return sample_cpu.relabel(ext, dst_nodes, src, num_nodes if dense else None)
    return torch_ops.relabel(dst_nodes, src, num_nodes)


# The compiled relabel uses dense per-vertex tables (about 1 ns per graph vertex) when the graph has at
# most this many vertices per id relabelled, else a hash table plus a sort of the new ids (about 50 ns
# per id). Measured on a 1M-vertex graph: dense 1.5 ms vs hash 3-5 ms for 67k ids, 1.2 vs 0.3 ms for 6k.
_DENSE_RELABEL_FACTOR = 32


def keep_cells(key: int, n: int, threshold: int, device="cpu") -> torch.Tensor:
    """:func:`gsplit.ops.counter_rng.keep_cells` on ``device``: the compiled kernel for the CPU when it
    builds (one pass, no int64 temporaries), else torch's integer ops; the same bits either way.

    Example:
        >>> from gsplit.ops import counter_rng
        >>> key = counter_rng.stream_key(1, 2, 3, 4)
        >>> torch.equal(keep_cells(key, 1000, 1 << 62), counter_rng.keep_cells(key, 1000, 1 << 62))
        True
    """
    device = torch.device(device)
    if device.type == "cpu":
        ext = sample_cpu.extension()
        if ext is not None:
            return ext.keep_cells(int(key) & ((1 << 64) - 1), int(n), int(threshold))
    return counter_rng.keep_cells(key, n, threshold, device)


def unique_ids(ids: torch.Tensor, num_nodes: Optional[int] = None) -> torch.Tensor:
    """Sorted distinct values of ``ids`` (see :func:`gsplit.ops.torch_ops.unique_ids`).

    Example:
        >>> unique_ids(torch.tensor([5, 1, 5, 3]), num_nodes=8).tolist()
        [1, 3, 5]
    """
    return torch_ops.unique_ids(ids, num_nodes)


def unique_inverse(ids: torch.Tensor, num_nodes: Optional[int] = None, distinct: bool = False
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(sorted distinct values of ids, each id's place in them)``: ``unique`` and ``searchsorted`` in one call.

    ``distinct=True`` promises that ``ids`` has no repeats. On the CPU with the compiled extension it is one
    relabel pass against an empty block (:func:`relabel`: a dense mark per vertex, the new ids come out
    sorted): 1.6 ms for 90k ids on one core where ``searchsorted`` alone took 13 ms. Elsewhere (GPU, or no
    extension) the torch ops: ``unique_ids`` and ``searchsorted`` (one size read, the union's), or for
    distinct ids a sort and its inverse permutation, which read no size at all. Same result on every path.

    Example:
        >>> [t.tolist() for t in unique_inverse(torch.tensor([5, 1, 5, 3]), num_nodes=8)]
        [[1, 3, 5], [2, 0, 2, 1]]
    """
    if ids.device.type == "cpu":
        ext = sample_cpu.extension()
        if ext is not None:
            dense = num_nodes is not None and num_nodes <= _DENSE_RELABEL_FACTOR * ids.numel()
            return sample_cpu.relabel(ext, ids[:0], ids, num_nodes if dense else None)
    if distinct:
        uniq, order = torch.sort(ids, stable=True)
        return uniq, torch.argsort(order)
    uniq = unique_ids(ids, num_nodes)
    return uniq, torch.searchsorted(uniq, ids)
