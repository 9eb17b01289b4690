"""Row copies by index: :func:`gather_rows` (``x.index_select(0, idx)``) and :func:`scatter_rows_`
(``out.index_copy_(0, idx, x)``), what the shuffles and the feature store do at every step, and
:func:`place_rows`, a differentiable scatter into a new tensor.

On CPU (float32 / float64, 2-D) the compiled kernels of ``kernels/aggregate_cpu.cpp`` copy one row per
``memcpy`` with a later row prefetched; elsewhere (CUDA, other dtypes, no extension) torch's ops run. Both
are copies: the same bits on every path. Measured on this project's 2-core host (one thread, median of 30):
19.8k 256-wide rows scattered into 26k took 4.2 ms against ``index_copy_``'s 8.4, 62k 64-wide rows 2.6
against 8.8; gathers 1.2-1.6x faster where the rows are scattered, the same where they are in order.
Profiles name the compiled copies ``gsplit::gather_rows`` and ``gsplit::scatter_rows_``.
"""

from __future__ import annotations

import torch
from torch.profiler import record_function

from gsplit.ops.aggregate_ext import _use_extension

__all__ = ["gather_rows", "scatter_rows_", "place_rows"]


def _compiled(*tensors: torch.Tensor):
    """The extension for 2-D CPU float rows of one dtype, else ``None`` (torch's ops then)."""
    if any(t.dim() != 2 for t in tensors):
        return None
    return _use_extension(*tensors)


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, idx)``: the rows ``idx`` of ``x``, in that order.

    Example:
        >>> gather_rows(torch.tensor([[1., 2.], [3., 4.], [5., 6.]]), torch.tensor([2, 0])).tolist()
        [[5.0, 6.0], [1.0, 2.0]]
    """
    ext = _compiled(x)
    if ext is None or idx.device.type != "cpu" or idx.dtype != torch.int64 or idx.dim() != 1:
        return x.index_select(0, idx)
    with record_function("gsplit::gather_rows"):  # named in profiles, as torch's ops are
        return ext.gather_rows(x, idx.contiguous())


def scatter_rows_(out: torch.Tensor, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out.index_copy_(0, idx, x)``: row ``i`` of ``x`` into row ``idx[i]`` of ``out`` (in place; ``idx`` holds
    distinct rows, as every plan here does). Returns ``out``.

    Example:
        >>> out = torch.zeros(3, 2)
        >>> scatter_rows_(out, torch.tensor([2, 0]), torch.tensor([[1., 2.], [3., 4.]])).tolist()
        [[3.0, 4.0], [0.0, 0.0], [1.0, 2.0]]
    """
    ext = _compiled(out, x)
    if (ext is None or not out.is_contiguous() or idx.device.type != "cpu" or idx.dtype != torch.int64
            or idx.dim() != 1 or x.shape[0] != idx.numel() or x.shape[1:] != out.shape[1:]):
        return out.index_copy_(0, idx, x)
    with record_function("gsplit::scatter_rows_"):
        ext.scatter_rows_(out, idx.contiguous(), x)
    return out


class _PlaceRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, num_rows, pos):
        ctx.save_for_backward(pos)
        return scatter_rows_(x.new_empty((num_rows,) + tuple(x.shape[1:])), pos, x)

    @staticmethod
    def backward(ctx, grad):
        (pos,) = ctx.saved_tensors
        return gather_rows(grad, pos), None, None


def place_rows(x: torch.Tensor, num_rows: int, pos: torch.Tensor) -> torch.Tensor:
    """A new ``[num_rows, ...]`` tensor with row ``i`` of ``x`` at row ``pos[i]`` (distinct places) and the other
    rows uninitialised, for the caller to fill in place; differentiable in ``x`` (backward gathers the rows
    ``pos`` of the gradient). What an overlapped layer's interior part becomes in the next layer's input when
    its between-layer step has no placed kernel (gsplit's models' ``between``).

    Example:
        >>> out = place_rows(torch.tensor([[1., 2.], [3., 4.]]), 3, torch.tensor([2, 0]))
        >>> out[[0, 2]].tolist()
        [[3.0, 4.0], [1.0, 2.0]]
    """
    if pos.dim() != 1 or pos.numel() != x.shape[0]:
        raise ValueError(f"place_rows: x has {x.shape[0]} rows but pos has shape {tuple(pos.shape)}; pass one place per row")
    return _PlaceRows.apply(x, int(num_rows), pos)
