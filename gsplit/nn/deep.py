"""Deep residual GNNs: DeeperGCN's pre-activation ``res+`` blocks of SAGE or GCN layers, as GraNNDis trains them.

A model of ``L`` layers (Li et al., "DeeperGCN: All You Need to Train Deeper GCNs", 2020, the ``res+`` variant):

* layer 0: an input encoder (``Linear(in_feats, hidden)`` on every input row) and a graph convolution
  ``hidden -> hidden``;
* layers 1 .. L-1: ``res+`` blocks, ``h_dst + conv(dropout(relu(norm(h))))``: the block's input rows are
  normalised, activated and dropped out, convolved, and the destinations' own input rows are added back;
* after the last block, the output head: ``Linear(dropout(relu(norm(h))), num_classes)``.

The hidden width is the same throughout, so the residual is a plain sum. In a block the destinations are the
first ``num_dst`` source rows (from ``dst_start``), so the residual is ``h[dst_start:dst_start + num_dst]`` of the
layer's input: on split blocks, after the shuffle, where every rank has its destinations' rows.

**Why LayerNorm.** DeeperGCN normalises with BatchNorm, whose statistics are taken over the rows it is given: under
split parallelism each rank would normalise over its own vertices only and train another model than one process
does (:func:`gsplit.fullgraph.check_split_safe` refuses it). LayerNorm normalises each row by its own features, so
a vertex's row is the same whichever rank computes it: split training stays exact, and so does layer-wise inference.

**Dropout** is vertex-keyed (:func:`gsplit.nn.vertex_dropout`): the mask of a row depends on its vertex, the layer
and the training step, never on the rank. A ``res+`` block drops out its *source* rows (every rank that reads a
vertex's row draws the same mask for it); the head drops out the top destinations.

Every layer splits its per-source work from its destinations (``project_sources`` / ``combine``, as gsplit's
convolutions), so overlapped split layers (:mod:`gsplit.minibatch.overlap`), :func:`gsplit.recompute_layers`,
layer-wise inference and the full-graph loader run these models as they run SAGE and GCN.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from gsplit.nn.dropout import SteppedModel, relu_vertex_dropout
from gsplit.nn.forward import sp_forward
from gsplit.nn.layers import GraphConv, SAGEConv, _check_input
from gsplit.ops.rows import place_rows
from gsplit.sampling.block import Block

__all__ = ["DeepSAGE", "DeepGCN", "ResPlusLayer"]


class _StepCounter:
    """Training steps of one deep model, shared by its layers (each keys its dropout masks by it)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class ResPlusLayer(nn.Module):
    """One layer of a deep residual model (:class:`DeepSAGE`, :class:`DeepGCN`), called as ``layer(block, h)``.

    ``out = conv(block, x) [+ h_dst]`` where ``x = dropout(relu(norm(h)))`` for a ``res+`` block (``residual=True``)
    and ``x = h`` otherwise; ``h`` is first projected by ``encoder`` when one is given (the input layer), and the
    output goes through ``head`` (``Linear(dropout(relu(norm(out))))``, the last layer) when ``num_classes`` is
    given. Dropout is vertex-keyed (:func:`gsplit.nn.vertex_dropout`) with layer key ``index`` (the head uses
    ``index + 1``) and the model's step counter.

    Args:
        conv: a ``hidden -> hidden`` graph convolution with ``project_sources`` / ``combine`` (gsplit's).
        index: the layer's position in the model (keys its dropout masks).
        residual: pre-activation and the residual sum (``res+``); ``False`` for the input layer.
        in_feats: input width; an input encoder ``Linear(in_feats, hidden)`` runs first when it differs from the
            convolution's (``None``: no encoder).
        num_classes: the output head's width (``None``: no head).
        dropout: vertex-keyed dropout probability of the pre-activation and of the head.
        seed: seed of the dropout masks.
        counter: the model's step counter (``None``: a counter of this layer's own, for a layer used alone).

    Example:
        >>> b = Block(src_nodes=torch.tensor([5, 6, 7]), num_dst=2, edge_src=torch.tensor([1, 2, 0]),
        ...           edge_dst=torch.tensor([0, 0, 1]), edge_ids=torch.tensor([0, 1, 2]))
        >>> layer = ResPlusLayer(SAGEConv(4, 4), index=1, residual=True)
        >>> h = torch.randn(3, 4)
        >>> out = layer(b, h)
        >>> torch.allclose(out - h[:2], layer.conv(b, torch.relu(layer.norm(h))))   # h_dst + conv(relu(norm(h)))
        True
    """

    def __init__(self, conv: nn.Module, index: int, residual: bool, in_feats: Optional[int] = None,
                 num_classes: Optional[int] = None, dropout: float = 0.0, seed: int = 0,
                 counter: Optional[_StepCounter] = None):
        super().__init__()
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout={dropout}; it must be in [0, 1)")
        hidden = int(conv.in_feats)
        if int(conv.out_feats) != hidden:
            raise ValueError(f"a residual layer needs a convolution of one width, got {conv.in_feats} -> "
                             f"{conv.out_feats}; build it as conv(hidden, hidden)")
        self.conv = conv
        self.index, self.residual, self.dropout, self.seed = int(index), bool(residual), float(dropout), int(seed)
        self.encoder = nn.Linear(int(in_feats), hidden) if in_feats is not None and int(in_feats) != hidden else None
        self.norm = nn.LayerNorm(hidden) if residual else None
        if num_classes is not None:
            self.head_norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, int(num_classes))
        else:
            self.head_norm, self.head = None, None
        self._counter = counter if counter is not None else _StepCounter()

    @property
    def in_feats(self) -> int:
        """Width of the rows the layer takes (the encoder's input, else the convolution's)."""
        return self.encoder.in_features if self.encoder is not None else self.conv.in_feats

    @property
    def out_feats(self) -> int:
        """Width of the rows the layer returns (the head's classes, else the hidden width)."""
        return self.head.out_features if self.head is not None else self.conv.out_feats

    @property
    def saved_values(self) -> Tuple[int, int]:
        """``(per source, per destination)``: values this layer keeps for backward beyond a convolution's own (what
        :func:`gsplit.fullgraph.estimate_memory` adds): the encoder's output and the pre-activation's rows of every
        source (measured with saved-tensor hooks: two rows), the head's rows of every destination."""
        hidden = self.conv.in_feats
        per_src = (1 if self.encoder is not None else 0) + (2 if self.residual else 0)
        return per_src * hidden, (3 * hidden if self.head is not None else 0)

    def _activate(self, h: torch.Tensor, vertices: torch.Tensor, key: int) -> torch.Tensor:
        """``dropout(relu(h))`` with vertex-keyed masks (layer key ``key``); ReLU alone outside training."""
        if self.training and self.dropout > 0:
            return relu_vertex_dropout(h, vertices, self.dropout, self.seed, self._counter.value, key)
        return F.relu(h)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        """``h``: [block.num_src_nodes(), in_feats] -> [block.num_dst, out_feats]."""
        return self.combine(block, self.project_sources(block, h))

    def project_sources(self, block: Block, h: torch.Tensor) -> Tuple:
        """The per-source terms: the (encoded) input rows, for the residual, and the convolution's own terms of
        their pre-activation."""
        _check_input(self, block, h, self.in_feats)
        if self.encoder is not None:
            h = self.encoder(h)
        x = self._activate(self.norm(h), block.src_nodes, self.index) if self.residual else h
        return h, self.conv.project_sources(block, x)

    def combine(self, block: Block, sources: Tuple, source_grad=None) -> torch.Tensor:
        """The destinations of ``block`` from :meth:`project_sources`' terms (``source_grad``: as
        :meth:`gsplit.nn.SAGEConv.combine`'s, for the parts of an overlapped layer)."""
        h, conv_sources = sources
        extra = {} if source_grad is None else {"source_grad": source_grad}
        out = self.conv.combine(block, conv_sources, **extra)
        if self.residual:
            out = out + h[block.dst_start:block.dst_start + block.num_dst]
        if self.head is not None:
            out = self.head(self._activate(self.head_norm(out), block.dst_nodes, self.index + 1))
        return out

    def extra_repr(self) -> str:
        return f"index={self.index}, residual={self.residual}, dropout={self.dropout}"


class _DeepStack(SteppedModel):
    """An input layer, ``res+`` blocks and an output head (see the module docstring); ``make_conv(hidden)`` builds
    each layer's ``hidden -> hidden`` convolution."""

    def __init__(self, make_conv: Callable[[int], nn.Module], in_feats: int, hidden: int, num_classes: int,
                 num_layers: int, dropout: float, seed: int = 0):
        super().__init__()
        if int(num_layers) < 1:
            raise ValueError(f"num_layers={num_layers}; a deep model needs at least 1 layer")
        if int(hidden) < 1:
            raise ValueError(f"hidden={hidden}; pass a positive hidden width")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout={dropout}; it must be in [0, 1)")
        self.dropout, self.seed = float(dropout), int(seed)
        self._counter = _StepCounter()
        last = int(num_layers) - 1
        self.layers = nn.ModuleList([
            ResPlusLayer(make_conv(hidden), index=i, residual=i > 0, in_feats=in_feats if i == 0 else None,
                         num_classes=num_classes if i == last else None, dropout=dropout, seed=seed,
                         counter=self._counter)
            for i in range(last + 1)])

    @property
    def step(self) -> int:
        """Training forward passes so far; every rank counts the same, which keys the dropout masks."""
        return self._counter.value

    @step.setter
    def step(self, value: int) -> None:
        self._counter.value = int(value)

    def between(self, i: int, h: torch.Tensor, block: Block,
                place: Optional[Tuple[int, torch.Tensor]] = None) -> torch.Tensor:
        """Nothing runs between layers (each ``res+`` block activates its own input rows); ``place`` as
        :func:`gsplit.ops.rows.place_rows` places the rows."""
        return h if place is None else place_rows(h, *place)

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """What follows the last layer: nothing (the head is part of the last layer)."""
        return h

    def forward(self, blocks: List[Block], x: torch.Tensor, group=None, clock=None) -> torch.Tensor:
        """Logits of the top block's destinations; ``group`` and ``clock`` as :func:`gsplit.sp_forward`'s."""
        if self.training:
            self.step += 1
        return sp_forward(self.layers, x, blocks, between=None, group=group, clock=clock)


class DeepSAGE(_DeepStack):
    """Deep residual GraphSAGE: DeeperGCN ``res+`` blocks (LayerNorm, ReLU, dropout, mean-SAGE, residual sum).

    ``num_layers`` graph convolutions, all ``hidden -> hidden``: an input encoder and a first convolution, then
    ``num_layers - 1`` ``res+`` blocks, then the output head (see :mod:`gsplit.nn.deep`). Exact under split
    parallelism (LayerNorm and vertex-keyed dropout), in mini-batch and full-graph training
    (``gsplit train --model deep-sage --layers 28``).

    Example:
        >>> model = DeepSAGE(in_feats=100, hidden=64, num_classes=7, num_layers=28)
        >>> model.num_layers, model.layers[0].in_feats, model.layers[-1].out_feats
        (28, 100, 7)
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 28, dropout: float = 0.0,
                 seed: int = 0):
        super().__init__(lambda d: SAGEConv(d, d), in_feats, hidden, num_classes, num_layers, dropout, seed)


class DeepGCN(_DeepStack):
    """Deep residual GCN: DeeperGCN ``res+`` blocks of :class:`gsplit.nn.GraphConv` with ``norm="right"``.

    As :class:`DeepSAGE` with a graph convolution (mean over the in-edges, as :class:`gsplit.nn.GCN`: the symmetric
    normalisation needs degrees no rank of a split knows). The residual sum gives each vertex its own row, which
    ``GraphConv`` (no self-loops) does not.

    Example:
        >>> model = DeepGCN(in_feats=100, hidden=64, num_classes=7, num_layers=4)
        >>> [layer.residual for layer in model.layers]
        [False, True, True, True]
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 28, dropout: float = 0.0,
                 seed: int = 0):
        super().__init__(lambda d: GraphConv(d, d, norm="right"), in_feats, hidden, num_classes, num_layers,
                         dropout, seed)
