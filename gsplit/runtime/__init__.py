"""What every part of a run leans on: host memory and CPU time (:mod:`gsplit.runtime.resources`), step and
per-layer clocks (:mod:`gsplit.runtime.timing`), atomic verified files and the run log (:mod:`gsplit.runtime.io`).

Nothing here imports the rest of gsplit.
"""
