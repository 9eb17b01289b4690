"""Pre-sampling for link prediction: how often each vertex and edge takes part in an *edge* mini-batch.

The targets of an edge mini-batch are its pairs' endpoints (positives and negatives), not a uniform share of
a vertex set, so the closed form of :mod:`gsplit.partitioning.expected` does not apply; the weights are
counted by running the edge sampler itself over the loaders' global batches of training edges (the sampled
method), so that the partition map fits edge mini-batches: their endpoints, their negatives, the exclusion.
"""

from __future__ import annotations

import logging
import time

import torch  # noqa: F401 - the example uses it

from gsplit.data.graph import Graph
from gsplit.link.sampler import EdgePredictionSampler, as_edge_ids
from gsplit.partitioning.presample import count_blocks
from gsplit.partitioning.weights import PresampleWeights
from gsplit.sampling.batches import global_batches

log = logging.getLogger(__name__)


def presample_edges(graph: Graph, train_eids, edge_sampler: EdgePredictionSampler, batch_size: int,
                    epochs: int = 3, seed: int = 0, num_parts: int = 1, progress: bool = False) -> PresampleWeights:
    """Pre-sampling weights of edge mini-batches of ``batch_size * num_parts`` training edges (``batch_size``
    per rank, as the loader takes it): ``epochs`` epochs of the loaders' global order of ``train_eids`` for
    ``(seed, epoch)``, each batch sampled by ``edge_sampler.sample`` (negatives and exclusion included) and
    counted as :func:`gsplit.presample` counts node mini-batches. Pass the result to
    ``gsplit.partition(graph, parts, method="gsplit", weights=...)``.

    Example:
        >>> import gsplit
        >>> g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> s = gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([2]),
        ...                                       negative_sampler=gsplit.negative_sampler.Uniform(1))
        >>> w = presample_edges(g, torch.arange(8), s, batch_size=4, epochs=2)
        >>> w.num_batches, w.vertex_weights.shape
        (4, torch.Size([4]))
    """
    train_eids = as_edge_ids(train_eids, graph)
    if int(batch_size) < 1 or int(num_parts) < 1 or int(epochs) < 1:
        raise ValueError(f"batch_size={batch_size}, num_parts={num_parts}, epochs={epochs}; each must be at least 1")
    edge_sampler.check(graph)
    per_rank, global_batch = int(batch_size), int(batch_size) * int(num_parts)
    t0 = time.perf_counter()
    per_epoch = -(-train_eids.numel() // global_batch)
    batches = (edge_sampler.sample(graph, eids, epoch, it).blocks for epoch in range(int(epochs))
               for it, eids in enumerate(global_batches(train_eids, global_batch, seed, epoch)))
    level_w, load_w, edge_w, num_batches = count_blocks(graph, batches, int(epochs) * per_epoch if progress else 0)
    elapsed = time.perf_counter() - t0
    log.info("pre-sampled %d edge mini-batches (%d epochs of %d edges) in %.1fs", num_batches, epochs, global_batch,
             elapsed)
    return PresampleWeights(
        vertex_weights=level_w.sum(0), edge_weights=edge_w, level_vertex_weights=level_w, layer_edge_load=load_w,
        num_batches=num_batches, batch_size=global_batch, epochs=int(epochs),
        fanouts=[int(f) for f in edge_sampler.fanouts], graph_fingerprint=graph.fingerprint(),
        metadata={"method": "sampled", "task": "link", "seed": int(seed), "seconds": round(elapsed, 3),
                  "sampler": edge_sampler.sampler.to_config(), "exclude": edge_sampler.exclude,
                  "negative_sampler": repr(edge_sampler.negative_sampler), "num_train_edges": int(train_eids.numel()),
                  "num_parts": int(num_parts), "batch_size_per_rank": per_rank})
