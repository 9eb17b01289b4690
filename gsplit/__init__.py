"""gsplit: split-parallel GNN training on one multi-GPU host.

See README.md for a quick start and DESIGN.md for how the parts fit together.
"""

from gsplit.graph import Graph
from gsplit.sampling import Block, NeighborSampler

__version__ = "0.1.0"

__all__ = ["Graph", "Block", "NeighborSampler", "__version__"]
