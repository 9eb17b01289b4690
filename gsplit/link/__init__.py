"""Link prediction on a split: edge mini-batches, negatives, pair scoring, metrics.

``gsplit.as_edge_prediction_sampler(sampler, exclude=..., negative_sampler=gsplit.negative_sampler.Uniform(k))``
makes an edge sampler; ``gsplit.DataLoader(graph, train_eids, edge_sampler, ...)`` then yields
``(input_nodes, pair_graph, neg_pair_graph, blocks)``. Modules: :mod:`~gsplit.link.negative` (counter-based
negatives), :mod:`~gsplit.link.exclude` (sampling without the mini-batch's edges), :mod:`~gsplit.link.sampler`
(planning a global mini-batch of edges), :mod:`~gsplit.link.pairs` (who scores which pair, the rows it needs),
:mod:`~gsplit.link.scoring` (the exchange of those rows, the split loss), :mod:`~gsplit.link.metrics` (MRR, Hits@K).
"""

from gsplit.link import negative
from gsplit.link.metrics import hits_at_k, mrr
from gsplit.link.pairs import LinkMiniBatch, PairGraph
from gsplit.link.sampler import (EdgePredictionSampler, as_edge_ids, as_edge_prediction_sampler, edge_endpoints,
                                 reverse_edge_ids)
from gsplit.link.scoring import pair_rows, split_bce_with_logits

__all__ = ["negative", "as_edge_prediction_sampler", "EdgePredictionSampler", "PairGraph", "LinkMiniBatch",
           "pair_rows", "split_bce_with_logits", "mrr", "hits_at_k", "reverse_edge_ids", "edge_endpoints",
           "as_edge_ids"]
