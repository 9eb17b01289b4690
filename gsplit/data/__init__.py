"""Data and storage: the graph (:mod:`gsplit.data.graph`), a rank's features (:mod:`gsplit.data.feature_store`),
the finiteness checks of feature tables (:mod:`gsplit.data.finite`) and the vertex-id range check every
reader of a user's ids shares (:mod:`gsplit.data.ids`).

Datasets (loading and preparing them) are :mod:`gsplit.datasets`. This ``__init__`` imports nothing, so the
kernels (:mod:`gsplit.ops`) can take the id check without pulling in the graph that uses them.
"""
