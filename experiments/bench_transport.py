"""Issue 20, item 5: the intra-host transport on CPU -- gloo's all-to-all against the bytes moved.

On ``--ranks`` CPU ranks of this host (``gsplit.launch``, gloo, one torch thread per rank as the trainer
gives them), for each message size (bytes each rank sends in one all-to-all, split evenly over the
ranks, itself included), the seconds of one exchange by:

* ``gloo``: ``torch.distributed.all_to_all_single`` (what ``gsplit.comm.Communicator`` issues on CPU);
* ``memcpy``: ``out.copy_(x)`` of the same bytes in every rank at once (the floor of any transport
  that moves the data once; the ranks share the memory bandwidth as in an exchange);
* ``shm+barrier``: a shared-memory all-to-all: every rank has two outboxes in ``/dev/shm`` (mapped
  once with ``torch.from_file(shared=True)``, used alternately, so one synchronisation per exchange
  suffices: a rank writes outbox ``k % 2`` only after every rank has passed exchange ``k - 1``, by
  which time they have read exchange ``k - 2`` from it). A rank copies its rows into its outbox, the
  ranks synchronise with a gloo barrier, and each copies its slice out of every other rank's outbox:
  two copies of the remote bytes and one barrier;
* ``shm+spin``: the same with the barrier replaced by a spin on a shared ``int64`` flag per rank
  (written after the copy, read with ``os.sched_yield`` between reads so a shared core is not
  hogged). x86 keeps stores in program order (glibc's non-temporal ``memcpy`` loops end with
  ``sfence``), so a rank that sees the flag sees the rows; on weaker memory models this needs a fence.

* ``gsplit-shm``: the transport the library ships (``gsplit.comm.shm.ShmAllToAll``, what
  ``GSPLIT_CPU_TRANSPORT=shm`` selects): per-pair slots written by the sender and read by the receiver,
  rows kept on the rank copied once, the same flag wait (sleeping 50 us at a time after 200 yields).

Also the latency of the synchronisations alone (``barrier``: ``dist.barrier``; ``spin``: the flag
exchange). An exchange in lockstep is all this measures: in training the ranks
arrive at different times and the waiting for the slower one is not transport (see the ``balance``
record of ``gsplit train --log``). Every figure is the median over ``--repeats`` timed blocks of
``--iters`` back-to-back exchanges (the ranks start each block after a barrier), per exchange.

    python experiments/bench_transport.py --quick          # 64 KB .. 2 MB, 2 ranks, seconds
    python experiments/bench_transport.py                  # 64 KB .. 32 MB, 2 and 3 ranks
    python experiments/bench_transport.py --ranks 2 --sizes 1M,8M

Writes ``OUT/bench_transport[_quick].json`` and prints one table per world size with each method's
milliseconds, its GB/s (bytes a rank sends / time) and its ratio to gloo.
"""

from __future__ import annotations

import os
import statistics
import sys
import uuid
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch
import torch.distributed as dist

import gsplit
from gsplit.comm.shm import ShmAllToAll

METHODS = ("gloo", "memcpy", "shm+barrier", "shm+spin", "gsplit-shm")
"""The transports compared, per message size."""


def parse_size(text: str) -> int:
    """``64K``, ``8M``, ``1G`` or a plain byte count."""
    text = text.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def parse_args(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--ranks", quick=[2], full=[2, 3], type=setup.int_list,
                help="comma-separated world sizes (default 2,3; quick 2)")
    p.add_sized("--sizes", quick="64K,512K,2M", full="64K,256K,1M,4M,8M,16M,32M",
                help="bytes each rank sends per exchange, comma-separated "
                     "(default 64K,256K,1M,4M,8M,16M,32M; quick 64K,512K,2M)")
    p.add_sized("--iters", quick=5, full=20, type=int, help="exchanges per timed block (default 20; quick 5)")
    p.add_sized("--repeats", quick=3, full=7, type=int, help="timed blocks per figure (default 7; quick 3)")
    p.add_argument("--sync-iters", type=int, default=200, help="synchronisations timed for the latency rows")
    args = p.parse_args(argv)
    args.sizes = [parse_size(x) for x in args.sizes.split(",")]
    if min(args.ranks) < 2:
        raise SystemExit(f"--ranks {args.ranks}: an exchange needs at least 2 ranks")
    return args


class ShmExchange:
    """A shared-memory all-to-all of equal-width float32 rows between the ranks of one host (benchmark only).

    Each rank maps every rank's two outboxes (``/dev/shm/<token>-<rank>``, ``capacity`` bytes each, plus
    a header with the sender's row offsets) and one flag per rank; the flags count completed exchanges.
    """

    def __init__(self, token: str, rank: int, world: int, capacity: int):
        self.rank, self.world, self.k = rank, world, 0
        self.cap = capacity // 4
        self.head = world + 1  # int64 offsets of the sender's blocks, in rows
        self.paths = [Path(f"/dev/shm/{token}-{r}") for r in range(world)]
        size = 2 * (self.cap + 2 * self.head)  # float32 cells: two boxes of header (int64 = 2 cells) + rows
        self.boxes = [torch.from_file(str(p), shared=True, size=size, dtype=torch.float32) for p in self.paths]
        self.flags = torch.from_file(f"/dev/shm/{token}-flags", shared=True, size=world, dtype=torch.int64)

    def _box(self, r: int, k: int):
        base = (k % 2) * (self.cap + 2 * self.head)
        b = self.boxes[r]
        return b[base:base + 2 * self.head].view(torch.int64), b[base + 2 * self.head:base + 2 * self.head + self.cap]

    def exchange(self, x: torch.Tensor, send_counts, recv_counts, sync: str) -> torch.Tensor:
        """``all_to_all_single(out, x, recv_counts, send_counts)`` through the outboxes."""
        k, me = self.k, self.rank
        width = x.shape[1]
        head, rows = self._box(me, k)
        offsets = [0]
        for c in send_counts:
            offsets.append(offsets[-1] + c)
        head[:self.world + 1] = torch.tensor(offsets)
        rows[:x.numel()].copy_(x.reshape(-1))
        self.sync(sync)
        out = x.new_empty((sum(recv_counts), width))
        at = 0
        for j in range(self.world):
            n = recv_counts[j]
            if j == me:
                out[at:at + n] = x[offsets[me]:offsets[me] + n]
            else:
                jhead, jrows = self._box(j, k)
                start = int(jhead[me])
                out[at:at + n].view(-1).copy_(jrows[start * width:(start + n) * width])
            at += n
        self.k += 1
        return out

    def sync(self, how: str) -> None:
        if how == "barrier":
            dist.barrier()
            return
        target = self.k + 1
        self.flags[self.rank] = target
        while int(self.flags.min()) < target:
            os.sched_yield()

    def close(self) -> None:
        for p in self.paths:
            if p.exists():
                p.unlink()


def timed(fn, iters: int, repeats: int) -> float:
    """Median over ``repeats`` blocks of seconds per call, each block of ``iters`` calls after a barrier."""
    fn()  # warm-up (first-touch of buffers, gloo's pairs)
    blocks = rounds.time_repeats(lambda: [fn() for _ in range(iters)], repeats, warmup=0, before=dist.barrier)
    return statistics.median(t / iters for t in blocks)


def bench_rank(rank: int, world: int, args, token: str) -> dict:
    torch.set_num_threads(1)  # as the trainer's CPU ranks on a 2-core host; a copy uses one core
    cap = max(args.sizes) + 64 * world
    shm = ShmExchange(token, rank, world, cap)
    dist.barrier()  # every rank has mapped every file
    lib = ShmAllToAll()
    lib.setup()
    res = {"threads": torch.get_num_threads(), "sync_ms": {}, "exchange_ms": {}}
    res["sync_ms"]["barrier"] = 1e3 * timed(dist.barrier, args.sync_iters, args.repeats)
    res["sync_ms"]["spin"] = 1e3 * timed(lambda: (shm.sync("spin"), setattr(shm, "k", shm.k + 1)),
                                         args.sync_iters, args.repeats)
    for size in args.sizes:
        width = 64  # 256-byte rows; the trainer's rows are hidden x 4 bytes
        rows = max(1, size // (4 * width) // world)  # per destination
        counts = [rows] * world
        x = torch.randn(sum(counts), width)
        recv = [counts[rank]] * world
        out = x.new_empty((sum(recv), width))
        ref = torch.empty_like(out)
        dist.all_to_all_single(ref, x, recv, counts)
        for how in ("barrier", "spin", "lib"):  # the shared-memory paths give gloo's result exactly
            got = lib.all_to_all(x, counts, recv) if how == "lib" else shm.exchange(x, counts, recv, how)
            if not torch.equal(got, ref):
                raise AssertionError(f"shm+{how} differs from gloo at {size} bytes on rank {rank}")
        ms = {
            "gloo": timed(lambda: dist.all_to_all_single(out, x, recv, counts), args.iters, args.repeats),
            "memcpy": timed(lambda: out.copy_(x), args.iters, args.repeats),
            "shm+barrier": timed(lambda: shm.exchange(x, counts, recv, "barrier"), args.iters, args.repeats),
            "shm+spin": timed(lambda: shm.exchange(x, counts, recv, "spin"), args.iters, args.repeats),
            "gsplit-shm": timed(lambda: lib.all_to_all(x, counts, recv), args.iters, args.repeats),
        }
        res["exchange_ms"][x.numel() * 4] = {m: 1e3 * s for m, s in ms.items()}
    dist.barrier()
    if rank == 0:
        shm.close()
        Path(f"/dev/shm/{token}-flags").unlink(missing_ok=True)
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    stem = report.output_stem(args, "bench_transport")
    results = {}
    for world in args.ranks:
        token = f"gsplit-bench-{uuid.uuid4().hex[:12]}"
        try:
            per_rank = gsplit.launch(bench_rank, world, args=(args, token), devices="cpu")
        finally:
            for p in Path("/dev/shm").glob(f"{token}-*"):
                p.unlink(missing_ok=True)
        # the slowest rank's figure: an exchange ends for the job when its last rank is done
        sync = {m: max(r["sync_ms"][m] for r in per_rank) for m in per_rank[0]["sync_ms"]}
        sizes = list(per_rank[0]["exchange_ms"])
        table = {size: {m: max(r["exchange_ms"][size][m] for r in per_rank) for m in METHODS} for size in sizes}
        results[world] = {"sync_ms": sync, "exchange_ms": table, "threads": [r["threads"] for r in per_rank]}
        rows = [[f"{size / 2**20:.3g} MiB",
                 *[f"{table[size][m]:.3f}" for m in METHODS],
                 *[f"{size / table[size][m] / 1e6:.2f}" for m in METHODS],
                 *[f"{table[size][m] / table[size]['gloo']:.2f}" for m in METHODS[1:]]] for size in sizes]
        print(f"\n{world} ranks (1 torch thread each), per exchange, slowest rank, median of {args.repeats} x "
              f"{args.iters}; sync alone: barrier {sync['barrier']:.3f} ms, spin {sync['spin']:.3f} ms")
        print(report.format_table(["bytes sent per rank", *[f"{m} ms" for m in METHODS],
                                   *[f"{m} GB/s" for m in METHODS], *[f"{m}/gloo" for m in METHODS[1:]]], rows))
    report.save_json(stem, {"experiment": "intra-host transport (issue 20 item 5)",
                            "settings": report.settings(args),
                            "results": {str(w): {**r, "exchange_ms": {str(s): v for s, v in r["exchange_ms"].items()}}
                                        for w, r in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
