"""Full-graph training, split-parallel: every vertex's layer rows computed once, by its owner
(:mod:`gsplit.fullgraph.loader`: :class:`FullGraphLoader`, the memory estimate and its checks), and the
boundary-first overlapped forward (:mod:`gsplit.fullgraph.overlap`).

One host today; hosts modes (one split group across hosts, per-host preloading) go beside the loader.
"""

from gsplit.fullgraph.loader import (IGNORE_INDEX, FullGraph, FullGraphLoader, FullGraphMemoryError, MemoryEstimate,
                                     available_memory, check_split_safe, estimate_memory, layer_dims,
                                     recompute_layers)

__all__ = ["FullGraphLoader", "FullGraph", "FullGraphMemoryError", "MemoryEstimate", "IGNORE_INDEX",
           "available_memory", "check_split_safe", "estimate_memory", "layer_dims", "recompute_layers"]
