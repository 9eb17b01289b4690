"""G3's boundary-first order for full-graph training: send the rows other ranks need while the rest compute.

(Mini-batch training has its own plan, built per batch: :mod:`gsplit.minibatch.overlap`, whose asynchronous
all-to-all both use.)

Before layer ``i + 1`` every rank sends the rows of its *boundary* vertices (those some other rank reads)
and receives its halo. With the owned vertices ordered boundary first (:func:`boundary_first`), layer
``i`` is computed in two parts: the boundary rows (a prefix of the block's destinations: a block over the
first ``num_boundary`` destinations and their edges), whose all-to-all then starts asynchronously, and
the interior rows, computed while it is in flight. Backward mirrors it: the halo rows' gradients are sent
back asynchronously as soon as the next layer's backward has them, while autograd goes through the
interior part (created later in forward, so it runs first in backward); only the boundary part waits.

Every destination still sums the same in-edges in the same order, so the result equals the
non-overlapped forward (and single-process training) up to the order of gradient sums.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import torch

from gsplit.comm.communicator import Communicator, as_communicator
from gsplit.data.precision import model_input
from gsplit.minibatch.overlap import AsyncRows
from gsplit.sampling.block import Block

__all__ = ["boundary_first", "OverlapPlan", "build_overlap_plan", "overlapped_forward"]


def boundary_first(block: Block, rank: int) -> Tuple[Block, int]:
    """``(block', num_boundary)``: ``block`` (a full-graph split block) with its destinations reordered,
    boundary vertices first, and how many there are.

    The boundary vertices are those the shuffle plan sends to another rank. Each destination keeps its
    in-edges in the same order; the shuffle plan is renumbered to the new row order.
    """
    index = block.shuffle_index
    n_own = block.num_dst
    dest = torch.repeat_interleave(torch.arange(len(index.send_counts), device=index.send_idx.device),
                                   torch.tensor(index.send_counts, device=index.send_idx.device))
    boundary = torch.zeros(n_own, dtype=torch.bool, device=block.device)
    boundary[index.send_idx[dest != rank].to(block.device)] = True
    perm = torch.cat([boundary.nonzero().squeeze(1), (~boundary).nonzero().squeeze(1)])  # new row -> old row
    new_of_old = torch.arange(block.num_src_nodes(), device=block.device)
    new_of_old[perm] = torch.arange(n_own, device=block.device)
    # edges regrouped by the new destination order, each destination's edges in their old order
    deg = torch.bincount(block.edge_dst, minlength=n_own)
    ptr = torch.cumsum(deg, 0) - deg
    lens = deg[perm]
    starts = ptr[perm]
    total = int(lens.sum())
    offsets = torch.cumsum(lens, 0) - lens
    order = torch.repeat_interleave(starts - offsets, lens) + torch.arange(total, device=block.device)
    src_nodes = torch.cat([block.src_nodes[:n_own][perm], block.src_nodes[n_own:]])
    plan = replace(index, send_idx=new_of_old[index.send_idx.to(block.device)].to(index.send_idx.device),
                   recv_pos=new_of_old[index.recv_pos.to(block.device)].to(index.recv_pos.device))
    out = replace(block, src_nodes=src_nodes, edge_src=new_of_old[block.edge_src[order]],
                  edge_dst=torch.repeat_interleave(torch.arange(n_own, device=block.device), lens),
                  edge_ids=block.edge_ids[order], shuffle_index=plan)
    return out, int(boundary.sum())


@dataclass
class OverlapPlan:
    """What the boundary-first forward needs on one rank, built once with the blocks."""

    boundary_blocks: List[Block]
    """Per layer: the block of the boundary destinations (a prefix of the full block's)."""
    interior_blocks: List[Block]
    """Per layer: the block of the interior destinations, over the input rows permuted by ``interior_rows``."""
    interior_rows: torch.Tensor
    """Input rows of the interior blocks: interior, then boundary, then halo rows of the full block."""
    num_boundary: int
    """Boundary vertices of this rank (rows other ranks read)."""
    num_own: int
    """Vertices this rank owns."""
    send_idx: torch.Tensor
    """Boundary rows sent to other ranks, grouped by destination rank."""
    send_counts: List[int]
    """Rows sent to each rank (0 to itself)."""
    recv_pos: torch.Tensor
    """Halo position (row of the full block minus ``num_own``) of every received row, grouped by sender."""
    recv_counts: List[int]
    """Rows received from each rank (0 from itself)."""
    full_blocks: List[Block]
    """The full blocks (the last layer runs on its full block: nothing is sent after it)."""


def build_overlap_plan(blocks: List[Block], rank: int, num_boundary: int) -> OverlapPlan:
    """The plan of :func:`overlapped_forward` for boundary-first blocks (see :func:`boundary_first`)."""
    base = blocks[0]
    nb, n_own, index = int(num_boundary), base.num_dst, base.shuffle_index
    world = len(index.send_counts)
    dev = index.send_idx.device
    send_dest = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(index.send_counts, device=dev))
    recv_src = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(index.recv_counts, device=dev))
    send_counts = [0 if r == rank else c for r, c in enumerate(index.send_counts)]
    recv_counts = [0 if r == rank else c for r, c in enumerate(index.recv_counts)]
    rows = torch.cat([torch.arange(nb, n_own), torch.arange(nb), torch.arange(n_own, base.num_src_nodes())]).to(
        base.device)
    new_of_old = torch.empty_like(rows)
    new_of_old[rows] = torch.arange(rows.numel(), device=base.device)
    eb = int((base.edge_dst < nb).sum())
    boundary_blocks, interior_blocks = [], []
    for b in blocks:
        boundary_blocks.append(Block(src_nodes=b.src_nodes, num_dst=nb, edge_src=b.edge_src[:eb],
                                     edge_dst=b.edge_dst[:eb], edge_ids=b.edge_ids[:eb], layer=b.layer))
        interior_blocks.append(Block(src_nodes=b.src_nodes[rows], num_dst=n_own - nb,
                                     edge_src=new_of_old[b.edge_src[eb:]], edge_dst=b.edge_dst[eb:] - nb,
                                     edge_ids=b.edge_ids[eb:], layer=b.layer))
    return OverlapPlan(boundary_blocks=boundary_blocks, interior_blocks=interior_blocks, interior_rows=rows,
                       num_boundary=nb, num_own=n_own, send_idx=index.send_idx[send_dest != rank],
                       send_counts=send_counts, recv_pos=index.recv_pos[recv_src != rank] - n_own,
                       recv_counts=recv_counts, full_blocks=list(blocks))


class _Exchange(AsyncRows):
    """One layer's asynchronous all-to-all, forward and backward (what the two autograd halves share): the
    mini-batch path's :class:`~gsplit.minibatch.overlap.AsyncRows` (counted, its waits marked), under ``self.tag``."""

    def __init__(self, plan: OverlapPlan, comm: Communicator, tag: str):
        super().__init__(comm)
        self.plan, self.tag = plan, tag
        self.width: tuple = ()

    def start(self, rows: torch.Tensor, send_counts, recv_counts) -> None:
        super().start(rows, send_counts, recv_counts, self.tag)


class _Start(torch.autograd.Function):
    """Forward: start sending the boundary rows. Backward: wait for the halo gradients, add them up."""

    @staticmethod
    def forward(ctx, h_boundary: torch.Tensor, ex: _Exchange) -> torch.Tensor:
        ctx.ex = ex
        ctx.shape = h_boundary.shape
        ex.width = tuple(h_boundary.shape[1:])
        ex.start(h_boundary[ex.plan.send_idx], ex.plan.send_counts, ex.plan.recv_counts)
        return h_boundary.new_empty(0)  # a token that orders _Wait after this in the graph

    @staticmethod
    def backward(ctx, _token_grad):
        ex: _Exchange = ctx.ex
        back = ex.wait()
        grad = back.new_zeros(ctx.shape)
        grad.index_add_(0, ex.plan.send_idx, back)
        return grad, None


class _Wait(torch.autograd.Function):
    """Forward: wait for the halo rows. Backward: start sending their gradients back to their owners."""

    @staticmethod
    def forward(ctx, token: torch.Tensor, ex: _Exchange) -> torch.Tensor:
        ctx.ex = ex
        ctx.token_shape = token.shape
        recv = ex.wait()
        halo = recv.new_empty((int(sum(ex.plan.recv_counts)),) + tuple(recv.shape[1:]))
        halo[ex.plan.recv_pos] = recv
        return halo

    @staticmethod
    def backward(ctx, grad_halo: torch.Tensor):
        ex: _Exchange = ctx.ex
        ex.tag = ex.tag.replace("/fwd", "/bwd")
        ex.start(grad_halo[ex.plan.recv_pos], ex.plan.recv_counts, ex.plan.send_counts)
        return grad_halo.new_zeros(ctx.token_shape), None


def overlapped_forward(model, plan: OverlapPlan, x: torch.Tensor, group=None) -> torch.Tensor:
    """The model's forward on full-graph blocks, boundary rows first and their shuffle overlapped.

    ``model`` follows :mod:`gsplit.minibatch.inference`'s protocol (``layers``, ``between(i, h, block)``, optional
    ``output(h)``), as gsplit's models do; a model that counts its training steps in ``model.step``
    (gsplit's, for vertex dropout) has it advanced as its own forward would. ``x`` is
    ``blocks[0].srcdata["feat"]``; ``group`` the loader's (``loader.comm``). Returns one row per owned
    vertex, in the blocks' (boundary-first) order, equal to ``model(blocks, x)``.

    Example:
        >>> logits = overlapped_forward(model, loader.overlap_plan, blocks[0].srcdata["feat"], loader.comm)  # doctest: +SKIP
    """
    from gsplit.minibatch.inference import _model_parts

    layers, between, output = _model_parts(model, "model")
    if len(layers) != len(plan.full_blocks):
        raise ValueError(f"the model has {len(layers)} layers but the plan {len(plan.full_blocks)}")
    if getattr(model, "training", False) and isinstance(getattr(model, "step", None), int):
        model.step += 1  # what the model's own forward does first (it keys the vertex-dropout masks)
    comm = as_communicator(group)
    h = model_input(x, layers)  # half-precision features: upcast once, as sp_forward does
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        if i == last:
            h = layer(plan.full_blocks[i], h)
            break
        bb, ib = plan.boundary_blocks[i], plan.interior_blocks[i]
        hb = layer(bb, h)
        if between is not None:
            hb = between(i, hb, bb)
        ex = _Exchange(plan, comm, f"shuffle/layer{i + 1}/overlap/fwd")
        token = _Start.apply(hb, ex)
        hi = layer(ib, h[plan.interior_rows])        # computed while the boundary rows travel
        if between is not None:
            hi = between(i, hi, ib)
        halo = _Wait.apply(token, ex)
        h = torch.cat([hb, hi, halo])
    return output(h) if output is not None else h
