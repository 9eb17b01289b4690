"""The one error for a vertex id out of range, shared by every reader of ids (the graph's checks, the kernels,
the feature store). It lives apart from :mod:`gsplit.data.graph` so that the kernels of :mod:`gsplit.ops`,
which the graph uses to pin itself, can raise it without importing the graph.
"""

from __future__ import annotations

__all__ = ["id_range_error"]


def id_range_error(what: str, bad: int, num_nodes: int, holder: str = "the graph") -> ValueError:
    """The one error for a vertex id outside ``[0, num_nodes)`` (every range check raises it).

    Example:
        >>> str(id_range_error("nodes", 7, 5))[:30]
        'nodes contain id 7 but the gra'
    """
    return ValueError(f"{what} contain id {bad} but {holder} has {num_nodes} vertices: id {bad} is outside "
                      f"[0, {num_nodes}) (outside {holder}); pass ids of {holder}")
