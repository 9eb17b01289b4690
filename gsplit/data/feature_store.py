"""``FeatureStore``: a rank's input features, its hottest OWNED rows cached in GPU memory.

In split parallelism a rank loads input features only for vertices it owns under the partition map, so
its cache holds only owned vertices: no feature is cached on two GPUs, and the caches of all ranks
together hold ``world_size`` times more distinct rows than one GPU could. Rows are cached hottest
first, by how often pre-sampling saw each vertex (``PresampleWeights.vertex_weights``, written by
``gsplit prepare`` as ``vertex_weights.npy``), or by in-degree when no weights are given.

A :meth:`FeatureStore.gather` returns ``features[ids]`` on the store's device. Cached rows come from
device memory; the others (misses) are read from host memory:

* ``mode == "uva"`` (CUDA and CuPy): the host table is made readable by the GPU
  (:func:`gsplit.ops.pinning.make_host_readable`: registered in place, or a pinned copy for a memory-mapped
  table) and one kernel (``kernels/gather.cu``) reads cached rows from the GPU and missing rows straight
  from host memory (zero-copy through unified virtual addressing), so no CPU thread touches the rows;
* ``mode == "host-gather"`` (CUDA without CuPy, or a table that can be neither registered nor copied): the
  CPU gathers the missing rows into a pinned buffer that is copied to the GPU asynchronously;
* ``mode == "cpu"``: the device is the CPU; the "cache" is a contiguous tensor of the cached rows and
  misses read the host tensor; the same logic, so it is testable without a GPU;
* ``mode == "resident"``: the features already live on the device; nothing is cached or copied.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np
import torch

from gsplit import ops
from gsplit.data.graph import id_range_error
from gsplit.ops import pinning
from gsplit.ops.rows import gather_rows, scatter_rows_
from gsplit.runtime.timing import timed_step

log = logging.getLogger(__name__)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_FILL_BYTES = 64 << 20
"""The cache is filled in chunks of about this many bytes, so filling it never needs a host copy of it."""


def parse_size(size: Union[int, str, None], what: str = "cache size") -> int:
    """Bytes in ``size``: an int, or a string such as ``"10G"``, ``"512M"``, ``"1.5GiB"``, ``"0"``.

    Units are binary (``K`` = 1024 bytes, ``M`` = 1024**2, ``G`` = 1024**3, ``T`` = 1024**4), with or
    without a trailing ``B``/``iB``; no unit means bytes. ``what`` names the option in an error (e.g.
    ``"macrobatch_memory"``).

    Example:
        >>> parse_size("10G"), parse_size("512M"), parse_size("0"), parse_size(4096)
        (10737418240, 536870912, 0, 4096)
    """
    if size is None:
        return 0
    if isinstance(size, bool):
        raise ValueError(f"{what} {size!r} is a bool; pass a number of bytes or a string like '10G'")
    if isinstance(size, (int, np.integer)):
        if size < 0:
            raise ValueError(f"{what} {size} is negative; pass "
                             + ("0 (no cache) or " if what == "cache size" else "") + "a positive number of bytes")
        return int(size)
    if isinstance(size, float):
        if not math.isfinite(size) or size < 0:
            raise ValueError(f"{what} {size} is not a finite non-negative number of bytes")
        return int(size)
    m = _SIZE_RE.match(str(size))
    if m is None:
        raise ValueError(f"{what} {size!r} is not a size; write bytes or a number with a unit K, M, G or T, "
                         "e.g. '10G', '512M' or '0'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass
class CacheCounts:
    """Rows a :class:`FeatureStore` served, by where they came from."""

    hits: int = 0
    """Rows served from the cache (device memory; for ``mode == "resident"`` every row)."""
    misses: int = 0
    """Rows read from host memory."""
    host_bytes: int = 0
    """Bytes read from host memory for the misses."""

    def __iadd__(self, other: "CacheCounts") -> "CacheCounts":
        self.hits += other.hits
        self.misses += other.misses
        self.host_bytes += other.host_bytes
        return self


@functools.lru_cache(maxsize=None)
def _log_once(level: int, message: str) -> None:
    """Log ``message`` the first time only (one line per process, not one per store or iteration)."""
    log.log(level, message)


class FeatureStore:
    """One rank's input features: hottest owned rows cached on ``device``, the rest read from host memory.

    Args:
        features: ``[num_nodes, ...]`` tensor indexed by global vertex id, normally in host memory
            (on CUDA it is pinned in place; a memory-mapped table is copied once into pinned memory).
        device: where :meth:`gather` delivers rows and the cache lives (default: the features' device).
        cache_size: cache budget in bytes, an int or a string like ``"10G"`` (see :func:`parse_size`);
            ``0`` caches nothing. More than the owned rows need caches all owned rows.
        weights: per-vertex hotness, e.g. ``PresampleWeights.vertex_weights`` (a ``PresampleWeights``,
            tensor or numpy array); higher is cached first. ``None``: in-degree of ``graph``.
        graph: the graph, for the in-degree fallback.
        owner: ``owner[v]`` is the rank owning ``v`` (``PartitionMap.assignment``); ``None``: ``rank``
            owns every vertex (world size 1).
        rank: this rank; only vertices it owns are cached.

    Example:
        >>> feats = torch.arange(12.).reshape(6, 2)
        >>> store = FeatureStore(feats, cache_size=2 * 8, weights=torch.tensor([0, 5, 1, 9, 0, 0.]),
        ...                      owner=torch.tensor([0, 0, 0, 1, 1, 1]), rank=0)
        >>> store.cached_ids.tolist()                 # hottest owned rows (vertex 3 is rank 1's)
        [1, 2]
        >>> torch.equal(store.gather(torch.tensor([3, 1, 0])), feats[[3, 1, 0]])
        True
        >>> store.counts
        CacheCounts(hits=1, misses=2, host_bytes=16)
    """

    def __init__(self, features: torch.Tensor, *, device: Union[str, torch.device, None] = None,
                 cache_size: Union[int, str] = 0, weights=None, graph=None,
                 owner: Optional[torch.Tensor] = None, rank: int = 0):
        if not isinstance(features, torch.Tensor) or features.dim() < 1:
            raise ValueError(f"features must be a tensor with one row per vertex, got {type(features).__name__}"
                             + (f" of shape {tuple(features.shape)}" if isinstance(features, torch.Tensor) else ""))
        self.num_nodes = int(features.shape[0])
        self.row_shape = tuple(features.shape[1:])
        self.dtype = features.dtype
        self.row_bytes = math.prod(self.row_shape) * features.element_size()
        self.device = torch.device(device) if device is not None else features.device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.rank = int(rank)
        self.cache_bytes_budget = parse_size(cache_size)
        self._lock = threading.Lock()  # counters may be updated by a prefetching thread
        self._host_for_kernel: Optional[torch.Tensor] = None
        self._counts = CacheCounts()

        if features.device.type != "cpu":
            if features.device != self.device:
                raise ValueError(f"features are on {features.device} but the store delivers to {self.device}; "
                                 "pass host features (they are cached and read from there) or features on "
                                 f"{self.device}")
            self.mode = "resident"
            self.features = features
            self.cached_ids = torch.empty(0, dtype=torch.int64)
            self.cache = features.new_empty((0,) + self.row_shape)
            self._slot_of = None
            return

        self.features = features.contiguous()  # kernels and index_select read rows at fixed strides
        # no cache, no owned ids: a [num_nodes] mask and [num_nodes / ranks] ids per rank for nothing
        cached_any = bool(self.cache_bytes_budget) or not self.row_bytes
        owned = self._owned(owner, ids=cached_any)
        capacity = self.cache_bytes_budget // self.row_bytes if self.row_bytes else owned.numel()
        k = min(int(capacity), owned.numel())
        self.cached_ids = self._hottest(owned, k, weights, graph) if k else torch.empty(0, dtype=torch.int64)
        if owner is not None and k:
            # The split invariant: a vertex is loaded only by its owner, so caching it elsewhere wastes
            # the cache and would mean two GPUs hold one row.
            own = torch.as_tensor(owner).cpu()[self.cached_ids]
            if not bool((own == self.rank).all()):
                raise RuntimeError(f"internal error: rank {self.rank} would cache vertex "
                                   f"{int(self.cached_ids[own != self.rank][0])} that it does not own")
        self.cache = self._fill_cache()
        self._slot_of = None
        if k:
            dtype = torch.int32 if k < 2**31 else torch.int64
            slot_of = torch.full((self.num_nodes,), -1, dtype=dtype)
            slot_of[self.cached_ids] = torch.arange(k, dtype=dtype)
            self._slot_of = slot_of.to(self.device)

        if self.device.type == "cpu":
            self.mode = "cpu"
        elif self.device.type != "cuda":
            raise ValueError(f"device {self.device} is neither the CPU nor a CUDA GPU")
        elif not ops.cuda.cupy_available():
            self.mode = "host-gather"
            _log_once(logging.INFO, "CuPy is not available: feature-cache misses are gathered by the CPU and "
                      "copied to the GPU (install cupy for the zero-copy gather kernel)")
        elif k == self.num_nodes or self.num_nodes == 0:
            self.mode = "uva"  # every row is cached: host memory is never read, so it needs no pinning
            self._host_for_kernel = self.cache[:0]
        else:
            # in place, or a pinned copy (a memory-mapped table, or a slow registration); else the CPU gathers
            readable = pinning.make_host_readable(self.features, "host feature table")
            self.mode = "uva" if readable.tensor is not None else "host-gather"
            self._host_for_kernel = readable.tensor
        log.info("feature store on %s (%s): %d of %d owned rows cached (%.1f MiB of %.1f MiB budget)",
                 self.device, self.mode, k, owned.numel(), k * self.row_bytes / 2**20,
                 self.cache_bytes_budget / 2**20)

    @classmethod
    def for_loader(cls, features, device: Union[str, torch.device], cache_size: Union[int, str] = 0, weights=None,
                   graph=None) -> Optional["FeatureStore"]:
        """The store a loader that delivers to ``device`` reads ``features`` through, with no owner map (every
        row may be loaded): ``features`` itself when it is a store already (shared between loaders), ``None``
        without features, else a new store (features already on a GPU stay there and are served from there).

        Example:
            >>> FeatureStore.for_loader(torch.ones(4, 2), "cpu").mode
            'cpu'
        """
        if isinstance(features, FeatureStore):
            if parse_size(cache_size) or weights is not None:
                raise ValueError("features is a FeatureStore, whose cache is already set up; leave cache_size and "
                                 "cache_weights out (or pass the feature tensor instead)")
            store = features
        elif features is None:
            if parse_size(cache_size):
                raise ValueError(f"cache_size={cache_size!r} but no features were given; pass features= to cache")
            return None
        else:
            device = device if features.device.type == "cpu" else features.device
            store = cls(features, device=device, cache_size=cache_size, weights=weights, graph=graph)
        if graph is not None and store.num_nodes != graph.num_nodes:
            raise ValueError(f"the features have {store.num_nodes} rows but the graph has {graph.num_nodes} "
                             "vertices; pass one row per vertex")
        return store

    # ------------------------------------------------------------------ construction
    def _owned(self, owner, ids: bool = True) -> torch.Tensor:
        """The vertices this rank owns (``owner`` checked); with ``ids=False`` only the check (empty ids)."""
        if owner is None:
            return torch.arange(self.num_nodes if ids else 0, dtype=torch.int64)
        owner = torch.as_tensor(owner)  # a tensor stays where it is: no copy to check its shape
        if owner.shape != (self.num_nodes,):
            raise ValueError(f"owner has shape {tuple(owner.shape)} but the features have {self.num_nodes} rows; "
                             "pass one owning rank per vertex (PartitionMap.assignment)")
        if not ids:
            return torch.empty(0, dtype=torch.int64)
        owner = owner.cpu()
        return (owner == self.rank).nonzero().squeeze(1)

    def _hottest(self, owned: torch.Tensor, k: int, weights, graph) -> torch.Tensor:
        if weights is None:
            if graph is None:
                raise ValueError("the cache needs to know which vertices are hot: pass weights= (e.g. "
                                 "PresampleWeights.vertex_weights) or graph= to rank vertices by in-degree")
            if graph.num_nodes != self.num_nodes:
                raise ValueError(f"the graph has {graph.num_nodes} vertices but the features {self.num_nodes} rows")
            hot = graph.in_degrees().cpu().to(torch.float64)
            log.info("no pre-sampling weights: caching the owned vertices of highest in-degree")
        else:
            hot = getattr(weights, "vertex_weights", weights)  # a PresampleWeights or the tensor itself
            hot = torch.as_tensor(np.asarray(hot) if not isinstance(hot, torch.Tensor) else hot).cpu()
            if hot.shape != (self.num_nodes,):
                raise ValueError(f"cache weights have shape {tuple(hot.shape)} but the features have "
                                 f"{self.num_nodes} rows; pass one weight per vertex (vertex_weights.npy of "
                                 "this dataset's prepare)")
            hot = hot.to(torch.float64)
            if not bool(torch.isfinite(hot).all()):
                raise ValueError("cache weights hold NaN or inf; pass finite vertex weights")
        # Stable sort of ascending ids: equally hot vertices are taken lowest id first, on every run.
        order = torch.sort(hot[owned], descending=True, stable=True).indices[:k]
        return owned[order]

    def _fill_cache(self) -> torch.Tensor:
        k = self.cached_ids.numel()
        cache = torch.empty((k,) + self.row_shape, dtype=self.dtype, device=self.device)
        if not k:
            return cache
        rows = max(1, _FILL_BYTES // max(self.row_bytes, 1))
        with timed_step(f"filling the {k * self.row_bytes / 2**30:.2f} GiB feature cache on {self.device}",
                        logger=log) as step:
            for start in range(0, k, rows):
                cache[start:start + rows] = self.features[self.cached_ids[start:start + rows]].to(self.device)
                step.update(min(k, start + rows) * self.row_bytes, k * self.row_bytes)
        return cache

    # ------------------------------------------------------------------ queries
    @property
    def num_cached(self) -> int:
        """Rows held in the cache."""
        return self.cached_ids.numel()

    @property
    def cache_bytes(self) -> int:
        """Bytes the cached rows take on the device."""
        return self.num_cached * self.row_bytes

    @property
    def counts(self) -> CacheCounts:
        """Rows served since construction (or :meth:`reset_counts`): hits, misses, bytes from host."""
        with self._lock:
            return CacheCounts(self._counts.hits, self._counts.misses, self._counts.host_bytes)

    @property
    def hits(self) -> int:
        return self.counts.hits

    @property
    def misses(self) -> int:
        return self.counts.misses

    @property
    def bytes_from_host(self) -> int:
        return self.counts.host_bytes

    def reset_counts(self) -> None:
        with self._lock:
            self._counts = CacheCounts()

    def is_cached(self, ids: torch.Tensor) -> torch.Tensor:
        """Boolean tensor (on the CPU): which of ``ids`` are in this rank's cache."""
        ids = torch.as_tensor(ids, dtype=torch.int64).cpu()
        if self._slot_of is None:
            return torch.zeros(ids.shape, dtype=torch.bool)
        return self._slot_of.cpu()[ids] >= 0

    def __repr__(self) -> str:
        return (f"FeatureStore(rows={self.num_nodes}, row_bytes={self.row_bytes}, device={self.device}, "
                f"mode={self.mode!r}, cached={self.num_cached})")

    # ------------------------------------------------------------------ gather
    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """``features[ids]`` on the store's device (cached rows from the cache, others from host memory).

        Example:
            >>> store = FeatureStore(torch.eye(3), cache_size="0")
            >>> store.gather(torch.tensor([2, 0])).tolist()
            [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
        """
        return self.gather_with_counts(ids)[0]

    def gather_with_counts(self, ids: torch.Tensor) -> Tuple[torch.Tensor, CacheCounts]:
        """:meth:`gather`, also returning how many rows of this call hit the cache and missed it."""
        ids = torch.as_tensor(ids)
        if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be a 1-D integer tensor of vertex ids, got {ids.dtype} of shape "
                             f"{tuple(ids.shape)}")
        if self.mode == "resident":
            ids = ids.to(self.device, torch.int64)
            self._check_range(*self._min_max(ids))
            rows = gather_rows(self.features, ids)
            counts = CacheCounts(hits=ids.numel())
        elif self.mode == "cpu":
            rows, counts = self._gather_cpu(ids.to(torch.int64).cpu())
        elif self.mode == "uva":
            rows, counts = self._gather_uva(ids.to(self.device, torch.int64).contiguous())
        else:
            rows, counts = self._gather_host(ids.to(self.device, torch.int64))
        with self._lock:
            self._counts += counts
        return rows, counts

    def _check_range(self, lo: int, hi: int) -> None:
        # min and max come from one device sync with the hit count, so this cannot call check_id_range
        if lo < 0 or hi >= self.num_nodes:
            raise id_range_error("ids", lo if lo < 0 else hi, self.num_nodes)

    @staticmethod
    def _min_max(ids: torch.Tensor) -> Tuple[int, int]:
        if ids.numel() == 0:
            return 0, -1
        lo, hi = torch.aminmax(ids)
        return int(lo), int(hi)

    def _empty(self, n: int) -> torch.Tensor:
        return torch.empty((n,) + self.row_shape, dtype=self.dtype, device=self.device)

    def _counts_for(self, n: int, hits: int) -> CacheCounts:
        return CacheCounts(hits=hits, misses=n - hits, host_bytes=(n - hits) * self.row_bytes)

    def _gather_cpu(self, ids: torch.Tensor) -> Tuple[torch.Tensor, CacheCounts]:
        self._check_range(*self._min_max(ids))
        if self._slot_of is None:
            return gather_rows(self.features, ids), self._counts_for(ids.numel(), 0)
        slots = self._slot_of.index_select(0, ids).to(torch.int64)  # index_select: ids are 1-D, faster than x[ids]
        hit = slots >= 0
        hit_pos, miss_pos = hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)
        out = self._empty(ids.numel())
        scatter_rows_(out, hit_pos, gather_rows(self.cache, slots.index_select(0, hit_pos)))
        scatter_rows_(out, miss_pos, gather_rows(self.features, ids.index_select(0, miss_pos)))
        return out, self._counts_for(ids.numel(), hit_pos.numel())

    def _slots_and_checks(self, ids: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """Cache slot of every id (-1: miss) and the number of hits, after checking the id range.

        One host synchronisation for the range check and the hit count together.
        """
        if ids.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=ids.device), 0
        if self._slot_of is None:
            slots = torch.full_like(ids, -1)
            lo, hi = self._min_max(ids)
            self._check_range(lo, hi)
            return slots, 0
        lo, hi = torch.aminmax(ids)
        # clamp so that an out-of-range id cannot index slot_of before the check below reports it
        slots = self._slot_of.index_select(0, ids.clamp(0, self.num_nodes - 1)).to(torch.int64)
        lo, hi, hits = torch.stack([lo, hi, (slots >= 0).sum()]).tolist()
        self._check_range(lo, hi)
        return slots, hits

    def _gather_uva(self, ids: torch.Tensor) -> Tuple[torch.Tensor, CacheCounts]:
        slots, hits = self._slots_and_checks(ids)
        out = self._empty(ids.numel())
        ops.cuda.gather_rows(self.cache, self._host_for_kernel, slots, ids, out)
        return out, self._counts_for(ids.numel(), hits)

    def _gather_host(self, ids: torch.Tensor) -> Tuple[torch.Tensor, CacheCounts]:
        slots, hits = self._slots_and_checks(ids)
        out = self._empty(ids.numel())
        hit = slots >= 0
        hit_pos, miss_pos = hit.nonzero().squeeze(1), (~hit).nonzero().squeeze(1)
        if hit_pos.numel():
            scatter_rows_(out, hit_pos, gather_rows(self.cache, slots.index_select(0, hit_pos)))
        if miss_pos.numel():
            miss_ids = ids.index_select(0, miss_pos).cpu()
            # Pinned staging, so the copy below is asynchronous; torch's pinned allocator keeps the
            # buffer alive until the copy has run.
            staging = torch.empty((miss_ids.numel(),) + self.row_shape, dtype=self.dtype,
                                  pin_memory=self.device.type == "cuda")
            torch.index_select(self.features, 0, miss_ids, out=staging)
            out.index_copy_(0, miss_pos, staging.to(self.device, non_blocking=True))
        return out, self._counts_for(ids.numel(), hits)
