"""Full-graph training across hosts with shared preloading (GraNNDis): every layer's exchange stays inside a host.

A host map (one part per host, e.g. :func:`gsplit.partition_full_graph` with ``num_parts=H``) gives each
host its inner vertices. Each host preloads its inner vertices plus their L-hop halo
(:func:`gsplit.fullgraph.hosts.host_subgraph`) and trains that share with the ordinary full-graph machinery
(:class:`gsplit.FullGraphLoader`'s blocks, shuffles over the host's own process group, its ranks' parts
from a full-graph METIS map of the share); the loss counts the host's inner training vertices, divided by
the training vertices of the whole graph, and the gradients are summed over every rank of every host
(``gsplit.allreduce_gradients(model, world)``). With the full halo that step equals single-process
full-graph training; the halo's vertices are computed on their own host and again on every host that
preloads them (the redundant work that buys a step without per-layer traffic across hosts).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from gsplit.comm.communicator import as_communicator
from gsplit.comm.hosts import check_same_everywhere, replica_layout
from gsplit.data.finite import first_non_finite_row
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.fullgraph.hosts import HostSubgraph, host_subgraph
from gsplit.fullgraph.loader import FullGraph, FullGraphLoader, _build, _check_fits, estimate_memory
from gsplit.minibatch.rank_loader import IterationStats
from gsplit.partitioning.full_graph import partition_full_graph
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.stats import full_graph_stats
from gsplit.sampling.block import Block

log = logging.getLogger(__name__)

__all__ = ["PreloadLoader", "HostFullGraph", "host_map_tensor", "host_share"]


@dataclass
class HostFullGraph(FullGraph):
    """A :class:`FullGraph` built over one host's share, relabelled to global vertex and edge ids."""

    share: Optional[HostSubgraph] = None
    """The host's vertices, kept edges and external hops (local ids; ``share.nodes`` maps them to global)."""


def host_map_tensor(host_map, graph: Graph, num_hosts: int) -> torch.Tensor:
    """The host of every vertex (int64), from a :class:`PartitionMap` or a tensor, checked against the job's hosts.

    Example:
        >>> g = Graph.from_edges([0, 1], [1, 2])
        >>> host_map_tensor(torch.tensor([0, 1, 1]), g, num_hosts=2).tolist()
        [0, 1, 1]
    """
    if isinstance(host_map, PartitionMap):
        host_map.check_graph(graph)
        if host_map.num_parts != int(num_hosts):
            raise ValueError(f"the host map has {host_map.num_parts} parts but the job has {num_hosts} hosts; make one "
                             f"with one part per host (gsplit prepare --full-graph --num-parts {num_hosts})")
        host_map = host_map.assignment
    owner = torch.as_tensor(host_map).to("cpu", torch.int64)
    if owner.shape != (graph.num_nodes,):
        raise ValueError(f"the host map has {owner.numel()} entries but the graph has {graph.num_nodes} vertices; "
                         "pass one host per vertex")
    if owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= int(num_hosts)):
        raise ValueError(f"the host map names hosts {int(owner.min())}..{int(owner.max())} but the job has "
                         f"{num_hosts} hosts (0..{int(num_hosts) - 1}); make one with one part per host")
    return owner


def host_share(graph: Graph, host_map: torch.Tensor, host: int, num_layers: int, comm, *,
               external_hops: Optional[int] = None, external_fanout: Optional[int] = None, seed: int = 0):
    """Host ``host``'s share (:func:`gsplit.fullgraph.host_subgraph`) and the rank of the host (of ``comm``, its
    split group) that owns each of its vertices: a full-graph METIS map of the share, made on every rank of the host
    and compared (any map gives the same result).

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 4])
        >>> share, ranks = host_share(g, torch.tensor([0, 0, 0, 1, 1]), 1, 2, as_communicator(None))
        >>> share.nodes.tolist(), ranks.tolist()
        ([1, 2, 3, 4], [0, 0, 0, 0])
    """
    share = host_subgraph(graph, host_map, host, num_layers, external_hops=external_hops,
                          external_fanout=external_fanout, seed=seed)
    size = comm.world_size
    if size > 1 and share.nodes.numel() < size:  # too few for METIS (a host map with an empty part): round robin
        ranks = torch.arange(share.nodes.numel()) % size
    elif size > 1:  # the host's ranks split its share by a full-graph map of it (any map gives the same result)
        ranks = partition_full_graph(share.graph, size, seed=seed).assignment.to(torch.int64)
        digest = hashlib.sha256(ranks.numpy().tobytes()).hexdigest()
        check_same_everywhere([digest], comm, f"host {host}'s map of its share over its ranks")
    else:
        ranks = torch.zeros(share.nodes.numel(), dtype=torch.int64)
    return share, ranks


def _relabel(block: Block, share: HostSubgraph) -> Block:
    """``block`` with global vertex and edge ids (its rows and shuffle plan are positional: unchanged)."""
    nodes, edges = share.nodes.to(block.device), share.edge_ids.to(block.device)
    return replace(block, src_nodes=nodes[block.src_nodes], edge_ids=edges[block.edge_ids])


class PreloadLoader(FullGraphLoader):
    """Full-graph training across hosts, shared preloading: this host's share, split over its ranks.

    Args:
        graph: the whole graph (every rank holds it; each host keeps only its share's blocks).
        num_layers: layers of the model.
        host_map: a :class:`gsplit.PartitionMap` with one part per host (or a tensor of hosts).
        group: this host's process group (its split group), e.g. the first of :func:`gsplit.host_groups`.
        replica_group: every rank of the job (the second of :func:`gsplit.host_groups`); hosts are numbered
            by their lowest global rank, host ``h`` gets part ``h`` of ``host_map``.
        features, labels, train_idx, device, memory_limit, feat_key, label_key, overlap: as for
            :class:`gsplit.FullGraphLoader` (``features``: the whole table, or another preload loader's
            ``feature_store`` to share its blocks). The loss rows are this host's inner training vertices;
            ``blocks[-1].global_num_dst`` is the training set of the whole graph.
        external_hops, external_fanout, seed: expansion-aware sampling (see :mod:`gsplit.fullgraph.hosts`);
            ``None`` (default): the full halo, exact.
        share: this host's ``(share, ranks)`` from :func:`host_share` when the caller made them already.

    The model's gradients must be summed over ``replica_group`` (``gsplit.allreduce_gradients(model, world)``),
    the loss likewise (``gsplit.global_sum(loss, world)``).

    Example:
        >>> host, world = gsplit.host_groups()                  # under torchrun  # doctest: +SKIP
        >>> hmap = gsplit.partition_full_graph(ds.graph, num_hosts)                 # doctest: +SKIP
        >>> loader = PreloadLoader(ds.graph, 2, host_map=hmap, group=host, replica_group=world,
        ...                        features=ds.features, labels=ds.labels, train_idx=ds.train_idx)  # doctest: +SKIP
    """

    def __init__(self, graph: Graph, num_layers: int, *, host_map, group, replica_group, features=None, labels=None,
                 train_idx=None, device: Union[str, torch.device, None] = None,
                 memory_limit: Union[str, int, None] = "auto", feat_key: str = "feat", label_key: str = "label",
                 overlap: bool = False, external_hops: Optional[int] = None, external_fanout: Optional[int] = None,
                 seed: int = 0, share: Optional[tuple] = None):
        if int(num_layers) < 1:
            raise ValueError(f"num_layers={num_layers}; pass the number of layers of the model (at least 1)")
        self._skip, self._epoch, self._first = False, 0, True
        self.last_stats = IterationStats()
        self.graph = graph
        self.num_layers = int(num_layers)
        self.comm = as_communicator(group)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.feat_key, self.label_key = feat_key, label_key
        self.num_replicas, self.replica_rank = replica_layout(group, replica_group)
        self.owner = host_map_tensor(host_map, graph, self.num_replicas)
        self.host = self.replica_rank
        self.memory_limit = self._limit(memory_limit)
        if isinstance(features, HostFullGraph):
            full = features
            if full.num_nodes != graph.num_nodes or full.world_size != self.comm.world_size or \
                    len(full.blocks) != self.num_layers or full.share.host != self.host:
                raise ValueError("features is another preload loader's feature_store for another graph, host, group "
                                 "or depth; share it only between loaders of the same host and model depth")
            self._first = False
        else:
            full = self._build_share(graph, features, external_hops, external_fanout, seed, overlap, share)
        self.full_graph = full
        self.blocks = self._labels_of_host(full, labels, train_idx)

    def _build_share(self, graph, features, external_hops, external_fanout, seed, overlap, made=None) -> HostFullGraph:
        share, ranks = made if made is not None else host_share(
            graph, self.owner, self.host, self.num_layers, self.comm, external_hops=external_hops,
            external_fanout=external_fanout, seed=seed)
        size = self.comm.world_size
        local = None
        if features is not None:
            if features.dim() != 2 or features.shape[0] != graph.num_nodes:
                raise ValueError(f"features has shape {tuple(features.shape)} but the graph has {graph.num_nodes} "
                                 "vertices; pass one feature row per vertex")
            local = features[share.nodes.to(features.device)]  # the preloaded rows: inner vertices and halo
            bad = first_non_finite_row(local) if local.dtype.is_floating_point else None
            if bad is not None:
                raise ValueError(f"features hold NaN or inf (row {int(share.nodes[bad])}); clean the features before "
                                 "training")
        stats = full_graph_stats(share.graph, ranks, size)
        need = estimate_memory(stats, self.comm.rank, 0 if local is None else local.shape[1],
                               dtype_bytes=4 if local is None else local.element_size())
        _check_fits(need, self.memory_limit, f"host {self.host}'s share ({share.nodes.numel()} vertices, "
                                             f"{share.graph.num_edges} edges)")
        built = _build(share.graph, ranks, self.num_layers, self.comm, self.device, local, self.feat_key, stats,
                       overlap)
        plan = built.overlap_plan
        if plan is not None:
            plan = replace(plan, boundary_blocks=[_relabel(b, share) for b in plan.boundary_blocks],
                           interior_blocks=[_relabel(b, share) for b in plan.interior_blocks])
        full = HostFullGraph(nodes=share.nodes.to(built.nodes.device)[built.nodes],
                             blocks=[_relabel(b, share) for b in built.blocks], num_nodes=graph.num_nodes,
                             world_size=size, stats=stats, build_s=built.build_s, traffic=built.traffic,
                             overlap_plan=plan, share=share)
        log.info("host %d preloaded %d vertices (%d inner, %d halo) and %d edges in %.2fs; rank %d of the host owns "
                 "%d of them", self.host, share.nodes.numel(), share.num_inner, share.num_halo, share.graph.num_edges,
                 full.build_s, self.comm.rank, full.nodes.numel())
        return full

    def _labels_of_host(self, full: HostFullGraph, labels, train_idx):
        """The top block's labels and loss rows: the host's inner training vertices, over the whole training set."""
        n = self.graph.num_nodes
        if train_idx is None:
            train = torch.as_tensor(labels).cpu() >= 0 if labels is not None else torch.ones(n, dtype=torch.bool)
        else:
            train = torch.zeros(n, dtype=torch.bool)
            train[as_vertex_ids(train_idx, n, "train_idx", unique=True)] = True
        if labels is not None and torch.as_tensor(labels).dim() == 1 and torch.as_tensor(labels).shape[0] == n:
            bad = train & (torch.as_tensor(labels).cpu() < 0)
            if bool(bad.any()):  # said for every vertex, also one another host trains
                v = int(bad.nonzero()[0])
                raise ValueError(f"training vertex {v} has label {int(labels[v])}; every training vertex needs a "
                                 "class >= 0")
        total = int(train.sum())
        mine = (train & (self.owner == self.host)).nonzero().flatten()
        blocks = self._with_labels(full, labels, mine)
        blocks[-1] = replace(blocks[-1], global_num_dst=total)
        return blocks

    @property
    def share(self) -> HostSubgraph:
        """This host's vertices (inner and halo) and kept edges."""
        return self.full_graph.share
