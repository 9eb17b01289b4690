"""``Block``: one sampled GNN layer with DGL block semantics.

A block is a bipartite graph from ``src_nodes`` (the inputs of one GNN layer) to ``dst_nodes`` (its
outputs). ``dst_nodes`` is a prefix of ``src_nodes`` so a layer can read a destination's own input row
at the same local index. Edges are stored as local indices into those two tensors, grouped by
destination in ``dst_nodes`` order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import torch

if TYPE_CHECKING:  # pragma: no cover
    from gsplit.split.shuffle_index import ShuffleIndex


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
    (``split_cross_entropy`` divides by it); ``None`` on lower split blocks, which do not need it."""
    srcdata: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-source-row tensors, e.g. ``srcdata["feat"]`` on the first block."""
    dstdata: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-destination-row tensors, e.g. ``dstdata["label"]`` on the last block."""

    @property
    def dst_nodes(self) -> torch.Tensor:
        """int64 global ids of the layer's outputs (a prefix of ``src_nodes``)."""
        return self.src_nodes[: self.num_dst]

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
        """Number of sampled in-edges of every destination."""
        return torch.bincount(self.edge_dst, minlength=self.num_dst)

    def to(self, device, non_blocking: bool = False) -> "Block":
        mv = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(
            self,
            src_nodes=mv(self.src_nodes),
            edge_src=mv(self.edge_src),
            edge_dst=mv(self.edge_dst),
            edge_ids=mv(self.edge_ids),
            shuffle_index=None if self.shuffle_index is None else self.shuffle_index.to(device),
            srcdata={k: mv(v) for k, v in self.srcdata.items()},
            dstdata={k: mv(v) for k, v in self.dstdata.items()},
        )

    def __repr__(self) -> str:
        split = "" if self.shuffle_index is None else ", split"
        return (f"Block(layer={self.layer}, num_src_nodes={self.num_src_nodes()}, "
                f"num_dst_nodes={self.num_dst}, num_edges={self.num_edges()}{split})")
