"""How much of the graph METIS is given: the default budget of its input (``"auto"``), the bounds tried when
memory is short, and the choice between them from the host memory that preparing a map needs
(:func:`prepare_peak_bytes`, the memory model of :func:`~gsplit.partitioning.prepare.prepare_partition`).

:func:`gsplit.partition` and :func:`~gsplit.partitioning.prepare.prepare_partition` both resolve ``"auto"``
here; :mod:`gsplit.partitioning.sparsify` keeps each vertex's heaviest edges within the bound chosen.
"""

from __future__ import annotations

import logging
from typing import Optional, Union

from gsplit.partitioning.sparsify import AUTO, check_entries_per_vertex
from gsplit.runtime.resources import available_memory

log = logging.getLogger(__name__)


METIS_EDGES_PER_VERTEX = "auto"
"""Default budget of METIS's input: ``"auto"`` gives METIS every edge where the memory it needs is
available and otherwise the largest of :data:`METIS_BOUNDS_WHEN_SHORT` entries per vertex that fits
(:func:`resolve_metis_bound`); a number: adjacency entries (both directions)
per vertex, the heaviest edges of each vertex kept (:func:`gsplit.partitioning.sparsify.heaviest_edges`);
0 or None: every edge."""

METIS_BOUNDS_WHEN_SHORT = (12.0, 10.0, 8.0)
"""The budgets ``"auto"`` tries, largest first, when every edge would not fit: at 4M vertices 12 and 10
entries per vertex kept the unbounded cut (0.150) with 82 % / 66 % of METIS's memory while 8 raised it to
0.178; at 1M, 8 cost nothing after the refinement (experiments/README.md, issue 19; one graph, one seed)."""

METIS_BOUND_WHEN_SHORT = METIS_BOUNDS_WHEN_SHORT[-1]
"""The smallest of them: what ``"auto"`` uses when none fits (the memory check then says what is missing)."""

PREPARE_BYTES_PER_EDGE = 48
"""Peak host memory ``prepare_partition`` adds to the loaded dataset, per stored (directed) edge, besides
METIS: the pre-sampling weights (float32) and, while METIS's input is built, the summed weights, the
reverse-edge ids and the per-entry ranks of the bound (~40 B per edge, built in chunks, freed before
METIS starts)."""

PREPARE_BYTES_PER_METIS_ENTRY = 144
"""Per adjacency entry that METIS is given (at most ``metis_edges_per_vertex`` per vertex): its int64
input (id and weight, 16 B) and METIS's own memory in its forked process, which keeps every coarsening
level (measured 115-121 B per entry at 1M vertices, 4 balance constraints, rounded up)."""

PREPARE_BYTES_PER_VERTEX = 160
"""Likewise per vertex: weights, degrees, part ids, the balance constraints as int64 and METIS's
per-vertex arrays."""


def prepare_peak_bytes(num_nodes: int, num_edges: int, metis_edges_per_vertex: Optional[float] = None) -> int:
    """Estimated peak host memory that :func:`~gsplit.partitioning.prepare.prepare_partition` needs on top of the loaded dataset, with
    METIS's input bounded to ``metis_edges_per_vertex`` entries per vertex (None: every edge).

    Example:
        >>> round(prepare_peak_bytes(1_000_000, 15_000_000) / 2**30, 2), round(prepare_peak_bytes(1_000_000, 15_000_000, 8) / 2**30, 2)
        (2.83, 1.89)
    """
    entries = int(num_edges) if not metis_edges_per_vertex else min(int(num_edges),
                                                                    int(metis_edges_per_vertex * num_nodes))
    return (PREPARE_BYTES_PER_EDGE * int(num_edges) + PREPARE_BYTES_PER_METIS_ENTRY * entries
            + PREPARE_BYTES_PER_VERTEX * int(num_nodes))


def resolve_metis_bound(num_nodes: int, num_edges: int,
                        metis_edges_per_vertex: Union[float, str, None] = METIS_EDGES_PER_VERTEX) -> Optional[float]:
    """The budget of METIS's input to use: ``"auto"`` keeps every edge (None) where the memory that needs
    (:func:`prepare_peak_bytes`) is available, else bounds it to the largest of
    :data:`METIS_BOUNDS_WHEN_SHORT` entries per vertex whose peak fits (the
    smallest when none does) and logs a warning (a bound can cost cut quality); a number is validated and kept.

    Example:
        >>> resolve_metis_bound(1000, 15000), resolve_metis_bound(1000, 15000, 6), resolve_metis_bound(1000, 15000, 0)
        (None, 6.0, None)
    """
    budget = check_entries_per_vertex(metis_edges_per_vertex)
    if budget != AUTO:
        return budget
    needed, available = prepare_peak_bytes(num_nodes, num_edges), available_memory()
    if needed <= available:
        return None
    fits = [k for k in METIS_BOUNDS_WHEN_SHORT if prepare_peak_bytes(num_nodes, num_edges, k) <= available]
    bound = fits[0] if fits else METIS_BOUNDS_WHEN_SHORT[-1]
    log.warning("METIS on every edge of %s vertices / %s edges would need about %.1f GiB but %.1f GiB is available; "
                "bounding its input to the %g heaviest edges per vertex (the cut can be worse: pass "
                "metis_edges_per_vertex=0 / --metis-edges-per-vertex 0 on a larger host for full quality)",
                f"{num_nodes:,}", f"{num_edges:,}", needed / 2**30, available / 2**30, bound)
    return bound
