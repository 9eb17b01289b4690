"""The graph: CSC in-edges, built from edge lists or scipy matrices, saved as memory-mappable ``.npy``.

A :class:`Graph` stores, for every destination vertex ``v``, the sources of its in-edges in
``indices[indptr[v]:indptr[v + 1]]``. Sampling walks in-edges (messages flow src -> dst), so CSC is the
layout every other part reads. The position of an edge in ``indices`` is its edge id.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from gsplit.data.ids import id_range_error  # noqa: F401 - part of the graph's checks, importable here too
from gsplit.runtime.io import load_npy, read_meta, write_array_dir

log = logging.getLogger(__name__)

_FORMAT = "gsplit-graph"
_FORMAT_VERSION = 1


def _as_int64_tensor(x, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got numpy dtype {x.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must hold integers, got torch dtype {x.dtype}")
        t = x
    else:
        t = torch.as_tensor(np.asarray(x, dtype=np.int64))
    if t.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(t.shape)}")
    return t.to(torch.int64).contiguous()


def check_id_range(ids: torch.Tensor, num_nodes: int, what: str = "vertex ids", holder: str = "the graph") -> None:
    """Raise :func:`id_range_error` for the first bad extreme of ``ids`` (no-op for an empty tensor)."""
    if ids.numel() == 0:
        return
    lo, hi = (int(x) for x in torch.aminmax(ids))
    if lo < 0 or hi >= num_nodes:
        raise id_range_error(what, lo if lo < 0 else hi, num_nodes, holder)


def as_vertex_ids(ids, num_nodes: int, what: str = "vertex ids", *, unique: bool = False) -> torch.Tensor:
    """``ids`` as a 1-D int64 tensor of valid vertex ids: the one check every entry point uses.

    A boolean mask with one entry per vertex (e.g. PyG's ``train_mask``) becomes the ids it marks.
    Non-integer values are an error, never truncated; ids must lie in ``[0, num_nodes)``; with
    ``unique=True`` a repeated id is an error too.

    Example:
        >>> as_vertex_ids(torch.tensor([False, True, True]), 3, "train_idx").tolist()
        [1, 2]
        >>> as_vertex_ids([1.5, 2.7], 3, "train_idx")
        Traceback (most recent call last):
        ...
        TypeError: train_idx must hold integer vertex ids (or be a boolean mask), got torch.float64 values such as 1.5
    """
    t = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(np.asarray(ids))
    if t.dtype == torch.bool:
        if t.dim() != 1 or t.numel() != num_nodes:
            raise ValueError(f"{what} is a boolean mask of shape {tuple(t.shape)} but the graph has {num_nodes} "
                             "vertices; pass a mask with one entry per vertex or a tensor of ids")
        return t.nonzero().squeeze(1).to(torch.int64)
    if t.dtype.is_floating_point or t.is_complex():
        example = t.flatten()[:1].tolist()
        raise TypeError(f"{what} must hold integer vertex ids (or be a boolean mask), got {t.dtype} values"
                        + (f" such as {example[0]}" if example else ""))
    if t.dim() != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {tuple(t.shape)}")
    t = t.to(torch.int64)
    check_id_range(t, num_nodes, what)
    if unique and torch.unique(t).numel() != t.numel():
        raise ValueError(f"{what} contain repeated vertex ids; pass each vertex once")
    return t


_CHUNK = 1 << 22  # entries per pass of the chunked checks: bounded temporaries on billion-entry arrays


def _check_loaded_indptr(folder: Path, g: "Graph", fix: str) -> None:
    """``indptr`` runs from 0 to the edge count without decreasing (one pass over ``num_nodes + 1`` entries,
    in chunks), with a message naming the file: cheap enough for every load."""
    ptr, idx = folder / "indptr.npy", folder / "indices.npy"
    first, last = int(g.indptr[0]), int(g.indptr[-1])
    if first != 0 or last != g.indices.numel():
        raise ValueError(f"{ptr} runs from {first} to {last} but must run from 0 to the {g.indices.numel()} entries "
                         f"of {idx.name}; {fix}")
    for start in range(0, g.indptr.numel() - 1, _CHUNK):
        seg = g.indptr[start:start + _CHUNK + 1]
        drops = (seg[1:] < seg[:-1]).nonzero()
        if drops.numel():
            v = start + int(drops[0, 0])
            raise ValueError(f"{ptr} is not non-decreasing: entry {v + 1} ({int(g.indptr[v + 1])}) < entry {v} "
                             f"({int(g.indptr[v])}); {fix}")


def _check_loaded_ids(folder: Path, g: "Graph", fix: str) -> None:
    """Every id of ``indices`` is a vertex (one chunked pass over all edges), with a message naming the file."""
    idx = folder / "indices.npy"
    for start in range(0, g.indices.numel(), _CHUNK):
        seg = g.indices[start:start + _CHUNK]
        lo, hi = (int(x) for x in torch.aminmax(seg))
        if lo < 0 or hi >= g.num_nodes:
            bad = lo if lo < 0 else hi
            pos = start + int((seg == bad).nonzero()[0, 0])
            raise ValueError(f"{idx} holds vertex id {bad} outside [0, {g.num_nodes}) at entry {pos} (the graph has "
                             f"{g.num_nodes} vertices); {fix}")


@dataclass(frozen=True)
class Graph:
    """A directed graph in CSC form (in-edges grouped by destination).

    Example:
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
        >>> g.num_nodes, g.num_edges
        (3, 6)
        >>> g.in_neighbors(0).tolist()
        [1, 2]
    """

    indptr: torch.Tensor
    """int64 ``[num_nodes + 1]``: in-edges of ``v`` are ``indices[indptr[v]:indptr[v+1]]``."""
    indices: torch.Tensor
    """int64 ``[num_edges]``: source vertex of each in-edge; the position is the edge id."""

    def __post_init__(self):
        if self.indptr.dtype != torch.int64 or self.indices.dtype != torch.int64:
            raise TypeError(
                f"Graph needs int64 indptr and indices, got {self.indptr.dtype} and {self.indices.dtype}; "
                "build graphs with Graph.from_edges / Graph.from_csc"
            )

    # ------------------------------------------------------------------ constructors
    @staticmethod
    def from_csc(indptr, indices, validate: bool = True) -> "Graph":
        """Wrap existing CSC arrays; checks shapes, monotonicity and id ranges unless ``validate=False``."""
        indptr = _as_int64_tensor(indptr, "indptr")
        indices = _as_int64_tensor(indices, "indices")
        g = Graph(indptr, indices)
        if validate:
            g.validate()
        return g

    @staticmethod
    def from_edges(
        src,
        dst,
        num_nodes: Optional[int] = None,
        *,
        symmetric: bool = False,
        remove_duplicates: bool = False,
        remove_self_loops: bool = False,
    ) -> "Graph":
        """Build a graph from edge lists ``src[i] -> dst[i]``.

        Args:
            src, dst: integer sequences of equal length, ids in ``[0, num_nodes)``.
            num_nodes: number of vertices; defaults to ``max id + 1``.
            symmetric: add the reverse of every edge (for undirected data).
            remove_duplicates: keep one copy of repeated ``(src, dst)`` pairs.
            remove_self_loops: drop edges ``v -> v``.

        Example:
            >>> Graph.from_edges([0, 0, 1], [1, 1, 1], remove_duplicates=True).num_edges
            2
        """
        src = _as_int64_tensor(src, "src")
        dst = _as_int64_tensor(dst, "dst")
        if src.numel() != dst.numel():
            raise ValueError(f"src has {src.numel()} entries but dst has {dst.numel()}; pass one of each per edge")
        max_id = int(torch.maximum(src.max(), dst.max())) if src.numel() else -1
        min_id = int(torch.minimum(src.min(), dst.min())) if src.numel() else 0
        if min_id < 0:
            raise ValueError(f"edge lists contain negative vertex id {min_id}; ids must be in [0, num_nodes)")
        if num_nodes is None:
            num_nodes = max_id + 1
        if num_nodes <= 0:
            raise ValueError(f"a graph needs at least one vertex, got num_nodes={num_nodes}")
        if max_id >= num_nodes:
            raise ValueError(
                f"edge lists contain vertex id {max_id} but num_nodes={num_nodes}; "
                "ids must be in [0, num_nodes), pass a larger num_nodes or remap the ids"
            )
        if remove_self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
        if symmetric:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
        # Sort by (dst, src): CSC grouping, with sources ordered inside each row so that the graph (and
        # hence sampling) does not depend on the order the edges were given in.
        key = dst * num_nodes + src
        key, _ = torch.sort(key)
        if remove_duplicates or symmetric:
            # symmetric input that already held both directions would otherwise get doubled edges
            key = torch.unique_consecutive(key)
        dst_s = key // num_nodes
        src_s = key - dst_s * num_nodes
        counts = torch.bincount(dst_s, minlength=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        return Graph(indptr, src_s.contiguous())

    @staticmethod
    def from_scipy(mat, *, symmetric: bool = False, remove_self_loops: bool = False) -> "Graph":
        """Build from a scipy sparse adjacency matrix where ``mat[i, j] != 0`` means an edge ``i -> j``.

        Stored values are ignored (the graph is unweighted); duplicates are summed by scipy first.
        """
        import scipy.sparse as sp

        if not sp.issparse(mat):
            raise TypeError(f"from_scipy expects a scipy sparse matrix, got {type(mat).__name__}")
        n0, n1 = mat.shape
        if n0 != n1:
            raise ValueError(f"adjacency matrix must be square, got shape {mat.shape}")
        coo = mat.tocoo()
        return Graph.from_edges(
            coo.row.astype(np.int64),
            coo.col.astype(np.int64),
            num_nodes=n0,
            symmetric=symmetric,
            remove_duplicates=True,
            remove_self_loops=remove_self_loops,
        )

    # ------------------------------------------------------------------ properties
    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def in_degrees(self, nodes: Optional[torch.Tensor] = None) -> torch.Tensor:
        """In-degree of every vertex (or of ``nodes``), int64."""
        if nodes is None:
            return self.indptr[1:] - self.indptr[:-1]
        return self.indptr[nodes + 1] - self.indptr[nodes]

    def in_neighbors(self, v: int) -> torch.Tensor:
        return self.indices[self.indptr[v] : self.indptr[v + 1]]

    def edge_dst(self) -> torch.Tensor:
        """Destination of every edge, aligned with ``indices`` (materialises ``num_edges`` int64s)."""
        return torch.repeat_interleave(torch.arange(self.num_nodes, device=self.device), self.in_degrees())

    def to_scipy(self):
        """The adjacency as ``scipy.sparse.csc_matrix`` with ``A[src, dst] = 1``."""
        import scipy.sparse as sp

        n = self.num_nodes
        data = np.ones(self.num_edges, dtype=np.float32)
        return sp.csc_matrix((data, self.indices.cpu().numpy(), self.indptr.cpu().numpy()), shape=(n, n))

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ``ValueError`` if the arrays do not form a valid CSC graph."""
        if self.indptr.numel() < 2:
            raise ValueError("a graph needs at least one vertex: indptr must have num_nodes + 1 >= 2 entries")
        if int(self.indptr[0]) != 0:
            raise ValueError(f"indptr[0] must be 0, got {int(self.indptr[0])}")
        if int(self.indptr[-1]) != self.indices.numel():
            raise ValueError(
                f"indptr[-1]={int(self.indptr[-1])} but indices has {self.indices.numel()} entries; they must agree"
            )
        if self.indptr.numel() > 1 and bool((self.indptr[1:] < self.indptr[:-1]).any()):
            raise ValueError("indptr must be non-decreasing")
        check_id_range(self.indices, self.num_nodes, "indices")

    def check_ids(self, ids: torch.Tensor, what: str = "vertex ids") -> None:
        """Raise ``ValueError`` naming the first bad value if any id is outside ``[0, num_nodes)``."""
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"{what} must be an integer tensor, got {ids.dtype}")
        check_id_range(ids, self.num_nodes, what)

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """A short content hash of the structure; a ``PartitionMap`` uses it to refuse another graph.

        Computed once per ``Graph`` object (hashing a billion-edge graph takes seconds and every loader
        checks it); a ``Graph`` is not modified in place, any change makes a new object.
        """
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = self._hash_structure()
            self.__dict__["_fingerprint"] = cached  # frozen dataclass: bypass __setattr__ for the cache
        return cached

    def _hash_structure(self) -> str:
        h = hashlib.blake2b(digest_size=12)
        h.update(np.int64(self.num_nodes).tobytes())
        h.update(np.int64(self.num_edges).tobytes())
        h.update(memoryview(self.indptr.cpu().numpy()).cast("B"))
        h.update(memoryview(self.indices.cpu().numpy()).cast("B"))
        return h.hexdigest()

    # ------------------------------------------------------------------ devices
    def to(self, device: Union[str, torch.device]) -> "Graph":
        """The graph on ``device``, keeping the fingerprint already computed: the structure is the same, and
        hashing a device graph would copy all of it back to the host (26 GB at Papers100M scale).

        Example:
            >>> g = Graph.from_edges([0, 1], [1, 0])
            >>> g.to("cpu").fingerprint() == g.fingerprint()
            True
        """
        return self._same_structure(self.indptr.to(device), self.indices.to(device))

    def _same_structure(self, indptr: torch.Tensor, indices: torch.Tensor) -> "Graph":
        """A graph over ``indptr`` and ``indices`` (this graph's arrays elsewhere), keeping the fingerprint."""
        other = Graph(indptr, indices)
        cached = self.__dict__.get("_fingerprint")
        if cached is not None:
            other.__dict__["_fingerprint"] = cached
        return other

    def pin_memory(self) -> "Graph":
        """The graph with its host arrays readable by GPU kernels over UVA (page-locked), or ``self`` unpinned.

        Each array goes through :func:`gsplit.ops.pinning.make_host_readable`: registered where it is
        (``cudaHostRegister``, mapped) when it lives in anonymous or shared memory, so nothing is copied: ranks
        started by :func:`gsplit.launch` receive the graph in shared memory and every rank of a host registers
        the same pages (the graph is held once per host); else (a memory-mapped graph, ``Graph.load(mmap=True)``,
        or a registration that is slow or refused) a pinned copy of exactly its size when the host has the
        memory, and the result is a new graph over the copies (one per rank). Needs CUDA and CuPy; without
        them, or when an array can be neither, the graph is returned unpinned, with a log line, and is sampled
        where it is (:func:`gsplit.ops.sampling_device`).
        """
        if not torch.cuda.is_available():
            log.info("pin_memory: CUDA is not available; returning the graph unchanged")
            return self
        if self.device.type != "cpu":
            raise ValueError(f"pin_memory pins a host graph, but this graph is on {self.device}; "
                             "call it on the host graph (or keep the graph on the GPU)")
        from gsplit.ops import cuda as cuda_kernels  # gsplit.ops imports this module
        from gsplit.ops import pinning

        if not cuda_kernels.cupy_available():
            log.warning("pin_memory: pinning needs CuPy, which does not work here (see the warning of "
                        "gsplit.ops.cuda); the graph stays in pageable memory and is sampled by the CPU")
            return self
        readable = []
        for name, array in (("indptr", self.indptr), ("indices", self.indices)):
            got = pinning.make_host_readable(array, f"graph {name} array")
            if got.tensor is None:
                return self  # logged; a half-pinned graph is not readable by the kernels: sampled on the CPU
            readable.append(got.tensor)
        if readable[0] is self.indptr and readable[1] is self.indices:
            return self
        return self._same_structure(*readable)

    # ------------------------------------------------------------------ persistence
    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write ``indptr.npy``, ``indices.npy`` and then ``meta.json`` into folder ``path``, each atomically.

        ``meta.json`` lands last, so a folder without it is an interrupted write (:meth:`load` says so).
        """
        meta = {"format": _FORMAT, "version": _FORMAT_VERSION,
                "num_nodes": self.num_nodes, "num_edges": self.num_edges}
        write_array_dir(path, {"indptr.npy": self.indptr.cpu().numpy(), "indices.npy": self.indices.cpu().numpy()},
                        meta)

    @staticmethod
    def load(path: Union[str, os.PathLike], mmap: bool = True, validate: bool = True) -> "Graph":
        """Load a folder written by :meth:`save`; with ``mmap=True`` the arrays are memory-mapped.

        Always checked, whatever ``validate`` says: the sizes, dtypes and metadata, ``indptr`` (starts at 0,
        never decreases, ends at the edge count) and that every source id of ``indices`` is in
        ``[0, num_nodes)``. The arrays go to native code (scipy, the compiled kernels, METIS) that indexes
        with them unchecked, so one bad id in a file would corrupt memory; each check is one chunked pass
        (about 31 ms of one core per 30M edges, next to reading the file from disk).
        ``validate`` is kept for callers that pass it; it no longer skips anything. Any problem is a
        one-line ``ValueError`` naming the file, the bad value and where it is.

        Example:
            >>> import tempfile
            >>> d = tempfile.mkdtemp()
            >>> Graph.from_edges([0, 1], [1, 2]).save(d)
            >>> Graph.load(d)
            Graph(num_nodes=3, num_edges=2, device=cpu)
        """
        p = Path(path)
        fix = "write it again with Graph.save (or `gsplit prepare`)"
        meta = read_meta(p, ["format", "num_nodes", "num_edges"], "graph", fix)
        if meta["format"] != _FORMAT:
            raise ValueError(f"{p / 'meta.json'} has format {meta['format']!r}, expected {_FORMAT!r}; "
                             f"is this a gsplit graph folder?")
        if int(meta.get("version", 0)) > _FORMAT_VERSION:
            raise ValueError(f"{p} was written by a newer gsplit (format version {meta['version']} > "
                             f"{_FORMAT_VERSION}); upgrade gsplit to read it")
        n, e = meta["num_nodes"], meta["num_edges"]
        if not (isinstance(n, int) and isinstance(e, int) and n >= 1 and e >= 0):
            raise ValueError(f"{p / 'meta.json'}: num_nodes={n!r} and num_edges={e!r} must be integers >= 1 and "
                             f">= 0; {fix}")
        indptr = load_npy(p / "indptr.npy", fix, kind="iu", ndim=1, length=n + 1, mmap=mmap)
        indices = load_npy(p / "indices.npy", fix, kind="iu", ndim=1, length=e, mmap=mmap)
        # copy-on-write maps: torch.from_numpy refuses read-only arrays, and "c" keeps loading lazy
        g = Graph(torch.from_numpy(indptr.astype(np.int64, copy=False)),
                  torch.from_numpy(indices.astype(np.int64, copy=False)))
        _check_loaded_indptr(p, g, fix)
        _check_loaded_ids(p, g, fix)  # never skipped (validate or a folder's stamp): bad ids corrupt memory
        return g

    def __repr__(self) -> str:
        return f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, device={self.device})"
