"""Comparison systems that run in the same training harness as split parallelism."""

from gsplit.baselines.data_parallel import DataParallelLoader

__all__ = ["DataParallelLoader"]
