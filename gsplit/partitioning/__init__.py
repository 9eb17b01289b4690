"""Offline half of GSplit: pre-sampling, partitioning strategies, the partition map and split statistics."""

from gsplit.partitioning.full_graph import partition_full_graph
from gsplit.partitioning.metis import metis_part_kway, symmetrize, to_metis_weights
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.prepare import PRESAMPLING_METHODS, PreparedPartition, prepare_partition
from gsplit.partitioning.presample import presample
from gsplit.partitioning.stats import FullGraphStats, SplitStats, full_graph_stats, split_stats
from gsplit.partitioning.strategies import METHODS, partition
from gsplit.partitioning.weights import PresampleWeights

__all__ = [
    "METHODS",
    "FullGraphStats",
    "full_graph_stats",
    "partition_full_graph",
    "PartitionMap",
    "PRESAMPLING_METHODS",
    "PreparedPartition",
    "prepare_partition",
    "PresampleWeights",
    "SplitStats",
    "metis_part_kway",
    "partition",
    "presample",
    "split_stats",
    "symmetrize",
    "to_metis_weights",
]
