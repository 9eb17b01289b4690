"""``Block``, ``ShuffleIndex`` and ``MiniBatch``: what a sampled mini-batch is made of.

A block is a bipartite graph from ``src_nodes`` (the inputs of one GNN layer) to ``dst_nodes`` (its
outputs). ``dst_nodes`` is a prefix of ``src_nodes`` so a layer can read a destination's own input row
at the same local index. Edges are stored as local indices into those two tensors, grouped by
destination in ``dst_nodes`` order. On a rank of split-parallel training a block also carries its
:class:`ShuffleIndex`: pure tensors and counts; the process group is given where the shuffle runs
(:func:`gsplit.shuffle`), never stored here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch


@dataclass(eq=False)  # identity semantics: a plan is one batch's, and gsplit.comm.bind_group keys by it
class ShuffleIndex:
    """The plan of one shuffle: who sends which rows to whom before one layer of split-parallel training.

    Before layer ``l`` a rank holds one row per vertex of its *local frontier* (vertices it owns at
    that level). The layer needs one row per vertex of its block's ``src_nodes`` (the *mixed
    frontier*), some owned by other ranks. Each mixed-frontier vertex is received from its owner
    exactly once, so the forward shuffle is a permutation-with-copies and backward is its transpose.
    The plan holds no process group: :func:`gsplit.shuffle` takes the group at the call.
    """

    send_idx: torch.Tensor
    """int64 rows of the local frontier to send, grouped by destination rank (a row may repeat)."""
    send_counts: List[int]
    """Rows sent to each rank (``len == world_size``)."""
    recv_pos: torch.Tensor
    """int64 position in the block's ``src_nodes`` of each received row, grouped by source rank."""
    recv_counts: List[int]
    """Rows received from each rank."""
    num_local: int
    """Rows of the local frontier (input of the shuffle)."""
    num_mixed: int
    """Rows of the mixed frontier (output of the shuffle) = the block's ``num_src_nodes()``."""
    tag: str = "shuffle"
    """Traffic-counter tag for this shuffle (e.g. ``"shuffle/layer1"``)."""
    num_interior: Optional[int] = None
    """Sampled for overlap (:mod:`gsplit.minibatch.overlap`): the local frontier is ordered interior first, and its
    first ``num_interior`` rows are those no other rank reads (``send_idx`` sends only rows from
    ``num_interior`` on to other ranks); ``None``: the frontier is in id order (a single rank's keeps the mixed
    frontier's order, see ``identity``)."""
    identity: bool = False
    """Every row stays where it is (the local frontier is the mixed frontier, in its order: ``send_idx`` and
    ``recv_pos`` are ``0..n-1`` and nothing crosses ranks), so :func:`gsplit.shuffle` returns its input as it is,
    with no copy and no collective. Set by :meth:`read_directly` and by a single rank's sampling."""

    def to(self, device, non_blocking: bool = False) -> "ShuffleIndex":
        """The plan on ``device``; the plan itself when it is there already (as ``Tensor.to``), so that
        the process group bound to it (:func:`gsplit.comm.bind_group`) stays bound."""
        device = torch.device(device)
        if all(t.device == device or (device.index is None and t.device.type == device.type)
               for t in self.tensors()):
            return self
        return replace(self, send_idx=self.send_idx.to(device, non_blocking=non_blocking),
                       recv_pos=self.recv_pos.to(device, non_blocking=non_blocking))

    def own_rows(self, rank: int) -> Tuple[slice, slice]:
        """``(send, recv)``: the stretches of ``send_idx`` and ``recv_pos`` that ``rank`` sends to itself (python
        ints from the counts; rows are grouped by rank). :func:`gsplit.shuffle` copies them directly instead of
        passing them through the all-to-all.

        Example:
            >>> index = ShuffleIndex(send_idx=torch.tensor([0, 2, 1]), send_counts=[1, 2],
            ...                      recv_pos=torch.tensor([1, 0]), recv_counts=[1, 1], num_local=3, num_mixed=2)
            >>> index.own_rows(1)
            (slice(1, 3, None), slice(1, 2, None))
        """
        s0, r0 = sum(self.send_counts[:rank]), sum(self.recv_counts[:rank])
        return slice(s0, s0 + self.send_counts[rank]), slice(r0, r0 + self.recv_counts[rank])

    def counts_to_others(self, rank: int) -> Tuple[List[int], List[int]]:
        """``(send_counts, recv_counts)`` with ``rank``'s own entries 0: the all-to-all of the rows that leave
        the rank (its own rows, :meth:`own_rows`, are copied directly).

        Example:
            >>> index = ShuffleIndex(send_idx=torch.tensor([0, 2, 1]), send_counts=[1, 2],
            ...                      recv_pos=torch.tensor([1, 0]), recv_counts=[1, 1], num_local=3, num_mixed=2)
            >>> index.counts_to_others(1)
            ([1, 0], [1, 0])
        """
        return ([0 if j == rank else int(c) for j, c in enumerate(self.send_counts)],
                [0 if j == rank else int(c) for j, c in enumerate(self.recv_counts)])

    @classmethod
    def read_directly(cls, num_rows: int, rank: int, world_size: int, device=None,
                      tag: str = "shuffle") -> "ShuffleIndex":
        """The plan of rows this rank reads itself: all ``num_rows`` are its own, in order, and nothing is sent
        or received. Split sampling gives it to the bottom block when the input features are read from a table
        every rank holds (CPU ranks of one host), instead of an id exchange with the rows' owners.

        Example:
            >>> index = ShuffleIndex.read_directly(3, rank=1, world_size=2)
            >>> index.send_counts, index.recv_counts, index.counts_to_others(1)
            ([0, 3], [0, 3], ([0, 0], [0, 0]))
        """
        counts = [num_rows if j == rank else 0 for j in range(world_size)]
        rows = torch.arange(num_rows, device=device)
        return cls(send_idx=rows, send_counts=counts, recv_pos=rows, recv_counts=list(counts), num_local=num_rows,
                   num_mixed=num_rows, tag=tag, identity=True)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the plan (e.g. to mark them as used on a CUDA stream)."""
        yield self.send_idx
        yield self.recv_pos


@dataclass
class Block:
    """One layer of a sampled mini-batch (or of one rank's split of it).

    Example:
        >>> b = Block(src_nodes=torch.tensor([7, 3, 9]), num_dst=1,
        ...           edge_src=torch.tensor([1, 2]), edge_dst=torch.tensor([0, 0]),
        ...           edge_ids=torch.tensor([40, 41]))
        >>> b.dst_nodes.tolist(), b.num_edges()
        ([7], 2)
    """

    src_nodes: torch.Tensor
    """int64 global ids of the layer's inputs (for a split: the rank's *mixed frontier*)."""
    num_dst: int
    """How many of ``src_nodes`` (a prefix) are the layer's outputs."""
    edge_src: torch.Tensor
    """int64 local index into ``src_nodes`` of each edge's source."""
    edge_dst: torch.Tensor
    """int64 local index into ``dst_nodes`` of each edge's destination; non-decreasing."""
    edge_ids: torch.Tensor
    """int64 id of each edge in the full graph (its position in ``Graph.indices``)."""
    layer: int = 0
    """Layer number, 0 = closest to the input features."""
    shuffle_index: Optional["ShuffleIndex"] = None
    """Split parallelism only: how this rank's local rows become this block's ``src_nodes`` rows."""
    global_num_dst: Optional[int] = None
    """Destinations of this layer summed over all ranks: the global mini-batch size on the top block
    (``split_cross_entropy`` divides by it); ``None`` on lower split blocks, which do not need it. In
    full-graph training (:class:`gsplit.FullGraphLoader`) the loss rows over all ranks: the training set."""
    num_loss_rows: Optional[int] = None
    """Destinations of this rank whose labels count in the loss (full-graph training: its training
    vertices; the others are labelled ``-100``); ``None``: all of them."""
    srcdata: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-source-row tensors, e.g. ``srcdata["feat"]`` on the first block."""
    dstdata: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-destination-row tensors, e.g. ``dstdata["label"]`` on the last block."""
    overlap: Optional["OverlapSplit"] = None
    """Split blocks sampled for overlap, every layer but the last: how this layer computes the rows other
    ranks need first and overlaps their shuffle with the rest (:mod:`gsplit.minibatch.overlap`); else ``None``."""
    dst_start: int = 0
    """The destinations are ``src_nodes[dst_start : dst_start + num_dst]``. 0 (a prefix) for every block a
    sampler makes; only the parts of an overlapped layer (:class:`OverlapSplit`) start later, and only
    gsplit's layers (:mod:`gsplit.nn.layers`) read them."""
    pairs: Optional[tuple] = None
    """Link prediction (:mod:`gsplit.link`), on the top block: the mini-batch's ``(pair_graph,
    neg_pair_graph)``, whose pair rows :class:`gsplit.SplitParallel` returns in place of the output rows."""

    @property
    def dst_nodes(self) -> torch.Tensor:
        """int64 global ids of the layer's outputs (a prefix of ``src_nodes``, from ``dst_start``)."""
        return self.src_nodes[self.dst_start: self.dst_start + self.num_dst]

    @property
    def device(self) -> torch.device:
        return self.src_nodes.device

    def num_src_nodes(self) -> int:
        return self.src_nodes.numel()

    def num_dst_nodes(self) -> int:
        return self.num_dst

    def num_edges(self) -> int:
        return self.edge_src.numel()

    def edges(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` local indices of every edge, as in DGL's ``block.edges()``."""
        return self.edge_src, self.edge_dst

    def in_degrees(self) -> torch.Tensor:
        """Number of sampled in-edges of every destination (int64; no host sync, unlike ``torch.bincount`` on CUDA)."""
        return torch.zeros(self.num_dst, dtype=torch.int64, device=self.edge_dst.device).index_add_(
            0, self.edge_dst, torch.ones_like(self.edge_dst))

    def to(self, device, non_blocking: bool = False) -> "Block":
        mv = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        moved = replace(
            self,
            src_nodes=mv(self.src_nodes),
            edge_src=mv(self.edge_src),
            edge_dst=mv(self.edge_dst),
            edge_ids=mv(self.edge_ids),
            shuffle_index=None if self.shuffle_index is None else self.shuffle_index.to(device, non_blocking),
            overlap=None,
            srcdata={k: mv(v) for k, v in self.srcdata.items()},
            dstdata={k: mv(v) for k, v in self.dstdata.items()},
        )
        if self.overlap is not None:  # its parts are views of the moved block's edges, not copies of their own
            moved.overlap = self.overlap.to(device, non_blocking, block=moved)
        return moved

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the block holds, its shuffle index's and data included (one list, kept here)."""
        yield from (self.src_nodes, self.edge_src, self.edge_dst, self.edge_ids)
        yield from self.srcdata.values()
        yield from self.dstdata.values()
        if self.shuffle_index is not None:
            yield from self.shuffle_index.tensors()
        if self.overlap is not None:
            yield from self.overlap.tensors()

    def __repr__(self) -> str:
        split = "" if self.shuffle_index is None else ", split"
        return (f"Block(layer={self.layer}, num_src_nodes={self.num_src_nodes()}, "
                f"num_dst_nodes={self.num_dst}, num_edges={self.num_edges()}{split})")


@dataclass
class OverlapSplit:
    """One layer of a split mini-batch in two parts, boundary rows first (built by :func:`gsplit.minibatch.overlap.plan_overlap`).

    The layer's destinations (this rank's local frontier at the next level) are ordered interior first:
    rows ``[0, num_interior)`` only this rank reads, rows ``[num_interior, num_dst)`` (the *boundary*)
    other ranks read too. Each part is a block over the same sources as the whole one, with its
    destinations (``dst_start``) and their in-edges (an edge range: edges are grouped by destination), so
    both read the same per-source terms, computed once. The boundary part is computed first and sent
    asynchronously; the interior part is computed while the rows travel. The exchange fields below are
    the next block's shuffle plan, cut in the rows that go to other ranks and those that stay.
    """

    interior_block: "Block"
    """The interior destinations with their in-edges (``dst_start`` 0)."""
    boundary_block: "Block"
    """The boundary destinations with their in-edges (``dst_start = num_interior``)."""
    send_idx: torch.Tensor
    """int64 boundary rows (``0`` = first boundary row) sent to other ranks, grouped by destination rank."""
    send_counts: List[int]
    """Rows sent to each rank (0 to this one)."""
    recv_pos: torch.Tensor
    """int64 rows of the next block's sources that come from other ranks, grouped by sender."""
    recv_counts: List[int]
    """Rows received from each rank (0 from this one)."""
    keep_idx: torch.Tensor
    """int64 rows of this layer's output (interior first) the next block reads on this rank."""
    keep_pos: torch.Tensor
    """int64 where they go among the next block's sources."""
    num_mixed: int
    """Sources of the next block (rows of the shuffled output)."""
    interior_pos: Optional[torch.Tensor] = None
    """int64 place among the next block's sources of every interior row, in row order: each interior row is
    read by this rank exactly once (no other rank reads it), so the interior part lands with one
    ``index_copy_`` and its gradient comes back with one ``index_select``. ``None``: derived from ``keep_idx``
    / ``keep_pos`` where used (:func:`gsplit.minibatch.overlap.plan_overlap` fills it)."""
    keep_boundary_idx: Optional[torch.Tensor] = None
    """int64 boundary rows (``0`` = first boundary row) this rank reads too, ascending; ``None`` as above."""
    keep_boundary_pos: Optional[torch.Tensor] = None
    """int64 where they go among the next block's sources; ``None`` as above."""
    send_inverse: Optional[torch.Tensor] = None
    """When every boundary row is sent exactly once (two ranks): the position in ``send_idx`` of each boundary
    row, so that the returning gradients are gathered (``index_select``) instead of accumulated; ``None``
    where a row goes to several ranks (or not computed)."""
    keep_boundary_send: Optional[torch.Tensor] = None
    """``send_inverse[keep_boundary_idx]``: where the boundary rows this rank reads too sit when the boundary rows
    are computed in send order (:mod:`gsplit.minibatch.overlap` does so where ``send_inverse`` is set); ``None`` with it."""

    @property
    def num_interior(self) -> int:
        return self.interior_block.num_dst

    def to(self, device, non_blocking: bool = False, block: Optional["Block"] = None) -> "OverlapSplit":
        """The split on ``device``; given ``block`` (the whole block, already there) its parts are views of it."""
        mv = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        if block is not None:
            interior, boundary = split_destinations(block, self.num_interior, self.interior_block.num_edges())
        else:
            interior, boundary = self.interior_block.to(device, non_blocking), self.boundary_block.to(device, non_blocking)
        mv_opt = lambda t: None if t is None else mv(t)  # noqa: E731
        return replace(self, interior_block=interior, boundary_block=boundary,
                       send_idx=mv(self.send_idx), recv_pos=mv(self.recv_pos),
                       keep_idx=mv(self.keep_idx), keep_pos=mv(self.keep_pos),
                       interior_pos=mv_opt(self.interior_pos), keep_boundary_idx=mv_opt(self.keep_boundary_idx),
                       keep_boundary_pos=mv_opt(self.keep_boundary_pos), send_inverse=mv_opt(self.send_inverse),
                       keep_boundary_send=mv_opt(self.keep_boundary_send))

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the split (its two blocks' included)."""
        yield from self.interior_block.tensors()
        yield from self.boundary_block.tensors()
        yield from (self.send_idx, self.recv_pos, self.keep_idx, self.keep_pos)
        yield from (t for t in (self.interior_pos, self.keep_boundary_idx, self.keep_boundary_pos, self.send_inverse,
                                self.keep_boundary_send) if t is not None)


def without_stretch(t: torch.Tensor, stretch: slice) -> torch.Tensor:
    """``t`` without ``t[stretch]`` (e.g. a plan's rows but this rank's own, :meth:`ShuffleIndex.own_rows`): a
    view where the stretch is at one end, as with two ranks, else one concatenation of the two sides.

    Example:
        >>> without_stretch(torch.tensor([5, 6, 7, 8]), slice(1, 3)).tolist()
        [5, 8]
    """
    if stretch.start == 0:
        return t[stretch.stop:]
    if stretch.stop == t.numel():
        return t[:stretch.start]
    return torch.cat([t[:stretch.start], t[stretch.stop:]])


def split_destinations(block: Block, num_first: int, num_first_edges: int) -> Tuple[Block, Block]:
    """``block`` as two blocks over the same sources: its first ``num_first`` destinations with their
    ``num_first_edges`` in-edges (an edge prefix, as edges are grouped by destination), and the others
    (``dst_start = num_first``). Views of ``block``'s tensors (but the second part's ``edge_dst``, shifted):
    nothing is read from a device.

    Example:
        >>> b = Block(src_nodes=torch.tensor([7, 3, 9]), num_dst=2, edge_src=torch.tensor([1, 2, 0]),
        ...           edge_dst=torch.tensor([0, 0, 1]), edge_ids=torch.tensor([40, 41, 42]))
        >>> first, rest = split_destinations(b, 1, 2)
        >>> first.dst_nodes.tolist(), rest.dst_nodes.tolist(), rest.edge_dst.tolist()
        ([7], [3], [0])
    """
    n, e = int(num_first), int(num_first_edges)
    first = Block(src_nodes=block.src_nodes, num_dst=n, dst_start=block.dst_start, edge_src=block.edge_src[:e],
                  edge_dst=block.edge_dst[:e], edge_ids=block.edge_ids[:e], layer=block.layer)
    rest = Block(src_nodes=block.src_nodes, num_dst=block.num_dst - n, dst_start=block.dst_start + n,
                 edge_src=block.edge_src[e:], edge_dst=block.edge_dst[e:] - n, edge_ids=block.edge_ids[e:],
                 layer=block.layer)
    return first, rest


class MiniBatch(NamedTuple):
    """A sampled mini-batch (or one rank's split of one): what every sampler and loader produces.

    A named tuple, so it unpacks and indexes like DGL's ``(input_nodes, output_nodes, blocks)``.

    Example:
        >>> b = Block(src_nodes=torch.tensor([7, 3]), num_dst=1, edge_src=torch.tensor([1]),
        ...           edge_dst=torch.tensor([0]), edge_ids=torch.tensor([5]))
        >>> input_nodes, output_nodes, blocks = MiniBatch(b.src_nodes, b.dst_nodes, [b])
        >>> input_nodes.tolist(), output_nodes.tolist(), len(blocks)
        ([7, 3], [7], 1)
    """

    input_nodes: torch.Tensor
    """int64 global ids whose input features this rank loads: ``blocks[0].src_nodes`` for a whole
    mini-batch, the rank's bottom *local frontier* for a split (disjoint across ranks), or, for a split whose
    ranks read their inputs directly (``DataLoader(input_features="direct")``), ``blocks[0].src_nodes``."""
    output_nodes: torch.Tensor
    """int64 global ids of the targets (a split's: the rank's local targets), ``blocks[-1].dst_nodes``."""
    blocks: List[Block]
    """One block per layer, index 0 = the input layer."""

    # PyG's NeighborLoader habits: a PyG user's batch.batch_size / batch.x / batch.y answer with the
    # gsplit equivalent (rows are this rank's), other PyG attributes raise an error that names it.
    @property
    def batch_size(self) -> int:
        """Targets of this batch (this rank's on a split), as PyG's ``batch.batch_size``: the model's output
        has exactly these rows, so PyG's ``out[:batch.batch_size]`` keeps all of them."""
        return int(self.output_nodes.numel())

    @property
    def x(self) -> torch.Tensor:
        """``blocks[0].srcdata["feat"]``: input features of the first layer's sources (PyG's ``batch.x``)."""
        return self._block_data(self.blocks[0].srcdata, "feat", "x", 'blocks[0].srcdata["feat"]')

    @property
    def y(self) -> torch.Tensor:
        """``blocks[-1].dstdata["label"]``: labels of the targets only (PyG's ``batch.y[:batch.batch_size]``)."""
        return self._block_data(self.blocks[-1].dstdata, "label", "y", 'blocks[-1].dstdata["label"]')

    def _block_data(self, data, key: str, pyg_name: str, where: str) -> torch.Tensor:
        if key not in data:
            # AttributeError from a property would be replaced by __getattr__'s; this message is the useful one
            raise KeyError(f"MiniBatch.{pyg_name} (PyG's batch.{pyg_name}) is {where}, but this batch has no {key!r} "
                           f"there (it has {sorted(data)}); give the loader features= / labels=")
        return data[key]

    def __getattr__(self, name: str):
        hint = _PYG_ATTRIBUTES.get(name)
        if hint is None:
            raise AttributeError(f"'MiniBatch' object has no attribute {name!r}")
        raise AttributeError(f"MiniBatch has no {name!r} (a PyG NeighborLoader batch attribute); in gsplit: {hint}")

    def to(self, device, non_blocking: bool = False) -> "MiniBatch":
        return MiniBatch(self.input_nodes.to(device, non_blocking=non_blocking),
                         self.output_nodes.to(device, non_blocking=non_blocking),
                         [b.to(device, non_blocking) for b in self.blocks])

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the mini-batch."""
        yield self.input_nodes
        yield self.output_nodes
        for b in self.blocks:
            yield from b.tensors()


_PYG_ATTRIBUTES = {
    "n_id": "output_nodes are the targets (PyG's n_id[:batch_size]), blocks[0].src_nodes every vertex the first "
            "layer reads (on a split: this rank's mixed frontier), input_nodes the vertices whose features this "
            "rank loaded",
    "edge_index": "a batch has one block per layer instead of one edge_index: run PyG layers on them with "
                  "gsplit.interop.pyg.BlockConv(conv)(block, h), or get a layer's ((h_src, h_dst), edge_index, size) "
                  "from gsplit.interop.pyg.block_inputs(block, h)",
    "e_id": "blocks[i].edge_ids (ids of each layer's edges in the full graph)",
    "input_id": "output_nodes (the targets)",
    "num_sampled_nodes": "[b.num_src_nodes() for b in blocks] and [b.num_dst_nodes() for b in blocks]",
    "num_sampled_edges": "[b.num_edges() for b in blocks]",
    "num_nodes": "blocks[0].num_src_nodes() (vertices the first layer reads)",
}
"""PyG ``NeighborLoader`` batch attributes -> what a gsplit :class:`MiniBatch` offers instead."""
