"""Mini-batch training: the loader that samples one global mini-batch per iteration and splits it
(:mod:`gsplit.minibatch.loader`, with its background thread :mod:`gsplit.minibatch.prefetch`),
:class:`~gsplit.minibatch.parallel.SplitParallel`, the overlapped layers (:mod:`gsplit.minibatch.overlap`) and
layer-wise inference over every vertex (:mod:`gsplit.minibatch.inference`).

Node classification is what the loader serves today; an edge task's sampler plugs into the same loader.
"""
