"""All-to-all over torch.distributed and the autograd shuffle."""

from gsplit.comm.communicator import Communicator, TrafficCounter
from gsplit.comm.shuffle import shuffle, shuffle_rows

__all__ = ["Communicator", "TrafficCounter", "shuffle", "shuffle_rows"]
