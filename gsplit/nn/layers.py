"""GNN layers on sampled blocks: ``SAGEConv``, ``GATConv`` and ``GraphConv``.

Each layer maps the rows of a block's ``src_nodes`` (inputs, ``block.num_src_nodes()`` rows, the first
``block.num_dst`` of which are the destinations' own rows) to one row per destination, with the
semantics of DGL's layer of the same name on a DGL block. Aggregation goes through
:mod:`gsplit.ops.aggregate`: on CPU a compiled kernel sums each destination's source rows over the
block's destination-grouped edges (no ``[edges x width]`` message tensor; GAT's edge softmax and
weighted sum in one fused pass); elsewhere, or without the extension, a gather (``index_select``) and a
scatter-add (``index_add_``). Both paths run in float32 and float64 and handle blocks without edges or
destinations. As DGL does, SAGE and GCN multiply by their weight before aggregating when that narrows
the rows (``in_feats > out_feats``).

Every layer's forward is ``combine(block, project_sources(block, h))``: the per-source work (GAT's
projection, SAGE's and GCN's when they multiply first) once over all sources, then the destinations. An
overlapped layer (:mod:`gsplit.minibatch.overlap`) projects once and combines twice, for two parts of the block's
destinations (blocks with ``dst_start``), so that splitting a layer repeats no per-source work.

Determinism: on CPU the result is a pure function of the inputs. On CUDA, ``index_add_`` and the
backward of ``index_select`` use atomic adds whose order varies; call
``torch.use_deterministic_algorithms(True)`` for bitwise-reproducible runs there.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import nn

from gsplit.ops.aggregate import (SharedSourceGrad, copy_u_mean, copy_u_sum, degrees, edge_softmax, gat_aggregate,
                                  gat_aggregate_torch, gat_scores, self_and_mean)
from gsplit.sampling.block import Block

__all__ = ["SAGEConv", "GATConv", "GraphConv", "edge_softmax"]


def _check_input(layer: nn.Module, block: Block, h: torch.Tensor, in_feats: int) -> None:
    """Raise a clear error when ``h`` does not fit ``block`` or the layer."""
    name = type(layer).__name__
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"{name} expects h to be a torch.Tensor, got {type(h).__name__}")
    if h.dim() != 2:
        raise ValueError(f"{name} expects a 2-D input h of shape [block.num_src_nodes(), in_feats], "
                         f"got shape {tuple(h.shape)}")
    n_src = block.num_src_nodes()
    if h.shape[0] != n_src:
        raise ValueError(f"{name}: h has {h.shape[0]} rows but expected block.num_src_nodes() = {n_src} "
                         f"(one row per source node of {block!r}); for layers above the first, shuffle or "
                         f"index the previous layer's output to this block's src_nodes first")
    if h.shape[1] != in_feats:
        raise ValueError(f"{name} was built with in_feats={in_feats} but h has {h.shape[1]} columns")
    if block.dst_start + block.num_dst > n_src:
        raise ValueError(f"{name}: block has num_dst={block.num_dst} (from row {block.dst_start}) but "
                         f"num_src_nodes()={n_src}; dst_nodes must be a prefix of src_nodes")
    if block.edge_src.device != h.device or block.edge_dst.device != h.device:
        raise ValueError(f"{name}: block edges are on {block.edge_src.device} but h is on {h.device}; "
                         f"move the block with block.to(h.device)")


def _degrees(index: torch.Tensor, n: int, like: torch.Tensor) -> torch.Tensor:
    """Edge counts per vertex as a float column of ``like``'s dtype, clamped to at least 1."""
    return degrees(index, n).clamp_(min=1).to(like.dtype).unsqueeze(1)


class SAGEConv(nn.Module):
    """GraphSAGE layer (Hamilton et al. 2017) on a block, as DGL's ``SAGEConv``.

    ``aggregator="mean"``: ``out = W_self h_dst + W_neigh mean_{src in N(dst)} h_src + b``; a destination
    without sampled in-edges gets a zero neighbour mean. ``aggregator="gcn"``:
    ``out = W_neigh (h_dst + sum_{src in N(dst)} h_src) / (deg + 1) + b``. ``activation`` is applied last.

    Args:
        in_feats: input feature size.
        out_feats: output feature size.
        aggregator: ``"mean"`` or ``"gcn"``.
        activation: callable applied to the output, e.g. ``torch.relu``; ``None`` for none.
        bias: add a learnable bias (initialised to zero).
        feat_drop: dropout probability on the input features (training mode only).

    Example:
        >>> from gsplit.sampling import Block
        >>> b = Block(src_nodes=torch.tensor([5, 6, 7]), num_dst=1, edge_src=torch.tensor([1, 2]),
        ...           edge_dst=torch.tensor([0, 0]), edge_ids=torch.tensor([0, 1]))
        >>> SAGEConv(4, 2)(b, torch.randn(3, 4)).shape
        torch.Size([1, 2])
    """

    _AGGREGATORS = ("mean", "gcn")

    def __init__(self, in_feats: int, out_feats: int, aggregator: str = "mean",
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, bias: bool = True,
                 feat_drop: float = 0.0):
        super().__init__()
        if aggregator not in self._AGGREGATORS:
            raise ValueError(f"SAGEConv aggregator={aggregator!r} is not supported; use one of {self._AGGREGATORS}")
        self.in_feats, self.out_feats, self.aggregator = int(in_feats), int(out_feats), aggregator
        self.activation = activation
        self.feat_drop = nn.Dropout(feat_drop)
        self.fc_neigh = nn.Linear(self.in_feats, self.out_feats, bias=False)
        # The gcn aggregator folds the destination's own row into the neighbour mean: no W_self.
        self.fc_self = nn.Linear(self.in_feats, self.out_feats, bias=False) if aggregator == "mean" else None
        self.bias = nn.Parameter(torch.empty(self.out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights with the ReLU gain and zero bias, as DGL."""
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)
        if self.fc_self is not None:
            nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        """``h``: [block.num_src_nodes(), in_feats] -> [block.num_dst, out_feats]."""
        return self.combine(block, self.project_sources(block, h))

    def project_sources(self, block: Block, h: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The per-source terms ``(h, x)``: the (dropped-out) input and the rows to aggregate."""
        _check_input(self, block, h, self.in_feats)
        h = self.feat_drop(h)
        # Project before aggregating when that narrows the summed rows (DGL's rule; same result, less work).
        return h, (self.fc_neigh(h) if self.in_feats > self.out_feats else h)

    def combine(self, block: Block, sources: Tuple[torch.Tensor, ...],
                source_grad: Optional[SharedSourceGrad] = None) -> torch.Tensor:
        """The destinations of ``block`` from :meth:`project_sources`' terms (of the same sources).
        ``source_grad``: shared by the parts of one layer's destinations (:mod:`gsplit.minibatch.overlap`), for the
        aggregated rows' gradient (:class:`~gsplit.ops.aggregate.SharedSourceGrad`)."""
        h, x = sources
        nd, d0 = block.num_dst, block.dst_start
        src, dst = block.edge_src, block.edge_dst
        lin_first = self.in_feats > self.out_feats
        if self.aggregator == "mean" and lin_first:  # x is W_neigh h already: add W_self h_dst (+ b) to its mean
            out = torch.addmm(copy_u_mean(x, src, dst, nd, source_grad), h[d0:d0 + nd], self.fc_self.weight.t())
            if self.bias is not None:
                out = out.add_(self.bias)  # addmm's backward does not need its output: in place is safe
        elif self.aggregator == "mean":
            # One product of [h_dst | mean | 1] with [W_self | W_neigh | b]: no sum temporaries, one gradient over h
            # in backward instead of a zero-filled slice gradient plus the scatter's, and the bias inside the GEMM
            # both ways (addmm would first copy b into every output row, and its backward sum the output's gradient
            # over the rows in one more pass: together ~3 ms of a 2-rank SAGE step on one core)
            both = self_and_mean(h, src, dst, nd, d0, source_grad, ones_column=self.bias is not None)
            parts = [self.fc_self.weight, self.fc_neigh.weight]
            w = torch.cat(parts if self.bias is None else parts + [self.bias.unsqueeze(1)], dim=1)
            out = both @ w.t()
        else:  # gcn
            deg = degrees(dst, nd).to(h.dtype).unsqueeze(1)
            neigh = (copy_u_sum(x, src, dst, nd, source_grad) + x[d0:d0 + nd]) / (deg + 1)
            out = neigh if lin_first else self.fc_neigh(neigh)
            if self.bias is not None:
                out = out + self.bias
        return self.activation(out) if self.activation is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, aggregator={self.aggregator!r}, bias={self.bias is not None}"


class GATConv(nn.Module):
    """Multi-head graph attention layer (Velickovic et al. 2018) on a block, as DGL's ``GATConv``.

    For head ``k``: ``z = W h``; ``e_uv = LeakyReLU(a_l . z_u + a_r . z_v)`` for each edge ``u -> v``;
    ``alpha = softmax of e over v's in-edges``; ``out_v = sum_u alpha_uv z_u + b``. A destination
    without in-edges gets zeros (plus the bias). Output shape ``[num_dst, num_heads, out_feats]``; the
    model flattens or averages the heads.

    Args:
        in_feats: input feature size.
        out_feats: output size per head.
        num_heads: number of attention heads.
        negative_slope: LeakyReLU slope for the attention scores.
        activation: callable applied to the output; ``None`` for none.
        feat_drop: dropout probability on the input features (training mode only).
        attn_drop: dropout probability on the attention coefficients (training mode only).
        bias: add a learnable bias of size ``num_heads * out_feats`` (initialised to zero).

    Example:
        >>> from gsplit.sampling import Block
        >>> b = Block(src_nodes=torch.tensor([5, 6, 7]), num_dst=2, edge_src=torch.tensor([1, 2, 0]),
        ...           edge_dst=torch.tensor([0, 0, 1]), edge_ids=torch.tensor([0, 1, 2]))
        >>> GATConv(4, 3, num_heads=2)(b, torch.randn(3, 4)).shape
        torch.Size([2, 2, 3])
    """

    def __init__(self, in_feats: int, out_feats: int, num_heads: int, negative_slope: float = 0.2,
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, feat_drop: float = 0.0,
                 attn_drop: float = 0.0, bias: bool = True):
        super().__init__()
        if int(num_heads) < 1:
            raise ValueError(f"GATConv num_heads={num_heads}; pass at least 1 head")
        self.in_feats, self.out_feats, self.num_heads = int(in_feats), int(out_feats), int(num_heads)
        self.negative_slope = float(negative_slope)
        self.activation = activation
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
        self.fc = nn.Linear(self.in_feats, self.num_heads * self.out_feats, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, self.num_heads, self.out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, self.num_heads, self.out_feats))
        self.bias = nn.Parameter(torch.empty(self.num_heads * self.out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal weights and attention vectors with the ReLU gain, zero bias, as DGL."""
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        """``h``: [block.num_src_nodes(), in_feats] -> [block.num_dst, num_heads, out_feats]."""
        return self.combine(block, self.project_sources(block, h))

    def project_sources(self, block: Block, h: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The per-source terms ``(z, el)``: projected rows and the source half of the scores."""
        _check_input(self, block, h, self.in_feats)
        z = self.fc(self.feat_drop(h)).view(-1, self.num_heads, self.out_feats)
        # (Measured, issue 20: both score halves as one GEMM with block-diagonal [H*D, 2H] attention weights, or
        # einsum, took 2x the elementwise `(z * attn_l).sum(-1)` forward + backward at 86k x 4 x 64 on one thread:
        # skinny products. gat_scores is that elementwise form in one pass, without its [n, H, D] temporaries.)
        return z, gat_scores(z, self.attn_l)       # [num_src, H]: source half of the score

    def combine(self, block: Block, sources: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The destinations of ``block`` from :meth:`project_sources`' terms (of the same sources)."""
        z, el = sources
        nd, d0, H, D = block.num_dst, block.dst_start, self.num_heads, self.out_feats
        src, dst = block.edge_src, block.edge_dst
        er = gat_scores(z[d0:d0 + nd], self.attn_r)  # [num_dst, H]: destination half
        if self.training and self.attn_drop.p > 0:
            # Dropout on the attention coefficients needs them as a tensor: the unfused path.
            out = gat_aggregate_torch(z, el, er, src, dst, nd, self.negative_slope, attn_drop=self.attn_drop)
        else:
            out = gat_aggregate(z, el, er, src, dst, nd, self.negative_slope)
        if self.bias is not None:
            out = out + self.bias.view(1, H, D)
        return self.activation(out) if self.activation is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, num_heads={self.num_heads}, negative_slope={self.negative_slope}"


class GraphConv(nn.Module):
    """Graph convolution (Kipf & Welling 2017) on a block, as DGL's ``GraphConv``.

    Degrees are the block's sampled ones, as DGL uses on blocks: ``d_out(u)`` counts ``u``'s edges as
    a source in the block, ``d_in(v)`` ``v``'s edges as a destination, both clamped to at least 1.
    ``norm="both"``: ``out_v = W sum_u h_u / sqrt(d_out(u) d_in(v)) + b``; ``"right"``:
    ``W sum_u h_u / d_in(v) + b``; ``"left"``: ``W sum_u h_u / d_out(u) + b``; ``"none"``: plain sum.
    A destination without in-edges gets zeros (plus the bias). No self-loops are added: add them to
    the graph if wanted, as with DGL.

    Args:
        in_feats: input feature size.
        out_feats: output feature size.
        norm: ``"both"``, ``"right"``, ``"left"`` or ``"none"``.
        activation: callable applied to the output; ``None`` for none.
        bias: add a learnable bias (initialised to zero).

    Example:
        >>> from gsplit.sampling import Block
        >>> b = Block(src_nodes=torch.tensor([5, 6, 7]), num_dst=1, edge_src=torch.tensor([1, 2]),
        ...           edge_dst=torch.tensor([0, 0]), edge_ids=torch.tensor([0, 1]))
        >>> GraphConv(4, 2)(b, torch.randn(3, 4)).shape
        torch.Size([1, 2])
    """

    _NORMS = ("both", "right", "left", "none")

    def __init__(self, in_feats: int, out_feats: int, norm: str = "both",
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, bias: bool = True):
        super().__init__()
        if norm not in self._NORMS:
            raise ValueError(f"GraphConv norm={norm!r} is not supported; use one of {self._NORMS}")
        self.in_feats, self.out_feats, self.norm = int(in_feats), int(out_feats), norm
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(self.in_feats, self.out_feats))
        self.bias = nn.Parameter(torch.empty(self.out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight and zero bias, as DGL."""
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, h: torch.Tensor) -> torch.Tensor:
        """``h``: [block.num_src_nodes(), in_feats] -> [block.num_dst, out_feats]."""
        return self.combine(block, self.project_sources(block, h))

    def project_sources(self, block: Block, h: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The per-source term: the rows to sum (source-normalised, multiplied by W first when narrower)."""
        _check_input(self, block, h, self.in_feats)
        if self.norm in ("both", "left") and block.shuffle_index is not None:
            # A source's out-degree in the mini-batch counts edges held by other ranks: a split block
            # cannot know it, and using the local count would silently train a different model.
            raise ValueError(f"GraphConv norm={self.norm!r} needs each source's out-degree over the whole "
                             "mini-batch, which a split block does not have; use norm='right' or 'none' "
                             "with split parallelism")
        if self.norm in ("both", "left"):
            d_out = _degrees(block.edge_src, block.num_src_nodes(), h)
            h = h * (d_out.rsqrt() if self.norm == "both" else d_out.reciprocal())
        # Multiply by W on the narrower side of the aggregation (same result, less work).
        return (h @ self.weight if self.in_feats > self.out_feats else h),

    def combine(self, block: Block, sources: Tuple[torch.Tensor, ...],
                source_grad: Optional[SharedSourceGrad] = None) -> torch.Tensor:
        """The destinations of ``block`` from :meth:`project_sources`' term (of the same sources); ``source_grad``
        as :meth:`SAGEConv.combine`'s."""
        (x,) = sources
        nd, src, dst = block.num_dst, block.edge_src, block.edge_dst
        out = copy_u_sum(x, src, dst, nd, source_grad)
        if self.in_feats <= self.out_feats:
            out = out @ self.weight
        if self.norm in ("both", "right"):
            d_in = _degrees(dst, nd, out)
            out = out * (d_in.rsqrt() if self.norm == "both" else d_in.reciprocal())
        if self.bias is not None:
            out = out + self.bias
        return self.activation(out) if self.activation is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, norm={self.norm!r}, bias={self.bias is not None}"
