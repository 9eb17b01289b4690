"""Chunked edge list -> CSC conversion into a prepared dataset folder, never holding the edge list and
the CSC in memory at once.

:func:`load_edgelist` parses the whole file, then sorts every edge (``Graph.from_edges``): the edge
list, its sort keys and the CSC are all in memory together (~50 B per edge). :func:`convert_edgelist`
writes the same graph through files, with only per-vertex arrays and one chunk of edges in memory:

1. parse the text ``chunk_edges`` lines at a time into a binary scratch file of (src, dst) int64 pairs,
   merging each chunk's distinct ids into the sorted id list (vertex ids may be any integers);
2. pass 1 over the scratch file: ids -> ``0..N-1`` (``searchsorted``, written back), self loops
   dropped, reverse edges added when ``symmetric``, in-degree counted per destination;
3. pass 2: each chunk's sources are written at their destination's next free offsets in a
   memory-mapped ``indices`` array (a cursor per vertex);
4. pass 3, over blocks of whole rows: sort each row's sources and drop repeats (as ``Graph.from_edges``
   does), compacting in place, then copy the result into ``graph/indices.npy``.

The folder equals ``save_folder(load_edgelist(path, same options))``: same graph, features, labels,
split and node ids (tests/test_dataset_folder.py checks it, with duplicates, self loops and unsorted
input). Memory-mapped pages written by passes 2 and 3 are file pages: the kernel writes them back
and drops them under pressure, but they count in the resident size (``VmHWM``) while they are mapped.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

import numpy as np
import torch

from gsplit.datasets.base import random_split
from gsplit.datasets.files import _COMMENTS, _existing_file, _sniff
from gsplit.datasets.folder import _SPLITS, folder_meta
from gsplit.graph import Graph
from gsplit.io import atomic_save_npy, atomic_write_json, write_array_dir

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

DEFAULT_CHUNK_EDGES = 1 << 22
"""Edges per chunk (4M: ~100 MB of temporaries per chunk)."""


@dataclass
class ConversionReport:
    """What :func:`convert_edgelist` did and what it cost."""

    folder: str
    """The prepared dataset folder written."""
    num_nodes: int
    """Vertices (distinct ids of the file)."""
    num_edges: int
    """Edges of the CSC after symmetrisation, self-loop removal and deduplication."""
    file_edges: int
    """Edge lines read from the file."""
    chunks: int
    """Chunks of at most ``chunk_edges`` lines the file was read in."""
    seconds: Dict[str, float] = field(default_factory=dict)
    """Wall seconds per stage: parse, degrees, place, sort, features."""
    peak_rss_bytes: Optional[int] = None
    """This process's peak resident size (``VmHWM``) at the end; mapped file pages count in it."""


def peak_rss_bytes() -> Optional[int]:
    """This process's peak resident set size (``VmHWM`` of ``/proc/self/status``), or None off Linux.

    Example:
        >>> (peak_rss_bytes() or 1) > 0
        True
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _read_chunks(path: Path, delimiter, chunk_edges: int):
    """Yield int64 ``[k, 2]`` arrays of at most ``chunk_edges`` edges, parsed as :func:`read_edgelist` does."""
    with open(path, "r", newline=None, encoding="utf-8-sig") as f:
        skip, delim = _sniff(f, path, delimiter)
        f.seek(0)
        for _ in range(skip):
            f.readline()
        while True:
            lines = list(itertools.islice(f, chunk_edges))
            if not lines:
                return
            try:
                edges = np.loadtxt(lines, dtype=np.int64, delimiter=delim, comments=_COMMENTS, usecols=(0, 1),
                                   ndmin=2)
            except ValueError as e:
                raise ValueError(f"could not parse {str(path)!r} as an edge list of two integer columns "
                                 f"(delimiter {delim!r}): {e}") from e
            if edges.shape[0]:
                yield edges


def _open_npy(path: Path, dtype, shape) -> np.memmap:
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)


def convert_edgelist(
    path: PathLike,
    out: PathLike,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    delimiter: Optional[str] = "auto",
    feature_dim: int = 64,
    num_classes: int = 8,
    seed: int = 0,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    name: Optional[str] = None,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> ConversionReport:
    """Write the prepared dataset folder ``out`` from the edge list ``path``, in chunks (see the module doc).

    Options are :func:`load_edgelist`'s, with the same meaning and result; ``chunk_edges`` bounds the
    lines parsed and the edges sorted at once. Scratch files live in ``out`` and are removed.

    Example:
        >>> rep = convert_edgelist("edges.csv", "prepared/edges")    # doctest: +SKIP
        >>> ds = gsplit.datasets.load_folder(rep.folder)              # doctest: +SKIP
    """
    from gsplit.feature_store import first_non_finite_row

    if chunk_edges < 1:
        raise ValueError(f"chunk_edges must be a positive number of edges, got {chunk_edges}")
    if feature_dim < 1 or num_classes < 1:
        raise ValueError(f"feature_dim and num_classes must be positive, got {feature_dim} and {num_classes}")
    src_path = _existing_file(path, "edge list")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "meta.json").exists():
        (out / "meta.json").unlink()
    seconds: Dict[str, float] = {}
    scratch = out / ".edges.tmp"
    placed = out / ".indices.tmp"
    try:
        # ---- parse: text -> binary (src, dst) pairs; the sorted distinct ids
        t = time.perf_counter()
        ids = np.empty(0, dtype=np.int64)
        file_edges, chunks = 0, 0
        with open(scratch, "wb") as f:
            for edges in _read_chunks(src_path, delimiter, chunk_edges):
                f.write(np.ascontiguousarray(edges).tobytes())
                ids = np.union1d(ids, np.unique(edges))
                file_edges += edges.shape[0]
                chunks += 1
        if file_edges == 0:
            raise ValueError(f"edge list {str(src_path)!r} holds no edges")
        n = int(ids.size)
        seconds["parse"] = time.perf_counter() - t

        # ---- pass 1: remap ids in place, drop self loops, count in-degrees
        t = time.perf_counter()
        pairs = np.memmap(scratch, dtype=np.int64, mode="r+", shape=(file_edges, 2))
        degree = np.zeros(n, dtype=np.int64)
        for start in range(0, file_edges, chunk_edges):
            chunk = pairs[start:start + chunk_edges]
            chunk[:] = np.searchsorted(ids, chunk)
            src, dst = _directed(chunk, symmetric, remove_self_loops)
            degree += np.bincount(dst, minlength=n)
        pairs.flush()
        slots = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(degree, out=slots[1:])
        del degree
        total = int(slots[-1])
        seconds["degrees"] = time.perf_counter() - t

        # ---- pass 2: every source at its destination's next free slot
        t = time.perf_counter()
        indices = np.memmap(placed, dtype=np.int64, mode="w+", shape=(max(total, 1),))
        cursor = slots[:-1].copy()
        for start in range(0, file_edges, chunk_edges):
            src, dst = _directed(pairs[start:start + chunk_edges], symmetric, remove_self_loops)
            order = np.argsort(dst, kind="stable")
            dst_sorted = dst[order]
            first = np.searchsorted(dst_sorted, dst_sorted, side="left")  # first position of each row's run
            pos = cursor[dst_sorted] + (np.arange(dst_sorted.size) - first)
            indices[pos] = src[order]
            rows, counts = np.unique(dst_sorted, return_counts=True)
            cursor[rows] += counts
        del cursor, pairs
        seconds["place"] = time.perf_counter() - t

        # ---- pass 3: sort each row and drop repeats, compacting in place; then the final indptr/indices
        t = time.perf_counter()
        indptr = np.zeros(n + 1, dtype=np.int64)
        written, row = 0, 0
        while row < n:
            end = int(np.searchsorted(slots, slots[row] + chunk_edges, side="right")) - 1
            end = min(max(end, row + 1), n)  # whole rows; a row longer than a chunk is one block
            a, b = int(slots[row]), int(slots[end])
            deg = np.diff(slots[row:end + 1])
            key = np.repeat(np.arange(end - row, dtype=np.int64), deg) * n + indices[a:b]
            key.sort()
            if key.size:
                key = key[np.concatenate(([True], key[1:] != key[:-1]))]
            local = key // n
            indices[written:written + key.size] = key - local * n
            np.cumsum(np.bincount(local, minlength=end - row), out=indptr[row + 1:end + 1])
            indptr[row + 1:end + 1] += written
            written += key.size
            row = end
        del slots
        graph_dir = out / "graph"
        graph_dir.mkdir(exist_ok=True)
        final = _open_npy(graph_dir / "indices.npy", np.int64, (written,))
        for start in range(0, written, chunk_edges):
            stop = min(start + chunk_edges, written)
            final[start:stop] = indices[start:stop]
        final.flush()
        del final, indices
        os.unlink(placed)
        seconds["sort"] = time.perf_counter() - t
    finally:
        for tmp in (scratch, placed):
            if tmp.exists():
                tmp.unlink()

    atomic_save_npy(graph_dir / "indptr.npy", indptr)
    atomic_write_json(graph_dir / "meta.json", {"format": "gsplit-graph", "version": 1, "num_nodes": n,
                                                "num_edges": written})
    graph = Graph.load(graph_dir, mmap=True, validate=True)  # one pass: the converter's own output is checked

    # ---- features, labels, split: the values load_edgelist makes, features written straight to the file
    t = time.perf_counter()
    gen = torch.Generator().manual_seed(int(seed))
    feats = _open_npy(out / "features.npy", np.float32, (n, feature_dim))
    torch.randn(n, feature_dim, generator=gen, out=torch.from_numpy(feats))
    feats.flush()
    bad = first_non_finite_row(torch.from_numpy(feats))  # recorded as checked below: readers skip the scan
    del feats
    if bad is not None:
        raise RuntimeError(f"internal error: generated feature row {bad} is not finite")
    labels = torch.randint(num_classes, (n,), generator=gen, dtype=torch.int64)
    train, val, test = random_split(n, split_fractions, seed=seed)
    seconds["features"] = time.perf_counter() - t
    provenance = {"source": str(src_path), "format": "edgelist", "file_edges": int(file_edges),
                  "symmetric": symmetric, "remove_self_loops": remove_self_loops,
                  "split": f"random {tuple(split_fractions)} seed={seed}", "converted_in_chunks": int(chunk_edges)}
    arrays = {"labels.npy": labels.numpy(), "node_ids.npy": ids,
              **{f"{k}.npy": v.numpy() for k, v in zip(_SPLITS, (train, val, test))}}
    features_meta = torch.empty(0, feature_dim)  # only its width is read
    write_array_dir(out, arrays, folder_meta(graph, features_meta, name or src_path.stem, num_classes,
                                             True, True, ["node_ids"], provenance), default=str)
    report = ConversionReport(str(out), n, written, file_edges, chunks,
                              {k: round(v, 3) for k, v in seconds.items()}, peak_rss_bytes())
    log.info("converted %s -> %s: %d vertices, %d edges in %d chunk(s), %s", src_path, out, n, written, chunks,
             report.seconds)
    return report


def _directed(chunk: np.ndarray, symmetric: bool, remove_self_loops: bool):
    """(src, dst) of a chunk of remapped pairs, self loops dropped and reverses added as ``from_edges`` does."""
    src, dst = chunk[:, 0], chunk[:, 1]
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    return np.asarray(src), np.asarray(dst)
