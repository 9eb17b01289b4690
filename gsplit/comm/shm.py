"""A shared-memory all-to-all for the CPU ranks of one host (issue 20, item 5), opt-in.

gloo moves an all-to-all between processes of one host through loopback TCP: two kernel copies per
byte, helper threads and a wake-up per peer. Here every ordered pair of ranks ``(j -> r)`` has a
file in ``/dev/shm`` that the sender ``j`` writes and the receiver ``r`` reads, mapped once by both
(``torch.from_file(shared=True)``): one copy in, one copy out, no system call. Measured by
``experiments/bench_transport.py`` (2 CPU ranks, 4 MB to the peer per exchange): gloo 4.9 ms, this
path 2.6 ms (see experiments/README.md, "The intra-host transport").

Protocol (exchange ``k``, the same sequence on every rank since all-to-alls are collective):

* sizes: a pair's slot holds two halves (exchange ``k`` uses half ``k % 2``), each big enough for the
  rows of that pair; sender and receiver both know the pair's row count (``send_counts`` /
  ``recv_counts``), so both grow the slot alike, with no message: the sender creates the next
  generation of the pair's file (a new name) before the synchronisation, the receiver maps and
  unlinks it after it. Nothing stays in ``/dev/shm`` past that (a crash in between leaves one file);
* synchronisation: one shared ``int64`` flag per rank; a rank writes its rows, then sets its flag to
  ``k + 1``, then waits until every flag is ``>= k + 1`` and reads. Two halves make that the only
  wait: a rank writes half ``k % 2`` after every rank has passed exchange ``k - 1``, hence read
  ``k - 2`` from it. The wait spins briefly (``os.sched_yield``) then sleeps 50 us at a time, so a rank
  that waits for a slow peer gives its core away;
* memory order: x86-64 keeps stores in program order (and glibc's non-temporal copy loops end with
  ``sfence``), so a rank that sees a peer's flag sees its rows; :func:`supported` refuses other
  architectures (weaker memory models need fences that Python cannot issue).

Set up lazily at a communicator's first exchange (one ``all_gather_object`` and two barriers on its
gloo group, in the same order on every rank); used only when every rank of the group is on this host.

Example:
    >>> ex = ShmAllToAll(group=None)                   # in each rank of a gloo group  # doctest: +SKIP
    >>> out = ex.all_to_all(x, send_counts, recv_counts)                                # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import platform
import socket
import time
import uuid
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from gsplit.comm.waits import waiting_for_peers

SHM_DIR = Path("/dev/shm")
"""Where the pair files live (a tmpfs: memory, not disk)."""

ENV = "GSPLIT_CPU_TRANSPORT"
"""Environment variable choosing CPU ranks' all-to-all transport: ``gloo`` (default) or ``shm``."""

_SPINS = 200
"""Yields before the wait starts sleeping (a peer that is about to arrive costs microseconds)."""

_SLEEP_S = 5e-5
"""Sleep between flag reads once spinning stopped."""

_ALIGN = 4096
"""Slot halves are rounded up to pages."""


def supported() -> bool:
    """Whether this machine can run the transport: Linux with ``/dev/shm``, x86-64 (store order)."""
    return platform.machine().lower() in ("x86_64", "amd64") and SHM_DIR.is_dir()


def requested() -> bool:
    """Whether ``GSPLIT_CPU_TRANSPORT=shm`` asks for the shared-memory transport.

    Raises:
        ValueError: the variable holds something else than ``gloo`` or ``shm``.
    """
    value = os.environ.get(ENV, "gloo").strip().lower() or "gloo"
    if value not in ("gloo", "shm"):
        raise ValueError(f"{ENV}={value!r}; use 'shm' (shared memory between the CPU ranks of one host) "
                         f"or 'gloo' (the default)")
    return value == "shm"


class ShmAllToAll:
    """All-to-alls of CPU tensors between the ranks of ``group`` (all on this host) through ``/dev/shm``.

    Args:
        group: the gloo process group (``None``: the default group).
        timeout_s: a wait for peers longer than this raises (a peer died or left the sequence).
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, timeout_s: float = 1800.0):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout_s = timeout_s
        self.k = 0
        self._token: Optional[str] = None
        self._flags: Optional[torch.Tensor] = None
        self.usable: Optional[bool] = None
        """None until set up; then whether every rank of the group is on this host."""
        # per peer: the slot this rank writes to it / reads from it, its half size (bytes), its generation
        self._out: List[Optional[torch.Tensor]] = [None] * self.world
        self._in: List[Optional[torch.Tensor]] = [None] * self.world
        self._out_half = [0] * self.world
        self._in_half = [0] * self.world
        self._out_gen = [0] * self.world
        self._in_gen = [0] * self.world

    # ------------------------------------------------------------------ setup
    def setup(self) -> bool:
        """Agree on a token and map the flags (collective); returns whether the transport is usable."""
        if self.usable is not None:
            return self.usable
        token = f"gsplit-a2a-{uuid.uuid4().hex[:16]}"
        info: List = [None] * self.world
        dist.all_gather_object(info, (socket.gethostname(), token, supported()), group=self.group)
        self.usable = all(h == info[0][0] and ok for h, _, ok in info)
        if not self.usable:
            return False
        self._token = info[0][1]
        path = SHM_DIR / f"{self._token}-flags"
        if self.rank == 0:
            self._flags = torch.from_file(str(path), shared=True, size=self.world, dtype=torch.int64)
            self._flags.zero_()
        dist.barrier(group=self.group)
        if self.rank != 0:
            self._flags = torch.from_file(str(path), shared=True, size=self.world, dtype=torch.int64)
        dist.barrier(group=self.group)
        if self.rank == 0:
            path.unlink(missing_ok=True)
        return True

    def _path(self, src: int, dst: int, gen: int) -> str:
        return str(SHM_DIR / f"{self._token}-{src}-{dst}-{gen}")

    @staticmethod
    def _grown(half: int, need: int) -> int:
        """The next half size for ``need`` bytes: double at least (few regrowths), page-aligned."""
        size = max(need, 2 * half, _ALIGN)
        return int(math.ceil(size / _ALIGN) * _ALIGN)

    # ------------------------------------------------------------------ exchange
    def all_to_all(self, x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]) -> torch.Tensor:
        """``all_to_all_single(out, x, recv_counts, send_counts)`` for a contiguous CPU tensor ``x``."""
        k, me, world = self.k, self.rank, self.world
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        src = x.contiguous().view(-1).view(torch.uint8) if x.numel() else torch.empty(0, dtype=torch.uint8)
        out = torch.empty((sum(recv_counts),) + tuple(x.shape[1:]), dtype=x.dtype)
        dst = out.view(-1).view(torch.uint8) if out.numel() else torch.empty(0, dtype=torch.uint8)
        send_at = [0] * (world + 1)
        recv_at = [0] * (world + 1)
        for j in range(world):
            send_at[j + 1] = send_at[j] + send_counts[j] * row_bytes
            recv_at[j + 1] = recv_at[j] + recv_counts[j] * row_bytes
        # write this rank's rows into every peer's slot (growing a slot first where it is too small)
        for j in range(world):
            n = send_at[j + 1] - send_at[j]
            if j == me:
                dst[recv_at[me]:recv_at[me] + n].copy_(src[send_at[me]:send_at[me + 1]])
                continue
            if n > self._out_half[j]:
                self._out_half[j] = self._grown(self._out_half[j], n)
                self._out_gen[j] += 1
                self._out[j] = torch.from_file(self._path(me, j, self._out_gen[j]), shared=True,
                                               size=2 * self._out_half[j], dtype=torch.uint8)
            if n:
                base = (k % 2) * self._out_half[j]
                self._out[j][base:base + n].copy_(src[send_at[j]:send_at[j + 1]])
        self._sync(k + 1)
        # read every peer's rows from its slot (mapping a slot it grew, then unlinking its file)
        for j in range(world):
            n = recv_at[j + 1] - recv_at[j]
            if j == me:
                continue
            if n > self._in_half[j]:
                self._in_half[j] = self._grown(self._in_half[j], n)
                self._in_gen[j] += 1
                path = self._path(j, me, self._in_gen[j])
                self._in[j] = torch.from_file(path, shared=True, size=2 * self._in_half[j], dtype=torch.uint8)
                os.unlink(path)  # both ends have it mapped: the memory lives as long as the mappings
            if n:
                base = (k % 2) * self._in_half[j]
                dst[recv_at[j]:recv_at[j + 1]].copy_(self._in[j][base:base + n])
        self.k += 1
        return out

    def _sync(self, target: int) -> None:
        """Set this rank's flag to ``target`` and wait until every rank's flag reached it."""
        flags = self._flags
        flags[self.rank] = target
        if int(flags.min()) >= target:
            return
        start = time.monotonic()
        with waiting_for_peers():
            spins = 0
            while int(flags.min()) < target:
                if spins < _SPINS:
                    spins += 1
                    os.sched_yield()
                    continue
                time.sleep(_SLEEP_S)
                if time.monotonic() - start > self.timeout_s:
                    late = [r for r in range(self.world) if int(flags[r]) < target]
                    raise RuntimeError(f"shared-memory all-to-all {target - 1}: ranks {late} did not arrive within "
                                       f"{self.timeout_s:.0f}s (a peer died or issued other collectives); "
                                       f"unset {ENV} to use gloo")
