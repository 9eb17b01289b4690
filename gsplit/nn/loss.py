"""``split_cross_entropy``: a rank's share of the global mini-batch's mean loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gsplit.sampling.block import Block


def split_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, block: Block) -> torch.Tensor:
    """This rank's share of the global mean cross-entropy: ``sum(local CE) / global mini-batch size``.

    Summed over ranks it equals the mean loss of single-process training on the whole mini-batch
    (see :mod:`gsplit.comm.gradients` for the matching gradient rule). For an unsplit block it is the
    ordinary mean.

    Example:
        >>> loss = gsplit.split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])  # doctest: +SKIP
    """
    total = block.global_num_dst if block.global_num_dst is not None else block.num_dst_nodes()
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits has {logits.shape[0]} rows but labels has {labels.shape[0]}")
    return F.cross_entropy(logits, labels, reduction="sum") / max(int(total), 1)
