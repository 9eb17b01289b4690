"""Counter-based neighbour sampling and the ``Block`` type it produces."""

from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler, SampledEdges, relabel

__all__ = ["Block", "NeighborSampler", "SampledEdges", "relabel"]
