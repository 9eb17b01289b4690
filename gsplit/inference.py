"""Layer-wise full-graph inference, split-parallel: gsplit's equivalent of DGL's ``model.inference``.

Mini-batch evaluation samples neighbours, so its predictions are noisy, and computing every vertex's
k-hop neighbourhood per target repeats work exponentially in depth. Layer-wise inference instead
computes layer 1 for *every* vertex over *all* its in-edges, then layer 2 from those rows, and so on:
each layer costs one pass over the graph's edges.

Split-parallel, every rank owns the vertices the partition map gives it and computes every layer for
them only. Per layer, it walks its owned vertices in chunks of ``batch_size`` (bounding memory):
all ranks take chunk ``k`` of their owned vertices together, sample the chunk's full in-neighbourhood
(``NeighborSampler([-1])``) with :func:`gsplit.sp_sample`, which exchanges the source ids with their
owners, and one shuffle brings the sources' rows of the previous layer; the layer and what runs
between layers then compute the chunk's rows of the next layer. Each vertex's row is therefore
computed exactly once, by its owner, from the same inputs as on one process: the result equals
single-process layer-wise inference (exactly in float64, up to summation order).

**The model protocol.** A model usable here has

* ``model.layers``: a sequence of modules called as ``layer(block, h)`` (``h`` one row per
  ``block.src_nodes``, output one row per ``block.dst_nodes``), bottom layer first;
* ``model.between(i, h, block)``: what runs after layer ``i`` on the rank's own rows, for every
  layer but the last (activation, dropout, flattening of heads); a model without it must say so
  with ``between=None`` (nothing between the layers) or pass its own callable;
* optionally ``model.output(h)``: what runs after the last layer (e.g. averaging attention heads);
  identity when absent.

gsplit's models (:class:`gsplit.nn.SAGE`, ``GAT``, ``GCN``) follow it. Layers must compute a
destination from its own in-edges only (the rule split training already imposes), so a chunk's rows
do not depend on which other vertices share the chunk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from gsplit.comm.communicator import Communicator, as_communicator
from gsplit.graph import Graph, as_vertex_ids
from gsplit.partitioning.partition_map import owner_tensor
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

__all__ = ["InferenceResult", "layerwise_inference", "gather_rows", "accuracy"]

# The model's own ``between`` (the default of ``layerwise_inference(between=...)``).
_FROM_MODEL = "model"


@dataclass
class InferenceResult:
    """One rank's share of layer-wise inference: the final layer's rows of the vertices it owns."""

    nodes: torch.Tensor
    """int64 sorted global ids of the vertices this rank owns (all vertices on a single process)."""
    output: torch.Tensor
    """The model's output for ``nodes``, one row each, in the same order (e.g. logits)."""
    num_nodes: int
    """Vertices of the whole graph (``nodes`` over all ranks are a partition of ``range(num_nodes)``)."""

    def rows_of(self, ids: torch.Tensor):
        """``(positions, rows)``: which entries of ``ids`` this rank owns, and their output rows.

        Example:
            >>> r = InferenceResult(nodes=torch.tensor([1, 4]), output=torch.tensor([[1.], [4.]]), num_nodes=5)
            >>> pos, rows = r.rows_of(torch.tensor([4, 0, 1]))
            >>> pos.tolist(), rows.flatten().tolist()
            ([0, 2], [4.0, 1.0])
        """
        ids = as_vertex_ids(ids, self.num_nodes, "ids").to(self.nodes.device)
        where = torch.searchsorted(self.nodes, ids).clamp_(max=max(self.nodes.numel() - 1, 0))
        mine = (self.nodes[where] == ids) if self.nodes.numel() else torch.zeros_like(ids, dtype=torch.bool)
        positions = mine.nonzero().squeeze(1)
        return positions, self.output[where[positions].to(self.output.device)]


def _model_parts(model, between):
    """``(layers, between, output)`` of a model that follows the protocol in this module's docstring."""
    layers = getattr(model, "layers", None)
    if layers is None or not isinstance(layers, (Sequence, nn.ModuleList)) or len(layers) == 0:
        raise TypeError(f"layer-wise inference needs the model as a stack of layers, but {type(model).__name__} "
                        "has no non-empty `layers` list; give it `self.layers = nn.ModuleList([...])` of modules "
                        "called as layer(block, h) (see gsplit.inference)")
    if isinstance(between, str):
        if between != _FROM_MODEL:
            raise ValueError(f"between={between!r}; pass a callable between(i, h, block), None, or leave the default")
        between = getattr(model, "between", None)
        if between is None:
            raise TypeError(f"{type(model).__name__} has `layers` but no `between(i, h, block)` method, so layer-wise "
                            "inference cannot know what its forward does between layers (activation, dropout); "
                            "add the method, or pass between=None if nothing runs between them, or "
                            "between=lambda i, h, block: torch.relu(h)")
    if between is not None and not callable(between):
        raise TypeError(f"between must be callable as between(i, h, block) or None, got {type(between).__name__}")
    output = getattr(model, "output", None)
    if output is not None and not callable(output):
        raise TypeError(f"{type(model).__name__}.output must be a method output(h), got {type(output).__name__}")
    return list(layers), between, output


def _device_of(model) -> torch.device:
    for p in model.parameters() if isinstance(model, nn.Module) else ():
        return p.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------------
# The only two places that call the split machinery (kept apart so that its signatures can change).

def _sample_chunk(graph: Graph, seeds: torch.Tensor, owner: torch.Tensor, comm: Communicator):
    """``(local_frontier, block)``: this rank's split of the full in-neighbourhood of the global chunk ``seeds``.

    ``block.dst_nodes`` are the seeds this rank owns; ``local_frontier`` the vertices it owns whose rows
    some rank needs as sources; ``block.shuffle_index`` moves those rows to where they are needed.
    """
    from gsplit.split.split_sampling import sp_sample

    batch = sp_sample(graph, seeds, owner, NeighborSampler([-1]), comm)
    return batch.input_nodes, batch.blocks[0]


def _to_sources(h_local: torch.Tensor, block: Block, comm: Communicator) -> torch.Tensor:
    """Rows of the local frontier -> rows of ``block``'s sources (one all-to-all; no autograd)."""
    from gsplit.comm.shuffle import shuffle_rows

    return shuffle_rows(h_local, block.shuffle_index, comm, tag_suffix="inference")
# ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def layerwise_inference(model, graph: Graph, features: torch.Tensor, *, partition=None, group=None,
                        batch_size: int = 4096, device: Union[str, torch.device, None] = None,
                        buffer_device: Union[str, torch.device, None] = None,
                        between: Union[str, None, Callable[[int, torch.Tensor, Block], torch.Tensor]] = _FROM_MODEL,
                        ) -> InferenceResult:
    """Compute the model's output for every vertex, layer by layer over all in-edges; split-parallel.

    Every rank of ``group`` must call it with the same arguments (the same graph, features and map);
    each gets the rows of the vertices it owns. On one process (no ``partition``, no process group)
    the result covers all vertices.

    Args:
        model: a stack of layers following this module's protocol (``layers``, ``between``, optional
            ``output``); gsplit's models do. It runs in eval mode (dropout off) and is left in the mode
            it was in.
        graph: the full graph (every rank holds it).
        features: ``[num_nodes, in_feats]`` input features (every rank reads only its owned rows).
        partition: a :class:`gsplit.PartitionMap` or one owner rank per vertex; required with more than
            one rank. Any map gives the same result; a balanced one balances the work.
        group: a ``torch.distributed`` process group or a :class:`gsplit.Communicator`; ``None``: the
            default group when one is initialised, else a single process.
        batch_size: owned vertices per rank per chunk: memory is bounded by the chunk's in-edges.
        device: where the layers run; default the model's parameters' device.
        buffer_device: where the per-layer rows of the owned vertices are kept; default ``device``
            (pass ``"cpu"`` when they do not fit in GPU memory).
        between: the default uses ``model.between``; pass ``None`` when nothing runs between the
            layers, or a callable ``between(i, h, block)``.

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> model = gsplit.nn.SAGE(ds.feature_dim, 16, ds.num_classes, num_layers=2)
        >>> res = gsplit.layerwise_inference(model, ds.graph, ds.features, batch_size=100)
        >>> res.output.shape == (300, ds.num_classes), bool((res.nodes == torch.arange(300)).all())
        (True, True)
        >>> round(gsplit.inference.accuracy(res, ds.labels, ds.test_idx), 2) <= 1.0
        True
    """
    layers, between, output = _model_parts(model, between)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size}; pass a positive number of vertices per rank per chunk")
    if features.dim() != 2 or features.shape[0] != graph.num_nodes:
        raise ValueError(f"features has shape {tuple(features.shape)} but the graph has {graph.num_nodes} vertices; "
                         "pass one feature row per vertex")
    comm = as_communicator(group)
    owner = owner_tensor(partition, graph, comm.world_size).to(graph.device)
    device = torch.device(device) if device is not None else _device_of(model)
    buffer_device = torch.device(buffer_device) if buffer_device is not None else device

    # Every rank derives every rank's owned vertices from the same map, so all agree on the chunks.
    counts = torch.bincount(owner, minlength=comm.world_size).cpu()
    by_owner = torch.argsort(owner, stable=True)          # rank 0's vertices, then rank 1's, ... each sorted
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    counts_l = counts.tolist()
    mine = by_owner[starts[comm.rank]:starts[comm.rank] + counts_l[comm.rank]]
    # position of an owned vertex among this rank's vertices (its row in the per-layer buffers)
    row_of = torch.full((graph.num_nodes,), -1, dtype=torch.int64, device=graph.device)
    row_of[mine] = torch.arange(mine.numel(), device=graph.device)
    bs = int(batch_size)
    num_chunks = -(-max(counts_l) // bs) if counts_l else 0

    was_training = model.training if isinstance(model, nn.Module) else False
    if isinstance(model, nn.Module):
        model.eval()
    try:
        h_prev: Optional[torch.Tensor] = None       # rows of the owned vertices at the previous layer
        for i, layer in enumerate(layers):
            h_next: Optional[torch.Tensor] = None
            for k in range(num_chunks):
                seeds = torch.cat([by_owner[s + k * bs: s + min((k + 1) * bs, c)]
                                   for s, c in zip(starts, counts_l)])
                frontier, block = _sample_chunk(graph, seeds, owner, comm)
                block = block.to(device)
                if i == 0:
                    h_local = features[frontier.to(features.device)].to(device)
                else:
                    h_local = h_prev[row_of[frontier].to(h_prev.device)].to(device)
                h = layer(block, _to_sources(h_local, block, comm))
                if i < len(layers) - 1:
                    if between is not None:
                        h = between(i, h, block)
                elif output is not None:
                    h = output(h)
                if h_next is None:
                    h_next = h.new_empty((mine.numel(),) + tuple(h.shape[1:]), device=buffer_device)
                h_next[row_of[block.dst_nodes.to(graph.device)].to(buffer_device)] = h.to(buffer_device)
            h_prev = h_next
            log.debug("layer-wise inference: layer %d done in %d chunks", i, num_chunks)
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    return InferenceResult(nodes=mine, output=h_prev, num_nodes=graph.num_nodes)


def gather_rows(result: InferenceResult, ids, group=None) -> torch.Tensor:
    """The output rows of ``ids`` (vertex ids or a boolean mask) on every rank, in ``ids`` order.

    One all-reduce of ``[len(ids), ...]``: each row is filled by its owner and zeros elsewhere, so the
    sum is the row itself, exactly. Every rank of ``group`` must call it with the same ``ids``.

    Example:
        >>> r = InferenceResult(nodes=torch.tensor([0, 1, 2]), output=torch.eye(3), num_nodes=3)
        >>> gather_rows(r, torch.tensor([2, 0])).tolist()
        [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    comm = as_communicator(group)
    ids = as_vertex_ids(ids, result.num_nodes, "ids")
    positions, rows = result.rows_of(ids)
    out = result.output.new_zeros((ids.numel(),) + tuple(result.output.shape[1:]))
    out[positions.to(out.device)] = rows
    return comm.all_reduce_(out)


def accuracy(result: InferenceResult, labels: torch.Tensor, ids, group=None) -> float:
    """Fraction of ``ids`` whose arg-max output equals the label, counted by each owner and summed over ranks.

    ``ids`` are vertex ids or a boolean mask; every rank must call it with the same ``ids`` and gets the
    same number. See :func:`layerwise_inference` for an example.
    """
    comm = as_communicator(group)
    ids = as_vertex_ids(ids, result.num_nodes, "ids")
    positions, rows = result.rows_of(ids)
    if labels.shape[0] != result.num_nodes:
        raise ValueError(f"labels has {labels.shape[0]} entries but the graph has {result.num_nodes} vertices")
    mine = ids[positions.to(ids.device)]
    correct = rows.argmax(1).cpu() == labels[mine.to(labels.device)].cpu()
    correct_total = comm.all_reduce_(correct.sum().reshape(1).to(torch.float64))
    return float(correct_total[0]) / max(ids.numel(), 1)  # ids are the same on every rank
