"""Former home of the split-parallel helpers, kept so that existing imports keep working.

New code imports them from ``gsplit`` (``gsplit.split_cross_entropy``, ``gsplit.allreduce_gradients``,
``gsplit.global_sum``, ``gsplit.sp_forward``); they live in :mod:`gsplit.nn.loss`,
:mod:`gsplit.comm.gradients` and :mod:`gsplit.nn.forward`.
"""

from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.nn.forward import sp_forward
from gsplit.nn.loss import split_cross_entropy

__all__ = ["allreduce_gradients", "global_sum", "sp_forward", "split_cross_entropy"]
