"""The CUDA sampler on a :class:`~gsplit.data.graph.Graph` (``kernels/sample.cu`` through CuPy, :mod:`gsplit.ops.cuda`),
and where a graph is sampled (:func:`sampling_device`): on its GPU, or through UVA when it is pinned on the host.

The counterpart of :mod:`gsplit.ops.sample_cpu` (the compiled CPU sampler); :func:`gsplit.ops.sample_neighbors`
chooses between them. The kernels pick exactly the edges the torch sampler picks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import numpy as np
import torch

from gsplit.data.ids import id_range_error
from gsplit.ops import cuda

if TYPE_CHECKING:  # annotations only: the graph imports these kernels to pin itself
    from gsplit.data.graph import Graph


def graph_readable(graph: Graph, device: torch.device) -> bool:
    """Whether the kernels can read ``graph`` from ``device``: it is on that GPU, or pinned on the host."""
    arrays = (graph.indptr, graph.indices)
    if all(a.device == device for a in arrays):
        return all(a.is_contiguous() for a in arrays)
    return all(a.device.type == "cpu" and a.is_pinned() and a.is_contiguous() for a in arrays)


def sample_neighbors(
    graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick in-edges of ``nodes`` with the CUDA kernel; same edges as the torch sampler.

    Args:
        graph: CSC graph, on ``nodes``' GPU or in pinned host memory (``Graph.pin_memory()``), which
            the kernel reads through unified virtual addressing without copying the graph.
        nodes: int64 destination vertices (any order, repeats allowed), normally a CUDA tensor.
        fanout: neighbours per vertex, or -1 for all in-neighbours.
        replace: sample with replacement.
        key: 64-bit stream key, ``counter_rng.stream_key(seed, epoch, iteration, layer)``.

    Returns:
        ``(src, dst_index, edge_ids)`` int64 on ``nodes``' device, grouped by destination in
        ``nodes`` order, each destination's edges in CSC order.

    Needs CuPy, CUDA ``nodes`` and a graph that :func:`graph_readable` from their device;
    :func:`gsplit.ops.sample_neighbors` checks that and otherwise runs the torch sampler.

    Example:
        >>> src, dst_index, eids = sample_neighbors(g.to("cuda"), torch.tensor([0, 2], device="cuda"), 1, False,
        ...                                         counter_rng.stream_key(0, 0, 0, 0))  # doctest: +SKIP
    """
    return _sample_kernel(graph, nodes.to(torch.int64).contiguous(), int(fanout), bool(replace), int(key))


def _sample_kernel(graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int):
    device = nodes.device
    n = nodes.numel()
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return empty, empty.clone(), empty.clone()
    start, deg, counts = (torch.empty(n, dtype=torch.int64, device=device) for _ in range(3))
    bad = torch.zeros(1, dtype=torch.int64, device=device)
    with cuda._torch_stream(device):
        cuda._launch("sample.cu", "gsplit_sample_count", n, (
            cuda._ptr(graph.indptr), np.int64(graph.num_nodes), cuda._ptr(nodes), np.int64(n),
            np.int64(fanout), np.int32(replace), cuda._ptr(start), cuda._ptr(deg), cuda._ptr(counts),
            cuda._ptr(bad)))
    ends = torch.cumsum(counts, 0)
    total, num_bad = torch.stack([ends[-1], bad[0]]).tolist()  # the one host sync: output size
    if num_bad:
        lo, hi = int(nodes.min()), int(nodes.max())
        raise id_range_error("nodes", lo if lo < 0 else hi, graph.num_nodes)
    src, dst_index, edge_ids = (torch.empty(total, dtype=torch.int64, device=device) for _ in range(3))
    if total:
        with cuda._torch_stream(device):
            if fanout == -1:
                cuda._launch("sample.cu", "gsplit_sample_all", n * 32, (
                    cuda._ptr(graph.indices), cuda._ptr(start), cuda._ptr(ends), np.int64(n),
                    cuda._ptr(src), cuda._ptr(dst_index), cuda._ptr(edge_ids)))
            else:
                cuda._launch("sample.cu", "gsplit_sample_fill", n, (
                    cuda._ptr(graph.indices), cuda._ptr(nodes), cuda._ptr(start), cuda._ptr(deg), cuda._ptr(ends),
                    np.int64(n),
                    np.int64(fanout), np.int32(replace), np.uint64(key),
                    cuda._ptr(src), cuda._ptr(dst_index), cuda._ptr(edge_ids)))
    return src, dst_index, edge_ids


def sampling_device(graph: Graph, device: torch.device) -> torch.device:
    """Where a loader delivering to ``device`` should sample ``graph``: on the GPU when the graph is there or
    pinned in host memory and the CuPy kernels work (they read it through UVA), else where the graph is.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1], [1, 0])
        >>> sampling_device(g, torch.device("cuda", 0))   # a host graph that is not pinned: sampled there
        device(type='cpu')
    """
    device = torch.device(device)
    if device.type != "cuda":
        return graph.device
    if graph.device == device:
        return device
    if graph.device.type == "cpu" and graph.indptr.is_pinned() and cuda.cupy_available():
        return device
    return graph.device


def sample_neighbors_padded(graph: Graph, nodes: torch.Tensor, num_valid: torch.Tensor, fanout: int, replace: bool,
                            key: int):
    """The CUDA kernels' :func:`gsplit.ops.torch_ops.sample_neighbors_padded`: the picks of ``nodes[:num_valid]``
    in buffers of ``nodes.numel() * fanout`` entries with their ``count`` and a ``bad`` flag, no host read
    (the kernels' own output size stays on the device). Padding rows read vertex 0 and are emptied before the
    fill kernel, which writes nothing for an empty row.

    Example:
        >>> src, dst, eids, count, bad = sample_neighbors_padded(g.to("cuda"), nodes, torch.tensor(2, device="cuda"),
        ...                                                      5, False, key)            # doctest: +SKIP
    """
    fanout, device = int(fanout), nodes.device
    if fanout <= 0:
        raise ValueError(f"fanout = {fanout}; the padded sampler needs a positive fanout (its output bound is n * fanout)")
    nodes = nodes.to(torch.int64)
    n = nodes.numel()
    rows = torch.arange(n, device=device) < num_valid
    safe = torch.where(rows, nodes, 0).contiguous()
    start, deg, counts = (torch.empty(n, dtype=torch.int64, device=device) for _ in range(3))
    bad = torch.zeros(1, dtype=torch.int64, device=device)
    src, dst_index, edge_ids = (torch.empty(n * fanout, dtype=torch.int64, device=device) for _ in range(3))
    if n == 0:
        return src, dst_index, edge_ids, bad[0], bad[0]
    with cuda._torch_stream(device):
        cuda._launch("sample.cu", "gsplit_sample_count", n, (
            cuda._ptr(graph.indptr), np.int64(graph.num_nodes), cuda._ptr(safe), np.int64(n),
            np.int64(fanout), np.int32(replace), cuda._ptr(start), cuda._ptr(deg), cuda._ptr(counts),
            cuda._ptr(bad)))
    ends = torch.cumsum(torch.where(rows, counts, 0), 0)
    with cuda._torch_stream(device):
        cuda._launch("sample.cu", "gsplit_sample_fill", n, (
            cuda._ptr(graph.indices), cuda._ptr(safe), cuda._ptr(start), cuda._ptr(deg), cuda._ptr(ends),
            np.int64(n), np.int64(fanout), np.int32(replace), np.uint64(key),
            cuda._ptr(src), cuda._ptr(dst_index), cuda._ptr(edge_ids)))
    return src, dst_index, edge_ids, ends[-1], bad[0]
