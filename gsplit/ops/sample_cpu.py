"""The compiled CPU sampler and relabel (``kernels/sample_cpu.cpp``), same results as :mod:`gsplit.ops.torch_ops`.

The extension is built at first use by :func:`gsplit.ops.cpu_ext.load`; :func:`extension` returns it,
or ``None`` when it cannot be built (or ``GSPLIT_NO_EXTENSIONS=1``), and then :mod:`gsplit.ops` runs the
torch functions instead. The wrappers here only prepare arguments and turn the extension's counts of
bad ids into the library's errors; the picks and local numbers are the extension's.

Why a compiled sampler: the torch sampler runs Floyd's algorithm as ``fanout`` passes over
``[vertices, fanout]`` tensors and relabels with several passes over graph-sized tables; on a
1M-vertex graph that was 2.2-2.5x slower per batch than DGL's C++ sampler. The C++ loop samples each
vertex in one pass over its own draws (as the CUDA kernel does per thread) and relabels touching each
id once or twice.
"""

from __future__ import annotations

from typing import Optional, TYPE_CHECKING, Tuple

import torch

from gsplit.data.ids import id_range_error
from gsplit.ops import cpu_ext

if TYPE_CHECKING:  # annotations only: the graph imports these kernels to pin itself
    from gsplit.data.graph import Graph

NAME = "gsplit_sample_cpu"
"""Name of the compiled module (also its build folder under the extension cache)."""
SOURCES = ("sample_cpu.cpp",)
"""Its sources in ``kernels/``."""


def extension() -> Optional[object]:
    """The compiled module, or ``None`` when it cannot be built or extensions are switched off.

    Example:
        >>> ext = extension()
        >>> ext is None or hasattr(ext, "sample_neighbors")
        True
    """
    return cpu_ext.load(NAME, SOURCES)


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64).contiguous()


def sample_neighbors(ext, graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gsplit.ops.torch_ops.sample_neighbors_torch` with the extension ``ext``; CPU tensors only.

    Raises the library's id error when ``nodes`` holds an id outside the graph.

    Example:
        >>> from gsplit.ops import counter_rng
        >>> ext = extension()
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> key = counter_rng.stream_key(0, 0, 0, 0)
        >>> ext is None or sample_neighbors(ext, g, torch.tensor([0, 2]), 1, False, key)[1].tolist() == [0, 1]
        True
    """
    nodes = _i64(nodes)
    src, dst_index, edge_ids, num_bad = ext.sample_neighbors(_i64(graph.indptr), _i64(graph.indices), nodes,
                                                             int(fanout), bool(replace), int(key))
    if num_bad:
        lo, hi = (int(x) for x in torch.aminmax(nodes))
        raise id_range_error("nodes", lo if lo < 0 else hi, graph.num_nodes)
    return src, dst_index, edge_ids


def relabel(ext, dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: Optional[int] = None
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gsplit.ops.torch_ops.relabel` with the extension ``ext``; CPU tensors only.

    With ``num_nodes`` a dense table of one entry per vertex is used (ids must lie in
    ``[0, num_nodes)``), else a hash table (ids must be non-negative). Same result either way.

    Example:
        >>> ext = extension()
        >>> ext is None or [t.tolist() for t in relabel(ext, torch.tensor([9, 4]), torch.tensor([4, 7, 1]), 10)] == [[9, 4, 1, 7], [1, 3, 2]]
        True
    """
    dst_nodes, src = _i64(dst_nodes), _i64(src)
    src_nodes, src_local, num_bad = ext.relabel(dst_nodes, src, -1 if num_nodes is None else int(num_nodes))
    if num_bad:
        ids = torch.cat([dst_nodes, src])
        lo, hi = (int(x) for x in torch.aminmax(ids))
        if num_nodes is None:
            raise ValueError(f"relabel got the negative vertex id {lo}; pass global ids in [0, num_nodes)")
        raise id_range_error("the block's vertex ids", lo if lo < 0 else hi, num_nodes)
    return src_nodes, src_local
