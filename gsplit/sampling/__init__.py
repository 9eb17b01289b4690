"""Counter-based neighbour sampling and the types it produces (``Block``, ``ShuffleIndex``, ``MiniBatch``)."""

from gsplit.sampling.block import Block, MiniBatch, ShuffleIndex
from gsplit.sampling.neighbor import Exchange, NeighborSampler, SampledEdges
from gsplit.ops import relabel  # noqa: E402 - the block relabelling, part of sampling's public API

__all__ = ["Block", "MiniBatch", "ShuffleIndex", "NeighborSampler", "SampledEdges", "Exchange", "relabel"]
