"""Running a stack of layers over split blocks, the loss, and combining gradients across ranks.

The rule that makes N-rank split training take the same optimiser steps as 1-process training on the
global mini-batch: every rank computes ``sum of its local losses / global mini-batch size``
(:func:`split_cross_entropy`), and parameter gradients are **summed** over ranks
(:func:`allreduce_gradients`). The sum of the ranks' losses is then the global mean loss, and the
summed gradient is its gradient.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from gsplit.comm.communicator import Communicator
from gsplit.comm.shuffle import shuffle
from gsplit.sampling.block import Block


def sp_forward(layers: Sequence[torch.nn.Module], feat: torch.Tensor, blocks: Sequence[Block],
               between: Optional[Callable[[int, torch.Tensor, Block], torch.Tensor]] = None) -> torch.Tensor:
    """Run ``layers[i](blocks[i], h)`` bottom-up, shuffling rows before every layer but the first.

    ``feat`` has one row per ``blocks[0]`` source node (``blocks[0].srcdata["feat"]`` from the
    loader, already shuffled). ``between(i, h, blocks[i])`` runs after layer ``i`` except the last
    (activation, dropout, head flattening); it runs on the rank's own rows (``blocks[i].dst_nodes``),
    before the next shuffle.

    Example:
        >>> logits = gsplit.sp_forward(model.layers, blocks[0].srcdata["feat"], blocks,
        ...                            between=lambda i, h, block: torch.relu(h))      # doctest: +SKIP
    """
    if len(layers) != len(blocks):
        raise ValueError(f"got {len(blocks)} blocks but the model has {len(layers)} layers; "
                         "sample with one fanout per layer")
    h = feat
    for i, (layer, block) in enumerate(zip(layers, blocks)):
        if i > 0:
            h = shuffle(h, block)
        h = layer(block, h)
        if between is not None and i < len(layers) - 1:
            h = between(i, h, block)
    return h


def split_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, block: Block) -> torch.Tensor:
    """This rank's share of the global mean cross-entropy: ``sum(local CE) / global mini-batch size``.

    Summed over ranks it equals the mean loss of single-process training on the whole mini-batch.
    For an unsplit block it is the ordinary mean.

    Example:
        >>> loss = gsplit.split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])  # doctest: +SKIP
    """
    total = block.global_num_dst if block.global_num_dst is not None else block.num_dst_nodes()
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits has {logits.shape[0]} rows but labels has {labels.shape[0]}")
    return F.cross_entropy(logits, labels, reduction="sum") / max(int(total), 1)


def allreduce_gradients(module: torch.nn.Module, comm: Communicator) -> None:
    """Sum every parameter gradient over ranks, in one flattened all-reduce.

    Call it after ``loss.backward()`` and before ``optimizer.step()``. Parameters without a gradient
    on this rank (e.g. a rank that owned no target) contribute zeros, so every rank joins the
    collective with the same buffer size.
    """
    if comm.world_size == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce_(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n


def global_sum(value: torch.Tensor, comm: Communicator) -> float:
    """Sum a scalar over ranks (for logging the global loss); no autograd."""
    t = value.detach().reshape(1).to(torch.float64).clone()
    return float(comm.all_reduce_(t)[0])
