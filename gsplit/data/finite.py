"""Whether a feature table holds NaN or inf: chunked scans (:func:`first_non_finite_row`, :func:`check_finite`)
and the mark that says a table was scanned already (:func:`mark_finite`: a prepared folder's writer scanned it,
so :class:`gsplit.datasets.Dataset`, the loaders and the feature store skip their pass over the file).
"""

from __future__ import annotations

from typing import Optional

import torch

_KNOWN_FINITE = "_gsplit_known_finite"


def mark_finite(features: torch.Tensor) -> torch.Tensor:
    """Record on the tensor object that ``features`` was checked to hold no NaN/inf; returns it.

    :func:`gsplit.datasets.load_folder` marks the features of a folder whose writer checked them (``meta.json``'s
    ``checks``), so that :class:`gsplit.datasets.Dataset` and the loaders (:func:`first_non_finite_row`)
    skip their full pass over a memory-mapped table, which would read the whole file before the first
    epoch. The mark is an attribute of this tensor object: a tensor derived from it is checked again.
    Writing NaN into a marked tensor in place is not noticed.

    Example:
        >>> known_finite(mark_finite(torch.zeros(2, 2)))
        True
    """
    setattr(features, _KNOWN_FINITE, True)
    return features


def known_finite(features: torch.Tensor) -> bool:
    """True when :func:`mark_finite` marked this tensor object."""
    return bool(getattr(features, _KNOWN_FINITE, False))


_CHECK_BYTES = 64 << 20
""":func:`first_non_finite_row` reads the features in chunks of about this many bytes (its only temporaries)."""


def first_non_finite_row(features: torch.Tensor) -> Optional[int]:
    """The first row of ``features`` that holds NaN or inf, or ``None`` (also for integer features).

    Reads the rows in chunks of about ``_CHECK_BYTES``: a whole-table ``torch.isfinite`` would allocate a
    boolean copy of the table (14 GB for Papers100M's features) in every rank.

    Example:
        >>> first_non_finite_row(torch.tensor([[0.0, 1.0], [2.0, float("nan")]]))
        1
        >>> first_non_finite_row(torch.ones(3, 2)) is None
        True
    """
    if not features.dtype.is_floating_point or features.numel() == 0 or known_finite(features):
        return None  # known_finite: a prepared folder's writer scanned it (mark_finite)
    rows = features.reshape(features.shape[0], -1) if features.dim() != 2 else features
    step = max(1, _CHECK_BYTES // max(1, rows.shape[1] * rows.element_size()))
    for start in range(0, rows.shape[0], step):
        chunk = rows[start:start + step]
        if not all_finite(chunk):
            return start + int((~torch.isfinite(chunk).all(1)).nonzero()[0, 0])
    return None


def all_finite(t: torch.Tensor) -> bool:
    """Whether float tensor ``t`` holds no NaN or inf, in one read-only pass: its minimum and maximum
    (``torch.aminmax``: NaN propagates to both, +inf shows in the maximum, -inf in the minimum). About 9x
    faster than ``torch.isfinite(t).all()`` on the CPU, which writes a boolean copy and reads it again
    (2026-11-27, 2 threads: 0.10 against 0.9 s for a 1 GiB table); a table checked at every training start.

    Example:
        >>> all_finite(torch.ones(3)), all_finite(torch.tensor([1.0, float("-inf")])), all_finite(torch.ones(0))
        (True, False, True)
    """
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low) & torch.isfinite(high))


_FINITE_CHECK_ROWS = 1 << 16
"""Rows per chunk of :func:`check_finite`'s scan: bounds the temporary bool mask on huge tables."""


def check_finite(features: torch.Tensor, what: str = "features") -> None:
    """Raise ``ValueError`` naming the first row of ``features`` that holds NaN or inf.

    Scans in row chunks so that the temporary mask stays small even for very large tables.

    Example:
        >>> check_finite(torch.zeros(3, 2))
    """
    n = features.shape[0]
    for start in range(0, n, _FINITE_CHECK_ROWS):
        chunk = features[start:start + _FINITE_CHECK_ROWS]
        if all_finite(chunk):
            continue
        bad_rows = ~torch.isfinite(chunk).all(dim=1)
        if bool(bad_rows.any()):
            row = start + int(torch.nonzero(bad_rows)[0])
            total = int(bad_rows.sum())
            raise ValueError(f"{what} row {row} contains NaN or inf ({total} bad rows in rows "
                             f"{start}..{start + chunk.shape[0] - 1}); clean the input or drop those vertices")
