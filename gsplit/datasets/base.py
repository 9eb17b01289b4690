"""The :class:`Dataset` every loader returns, its validation, and the train/val/test split helpers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from gsplit.data.finite import check_finite, known_finite
from gsplit.data.graph import Graph
from gsplit.data.precision import FEATURE_DTYPES

log = logging.getLogger(__name__)


@dataclass
class Dataset:
    """A node-classification dataset: graph, features, labels and a train/val/test split.

    Built by :func:`gsplit.datasets.load`; construction validates everything (ids in range, labels in
    range, finite features, matching lengths) and raises ``ValueError`` naming the bad value.

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0)
        >>> ds.features.shape[0] == ds.graph.num_nodes
        True
    """

    graph: Graph
    """The graph, CSC in-edges (see :class:`gsplit.Graph`)."""
    features: torch.Tensor
    """float32, bfloat16 or float16 ``[num_nodes, feature_dim]``: input features, one row per vertex (half precision
    halves their memory; a model upcasts them at its first layer: :mod:`gsplit.data.precision`)."""
    labels: torch.Tensor
    """int64 ``[num_nodes]``: class of every vertex in ``[0, num_classes)``, or -1 for an unlabelled vertex."""
    train_idx: torch.Tensor
    """int64: ids of the training vertices (all labelled, disjoint from val/test)."""
    val_idx: torch.Tensor
    """int64: ids of the validation vertices."""
    test_idx: torch.Tensor
    """int64: ids of the test vertices."""
    num_classes: int
    """Number of classes; labels lie in ``[0, num_classes)``."""
    name: str
    """Short name for logs and reports, e.g. ``"synthetic"``, ``"cora"``, ``"ogbn-arxiv"``."""
    synthetic_features: bool = False
    """True when ``features`` were generated at random (the source had none), not read from data."""
    synthetic_labels: bool = False
    """True when ``labels`` were generated at random (the source had none), so accuracy means nothing."""
    node_ids: Optional[torch.Tensor] = None
    """int64 ``[num_nodes]``: the source file's id of every vertex when the loader renumbered them (an edge
    list's ids, 1-based or ~1e12, become ``0..N-1``), else None (the vertex index is the source's id).
    :meth:`source_ids` and :meth:`vertices` translate; ``gsplit predict`` and ``eval --ids`` speak these ids."""
    communities: Optional[torch.Tensor] = None
    """int64 ``[num_nodes]``: planted community of every vertex (synthetic graphs only), else None."""
    meta: Dict[str, Any] = field(default_factory=dict)
    """Provenance for logs and reports (source path, generator parameters, split kind)."""

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ properties
    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` saying what is wrong if the parts do not fit together."""
        if not isinstance(self.graph, Graph):
            raise TypeError(f"Dataset.graph must be a gsplit.Graph, got {type(self.graph).__name__}")
        n = self.graph.num_nodes
        _check_tensor(self.features, "features", tuple(FEATURE_DTYPES.values()), 2)
        _check_tensor(self.labels, "labels", torch.int64, 1)
        if self.features.shape[0] != n:
            raise ValueError(f"features has {self.features.shape[0]} rows but the graph has {n} vertices; "
                             "pass one feature row per vertex")
        if self.labels.shape[0] != n:
            raise ValueError(f"labels has {self.labels.shape[0]} entries but the graph has {n} vertices; "
                             "pass one label per vertex (-1 for unlabelled)")
        if not isinstance(self.num_classes, (int, np.integer)) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {self.num_classes!r}")
        self.num_classes = int(self.num_classes)
        if self.labels.numel():
            lo, hi = int(self.labels.min()), int(self.labels.max())
            if lo < -1 or hi >= self.num_classes:
                bad = lo if lo < -1 else hi
                row = int(torch.nonzero(self.labels == bad)[0])
                raise ValueError(f"labels[{row}] = {bad} is outside [0, {self.num_classes}) "
                                 "(-1 marks an unlabelled vertex); fix the labels or num_classes")
        if not known_finite(self.features):  # a prepared folder's writer scanned it (datasets.folder)
            check_finite(self.features, "features")  # not marked: the loaders check again (cheap), as features
            # normalised in place after loading (a zero std) may have become NaN
        counts = torch.zeros(n, dtype=torch.int32)
        for what in ("train_idx", "val_idx", "test_idx"):
            idx = getattr(self, what)
            _check_tensor(idx, what, torch.int64, 1)
            self.graph.check_ids(idx, what)
            unlabelled = self.labels[idx] < 0
            if bool(unlabelled.any()):
                v = int(idx[unlabelled][0])
                raise ValueError(f"{what} contains vertex {v} which has no label (-1); "
                                 "splits may only hold labelled vertices")
            counts.index_add_(0, idx, torch.ones(idx.numel(), dtype=torch.int32))
        if bool((counts > 1).any()):
            v = int(torch.nonzero(counts > 1)[0])
            raise ValueError(f"vertex {v} appears more than once in train_idx/val_idx/test_idx; "
                             "the splits must be disjoint and free of repeats")
        for what in ("node_ids", "communities"):
            t = getattr(self, what)
            if t is not None:
                _check_tensor(t, what, torch.int64, 1)
                if t.shape[0] != n:
                    raise ValueError(f"{what} has {t.shape[0]} entries but the graph has {n} vertices")

    # ------------------------------------------------------------------ the source's vertex ids
    def source_ids(self, vertices: torch.Tensor) -> torch.Tensor:
        """The source's own ids of ``vertices`` (indices ``0..N-1``): :attr:`node_ids` at them, or the indices
        themselves when the loader kept the source's numbering.

        Example:
            >>> ds = _renumbered_example()
            >>> ds.source_ids(torch.tensor([0, 2])).tolist()
            [10, 1000000000000]
        """
        vertices = torch.as_tensor(vertices, dtype=torch.int64)
        return vertices.clone() if self.node_ids is None else self.node_ids[vertices]

    def vertices(self, ids, what: str = "vertex ids") -> torch.Tensor:
        """Vertex indices (``0..N-1``) of the source's own ids ``ids`` (the inverse of :meth:`source_ids`);
        ``ValueError`` naming the ids the dataset does not have, how many, and what ids it has.

        Example:
            >>> ds = _renumbered_example()
            >>> ds.vertices([1000000000000, 10]).tolist()
            [2, 0]
            >>> ds.vertices([11, 12], "--ids ids.txt")
            Traceback (most recent call last):
            ...
            ValueError: --ids ids.txt: 2 of 2 ids are not vertices of dataset 'example' (e.g. 11, 12); its vertex ids are those of its source file (node_ids: 3 ids from 10 to 1000000000000)
        """
        t = torch.as_tensor(np.asarray(ids)) if not isinstance(ids, torch.Tensor) else ids
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.dim() != 1:
            raise ValueError(f"{what} must be a 1-D array of integer vertex ids, got {t.dtype} of shape "
                             f"{tuple(t.shape)}")
        t = t.to(torch.int64)
        if self.node_ids is None:
            self.graph.check_ids(t, what)
            return t
        order = torch.argsort(self.node_ids)
        known = self.node_ids[order]
        if known.numel() == 0:
            pos, found = t, torch.zeros_like(t, dtype=torch.bool)
        else:
            pos = torch.searchsorted(known, t).clamp_max(known.numel() - 1)
            found = known[pos] == t
        if not bool(found.all()):
            missing = t[~found]
            raise ValueError(f"{what}: {missing.numel()} of {t.numel()} ids are not vertices of dataset {self.name!r} "
                             f"(e.g. {', '.join(str(v) for v in missing[:5].tolist())}); its vertex ids are those "
                             f"of its source file (node_ids: {known.numel()} ids from {int(known[0])} to "
                             f"{int(known[-1])})")
        return order[pos]

    # ------------------------------------------------------------------ pickling
    def __reduce_ex__(self, protocol):
        """A dataset mapped from a prepared folder (:func:`gsplit.datasets.load_folder`) and still holding the
        tensors it was loaded with pickles as the folder's path: a process that unpickles it (a rank that
        :func:`gsplit.launch` starts) maps the same files and shares their page cache, instead of receiving
        a copy of the tensors in shared memory. Any other dataset pickles its tensors as usual."""
        source = self.__dict__.get("_folder_source")
        if source is not None and source.matches(self):  # a gsplit.datasets.folder.FolderSource
            return source.reduce(self)
        return super().__reduce_ex__(protocol)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_folder_source", None)  # holds the tensors again, and means nothing in another process
        return state

    # ------------------------------------------------------------------ display
    def describe(self) -> str:
        """A few human-readable lines: sizes, split, and whether features/labels are real."""
        deg = self.num_edges / max(self.num_nodes, 1)
        feat = "random" if self.synthetic_features else "real"
        lab = "random" if self.synthetic_labels else "real"
        lines = [
            f"{self.name}: {self.num_nodes:,} vertices, {self.num_edges:,} edges (avg in-degree {deg:.1f})",
            f"  features: {self.feature_dim} dims ({feat}); labels: {self.num_classes} classes ({lab})",
            f"  split: {self.train_idx.numel():,} train / {self.val_idx.numel():,} val / "
            f"{self.test_idx.numel():,} test" + (f" ({self.meta['split']})" if "split" in self.meta else ""),
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        flags = []
        if self.synthetic_features:
            flags.append("synthetic_features")
        if self.synthetic_labels:
            flags.append("synthetic_labels")
        extra = (", " + ", ".join(flags)) if flags else ""
        return (f"Dataset(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"feature_dim={self.feature_dim}, num_classes={self.num_classes}, "
                f"train/val/test={self.train_idx.numel()}/{self.val_idx.numel()}/{self.test_idx.numel()}{extra})")


def _renumbered_example() -> "Dataset":
    """A 3-vertex dataset whose source ids are 10, 20 and 10**12 (the docstring examples' renumbered dataset)."""
    graph = Graph.from_edges([0, 1], [1, 2], num_nodes=3)
    return Dataset(graph=graph, features=torch.zeros(3, 1), labels=torch.zeros(3, dtype=torch.int64),
                   train_idx=torch.tensor([0]), val_idx=torch.tensor([1]), test_idx=torch.tensor([2]), num_classes=1,
                   name="example", node_ids=torch.tensor([10, 20, 10**12]))


def _check_tensor(t, what: str, dtype, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    allowed = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{what} must have dtype {names}, got {t.dtype}; convert it with .to({allowed[0]})")
    if t.dim() != dim:
        raise ValueError(f"{what} must be {dim}-dimensional, got shape {tuple(t.shape)}")


def class_labels(y: torch.Tensor, what: str, num_classes: Optional[int] = None) -> Tuple[torch.Tensor, int]:
    """Node-classification labels from another library's tensor: int64 ``[N]`` and the number of classes.

    A ``[N, 1]`` column is squeezed; anything else that is not one integer class per vertex is an error
    (multi-label targets are not supported). ``num_classes`` defaults to ``max + 1``.

    Example:
        >>> labels, k = class_labels(torch.tensor([[2], [0], [1]]), "y")
        >>> labels.tolist(), k
        ([2, 0, 1], 3)
    """
    labels = y.detach().cpu()
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels.squeeze(1)
    if labels.dim() != 1 or labels.dtype.is_floating_point:
        raise ValueError(f"{what} has dtype {labels.dtype} and shape {tuple(y.shape)}; gsplit needs one integer "
                         "class per vertex (multi-label targets are not supported)")
    labels = labels.to(torch.int64)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.numel() else 1
    return labels, int(num_classes)


# ---------------------------------------------------------------------------------- splits
def random_split(
    num_nodes: int,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    labels: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded random train/val/test split of the vertices (of the labelled ones when ``labels`` is given).

    ``fractions`` are the train, val and test shares; they may sum to less than 1 (the rest is unused).
    Each returned index tensor is sorted.

    Example:
        >>> tr, va, te = random_split(10, (0.6, 0.2, 0.2), seed=0)
        >>> (tr.numel(), va.numel(), te.numel())
        (6, 2, 2)
    """
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(f < 0 for f in fr) or sum(fr) > 1 + 1e-9:
        raise ValueError(f"split fractions must be three non-negative numbers (train, val, test) summing to "
                         f"at most 1, got {tuple(fractions)}")
    if labels is not None:
        candidates = torch.nonzero(labels >= 0).flatten()
    else:
        candidates = torch.arange(num_nodes, dtype=torch.int64)
    m = candidates.numel()
    g = torch.Generator().manual_seed(int(seed))
    perm = candidates[torch.randperm(m, generator=g)]
    n_train = int(round(fr[0] * m))
    n_val = int(round(fr[1] * m))
    n_test = min(int(round(fr[2] * m)), m - n_train - n_val)
    parts = (perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:n_train + n_val + n_test])
    return tuple(torch.sort(p).values for p in parts)  # type: ignore[return-value]


def planetoid_split(
    labels: torch.Tensor,
    num_classes: int,
    train_per_class: int = 20,
    num_val: int = 500,
    num_test: int = 1000,
    seed: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Planetoid-style split: ``train_per_class`` random vertices per class, then ``num_val`` and ``num_test``.

    Vertices are drawn in one seeded random order: the first ``train_per_class`` of each class train,
    the next ``num_val`` of the others validate and the next ``num_test`` test. A class with fewer
    vertices than ``train_per_class`` puts all of them in training. Unlabelled (-1) vertices are skipped.

    Example:
        >>> labels = torch.arange(3000) % 7
        >>> [t.numel() for t in planetoid_split(labels, 7)]
        [140, 500, 1000]
    """
    labelled = torch.nonzero(labels >= 0).flatten()
    g = torch.Generator().manual_seed(int(seed))
    perm = labelled[torch.randperm(labelled.numel(), generator=g)]
    lab = labels[perm]
    # rank of each vertex within its class, in the random order (stable sort keeps the order)
    order = torch.sort(lab, stable=True).indices
    sorted_lab = lab[order]
    class_start = torch.searchsorted(sorted_lab, torch.arange(num_classes, dtype=sorted_lab.dtype))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel()) - class_start[sorted_lab]
    is_train = rank < train_per_class
    rest = perm[~is_train]
    if rest.numel() < num_val + num_test:
        raise ValueError(f"the Planetoid split needs {num_val} + {num_test} vertices beyond the "
                         f"{int(is_train.sum())} training ones but only {rest.numel()} are left; "
                         "pass smaller num_val/num_test or use split='random'")
    train = perm[is_train]
    val = rest[:num_val]
    test = rest[num_val:num_val + num_test]
    return torch.sort(train).values, torch.sort(val).values, torch.sort(test).values
