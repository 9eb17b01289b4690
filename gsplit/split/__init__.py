"""Online splitting of a global mini-batch: split sampling and the shuffle index."""

from gsplit.split.shuffle_index import ShuffleIndex
from gsplit.split.sp_sample import SplitBatch, exchange_ids, sp_sample

__all__ = ["ShuffleIndex", "SplitBatch", "sp_sample", "exchange_ids"]
