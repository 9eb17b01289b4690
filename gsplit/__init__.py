"""gsplit: split-parallel GNN training on one multi-GPU host.

One global mini-batch per iteration, split across ranks by a partition map computed offline, with an
all-to-all shuffle per layer. See README.md for a quick start and DESIGN.md for how the parts fit.
"""

from gsplit import datasets
from gsplit.comm import Communicator, allreduce_gradients, global_sum, host_groups, shuffle
from gsplit.feature_store import FeatureStore
from gsplit.fullgraph import FullGraphLoader, recompute_layers
from gsplit.graph import Graph
from gsplit.inference import InferenceResult, layerwise_inference
from gsplit.link import as_edge_prediction_sampler, negative as negative_sampler
from gsplit.launch import LaunchError, LaunchInterrupted, current_device, launch, report_progress, spawn, world_size
from gsplit.loader import DataLoader
from gsplit.nn import sp_forward, split_cross_entropy
from gsplit.parallel import SplitParallel
from gsplit.partitioning import (PartitionMap, PresampleWeights, full_graph_stats, partition, partition_full_graph,
                                 prepare_partition, presample, split_stats)
from gsplit.sampling import Block, MiniBatch, NeighborSampler, ShuffleIndex
from gsplit.split import sp_sample

__version__ = "0.1.0"

__all__ = [
    "Graph", "Block", "MiniBatch", "NeighborSampler", "SplitParallel", "datasets",
    "presample", "PresampleWeights", "partition", "PartitionMap", "split_stats", "prepare_partition",
    "Communicator", "shuffle", "ShuffleIndex", "sp_sample", "sp_forward",
    "split_cross_entropy", "allreduce_gradients", "global_sum", "host_groups", "DataLoader", "FeatureStore", "launch", "LaunchError", "current_device",
    "LaunchInterrupted", "report_progress", "world_size", "spawn",
    "layerwise_inference", "InferenceResult",
    "FullGraphLoader", "recompute_layers", "partition_full_graph", "full_graph_stats",
    "as_edge_prediction_sampler", "negative_sampler",
    "__version__",
]
