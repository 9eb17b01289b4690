"""METIS for the partitioning strategies (:mod:`gsplit.partitioning.strategies`): its input (a symmetric graph
with integer weights) and the k-way call, made safe.

METIS is reached through the C symbols that pymetis's extension module exports, called with ctypes:
``pymetis.part_graph`` only passes one balance constraint, and the ``gsplit`` and ``edge`` strategies
balance several at once (METIS's multi-constraint mode, ``ncon > 1``). If the ctypes route fails, the
strategies fall back to ``pymetis.part_graph`` with the constraints summed into one, and log a warning.

METIS wants an undirected graph with positive integer weights. A directed graph is symmetrised as
``A + A^T`` (weights of the two directions summed, self loops dropped). Float weights become integers by
one scale factor per weight kind (see :func:`to_metis_weights`).

METIS runs in a forked child process (Linux and other POSIX systems). Its GKlib traps SIGTERM with a
handler that ``longjmp``s back into METIS: a SIGTERM during a long partitioning made the process crash
(SIGSEGV) or report a fake ``METIS_ERROR`` instead of stopping. In a child, the signal reaches this
process's own handler (``gsplit`` exits 143), the child is killed, and a child left alone dies with it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import select
import signal
import struct
import sys
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from gsplit.data.graph import Graph
from gsplit.runtime.resources import process_status_kb, return_freed_heap

log = logging.getLogger(__name__)


_METIS_OK = 1
_METIS_NOPTIONS = 40
_METIS_ERRORS = {-2: "METIS_ERROR_INPUT (invalid input)", -3: "METIS_ERROR_MEMORY (out of memory)", -4: "METIS_ERROR"}


# ---------------------------------------------------------------------------------------------- ctypes
@dataclass(frozen=True)
class _MetisLib:
    """The METIS entry points of pymetis's extension module and the width of its ``idx_t``."""

    part_kway: "ctypes._CFuncPtr"
    set_default_options: "ctypes._CFuncPtr"
    idx_dtype: type
    option_seed: int
    option_ufactor: int
    option_numbering: int


def _ptr(a: Optional[np.ndarray]):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


@functools.lru_cache(maxsize=1)
def _load_metis() -> _MetisLib:
    """Open pymetis's extension with ctypes and check on a tiny graph that calls work (cached)."""
    import pymetis
    from pymetis import _internal

    lib = ctypes.CDLL(_internal.__file__)
    part = lib.METIS_PartGraphKway
    part.restype = ctypes.c_int
    part.argtypes = [ctypes.c_void_p] * 13
    setdef = lib.METIS_SetDefaultOptions
    setdef.restype = ctypes.c_int
    setdef.argtypes = [ctypes.c_void_p]
    # idx_t's width is a build option (METIS_IDXTYPEWIDTH); pymetis reports it. real_t is never needed:
    # we pass no tpwgts/ubvec and set the tolerance through the integer UFACTOR option instead.
    width = int(_internal._idx_type_width()) if hasattr(_internal, "_idx_type_width") else 64
    if width not in (32, 64):
        raise RuntimeError(f"pymetis reports an idx_t width of {width} bits; expected 32 or 64")
    from pymetis._internal import OptionKey

    lib_info = _MetisLib(part, setdef, np.int64 if width == 64 else np.int32,
                         int(OptionKey.SEED), int(OptionKey.UFACTOR), int(OptionKey.NUMBERING))
    _self_test(lib_info)
    log.debug("METIS through ctypes: %s, idx_t %d bits, pymetis %s", _internal.__file__, width,
              getattr(pymetis, "__version__", "?"))
    return lib_info


def _self_test(lib: _MetisLib) -> None:
    """Two 4-cliques joined by one edge, 2 parts: a working call returns the two cliques, cut 1."""
    edges = [(a, b) for c in (0, 4) for a in range(c, c + 4) for b in range(c, c + 4) if a != b] + [(3, 4), (4, 3)]
    src = np.array([e[0] for e in edges])
    dst = np.array([e[1] for e in edges])
    order = np.lexsort((dst, src))
    xadj = np.zeros(9, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=8), out=xadj[1:])
    parts, cut = _call_kway(lib, xadj, dst[order], 2, None, None, seed=1, ufactor=30)
    if cut != 1 or len(set(parts[:4])) != 1 or len(set(parts[4:])) != 1 or parts[0] == parts[4]:
        raise RuntimeError(f"METIS self-test through ctypes gave parts {parts.tolist()} with cut {cut}; "
                           "expected the two cliques with cut 1")


def _call_kway(lib: _MetisLib, xadj, adjncy, nparts: int, vwgt, adjwgt, seed: int, ufactor: int
               ) -> Tuple[np.ndarray, int]:
    idx = lib.idx_dtype
    n = len(xadj) - 1
    xadj = np.ascontiguousarray(xadj, dtype=idx)
    adjncy = np.ascontiguousarray(adjncy, dtype=idx)
    ncon = 1
    if vwgt is not None:
        vwgt = np.asarray(vwgt)
        ncon = 1 if vwgt.ndim == 1 else vwgt.shape[1]
        vwgt = np.ascontiguousarray(vwgt, dtype=idx)  # row-major [n, ncon], the layout METIS reads
    if adjwgt is not None:
        adjwgt = np.ascontiguousarray(adjwgt, dtype=idx)
    opts = np.zeros(_METIS_NOPTIONS, dtype=idx)
    lib.set_default_options(_ptr(opts))
    opts[lib.option_seed] = seed
    opts[lib.option_ufactor] = ufactor
    opts[lib.option_numbering] = 0
    nvtxs = np.array([n], dtype=idx)
    ncon_a = np.array([ncon], dtype=idx)
    nparts_a = np.array([nparts], dtype=idx)
    cut = np.zeros(1, dtype=idx)
    parts = np.full(n, -1, dtype=idx)
    ret = lib.part_kway(_ptr(nvtxs), _ptr(ncon_a), _ptr(xadj), _ptr(adjncy), _ptr(vwgt), None, _ptr(adjwgt),
                        _ptr(nparts_a), None, None, _ptr(opts), _ptr(cut), _ptr(parts))
    if ret != _METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway returned {_METIS_ERRORS.get(ret, ret)} for {n} vertices, "
                           f"{len(adjncy)} adjacency entries, {ncon} constraints, {nparts} parts")
    if n and (parts.min() < 0 or parts.max() >= nparts):
        raise RuntimeError(f"METIS_PartGraphKway returned part ids outside [0, {nparts}); the ctypes call is broken")
    return parts.astype(np.int64, copy=False), int(cut[0])


def metis_part_kway(xadj, adjncy, nparts: int, vwgt=None, adjwgt=None, seed: int = 0, ufactor: int = 30,
                    memory: Optional[dict] = None) -> Tuple[np.ndarray, int, str]:
    """k-way min-edge-cut METIS on an undirected CSR graph; several balance constraints allowed.

    Args:
        xadj, adjncy: CSR of a symmetric graph without self loops (both directions stored).
        nparts: number of parts (>= 2).
        vwgt: non-negative integer vertex weights, ``[n]`` or ``[n, ncon]`` (one column per constraint),
            or None for unit weights. Every constraint is balanced to within ``ufactor``.
        adjwgt: positive integer weight of each adjacency entry (symmetric), or None for unit weights.
        seed: METIS's random seed; equal inputs and seed give equal output.
        ufactor: allowed imbalance in thousandths: ``30`` lets a part weigh up to 1.03x the average.
        memory: a dict that receives the METIS process's RSS before METIS and its peak, in MB
            (``metis_child_start_rss_mb``, ``metis_child_peak_rss_mb``) where they were measured.

    Returns:
        ``(parts, edgecut, backend)``: int64 part of every vertex, the weighted cut METIS reports, and
        ``"ctypes"`` or ``"pymetis"`` (the single-constraint fallback).

    Example:
        >>> xadj, adjncy = np.array([0, 1, 3, 5, 6]), np.array([1, 0, 2, 1, 3, 2])   # path 0-1-2-3
        >>> parts, cut, _ = metis_part_kway(xadj, adjncy, 2)
        >>> cut, parts.tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
        (1, True)
    """
    try:
        lib = _load_metis()
    except Exception as err:  # noqa: BLE001 - any failure to reach METIS through ctypes means: fall back
        log.warning("cannot call METIS through ctypes (%s: %s); falling back to pymetis.part_graph, which "
                    "balances a single constraint (the constraints are summed)", type(err).__name__, err)
        return _pymetis_fallback(xadj, adjncy, nparts, vwgt, adjwgt, seed, ufactor)
    parts, cut, used = _call_kway_in_child(lib, xadj, adjncy, nparts, vwgt, adjwgt, seed, ufactor)
    if memory is not None:
        memory.update(used)
    return parts, cut, "ctypes"


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        # Wake up often: a process-wide signal may be delivered to another thread (torch's), and then only
        # the main thread's next bytecode runs its Python handler; a blocking read would delay it until
        # METIS ends.
        while not select.select([fd], [], [], 0.1)[0]:
            pass
        chunk = os.read(fd, min(n - got, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _call_kway_in_child(lib: _MetisLib, xadj, adjncy, nparts: int, vwgt, adjwgt, seed: int, ufactor: int
                        ) -> Tuple[np.ndarray, int, dict]:
    """:func:`_call_kway` in a forked child (see the module doc: METIS traps SIGTERM); inline without fork.

    Also returns the child's RSS before METIS and its peak (MB): METIS's own memory is the difference,
    and it is not in this process's peak (``VmHWM``)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return (*_call_kway(lib, xadj, adjncy, nparts, vwgt, adjwgt, seed, ufactor), {})
    # the temporaries of METIS's input, freed but resident in the heap, would stay held by both processes
    return_freed_heap()
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # the child only runs METIS (C) and numpy copies: no locks of other threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's handlers or atexit hooks
        status = 1
        try:
            os.close(read_fd)
            for sig in (signal.SIGINT, signal.SIGHUP):  # the parent decides what a signal means
                signal.signal(sig, signal.SIG_IGN)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent
            except (OSError, AttributeError):
                pass
            try:
                start_kb = process_status_kb("VmRSS")
                parts, cut = _call_kway(lib, xadj, adjncy, nparts, vwgt, adjwgt, seed, ufactor)
                data = np.ascontiguousarray(parts, dtype=np.int64).tobytes()
                message = struct.pack(_HEADER, 0, cut, start_kb, process_status_kb("VmHWM"), len(data)) + data
            except BaseException as e:  # noqa: BLE001 - the parent re-raises it
                text = f"{type(e).__name__}: {e}".encode()
                message = struct.pack(_HEADER, 1, 0, 0, 0, len(text)) + text
            view = memoryview(message)
            while view:
                view = view[os.write(write_fd, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        header = _read_exactly(read_fd, struct.calcsize(_HEADER))
        if len(header) == struct.calcsize(_HEADER):
            failed, cut, start_kb, peak_kb, size = struct.unpack(_HEADER, header)
            body = _read_exactly(read_fd, size)
        else:
            failed, cut, start_kb, peak_kb, body = None, 0, 0, 0, b""
        _, wait_status = os.waitpid(pid, 0)
        pid = 0
    finally:
        os.close(read_fd)
        if pid:  # interrupted (a signal's handler raised): the child must not outlive the call
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if failed is None:
        code = os.waitstatus_to_exitcode(wait_status)
        how = f"died from {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise RuntimeError(f"the METIS process {how} before returning a partition ({len(xadj) - 1} vertices, "
                           f"{nparts} parts); if it was killed for memory, partition on a larger machine")
    if failed:
        raise RuntimeError(body.decode(errors="replace"))
    memory = {"metis_child_start_rss_mb": round(start_kb / 1024, 1) if start_kb >= 0 else None,
              "metis_child_peak_rss_mb": round(peak_kb / 1024, 1) if peak_kb >= 0 else None}
    return np.frombuffer(body, dtype=np.int64).copy(), int(cut), memory


_HEADER = "<bqqqq"
"""The METIS child's message header: failed, edge cut, its RSS before METIS and its peak RSS (KiB), body size."""


def _pymetis_fallback(xadj, adjncy, nparts, vwgt, adjwgt, seed, ufactor) -> Tuple[np.ndarray, int, str]:
    import pymetis

    if vwgt is not None:
        vwgt = np.asarray(vwgt, dtype=np.float64)
        if vwgt.ndim == 2:
            # each constraint normalised to the same total, so none dominates the single sum
            tot = vwgt.sum(0)
            vwgt = (vwgt / np.where(tot > 0, tot, 1)).sum(1)
            vwgt = to_metis_weights(vwgt, keep_positive=False)
        vwgt = np.ascontiguousarray(vwgt, dtype=np.int64)
    opts = pymetis.Options()
    opts.seed = seed
    opts.ufactor = ufactor
    adjacency = pymetis.CSRAdjacency(np.asarray(xadj, dtype=np.int64), np.asarray(adjncy, dtype=np.int64))
    res = pymetis.part_graph(nparts, adjacency, vweights=vwgt,
                             eweights=None if adjwgt is None else np.asarray(adjwgt, dtype=np.int64),
                             recursive=False, options=opts)
    return np.asarray(res.vertex_part, dtype=np.int64), int(res.edge_cuts), "pymetis"


# ---------------------------------------------------------------------------------------------- weights
def to_metis_weights(w: np.ndarray, max_weight: int = 1 << 20, max_total: int = 1 << 50,
                     keep_positive: bool = True) -> np.ndarray:
    """Scale non-negative float weights to METIS integers: ``round(w * s)`` with one scale ``s`` per array.

    ``s`` makes the largest weight ``max_weight`` (a relative resolution of about 1e-6) unless the sum
    would pass ``max_total`` (kept well inside 64-bit ``idx_t`` sums), in which case it shrinks. With
    ``keep_positive`` a positive weight never rounds down to 0 (it becomes 1), so a sampled edge or vertex
    is never treated as free. For a 2-D array each column is scaled on its own (METIS normalises each
    balance constraint by its total, so per-column scales change nothing but rounding).

    Example:
        >>> to_metis_weights(np.array([0.0, 0.5, 1.0]), max_weight=10).tolist()
        [0, 5, 10]
    """
    w = np.asarray(w)
    if w.dtype.kind != "f":
        w = w.astype(np.float64)
    if w.size and (not np.isfinite(w).all() or w.min() < 0):
        raise ValueError("weights must be finite and non-negative; check the pre-sampling weights")
    cols = w.reshape(len(w), -1)
    out = np.zeros(cols.shape, dtype=np.int64)
    for j in range(cols.shape[1]):
        c = cols[:, j]
        top, total = (float(c.max()), float(c.sum(dtype=np.float64))) if c.size else (0.0, 0.0)
        if top <= 0:
            continue
        s = min(max_weight / top, max_total / total)
        for a, b in _chunks(len(c)):  # in chunks: the float64 temporaries stay small
            part = c[a:b].astype(np.float64)
            q = np.rint(part * s).astype(np.int64)
            if keep_positive:
                q[(q == 0) & (part > 0)] = 1
            out[a:b, j] = q
    return out.reshape(w.shape)


def symmetrize(graph: Graph, edge_weights: Optional[torch.Tensor] = None, drop_zero: bool = False
               ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The METIS view of ``graph``: CSR of ``A + A^T`` without self loops, and its summed edge weights.

    Args:
        edge_weights: ``[num_edges]`` weight per edge id; None means 1 per edge.
        drop_zero: leave out edges whose weight is 0 (e.g. never sampled) before summing the two
            directions; an entry whose summed weight is 0 is always left out.

    Returns:
        ``(xadj, adjncy, adjwgt)`` as int64 / int64 / float64 numpy arrays; ``adjwgt`` is None when
        every entry has the same weight (METIS then treats edges as unit weight).

    A graph whose every edge has its reverse (undirected data, e.g. built with ``symmetric=True``)
    and sorted in-edge lists is already its own symmetric CSR: its arrays are used as they are, with
    ``w(u, d) + w(d, u)`` per entry. Other graphs go through scipy's ``A + A^T``.

    Example:
        >>> g = Graph.from_edges([0, 1, 1], [1, 0, 2])
        >>> xadj, adjncy, w = symmetrize(g)
        >>> xadj.tolist(), adjncy.tolist(), w.tolist()
        ([0, 1, 3, 4], [1, 0, 2, 1], [2.0, 2.0, 1.0, 1.0])
    """
    from gsplit.partitioning.expected import reverse_edges

    indptr = graph.indptr.cpu().numpy()
    src = graph.indices.cpu().numpy()
    n, m = graph.num_nodes, src.size
    # float32 weights stay float32 here; each chunk is widened to float64 as it is summed (no full copy)
    w = None if edge_weights is None else edge_weights.detach().cpu().numpy()
    rev = reverse_edges(indptr, src)
    if rev.size and rev.min() >= 0 and not _has_repeats(indptr, src):
        # every edge has its reverse, none is repeated: the in-edge lists are the symmetric adjacency
        # lists already; each entry's weight is the sum of its two directions. Built chunk by chunk:
        # the full-size arrays are the summed weights, a keep mask and (when some are dropped) the kept
        # ids, never a destination per edge or float64 copies of the weights.
        sym = np.empty(m, dtype=np.float64)
        keep = np.empty(m, dtype=bool)
        for a, b in _chunks(m):
            if w is None:
                sym[a:b] = 2.0
            else:
                here, there = w[a:b].astype(np.float64), w[rev[a:b]].astype(np.float64)
                if drop_zero:
                    np.maximum(here, 0.0, out=here)
                    np.maximum(there, 0.0, out=there)
                np.add(here, there, out=sym[a:b])
            # a zero sum is dropped either way, as scipy's A + A^T drops it; self loops too
            keep[a:b] = (src[a:b] != _rows(indptr, a, b)) & (sym[a:b] > 0)
        del rev
        if keep.all():
            xadj, adjncy, data = indptr.astype(np.int64, copy=False), src.astype(np.int64, copy=False), sym
        else:
            counts = np.zeros(n, dtype=np.int64)
            adjncy = np.empty(int(np.count_nonzero(keep)), dtype=np.int64)
            written = 0
            for a, b in _chunks(m):
                k = keep[a:b]
                kept = int(np.count_nonzero(k))
                counts += np.bincount(_rows(indptr, a, b)[k], minlength=n)
                adjncy[written:written + kept] = src[a:b][k]
                sym[written:written + kept] = sym[a:b][k]  # compacted in place: written <= a
                written += kept
            xadj = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(counts, out=xadj[1:])
            data = sym[:written]
    else:
        del rev
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        w = np.ones(m, dtype=np.float64) if w is None else w.astype(np.float64, copy=False)
        xadj, adjncy, data = _symmetrize_scipy(n, src, dst, w, drop_zero)
    uniform = data.size == 0 or bool(np.all(data == data[0]))
    return xadj, adjncy, (None if uniform else data)


_CHUNK = 1 << 22
"""Edges per chunk in :func:`symmetrize` and :func:`to_metis_weights`: bounds their temporaries (~100 MB)."""


def _chunks(m: int):
    return ((a, min(a + _CHUNK, m)) for a in range(0, m, _CHUNK))


def _rows(indptr: np.ndarray, a: int, b: int) -> np.ndarray:
    """The destination (CSC column) of edges ``a..b-1`` (``a < b``)."""
    r0 = int(np.searchsorted(indptr, a, side="right")) - 1
    r1 = int(np.searchsorted(indptr, b - 1, side="right")) - 1
    counts = np.minimum(indptr[r0 + 1:r1 + 2], b) - np.maximum(indptr[r0:r1 + 1], a)
    return np.repeat(np.arange(r0, r1 + 1, dtype=np.int64), counts)


def _has_repeats(indptr: np.ndarray, src: np.ndarray) -> bool:
    """True when some in-edge list holds a source twice next to each other (sorted lists: any repeat)."""
    for a, b in _chunks(max(src.size - 1, 0)):  # pairs (i, i + 1) for i in a..b-1
        same = src[a:b] == src[a + 1:b + 1]
        if same.any() and bool((same & (_rows(indptr, a, b) == _rows(indptr, a + 1, b + 1))).any()):
            return True
    return False


def _symmetrize_scipy(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, drop_zero: bool
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A + A^T`` (duplicates summed, self loops dropped) through scipy, for graphs that are not symmetric."""
    import scipy.sparse as sp

    keep = src != dst
    if drop_zero:
        keep &= w > 0
    if not keep.all():
        src, dst, w = src[keep], dst[keep], w[keep]
    a = sp.coo_matrix((w, (src, dst)), shape=(n, n))
    s = (a + a.T).tocsr()
    s.sum_duplicates()
    s.sort_indices()
    return s.indptr.astype(np.int64), s.indices.astype(np.int64), s.data.astype(np.float64, copy=False)


# ---------------------------------------------------------------------------------------------- strategies


def _weight_limits() -> Tuple[int, int]:
    """``(max_weight, max_total)`` for :func:`to_metis_weights` that METIS's ``idx_t`` sums can hold."""
    try:
        bits = 64 if _load_metis().idx_dtype == np.int64 else 32
    except Exception:  # noqa: BLE001 - the fallback path reports the failure itself
        from pymetis import _internal

        bits = int(getattr(_internal, "_idx_type_width", lambda: 32)())
    return (1 << 20, 1 << 50) if bits == 64 else (1 << 10, 1 << 30)
