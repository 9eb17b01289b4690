"""gsplit: split-parallel GNN training on one multi-GPU host.

One global mini-batch per iteration, split across ranks by a partition map computed offline, with an
all-to-all shuffle per layer. See README.md for a quick start and DESIGN.md for how the parts fit.
"""

from gsplit import datasets
from gsplit.comm import Communicator, shuffle
from gsplit.feature_store import FeatureStore
from gsplit.graph import Graph
from gsplit.launch import LaunchError, current_device, launch
from gsplit.loader import DataLoader
from gsplit.nn import allreduce_gradients, sp_forward, split_cross_entropy
from gsplit.parallel import SplitParallel
from gsplit.partition import PartitionMap, PresampleWeights, partition, presample, split_stats
from gsplit.sampling import Block, NeighborSampler
from gsplit.split import ShuffleIndex, sp_sample

__version__ = "0.1.0"

__all__ = [
    "Graph", "Block", "NeighborSampler", "datasets",
    "presample", "PresampleWeights", "partition", "PartitionMap", "split_stats",
    "Communicator", "shuffle", "ShuffleIndex", "sp_sample", "sp_forward",
    "split_cross_entropy", "allreduce_gradients", "DataLoader", "FeatureStore", "launch", "LaunchError", "current_device",
    "__version__",
]
