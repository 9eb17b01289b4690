"""Stand-ins for CUDA objects that tests of GPU code paths use on a machine without a GPU."""

from __future__ import annotations

import time


class FakeEvent:
    """A CUDA event: ``record`` notes the host time; the GPU 'reaches' it once ``gpu_at`` passes it.

    Every call is appended to ``FakeEvent.log``; reset ``FakeEvent.log, FakeEvent.gpu_at = [], [0.0]``
    before a test.
    """

    log: list = []
    gpu_at = [0.0]

    def __init__(self):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()
        FakeEvent.log.append("record")

    def query(self):
        FakeEvent.log.append("query")
        return self.t is not None and self.t <= FakeEvent.gpu_at[0]

    def synchronize(self):
        FakeEvent.log.append("synchronize")
        FakeEvent.gpu_at[0] = max(FakeEvent.gpu_at[0], self.t)

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0
