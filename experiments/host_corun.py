"""How this host's cores slow each other down, sampled over minutes: one process alone against one per core.

Every ``--interval`` seconds, for two fixed workloads, a dense product (``[2048, 256] x [256, 256]``, 20 times:
what a layer's GEMMs do) and a random row gather (``index_select`` of 200k of 400k 64-d rows, 5 times: what
sampling, loading and aggregation do), each in a fresh one-thread process: the time of one process alone, then
of one process per core started together (best of 3 each, after a warm-up). The ratio together / alone is the
co-run slowdown a multi-rank run meets at that moment (``contention`` in ``gsplit.estimate``); with cores of
its own a machine should keep it near 1 for the product (the gather shares memory bandwidth).

Why it exists: on the 2-core development VM the cost model's co-run slowdown came out 0.8-1.5x from one
measurement to the next, and a 2-rank epoch is bimodal (about 7.5 or 9.5 s for the same run). This shows
whether the host, not the code, is what changes.

    python experiments/host_corun.py                  # 20 samples 8 s apart (~5 min)
    python experiments/host_corun.py --quick          # 2 samples (~15 s)
"""

from __future__ import annotations

import statistics
import sys
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import multiprocessing as mp

import torch


def _gemm(repeats: int = 20) -> float:
    a, b = torch.randn(2048, 256), torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return time.perf_counter() - t


def _gather(repeats: int = 5) -> float:
    x, idx = torch.randn(400_000, 64), torch.randint(0, 400_000, (200_000,))
    t = time.perf_counter()
    for _ in range(repeats):
        x.index_select(0, idx)
    return time.perf_counter() - t


WORKLOADS = {"gemm": _gemm, "gather": _gather}


def _worker(kind: str, start, results) -> None:
    torch.set_num_threads(1)
    WORKLOADS[kind](3)  # warm-up: pages touched, code loaded
    start.wait()
    results.put(min(WORKLOADS[kind]() for _ in range(3)))


def timed_at_once(kind: str, copies: int) -> list:
    """Seconds of ``kind`` in each of ``copies`` fresh processes released together."""
    ctx = mp.get_context("fork")  # the parent computes nothing: no threads to inherit; spawn re-imports torch (~10 s)
    start, results = ctx.Barrier(copies), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, start, results)) for _ in range(copies)]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return got


def summarise(samples: list, kind: str) -> dict:
    """Median, range and share of slow co-runs of one workload's samples.

    Example:
        >>> s = [{"gemm": {"alone_s": 1.0, "ratio": r}} for r in (1.0, 1.1, 2.2)]
        >>> summarise(s, "gemm")["ratio_median"], summarise(s, "gemm")["share_above_1_5"]
        (1.1, 0.333)
    """
    ratios = [s[kind]["ratio"] for s in samples]
    alone = [s[kind]["alone_s"] for s in samples]
    return {"ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3), "share_above_1_5": round(sum(r > 1.5 for r in ratios) / len(ratios), 3),
            "alone_s_min": min(alone), "alone_s_max": max(alone)}


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--samples", quick=2, full=20, type=int, help="samples (default 20; quick 2)")
    p.add_sized("--interval", quick=0.0, full=8.0, type=float, help="seconds between samples (default 8; quick 0)")
    args = p.parse_args(argv)
    cores = report.cpu_cores()
    samples = []
    for k in range(args.samples):
        sample = {"t_s": round(time.time(), 1)}
        for kind in WORKLOADS:
            alone = timed_at_once(kind, 1)[0]
            together = timed_at_once(kind, cores)
            sample[kind] = {"alone_s": alone, "together_s": together,
                            "ratio": round(statistics.median(together) / alone, 4)}
        samples.append(sample)
        print(f"sample {k}: " + ", ".join(f"{kind} {sample[kind]['ratio']:.2f}x" for kind in WORKLOADS), flush=True)
        if k + 1 < args.samples:
            time.sleep(args.interval)
    rows = [[k, *(v for kind in WORKLOADS for v in (s[kind]["alone_s"] * 1e3,
                                                      statistics.median(s[kind]["together_s"]) * 1e3, s[kind]["ratio"]))]
            for k, s in enumerate(samples)]
    print(report.format_table(["sample", *(f"{kind} {c}" for kind in WORKLOADS
                                          for c in ("alone ms", "together ms", "together/alone"))], rows, floatfmt=".2f"))
    summary = {kind: summarise(samples, kind) for kind in WORKLOADS}
    for kind, s in summary.items():
        print(f"{kind}: together/alone median {s['ratio_median']:.2f} (range {s['ratio_min']:.2f}-{s['ratio_max']:.2f},"
              f" above 1.5 in {s['share_above_1_5']:.0%} of samples); alone {s['alone_s_min'] * 1e3:.0f}-"
              f"{s['alone_s_max'] * 1e3:.0f} ms")
    report.save_json(report.output_stem(args, "host_corun"),
                     {"settings": report.settings(args), "cores": cores, "samples": samples, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
