"""What :class:`gsplit.DataLoader` does differently for an edge sampler (link prediction), in one place.

The loader's schedule iterates edge ids; each global mini-batch of edges is planned
(:meth:`~gsplit.link.sampler.EdgePredictionSampler.plan`) into the vertex targets that the split machinery
samples as usual, with a node sampler that leaves out the excluded edges; the pairs are then split by owner
(:func:`~gsplit.link.sampler.attach_pairs`). Nothing here runs a collective, so it is safe in the loader's
prefetch thread.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from gsplit.data.graph import Graph
from gsplit.link.negative import CallableNegatives
from gsplit.link.sampler import EdgeBatch, EdgePredictionSampler, as_edge_ids, edge_endpoints
from gsplit.sampling.neighbor import NeighborSampler


def unwrap_edge_sampler(sampler, graph_kind: str, replica_group) -> Tuple[Optional[EdgePredictionSampler], object]:
    """``(edge_sampler, node_sampler)`` of the loader's ``sampler`` argument: ``(None, sampler)`` for a node
    sampler; one error line for what link prediction does not support yet.

    Example:
        >>> s = NeighborSampler([2])
        >>> unwrap_edge_sampler(s, "gsplit", None) == (None, s)
        True
    """
    if not isinstance(sampler, EdgePredictionSampler):
        return None, sampler
    if replica_group is not None:
        raise ValueError("an edge sampler with replica_group (several hosts) is not supported yet; train link "
                         "prediction on one host")
    return sampler, sampler.sampler


def native_edge_ids(source, given) -> Optional[torch.Tensor]:
    """For each gsplit edge, its id in the input graph (DGL's edge id, PyG's ``edge_index`` column), or ``None``
    when they coincide or the input is a gsplit graph. ``given``: the loader's graph argument, ``source`` its
    :func:`~gsplit.interop.graphs.graph_input`.

    gsplit orders edges by (destination, source), stably: a PyG edge's place is its rank in that order.
    """
    if source.kind == "dgl":
        return source.dgl_source.dgl_edge_ids
    if source.kind == "pyg":
        n = source.graph.num_nodes
        src, dst = (t.cpu().to(torch.int64) for t in given.edge_index)
        order = torch.sort(dst * n + src, stable=True).indices
        return None if torch.equal(order, torch.arange(order.numel())) else order
    return None


def from_input_edge_ids(train_eids, edge_sampler: EdgePredictionSampler, graph: Graph,
                        native: Optional[torch.Tensor], graph_for_fn
                        ) -> Tuple[torch.Tensor, EdgePredictionSampler]:
    """A ``DGLGraph`` or PyG ``Data`` input: its training edge ids and ``reverse_eids`` (the input's own ids,
    ``native[gsplit id]``) as gsplit's, and a callable negative sampler given the input graph and its ids."""
    out = edge_sampler.with_node_sampler(edge_sampler.sampler)
    if isinstance(out.negative_sampler, CallableNegatives):
        to_native = None if native is None else (lambda e: native.index_select(0, e.cpu()).to(e.device))
        out.negative_sampler = CallableNegatives(out.negative_sampler.fn, graph_for_fn=graph_for_fn,
                                                 eids_for_fn=to_native)
    train_eids = as_edge_ids(train_eids, graph)
    if native is None:
        return train_eids, out
    gsplit_of = torch.empty_like(native)
    gsplit_of[native] = torch.arange(native.numel())
    if out.reverse_eids is not None:
        out.check_reverse_eids(graph)  # its length and range, before it is indexed
        out.reverse_eids = gsplit_of.index_select(0, out.reverse_eids.index_select(0, native))
    return gsplit_of.index_select(0, train_eids), out


def bind_node_sampler(edge_sampler: EdgePredictionSampler, sampler: NeighborSampler, graph: Graph,
                      train_eids: torch.Tensor) -> Tuple[EdgePredictionSampler, torch.Tensor]:
    """The edge sampler around the loader's (converted) node sampler, checked against ``graph``, and the
    vertices the training edges touch (the targets a default partition map is made for)."""
    edge_sampler = edge_sampler.with_node_sampler(sampler)
    edge_sampler.check(graph)
    touched = torch.zeros(graph.num_nodes, dtype=torch.bool, device=train_eids.device)
    for ends in edge_endpoints(graph, train_eids):  # a mask: torch.unique of 2.6M endpoints took seconds
        touched[ends.to(touched.device)] = True
    return edge_sampler, torch.nonzero(touched).squeeze(1)


def plan_group(edge_sampler: EdgePredictionSampler, graph: Graph, group: Sequence[Tuple[int, torch.Tensor]],
               epoch: int) -> Tuple[List[Tuple[int, torch.Tensor]], NeighborSampler, List[EdgeBatch]]:
    """For ``group`` (``(iteration, global edge ids)`` pairs: a mini-batch or a macrobatch's): the
    ``(iteration, vertex targets)`` pairs to split, the node sampler to split them with, and the planned
    batches (for :func:`~gsplit.link.sampler.attach_pairs`)."""
    batches = [edge_sampler.plan(graph, eids, epoch, it) for it, eids in group]
    return [(b.iteration, b.seeds) for b in batches], edge_sampler.node_sampler(graph, batches), batches
