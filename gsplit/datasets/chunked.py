"""Chunked edge list -> CSC conversion into a prepared dataset folder, never holding the edge list and
the CSC in memory at once: from a text edge list (:func:`convert_edgelist`) or an unpacked OGB
dataset folder (:func:`convert_ogb`).

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
split and node ids (tests/datasets/test_dataset_folder.py checks it, with duplicates, self loops and unsorted
input). Memory-mapped pages written by passes 2 and 3 are file pages: the kernel writes them back
and drops them under pressure, but they count in the resident size (``VmHWM``) while they are mapped.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Union

import numpy as np
import torch

from gsplit.datasets.base import random_split
from gsplit.datasets.files import _COMMENTS, _existing_file, _sniff
from gsplit.datasets.folder import _SPLITS, folder_meta
from gsplit.data.graph import Graph
from gsplit.runtime.io import atomic_save_npy, atomic_write_json, write_array_dir
from gsplit.runtime.resources import peak_rss_bytes

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


def ogb_labels_to_int64(raw: np.ndarray, name: str) -> torch.Tensor:
    """OGB labels are ``[N, 1]``; float with NaN for unlabelled vertices in papers100M. NaN -> -1.

    Example:
        >>> ogb_labels_to_int64(np.array([[1.0], [np.nan]]), "demo").tolist()
        [1, -1]
    """
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim != 1:
        raise ValueError(f"{name}: expected one label per vertex, got a label array of shape {raw.shape}")
    if np.issubdtype(raw.dtype, np.floating):
        out = np.full(raw.shape, -1, dtype=np.int64)
        ok = ~np.isnan(raw)
        out[ok] = raw[ok].astype(np.int64)
        return torch.from_numpy(out)
    return torch.from_numpy(raw.astype(np.int64))


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
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    _reserve(path)
    return arr


def _reserve(path: Path) -> None:
    """Allocate ``path``'s blocks on disk now. A memory map over a sparse file dies of SIGBUS at the first
    page a full disk cannot back (no message, no cleanup); reserved first, a full disk is an ``OSError``
    (ENOSPC) naming the file. File systems without ``fallocate`` keep the sparse file."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise OSError(e.errno, f"{e.strerror}: {size:,} bytes needed", str(path)) from None
                # EOPNOTSUPP / EINVAL: this file system cannot reserve; the map stays sparse
    finally:
        os.close(fd)


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
    from gsplit.data.finite import first_non_finite_row

    if chunk_edges < 1:
        raise ValueError(f"chunk_edges must be a positive number of edges, got {chunk_edges}")
    if feature_dim < 1 or num_classes < 1:
        raise ValueError(f"feature_dim and num_classes must be positive, got {feature_dim} and {num_classes}")
    src_path = _existing_file(path, "edge list")
    out = _fresh_folder(out)
    seconds: Dict[str, float] = {}
    csc = _write_csc(_read_chunks(src_path, delimiter, chunk_edges), out, None, symmetric, remove_self_loops,
                     chunk_edges, f"edge list {str(src_path)!r}", seconds)
    ids, n, written, file_edges, chunks = csc
    graph = Graph.load(out / "graph", mmap=True, validate=True)  # one pass: the converter's own output is checked

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
                                             True, True, ["node_ids"], provenance), default=str, stamp=True)
    report = ConversionReport(str(out), n, written, file_edges, chunks,
                              {k: round(v, 3) for k, v in seconds.items()}, peak_rss_bytes())
    log.info("converted %s -> %s: %d vertices, %d edges in %d chunk(s), %s", src_path, out, n, written, chunks,
             report.seconds)
    return report


OGB_NUM_CLASSES = {"ogbn-arxiv": 40, "ogbn-products": 47, "ogbn-papers100M": 172}
"""``num classes`` of OGB's ``master.csv`` for the datasets :func:`convert_ogb` knows (others: max label + 1)."""


def _csv_gz_chunks(path: Path, rows: int, dtype=None):
    """``[k, columns]`` arrays of a headerless OGB ``.csv.gz``, ``rows`` lines at a time, parsed as ogb does
    (pandas, then cast), so that the values equal :func:`load_ogb`'s."""
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError("reading OGB's .csv.gz files needs pandas: pip install gsplit[ogb]") from e
    with pd.read_csv(path, compression="gzip", header=None, chunksize=rows) as reader:
        for frame in reader:
            values = frame.values
            yield values if dtype is None else values.astype(dtype)


def convert_ogb(
    dataset_dir: PathLike,
    out: PathLike,
    *,
    name: Optional[str] = None,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> ConversionReport:
    """Write the prepared dataset folder ``out`` from an OGB node-property dataset folder's raw files, in chunks.

    ``dataset_dir`` is the unpacked OGB folder (``.../ogbn_papers100M`` with ``raw/edge.csv.gz``,
    ``raw/num-node-list.csv.gz``, ``raw/node-feat.csv.gz``, ``raw/node-label.csv.gz`` and
    ``split/<kind>/{train,valid,test}.csv.gz``). The graph goes through the chunked CSC build (see the
    module doc), the features are parsed ``chunk_edges`` values at a time straight into
    ``features.npy``; neither ogb's processing (which holds everything at once) nor its package is
    used. ``symmetric`` and ``remove_self_loops`` mean what they mean for :func:`load_ogb`, and the
    folder holds what ``load_ogb`` returns.

    Example:
        >>> convert_ogb("/data/ogb/ogbn_papers100M", "prepared/papers100M")    # doctest: +SKIP
    """
    from gsplit.data.finite import first_non_finite_row

    if chunk_edges < 1:
        raise ValueError(f"chunk_edges must be a positive number of edges, got {chunk_edges}")
    src_dir = Path(dataset_dir).expanduser()
    raw = src_dir / "raw"
    needed = [raw / f for f in ("edge.csv.gz", "num-node-list.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")]
    missing = [str(f) for f in needed if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{src_dir} is not an unpacked OGB node-property dataset: {missing} missing; "
                                f"pass the folder that holds raw/ and split/")
    kinds = sorted(d for d in (src_dir / "split").glob("*") if d.is_dir()) if (src_dir / "split").is_dir() else []
    if len(kinds) != 1:
        raise FileNotFoundError(f"{src_dir / 'split'} must hold one split folder (e.g. time/), found "
                                f"{[d.name for d in kinds]}")
    name = name or src_dir.name.replace("_", "-")
    n = int(next(_csv_gz_chunks(raw / "num-node-list.csv.gz", 1, np.int64))[0, 0])
    out = _fresh_folder(out)
    seconds: Dict[str, float] = {}
    _, n, written, file_edges, chunks = _write_csc(
        _csv_gz_chunks(raw / "edge.csv.gz", chunk_edges, np.int64), out, n, symmetric, remove_self_loops,
        chunk_edges, f"{raw / 'edge.csv.gz'}", seconds)
    graph = Graph.load(out / "graph", mmap=True, validate=True)

    t = time.perf_counter()
    feats, row = None, 0
    for block in _csv_gz_chunks(raw / "node-feat.csv.gz", max(1, chunk_edges // 64), np.float32):
        if feats is None:
            feats = _open_npy(out / "features.npy", np.float32, (n, block.shape[1]))
        if row + block.shape[0] > n:
            raise ValueError(f"{raw / 'node-feat.csv.gz'} has more than {n} rows (the vertex count)")
        feats[row:row + block.shape[0]] = block
        row += block.shape[0]
    if feats is None or row != n:
        raise ValueError(f"{raw / 'node-feat.csv.gz'} has {row} rows but the graph has {n} vertices")
    feats.flush()
    bad = first_non_finite_row(torch.from_numpy(feats))
    dim = feats.shape[1]
    del feats
    if bad is not None:
        raise ValueError(f"{raw / 'node-feat.csv.gz'} row {bad} holds NaN or inf; clean the features")
    labels = ogb_labels_to_int64(np.concatenate(list(_csv_gz_chunks(raw / "node-label.csv.gz", 1 << 22))), name)
    splits = [np.concatenate(list(_csv_gz_chunks(kinds[0] / f"{k}.csv.gz", 1 << 22, np.int64))).reshape(-1)
              for k in ("train", "valid", "test")]
    seconds["features"] = time.perf_counter() - t
    num_classes = OGB_NUM_CLASSES.get(name, int(labels.max()) + 1 if labels.numel() else 1)
    provenance = {"source": str(src_dir), "format": "ogb", "symmetric": symmetric,
                  "remove_self_loops": remove_self_loops, "split": f"official ({kinds[0].name})",
                  "converted_in_chunks": int(chunk_edges)}
    arrays = {"labels.npy": labels.numpy(), **{f"{k}.npy": v for k, v in zip(_SPLITS, splits)}}
    write_array_dir(out, arrays, folder_meta(graph, torch.empty(0, dim), name, num_classes, False, False, [],
                                             provenance), default=str, stamp=True)
    from gsplit.datasets.folder import load_folder

    load_folder(out)  # labels in range, splits labelled and disjoint: the Dataset checks, on the mapped files
    report = ConversionReport(str(out), n, written, file_edges, chunks,
                              {k: round(v, 3) for k, v in seconds.items()}, peak_rss_bytes())
    log.info("converted %s -> %s: %d vertices, %d edges in %d chunk(s), %s", src_dir, out, n, written, chunks,
             report.seconds)
    return report


def _fresh_folder(out: PathLike) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "meta.json").exists():  # old metadata must not describe the new arrays if this write dies midway
        (out / "meta.json").unlink()
    return out


def _write_csc(chunk_source: Iterable[np.ndarray], out: Path, num_nodes: Optional[int], symmetric: bool,
               remove_self_loops: bool, chunk_edges: int, what: str, seconds: Dict[str, float]):
    """Passes 1-4 of the module doc: ``out/graph`` from ``[k, 2]`` (src, dst) chunks.

    ``num_nodes=None`` remaps the ids to ``0..N-1`` in increasing order (and returns them); otherwise ids
    must lie in ``[0, num_nodes)``. Returns ``(ids or None, N, edges written, edge lines, chunks)`` and
    adds each pass's wall seconds to ``seconds``.
    """
    scratch = out / ".edges.tmp"
    placed = out / ".indices.tmp"
    try:
        # ---- parse: text -> binary (src, dst) pairs; the sorted distinct ids
        t = time.perf_counter()
        ids = np.empty(0, dtype=np.int64)
        file_edges, chunks = 0, 0
        with _naming_the_file(scratch), open(scratch, "wb") as f:
            for edges in chunk_source:
                if num_nodes is None:
                    ids = np.union1d(ids, np.unique(edges))
                elif edges.size and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
                    bad = int(edges.min()) if int(edges.min()) < 0 else int(edges.max())
                    raise ValueError(f"{what} holds vertex id {bad} outside [0, {num_nodes}) (its vertex count)")
                f.write(np.ascontiguousarray(edges, dtype=np.int64).tobytes())
                file_edges += edges.shape[0]
                chunks += 1
        if file_edges == 0:
            raise ValueError(f"{what} holds no edges")
        n = int(ids.size) if num_nodes is None else int(num_nodes)
        seconds["parse"] = time.perf_counter() - t

        # ---- pass 1: remap ids in place, drop self loops, count in-degrees
        t = time.perf_counter()
        pairs = np.memmap(scratch, dtype=np.int64, mode="r+", shape=(file_edges, 2))
        degree = np.zeros(n, dtype=np.int64)
        for start in range(0, file_edges, chunk_edges):
            chunk = pairs[start:start + chunk_edges]
            if num_nodes is None:
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
        _reserve(placed)
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
    return (ids if num_nodes is None else None), n, written, file_edges, chunks


@contextlib.contextmanager
def _naming_the_file(path: Path):
    """An ``OSError`` without a file name (``write`` on a full disk) gets ``path``'s."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def _directed(chunk: np.ndarray, symmetric: bool, remove_self_loops: bool):
    """(src, dst) of a chunk of remapped pairs, self loops dropped and reverses added as ``from_edges`` does."""
    src, dst = chunk[:, 0], chunk[:, 1]
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    return np.asarray(src), np.asarray(dst)
