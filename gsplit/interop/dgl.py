"""DGL interop: a ``DGLGraph`` goes into :class:`gsplit.DataLoader`, real DGL blocks come out.

``pip install -e ".[dgl]"`` in a clone. DGL 2.1 (the last release on PyPI) loads only with torch 2.2.x, so a DGL
environment pins ``torch==2.2.*`` (``./dev dgl-env`` builds one); gsplit supports torch >= 2.2.

* :func:`graph_from_dgl` converts a homogeneous ``DGLGraph`` once into gsplit's CSC of in-edges and
  keeps DGL's edge ids (:class:`GraphFromDGL`); :func:`from_dgl` also takes ``ndata["feat"]``,
  ``ndata["label"]`` and the ``train_mask`` / ``val_mask`` / ``test_mask`` into a
  :class:`gsplit.datasets.Dataset` for the offline steps (``presample``, ``partition``).
* ``gsplit.DataLoader(g, train_idx, sampler, ...)`` with a ``DGLGraph`` ``g`` takes features and labels
  from ``g.ndata`` and yields DGL blocks made by :func:`to_dgl_block` (``dgl.create_block`` with
  ``srcdata["feat"]``, ``dstdata["label"]``, ``srcdata[dgl.NID]`` / ``dstdata[dgl.NID]`` global vertex
  ids and ``edata[dgl.EID]`` DGL edge ids), so ``dgl.nn`` layers run on them unchanged.
* DGL's ``NeighborSampler([10, 10, 10], prefetch_node_feats=["feat"], prefetch_labels=["label"])`` may
  be passed to the loader as it is: :func:`sampler_from_dgl` turns it into a
  :class:`gsplit.NeighborSampler` with the same fanouts (gsplit's counter-based sampling, which split
  parallelism needs: the picks differ from DGL's) and the loader takes its ``prefetch_*`` names.
* Split training: each DGL block made here holds the gsplit :class:`~gsplit.Block` it was made from
  (with the block's shuffle plan) in an attribute; :func:`block_of` returns it, and
  :class:`gsplit.SplitParallel` uses it to shuffle before every layer above the first. DGL's copies
  (``block.to(device)``, which copies even on the same device, and ``copy.copy``) copy the attribute,
  so DGL's ``blocks = [b.to(device) for b in blocks]`` keeps working; a copy on another device gets the
  plan moved there, bound to the same process group.

dgl is imported only inside the functions that need it, so this module (and gsplit) imports without it.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import torch

from gsplit.datasets.base import Dataset, class_labels
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.sampling.block import Block, MiniBatch
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

__all__ = ["GraphFromDGL", "graph_from_dgl", "from_dgl", "to_dgl_block", "to_dgl_batch", "block_of",
           "to_dgl_pair_graph", "pair_of",
           "is_dgl_graph", "is_dgl_block", "is_dgl_sampler", "SamplerFromDGL", "sampler_from_dgl", "prefetch_flag", "named_node_data",
           "loader_sampler"]

# The attribute of a DGL block made by to_dgl_block that holds the gsplit Block it was made from (its
# shuffle plan, global ids). An attribute, not a side table: DGL's block.to(device) and copy.copy copy the
# object's __dict__ (DGLGraph.__copy__), so a copy of the block still finds its plan.
_PLAN_ATTR = "_gsplit_block"


def _dgl():
    try:
        import dgl
    except ImportError as e:  # an ImportError of dgl's own (e.g. a torch it does not support) says why
        raise ImportError(f"gsplit.interop.dgl needs DGL ({e}); install it with pip install 'gsplit[dgl]' into an "
                          "environment with torch 2.2.x (DGL 2.1 loads only with that torch; ./dev dgl-env builds "
                          "one)") from e
    return dgl


def is_dgl_graph(x) -> bool:
    """True for a ``DGLGraph`` that is not a block. Never imports dgl: without it nothing is one.

    Example:
        >>> is_dgl_graph(Graph.from_edges([0], [1]))
        False
    """
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(x, dgl.DGLGraph) and not x.is_block


def is_dgl_block(x) -> bool:
    """True for a DGL block (``DGLGraph.is_block``). Never imports dgl.

    Example:
        >>> is_dgl_block(torch.zeros(2))
        False
    """
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(x, dgl.DGLGraph) and x.is_block


def block_of(x) -> Optional[Block]:
    """The gsplit :class:`~gsplit.Block` a DGL block was made from by :func:`to_dgl_block`, else None.

    Example:
        >>> block_of(torch.zeros(2)) is None      # not a DGL block
        True
    """
    if not is_dgl_block(x):
        return None
    block = getattr(x, _PLAN_ATTR, None)
    if block is None or block.device == x.device:
        return block
    # A copy on another device (block.to(other_device)): move the plan with it, once, and keep the
    # group the loader bound the original plan to.
    from gsplit.comm.communicator import bind_group, group_of

    moved = block.to(x.device)
    if block.shuffle_index is not None:
        bind_group([moved], group_of(block.shuffle_index))
    setattr(x, _PLAN_ATTR, moved)
    return moved


@dataclass(frozen=True)
class GraphFromDGL:
    """A ``DGLGraph``'s structure as a gsplit :class:`~gsplit.Graph`, with the way back to DGL's edge ids."""

    graph: Graph
    """CSC of in-edges, edges ordered by (destination, source) as :meth:`gsplit.Graph.from_edges` orders
    them, so it samples exactly as ``Graph.from_edges(*g.edges(), g.num_nodes())`` does."""
    dgl_edge_ids: Optional[torch.Tensor]
    """int64 DGL edge id of every gsplit edge (position in ``graph.indices``), on the CPU; ``None`` when
    they coincide (DGL's edges already in that order)."""

    def edge_ids(self, gsplit_edge_ids: torch.Tensor) -> torch.Tensor:
        """DGL's ids of the gsplit edges ``gsplit_edge_ids`` (e.g. ``Block.edge_ids``), on their device."""
        if self.dgl_edge_ids is None:
            return gsplit_edge_ids
        return self.dgl_edge_ids[gsplit_edge_ids.cpu()].to(gsplit_edge_ids.device)

    def gsplit_edge_ids(self, dgl_edge_ids: torch.Tensor) -> torch.Tensor:
        """gsplit's ids of DGL's edges ``dgl_edge_ids`` (e.g. a link prediction loader's ``train_eids``): the
        inverse of :meth:`edge_ids`; the ids must be in range (a loader checks them first)."""
        if self.dgl_edge_ids is None:
            return dgl_edge_ids
        inverse = torch.empty_like(self.dgl_edge_ids)
        inverse[self.dgl_edge_ids] = torch.arange(self.dgl_edge_ids.numel())
        return inverse[dgl_edge_ids.cpu()].to(dgl_edge_ids.device)


def graph_from_dgl(g) -> GraphFromDGL:
    """Convert a homogeneous ``DGLGraph``'s edges ``u -> v`` into gsplit's CSC of in-edges (``v`` reads ``u``).

    Every edge is kept (also repeated ones and self-loops), so DGL's edge ids map one to one. The graph
    is built on the CPU and moved to ``g.device``.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> g = dgl.graph((torch.tensor([2, 0, 1]), torch.tensor([1, 1, 0])))
        >>> conv = graph_from_dgl(g)
        >>> conv.graph.in_neighbors(1).tolist(), conv.dgl_edge_ids.tolist()  # edge 2 (1 -> 0) comes first
        ([0, 2], [2, 1, 0])
    """
    if not is_dgl_graph(g):
        what = "a DGL block" if is_dgl_block(g) else type(g).__name__
        raise TypeError(f"graph_from_dgl expects a DGLGraph (not a block), got {what}")
    if len(g.ntypes) != 1 or len(g.canonical_etypes) != 1:
        raise ValueError(f"the DGLGraph has node types {g.ntypes} and edge types {g.canonical_etypes}; gsplit trains "
                         "on homogeneous graphs: convert it with dgl.to_homogeneous(g, ndata=[...]) first")
    n = g.num_nodes()
    if n == 0:
        raise ValueError("the DGLGraph has no vertices; gsplit needs at least one")
    src, dst, eid = (t.cpu().to(torch.int64) for t in g.edges(form="all", order="eid"))
    # (dst, src) order as Graph.from_edges: sampling then depends on the edge set, not on DGL's edge order
    order = torch.sort(dst * n + src, stable=True).indices
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
    graph = Graph.from_csc(indptr, src[order].contiguous())
    dgl_ids = eid[order]
    same = bool(torch.equal(dgl_ids, torch.arange(dgl_ids.numel())))
    if g.device.type != "cpu":
        graph = graph.to(g.device)
    return GraphFromDGL(graph=graph, dgl_edge_ids=None if same else dgl_ids)


SPLIT_FIX = ("pass the split to from_dgl(g, train_idx=..., val_idx=..., test_idx=...) (vertex ids or boolean "
             "masks, e.g. OGB's dataset.get_idx_split()['train']) or set g.ndata['train_mask'] before from_dgl(g)")
"""How to give a dataset made by :func:`from_dgl` its training vertices (said where they are missing)."""


def _no_train_reason(mask, train_idx) -> str:
    if train_idx is not None:
        return "train_idx is empty"
    return "g.ndata has no 'train_mask'" if mask is None else "g.ndata['train_mask'] marks no vertex"


def from_dgl(g, *, feat: str = "feat", label: str = "label", num_classes: Optional[int] = None,
             name: str = "dgl", train_idx=None, val_idx=None, test_idx=None) -> Dataset:
    """A :class:`gsplit.datasets.Dataset` from a ``DGLGraph`` with ``ndata[feat]``, ``ndata[label]`` and masks.

    For the offline steps (``gsplit.presample``, ``gsplit.partition``) and gsplit's own tools; training
    can pass ``g`` itself to :class:`gsplit.DataLoader`. Features become float32, labels int64 (a
    ``[N, 1]`` label column is squeezed; ``-1`` marks an unlabelled vertex); ``ndata["train_mask"]`` /
    ``"val_mask"`` / ``"test_mask"`` (boolean or 0/1 masks; a missing one is empty) become the split ids.
    ``train_idx`` / ``val_idx`` / ``test_idx`` (vertex ids or boolean masks) replace them: the split of a
    graph without masks, e.g. OGB's ``dataset.get_idx_split()["train"]``. A dataset without training
    vertices is made (for inference) with a warning that says how to pass them.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])))
        >>> g.ndata["feat"], g.ndata["label"] = torch.randn(3, 4), torch.tensor([0, 1, 1])
        >>> g.ndata["train_mask"] = torch.tensor([True, True, False])
        >>> ds = from_dgl(g)
        >>> ds.train_idx.tolist(), ds.num_classes, ds.graph.in_neighbors(1).tolist()
        ([0, 1], 2, [0])
    """
    graph = graph_from_dgl(g).graph.to("cpu")
    n = graph.num_nodes
    for key in (feat, label):
        if key not in g.ndata:
            raise ValueError(f"g.ndata has no {key!r} (it has {sorted(g.ndata.keys())}); name the keys with "
                             f"from_dgl(g, feat=..., label=...)")
    x = g.ndata[feat].detach().cpu()
    y, num_classes = class_labels(g.ndata[label], f"g.ndata[{label!r}]", num_classes)
    splits = {}
    given = {"train": train_idx, "val": val_idx, "test": test_idx}
    for what in ("train", "val", "test"):
        mask = g.ndata.get(f"{what}_mask")
        if given[what] is not None:
            splits[what] = as_vertex_ids(given[what], n, f"{what}_idx")
        elif mask is None:
            splits[what] = torch.zeros(0, dtype=torch.int64)
        else:
            mask = mask.cpu()
            mask = mask.bool() if not mask.dtype.is_floating_point and mask.dtype != torch.bool else mask
            splits[what] = as_vertex_ids(mask, n, f"g.ndata['{what}_mask']")
    if splits["train"].numel() == 0:
        log.warning("from_dgl: %s, so the dataset has no training vertices (enough for inference, not for "
                    "training); %s", _no_train_reason(g.ndata.get("train_mask"), train_idx), SPLIT_FIX)
    return Dataset(graph=graph, features=x.to(torch.float32).contiguous(), labels=y, train_idx=splits["train"],
                   val_idx=splits["val"], test_idx=splits["test"], num_classes=int(num_classes), name=name,
                   meta={"source": "dgl.DGLGraph"})


def to_dgl_block(block: Block, source: Optional[GraphFromDGL] = None):
    """The DGL block of a gsplit block: same edges in the same order, data attached, plan remembered.

    ``dgl.create_block`` from ``(block.edge_src, block.edge_dst)`` on the block's device, with
    ``srcdata[dgl.NID] = block.src_nodes``, ``dstdata[dgl.NID] = block.dst_nodes`` (global vertex ids),
    ``edata[dgl.EID]`` the edges' ids (DGL's ids when ``source`` is given, else gsplit's) and every
    tensor of ``block.srcdata`` / ``block.dstdata``. :func:`block_of` returns ``block`` for the result,
    which is how :class:`gsplit.SplitParallel` finds the shuffle plan of a split block.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> b = Block(src_nodes=torch.tensor([7, 3, 9]), num_dst=1, edge_src=torch.tensor([1, 2]),
        ...           edge_dst=torch.tensor([0, 0]), edge_ids=torch.tensor([40, 41]))
        >>> db = to_dgl_block(b)
        >>> db.num_src_nodes(), db.num_dst_nodes(), db.srcdata[dgl.NID].tolist(), block_of(db) is b
        (3, 1, [7, 3, 9], True)
    """
    dgl = _dgl()
    out = dgl.create_block((block.edge_src, block.edge_dst), num_src_nodes=block.num_src_nodes(),
                           num_dst_nodes=block.num_dst_nodes(), device=block.device)
    out.srcdata[dgl.NID] = block.src_nodes
    out.dstdata[dgl.NID] = block.dst_nodes
    out.edata[dgl.EID] = block.edge_ids if source is None else source.edge_ids(block.edge_ids)
    for key, value in block.srcdata.items():
        out.srcdata[key] = value
    for key, value in block.dstdata.items():
        out.dstdata[key] = value
    setattr(out, _PLAN_ATTR, block)
    return out


# The attribute of a DGL pair graph made by to_dgl_pair_graph that holds the gsplit PairGraph it was made from
_PAIR_ATTR = "_gsplit_pair_graph"


def to_dgl_pair_graph(pair, source: Optional[GraphFromDGL] = None):
    """The DGL graph of a link prediction :class:`~gsplit.link.PairGraph` (DGL's ``pair_graph``): its pairs as
    edges over ``pair.num_nodes()`` nodes (the rank's pair rows), ``ndata[dgl.NID]`` their global ids, for
    positives ``edata[dgl.EID]`` the edge ids (DGL's with ``source``). :func:`pair_of` returns ``pair`` for it,
    which is how :func:`gsplit.link.pair_rows` finds the exchange of the rows.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> from gsplit.link import PairGraph
        >>> p = PairGraph(torch.tensor([0]), torch.tensor([1]), torch.tensor([4, 9]), torch.tensor([0]), 1)
        >>> g = to_dgl_pair_graph(p)
        >>> g.num_nodes(), [t.tolist() for t in g.edges()], pair_of(g) is p
        (2, [[0], [1]], True)
    """
    dgl = _dgl()
    out = dgl.graph((pair.src, pair.dst), num_nodes=pair.num_nodes(), device=pair.src.device)
    out.ndata[dgl.NID] = pair.nodes
    if pair.edge_ids is not None:
        out.edata[dgl.EID] = pair.edge_ids if source is None else source.edge_ids(pair.edge_ids)
    setattr(out, _PAIR_ATTR, pair)
    return out


def pair_of(x):
    """The gsplit pair graph a DGL graph was made from by :func:`to_dgl_pair_graph`, else None.

    Example:
        >>> pair_of(torch.zeros(2)) is None
        True
    """
    return getattr(x, _PAIR_ATTR, None) if is_dgl_graph(x) else None


def to_dgl_batch(batch: MiniBatch, source: Optional[GraphFromDGL] = None) -> MiniBatch:
    """``batch`` with its blocks as DGL blocks (:func:`to_dgl_block`); ``input_nodes``/``output_nodes`` unchanged.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> from gsplit import NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> input_nodes, output_nodes, blocks = to_dgl_batch(NeighborSampler([2, 2]).sample(g, [0, 2]))
        >>> [b.is_block for b in blocks], blocks[-1].dstdata[dgl.NID].tolist()
        ([True, True], [0, 2])
    """
    blocks = [to_dgl_block(b, source) for b in batch.blocks]
    if hasattr(batch, "pair_graph"):  # link prediction (gsplit.link.LinkMiniBatch): DGL pair graphs too
        return replace(batch, pair_graph=to_dgl_pair_graph(batch.pair_graph, source), blocks=blocks,
                       neg_pair_graph=None if batch.neg_pair_graph is None else
                       to_dgl_pair_graph(batch.neg_pair_graph, source))
    return MiniBatch(batch.input_nodes, batch.output_nodes, blocks)


def is_dgl_sampler(x) -> bool:
    """True for a DGL block sampler (``dgl.dataloading.BlockSampler``). Never imports dgl.

    Example:
        >>> is_dgl_sampler(NeighborSampler([2]))
        False
    """
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(x, dgl.dataloading.BlockSampler)


@dataclass(frozen=True)
class SamplerFromDGL:
    """What a DGL ``NeighborSampler`` means for :class:`gsplit.DataLoader`."""

    sampler: NeighborSampler
    """gsplit's sampler with DGL's fanouts (input layer first, as in DGL) and ``replace``."""
    node_feats: List[str]
    """DGL's ``prefetch_node_feats``: ``ndata`` keys for ``blocks[0].srcdata``."""
    labels: List[str]
    """DGL's ``prefetch_labels``: ``ndata`` keys for ``blocks[-1].dstdata``."""


def sampler_from_dgl(sampler, seed: int = 0) -> SamplerFromDGL:
    """gsplit's equivalent of a DGL ``NeighborSampler`` / ``MultiLayerFullNeighborSampler`` (same fanouts).

    gsplit samples with its own counter-based sampler (a vertex's picks depend only on the seed, the
    epoch, the iteration, the layer and the vertex, which is what lets ranks split a mini-batch), so the
    neighbours picked differ from DGL's; the fanouts, ``replace`` and the ``prefetch_*`` names carry
    over. Options gsplit does not have (``edge_dir="out"``, ``prob``/``mask``, ``prefetch_edge_feats``,
    per-edge-type fanouts) raise ``ValueError``.

    Example:
        >>> import pytest; dgl = pytest.importorskip("dgl")   # (the test suite skips without DGL)
        >>> conv = sampler_from_dgl(dgl.dataloading.NeighborSampler([10, 5], prefetch_node_feats=["feat"]))
        >>> conv.sampler.fanouts, conv.node_feats, conv.labels
        ([10, 5], ['feat'], [])
    """
    dgl = _dgl()
    if not isinstance(sampler, dgl.dataloading.NeighborSampler):
        raise TypeError(f"gsplit converts DGL's NeighborSampler and MultiLayerFullNeighborSampler, got "
                        f"{type(sampler).__name__}; pass a gsplit.NeighborSampler(fanouts) instead")
    unsupported = []
    if sampler.edge_dir != "in":
        unsupported.append(f"edge_dir={sampler.edge_dir!r}")
    if sampler.prob is not None:
        unsupported.append(f"prob/mask={sampler.prob!r}")
    if sampler.prefetch_edge_feats:
        unsupported.append(f"prefetch_edge_feats={list(sampler.prefetch_edge_feats)}")
    if any(isinstance(f, dict) for f in sampler.fanouts):
        unsupported.append("per-edge-type fanouts")
    if unsupported:
        raise ValueError(f"the DGL sampler uses {', '.join(unsupported)}, which gsplit's sampler does not have; "
                         "use uniform in-edge sampling (gsplit.NeighborSampler(fanouts)) on a homogeneous graph")
    return SamplerFromDGL(sampler=NeighborSampler(list(sampler.fanouts), replace=sampler.replace, seed=seed),
                          node_feats=[str(k) for k in sampler.prefetch_node_feats],
                          labels=[str(k) for k in sampler.prefetch_labels])


# ---------------------------------------------------------------- DGL DataLoader keywords (gsplit.DataLoader)
def prefetch_flag(prefetch: Optional[bool], use_prefetch_thread: Optional[bool], num_workers: int) -> bool:
    """Whether a :class:`gsplit.DataLoader` prefetches: ``prefetch`` or DGL's ``use_prefetch_thread``, else ``num_workers > 0``.

    Example:
        >>> prefetch_flag(None, None, num_workers=4), prefetch_flag(False, None, num_workers=4)
        (True, False)
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    if prefetch is not None and use_prefetch_thread is not None and bool(prefetch) != bool(use_prefetch_thread):
        raise ValueError(f"prefetch={prefetch} and use_prefetch_thread={use_prefetch_thread} disagree; they mean the "
                         "same (sample the next mini-batch in a background thread): pass one of them")
    for flag in (prefetch, use_prefetch_thread):
        if flag is not None:
            return bool(flag)
    if num_workers > 0:
        log.info("num_workers=%d: sampling runs in this rank's process (it exchanges ids with the other ranks); "
                 "prefetching the next mini-batch in a background thread instead", num_workers)
    return num_workers > 0


def named_node_data(dgl_graph, keys: Optional[Sequence[str]], arg: str, default_key: str,
                    given, given_arg: str) -> Dict[str, object]:
    """``key -> per-vertex tensor`` for one side of a loader's blocks (DGL's ``prefetch_node_feats`` or
    ``prefetch_labels``, ``arg`` names which).

    With a DGLGraph the keys name ``ndata`` entries (``given`` replaces the first one's tensor; a default
    key missing from ``ndata`` loads nothing); with a gsplit Graph (``dgl_graph=None``) there is one
    tensor, ``given``, and at most one key: where it lands.

    Example:
        >>> named_node_data(None, ["h"], "prefetch_node_feats", "feat", torch.zeros(3, 2), "features")["h"].shape
        torch.Size([3, 2])
    """
    if isinstance(keys, str):
        raise TypeError(f"{arg} is a list of names, got the string {keys!r}; pass [{keys!r}]")
    explicit = keys is not None
    keys = [default_key] if keys is None else list(keys)
    if not keys:
        if given is not None:
            raise ValueError(f"{arg}=[] loads nothing but {given_arg}= was given; name its key in {arg} or leave "
                             f"{given_arg} out")
        return {}
    if dgl_graph is None:
        if len(keys) > 1:
            raise ValueError(f"{arg}={keys} names {len(keys)} tensors but with a gsplit.Graph the loader has one "
                             f"({given_arg}=); name one key, or pass a DGLGraph whose ndata holds them all")
        return {} if given is None else {keys[0]: given}
    out = {}
    for i, key in enumerate(keys):
        if i == 0 and given is not None:
            out[key] = given
        elif key in dgl_graph.ndata:
            out[key] = dgl_graph.ndata[key]
        elif explicit:
            raise ValueError(f"{arg} names {key!r} but the DGLGraph's ndata holds {sorted(dgl_graph.ndata.keys())}; "
                             f"name existing keys (or pass {given_arg}=)")
    return out  # ndata tensors have one row per vertex (DGL checks); the given ones are checked by the loader


def loader_sampler(sampler, prefetch_node_feats: Optional[Sequence[str]], prefetch_labels: Optional[Sequence[str]]):
    """``(sampler, prefetch_node_feats, prefetch_labels)`` for :class:`gsplit.DataLoader`: a DGL sampler becomes
    gsplit's (:func:`sampler_from_dgl`) and its ``prefetch_*`` names fill in those the loader was not given.

    Example:
        >>> s = NeighborSampler([2])
        >>> loader_sampler(s, None, ["y"])[0] is s            # a gsplit sampler passes through
        True
    """
    if not is_dgl_sampler(sampler):
        return sampler, prefetch_node_feats, prefetch_labels
    converted = sampler_from_dgl(sampler)
    log.info("DataLoader: DGL's %s becomes gsplit.NeighborSampler(%s): the same fanouts, gsplit's counter-based "
             "picks (split parallelism needs them)", type(sampler).__name__, converted.sampler.fanouts)
    if prefetch_node_feats is None and converted.node_feats:
        prefetch_node_feats = converted.node_feats
    if prefetch_labels is None and converted.labels:
        prefetch_labels = converted.labels
    return converted.sampler, prefetch_node_feats, prefetch_labels
