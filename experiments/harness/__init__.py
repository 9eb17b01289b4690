"""The experiments' one harness: what every script in ``experiments/`` sets up, repeats, runs and reports.

Scripts run as ``python experiments/NAME.py [--quick] [--out DIR] [--seed N]``; ``experiments/`` is then first
on ``sys.path``, so ``from harness import setup, report`` works (spawned ranks and workers inherit it).

* :mod:`harness.setup`  -- paths, the arguments every script takes (``make_parser``), data, partition maps,
  arrays exported for a peer;
* :mod:`harness.runs`   -- training jobs through ``gsplit.run.trainer`` in one launch, and what their logs say
  (times per iteration, counters, traffic);
* :mod:`harness.rounds` -- interleaved rounds, repeats after a warm-up, time budgets, subprocesses (workers,
  other checkouts, peers) and the JSON they hand back;
* :mod:`harness.report` -- Markdown tables, the JSON with the command line, the machine and its load, figures;
* :mod:`harness.memory` -- resident memory of this process or of a process tree, sampled by a thread;
* :mod:`harness.peer`   -- the DGL peers' side (``dgl_*.py`` run under ``.venv-dgl``: DGL 2.1, torch 2.2).

Importing the package sets OpenMP's wait policy before torch loads, so scripts import it first. Nothing
here imports torch, gsplit or matplotlib at import time except :mod:`harness.runs`: the DGL peers import
:mod:`harness.peer` (and through it :mod:`harness.report` and :mod:`harness.rounds`), which must never load
gsplit (it needs a newer torch than DGL's venv has), and ``gpu_first_run.py`` reports even when gsplit
does not import. Everything a script reports is computed from the library's own counters (the trainer's
logs, ``Communicator.traffic``, ``split_stats``) or from what it timed itself, never estimated.
"""

import os

# Before torch loads OpenMP: with the default (spinning) wait policy a multi-threaded process collapses
# (10x slower and worse) whenever another process holds one of the few cores, as other jobs on a shared
# 2-core machine do; passive waiting costs nothing measurable when the cores are free. Children inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None
"""The host's 1/5/15-minute load averages when the experiment started (other jobs share the cores)."""
