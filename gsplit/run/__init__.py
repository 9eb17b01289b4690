"""A run's lifecycle, around the training loop: the harness behind ``gsplit train``
(:mod:`gsplit.run.trainer`, the systems it trains :mod:`gsplit.run.systems`, what a rank counts
:mod:`gsplit.run.counters`), checkpoints and resume (:mod:`gsplit.run.checkpoint`, :mod:`gsplit.run.resume`),
the self-describing model file (:mod:`gsplit.run.model_io`), predictions (:mod:`gsplit.run.predict`) and
plots (:mod:`gsplit.run.plot`).
"""
