"""Offline half of GSplit: pre-sampling, partitioning strategies, the partition map and split statistics."""

from gsplit.partition.metis import METHODS, metis_part_kway, partition, symmetrize, to_metis_weights
from gsplit.partition.partition_map import PartitionMap
from gsplit.partition.presample import PresampleWeights, presample
from gsplit.partition.stats import SplitStats, split_stats

__all__ = [
    "METHODS",
    "PartitionMap",
    "PresampleWeights",
    "SplitStats",
    "metis_part_kway",
    "partition",
    "presample",
    "split_stats",
    "symmetrize",
    "to_metis_weights",
]
