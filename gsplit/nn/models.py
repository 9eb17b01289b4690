"""Ready-made node-classification models whose forward works on reference and split blocks alike.

Every model runs :func:`gsplit.sp_forward`: on split blocks it shuffles between layers, on ordinary
blocks (single process, data parallel) the shuffle is the identity, so one model serves every system.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from gsplit.nn.deep import DeepGCN, DeepSAGE
from gsplit.nn.dropout import SteppedModel, dropout_bank, relu_vertex_dropout
from gsplit.nn.layers import GATConv, GraphConv, SAGEConv
from gsplit.nn.forward import sp_forward
from gsplit.ops.rows import place_rows
from gsplit.sampling.block import Block


class _Stack(SteppedModel):
    """Layers plus the activation and dropout applied between them (on the rank's own rows).

    Dropout is :func:`~gsplit.nn.dropout.vertex_dropout`: a vertex's mask depends on the vertex, the
    layer and the training step (counted by this module), so split training with dropout still computes
    exactly what single-process training computes.
    """

    def __init__(self, layers: Sequence[nn.Module], dropout: float, seed: int = 0):
        super().__init__()
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout={dropout}; it must be in [0, 1)")
        self.layers = nn.ModuleList(layers)
        self.dropout = float(dropout)
        self.seed = int(seed)
        self.step = 0
        """Training forward passes so far; every rank counts the same, which keys the dropout masks."""

    def between(self, i: int, h: torch.Tensor, block: Block,
                place: Optional[Tuple[int, torch.Tensor]] = None) -> torch.Tensor:
        """ReLU and dropout after layer ``i`` (not the last) on its rows of ``block``'s destinations. ``place``: the
        result placed as :func:`gsplit.ops.rows.place_rows` places it (an overlapped layer's interior rows go
        straight into the next layer's input, :mod:`gsplit.minibatch.overlap`)."""
        if self.training and self.dropout > 0:  # ReLU and dropout in one pass (the same bits as one after the other)
            return relu_vertex_dropout(h, block.dst_nodes, self.dropout, self.seed, self.step, i, bank=self._bank(i, h),
                                       place=place)
        return F.relu(h) if place is None else place_rows(F.relu(h), *place)

    def _bank(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Layer ``i``'s dropout mask bank of this step, drawn once: an overlapped layer (:mod:`gsplit.minibatch.overlap`)
        calls :meth:`between` for two parts of its rows. Only the current step's banks are kept."""
        key = (self.step, i, tuple(h.shape[1:]), h.dtype, h.device)
        banks = self.__dict__.setdefault("_dropout_banks", {})
        if key not in banks:
            if any(k[0] != self.step for k in banks):
                banks.clear()
            banks[key] = dropout_bank(h, self.dropout, self.seed, self.step, i, dtype=torch.bool)  # as drawn
        return banks[key]

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """What follows the last layer (identity here); layer-wise inference calls it too."""
        return h

    def forward(self, blocks: List[Block], x: torch.Tensor, group=None, clock=None) -> torch.Tensor:
        """Logits of the top block's destinations; ``group`` is where split blocks shuffle (default: the
        group the loader bound to the blocks); ``clock`` times each layer (see :func:`sp_forward`)."""
        if self.training:
            self.step += 1
        return self.output(sp_forward(self.layers, x, blocks, between=self.between, group=group, clock=clock))


class SAGE(_Stack):
    """GraphSAGE with mean aggregation.

    Example:
        >>> model = SAGE(in_feats=100, hidden=64, num_classes=7, num_layers=3)
        >>> model.num_layers
        3
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 3, dropout: float = 0.0):
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        super().__init__([SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers)], dropout)


class GCN(_Stack):
    """Graph convolutional network with ``norm="right"`` (mean over the sampled in-edges).

    The symmetric ``norm="both"`` divides by each *source's* out-degree in the sampled mini-batch,
    which no rank of a split knows locally (its edges are spread over ranks); the destination-side
    normalisation is exact under any split.
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 3, dropout: float = 0.0):
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        super().__init__([GraphConv(dims[i], dims[i + 1], norm="right") for i in range(num_layers)], dropout)


class GAT(_Stack):
    """Graph attention network: ``heads`` heads concatenated in hidden layers, averaged at the output."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 3, heads: int = 4,
                 dropout: float = 0.0):
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}; pick hidden as a multiple of heads")
        layers = []
        dim = in_feats
        for i in range(num_layers - 1):
            layers.append(GATConv(dim, hidden // heads, heads))
            dim = hidden
        layers.append(GATConv(dim, num_classes, 1))
        super().__init__(layers, dropout)

    def between(self, i: int, h: torch.Tensor, block: Block,
                place: Optional[Tuple[int, torch.Tensor]] = None) -> torch.Tensor:
        return super().between(i, h.flatten(1), block, place)

    def output(self, h: torch.Tensor) -> torch.Tensor:
        return h.mean(1)  # average the output layer's heads


MODELS = {"sage": SAGE, "gcn": GCN, "gat": GAT, "deep-sage": DeepSAGE, "deep-gcn": DeepGCN}
"""The models by name (``gsplit train --model``): what :func:`build_model` builds. ``deep-sage`` and ``deep-gcn`` are
the deep residual models of :mod:`gsplit.nn.deep` (DeeperGCN ``res+`` blocks, LayerNorm), for tens of layers."""


def build_model(name: str, in_feats: int, hidden: int, num_classes: int, num_layers: int,
                dropout: float = 0.0, heads: int = 4) -> nn.Module:
    """Build one of :data:`MODELS` by name (``sage``, ``gcn``, ``gat``, ``deep-sage``, ``deep-gcn``); ``heads`` is
    GAT's only.

    Example:
        >>> build_model("deep-sage", in_feats=100, hidden=64, num_classes=7, num_layers=28).num_layers
        28
    """
    key = name.lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    if key == "gat":
        return GAT(in_feats, hidden, num_classes, num_layers, heads=heads, dropout=dropout)
    return MODELS[key](in_feats, hidden, num_classes, num_layers, dropout=dropout)
