"""Overlapped layers in split-parallel MINI-BATCH training: the rows other ranks need first (G3's order).

Plain split training runs, for every layer ``i`` above the input, a blocking all-to-all (the shuffle)
and then the layer; backward mirrors it. Every layer is then a barrier: the faster rank waits for the
slower one. Overlapped, layer ``i`` (all but the last) runs in this order on every rank:

1. the per-source terms of the layer, once (``layer.project_sources``: GAT's projection, SAGE's and
   GCN's when they multiply first);
2. the *boundary* part: the layer's destinations that another rank's next block reads
   (``layer.combine`` on their in-edges), with the activation and dropout that follow the layer;
3. the asynchronous all-to-all of those rows starts (``async_op=True``); where each boundary row goes to exactly
   one other rank (two ranks), the between-layer step writes the rows in the order they are sent
   (``place=(n, send_inverse)``), so its output is the send buffer and no row is gathered for the send, nor
   its gradient gathered back;
4. the *interior* part: the destinations only this rank reads, computed while the rows travel;
5. wait, and assemble the next block's source rows (received rows plus this rank's own).

Backward does the same for the returning gradients: the gradients of the received rows start back to
their owners as soon as the next layer's backward has them, autograd runs the interior part's backward
meanwhile (it was created later in forward, so it runs first), and only the boundary part waits. A rank
then waits only when a peer has not finished its *boundary* part by the time it finished its whole layer.

What makes it cheap: sampling (:func:`gsplit.split.sp_sample` with ``overlap=True``) orders every local
frontier above the input interior first, so each part's destinations are a row range and their in-edges
an edge range (edges are grouped by destination): the two parts are views of the block
(:class:`~gsplit.sampling.block.OverlapSplit`, ``Block.dst_start``), over the same per-source terms, so
nothing is gathered and no per-source work is repeated. The plan (one per block but the last) is built
with the batch, on the loader's (prefetch) side, with python-int sizes: the forward reads nothing from the
device between starting and waiting for a collective, so it works unchanged on NCCL.

Exactness: every destination sums the same in-edges in the same order as the plain path, from the same
per-source terms. The per-destination products (e.g. SAGE's ``fc_self``) multiply fewer rows at once,
and a BLAS product's row may differ in the last bit with the number of rows (seen on this CPU in
float64); the gradients of the per-source terms are the sum of two parts' partial sums. So results equal
the plain path up to rounding (float64: relative 1e-12 in ``tests/minibatch/test_overlap_minibatch.py``), as the
plain path equals single-process training. The last layer sends nothing after it and runs whole;
layer 0's input is the feature shuffle.

Which models: gsplit's own (:mod:`gsplit.nn.models`, through :func:`gsplit.sp_forward`) whenever the
blocks carry a plan and every layer has ``project_sources`` / ``combine`` (gsplit's layers do); other
layers, and models wrapped by :class:`gsplit.SplitParallel` (DGL / PyG layers via hooks), run the plain
path on the same blocks.
"""

from __future__ import annotations

import inspect
import time
import weakref
from dataclasses import replace
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from gsplit.comm.communicator import Communicator
from gsplit.comm.waits import track_in_flight, waiting_for_peers
from gsplit.ops.aggregate import SharedSourceGrad
from gsplit.ops.rows import gather_rows, scatter_rows_
from gsplit.sampling.block import Block, OverlapSplit, split_destinations, without_stretch
from gsplit.runtime.timing import LayerClock, layer_ends, layer_starts

__all__ = ["AsyncRows", "plan_overlap", "overlapped_sp_forward", "splits_sources"]


class AsyncRows:
    """One asynchronous all-to-all of rows on a :class:`~gsplit.Communicator`: :meth:`start`, work, :meth:`wait`.

    Counted as the communicator's own collectives are: rows and bytes sent to other ranks and one call per
    start under the tag, the seconds spent in :meth:`wait` (the waiting for peers) too; the wait is marked
    for the launcher's watchdog (:mod:`gsplit.comm.waits`). Sizes are python ints: nothing is read from the
    device, so under NCCL ``start`` enqueues and ``wait`` only orders the current stream after it.

    Example:
        >>> ex = AsyncRows(Communicator())
        >>> ex.start(torch.zeros(0, 4), [0], [0], "shuffle/layer1/overlap/fwd")
        >>> ex.wait().shape
        torch.Size([0, 4])
    """

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.tag = ""
        self._work = None
        self._recv: Optional[torch.Tensor] = None
        self._staged_for: Optional[torch.device] = None
        self._send: Optional[torch.Tensor] = None
        self.kept_grad: Optional[torch.Tensor] = None
        """Overlapped layers' backward: the gradients of the boundary rows this rank reads itself
        (``OverlapSplit.keep_boundary_idx``), held from ``_Assemble``'s backward until ``_SendBoundary``'s adds
        them to the gradients that come back, so that the boundary rows' gradient is made once."""

    def start(self, rows: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], tag: str) -> None:
        """Start sending ``rows`` (grouped by destination rank, ``send_counts[j]`` to rank ``j``)."""
        comm, self.tag = self.comm, tag
        rows = rows.contiguous()
        send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        shape = (sum(recv_counts),) + tuple(rows.shape[1:])
        if comm.world_size == 1:  # nothing to send, no collective (as the Communicator's own)
            self._recv = rows if send_counts[0] else rows.new_empty(shape)
            return
        comm.count_rows(tag, rows, send_counts)
        comm.traffic.add_call(tag)
        dev = comm._collective_device(rows)
        self._staged_for = rows.device if dev != rows.device else None  # CUDA tensors over gloo: via the host
        send = rows.to(dev) if self._staged_for is not None else rows
        self._recv = torch.empty(shape, dtype=rows.dtype, device=dev)
        self._send = send  # alive until the exchange completes
        self._work = dist.all_to_all_single(self._recv, send, recv_counts, send_counts, group=comm.group,
                                            async_op=True)

    def wait(self) -> torch.Tensor:
        """The received rows, grouped by source rank (waits for the peers if they have not sent yet)."""
        if self._work is not None:
            t0 = time.perf_counter()
            with waiting_for_peers():
                self._work.wait()
            track_in_flight(self._work)
            self.comm.traffic.add_call(self.tag, n=0, seconds=time.perf_counter() - t0)
            self._work = None
        self._send = None
        recv, self._recv = self._recv, None
        return recv.to(self._staged_for) if self._staged_for is not None else recv


# ---------------------------------------------------------------------------------------------- the plan
def plan_overlap(blocks: List[Block], rank: int, interior_edges: Optional[List[int]] = None) -> None:
    """Give every block but the last its :class:`~gsplit.sampling.block.OverlapSplit` (``block.overlap``).

    ``blocks`` come from :func:`gsplit.split.sp_sample` with ``overlap=True`` (their local frontiers are
    ordered interior first: ``blocks[i + 1].shuffle_index.num_interior`` is set). Runs where the batch is
    made (the loader's prefetch thread): its sizes are read here once, as python ints. ``interior_edges[i]``: the
    in-edges of block ``i``'s interior destinations, when the sampler read them already with its other sizes
    (:mod:`gsplit.split.deferred`, which makes the plans itself): then nothing is read here, and the check that
    every interior row is kept, which only a plan made elsewhere can fail, is not made.

    Example:
        >>> batch = sp_sample(g, seeds, owner, sampler, comm, overlap=True)   # calls it   # doctest: +SKIP
        >>> batch.blocks[0].overlap.num_interior                                           # doctest: +SKIP
    """
    for i in range(len(blocks) - 1):
        block, index = blocks[i], blocks[i + 1].shuffle_index
        if index is None or index.num_interior is None:
            raise ValueError(f"block {i + 1} has no interior-first shuffle plan; sample with sp_sample(..., overlap=True)")
        n_own, n_int, dev = block.num_dst, int(index.num_interior), block.device
        if index.num_local != n_own:
            raise ValueError(f"block {i + 1}'s shuffle reads {index.num_local} rows but block {i} makes {n_own}")
        # the next shuffle, cut in the rows that stay on this rank and those that go (python-int offsets)
        own_send, own_recv = index.own_rows(rank)
        keep_idx, keep_pos = index.send_idx[own_send], index.recv_pos[own_recv]
        n_keep, n_bnd = keep_idx.numel(), n_own - n_int
        # every interior row is read here exactly once (no other rank asked for it), boundary rows at most once:
        # sorted, the kept rows are 0..n_int-1 and then the kept boundary rows
        if n_keep < n_int:
            raise ValueError(f"block {i + 1}'s plan keeps {n_keep} rows on rank {rank} but the layer has {n_int} "
                             f"interior rows, each read on this rank; the plan is not sp_sample's")
        place = _kept_places(keep_idx, n_own)
        e_int = 0
        if interior_edges is not None:
            e_int = interior_edges[i]
        elif n_int:  # edges are grouped by destination: the interior destinations' edges come first. One host
            # read, with the check that every interior row is kept (so interior_pos is right)
            e_int, missing = torch.stack([torch.searchsorted(block.edge_dst, torch.tensor([n_int], device=dev))[0],
                                          (place[:n_int] < 0).any().to(torch.int64)]).tolist()
            if missing:
                raise ValueError(f"block {i + 1}'s plan does not read each of the {n_int} interior rows once on "
                                 f"rank {rank}; the plan is not sp_sample's")
        assembly = _assembly_fields(keep_idx, keep_pos, n_int, n_own, place)
        # both parts read the whole block's sources (their per-source terms are computed once)
        interior, boundary = split_destinations(block, n_int, e_int)
        send_counts, recv_counts = index.counts_to_others(rank)
        send_idx = without_stretch(index.send_idx, own_send) - n_int
        send_inverse = None
        if sum(send_counts) == n_bnd and n_bnd:  # every boundary row goes to exactly one other rank (two ranks)
            send_inverse = torch.empty_like(send_idx).index_copy_(
                0, send_idx, torch.arange(n_bnd, dtype=send_idx.dtype, device=dev))
        keep_boundary_send = _kept_in_send_order(send_inverse, assembly["keep_boundary_idx"])
        block.overlap = OverlapSplit(
            interior_block=interior, boundary_block=boundary,
            send_idx=send_idx, send_counts=send_counts,
            recv_pos=without_stretch(index.recv_pos, own_recv), recv_counts=recv_counts,
            keep_idx=keep_idx, keep_pos=keep_pos, num_mixed=index.num_mixed, send_inverse=send_inverse,
            keep_boundary_send=keep_boundary_send, **assembly)


def _kept_places(keep_idx: torch.Tensor, n_own: int) -> torch.Tensor:
    """Per row of the block (``n_own``), its place in ``keep_idx`` (distinct rows), ``-1`` where it is not kept."""
    place = torch.full((n_own,), -1, dtype=torch.int64, device=keep_idx.device)
    return place.index_copy_(0, keep_idx.to(torch.int64), torch.arange(keep_idx.numel(), device=keep_idx.device))


def _assembly_fields(keep_idx: torch.Tensor, keep_pos: torch.Tensor, n_int: int, n_own: int,
                     place: Optional[torch.Tensor] = None) -> dict:
    """The plan's assembly fields of the kept rows ``keep_idx`` (distinct rows of ``n_own``, every interior row
    ``0..n_int-1`` among them: checked by :func:`plan_overlap`) read at ``keep_pos``: each interior row's place,
    then the kept boundary rows in row order with theirs. ``place``: :func:`_kept_places`, when made already.

    The same fields as a sort of ``keep_idx`` (distinct values: the order is unique), by a scatter into a table
    of the block's rows and, for the boundary rows, a prefix-sum compaction: linear time, and no size read from
    the device (measured on one CPU core, 23k rows: 0.19 ms against 1.23 ms for the sort).
    """
    dev, n_kb = keep_idx.device, keep_idx.numel() - n_int
    place = _kept_places(keep_idx, n_own) if place is None else place
    interior, boundary = place[:n_int], place[n_int:]
    kept = boundary >= 0
    # a kept boundary row's slot among the kept ones; the others all write one dump slot past the end
    slot = torch.where(kept, torch.cumsum(kept, 0) - 1, n_kb)
    keep_boundary_idx = torch.empty(n_kb + 1, dtype=torch.int64, device=dev).index_copy_(
        0, slot, torch.arange(boundary.numel(), device=dev))[:n_kb]
    return dict(interior_pos=keep_pos.index_select(0, interior), keep_boundary_idx=keep_boundary_idx,
                keep_boundary_pos=keep_pos.index_select(0, boundary.index_select(0, keep_boundary_idx)))


def _assembly(plan: OverlapSplit) -> OverlapSplit:
    """``plan`` with its assembly fields (``interior_pos``, ``keep_boundary_*``) derived from ``keep_idx`` /
    ``keep_pos`` (and ``send_inverse``) when a plan was made without them; no host read. :func:`plan_overlap`'s
    plans have them all (made on the loader's side), so this returns them as they are."""
    if plan.interior_pos is None:
        n_own = plan.interior_block.num_dst + plan.boundary_block.num_dst
        plan = replace(plan, **_assembly_fields(plan.keep_idx, plan.keep_pos, plan.num_interior, n_own))
    if plan.keep_boundary_send is None and plan.send_inverse is not None:
        plan = replace(plan, keep_boundary_send=_kept_in_send_order(plan.send_inverse, plan.keep_boundary_idx))
    return plan


def _kept_in_send_order(send_inverse: Optional[torch.Tensor], keep_boundary_idx: torch.Tensor
                        ) -> Optional[torch.Tensor]:
    """Where the boundary rows this rank reads too sit in a boundary output written in send order:
    ``send_inverse[keep_boundary_idx]``; ``None`` without ``send_inverse`` (rows sent to several ranks)."""
    return None if send_inverse is None else send_inverse.index_select(0, keep_boundary_idx)


# ---------------------------------------------------------------------------------------------- autograd
class _SendBoundary(torch.autograd.Function):
    """Forward: start sending the boundary rows. Backward: wait for their gradients from the other ranks.

    ``in_send_order``: ``hb``'s rows are in the order they are sent already (the between-layer step placed them
    there, ``place=(n, plan.send_inverse)``), so ``hb`` itself is the send buffer (no gather forward) and the
    returning gradients are its gradient as they arrive (no gather backward)."""

    @staticmethod
    def forward(ctx, hb: torch.Tensor, plan: OverlapSplit, ex: AsyncRows, tag: str, clock: Optional[LayerClock],
                layer: int, in_send_order: bool = False) -> torch.Tensor:
        ctx.plan, ctx.ex, ctx.shape, ctx.clock, ctx.layer = plan, ex, hb.shape, clock, layer
        ctx.in_send_order = in_send_order
        ex.start(hb if in_send_order else gather_rows(hb, plan.send_idx), plan.send_counts, plan.recv_counts,
                 f"{tag}/fwd")
        return hb.new_empty(0)  # a token that orders _Assemble after this in the graph

    @staticmethod
    def backward(ctx, _token_grad):
        plan: OverlapSplit = ctx.plan
        if ctx.clock is not None:  # the layer's backward pauses while it waits (not its compute)
            ctx.clock.mark(None)
        back = ctx.ex.wait()
        if ctx.clock is not None:
            ctx.clock.mark(("bwd", ctx.layer))
        kept_at = plan.keep_boundary_idx
        if ctx.in_send_order:  # row k's gradient is back[k]: the received buffer is the gradient (ours to write)
            grad = back
            kept_at = plan.keep_boundary_send
        elif plan.send_inverse is not None:  # each boundary row went to one rank: gather its one gradient
            grad = gather_rows(back, plan.send_inverse)
        else:  # a row sent to several ranks sums their gradients
            grad = back.new_zeros(ctx.shape)
            grad.index_add_(0, plan.send_idx, back)
        kept, ctx.ex.kept_grad = ctx.ex.kept_grad, None
        if kept is not None:  # and this rank's own reads of boundary rows (a + b: the bits of autograd's sum)
            grad.index_add_(0, kept_at, kept)
        return grad, None, None, None, None, None, None


class _Assemble(torch.autograd.Function):
    """Forward: the next block's source rows from this rank's rows and the received ones (after the wait).
    Backward: start returning the received rows' gradients, give this rank's rows theirs.

    Every place is written once and every row read from where it is (``hi``, ``hb``, the received rows): no
    concatenation, no advanced indexing. The interior rows, each read once here, are either copied in (one
    scatter, their gradients back in one gather) or, ``placed``, already in ``hi``: the between-layer step wrote
    them to their places in a ``[num_mixed, width]`` tensor (``between(..., place=...)``), which is then filled
    in place, and its backward reads their gradients from that whole gradient itself (no copy either way)."""

    @staticmethod
    def forward(ctx, token, hi: torch.Tensor, hb: torch.Tensor, plan: OverlapSplit, ex: AsyncRows,
                tag: str, placed: bool = False, in_send_order: bool = False) -> torch.Tensor:
        ctx.plan, ctx.ex, ctx.tag, ctx.token_shape, ctx.placed = plan, ex, tag, token.shape, placed
        if placed:
            if hi.shape[0] != plan.num_mixed:
                raise ValueError(f"between(..., place=({plan.num_mixed}, pos)) returned {hi.shape[0]} rows; with place "
                                 f"it must return the rows placed in a new [{plan.num_mixed}, width] tensor "
                                 "(gsplit.ops.rows.place_rows)")
            out = hi
            ctx.mark_dirty(out)
        else:
            out = scatter_rows_(hi.new_empty((plan.num_mixed,) + tuple(hi.shape[1:])), plan.interior_pos, hi)
        if plan.keep_boundary_idx.numel():
            kept = plan.keep_boundary_send if in_send_order else plan.keep_boundary_idx
            scatter_rows_(out, plan.keep_boundary_pos, gather_rows(hb, kept))
        scatter_rows_(out, plan.recv_pos, ex.wait())
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        plan: OverlapSplit = ctx.plan
        # the received rows' gradients go back first; the interior backward runs while they travel
        ctx.ex.start(gather_rows(grad_out, plan.recv_pos), plan.recv_counts, plan.send_counts, f"{ctx.tag}/bwd")
        grad_hi = grad_out if ctx.placed else gather_rows(grad_out, plan.interior_pos)
        # the boundary rows' gradient is made by _SendBoundary's backward (which runs next, after the wait),
        # from the returning gradients and these: one buffer, no zeros and no sum of two
        if plan.keep_boundary_idx.numel():
            ctx.ex.kept_grad = gather_rows(grad_out, plan.keep_boundary_pos)
        # a (size-0) gradient for the token, so that autograd runs _SendBoundary's backward: the wait
        return grad_out.new_zeros(ctx.token_shape), grad_hi, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------- forward
def overlapped_sp_forward(layers: Sequence[torch.nn.Module], feat: torch.Tensor, blocks: Sequence[Block],
                          between: Optional[Callable[[int, torch.Tensor, Block], torch.Tensor]],
                          comm: Communicator, clock: Optional[LayerClock] = None) -> torch.Tensor:
    """:func:`gsplit.sp_forward` on blocks that carry :class:`~gsplit.sampling.block.OverlapSplit` plans:
    each layer but the last computes its boundary rows, starts their shuffle, computes the interior rows,
    then waits (see the module docstring). ``between(i, h, block)`` gets the part's block, whose
    ``dst_nodes`` are the rows of ``h``; a ``between`` that also takes ``place=(num_rows, pos)`` (as gsplit's
    models' does) returns the interior part's rows placed as :func:`gsplit.ops.rows.place_rows` places them, the
    next layer's input, which the assembly then fills in place (no copy of the interior rows either way).
    ``clock`` times each layer's compute, its waits left out (see :func:`gsplit.sp_forward`). Returns what
    ``sp_forward`` returns, up to rounding.

    Example:
        >>> logits = overlapped_sp_forward(model.layers, blocks[0].srcdata["feat"], blocks, model.between,
        ...                                loader.comm)                                   # doctest: +SKIP
    """
    if not splits_sources(layers):
        raise ValueError("overlapped layers need layers with project_sources(block, h) and combine(block, sources) "
                         "(gsplit's SAGEConv, GATConv, GraphConv); run sp_forward, which falls back to the plain path")
    h = feat
    last = len(layers) - 1
    placed = between is not None and _takes(between, "place")
    for i, (layer, block) in enumerate(zip(layers, blocks)):
        h = layer_starts(clock, i, h)
        if i == last:
            return layer_ends(clock, i, layer(block, h))
        plan = _assembly(block.overlap)
        tag = f"{blocks[i + 1].shuffle_index.tag}/overlap"
        bb, ib = plan.boundary_block, plan.interior_block
        sources = layer.project_sources(block, h)  # once, for both parts
        # one gradient of the aggregated sources for both parts (the first part's backward makes it, the other adds)
        share = {"source_grad": SharedSourceGrad()} if _takes(layer.combine, "source_grad") else {}
        hb = layer.combine(bb, sources, **share)
        # each boundary row goes to one other rank (two ranks): the between-layer step writes the rows in the order
        # they are sent, so the send buffer is its output (no gather forward, none of the gradients backward)
        in_send_order = placed and plan.send_inverse is not None
        if in_send_order:
            hb = between(i, hb, bb, place=(hb.shape[0], plan.send_inverse))
        elif between is not None:
            hb = between(i, hb, bb)
        ex = AsyncRows(comm)
        token = _SendBoundary.apply(hb, plan, ex, tag, clock, i, in_send_order)
        hi = layer.combine(ib, sources, **share)  # computed while the boundary rows travel
        if placed:  # straight to their places in the next layer's input
            hi = between(i, hi, ib, place=(plan.num_mixed, plan.interior_pos))
        elif between is not None:
            hi = between(i, hi, ib)
        if clock is not None:  # the wait in _Assemble is not the layer's compute
            clock.mark(None)
        h = layer_ends(clock, i, _Assemble.apply(token, hi, hb, plan, ex, tag, placed, in_send_order))
    return h


_PARAMETERS: "weakref.WeakKeyDictionary[Callable, frozenset]" = weakref.WeakKeyDictionary()
"""Parameter names by function, read once: ``inspect.signature`` costs ~25 us, and the overlapped forward asks about
every layer's ``combine`` and the model's ``between`` at every step (a GPU step is ~14 ms)."""


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes a parameter ``name``: ``place`` for a ``between`` (gsplit's models' does: the interior rows
    are then written straight to their places in the next layer's input), ``source_grad`` for a layer's ``combine``
    (gsplit's SAGEConv and GraphConv do). A callable without a signature (a builtin) takes neither."""
    func = getattr(fn, "__func__", fn)  # a bound method's function: one entry per class, not per instance
    try:
        params = _PARAMETERS[func]
    except KeyError:
        params = _PARAMETERS[func] = _parameters(func)
    except TypeError:  # no weak reference to it (a builtin): read each time
        params = _parameters(func)
    return name in params


def _parameters(func: Callable) -> frozenset:
    try:
        return frozenset(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return frozenset()


def splits_sources(layers: Sequence[torch.nn.Module]) -> bool:
    """Whether every layer computes its per-source terms apart from its destinations (``project_sources`` and
    ``combine``, as gsplit's layers do): what an overlapped layer needs to compute two parts without repeating
    the per-source work. Layers under :func:`gsplit.recompute_layers` do not (they run the plain path).

    Example:
        >>> from gsplit.nn.layers import SAGEConv
        >>> splits_sources([SAGEConv(4, 4)]), splits_sources([torch.nn.Linear(4, 4)])
        (True, False)
    """
    # a layer under gsplit.recompute_layers recomputes its forward; its parts would bypass that: plain path
    return all(callable(getattr(layer, "project_sources", None)) and callable(getattr(layer, "combine", None))
               and not getattr(layer, "_gsplit_recompute", False) for layer in layers)
