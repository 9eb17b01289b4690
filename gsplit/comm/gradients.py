"""Combining gradients and logged values across ranks.

The rule that makes N-rank split training take the same optimiser steps as 1-process training on the
global mini-batch: every rank computes ``sum of its local losses / global mini-batch size``
(:func:`gsplit.split_cross_entropy`), and parameter gradients are **summed** over ranks
(:func:`allreduce_gradients`). The sum of the ranks' losses is then the global mean loss, and the
summed gradient is its gradient.
"""

from __future__ import annotations

import torch

from gsplit.comm.communicator import as_communicator

GRADIENT_TAG = "grad/allreduce"
"""The traffic tag of :func:`allreduce_gradients` in a :class:`~gsplit.Communicator`'s counters."""


def allreduce_gradients(module: torch.nn.Module, group=None) -> None:
    """Sum every parameter gradient over the ranks of ``group`` (a process group, a Communicator or ``None``
    for the default group), in one flattened all-reduce.

    Call it after ``loss.backward()`` and before ``optimizer.step()``. Parameters without a gradient
    on this rank (e.g. a rank that owned no target) contribute zeros, so every rank joins the
    collective with the same buffer size. With several hosts pass the group of every rank of the job
    (the second value of :func:`gsplit.host_groups`), not a host's split group.

    Passed a :class:`~gsplit.Communicator`, its traffic counters count the all-reduce under
    ``"grad/allreduce"``: ``2 (n - 1) / n`` of the buffer per rank over ``n`` ranks, what a
    bandwidth-optimal all-reduce (ring, or gloo's halving-doubling) sends; rows count gradient values.

    Example:
        >>> model = torch.nn.Linear(2, 1); model(torch.ones(1, 2)).sum().backward()
        >>> allreduce_gradients(model)          # world size 1: nothing to sum
        >>> model.weight.grad.tolist()
        [[1.0, 1.0]]
    """
    comm = as_communicator(group)
    if comm.world_size == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    sent = flat.numel() * 2 * (comm.world_size - 1) // comm.world_size
    comm.traffic.add(GRADIENT_TAG, sent, sent * flat.element_size())
    comm.all_reduce_(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n


def global_sum(value: torch.Tensor, group=None) -> float:
    """Sum a scalar over ranks (for logging the global loss); no autograd.

    Example:
        >>> global_sum(torch.tensor(2.5))
        2.5
    """
    t = value.detach().reshape(1).to(torch.float64).clone()
    return float(as_communicator(group).all_reduce_(t)[0])
