"""Online splitting of a global mini-batch: split sampling and its id exchange."""

from gsplit.split.split_sampling import exchange_ids, exchange_ids_many, local_targets, sp_sample, sp_sample_many

__all__ = ["sp_sample", "sp_sample_many", "exchange_ids", "exchange_ids_many", "local_targets"]
