"""One converter for every public function that takes a graph: a gsplit ``Graph``, a ``DGLGraph`` or a PyG ``Data``.

``gsplit.presample``, ``gsplit.partition``, ``gsplit.split_stats``, ``gsplit.layerwise_inference`` and
``gsplit.DataLoader`` call :func:`graph_input` on their ``graph`` argument, so a DGL or PyG user passes
the graph they already hold, and anything else gets one error that names what is accepted. Neither dgl
nor torch_geometric is imported here: an object is recognised only when its library is already loaded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

import torch

from gsplit.data.graph import Graph

__all__ = ["GraphInput", "graph_input", "as_graph", "is_pyg_data"]


def is_pyg_data(x) -> bool:
    """True for a ``torch_geometric.data.Data`` (homogeneous). Never imports torch_geometric.

    Example:
        >>> is_pyg_data(Graph.from_edges([0], [1]))
        False
    """
    pyg_data = sys.modules.get("torch_geometric.data")
    return pyg_data is not None and isinstance(x, pyg_data.Data)


@dataclass(frozen=True)
class GraphInput:
    """A ``graph`` argument after conversion, with what the other library's object carried besides its edges."""

    graph: Graph
    """gsplit's CSC of in-edges."""
    features: Optional[torch.Tensor]
    """``ndata["feat"]`` of a DGLGraph or ``x`` of a PyG Data (None for a gsplit Graph or when absent)."""
    labels: Optional[torch.Tensor]
    """``ndata["label"]`` / ``y`` (None when absent)."""
    kind: str
    """``"gsplit"``, ``"dgl"`` or ``"pyg"``: where the graph came from (for messages)."""
    dgl_source: object = None
    """The :class:`gsplit.interop.dgl.GraphFromDGL` of a DGLGraph (DGL's edge ids), else None."""


def graph_input(graph, what: str = "graph") -> GraphInput:
    """Convert ``graph`` (gsplit ``Graph``, homogeneous ``DGLGraph`` or PyG ``Data``) for a gsplit function.

    DGL's edges ``u -> v`` and PyG's ``edge_index[0] -> edge_index[1]`` both become in-edges of the
    target (every edge kept). ``what`` names the argument in errors.

    Example:
        >>> g = Graph.from_edges([0, 1], [1, 2])
        >>> graph_input(g).graph is g, graph_input(g).kind
        (True, 'gsplit')
        >>> graph_input("cora.npz")
        Traceback (most recent call last):
        ...
        TypeError: graph must be a gsplit.Graph, a DGLGraph or a torch_geometric Data, got str; load a dataset with gsplit.datasets.load(...) and pass its .graph
    """
    if isinstance(graph, Graph):
        return GraphInput(graph=graph, features=None, labels=None, kind="gsplit")
    from gsplit.interop import dgl as dgl_interop  # imports no dgl

    if dgl_interop.is_dgl_graph(graph):
        source = dgl_interop.graph_from_dgl(graph)
        return GraphInput(graph=source.graph, features=graph.ndata.get("feat"), labels=graph.ndata.get("label"),
                          kind="dgl", dgl_source=source)
    if dgl_interop.is_dgl_block(graph):
        raise TypeError(f"{what} is a DGL block; pass the whole DGLGraph (gsplit samples its own blocks)")
    if is_pyg_data(graph):
        from gsplit.interop.pyg import graph_from_pyg

        return GraphInput(graph=graph_from_pyg(graph), features=getattr(graph, "x", None),
                          labels=getattr(graph, "y", None), kind="pyg")
    if type(graph).__name__ in ("HeteroData", "Batch") and type(graph).__module__.startswith("torch_geometric"):
        raise TypeError(f"{what} is a PyG {type(graph).__name__}; gsplit trains on one homogeneous graph: pass a "
                        "Data (e.g. hetero_data.to_homogeneous())")
    if hasattr(graph, "graph") and isinstance(getattr(graph, "graph"), Graph):
        raise TypeError(f"{what} is a {type(graph).__name__}; pass its .graph (the gsplit.Graph) instead")
    raise TypeError(f"{what} must be a gsplit.Graph, a DGLGraph or a torch_geometric Data, got "
                    f"{type(graph).__name__}; load a dataset with gsplit.datasets.load(...) and pass its .graph")


def as_graph(graph, what: str = "graph") -> Graph:
    """:func:`graph_input`'s gsplit ``Graph`` only (for functions that need just the structure).

    Example:
        >>> as_graph(Graph.from_edges([0], [1])).num_nodes
        2
    """
    return graph_input(graph, what).graph


def as_sampler(sampler):
    """A DGL ``NeighborSampler`` as gsplit's (same fanouts, :func:`gsplit.interop.dgl.sampler_from_dgl`);
    anything else unchanged.

    Example:
        >>> from gsplit.sampling.neighbor import NeighborSampler
        >>> s = NeighborSampler([2]); as_sampler(s) is s
        True
    """
    from gsplit.interop import dgl as dgl_interop  # imports no dgl

    return dgl_interop.loader_sampler(sampler, None, None)[0]
