"""``PartitionMap``: which GPU (part) owns each vertex, tied to the graph it was made for."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch

from gsplit.data.graph import Graph, check_id_range
from gsplit.runtime.io import load_npy, read_meta, write_array_dir

log = logging.getLogger(__name__)

_FORMAT = "gsplit-partition-map"
_FORMAT_VERSION = 2
# version 2: ``batch_size`` is targets per rank (version 1 stored the global mini-batch, all ranks together)


def _small_int_dtype(num_parts: int) -> torch.dtype:
    """The narrowest signed integer type that holds part ids ``0..num_parts-1``."""
    if num_parts <= 127:
        return torch.int8
    if num_parts <= 32767:
        return torch.int16
    return torch.int32


@dataclass
class PartitionMap:
    """The owning part (GPU rank) of every vertex of one graph.

    Build one with :func:`gsplit.partition`, or from your own tensor with :meth:`from_tensor`.

    Example:
        >>> pm = PartitionMap.from_tensor(torch.tensor([0, 1, 1, 0]), num_parts=2)
        >>> pm.owner(torch.tensor([2, 3])).tolist(), pm.part_sizes().tolist()
        ([1, 0], [2, 2])
    """

    assignment: torch.Tensor
    """Part of every vertex, ``[num_nodes]``, stored as the smallest signed int type that fits (int8 up to 127 parts)."""
    num_parts: int
    """Number of parts; must equal the training world size."""
    method: str = "custom"
    """Strategy that made the map (``gsplit``, ``node``, ``edge``, ``random`` or ``custom``)."""
    graph_fingerprint: Optional[str] = None
    """``Graph.fingerprint()`` of the graph the map is for; None when unknown (then only sizes are checked)."""
    num_nodes: Optional[int] = None
    """Vertices of that graph; defaults to ``assignment``'s length."""
    fanouts: Optional[List[int]] = None
    """Fanouts of the sampler used for pre-sampling, if any."""
    batch_size: Optional[int] = None
    """Targets *per rank* per iteration the map was pre-sampled / tuned for (the loaders' ``batch_size``;
    the global mini-batch is ``batch_size * num_parts``)."""
    metadata: Dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable details (seed, METIS edge cut, time taken, ...)."""

    def __post_init__(self):
        a = torch.as_tensor(self.assignment)
        if a.dim() != 1:
            raise ValueError(f"assignment must be one-dimensional (one part per vertex), got shape {tuple(a.shape)}")
        if a.dtype.is_floating_point or a.dtype == torch.bool or a.is_complex():
            raise TypeError(f"assignment must hold integer part ids, got {a.dtype}")
        self.num_parts = int(self.num_parts)
        if self.num_parts < 1:
            raise ValueError(f"num_parts={self.num_parts}; a partition map needs at least one part")
        if a.numel():
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= self.num_parts:
                bad = lo if lo < 0 else hi
                raise ValueError(f"assignment holds part id {bad} outside [0, {self.num_parts}); "
                                 f"part ids must be 0..{self.num_parts - 1}")
        if self.num_nodes is None:
            self.num_nodes = a.numel()
        elif int(self.num_nodes) != a.numel():
            raise ValueError(f"num_nodes={self.num_nodes} but assignment has {a.numel()} entries; they must agree")
        self.num_nodes = int(self.num_nodes)
        self.assignment = a.to(_small_int_dtype(self.num_parts)).contiguous()
        if self.fanouts is not None:
            self.fanouts = [int(f) for f in self.fanouts]
        if self.batch_size is not None:
            self.batch_size = int(self.batch_size)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tensor(cls, assignment, num_parts: int, graph: Optional[Graph] = None,
                    method: str = "custom") -> "PartitionMap":
        """Wrap a user-made assignment (any integer sequence), checking ids are in ``[0, num_parts)``.

        With ``graph`` the map is tied to that graph (its length must match and its fingerprint is kept).
        """
        a = torch.as_tensor(np.asarray(assignment) if not isinstance(assignment, torch.Tensor) else assignment)
        if graph is not None and a.numel() != graph.num_nodes:
            raise ValueError(f"assignment has {a.numel()} entries but the graph has {graph.num_nodes} vertices; "
                             "pass one part id per vertex")
        pm = cls(assignment=a, num_parts=num_parts, method=method,
                 graph_fingerprint=None if graph is None else graph.fingerprint(),
                 num_nodes=None if graph is None else graph.num_nodes)
        sizes = pm.part_sizes()
        if bool((sizes == 0).any()):
            log.warning("partition map leaves parts %s empty; those ranks will own no vertices",
                        (sizes == 0).nonzero().squeeze(1).tolist())
        return pm

    # ------------------------------------------------------------------ queries
    def owner(self, ids: torch.Tensor, check: bool = True) -> torch.Tensor:
        """Owning part of each vertex in ``ids``, as int64 on ``ids``'s device.

        ``check=False`` skips the id range check (two passes over ``ids``) on hot paths whose ids are known valid.
        """
        ids = torch.as_tensor(ids)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"vertex ids must be an integer tensor, got {ids.dtype}")
        if check:
            check_id_range(ids, self.num_nodes, "vertex ids", holder="the partition map")
        a = self.assignment if self.assignment.device == ids.device else self.assignment.to(ids.device)
        return a[ids.to(torch.int64)].to(torch.int64)

    def part_sizes(self) -> torch.Tensor:
        """Number of vertices in each part, int64 ``[num_parts]``."""
        return torch.bincount(self.assignment.to(torch.int64), minlength=self.num_parts).cpu()

    def to(self, device) -> "PartitionMap":
        """A copy whose ``assignment`` lives on ``device`` (for lookups next to GPU-resident ids)."""
        return PartitionMap(self.assignment.to(device), self.num_parts, self.method, self.graph_fingerprint,
                            self.num_nodes, self.fanouts, self.batch_size, dict(self.metadata))

    # ------------------------------------------------------------------ checks
    def check_graph(self, graph: Graph) -> None:
        """Raise ``ValueError`` if this map was made for a different graph (vertex count, then fingerprint)."""
        if graph.num_nodes != self.num_nodes or (
                self.graph_fingerprint is not None and graph.fingerprint() != self.graph_fingerprint):
            raise ValueError(
                f"partition map was made for a graph with {self.num_nodes} nodes / fingerprint "
                f"{self.graph_fingerprint}, this graph has {graph.num_nodes} nodes / fingerprint {graph.fingerprint()}; "
                "run `gsplit prepare` again for this graph")

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ValueError`` unless the map has exactly ``world_size`` parts."""
        if int(world_size) != self.num_parts:
            raise ValueError(f"partition map has {self.num_parts} parts but the world size is {world_size}; "
                             f"run `gsplit prepare` with --num-parts {world_size} (one part per GPU)")

    # ------------------------------------------------------------------ persistence
    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write folder ``path``: ``assignment.npy``, then ``meta.json`` last (each atomically).

        A folder whose ``meta.json`` is missing is an interrupted write, which :meth:`load` reports.
        """
        meta = {"format": _FORMAT, "version": _FORMAT_VERSION, "num_parts": self.num_parts, "method": self.method,
                "graph_fingerprint": self.graph_fingerprint, "num_nodes": self.num_nodes, "fanouts": self.fanouts,
                "batch_size": self.batch_size, "metadata": self.metadata}
        write_array_dir(path, {"assignment.npy": self.assignment.cpu().numpy()}, meta, default=_json_default)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "PartitionMap":
        """Read a folder written by :meth:`save`, checking it: metadata keys, dtype, length, part ids.

        Any problem is a one-line ``ValueError`` naming the file and what to do; a path without a map
        is a ``FileNotFoundError``.

        Example:
            >>> import tempfile
            >>> d = tempfile.mkdtemp()
            >>> PartitionMap.from_tensor(torch.tensor([0, 1, 1]), num_parts=2).save(d)
            >>> PartitionMap.load(d).num_parts
            2
        """
        p = Path(path)
        fix = "make the map again with `gsplit prepare` (or PartitionMap.save)"
        meta = read_meta(p, ["format", "num_parts", "num_nodes"], "partition map", fix)
        if meta["format"] != _FORMAT:
            raise ValueError(f"{p / 'meta.json'} has format {meta['format']!r}, expected {_FORMAT!r}; {fix}")
        if int(meta.get("version", 0)) > _FORMAT_VERSION:
            raise ValueError(f"{p} was written by a newer gsplit (format version {meta['version']} > "
                             f"{_FORMAT_VERSION}); upgrade gsplit to read it")
        parts, n = meta["num_parts"], meta["num_nodes"]
        if not (isinstance(parts, int) and parts >= 1 and isinstance(n, int) and n >= 0):
            raise ValueError(f"{p / 'meta.json'}: num_parts={parts!r} must be an integer >= 1 and "
                             f"num_nodes={n!r} an integer >= 0; {fix}")
        a = load_npy(p / "assignment.npy", fix, kind="iu", ndim=1, length=n)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= parts):
            bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
            raise ValueError(f"{p / 'assignment.npy'} holds part id {bad} but {p / 'meta.json'} says "
                             f"num_parts={parts}; the folder mixes two maps or is corrupt; {fix}")
        fanouts, batch_size = meta.get("fanouts"), meta.get("batch_size")
        if fanouts is not None and not (isinstance(fanouts, list) and all(type(f) is int for f in fanouts)):
            raise ValueError(f"{p / 'meta.json'}: fanouts={fanouts!r} must be a list of integers (or null); {fix}")
        if batch_size is not None and not (type(batch_size) is int and batch_size >= 1):
            raise ValueError(f"{p / 'meta.json'}: batch_size={batch_size!r} must be a positive integer (or null); {fix}")
        if batch_size is not None and int(meta.get("version", 1)) < 2:
            batch_size = int(batch_size) // parts  # version 1 stored the global mini-batch
        return cls(assignment=torch.from_numpy(a.astype(np.int64, copy=False)), num_parts=parts,
                   method=meta.get("method", "custom"), graph_fingerprint=meta.get("graph_fingerprint"),
                   num_nodes=n, fanouts=meta.get("fanouts"), batch_size=batch_size,
                   metadata=meta.get("metadata", {}))

    def __repr__(self) -> str:
        return (f"PartitionMap(num_parts={self.num_parts}, method={self.method!r}, num_nodes={self.num_nodes}, "
                f"part_sizes={self.part_sizes().tolist()})")


def owner_tensor(partition, graph: Graph, world_size: int) -> torch.Tensor:
    """The owning rank of every vertex, from a :class:`PartitionMap` or a tensor of owners, checked
    against the graph and the world size by the map's own checks (one rule: one part per rank); ``None``
    is allowed at world size 1 only. Every consumer of a partition (loaders, inference) calls this.

    The result is the map's narrow integer type (int8 up to 127 ranks, see :attr:`PartitionMap.assignment`),
    not int64: at 111M vertices that is 111 MB instead of 888 MB on every GPU. A tensor that already has
    that type comes back as it is (same storage, on its device), so loaders handed one device owner array
    share it. A bare tensor is checked by length and part ids only: it carries no fingerprint of another
    graph, and hashing the graph for it would read all of it (from a GPU: a copy to the host).

    Example:
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0])
        >>> owner_tensor(torch.tensor([0, 1, 1]), g, world_size=2).tolist()
        [0, 1, 1]
        >>> owner_tensor(None, g, world_size=1).dtype
        torch.int8
    """
    if partition is None:
        if world_size > 1:
            raise ValueError(f"world size is {world_size} but no partition map was given; pass "
                             "partition=gsplit.partition(graph, num_parts=world_size, ...) or a saved PartitionMap")
        return torch.zeros(graph.num_nodes, dtype=_small_int_dtype(1))
    if isinstance(partition, torch.Tensor):
        # A bare tensor may leave the last ranks empty (a "starved" map), so it gets world_size parts.
        if partition.dim() == 1 and partition.numel() != graph.num_nodes:
            raise ValueError(f"assignment has {partition.numel()} entries but the graph has {graph.num_nodes} "
                             "vertices; pass one part id per vertex")
        partition = PartitionMap(assignment=partition, num_parts=world_size, num_nodes=graph.num_nodes)
    partition.check_graph(graph)
    partition.check_world_size(world_size)
    return partition.assignment


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    raise TypeError(f"metadata value {x!r} of type {type(x).__name__} is not JSON-serialisable")
