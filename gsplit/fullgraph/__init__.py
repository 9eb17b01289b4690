"""Full-graph training, split-parallel: every vertex's layer rows computed once, by its owner
(:mod:`gsplit.fullgraph.loader`: :class:`FullGraphLoader`, the memory estimate and its checks), and the
boundary-first overlapped forward (:mod:`gsplit.fullgraph.overlap`). Across hosts: one split group of every
rank (the same loader over every rank), or shared preloading (:mod:`gsplit.fullgraph.preload`:
:class:`PreloadLoader`, each host its vertices plus their halo, :mod:`gsplit.fullgraph.hosts`). A share too large
for its ranks' memory trains in co-batches (:mod:`gsplit.fullgraph.cobatch`: :class:`CoBatchLoader`,
:func:`full_graph_loader` chooses).
"""

from gsplit.fullgraph.loader import (IGNORE_INDEX, FullGraph, FullGraphLoader, FullGraphMemoryError, MemoryEstimate,
                                     available_memory, check_split_safe, estimate_memory, layer_dims,
                                     recompute_layers)
from gsplit.fullgraph.hosts import HostSubgraph, host_subgraph
from gsplit.fullgraph.preload import HostFullGraph, PreloadLoader
from gsplit.fullgraph.cobatch import CoBatchChoice, CoBatchLoader, choose_co_batches, full_graph_loader

__all__ = ["FullGraphLoader", "FullGraph", "FullGraphMemoryError", "MemoryEstimate", "IGNORE_INDEX",
           "available_memory", "check_split_safe", "estimate_memory", "layer_dims", "recompute_layers",
           "PreloadLoader", "HostFullGraph", "HostSubgraph", "host_subgraph", "CoBatchLoader", "CoBatchChoice",
           "choose_co_batches", "full_graph_loader"]
