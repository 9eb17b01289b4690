"""Link prediction metrics as OGB's evaluators define them (``ogb.linkproppred.Evaluator``).

* :func:`mrr`: each positive ranked against its own negatives (ogbl-citation2): the rank is the mean of the
  optimistic and the pessimistic rank (ties count half), MRR the mean of ``1 / rank``.
* :func:`hits_at_k`: every positive against one shared set of negatives (ogbl-collab, ogbl-ddi): the
  fraction of positives scored above the ``K``-th best negative (1.0 when there are fewer than ``K``).
"""

from __future__ import annotations

import torch


def mrr(pos_score: torch.Tensor, neg_score: torch.Tensor) -> float:
    """Mean reciprocal rank of ``pos_score[i]`` among ``neg_score[i, :]`` (per-edge negatives).

    Example:
        >>> mrr(torch.tensor([0.9, 0.1]), torch.tensor([[0.5, 0.2], [0.5, 0.2]]))
        0.6666666865348816
    """
    pos = pos_score.reshape(-1, 1).float()
    neg = neg_score.reshape(pos.shape[0], -1).float()
    optimistic = (neg > pos).sum(1)
    pessimistic = (neg >= pos).sum(1)
    rank = 0.5 * (optimistic + pessimistic) + 1
    return float((1.0 / rank).mean())


def hits_at_k(pos_score: torch.Tensor, neg_score: torch.Tensor, k: int) -> float:
    """Fraction of positives scored above the ``k``-th highest of the shared negatives.

    Example:
        >>> hits_at_k(torch.tensor([0.9, 0.3]), torch.tensor([0.5, 0.2, 0.1]), k=1)
        0.5
    """
    if k < 1:
        raise ValueError(f"k={k}; Hits@K needs k >= 1")
    neg = neg_score.reshape(-1).float()
    if neg.numel() < k:
        return 1.0
    kth = torch.topk(neg, k).values[-1]
    return float((pos_score.reshape(-1).float() > kth).sum()) / max(pos_score.numel(), 1)
