"""The GPU benchmark (issue 30) in one command: at most five minutes on a fresh one-GPU host, one JSON, one table.

    python experiments/gpu_bench.py --out experiments/results/gpu_bench.json     # on a GPU host (docs/guides/gpus.md)
    python experiments/gpu_bench.py --quick --out /tmp/gpu_bench.json           # anywhere: small sizes, same code path

Nothing to install on the project's GPU image (torch, CuPy and torch-geometric are there; pymetis is not needed:
world size 1 needs no partition map). The synthetic graph (``--nodes``, 15 in-edges per vertex, 128-d features:
2M vertices and 30M edges by default) is generated in memory once and also written as a dataset folder. Parts,
in order, each stopped when ``--budget`` runs out (what did not run says so in the JSON):

1. ``system``: kernel, memory zones, file systems, transparent huge pages; GPU, driver and versions.
2. ``gpu_start`` (GPU): what the first row of a process pays before its own work, phase by phase, in two fresh
   processes (an empty CuPy cache, then the filled one): the CUDA context, importing CuPy, CuPy's probe
   kernel, compiling each gsplit kernel file (``gsplit.ops.cuda.compile_kernels``), the first matmul. On the
   2026-11-27 H100 run the first row of ``first_iteration`` was about 7 s slower than the next one.
2a. ``pin_probe`` (GPU): the stall's mechanism measured directly. For 256 MiB of (i) anonymous memory, (ii) a
   private (copy-on-write) file mapping, as ``np.load(mmap_mode="c")`` makes, (iii) a shared read-only file
   mapping, (iv) ``/dev/shm`` memory, each in its own process with a time cap: ``cudaHostRegister`` read-only
   and writable, its seconds, the process's anonymous / file / shared resident memory before and after, the
   kernel's counters (``/proc/vmstat``: pins taken and released, pages migrated, faults), the dirty page
   cache after unregistering, and samples of the registering thread's kernel stack (``/proc/PID/task/*/stack``)
   every 50 ms, which name where the time goes. Without CUDA, io_uring's buffer registration (also a
   ``FOLL_LONGTERM`` pin, writable) stands in, so the part shows the kernel's side on any Linux host.
3. ``first_iteration``: ``train_rank`` for split, split ``--uva`` and data parallel, from the in-memory
   dataset and from the dataset folder: seconds of setup (loaders, pinning, graph to the GPU) and to the end
   of the first iteration (issue item 1: within 10 s). Setup steps log their own times (``-v``).
4. ``bandwidth``: device copy bandwidth (bytes read + written) and host-to-device from pinned memory.
5. ``kernels``: on the benchmark graph, for 1,024 / 8,192 / 65,536 seeds: one layer of sampling (fanout 15)
   by the CUDA kernel from a GPU graph and from the pinned host graph (UVA) against plain torch, relabelling;
   the feature gather of 200,000 rows through the store (pinned host memory) against a resident
   ``index_select`` and a host gather + copy. These rates are the floors' denominators.
6. ``layers``: layer 0 of a 3-layer mini-batch of 8,192 seeds, width 256: gsplit's SAGE / GAT layer against
   torch-geometric's, forward + backward.
7. ``train``: the issue's rows (item 3): SAGE, hidden 256, one GPU, world size 1, for (1,024 targets, fanouts
   15,10,5), (4,096, 15,10,5), (1,024, 30,30,30), each for split, split ``--uva`` and data parallel: ms per
   iteration (``--iters`` after ``--warmup``), its floor (sampled edges / the kernel's rate + feature bytes /
   the gather's bandwidth + each layer's bytes / device bandwidth, see ``floor``), the share of the iteration
   the GPU is busy (union of the kernel and copy intervals the profiler saw over ``--profile-iters``
   iterations), peak device memory, and, where a row is over 3x its floor, the profile's top kernels and
   host operations.
8. ``full_graph``: full-graph training (gsplit's full-graph system, one rank) against torch-geometric's
   full-batch GraphSAGE on a ``--full-nodes`` graph: ms per epoch and peak device memory (PyG materialises a
   message per edge; an out-of-memory is reported as such).

   ``train_bf16`` (not in the default ``--parts``: name it after ``train``): the same rows with bfloat16
   features (2-byte rows everywhere: host memory, gathers, the floor's feature term) and bfloat16 autocast.
   ``full_graph_bf16`` (not in the default ``--parts``: name it): part 8 with bfloat16 features and both models
   (gsplit's and PyG's) under bfloat16 autocast.

9. ``shares`` (issue 34, not in the default ``--parts``: name it): every rank's share of real mini-batches of the
   split plans for 1, 2, 4 and 8 ranks (``edge`` METIS maps), built in this one process and timed on the GPU --
   split sampling, the UVA gather, each layer's forward and backward, SAGE and GAT
   (``gsplit.estimate.calibrate.time_shares``) -- and one rank of the trainer per model; fits a device profile
   for ``gsplit estimate --device-profile`` (written beside ``--out`` as ``*_profile.json``), its cost per
   sampled layer held at what the ``kernels`` part timed for one small layer, when that part ran first.

10. ``macrobatch`` (issue 33): ``train_rank`` on one device, world size 1, no feature cache (every input row read
   from pinned host memory through UVA), split and data parallel with ``--macrobatches`` (default 1 and 16)
   mini-batches per macrobatch, ``--iters`` iterations: ms per iteration (the epoch's wall time over its
   iterations, the first macrobatch included), sample and load ms per iteration, input rows and host bytes read
   per iteration (the feature store's count).

``--quick`` runs every part at small sizes on whatever device there is (the CPU here: the GPU-only parts say
they were skipped), with the same JSON schema and table; ``tests/docs/test_docker_checks.py`` runs it.

This file is the command line and the driver; the parts live in ``experiments/gpu/`` (``host``: 1-2a, ``training``:
3, 7 and 10, ``rates``: 4-6, ``full_graph``: 8-9, ``table``: the printed table).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from pathlib import Path
from typing import Dict

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from harness.rounds import Budget
import torch

sys.path.insert(0, str(setup.REPO))  # this checkout's gsplit on a host where it is not installed

from gsplit.data.precision import cast_features  # noqa: E402
from gsplit.ops import cuda  # noqa: E402

from gpu import QUICK_ROWS, ROWS  # noqa: E402
from gpu.full_graph import full_graph, shares  # noqa: E402
from gpu.host import gpu_start, gpu_start_worker, pin_probe, probe_worker, system_facts  # noqa: E402
from gpu.rates import bandwidth, kernels, layers  # noqa: E402
from gpu.table import print_table  # noqa: E402
from gpu.training import first_iteration, macrobatch, train  # noqa: E402


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "gpu_bench.json", seed=False,
                          quick_help="small sizes (a CPU dry run; what the tests run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_sized("--nodes", quick=10_000, full=2_000_000, type=int,
                help="vertices of the benchmark graph (default 2,000,000; --quick 10,000)")
    p.add_sized("--full-nodes", quick=2_000, full=500_000, type=int,
                help="vertices of the full-graph comparison (default 500,000; --quick 2,000)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_sized("--iters", quick=2, full=40, type=int, help="timed iterations per row (default 40; --quick 2)")
    p.add_sized("--profile-iters", quick=1, full=10, type=int, help="profiled iterations per row (default 10)")
    p.add_sized("--repeats", quick=2, full=10, type=int, help="repeats of each kernel timing (default 10)")
    p.add_argument("--parts", default="system,gpu_start,pin_probe,first_iteration,bandwidth,kernels,layers,train,full_graph,"
                                      "macrobatch")
    p.add_argument("--macrobatches", default="1,16", help="mini-batches per macrobatch in the macrobatch part")
    p.add_argument("--budget", type=float, default=270.0, help="seconds for everything (default 270)")
    p.add_argument("--probe-mib", type=int, default=256)
    p.add_argument("--probe-timeout", type=float, default=30.0, help="seconds each probe process may take")
    p.add_argument("--workdir", default=str(setup.RESULTS / "scratch" / "gpu_bench"),
                   help="where the dataset folder and the probe's files go")
    p.add_argument("--probe-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gpu-start-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--probe-backend", default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe_worker:
        probe_worker(args.probe_worker, args.probe_mib << 20, args.workdir, args.probe_backend)
        return 0
    if args.gpu_start_worker:
        gpu_start_worker(args.gpu_start_worker)
        return 0
    quick, nodes, full_nodes, iters = args.quick, args.nodes, args.full_nodes, args.iters
    warmup = args.warmup if args.warmup is not None else (0 if quick else 10)
    profile_iters, repeats = args.profile_iters, args.repeats
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    budget = Budget(args.budget)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    parts = [s for s in args.parts.split(",") if s]
    result = {"quick": quick, "nodes": nodes, "parts": {}}
    stem = report.output_stem(args)

    def save():  # after every part: a run stopped early keeps what it measured
        report.save_json(stem, result, announce=False)

    ds = None
    rates: Dict[str, float] = {}
    for part in parts:
        if budget.left() < 10:
            result["parts"][part] = {"status": f"not run: {budget.left():.0f} s of the budget left"}
            continue
        t0 = time.monotonic()
        try:
            if part in ("first_iteration", "kernels", "layers", "train", "train_bf16", "shares", "macrobatch") \
                    and ds is None:
                ds = setup.load_named("synthetic", nodes, 0, feature_dim=128)
                result["generate_s"] = time.monotonic() - t0
                print(f"generated {nodes:,} vertices, {ds.graph.num_edges:,} edges in {result['generate_s']:.1f} s",
                      flush=True)
            if part == "system":
                got = system_facts(dev, workdir)
            elif part == "gpu_start":
                got = gpu_start(dev, workdir)
            elif part == "pin_probe":
                gpu = dev.type == "cuda" and cuda.cupy_available()
                got = pin_probe((args.probe_mib if gpu or not quick else 16) << 20, workdir / "probe",
                                args.probe_timeout, budget, "cuda" if gpu else "io_uring")
            elif part == "first_iteration":
                got = first_iteration(ds, dev, workdir / f"synthetic-{nodes}", ROWS[0][1],
                                      QUICK_ROWS[0][0] if quick else ROWS[0][0], budget)
            elif part == "bandwidth":
                got = bandwidth(dev, sync, repeats, quick)
                rates["device_Bps"] = got["copy_GBps_read_plus_written"] * 1e9
            elif part == "kernels":
                got = kernels(ds, dev, sync, repeats, quick)
                rates.update(got["rates"])
            elif part == "layers":
                got = layers(ds, dev, sync, repeats, quick)
            elif part == "train":
                missing = {"device_Bps", "sample_edges_per_s", "gather_Bps"} - set(rates)
                if missing:
                    raise RuntimeError(f"the train part needs the rates of the bandwidth and kernels parts "
                                       f"({sorted(missing)} missing): run them first")
                got = train(ds, dev, sync, QUICK_ROWS if quick else ROWS, warmup, iters, profile_iters, rates, budget)
            elif part == "train_bf16":  # the same rows, bfloat16 features and bfloat16 autocast
                missing = {"device_Bps", "sample_edges_per_s", "gather_Bps"} - set(rates)
                if missing:
                    raise RuntimeError(f"the train_bf16 part needs the rates of the bandwidth and kernels parts "
                                       f"({sorted(missing)} missing): run them first")
                half = dataclasses.replace(ds, features=cast_features(ds.features, "bfloat16"))
                got = train(half, dev, sync, QUICK_ROWS if quick else ROWS, warmup, iters, profile_iters, rates,
                            budget, precision="bf16")
                del half
            elif part in ("full_graph", "full_graph_bf16"):
                got = full_graph(full_nodes, dev, sync, 2 if quick else 3, "bf16" if part.endswith("bf16") else "fp32")
            elif part == "shares":
                got = shares(ds, dev, iters, budget, args.out, result["parts"].get("kernels"))
            elif part == "macrobatch":
                got = macrobatch(ds, dev, [int(b) for b in args.macrobatches.split(",")], iters, budget)
            else:
                raise SystemExit(f"unknown part {part!r}; parts are system, gpu_start, pin_probe, first_iteration, bandwidth, "
                                 "kernels, layers, train, train_bf16, full_graph, full_graph_bf16, macrobatch, shares")
        except Exception as exc:  # noqa: BLE001 - one failed part must not hide the others' numbers
            got = {"error": f"{type(exc).__name__}: {str(exc)[:500]}", "traceback": traceback.format_exc()[-4000:]}
        got["seconds"] = time.monotonic() - t0
        result["parts"][part] = got
        save()
        print(f"{part}: {got['seconds']:.1f} s" + (f"  FAILED {got['error']}" if "error" in got else ""), flush=True)
    result["total_s"] = args.budget - budget.left()
    save()
    print_table(result)
    print(f"wrote {report.rel(f'{stem}.json')}")
    return 1 if any("error" in v for v in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
