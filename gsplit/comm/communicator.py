"""``Communicator``: the rank's view of its process group, with all-to-all of variable-sized row blocks.

It wraps ``torch.distributed`` (NCCL for CUDA tensors, gloo for CPU tensors) on an explicit process
group, and degrades to local copies at world size 1 without any process group, so single-process code
paths need no special cases. It also counts what it sends (:class:`TrafficCounter`), so that the
numbers in benchmark logs come from the code path itself, and tells :mod:`gsplit.comm.waits` where it
blocks for other ranks (the launcher's progress watchdog reads that).
"""

from __future__ import annotations

import math
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from gsplit.comm import shm
from gsplit.comm.waits import track_in_flight, waiting_for_peers


@dataclass
class TrafficCounter:
    """Rows and bytes this rank sent to *other* ranks, per tag (e.g. ``"ids/layer1"``)."""

    rows: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Rows sent to other ranks (rows kept on this rank are not counted)."""
    bytes: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Bytes sent to other ranks."""
    calls: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Collectives this rank issued, per tag (every rank issues the same ones): each is a point where the
    faster ranks wait for the slowest."""
    seconds: Dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Wall seconds this rank spent inside the all-to-alls and all-reduces, per tag: with gloo (blocking) the
    transfer and the wait for the slowest peer; with NCCL only the enqueue (the wait then shows where the host
    syncs)."""

    def add(self, tag: str, rows: int, nbytes: int) -> None:
        self.rows[tag] += rows
        self.bytes[tag] += nbytes

    def add_call(self, tag: str, n: int = 1, seconds: float = 0.0) -> None:
        self.calls[tag] += n
        if seconds:
            self.seconds[tag] += seconds

    def merge(self, delta: dict) -> None:
        """Add a :meth:`delta` (e.g. what a loader's own group sent for a batch) to these counters."""
        for tag, rows in delta["rows"].items():
            self.add(tag, rows, delta["bytes"].get(tag, 0))
        for tag, n in delta.get("calls", {}).items():
            self.add_call(tag, n)
        for tag, sec in delta.get("seconds", {}).items():
            self.seconds[tag] += sec

    def reset(self) -> None:
        self.rows.clear()
        self.bytes.clear()
        self.calls.clear()
        self.seconds.clear()

    def snapshot(self, seconds: bool = False) -> dict:
        """The counts so far (``rows``, ``bytes``, ``calls`` per tag), and with ``seconds=True`` the timings,
        which differ from run to run."""
        counts = {"rows": dict(self.rows), "bytes": dict(self.bytes), "calls": dict(self.calls)}
        return {**counts, "seconds": dict(self.seconds)} if seconds else counts

    @staticmethod
    def delta(now: dict, before: dict) -> dict:
        """Per-tag difference of two :meth:`snapshot` results: what was sent in between."""
        return {kind: {tag: n - before.get(kind, {}).get(tag, 0) for tag, n in now.get(kind, {}).items()
                       if n != before.get(kind, {}).get(tag, 0)}
                for kind in ("rows", "bytes", "calls", "seconds")}


@dataclass
class CapacityBook:
    """Per-peer capacities of the fixed-size slots of :meth:`Communicator.all_to_all_counted`, per tag.

    The capacity of the slot from rank ``i`` to rank ``j`` is a function of the counts ``i`` sent ``j``
    under that tag so far, which both ``i`` (who sent them) and ``j`` (who received them) know: the two
    agree on every slot's size without exchanging it.
    """

    sent: Dict[str, List[List[int]]] = field(default_factory=dict)
    """Per tag, per destination rank: the last :attr:`HISTORY` counts this rank sent."""
    received: Dict[str, List[List[int]]] = field(default_factory=dict)
    """Per tag, per source rank: the last :attr:`HISTORY` counts this rank received."""

    HISTORY = 8
    HEADROOM = 1.25

    @classmethod
    def capacity(cls, history: List[int], headroom: float = HEADROOM, slack: int = 0) -> int:
        """The slot size after ``history``: the largest recent count and a quarter more (0 before any); a caller
        whose overflow costs more asks for more ``headroom`` and an absolute ``slack`` (small counts vary most)."""
        return math.ceil(headroom * max(history)) + slack if history else 0

    def capacities(self, tag: str, world_size: int, headroom: float = HEADROOM, slack: int = 0
                   ) -> Tuple[List[int], List[int]]:
        """``(send, recv)`` slot capacities per peer for the next exchange under ``tag``."""
        sent = self.sent.get(tag) or [[] for _ in range(world_size)]
        received = self.received.get(tag) or [[] for _ in range(world_size)]
        return ([self.capacity(h, headroom, slack) for h in sent],
                [self.capacity(h, headroom, slack) for h in received])

    def record(self, tag: str, sent: Sequence[int], received: Sequence[int]) -> None:
        for book, counts in ((self.sent, sent), (self.received, received)):
            histories = book.setdefault(tag, [[] for _ in counts])
            for history, n in zip(histories, counts):
                history.append(int(n))
                del history[:-self.HISTORY]


@dataclass
class SlotExchange:
    """What :meth:`Communicator.all_to_all_slots` received, still on the device (nothing read back)."""

    received: torch.Tensor
    """int64 slots, one per source rank in rank order (``recv_cap[i]`` entries for rank ``i``): the first
    ``min(recv_counts[i], recv_cap[i])`` of rank ``i``'s are the ids it sent here, the rest unspecified."""
    recv_counts: torch.Tensor
    """``[world_size]`` ids each rank meant to send here (more than its slot holds when it overflowed)."""
    sent_counts: torch.Tensor
    """``[world_size]`` ids this rank meant to send each rank."""
    overflow: torch.Tensor
    """``[world_size]`` 1 where that rank's ids outgrew one of its slots (any of them): the same flags on every rank."""
    send_cap: List[int]
    """Slot capacity per destination rank (host)."""
    recv_cap: List[int]
    """Slot capacity per source rank (host)."""
    tag: str
    """The traffic and capacity tag."""

    def valid(self) -> torch.Tensor:
        """bool per entry of :attr:`received`: whether it is an id sent here."""
        dev = self.received.device
        return torch.cat([torch.arange(cap, device=dev) < self.recv_counts[i] for i, cap in enumerate(self.recv_cap)])

    def slot(self, rank: int, n: int) -> slice:
        """The first ``n`` entries of ``rank``'s slot in :attr:`received` (a host slice)."""
        start = sum(self.recv_cap[:rank])
        return slice(start, start + n)


class Communicator:
    """A rank's handle on its process group.

    Args:
        group: a ``torch.distributed`` process group; ``None`` means the default group when one is
            initialised, otherwise a single-rank world with no communication at all.

    Example:
        >>> comm = Communicator()          # no process group: world size 1
        >>> comm.rank, comm.world_size
        (0, 1)
        >>> comm.all_to_all_rows(torch.ones(3, 2), [3], [3]).shape
        torch.Size([3, 2])
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.distributed = dist.is_available() and dist.is_initialized()
        if group is not None and not self.distributed:
            raise ValueError("a process group was given but torch.distributed is not initialised; "
                             "call torch.distributed.init_process_group first (gsplit.launch does it)")
        self.group = group
        if self.distributed:
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
            if self.rank < 0:
                raise ValueError("this process is not a member of the given process group")
        else:
            self.rank, self.world_size = 0, 1
        self.nccl_for_cuda = self.distributed and serves_cuda_with_nccl(group)
        """Whether the group sends CUDA tensors over NCCL (else they are staged through host memory)."""
        self.traffic = TrafficCounter()
        self.cross_host = TrafficCounter()
        """Of :attr:`traffic`'s rows, those sent to ranks on another host (counted after :meth:`set_hosts`)."""
        self._far: Optional[List[bool]] = None  # per group rank: on another host than this rank
        self.capacities = CapacityBook()
        # GSPLIT_CPU_TRANSPORT=shm (the same on every rank): CPU all-to-alls through /dev/shm instead of gloo's
        # loopback sockets, set up at the first one; a group spanning hosts keeps gloo
        self._shm = shm.ShmAllToAll(group) if self.distributed and self.world_size > 1 and shm.requested() else None

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"

    # ------------------------------------------------------------------ collectives
    def exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """Tell every rank how many rows it will get from us; returns how many we get from each (host int64)."""
        return torch.tensor(self.exchange_count_lists(send_counts)[1], dtype=torch.int64)

    def exchange_count_lists(self, send_counts: torch.Tensor) -> Tuple[List[int], List[int]]:
        """``(send, recv)``: ``send_counts`` and how many rows each rank sends us, as lists, with one wait.

        ``send_counts`` may be on the device: NCCL exchanges them there and one copy brings both back
        (the host waits once, for the sizes it must know); with gloo they go to the host first (the one
        wait). Host counts bound for NCCL go through pinned memory, asynchronously.

        Example:
            >>> Communicator().exchange_count_lists(torch.tensor([3]))
            ([3], [3])
        """
        send = send_counts.to(torch.int64)
        if self.world_size == 1:
            counts = send.tolist()
            return counts, list(counts)
        # NCCL needs device tensors; gloo needs CPU tensors. Counts follow the backend.
        dev = self._collective_device(send)
        if dev.type == "cpu" and send.device.type != "cpu":
            send = send.cpu()
        elif dev.type == "cuda" and send.device.type == "cpu":
            send = send.pin_memory().to(dev, non_blocking=True)
        recv = torch.empty_like(send)
        self.traffic.add_call("counts")
        dist.all_to_all_single(recv, send, group=self.group)
        with waiting_for_peers():  # under NCCL the host blocks here, until every peer has sent its counts
            both = torch.stack([send, recv]).tolist()
        return both[0], both[1]

    def all_to_all_rows(self, x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                        tag: Optional[str] = None) -> torch.Tensor:
        """Send ``x[rows of block j]`` to rank ``j``; rows are grouped by destination rank in ``x``.

        ``send_counts[j]`` rows go to rank ``j`` and ``recv_counts[j]`` rows come from rank ``j``; the
        result holds the received rows grouped by source rank.
        """
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        if len(send_counts) != self.world_size or len(recv_counts) != self.world_size:
            raise ValueError(f"send/recv counts have {len(send_counts)}/{len(recv_counts)} entries but the world "
                             f"has {self.world_size} ranks; pass one count per rank")
        if sum(send_counts) != x.shape[0]:
            raise ValueError(f"send counts add up to {sum(send_counts)} rows but x has {x.shape[0]}")
        if tag is not None and self.world_size > 1:
            self.count_rows(tag, x, send_counts)
        if self.world_size == 1:
            return x
        return self._all_to_all(x, send_counts, recv_counts, tag or "rows")

    def set_hosts(self, hosts: Sequence[int]) -> None:
        """Also count, in :attr:`cross_host`, the rows sent to ranks on another host: ``hosts[j]`` is the host of
        rank ``j`` of this group (a split group spanning hosts; inside one host nothing is counted there).

        Example:
            >>> comm = Communicator()
            >>> comm.set_hosts([0]); comm.cross_host.snapshot()["bytes"]
            {}
        """
        if len(hosts) != self.world_size:
            raise ValueError(f"hosts has {len(hosts)} entries but the group has {self.world_size} ranks; pass the "
                             "host of every rank of the group")
        self._far = [int(h) != int(hosts[self.rank]) for h in hosts]

    def _count_far(self, tag: str, sent: Sequence[int], row_bytes: int) -> None:
        if self._far is not None:
            far = sum(int(n) for n, other in zip(sent, self._far) if other)
            self.cross_host.add(tag, far, far * row_bytes)

    def count_rows(self, tag: str, x: torch.Tensor, send_counts: Sequence[int]) -> None:
        """Count the rows of ``x`` (grouped by destination, ``send_counts[j]`` to rank ``j``) that leave this rank,
        and their bytes, under ``tag``: what every all-to-all of rows books, blocking or not
        (:class:`gsplit.minibatch.overlap.AsyncRows`)."""
        remote = sum(send_counts) - send_counts[self.rank]
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        self.traffic.add(tag, remote, remote * row_bytes)
        self._count_far(tag, send_counts, row_bytes)

    def all_to_all_counted(self, x: torch.Tensor, dest: torch.Tensor, tag: str
                           ) -> Tuple[torch.Tensor, List[int], List[int]]:
        """Send the 1-D integer rows ``x`` (grouped by destination: ``dest`` ascending, ``dest[i]`` the rank
        row ``i`` goes to) with their counts in ONE all-to-all; returns ``(received, sent, recv)``.

        ``received`` holds the rows from every rank grouped by source rank, ``sent[j]`` / ``recv[j]`` how
        many rows went to / came from rank ``j`` (host lists, read in one wait). Every pair of ranks has a
        slot per tag: a header ``[count, overflow]`` and room for ``capacity`` rows, where the capacity
        follows the counts that pair exchanged before (:class:`CapacityBook`: both ends know them). Rows
        beyond a slot's capacity go in a second all-to-all, which every rank runs exactly when any rank
        overflowed (each header tells whether its sender did). Steady state: one collective instead of
        a count exchange and a row exchange. The first exchange under a tag always overflows (no
        history yet), so it takes two, as the counted exchange did.

        Example:
            >>> Communicator().all_to_all_counted(torch.tensor([5, 7]), torch.tensor([0, 0]), "ids")
            (tensor([5, 7]), [2], [2])
        """
        n = x.numel()
        if self.world_size == 1:
            return x, [n], [n]
        if x.dim() != 1 or x.dtype.is_floating_point:
            raise ValueError(f"all_to_all_counted sends 1-D integer rows (ids) with their counts in one buffer, "
                             f"got a {x.dtype} tensor of shape {tuple(x.shape)}; use all_to_all_rows for other rows")
        world = self.world_size
        send_cap, recv_cap = self.capacities.capacities(tag, world)
        out, counts, recv_base = self._send_slots(x, dest, send_cap, recv_cap, tag)
        headers = torch.stack([out[recv_base[j]:recv_base[j] + 2] for j in range(world)], 1)  # [count; overflow]
        with waiting_for_peers():  # under NCCL the host blocks here, until every peer has sent its slots
            host = torch.cat([counts.unsqueeze(0), headers]).tolist()  # the one wait
        sent, recv, any_overflow = host[0], host[1], any(host[2])
        self.capacities.record(tag, sent, recv)
        remote = sum(sent) - sent[self.rank]
        self.traffic.add(tag, remote, remote * x.element_size())
        self._count_far(tag, sent, x.element_size())
        parts = [out[recv_base[j] + 2:recv_base[j] + 2 + min(recv[j], recv_cap[j])] for j in range(world)]
        if any_overflow:
            offsets = [sum(sent[:j]) for j in range(world)]
            extra_sent = [max(0, sent[j] - send_cap[j]) for j in range(world)]
            extra_recv = [max(0, recv[j] - recv_cap[j]) for j in range(world)]
            extra = torch.cat([x[offsets[j] + send_cap[j]:offsets[j] + sent[j]] for j in range(world)
                               if extra_sent[j]] or [x[:0]])
            more = self._all_to_all(extra.to(torch.int64), extra_sent, extra_recv, f"{tag}/overflow")
            more_parts = torch.split(more, extra_recv)
            parts = [torch.cat([p, m]) for p, m in zip(parts, more_parts)]
        return torch.cat(parts).to(x.dtype), sent, recv

    def _send_slots(self, x: torch.Tensor, dest: torch.Tensor, send_cap: List[int], recv_cap: List[int], tag: str
                    ) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
        """The slot all-to-all of :meth:`all_to_all_counted` without a read: ``(received buffer, counts sent per
        rank (device), where each sender's slot starts)``. ``dest[i] == world_size`` sends row ``i`` nowhere."""
        world, device, n = self.world_size, x.device, x.numel()
        send_split = [2 + c for c in send_cap]
        recv_split = [2 + c for c in recv_cap]
        send_base = [sum(send_split[:j]) for j in range(world)]
        recv_base = [sum(recv_split[:j]) for j in range(world)]
        total = sum(send_split)
        dest = dest.to(torch.int64)
        counts = torch.zeros(world + 1, dtype=torch.int64, device=device).index_add_(
            0, dest, torch.ones_like(dest))
        starts = torch.cumsum(counts, 0) - counts
        counts = counts[:world]
        # the slot layout as device tensors, without a sync (a pinned asynchronous copy on a GPU); the extra
        # entry (capacity 0) is where rows sent nowhere would go
        layout = torch.tensor([send_base + [total], send_cap + [0]], dtype=torch.int64)
        if device.type == "cuda":
            layout = layout.pin_memory()
        base_t, cap_t = layout.to(device, non_blocking=True).unbind(0)
        # per-row lookups of the (world-sized) layout by index_select: advanced indexing (starts[dest]) is the
        # same gather 6x slower on the CPU (62k rows: 0.5 vs 0.08 ms on one core), 3 of them per exchange
        within = torch.arange(n, device=device) - starts.index_select(0, dest)
        fits = within < cap_t.index_select(0, dest)
        # rows that do not fit go past the end (one place each, so no two writes collide) and are dropped
        pos = torch.where(fits, base_t.index_select(0, dest) + 2 + within, total + torch.arange(n, device=device))
        buf = x.new_zeros(total + n, dtype=torch.int64)
        buf.index_copy_(0, pos, x.to(torch.int64))
        overflow = (counts > cap_t[:world]).any().to(torch.int64)
        buf.index_copy_(0, base_t[:world], counts)
        buf.index_copy_(0, base_t[:world] + 1, overflow.expand(world))
        return self._all_to_all(buf[:total], send_split, recv_split, tag), counts, recv_base

    def all_to_all_slots(self, x: torch.Tensor, dest: torch.Tensor, tag: str, headroom: float = 1.5,
                         slack: int = 64) -> "SlotExchange":
        """:meth:`all_to_all_counted` with nothing read back: the ids and their counts travel in the slots of the
        capacities learnt under ``tag`` (``headroom`` times the largest recent count plus ``slack``: more than
        :meth:`all_to_all_counted` keeps, as an overflow here costs a redo), and what came back stays on the
        device (:class:`SlotExchange`), to be read with the other sizes of the iteration at once. Rows past a
        slot's capacity are dropped, and every rank can tell (:attr:`SlotExchange.overflow` holds every
        sender's flag): the caller redoes the work with :meth:`all_to_all_counted` then. After reading the
        counts, :meth:`settle_slots` books them. ``dest[i] == world_size`` (padding) sends row ``i`` nowhere.
        Needs a world size above 1.

        Example:
            >>> comm = Communicator()                                                         # doctest: +SKIP
            >>> ex = comm.all_to_all_slots(ids_by_owner, owners_sorted, "ids/layer0")          # doctest: +SKIP
        """
        world = self.world_size
        if world == 1:
            raise ValueError("all_to_all_slots exchanges between ranks; with one rank every id is its own")
        send_cap, recv_cap = self.capacities.capacities(tag, world, headroom, slack)
        out, counts, recv_base = self._send_slots(x, dest, send_cap, recv_cap, tag)
        headers = torch.stack([out[recv_base[j]:recv_base[j] + 2] for j in range(world)])  # [sender][count, overflow]
        received = torch.cat([out[recv_base[j] + 2:recv_base[j] + 2 + recv_cap[j]] for j in range(world)])
        return SlotExchange(received=received, recv_counts=headers[:, 0], sent_counts=counts,
                            overflow=headers[:, 1], send_cap=send_cap, recv_cap=recv_cap, tag=tag)

    def settle_slots(self, exchange: "SlotExchange", sent: Sequence[int], received: Sequence[int],
                     row_bytes: int = 8) -> None:
        """Book an :meth:`all_to_all_slots` whose counts were read (``sent``, ``received``): the capacities learn
        them and the traffic counters count the ids that left this rank."""
        if self.world_size == 1:
            return
        self.capacities.record(exchange.tag, sent, received)
        remote = sum(sent) - sent[self.rank]
        self.traffic.add(exchange.tag, remote, remote * row_bytes)
        self._count_far(exchange.tag, sent, row_bytes)

    def _all_to_all(self, x: torch.Tensor, send_counts: List[int], recv_counts: List[int],
                    tag: str) -> torch.Tensor:
        """One all-to-all of rows whose counts both sides know; counted (call, seconds) under ``tag``."""
        t0 = time.perf_counter()
        x = x.contiguous()
        shape = (sum(recv_counts),) + tuple(x.shape[1:])
        dev = self._collective_device(x)
        if dev != x.device:  # e.g. CUDA tensors over gloo: stage through host memory
            # the received rows land in a buffer allocated where the collective writes: nothing to copy in
            if self._shared_memory(dev):
                out = self._shm.all_to_all(x.to(dev), send_counts, recv_counts).to(x.device)
            else:
                host_out = torch.empty(shape, dtype=x.dtype, device=dev)
                self._run(dist.all_to_all_single, host_out, x.to(dev), recv_counts, send_counts)
                out = host_out.to(x.device)
        elif self._shared_memory(dev):
            out = self._shm.all_to_all(x, send_counts, recv_counts)
        else:
            out = x.new_empty(shape)
            self._run(dist.all_to_all_single, out, x, recv_counts, send_counts)
        self.traffic.add_call(tag, seconds=time.perf_counter() - t0)
        return out

    def _shared_memory(self, dev: torch.device) -> bool:
        """Whether this CPU all-to-all goes through :mod:`gsplit.comm.shm` (set up at the first one)."""
        return self._shm is not None and dev.type == "cpu" and self._shm.setup()

    @property
    def transport(self) -> str:
        """The CPU all-to-all transport in use: ``"shm"`` or ``"gloo"`` (``"shm"`` requested but not set up yet
        counts as ``"shm"``; a group that spans hosts falls back to ``"gloo"`` at its first all-to-all)."""
        return "shm" if self._shm is not None and self._shm.usable is not False else "gloo"

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks (a no-op at world size 1)."""
        if self.world_size > 1:
            t0 = time.perf_counter()
            dev = self._collective_device(t)
            if dev != t.device:
                staged = t.to(dev)
                self._run(dist.all_reduce, staged)
                t.copy_(staged)
            else:
                self._run(dist.all_reduce, t)
            # timed as the all-to-alls: with gloo the transfer and the wait for the slowest rank
            self.traffic.add_call("allreduce", seconds=time.perf_counter() - t0)
        return t

    def all_gather_object(self, obj) -> List:
        if self.world_size == 1:
            return [obj]
        out: List = [None] * self.world_size
        self.traffic.add_call("gather")
        with waiting_for_peers():
            dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            self.traffic.add_call("barrier")
            self._run(dist.barrier)

    def _run(self, collective, *args) -> None:
        """Issue ``collective(*args, group=...)`` and wait for it as ``async_op=False`` would, telling
        :mod:`gsplit.comm.waits` that this thread waits for peers meanwhile. Under NCCL ``wait()`` only
        orders the current stream after the collective and returns; the collective stays tracked as in
        flight until it completes, since the host then blocks wherever it next reads device data."""
        with waiting_for_peers():
            work = collective(*args, group=self.group, async_op=True)
            if work is not None:  # None: this rank is not in the group
                work.wait()
        track_in_flight(work)

    def _collective_device(self, t: torch.Tensor) -> torch.device:
        if self.nccl_for_cuda:
            return t.device if t.is_cuda else torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def serves_cuda_with_nccl(group: Optional[dist.ProcessGroup] = None) -> bool:
    """Whether ``group`` (default: the default group) sends CUDA tensors over NCCL.

    A group's backend name says too little: a bare ``init_process_group()`` reports ``"undefined"`` and
    ``"cpu:gloo,cuda:nccl"`` its whole configuration, yet both send CUDA tensors over NCCL. So ask the
    group for the backend it registered for device type ``cuda`` (torch >= 2.0), else read its backend
    configuration (``dist.get_backend_config``: ``"cpu:gloo,cuda:nccl"``, ``"nccl"``), else its name.

    Example:
        >>> serves_cuda_with_nccl()  # no process group here
        False
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    get_backend = getattr(pg, "_get_backend", None)
    if callable(get_backend):
        try:
            backend = get_backend(torch.device("cuda"))
        except RuntimeError:  # "No backend type associated with device type cuda": nothing serves CUDA tensors
            return False
        name = backend.name() if callable(getattr(backend, "name", None)) else type(backend).__name__
        return "nccl" in str(name).lower()
    get_config = getattr(dist, "get_backend_config", None)
    config = str(get_config(group) if callable(get_config) else dist.get_backend(group))
    return device_backend(config, "cuda") == "nccl"


def device_backend(config: str, device_type: str) -> Optional[str]:
    """The backend a configuration string gives ``device_type``: ``"cpu:gloo,cuda:nccl"`` or one name for all.

    Example:
        >>> device_backend("cpu:gloo,cuda:nccl", "cuda"), device_backend("gloo", "cuda"), device_backend("cpu:gloo", "cuda")
        ('nccl', 'gloo', None)
    """
    for entry in str(config).lower().split(","):
        dev, sep, name = entry.strip().partition(":")
        if not sep:  # one backend for every device
            return dev or None
        if dev == device_type:
            return name.strip()
    return None


def as_communicator(group: Union["Communicator", dist.ProcessGroup, None] = None) -> Communicator:
    """A collective's ``group=`` argument as a :class:`Communicator`: one is used as it is (its traffic
    counters keep counting), a process group or ``None`` (the default group; world size 1 without one)
    gets a fresh one.

    Example:
        >>> as_communicator().world_size
        1
    """
    return group if isinstance(group, Communicator) else Communicator(group)


# Which communicator each shuffle plan runs on. The plans stay pure data; this table, filled by the loader
# that made them (bind_group) and read by gsplit.shuffle, is the one place a batch meets its group. Weak
# keys: an entry lives exactly as long as its plan.
_plan_groups: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def bind_group(blocks: Iterable, group) -> None:
    """Record that the shuffles of ``blocks`` run on ``group`` unless a call names another.

    :class:`gsplit.DataLoader` calls it for every batch it yields (with ``loader.comm``), so
    ``model(blocks, x)`` shuffles on the loader's group, also a subgroup, without a group argument.

    Example:
        >>> bind_group([], None)       # blocks without shuffle plans: nothing to record
    """
    comm = as_communicator(group)
    for block in blocks:
        if block.shuffle_index is not None:
            _plan_groups[block.shuffle_index] = comm


def group_of(index) -> Communicator:
    """The communicator :func:`bind_group` recorded for a shuffle plan, else the default group's."""
    comm = _plan_groups.get(index)
    return comm if comm is not None else Communicator()
