"""The launcher: start one process per rank (:func:`launch`, :func:`spawn`), or join the job torchrun started
(:mod:`gsplit.launch.torchrun`), and watch the ranks until they finish or one fails.

- :mod:`gsplit.launch.start`: :func:`launch` and :func:`spawn` (the launching process) and the entry
  point of a rank's process; results back, failures propagated, the other ranks stopped.
- :mod:`gsplit.launch.watch`: heartbeats, progress reports (:func:`report_progress`), the progress
  watchdog, the parent-death watch, SIGTERM/SIGHUP.
- :mod:`gsplit.launch.rank`: a rank's device, world size, CPU threads and process group.
- :mod:`gsplit.launch.rendezvous`: the local rendezvous socket and the loopback interface.
- :mod:`gsplit.launch.failures`: :class:`RankFailure`, :class:`LaunchError`, :class:`LaunchInterrupted`.
- :mod:`gsplit.launch.torchrun`: a rank that torchrun started joins its job.

``gsplit.launch`` the package holds these modules; ``gsplit.launch`` the attribute of :mod:`gsplit` is the
function :func:`launch` (``import gsplit; gsplit.launch(fn, 2)``).
"""

from gsplit.launch.failures import LaunchError, LaunchInterrupted, RankFailure
from gsplit.launch.rank import current_device, init_process_group, limit_threads, resolve_device, world_size
from gsplit.launch.start import launch, spawn
from gsplit.launch.watch import report_progress

__all__ = ["launch", "spawn", "LaunchError", "LaunchInterrupted", "RankFailure", "current_device", "report_progress",
           "resolve_device", "world_size", "init_process_group", "limit_threads"]
