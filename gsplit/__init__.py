"""gsplit: split-parallel GNN training on one multi-GPU host.

One global mini-batch per iteration, split across ranks by a partition map computed offline, with an
all-to-all shuffle per layer. See README.md for a quick start and DESIGN.md for how the parts fit.
"""

from gsplit import _moved

_moved.install_finder()  # old module paths (gsplit.trainer, gsplit.launch.X, ...) keep importing

from gsplit import datasets  # noqa: E402
from gsplit.comm import Communicator, allreduce_gradients, global_sum, host_groups, shuffle  # noqa: E402
from gsplit.data.feature_store import FeatureStore  # noqa: E402
from gsplit.data.graph import Graph  # noqa: E402
from gsplit.fullgraph import FullGraphLoader, recompute_layers  # noqa: E402
from gsplit.launcher import (LaunchError, LaunchInterrupted, current_device, launch, report_progress,  # noqa: E402
                             spawn, world_size)
from gsplit.link import as_edge_prediction_sampler, negative as negative_sampler  # noqa: E402
from gsplit.minibatch.inference import InferenceResult, layerwise_inference  # noqa: E402
from gsplit.minibatch.loader import DataLoader  # noqa: E402
from gsplit.minibatch.parallel import SplitParallel  # noqa: E402
from gsplit.nn import sp_forward, split_cross_entropy  # noqa: E402
from gsplit.partitioning import (PartitionMap, PresampleWeights, full_graph_stats, partition,  # noqa: E402
                                 partition_full_graph,
                                 prepare_partition, presample, split_stats)
from gsplit.sampling import Block, MiniBatch, NeighborSampler, ShuffleIndex  # noqa: E402
from gsplit.split import sp_sample  # noqa: E402

__version__ = "0.1.0"

_moved.alias_launcher()

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
