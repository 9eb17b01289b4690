"""Aggregation over a block's edges: sum / mean of source rows and GAT's attention-weighted sum.

A block's edges are grouped by destination (``edge_dst`` non-decreasing), so its edge list already is
a CSR matrix by destination. On CPU (float32 / float64) the compiled kernels of
``kernels/aggregate_cpu.cpp`` sum each destination's source rows directly, one row per parallel task,
without materialising an ``[edges x width]`` message tensor (the mean divides inside the kernel); backward
regroups the edges by source (a counting sort) and sums each source's gradient row from its destinations'
rows, one row per parallel task (no atomics). Each row is summed in edge order, so CPU results are a pure
function of the inputs, whatever the thread count.

The same extension holds GAT's per-vertex score halves, :func:`gat_scores` (``(z * attn).sum(-1)`` without its
[n, H, D] temporaries), and the step between two layers of gsplit's models, :func:`relu_dropout_rows` (ReLU and a
row-drawn dropout mask in one pass), which ride along so that they cost no build of their own.

Elsewhere (CUDA tensors, other dtypes, ``GSPLIT_NO_EXTENSIONS=1``, or an extension that did not build)
the plain-torch versions run: a gather (``index_select``) and a scatter-add (``index_add_``). Both
paths compute the same values up to float rounding; the ``*_torch`` functions are public so tests and
benchmarks can call the fallback directly.

Why a compiled kernel (measured by ``experiments/bench_layers.py``: 900k edges into 60k rows, forward +
backward, 2 threads, same run): it takes 0.18-0.25x the time of the gather + ``index_add_`` path and
0.6-0.9x that of ``torch.sparse.mm`` with a CSR matrix (which also needs the matrix built per block and
a transposed product in backward), and the fused GAT kernel 0.24-0.33x that of the torch ops;
``torch.segment_reduce`` would still materialise the per-edge messages. The price is a C++ build at
first use (about 25 s of CPU, then cached) and a fallback to keep tested.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from gsplit.ops import cpu_ext  # noqa: F401 - the build report's types
from gsplit.ops.aggregate_ext import (EXT_NAME, EXT_SOURCES, _cached_extension, _extension, _use_extension,  # noqa: F401
                                      extension_available)
from gsplit.ops.rows import place_rows

__all__ = ["copy_u_sum", "copy_u_mean", "self_and_mean", "gat_aggregate", "edge_softmax", "degrees", "copy_u_sum_torch",
           "copy_u_mean_torch", "gat_aggregate_torch", "extension_available", "relu_dropout_rows", "gat_scores", "SharedSourceGrad"]

# the compiled extension (shared with the row copies of gsplit.ops.rows): loaded and chosen per call there
_EXT_NAME, _EXT_SOURCES = EXT_NAME, EXT_SOURCES


def _check_edges(edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int) -> None:
    if edge_src.shape != edge_dst.shape or edge_src.dim() != 1:
        raise ValueError(f"edge_src and edge_dst must be 1-D and of equal length, got shapes "
                         f"{tuple(edge_src.shape)} and {tuple(edge_dst.shape)}")
    if int(num_dst) < 0:
        raise ValueError(f"num_dst = {num_dst} is negative; pass the block's number of destinations")


def _dst_indptr(ext, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_src: int, num_dst: int) -> torch.Tensor:
    """Row pointers of the destination-grouped edges from the compiled kernel, which also checks every index
    and reports (does not throw) the first bad one; the error is raised here."""
    indptr, problem, e = ext.dst_indptr(edge_src, edge_dst, int(num_src), int(num_dst))
    if problem == 1:
        raise ValueError(f"edge_dst[{e}] = {int(edge_dst[e])} is outside [0, num_dst = {num_dst}); "
                         f"pass the block's num_dst")
    if problem == 2:
        raise ValueError(f"edge_dst is not grouped by destination: edge_dst[{e}] = {int(edge_dst[e])} follows "
                         f"{int(edge_dst[e - 1])}; sort the edges by destination (stable)")
    if problem == 3:
        raise ValueError(f"edge_src[{e}] = {int(edge_src[e])} is outside [0, num_src = {num_src}); "
                         f"pass one input row per source node")
    return indptr


# ---------------------------------------------------------------------------- plain torch
class _IndexAddRows(torch.autograd.Function):
    """``zeros(num_rows, ...).index_add_(0, index, rows)`` whose backward keeps ``index`` only.

    torch's own ``index_add_`` saves ``rows`` for its backward (the formula reads their shape through the
    tensor), so the per-edge messages ([E, F], the largest tensor of a layer) stayed alive from forward to
    backward in every layer: full-graph SAGE peaked at 1.55x torch-geometric's device memory on an H100
    (2026-11-27), 1.46x on the CPU's torch path. The gradient is the same gather, ``grad.index_select(0, index)``
    (itself differentiable, so double backward still works)."""

    @staticmethod
    def forward(ctx, rows, index, num_rows):
        ctx.save_for_backward(index)
        return rows.new_zeros((int(num_rows),) + tuple(rows.shape[1:])).index_add_(0, index, rows)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


def index_add_rows(rows: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``out[index[i]] += rows[i]`` into ``num_rows`` zero rows; differentiable in ``rows`` without keeping them.

    Example:
        >>> index_add_rows(torch.tensor([[1.], [2.], [4.]]), torch.tensor([0, 0, 1]), 3).flatten().tolist()
        [3.0, 4.0, 0.0]
    """
    return _IndexAddRows.apply(rows, index, num_rows)


def copy_u_sum_torch(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Plain-torch :func:`copy_u_sum`: gather the sources' rows per edge, scatter-add into destinations.

    Runs on any device and dtype; does not need ``edge_dst`` sorted.

    Example:
        >>> copy_u_sum_torch(torch.tensor([[1.], [2.], [4.]]), torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 3).flatten().tolist()
        [6.0, 1.0, 0.0]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    return index_add_rows(x.index_select(0, edge_src), edge_dst, num_dst)


def degrees(index: torch.Tensor, size: int) -> torch.Tensor:
    """How often each of ``0..size-1`` occurs in ``index`` (int64): ``torch.bincount(index, minlength=size)``
    for indices below ``size``, without the host sync that ``bincount`` makes on CUDA to read the maximum.

    Example:
        >>> degrees(torch.tensor([0, 0, 2]), 4).tolist()
        [2, 0, 1, 0]
    """
    return torch.zeros(int(size), dtype=torch.int64, device=index.device).index_add_(
        0, index, torch.ones_like(index, dtype=torch.int64))


def _in_degrees(edge_dst: torch.Tensor, num_dst: int, like: torch.Tensor) -> torch.Tensor:
    return degrees(edge_dst, num_dst).to(like.dtype).unsqueeze(1)


def copy_u_mean_torch(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Plain-torch :func:`copy_u_mean`.

    Example:
        >>> copy_u_mean_torch(torch.tensor([[1.], [2.], [4.]]), torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 3).flatten().tolist()
        [3.0, 1.0, 0.0]
    """
    agg = copy_u_sum_torch(x, edge_src, edge_dst, num_dst)
    return agg / _in_degrees(edge_dst, num_dst, agg).clamp_(min=1).view((-1,) + (1,) * (agg.dim() - 1))


def edge_softmax(scores: torch.Tensor, edge_dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Softmax of edge ``scores`` ([E, H]) over the in-edges of each destination (plain torch).

    Computed stably: the per-destination maximum (``scatter_reduce`` ``amax``) is subtracted before
    ``exp``. The maximum is detached, which leaves value and gradient unchanged (softmax is invariant
    to a per-group shift) and avoids differentiating through ``amax``.

    Example:
        >>> edge_softmax(torch.tensor([[0.], [0.], [5.]]), torch.tensor([0, 0, 1]), 2).flatten().tolist()
        [0.5, 0.5, 1.0]
    """
    idx = edge_dst.unsqueeze(1).expand_as(scores)
    with torch.no_grad():
        # include_self=False: the zeros' initial value does not take part, so all-negative scores work.
        smax = scores.new_zeros((num_dst, scores.shape[1])).scatter_reduce_(0, idx, scores, "amax", include_self=False)
    e = torch.exp(scores - smax.index_select(0, edge_dst))
    denom = e.new_zeros((num_dst, e.shape[1])).index_add_(0, edge_dst, e)
    # Every destination referenced by an edge has denom >= 1 (its max term is exp(0)), so no 0/0.
    return e / denom.index_select(0, edge_dst)


def gat_aggregate_torch(z: torch.Tensor, el: torch.Tensor, er: torch.Tensor, edge_src: torch.Tensor,
                        edge_dst: torch.Tensor, num_dst: int, negative_slope: float = 0.2,
                        attn_drop: Optional[torch.nn.Module] = None) -> torch.Tensor:
    """Plain-torch :func:`gat_aggregate`, with optional dropout on the attention coefficients.

    ``attn_drop`` (e.g. an ``nn.Dropout``) is applied to the softmax output before the weighted sum,
    which the fused kernel does not do.

    Example:
        >>> z = torch.tensor([[[1.]], [[3.]]]); el = torch.zeros(2, 1); er = torch.zeros(1, 1)
        >>> gat_aggregate_torch(z, el, er, torch.tensor([0, 1]), torch.tensor([0, 0]), 1).flatten().tolist()
        [2.0]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    scores = torch.nn.functional.leaky_relu(el.index_select(0, edge_src) + er.index_select(0, edge_dst),
                                            negative_slope)
    alpha = edge_softmax(scores, edge_dst, int(num_dst))
    if attn_drop is not None:
        alpha = attn_drop(alpha)
    messages = z.index_select(0, edge_src) * alpha.unsqueeze(-1)
    return index_add_rows(messages, edge_dst, num_dst)


# ---------------------------------------------------------------------------- compiled CPU kernels
class SharedSourceGrad:
    """One gradient of a tensor of source rows for the aggregations of several parts of a block's destinations
    (an overlapped layer's boundary and interior parts, :mod:`gsplit.minibatch.overlap`), instead of one full
    ``[sources x width]`` gradient per part that autograd then adds.

    The first part's backward to run makes the gradient and hands it to autograd; each later part adds the rows
    it reaches into that tensor in place and hands autograd nothing. Autograd runs the node that consumes the
    sources' gradient only after the backward of every part that reaches the loss, so it sees every part's rows
    (a part whose output does not reach the loss adds nothing, as its gradient would be zero). The bits are
    those of the full gradients added (``a + b``). Make one per layer and forward pass, pass it to each part's
    aggregation (``source_grad=``); used by the compiled CPU kernels, ignored by the torch fallback (autograd
    adds the parts' gradients there). On an overlapped layer of a 2-rank split run the boundary part wrote a
    26k x 256 gradient, mostly zeros, for 480 destinations, and autograd added the two (2.2 + 2.4 ms a step).

    Example:
        >>> x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
        >>> share = SharedSourceGrad()
        >>> a = copy_u_sum(x, torch.tensor([0, 1]), torch.tensor([0, 0]), 1, source_grad=share)
        >>> b = copy_u_sum(x, torch.tensor([1, 2]), torch.tensor([0, 0]), 1, source_grad=share)
        >>> (a + 2 * b).sum().backward()
        >>> x.grad[:, 0].tolist()
        [1.0, 3.0, 2.0]
    """

    def __init__(self):
        self.parts = 0
        """Aggregations registered in forward (each part's)."""
        self._shape: Optional[torch.Size] = None
        self._grad: Optional[torch.Tensor] = None
        self._done = 0

    def register(self, x: torch.Tensor) -> "SharedSourceGrad":
        """A part's aggregation over ``x`` (forward); every part must read the same sources."""
        if self._shape is not None and x.shape != self._shape:
            raise ValueError(f"SharedSourceGrad: a part aggregates {tuple(x.shape)} source rows but another "
                             f"{tuple(self._shape)}; share one per tensor of sources (one per layer)")
        self._shape = x.shape
        self.parts += 1
        return self

    @staticmethod
    def take(share: Optional["SharedSourceGrad"], kernel) -> Optional[torch.Tensor]:
        """A part's gradient for autograd from ``kernel(into)``, which returns a new full gradient for ``into=None``
        and adds the part's rows to ``into`` otherwise: the new gradient without a share or for the first part,
        else ``None`` once the part's rows are added to the first part's."""
        if share is None:
            return kernel(None)
        if share._grad is None:
            grad = share._grad = kernel(None)
        else:
            kernel(share._grad)
            grad = None
        share._done += 1
        if share._done == share.parts:  # every part is in: a later backward (retain_graph) starts afresh
            share._grad, share._done = None, 0
        return grad


class _CopyUSum(torch.autograd.Function):
    """Sum (``mean=True``: mean) of source rows per destination; backward gathers each source's gradient."""

    @staticmethod
    def forward(ctx, x, edge_src, indptr, ext, mean, share=None):
        ctx.ext, ctx.num_src, ctx.mean, ctx.share = ext, x.shape[0], mean, share
        ctx.save_for_backward(edge_src, indptr)
        return (ext.spmm_mean if mean else ext.spmm_sum)(indptr, edge_src, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        edge_src, indptr = ctx.saved_tensors
        ext, ns, mean = ctx.ext, ctx.num_src, ctx.mean
        grad = SharedSourceGrad.take(ctx.share, lambda into: ext.spmm_backward(indptr, edge_src, grad_out, ns, mean, into))
        return grad, None, None, None, None, None


class _SAGEConcat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, edge_src, indptr, dst_start, ext, share=None, ones=False):
        ctx.ext, ctx.num_src, ctx.dst_start, ctx.share = ext, x.shape[0], dst_start, share
        ctx.save_for_backward(edge_src, indptr)
        return ext.sage_concat(indptr, edge_src, x, dst_start, ones)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None, None
        edge_src, indptr = ctx.saved_tensors
        ext, ns, d0 = ctx.ext, ctx.num_src, ctx.dst_start
        # a ones column's gradient (grad_out's last column, when its width is odd) is not x's: the kernel skips it
        grad = SharedSourceGrad.take(ctx.share,
                                     lambda into: ext.sage_concat_backward(indptr, edge_src, grad_out, ns, d0, into))
        return grad, None, None, None, None, None, None


class _GATAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, el, er, edge_src, indptr, negative_slope, ext):
        out, alpha = ext.gat_forward(indptr, edge_src, z, el, er, negative_slope)
        ctx.ext, ctx.slope = ext, negative_slope
        ctx.save_for_backward(z, el, er, edge_src, indptr, alpha)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        z, el, er, edge_src, indptr, alpha = ctx.saved_tensors
        gz, gel, ger = ctx.ext.gat_backward(grad_out, indptr, edge_src, z, el, er, alpha, ctx.slope)
        return gz, gel, ger, None, None, None, None


class _ReluDropoutRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, rows, mask, scale, ext):
        out = ext.relu_dropout_rows(h, rows, mask, scale)
        ctx.ext, ctx.scale = ext, scale
        ctx.save_for_backward(out)  # with a 0/1 mask, out > 0 exactly where relu(h) > 0 and the row's cell is kept
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        (out,) = ctx.saved_tensors
        return ctx.ext.relu_dropout_rows_backward(grad_out, out, ctx.scale), None, None, None, None


class _ReluDropoutRowsPlaced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, rows, mask, scale, num_rows, pos, ext):
        ctx.ext, ctx.scale = ext, scale
        # keeps h (not the output, which the caller fills in place): backward decides from h and the mask
        ctx.save_for_backward(h, rows, mask, pos)
        return ext.relu_dropout_rows_placed(h, rows, mask, scale, num_rows, pos)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None, None
        h, rows, mask, pos = ctx.saved_tensors
        return (ctx.ext.relu_dropout_rows_placed_backward(grad_out, h, rows, mask, ctx.scale, pos),
                None, None, None, None, None, None)


class _GATScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, attn, ext):
        ctx.ext = ext
        ctx.save_for_backward(z, attn)
        return ext.gat_scores(z, attn)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        z, attn = ctx.saved_tensors
        need_z, need_attn = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_z or need_attn):
            return None, None, None
        gz, ga = ctx.ext.gat_scores_backward(grad_out, z, attn, need_z, need_attn)
        return (gz if need_z else None), (ga if need_attn else None), None


def _registered(share: Optional[SharedSourceGrad], x: torch.Tensor) -> Optional[SharedSourceGrad]:
    return None if share is None or not x.requires_grad else share.register(x)


def _prepare(edge_src: torch.Tensor, edge_dst: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return edge_src.to(torch.int64).contiguous(), edge_dst.to(torch.int64).contiguous()


# ---------------------------------------------------------------------------- dispatch
def copy_u_sum(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int,
               source_grad: Optional[SharedSourceGrad] = None) -> torch.Tensor:
    """``out[v] = sum of x[u] over the edges u -> v``: DGL's ``update_all(copy_u, sum)`` on a block.

    ``x``: [num_src, ...] rows of the block's sources; ``edge_src`` / ``edge_dst``: the block's edges as
    local indices, grouped by destination (``edge_dst`` non-decreasing, as every gsplit block is).
    Returns [num_dst, ...]; a destination without edges gets zeros. Differentiable in ``x``. ``source_grad``: the
    :class:`SharedSourceGrad` of the other parts of the same destinations' layer that read ``x``, if any.

    Example:
        >>> x = torch.tensor([[1.], [2.], [4.]])
        >>> copy_u_sum(x, torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 3).flatten().tolist()
        [6.0, 1.0, 0.0]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    ext = _use_extension(x) if x.dim() == 2 else None
    if ext is None:
        return copy_u_sum_torch(x, edge_src, edge_dst, num_dst)
    edge_src, edge_dst = _prepare(edge_src, edge_dst)
    indptr = _dst_indptr(ext, edge_src, edge_dst, x.shape[0], int(num_dst))
    return _CopyUSum.apply(x, edge_src, indptr, ext, False, _registered(source_grad, x))


def copy_u_mean(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int,
                source_grad: Optional[SharedSourceGrad] = None) -> torch.Tensor:
    """Mean of ``x[u]`` over each destination's edges; zeros where a destination has none.

    Same arguments as :func:`copy_u_sum`, which it divides by the in-degree.

    Example:
        >>> x = torch.tensor([[1.], [2.], [4.]])
        >>> copy_u_mean(x, torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 3).flatten().tolist()
        [3.0, 1.0, 0.0]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    ext = _use_extension(x) if x.dim() == 2 else None
    if ext is None:
        return copy_u_mean_torch(x, edge_src, edge_dst, num_dst)
    edge_src, edge_dst = _prepare(edge_src, edge_dst)
    indptr = _dst_indptr(ext, edge_src, edge_dst, x.shape[0], int(num_dst))
    # The kernel divides each row by its edge count (no degree pass, no [num_dst, F] quotient temporary).
    return _CopyUSum.apply(x, edge_src, indptr, ext, True, _registered(source_grad, x))


def self_and_mean(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_dst: int,
                  dst_start: int = 0, source_grad: Optional[SharedSourceGrad] = None,
                  ones_column: bool = False) -> torch.Tensor:
    """``[x[dst_start + v] | mean of x[u] over v's edges]`` for each destination ``v``: [num_dst, 2 * F], the input
    of SAGE-mean's one product with ``[W_self | W_neigh]``. ``ones_column``: one more column of ones,
    [num_dst, 2 * F + 1], so that the product with ``[W_self | W_neigh | b]`` adds the bias and its backward makes
    the bias gradient with the weights' (no separate column sum over the output's gradient: on a 20k x 256 layer
    output that sum was one more pass, ~2.4 ms in a training step on one core).

    On CPU the compiled kernel writes both halves in one pass and its backward gives one gradient over ``x``
    (the destinations' own rows and the scatter into the sources together); elsewhere ``torch.cat`` of a
    slice and :func:`copy_u_mean`. Same arguments as :func:`copy_u_sum`, plus where the destinations' rows start.

    Example:
        >>> x = torch.tensor([[1.], [2.], [4.]])
        >>> self_and_mean(x, torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 2).tolist()
        [[1.0, 3.0], [2.0, 1.0]]
        >>> self_and_mean(x, torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]), 2, ones_column=True).tolist()
        [[1.0, 3.0, 1.0], [2.0, 1.0, 1.0]]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    d0, nd = int(dst_start), int(num_dst)
    if d0 < 0 or d0 + nd > x.shape[0]:
        raise ValueError(f"destinations [{d0}, {d0 + nd}) are not rows of x ({x.shape[0]} rows); "
                         "pass the block's dst_start and num_dst")
    ext = _use_extension(x) if x.dim() == 2 else None
    if ext is None:
        parts = [x[d0:d0 + nd], copy_u_mean_torch(x, edge_src, edge_dst, nd)]
        return torch.cat(parts + [x.new_ones((nd, 1))] if ones_column else parts, dim=1)
    edge_src, edge_dst = _prepare(edge_src, edge_dst)
    indptr = _dst_indptr(ext, edge_src, edge_dst, x.shape[0], nd)
    return _SAGEConcat.apply(x, edge_src, indptr, d0, ext, _registered(source_grad, x), bool(ones_column))


def gat_aggregate(z: torch.Tensor, el: torch.Tensor, er: torch.Tensor, edge_src: torch.Tensor,
                  edge_dst: torch.Tensor, num_dst: int, negative_slope: float = 0.2) -> torch.Tensor:
    """GAT's attention and weighted sum in one pass over each destination's edges.

    For every edge ``u -> v`` and head ``k``: ``s = leaky_relu(el[u, k] + er[v, k])``; ``alpha`` is the
    softmax of ``s`` over ``v``'s edges (stable: the row maximum is subtracted);
    ``out[v, k] = sum_u alpha * z[u, k]``. ``z``: [num_src, H, D]; ``el``: [num_src, H]; ``er``:
    [>= num_dst, H] (its first ``num_dst`` rows are used). Returns [num_dst, H, D], zeros for a
    destination without edges. Differentiable in ``z``, ``el`` and ``er``. On CPU the compiled kernel
    keeps only ``alpha`` ([E, H]) for backward, never an [E, H, D] tensor.

    Example:
        >>> z = torch.tensor([[[1.]], [[3.]]]); el = torch.zeros(2, 1); er = torch.zeros(1, 1)
        >>> gat_aggregate(z, el, er, torch.tensor([0, 1]), torch.tensor([0, 0]), 1).flatten().tolist()
        [2.0]
    """
    _check_edges(edge_src, edge_dst, num_dst)
    if z.dim() != 3 or el.shape != z.shape[:2] or er.dim() != 2 or er.shape[1] != z.shape[1] or er.shape[0] < int(num_dst):
        raise ValueError(f"gat_aggregate expects z [num_src, H, D], el [num_src, H], er [>= num_dst, H]; got z "
                         f"{tuple(z.shape)}, el {tuple(el.shape)}, er {tuple(er.shape)}, num_dst={num_dst}")
    ext = _use_extension(z, el, er)
    if ext is None:
        return gat_aggregate_torch(z, el, er[: int(num_dst)], edge_src, edge_dst, num_dst, negative_slope)
    edge_src, edge_dst = _prepare(edge_src, edge_dst)
    indptr = _dst_indptr(ext, edge_src, edge_dst, z.shape[0], int(num_dst))
    return _GATAggregate.apply(z, el, er[: int(num_dst)], edge_src, indptr, float(negative_slope), ext)


def relu_dropout_rows(h: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, scale: float,
                      place: Optional[Tuple[int, torch.Tensor]] = None) -> torch.Tensor:
    """``relu(h[i]) * (mask[rows[i]] * scale)`` for every row ``i``: ReLU, then dropout with each row's mask drawn
    from a small 0/1 bank (what :func:`gsplit.nn.relu_vertex_dropout` computes between two layers). ``h``: [n, F];
    ``rows``: [n] indices below ``mask.shape[0]``; ``mask``: [R, F] of zeros and ones (``h``'s dtype, or bool: the
    kernel then reads a quarter of the bytes and needs no check of the cells); ``scale``: ``1 / (1 - p)``.
    Differentiable in ``h``. ``place=(num_rows, pos)``: the result as :func:`gsplit.ops.rows.place_rows` places it
    (a new ``[num_rows, F]`` tensor, row ``i`` at ``pos[i]``, the other rows for the caller to fill in place); the
    kernel writes the rows there directly (an overlapped layer's interior rows, into the next layer's input:
    no copy forward, no gather backward) and keeps ``h`` for backward instead of its output.

    On CPU the compiled kernel does it in one pass forward and one backward and keeps only its output for
    backward (the unfused ops keep ReLU's output and the [n, F] mask rows), with the same bits as the unfused
    ops (ReLU, a gather of the scaled mask rows, a product; backward a product and ReLU's threshold) for every
    non-NaN output; elsewhere the unfused ops run. Measured in ``experiments/bench_layer_ops.py``.

    Example:
        >>> h = torch.tensor([[-1., 2.], [3., -4.]])
        >>> relu_dropout_rows(h, torch.tensor([1, 0]), torch.tensor([[0., 1.], [1., 1.]]), 2.0).tolist()
        [[0.0, 4.0], [0.0, 0.0]]
    """
    if h.dim() != 2 or rows.dim() != 1 or rows.numel() != h.shape[0] or mask.dim() != 2 or mask.shape[1] != h.shape[1]:
        raise ValueError(f"relu_dropout_rows expects h [n, F], rows [n] and mask [R, F]; got h {tuple(h.shape)}, rows "
                         f"{tuple(rows.shape)}, mask {tuple(mask.shape)}")
    fits = mask.device == h.device and mask.dtype in (torch.bool, h.dtype)
    ext = _use_extension(h) if fits else None
    if ext is None:
        out = torch.relu(h) * (mask.to(h.dtype) * scale).index_select(0, rows)
        if place is None:
            return out
        return place_rows(out, *place)
    rows = rows.to(torch.int64).contiguous()
    if place is None:
        return _ReluDropoutRows.apply(h, rows, mask, float(scale), ext)
    num_rows, pos = place
    return _ReluDropoutRowsPlaced.apply(h, rows, mask.contiguous(), float(scale), int(num_rows),
                                        pos.to(torch.int64).contiguous(), ext)


def gat_scores(z: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """GAT's per-vertex half of the attention score, ``(z * attn).sum(-1)``: ``z`` [n, H, D] (projected rows, per
    head), ``attn`` [1, H, D] or [H, D] (the attention vector ``attn_l`` or ``attn_r``); returns [n, H].
    Differentiable in both.

    On CPU (float32 / float64) the compiled kernel reads ``z`` once forward and once backward without the
    [n, H, D] product the unfused ops write (forward) and the two they write backward; the gradient of ``z`` has the
    unfused ops' bits, the scores and the gradient of ``attn`` are summed in another (fixed) order, so they can
    differ from the unfused ops in the last bits, never with the thread count. Elsewhere the unfused ops run.

    Example:
        >>> z = torch.arange(8.).view(2, 2, 2)
        >>> gat_scores(z, torch.tensor([[1., 0.], [0., 1.]])).tolist()
        [[0.0, 3.0], [4.0, 7.0]]
    """
    if z.dim() != 3 or attn.shape[-2:] != z.shape[1:] or attn.numel() != z.shape[1] * z.shape[2]:
        raise ValueError(f"gat_scores expects z [n, H, D] and attn [1, H, D] or [H, D] of the same H and D; got z "
                         f"{tuple(z.shape)}, attn {tuple(attn.shape)}")
    ext = _use_extension(z, attn)
    if ext is None:
        return (z * attn).sum(-1)
    return _GATScores.apply(z, attn.reshape(z.shape[1], z.shape[2]), ext)
