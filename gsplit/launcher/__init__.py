"""The launcher: start one process per rank (:func:`launch`, :func:`spawn`), or join the job torchrun started
(:mod:`gsplit.launcher.torchrun`), and watch the ranks until they finish or one fails.

- :mod:`gsplit.launcher.start`: :func:`launch` and :func:`spawn` (the launching process) and the entry
  point of a rank's process; results back, failures propagated, the other ranks stopped.
- :mod:`gsplit.launcher.watch`: heartbeats, progress reports (:func:`report_progress`), the progress
  watchdog, the parent-death watch, SIGTERM/SIGHUP.
- :mod:`gsplit.launcher.rank`: a rank's device, world size, CPU threads and process group.
- :mod:`gsplit.launcher.rendezvous`: the local rendezvous socket and the loopback interface.
- :mod:`gsplit.launcher.failures`: :class:`RankFailure`, :class:`LaunchError`, :class:`LaunchInterrupted`.
- :mod:`gsplit.launcher.torchrun`: a rank that torchrun started joins its job.

The package is ``gsplit.launcher``; ``gsplit.launch`` is the function :func:`launch`
(``import gsplit; gsplit.launch(fn, 2)``). Scripts written when the package was ``gsplit.launch``
(``from gsplit.launch import RankFailure``) still import: :mod:`gsplit._moved` maps the old path here.
"""

from gsplit.launcher.failures import LaunchError, LaunchInterrupted, RankFailure
from gsplit.launcher.rank import current_device, init_process_group, limit_threads, resolve_device, world_size
from gsplit.launcher.start import launch, spawn
from gsplit.launcher.watch import report_progress

__all__ = ["launch", "spawn", "LaunchError", "LaunchInterrupted", "RankFailure", "current_device", "report_progress",
           "resolve_device", "world_size", "init_process_group", "limit_threads"]
