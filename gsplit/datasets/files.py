"""Loaders for graphs stored in files: gnn-benchmark ``.npz`` (Cora, CiteSeer, ...) and plain edge lists."""

from __future__ import annotations

import logging
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch

from gsplit.datasets.base import Dataset, planetoid_split, random_split
from gsplit.data.graph import Graph

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

# Field separators tried, in order, on the first data line of an edge list (None = any whitespace).
_DELIMITERS = (",", "\t", ";")
_COMMENTS = ("#", "%")


def _existing_file(path: PathLike, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{what} file {str(p)!r} does not exist (or is not a file); check the path")
    return p


# ---------------------------------------------------------------------------------- npz
def _csr(arrays, prefix: str, p: Path):
    """The CSR matrix stored as ``{prefix}_data/_indices/_indptr/_shape``, checked so that a bad entry is
    one line naming the file and the array, not scipy's message."""
    import scipy.sparse as sp

    fix = "the file is damaged or not in the gnn-benchmark layout: write it again"
    names = [f"{prefix}_{k}" for k in ("data", "indices", "indptr", "shape")]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ValueError(f"{str(p)!r} lacks {missing}; {fix}")
    data, indices, indptr, shape = (np.asarray(arrays[n]) for n in names)
    if shape.shape != (2,) or shape.dtype.kind not in "iu" or (shape < 0).any():
        raise ValueError(f"{str(p)!r}: {prefix}_shape is {shape.tolist()}, expected two non-negative integers; {fix}")
    rows, cols = int(shape[0]), int(shape[1])
    for name, arr in ((f"{prefix}_indices", indices), (f"{prefix}_indptr", indptr)):
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"{str(p)!r}: {name} must be a 1-D integer array, got shape {arr.shape} dtype "
                             f"{arr.dtype}; {fix}")
    if len(indptr) != rows + 1 or (len(indptr) and (indptr[0] != 0 or indptr[-1] != len(indices)))\
            or (np.diff(indptr) < 0).any() or len(data) != len(indices):
        raise ValueError(f"{str(p)!r}: {prefix}_indptr (length {len(indptr)}) does not describe {rows} rows over "
                         f"{len(indices)} entries of {prefix}_indices ({len(data)} in {prefix}_data); {fix}")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= cols):
        bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
        raise ValueError(f"{str(p)!r}: {prefix}_indices holds {bad}, outside [0, {cols}) of {prefix}_shape "
                         f"{[rows, cols]}; {fix}")
    return sp.csr_matrix((data, indices, indptr), shape=(rows, cols))


def load_npz(
    path: PathLike,
    *,
    split: str = "planetoid",
    split_seed: int = 0,
    train_per_class: int = 20,
    num_val: int = 500,
    num_test: int = 1000,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    symmetric: bool = True,
    remove_self_loops: bool = True,
    normalize_features: bool = False,
    name: Optional[str] = None,
) -> Dataset:
    """Load a graph in the gnn-benchmark / nettack CSR ``.npz`` format (e.g. Cora, CiteSeer).

    The file holds the adjacency as CSR pieces ``adj_data, adj_indices, adj_indptr, adj_shape``
    (row = source), features as ``attr_data, attr_indices, attr_indptr, attr_shape`` (or a dense
    ``attr_matrix``) and integer ``labels``. Pickled entries (``idx_to_node``, ...) are never loaded.

    Citation graphs are directed; as is standard for GNN training on them the graph is made symmetric
    (``symmetric=True``), repeated edges are dropped and self-loops removed (``remove_self_loops=True``:
    GNN layers add their own self path). Features are dense float32, left as stored unless
    ``normalize_features=True`` divides each row by its sum (the GCN paper's preprocessing; all-zero rows
    stay zero). The default is off so the data are used as published.

    Split: ``"planetoid"`` (default) takes ``train_per_class`` vertices per class, ``num_val`` and
    ``num_test`` at random with ``split_seed``; ``"random"`` is a seeded ``split_fractions`` split.

    Example:
        >>> ds = load_npz("../shared/data/cora.npz")            # doctest: +SKIP
        >>> ds.num_nodes, ds.num_classes, ds.train_idx.numel()  # doctest: +SKIP
        (2708, 7, 140)
    """
    p = _existing_file(path, "npz")
    if not zipfile.is_zipfile(p):  # np.load would call a text file "pickled data" (it is neither)
        raise ValueError(f"{str(p)!r} is not an .npz archive (a zip of .npy arrays); for a text edge list use "
                         f"--dataset edgelist:{p}")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k.startswith(("adj_", "attr_", "labels"))}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # truncated or not a zip
        raise ValueError(f"could not read {str(p)!r} as a numpy .npz archive ({type(e).__name__}: {e}); "
                         f"the file is truncated or not an .npz: download or write it again") from None
    missing = [k for k in ("adj_data", "adj_indices", "adj_indptr", "adj_shape") if k not in arrays]
    if missing:
        raise ValueError(f"{str(p)!r} lacks {missing}: expected the gnn-benchmark CSR layout "
                         "(adj_data, adj_indices, adj_indptr, adj_shape, attr_*, labels)")
    adj = _csr(arrays, "adj", p)
    graph = Graph.from_scipy(adj, symmetric=symmetric, remove_self_loops=remove_self_loops)
    n = graph.num_nodes

    synthetic_features = False
    if "attr_data" in arrays:
        attr = _csr(arrays, "attr", p)
        feats = attr.astype(np.float32).toarray()
    elif "attr_matrix" in arrays:
        feats = np.asarray(arrays["attr_matrix"], dtype=np.float32)
    else:
        log.warning("%s has no features; using random N(0, 1) features of width 64 (flagged synthetic)", p)
        feats = torch.randn(n, 64, generator=torch.Generator().manual_seed(split_seed)).numpy()
        synthetic_features = True
    if feats.shape[0] != n:
        raise ValueError(f"{str(p)!r}: features have {feats.shape[0]} rows but the adjacency has {n} vertices")
    features = torch.from_numpy(np.ascontiguousarray(feats))
    if normalize_features:
        row_sum = features.sum(dim=1, keepdim=True)
        features = features / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)

    if "labels" not in arrays:
        raise ValueError(f"{str(p)!r} has no 'labels' array; this loader needs node labels")
    raw_labels = np.asarray(arrays["labels"])
    if raw_labels.ndim != 1 or not np.issubdtype(raw_labels.dtype, np.integer):
        raise ValueError(f"{str(p)!r}: labels must be a 1-D integer array (one class per vertex), got "
                         f"shape {raw_labels.shape} dtype {raw_labels.dtype}")
    if raw_labels.shape[0] != n:
        raise ValueError(f"{str(p)!r}: labels has {raw_labels.shape[0]} entries but the adjacency has {n} vertices; "
                         f"pass one label per vertex (-1 for unlabelled)")
    if raw_labels.size and (int(raw_labels.min()) < -1 or int(raw_labels.max()) >= n):
        # checked before the split: the class count sizes per-class arrays (a label of 1e12: an 8 TB allocation)
        bad = int(raw_labels.min()) if int(raw_labels.min()) < -1 else int(raw_labels.max())
        row = int(np.flatnonzero(raw_labels == bad)[0])
        raise ValueError(f"{str(p)!r}: labels[{row}] = {bad}, but classes must be numbered 0..C-1 (C at most the {n} "
                         f"vertices; -1 marks an unlabelled vertex); renumber the classes")
    labels = torch.from_numpy(raw_labels.astype(np.int64))
    num_classes = int(labels.max()) + 1 if labels.numel() else 1

    if split == "planetoid":
        train, val, test = planetoid_split(labels, num_classes, train_per_class, num_val, num_test, seed=split_seed)
        split_desc = f"planetoid {train_per_class}/class + {num_val} val + {num_test} test, seed={split_seed}"
    elif split == "random":
        train, val, test = random_split(n, split_fractions, seed=split_seed, labels=labels)
        split_desc = f"random {tuple(split_fractions)} seed={split_seed}"
    else:
        raise ValueError(f"split must be 'planetoid' or 'random', got {split!r}")

    ds = Dataset(graph=graph, features=features, labels=labels, train_idx=train, val_idx=val, test_idx=test,
                 num_classes=num_classes, name=name or p.stem, synthetic_features=synthetic_features,
                 meta={"source": str(p), "format": "npz", "symmetric": symmetric,
                       "remove_self_loops": remove_self_loops, "normalize_features": normalize_features,
                       "split": split_desc})
    log.info("loaded %r", ds)
    return ds


# ---------------------------------------------------------------------------------- edge lists
def read_edgelist(path: PathLike, delimiter: Optional[str] = "auto") -> np.ndarray:
    """Read the first two integer columns of an edge list into an int64 array of shape ``[E, 2]``.

    Accepts comma, tab, semicolon or whitespace separated fields (``delimiter="auto"`` detects it from
    the first data line; pass ``None`` for whitespace), an optional header line (detected when its first
    two fields are not integers), ``#``/``%`` comment lines, LF, CRLF or bare-CR line ends and a UTF-8
    byte-order mark. Further columns (weights, timestamps) are ignored.

    Example:
        >>> read_edgelist("edges.csv")   # doctest: +SKIP
        array([[1394, 2778], ...])
    """
    p = _existing_file(path, "edge list")
    # newline=None: Python's universal newlines turn "\r\n" and bare "\r" into "\n" before numpy parses
    try:
        with open(p, "r", newline=None, encoding="utf-8-sig") as f:
            skip, delim = _sniff(f, p, delimiter)
            f.seek(0)
            try:
                edges = np.loadtxt(f, dtype=np.int64, delimiter=delim, comments=_COMMENTS, skiprows=skip,
                                   usecols=(0, 1), ndmin=2)
            except ValueError as e:
                f.seek(0)
                raise ValueError(f"could not parse {str(p)!r} as an edge list of two integer columns "
                                 f"(delimiter {delim!r}, {skip} header line(s) skipped): "
                                 f"{_first_bad_line(f, delim, skip, 2, int) or e}") from None
    except UnicodeDecodeError as e:  # binary data: the codec's own message does not name the file
        raise ValueError(f"{str(p)!r} is not a text edge list: it holds bytes that are not UTF-8 text "
                         f"({e.reason} at byte {e.start}); pass a text file with 'src<sep>dst' per line") from None
    if edges.shape[0] == 0:
        raise ValueError(f"edge list {str(p)!r} holds no edges")
    return edges


def _first_bad_line(f, delim: Optional[str], skip: int, fields: int, conv, every: bool = False) -> Optional[str]:
    """``"line 7 (1-based, in the file): '3,x': 'x' is not an integer"``: the first line after ``skip`` whose first
    ``fields`` fields (``every``: all its fields, as many as the first line's) ``conv`` cannot read; numpy's own
    message counts rows after the skipped and comment lines, from 0. ``None`` where every line reads."""
    width = None
    for lineno, line in enumerate(f, start=1):
        text = line.strip()
        if lineno <= skip or not text or text.startswith(_COMMENTS):
            continue
        parts = [x.strip() for x in (text.split(delim) if delim is not None else text.split())]
        where = f"line {lineno} (1-based, in the file): {text[:60]!r}"
        if len(parts) < fields:
            return f"{where} has {len(parts)} field(s), not {fields}"
        if every:
            width = len(parts) if width is None else width
            if len(parts) != width:
                return f"{where} has {len(parts)} field(s), the lines before it {width}"
        for part in parts if every else parts[:fields]:
            try:
                conv(part)
            except ValueError:
                return f"{where}: {part[:30]!r} is not {'an integer' if conv is int else 'a number'}"
    return None


def _sniff(f, p: Path, delimiter: Optional[str]) -> Tuple[int, Optional[str]]:
    """(lines to skip, delimiter) from the first non-blank, non-comment line."""
    for lineno, line in enumerate(f):
        s = line.strip()
        if not s or s.startswith(_COMMENTS):
            continue
        delim = delimiter
        if delim == "auto":
            delim = next((d for d in _DELIMITERS if d in s), None)
        fields = [x.strip() for x in (s.split(delim) if delim is not None else s.split())]
        if len(fields) < 2:
            raise ValueError(f"{str(p)!r} line {lineno + 1} ({s[:60]!r}) has fewer than two fields with "
                             f"delimiter {delim!r}; an edge list needs 'src<sep>dst' per line")
        try:
            int(fields[0]), int(fields[1])
        except ValueError:
            return lineno + 1, delim  # a header: skip through it
        return lineno, delim
    raise ValueError(f"edge list {str(p)!r} holds no edges (only blank, comment or no lines)")


def load_edgelist(
    path: PathLike,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    delimiter: Optional[str] = "auto",
    feature_dim: int = 64,
    num_classes: int = 8,
    seed: int = 0,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    name: Optional[str] = None,
    features: Optional[PathLike] = None,
    labels: Optional[PathLike] = None,
) -> Dataset:
    """Load an edge list file (see :func:`read_edgelist` for the accepted formats) as a :class:`Dataset`.

    Vertex ids may be any integers (e.g. gene ids up to ~1e14); they are remapped to ``0..N-1`` in
    increasing order of the original id, and ``Dataset.node_ids`` keeps the original id of every vertex.
    ``symmetric=True`` (default) adds the reverse of each edge; repeated edges are always dropped and
    self-loops by default. Edge lists carry no features or labels, so seeded random ones are made
    (``feature_dim`` N(0, 1) features, ``num_classes`` uniform labels), flagged ``synthetic_features``
    and ``synthetic_labels`` and logged as a warning: accuracy on them is meaningless, timings are not.
    Split: seeded random ``split_fractions`` (of the labelled vertices).

    ``features`` and ``labels`` name files with the vertices' real features and labels instead (CLI:
    ``-D features=feat.npy -D labels=labels.npy``; see :func:`read_vertex_file`): row ``r`` of each belongs to
    the vertex whose id in the edge list is ``r``, so the files need more rows than the largest id; a label
    of -1 marks an unlabelled vertex (in no split). With a labels file ``num_classes`` is the largest label
    + 1, with a features file ``feature_dim`` its width.

    Example:
        >>> ds = load_edgelist("../shared/data/bio-pathways-network.csv")   # doctest: +SKIP
        >>> ds.num_nodes, ds.synthetic_labels                               # doctest: +SKIP
        (21557, True)
        >>> ds = load_edgelist("edges.csv", features="feat.npy", labels="labels.txt")  # doctest: +SKIP
    """
    if feature_dim < 1 or num_classes < 1:
        raise ValueError(f"feature_dim and num_classes must be positive, got {feature_dim} and {num_classes}")
    p = Path(path).expanduser()
    edges = read_edgelist(p, delimiter)
    ids, inverse = np.unique(edges.ravel(), return_inverse=True)
    inverse = inverse.reshape(-1, 2)
    n = int(ids.size)
    graph = Graph.from_edges(inverse[:, 0], inverse[:, 1], num_nodes=n, symmetric=symmetric,
                             remove_duplicates=True, remove_self_loops=remove_self_loops)
    gen = torch.Generator().manual_seed(int(seed))
    feature_rows = torch.randn(n, feature_dim, generator=gen)
    label_rows = torch.randint(num_classes, (n,), generator=gen, dtype=torch.int64)
    files = {}
    if features is not None:
        feature_rows = torch.from_numpy(read_vertex_file(features, ids, "features"))
        files["features"] = str(features)
    if labels is not None:
        label_rows = torch.from_numpy(read_vertex_file(labels, ids, "labels"))
        num_classes = max(1, int(label_rows.max()) + 1)
        files["labels"] = str(labels)
    train, val, test = random_split(n, split_fractions, seed=seed, labels=label_rows if labels is not None else None)
    ds = Dataset(graph=graph, features=feature_rows, labels=label_rows, train_idx=train, val_idx=val, test_idx=test,
                 num_classes=num_classes, name=name or p.stem, synthetic_features=features is None,
                 synthetic_labels=labels is None, node_ids=torch.from_numpy(ids.astype(np.int64)),
                 meta={"source": str(p), "format": "edgelist", "file_edges": int(edges.shape[0]),
                       "symmetric": symmetric, "remove_self_loops": remove_self_loops,
                       "split": f"random {tuple(split_fractions)} seed={seed}", **files})
    if features is None or labels is None:
        made = " and ".join(w for w, given in ((f"random features (dim {feature_dim})", features),
                                               (f"random labels ({num_classes} classes)", labels)) if given is None)
        log.warning("%s: no %s file given (-D features=FILE, -D labels=FILE): using %s, seed %d; accuracy on "
                    "random %s is meaningless", p, " or ".join(k for k in ("features", "labels") if k not in files),
                    made, seed, "labels" if labels is None else "features")
    log.info("loaded %r", ds)
    return ds


def read_vertex_file(path: PathLike, ids: np.ndarray, what: str) -> np.ndarray:
    r"""The rows ``ids`` of a per-vertex ``features`` (float32 ``[rows, dim]``) or ``labels`` (int64 ``[rows]``,
    -1: unlabelled) file: a ``.npy`` array, or text with one vertex a line (numbers separated by commas, tabs,
    semicolons or spaces; ``#``/``%`` comments). Row ``r`` is the vertex with id ``r``.

    A mistake is one ``ValueError`` naming the file: a line that is not numbers (its 1-based line number), too
    few rows for the largest id, a label below -1.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "labels.txt"
        >>> _ = f.write_text("0\n2\n1\n")
        >>> read_vertex_file(f, np.array([0, 2]), "labels").tolist()
        [0, 1]
    """
    p = _existing_file(path, what)
    features = what == "features"
    dtype = np.float32 if features else np.int64
    if p.suffix == ".npy":
        try:
            arr = np.load(p, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"{what} file {str(p)!r} is not a readable .npy array ({e}); write it with numpy.save")
        if arr.dtype.kind not in ("fiu" if features else "iu"):
            raise ValueError(f"{what} file {str(p)!r} holds {arr.dtype}; expected "
                             + ("numbers" if features else "integer classes"))
    else:
        arr = _read_vertex_text(p, what, dtype)
    if not features and arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != (2 if features else 1):
        raise ValueError(f"{what} file {str(p)!r} has shape {list(arr.shape)}; expected "
                         + ("[vertices, dim]" if features else "[vertices] (one label a vertex)"))
    top = int(ids.max()) if ids.size else -1
    if ids.size and (int(ids.min()) < 0 or top >= arr.shape[0]):
        bad = int(ids.min()) if int(ids.min()) < 0 else top
        raise ValueError(f"{what} file {str(p)!r} has {arr.shape[0]:,} rows but the edge list has vertex id {bad}; "
                         f"row r of the file belongs to the vertex with id r: give a row for every id from 0 to "
                         f"{top}, or renumber the edge list's ids to 0..N-1")
    rows = np.ascontiguousarray(arr[ids], dtype=dtype)
    if what == "labels" and rows.size and int(rows.min()) < -1:
        raise ValueError(f"labels file {str(p)!r} holds {int(rows.min())}; labels are classes 0..C-1, or -1 for "
                         "an unlabelled vertex")
    return rows


def _read_vertex_text(p: Path, what: str, dtype) -> np.ndarray:
    """A text file of numbers, one vertex a line, delimiter sniffed as :func:`read_edgelist` does (no header)."""
    conv, kind = (int, "integers") if what == "labels" else (float, "numbers")
    try:
        with open(p, "r", newline=None, encoding="utf-8-sig") as f:
            first = next((line.strip() for line in f if line.strip() and not line.strip().startswith(_COMMENTS)), "")
            delim = next((d for d in _DELIMITERS if d in first), None)
            f.seek(0)
            try:
                return np.loadtxt(f, dtype=dtype, delimiter=delim, comments=_COMMENTS, ndmin=2)
            except ValueError as e:
                f.seek(0)
                where = _first_bad_line(f, delim, 0, 1, conv, every=True)
                raise ValueError(f"could not parse {what} file {str(p)!r} as {kind}, one vertex a line: "
                                 f"{where or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} file {str(p)!r} is neither a .npy array nor text ({e.reason} at byte {e.start}); "
                         "pass a .npy file or a text file with one vertex a line") from None
