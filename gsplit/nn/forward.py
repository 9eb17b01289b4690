"""``sp_forward``: run a stack of layers over (split) blocks, shuffling rows before every layer but the first."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from gsplit.comm.communicator import as_communicator, group_of
from gsplit.comm.shuffle import shuffle
from gsplit.data.precision import model_input
from gsplit.minibatch.overlap import overlapped_sp_forward, splits_sources
from gsplit.interop.pyg import check_block_layer  # imports no torch_geometric
from gsplit.sampling.block import Block
from gsplit.runtime.timing import LayerClock, layer_ends, layer_starts


def sp_forward(layers: Sequence[torch.nn.Module], feat: torch.Tensor, blocks: Sequence[Block],
               between: Optional[Callable[[int, torch.Tensor, Block], torch.Tensor]] = None,
               group=None, clock: Optional[LayerClock] = None) -> torch.Tensor:
    """Run ``layers[i](blocks[i], h)`` bottom-up, shuffling rows on ``group`` before every layer but the first.

    ``feat`` has one row per ``blocks[0]`` source node (``blocks[0].srcdata["feat"]`` from the
    loader, already shuffled). ``between(i, h, blocks[i])`` runs after layer ``i`` except the last
    (activation, dropout, head flattening); it runs on the rank's own rows (``blocks[i].dst_nodes``),
    before the next shuffle. ``group`` is passed to :func:`gsplit.shuffle` (``None``: the default group).

    Blocks sampled for overlap (``DataLoader(..., overlap=True)``: every block but the last carries a
    ``block.overlap`` plan) run overlapped (:func:`gsplit.minibatch.overlap.overlapped_sp_forward`): each layer
    computes the rows other ranks need first and shuffles them while it computes the rest; ``between``
    then gets each part's block. The result is the same up to rounding. That needs layers that compute
    their per-source terms apart (``project_sources`` / ``combine``, as gsplit's layers do); with other
    layers the plain path runs.

    ``clock`` (a :class:`gsplit.runtime.timing.LayerClock`, e.g. the trainer's) times each layer's forward and
    backward compute apart from the shuffles and waits between layers; ``None``: nothing is timed.

    Example:
        >>> logits = gsplit.sp_forward(model.layers, blocks[0].srcdata["feat"], blocks,
        ...                            between=lambda i, h, block: torch.relu(h))      # doctest: +SKIP
    """
    if len(layers) != len(blocks):
        raise ValueError(f"got {len(blocks)} blocks but the model has {len(layers)} layers; "
                         "sample with one fanout per layer")
    for layer in layers:
        check_block_layer(layer)  # a bare PyG layer: say "wrap it in BlockConv" instead of PyG's dtype error
    feat = model_input(feat, layers)
    if len(blocks) > 1 and all(b.overlap is not None for b in blocks[:-1]) and splits_sources(layers[:-1]):
        comm = group_of(blocks[1].shuffle_index) if group is None else as_communicator(group)
        return overlapped_sp_forward(layers, feat, blocks, between, comm, clock)
    h = feat
    for i, (layer, block) in enumerate(zip(layers, blocks)):
        if i > 0:
            h = shuffle(h, block, group)
        h = layer_starts(clock, i, h)
        h = layer(block, h)
        if between is not None and i < len(layers) - 1:
            h = between(i, h, block)
        h = layer_ends(clock, i, h)
    return h
