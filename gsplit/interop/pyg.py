"""PyTorch Geometric interop: ``Data`` in, PyG layers on gsplit blocks, PyG's fanout order.

Three things a PyG user needs (``pip install -e ".[pyg]"`` in a clone):

* :func:`from_pyg` turns a ``torch_geometric.data.Data`` (``edge_index``, ``x``, ``y``, ``train_mask`` /
  ``val_mask`` / ``test_mask``) into a :class:`gsplit.datasets.Dataset`; :func:`to_pyg` goes back.
* :func:`block_inputs` gives the arguments a ``torch_geometric.nn`` layer takes for one gsplit block,
  ``((h_src, h_dst), edge_index, size)``, and :class:`BlockConv` wraps a PyG layer into a module with
  gsplit's ``forward(block, h)`` convention, so it runs in :func:`gsplit.sp_forward`, under
  ``gsplit.shuffle`` between layers, and in gsplit's wrappers like any gsplit layer.
* :meth:`gsplit.NeighborSampler.from_pyg` accepts PyG's ``num_neighbors`` (hops from the seeds
  outward, the reverse of gsplit's and DGL's input-layer-first ``fanouts``).

A layer whose normalisation needs the whole mini-batch (e.g. ``GCNConv(normalize=True)``, which weighs
every edge by its *source's* degree) cannot run on a split block: a rank holds only its own
destinations' edges. :class:`BlockConv` refuses such layers on split blocks with an error that names
the alternatives.

torch_geometric is imported only inside the functions that need it, so this module imports without it.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Optional, Tuple

import torch
from torch import nn

from gsplit.datasets.base import Dataset, class_labels
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.sampling.block import Block

log = logging.getLogger(__name__)

__all__ = ["warn_fanout_order", "from_pyg", "to_pyg", "graph_from_pyg", "block_inputs", "BlockConv", "is_pyg_layer", "check_block_layer"]

# PyG layers that weigh edges by degrees over the whole (sub)graph or propagate more than one hop; the
# value is the attribute that switches that off (None: it cannot be switched off).
_WHOLE_BATCH_LAYERS = {
    "GCNConv": "normalize", "LGConv": "normalize", "TAGConv": "normalize", "APPNP": "normalize",
    "GCN2Conv": "normalize", "SGConv": None, "SSGConv": None, "ClusterGCNConv": None, "ChebConv": None,
    "ARMAConv": None,
}


def _ids_from(mask, num_nodes: int, what: str) -> torch.Tensor:
    """Vertex ids marked by a boolean mask (or given as ids already); ``None`` gives none."""
    if mask is None:
        return torch.zeros(0, dtype=torch.int64)
    mask = torch.as_tensor(mask)
    if mask.dtype == torch.bool and mask.dim() == 2:  # PyG's multi-split masks, e.g. 10 random splits
        raise ValueError(f"data.{what} has shape {tuple(mask.shape)}: several splits; pick one split, e.g. "
                         f"data.{what}[:, 0]")
    return as_vertex_ids(mask, num_nodes, f"data.{what}")


def from_pyg(data, *, num_classes: Optional[int] = None, name: str = "pyg") -> Dataset:
    """A :class:`gsplit.datasets.Dataset` from a ``torch_geometric.data.Data``.

    Edges keep PyG's direction: ``edge_index[0]`` is the source, ``edge_index[1]`` the target, and a
    vertex aggregates from its in-edges (PyG's default ``flow="source_to_target"``); an undirected PyG
    graph already stores both directions. ``x`` becomes float32 features, ``y`` the labels (``[N, 1]``
    is squeezed; ``-1`` marks an unlabelled vertex), and ``train_mask`` / ``val_mask`` / ``test_mask``
    (boolean masks or id tensors; a missing one is empty) the split ids.

    Args:
        data: a ``Data`` (or any object with those attributes).
        num_classes: number of classes; default ``y.max() + 1``.
        name: the dataset's name in logs.

    Example:
        >>> import pytest; _ = pytest.importorskip("torch_geometric")   # (the test suite skips without PyG)
        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(3, 4), y=torch.tensor([0, 1, 1]),
        ...             edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]),
        ...             train_mask=torch.tensor([True, True, False]))
        >>> ds = from_pyg(data)
        >>> ds.train_idx.tolist(), ds.graph.in_neighbors(1).tolist()    # edge 0 -> 1: vertex 1 reads vertex 0
        ([0, 1], [0])
    """
    x, y = getattr(data, "x", None), getattr(data, "y", None)
    if x is None:
        raise ValueError("data.x is None; gsplit needs node features: set data.x to a [num_nodes, dim] tensor")
    if y is None:
        raise ValueError("data.y is None; gsplit trains node classification: set data.y to one label per vertex")
    graph = graph_from_pyg(data)
    num_nodes = graph.num_nodes
    if x.shape[0] != num_nodes:
        raise ValueError(f"data.x has {x.shape[0]} rows but data.num_nodes is {num_nodes}")
    labels, num_classes = class_labels(y, "data.y", num_classes)
    splits = {what: _ids_from(getattr(data, f"{what}_mask", None), num_nodes, f"{what}_mask")
              for what in ("train", "val", "test")}
    return Dataset(graph=graph, features=x.detach().cpu().to(torch.float32).contiguous(), labels=labels,
                   train_idx=splits["train"], val_idx=splits["val"], test_idx=splits["test"],
                   num_classes=int(num_classes), name=name, meta={"source": "torch_geometric.data.Data"})


def graph_from_pyg(data) -> Graph:
    """The structure of a PyG ``Data`` as gsplit's CSC of in-edges: ``edge_index[0] -> edge_index[1]``, every edge kept.

    ``data.num_nodes`` (else ``x``'s rows, else the largest id + 1) vertices. This is what
    :func:`gsplit.interop.graphs.graph_input` does with a ``Data`` given to any gsplit function.

    Example:
        >>> import pytest; _ = pytest.importorskip("torch_geometric")   # (the test suite skips without PyG)
        >>> from torch_geometric.data import Data
        >>> graph_from_pyg(Data(edge_index=torch.tensor([[0, 2], [1, 1]]), num_nodes=4)).in_neighbors(1).tolist()
        [0, 2]
    """
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None or not isinstance(edge_index, torch.Tensor):
        raise ValueError(f"data.edge_index is {type(edge_index).__name__}; gsplit needs a [2, num_edges] tensor "
                         "(convert a SparseTensor adj_t with data.edge_index = torch.stack(adj_t.t().coo()[:2]))")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"data.edge_index has shape {tuple(edge_index.shape)}; pass a [2, num_edges] tensor")
    x = getattr(data, "x", None)
    num_nodes = getattr(data, "num_nodes", None) or (x.shape[0] if x is not None else None)
    return Graph.from_edges(edge_index[0].cpu(), edge_index[1].cpu(), num_nodes)


def to_pyg(dataset: Dataset):
    """A ``torch_geometric.data.Data`` with the dataset's edges, features, labels and boolean masks.

    Edges come in gsplit's CSC order (grouped by target); ``from_pyg(to_pyg(ds))`` rebuilds ``ds``.

    Example:
        >>> import pytest; _ = pytest.importorskip("torch_geometric")   # (the test suite skips without PyG)
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=200, seed=0)
        >>> data = to_pyg(ds)
        >>> data.num_edges == ds.num_edges, int(data.train_mask.sum()) == ds.train_idx.numel()
        (True, True)
    """
    from torch_geometric.data import Data

    g = dataset.graph
    edge_index = torch.stack([g.indices, g.edge_dst()])
    masks = {}
    for what in ("train", "val", "test"):
        mask = torch.zeros(g.num_nodes, dtype=torch.bool)
        mask[getattr(dataset, f"{what}_idx")] = True
        masks[f"{what}_mask"] = mask
    return Data(x=dataset.features, y=dataset.labels, edge_index=edge_index, num_nodes=g.num_nodes, **masks)


def block_inputs(block: Block, h: torch.Tensor) -> Tuple[Tuple[torch.Tensor, torch.Tensor], torch.Tensor,
                                                         Tuple[int, int]]:
    """The arguments of a bipartite ``torch_geometric.nn`` layer for ``block``: ``((h_src, h_dst), edge_index, size)``.

    ``h`` has one row per ``block.src_nodes``; the destinations are their prefix, so ``h_dst =
    h[:num_dst]``. ``edge_index = [edge_src, edge_dst]`` holds local indices into those two, and
    ``size = (num_src, num_dst)``: ``conv((h_src, h_dst), edge_index, size=size)`` returns one row per
    destination, as on a PyG ``NeighborLoader`` batch.

    Example:
        >>> b = Block(src_nodes=torch.tensor([7, 3, 9]), num_dst=1, edge_src=torch.tensor([1, 2]),
        ...           edge_dst=torch.tensor([0, 0]), edge_ids=torch.tensor([40, 41]))
        >>> (h_src, h_dst), edge_index, size = block_inputs(b, torch.randn(3, 4))
        >>> h_dst.shape, edge_index.tolist(), size
        (torch.Size([1, 4]), [[1, 2], [0, 0]], (3, 1))
    """
    ns, nd = block.num_src_nodes(), block.num_dst_nodes()
    if h.shape[0] != ns:
        raise ValueError(f"h has {h.shape[0]} rows but {block!r} has {ns} source nodes; pass one row per "
                         "block.src_nodes (shuffle the previous layer's output with gsplit.shuffle(h, block) first)")
    return (h, h[:nd]), torch.stack([block.edge_src, block.edge_dst]), (ns, nd)


def is_pyg_layer(layer) -> bool:
    """True for a ``torch_geometric.nn`` message-passing layer (``MessagePassing``). Never imports torch_geometric.

    Example:
        >>> is_pyg_layer(torch.nn.Linear(2, 2))
        False
    """
    pyg_conv = sys.modules.get("torch_geometric.nn.conv")
    return pyg_conv is not None and isinstance(layer, pyg_conv.MessagePassing)


def check_block_layer(layer, where: str = "layers") -> None:
    """Refuse a bare PyG layer called as ``layer(block, h)``: PyG layers take ``(x, edge_index)``, not a block.

    gsplit's wrappers (:class:`gsplit.SplitParallel`, :func:`gsplit.sp_forward`,
    :func:`gsplit.layerwise_inference`) call it before a layer gets a block, so the user sees the fix
    instead of PyG's ``Expected 'edge_index' to be of integer type``.

    Example:
        >>> check_block_layer(torch.nn.Linear(2, 2))     # not a PyG layer: nothing to say
    """
    if is_pyg_layer(layer):
        name = type(layer).__name__
        raise TypeError(f"{where} holds a bare torch_geometric layer {name}, which takes (x, edge_index) and cannot "
                        f"be called as layer(block, h); wrap it: gsplit.interop.pyg.BlockConv({name}(...))")


# PyG NeighborLoader keywords -> what gsplit's loaders (DGL's signature) take instead
_PYG_LOADER_KEYWORDS = {
    "input_nodes": "pass the targets positionally as indices: {cls}(graph, indices, sampler, batch_size=...) "
                   "(DGL's signature; indices are vertex ids or a boolean mask, e.g. data.train_mask)",
    "num_neighbors": "pass a sampler as the third argument: {cls}(graph, indices, "
                     "gsplit.NeighborSampler.from_pyg(num_neighbors), ...) (from_pyg reads PyG's order)",
}


def refuse_pyg_loader_keywords(cls: str, kwargs: dict) -> None:
    """Raise ``TypeError`` naming gsplit's spelling when a loader gets a PyG ``NeighborLoader`` keyword.

    Example:
        >>> refuse_pyg_loader_keywords("DataLoader", {"input_nodes": None})
        Traceback (most recent call last):
        ...
        TypeError: DataLoader() got input_nodes=, a PyG NeighborLoader keyword; pass the targets positionally as indices: DataLoader(graph, indices, sampler, batch_size=...) (DGL's signature; indices are vertex ids or a boolean mask, e.g. data.train_mask)
    """
    for key, fix in _PYG_LOADER_KEYWORDS.items():
        if key in kwargs:
            raise TypeError(f"{cls}() got {key}=, a PyG NeighborLoader keyword; {fix.format(cls=cls)}")


def warn_fanout_order(sampler) -> None:
    """Warn when a PyG ``Data`` comes with a sampler whose fanouts may be PyG's ``num_neighbors`` (seeds outward).

    gsplit's ``NeighborSampler(fanouts)`` lists layers from the input up, PyG's ``num_neighbors`` the
    reverse; the same list means opposite things and cannot be told apart. A sampler built with
    :meth:`gsplit.NeighborSampler.from_pyg` (which reverses) or one whose fanouts read the same both ways
    is fine; any other gets this warning when the graph is a PyG ``Data`` (:class:`gsplit.DataLoader`).

    Example:
        >>> from gsplit.sampling.neighbor import NeighborSampler
        >>> warn_fanout_order(NeighborSampler.from_pyg([25, 10]))      # PyG's order, said so: silent
    """
    fanouts = list(getattr(sampler, "fanouts", []) or [])
    if getattr(sampler, "num_neighbors", None) is not None or fanouts == fanouts[::-1]:
        return
    log.warning("the graph is a PyG Data and the sampler's fanouts are %s, read input layer first (DGL's order: "
                "fanouts[0] feeds the first layer), the reverse of PyG's num_neighbors; if %s was meant as PyG's "
                "num_neighbors, build the sampler with gsplit.NeighborSampler.from_pyg(%s)", fanouts, fanouts, fanouts)


def _say_added_self_loops(name: str) -> None:
    """A PyG layer built with ``add_self_loops=True`` trains on edges the sampler did not pick: say the fix
    (WARNING on rank 0 of a job, INFO on the others, which build the same model)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    log.log(logging.WARNING if rank == 0 else logging.INFO,
            "%s(add_self_loops=True) (PyG's default) adds a self-loop to every destination on top of the edges the "
            "sampler picked, which gsplit's blocks already hold; build it with %s(..., add_self_loops=False) to "
            "train on exactly the sampled edges, as gsplit's and DGL's GAT do (split training equals one process "
            "either way)", name, name)


def _whole_batch_reason(conv: nn.Module) -> Optional[str]:
    """Why ``conv`` cannot run on a split block, or None when it can."""
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError:  # not a PyG layer then
        return None
    for cls_name, switch in _WHOLE_BATCH_LAYERS.items():
        cls = getattr(pyg_nn, cls_name, None)
        if cls is None or not isinstance(conv, cls):
            continue
        if switch is None:
            return f"{cls_name} normalises by degrees over the whole mini-batch or propagates over several hops"
        if getattr(conv, switch, False):
            return f"{cls_name}({switch}=True) normalises every edge by its source's degree over the whole mini-batch"
    return None


class BlockConv(nn.Module):
    """A ``torch_geometric.nn`` layer as a gsplit layer: ``forward(block, h)`` -> one row per destination.

    Layers that take bipartite input (a ``size`` argument: ``SAGEConv``, ``GATConv``, ``GraphConv``,
    ``GINConv``, ...) get ``conv((h_src, h_dst), edge_index, size=size)`` from :func:`block_inputs`; others
    (``GCNConv``) get ``conv(h, edge_index)`` and their first ``num_dst`` rows are kept. The block
    already holds the sampled edges, so build attention layers with ``add_self_loops=False`` to use
    exactly those (as the single-process reference does); a layer built with PyG's default
    ``add_self_loops=True`` (``GATConv``, ``GATv2Conv``) is said at WARNING (on rank 0) with that fix: it adds
    a self-loop to every destination on top of the sampled edges, which split training repeats exactly
    but which is not the model gsplit's and DGL's GAT train.

    A layer that needs the whole mini-batch (``GCNConv(normalize=True)`` and other degree-normalising or
    multi-hop layers) raises ``ValueError`` on a split block; use ``normalize=False`` with a mean
    aggregation (``GCNConv(..., normalize=False, aggr="mean")``) or another layer.

    Example:
        >>> import pytest; _ = pytest.importorskip("torch_geometric")   # (the test suite skips without PyG)
        >>> from torch_geometric.nn import SAGEConv
        >>> block = Block(src_nodes=torch.tensor([5, 6, 7]), num_dst=2, edge_src=torch.tensor([1, 2, 0]),
        ...               edge_dst=torch.tensor([0, 0, 1]), edge_ids=torch.tensor([0, 1, 2]))
        >>> BlockConv(SAGEConv(16, 32))(block, torch.randn(3, 16)).shape   # one row per destination
        torch.Size([2, 32])

        In a model, shuffle before every layer but the first (``gsplit.shuffle(h, block)``, the identity
        on a block that is not split), or run the layers with :func:`gsplit.sp_forward`.
    """

    def __init__(self, conv: nn.Module):
        super().__init__()
        if not isinstance(conv, nn.Module):
            raise TypeError(f"BlockConv wraps a torch_geometric.nn layer (an nn.Module), got {type(conv).__name__}")
        self.conv = conv
        self.bipartite = "size" in inspect.signature(conv.forward).parameters
        """True when the layer takes ``(x_src, x_dst)`` and ``size``; else it gets all rows and is sliced."""
        self._whole_batch = _whole_batch_reason(conv)
        # GCN-style layers add self-loops only while normalising, which _whole_batch_reason refuses already
        if getattr(conv, "add_self_loops", False) is True and not hasattr(conv, "normalize"):
            _say_added_self_loops(type(conv).__name__)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        if self._whole_batch is not None and block.shuffle_index is not None:
            raise ValueError(f"{self._whole_batch}, which a split block does not have (each rank holds only its own "
                             "destinations' edges), so it is not split-safe; use normalize=False with a mean "
                             "aggregation (e.g. GCNConv(in, out, normalize=False, aggr='mean')) or another layer "
                             "(SAGEConv, GATConv(add_self_loops=False), GraphConv)")
        x, edge_index, size = block_inputs(block, h)
        if self.bipartite:
            return self.conv(x, edge_index, size=size)
        return self.conv(h, edge_index)[: size[1]]

    def extra_repr(self) -> str:
        return "bipartite" if self.bipartite else "sliced"
