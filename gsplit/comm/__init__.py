"""Communication: all-to-all over torch.distributed, the autograd shuffle, gradient sums."""

from gsplit.comm.communicator import Communicator, TrafficCounter, as_communicator, bind_group, group_of
from gsplit.comm.gradients import allreduce_gradients, global_sum
from gsplit.comm.hosts import host_groups, replica_layout
from gsplit.comm.shuffle import shuffle, shuffle_rows

__all__ = ["Communicator", "TrafficCounter", "as_communicator", "bind_group", "group_of", "shuffle", "shuffle_rows",
           "allreduce_gradients", "global_sum", "host_groups", "replica_layout"]
