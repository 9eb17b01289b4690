"""Online splitting of a global mini-batch: split sampling and its id exchange."""

from gsplit.split.split_sampling import exchange_ids, local_targets, sp_sample

__all__ = ["sp_sample", "exchange_ids", "local_targets"]
