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
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import mmap
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from harness import memory, report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from harness.rounds import Budget, median_ms, run_command
import torch

sys.path.insert(0, str(setup.REPO))  # this checkout's gsplit on a host where it is not installed

import gsplit  # noqa: E402
from gsplit.data.feature_store import FeatureStore  # noqa: E402
from gsplit.ops import cuda, sample_cuda, torch_ops  # noqa: E402
from gsplit.ops import counter_rng  # noqa: E402

ROWS = ((1024, (15, 10, 5)), (4096, (15, 10, 5)), (1024, (30, 30, 30)))
"""(targets, fanouts) of the issue's rows."""
QUICK_ROWS = ((16, (15, 10, 5)), (64, (15, 10, 5)), (16, (30, 30, 30)))
SYSTEMS = (("split", "split", False), ("split_uva", "split", True), ("dp", "dp", False))
"""(row name, TrainConfig.system, uva)."""
HIDDEN = 256
PROBE_KINDS = ("anonymous", "private-file", "shared-file-read-only", "dev-shm")
VMSTAT_KEYS = ("nr_foll_pin_acquired", "nr_foll_pin_released", "pgmigrate_success", "pgmigrate_fail", "pgfault",
               "pgmajfault", "thp_fault_alloc", "thp_split_page", "compact_stall", "nr_dirty", "nr_writeback")


# ---------------------------------------------------------------------------------------- 1. the machine
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _fs_type(path: Path) -> str:
    """File system type of the mount holding ``path`` (``/proc/self/mounts``)."""
    best, kind = "", "unknown"
    path = str(path.resolve())
    for line in _read("/proc/self/mounts").splitlines():
        fields = line.split()
        if len(fields) > 2 and path.startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def system_facts(dev: torch.device, workdir: Path) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "device": str(dev), "gsplit": gsplit.__version__, "kernel": platform.release(), "cpus": os.cpu_count(),
            "hypervisor": "hypervisor" in _read("/proc/cpuinfo"),
            "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled").strip(),
            "workdir": str(workdir), "workdir_fs": _fs_type(workdir), "dev_shm_fs": _fs_type(Path("/dev/shm"))}
    meminfo = {line.split(":")[0]: line.split(":")[1].strip() for line in _read("/proc/meminfo").splitlines()
               if ":" in line}
    info["memory"] = {k: meminfo.get(k) for k in ("MemTotal", "MemAvailable", "Dirty")}
    zones, zone = {}, None
    for line in _read("/proc/zoneinfo").splitlines():
        if line.startswith("Node"):
            zone = " ".join(line.replace(",", "").split()[1:])  # "0 zone Movable"
        elif zone and line.strip().startswith("managed"):
            zones[zone] = int(line.split()[1]) * 4096 / 2**30
    info["zones_managed_GiB"] = zones
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
        if shutil.which("nvidia-smi"):
            out = run_command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=30,
                              check=False).output.strip()
            info["driver"] = out.splitlines()[0] if out else ""
        try:
            import cupy

            info["cupy"] = cupy.__version__
        except ImportError:
            info["cupy"] = None
        info["cupy_kernels"] = cuda.cupy_available()
    return info


# ---------------------------------------------------------------------------------------- 2. the pin probe
def _status() -> Dict[str, int]:
    """This process's resident memory by kind, in bytes (``/proc/self/status``)."""
    kinds = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
    return {k: kb * 1024 for k, kb in memory.proc_status_kb().items() if k in kinds}


def _vmstat() -> Dict[str, int]:
    values = dict(line.split() for line in _read("/proc/vmstat").splitlines() if len(line.split()) == 2)
    return {k: int(values[k]) for k in VMSTAT_KEYS if k in values}


def _dirty() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("Dirty:"):
            return int(line.split()[1]) * 1024
    return -1


def _probe_buffer(kind: str, size: int, folder: Path):
    """A fresh ``size``-byte mapping of ``kind``, every page touched; returns (mmap object, address, cleanup)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "anonymous":
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        np.frombuffer(m, dtype=np.uint8)[::4096] = 1  # fault every page in
        return m, np.frombuffer(m, dtype=np.uint8).ctypes.data, lambda: None
    path = Path("/dev/shm" if kind == "dev-shm" else folder) / f"gsplit_pin_probe_{kind}_{os.getpid()}"
    with open(path, "wb") as f:
        f.write(b"\1" * size)
    fd = os.open(path, os.O_RDWR if kind != "shared-file-read-only" else os.O_RDONLY)
    if kind == "private-file":
        m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)  # np.load "c"
    elif kind == "shared-file-read-only":
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    else:
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    view = np.frombuffer(m, dtype=np.uint8)
    int(view[::4096].sum())  # read-fault every page (the page cache holds it: the file was just written)
    return m, view.ctypes.data, lambda: path.unlink(missing_ok=True)


class _CudaPin:
    """``cudaHostRegister`` / ``cudaHostUnregister`` through CuPy (what gsplit's pinning calls)."""

    flavours = (("read-only", 1 | 2 | 8), ("writable", 1 | 2))

    def __init__(self):
        import cupy

        self.rt = cupy.cuda.runtime
        self.rt.free(self.rt.malloc(1))  # the CUDA context, outside the timed window

    def pin(self, ptr: int, size: int, flags: int) -> Optional[str]:
        try:
            self.rt.hostRegister(ptr, size, flags)
        except self.rt.CUDARuntimeError as exc:
            return str(exc)
        return None

    def unpin(self, ptr: int) -> None:
        self.rt.hostUnregister(ptr)


class _IoUringPin:
    """The CPU stand-in without a GPU: io_uring's buffer registration pins with ``FOLL_LONGTERM`` too (and
    ``FOLL_WRITE``), so it shows what the kernel does to a memory kind under a long-term pin."""

    flavours = (("writable (io_uring)", 0),)

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ring = None

    def pin(self, ptr: int, size: int, flags: int) -> Optional[str]:
        class Iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        self.ring = self.libc.syscall(425, 4, (ctypes.c_uint8 * 120)())  # io_uring_setup (x86-64)
        if self.ring < 0:
            return f"io_uring_setup failed (errno {ctypes.get_errno()})"
        iov = Iovec(ptr, size)
        if self.libc.syscall(427, self.ring, 0, ctypes.byref(iov), 1) < 0:  # IORING_REGISTER_BUFFERS
            error = f"io_uring buffer registration refused (errno {ctypes.get_errno()})"
            os.close(self.ring)
            return error
        return None

    def unpin(self, ptr: int) -> None:
        os.close(self.ring)


def probe_worker(kind: str, size: int, folder: str, backend: str) -> None:
    """One memory kind, in its own process: pin it long-term in each flavour, a fresh mapping each time."""
    pinner = _CudaPin() if backend == "cuda" else _IoUringPin()
    for name, flags in pinner.flavours:
        m, ptr, cleanup = _probe_buffer(kind, size, Path(folder))
        before, counters = _status(), _vmstat()
        print(json.dumps({"event": "start", "flags": name, "t": time.monotonic()}), flush=True)
        t0 = time.monotonic()
        error = pinner.pin(ptr, size, flags)
        seconds = time.monotonic() - t0
        after, counters_after = _status(), _vmstat()
        record = {"event": "done", "kind": kind, "flags": name, "t": time.monotonic(), "MiB": size >> 20,
                  "register_s": seconds, "error": error,
                  "rss_delta_MiB": {k: (after.get(k, 0) - before.get(k, 0)) / 2**20 for k in after},
                  "vmstat_delta": {k: counters_after.get(k, 0) - counters.get(k, 0) for k in counters}}
        if error is None:
            dirty = _dirty()
            t1 = time.monotonic()
            pinner.unpin(ptr)
            record["unregister_s"] = time.monotonic() - t1
            record["dirty_delta_MiB_after_unregister"] = (_dirty() - dirty) / 2**20
        print(json.dumps(record), flush=True)
        del m
        cleanup()


def _stack_sample(pid: int) -> List[str]:
    """The kernel stacks of ``pid``'s threads that are in the kernel (root can read ``/proc/PID/task/*/stack``)."""
    stacks = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = _read(str(task / "stack"))
        frames = [line.split()[-1].split("+")[0] for line in text.splitlines() if line.strip()]
        if frames and not any(f in ("do_epoll_wait", "futex_wait", "do_nanosleep", "do_select", "pipe_read")
                              for f in frames[:4]):
            stacks.append(" < ".join(frames[:8]))
        elif not text:
            wchan = _read(str(task / "wchan")).strip()
            if wchan and wchan != "0":
                stacks.append(f"wchan:{wchan}")
    return stacks


def pin_probe(size: int, folder: Path, timeout: float, budget: Budget, backend: str) -> dict:
    rows = []
    for kind in PROBE_KINDS:
        if budget.left() < timeout + 10:
            rows.append({"kind": kind, "status": f"not run: {budget.left():.0f} s of the budget left"})
            continue
        argv = [sys.executable, __file__, "--probe-worker", kind, "--probe-mib", str(size >> 20),
                "--workdir", str(folder), "--probe-backend", backend]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        samples: List[tuple] = []
        stop = threading.Event()

        def sample(pid=proc.pid):
            while not stop.wait(0.05):
                samples.append((time.monotonic(), _stack_sample(pid), _read(f"/proc/{pid}/stat").split(")")[-1][:3]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=timeout)
            status = "ran" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = f"STALLED: killed after {timeout:.0f} s"
        stop.set()
        sampler.join()
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        starts = [e for e in events if e["event"] == "start"]
        for start in starts:
            done = next((e for e in events if e["event"] == "done" and e["flags"] == start["flags"]), None)
            end = done["t"] if done else time.monotonic()
            window = [s for s in samples if start["t"] <= s[0] <= end]
            counts: Dict[str, int] = {}
            for _, stacks, _ in window:
                for stack in stacks:
                    counts[stack] = counts.get(stack, 0) + 1
            row = done or {"kind": kind, "flags": start["flags"], "register_s": f"> {end - start['t']:.1f} (stalled)"}
            row.update(status=status, samples=len(window),
                       states="".join(s[2].strip()[:1] for s in window)[:80],
                       top_stacks=sorted(counts.items(), key=lambda kv: -kv[1])[:4])
            rows.append(row)
        if not starts:
            rows.append({"kind": kind, "status": status, "output": out[-1500:]})
        rows[-1]["worker_s"] = time.monotonic() - t0
    return {"MiB": size >> 20, "folder": str(folder), "backend": backend, "rows": rows}


# ---------------------------------------------------------------------------------------- 2b. the GPU start
def gpu_start_worker(cache_dir: str) -> None:
    """One fresh process's GPU start, phase by phase, as one JSON line: what the first row of a process pays.

    ``CUPY_CACHE_DIR`` is set before CuPy loads, so an empty folder means cold NVRTC compiles and a used one
    means CuPy's on-disk cache (a later run on the same machine)."""
    os.environ["CUPY_CACHE_DIR"] = cache_dir
    phases: Dict[str, float] = {}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases[name] = now - t
        t = now

    dev = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)
    mark("cuda_context_s")
    import cupy  # noqa: F401 - its import time is a phase

    mark("import_cupy_s")
    ok = cuda.cupy_available()
    mark("cupy_probe_s")
    if ok:
        for name, secs in cuda.compile_kernels(dev).items():
            phases[f"compile_{name}_s"] = secs
        t = time.perf_counter()
    a = torch.randn(512, 512, device=dev)
    (a @ a).sum().item()
    mark("first_matmul_s")
    print(json.dumps({"phases": phases, "total_s": sum(phases.values())}), flush=True)


def gpu_start(dev: torch.device, workdir: Path) -> dict:
    """Run :func:`gpu_start_worker` twice in fresh processes: with an empty CuPy cache, then with the filled one."""
    if dev.type != "cuda":
        return {"status": "skipped: needs a GPU"}
    cache = workdir / "cupy_cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    out = {}
    for run in ("cold_cache", "warm_cache"):
        done = run_command([sys.executable, __file__, "--gpu-start-worker", cache], timeout=120, check=False)
        lines = [line for line in done.output.splitlines() if line.startswith("{")]
        out[run] = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "status": f"exit {done.returncode}", "output": done.output[-1500:]}
        out[run]["process_s"] = done.seconds  # with Python, torch and gsplit imports
    return out


# ---------------------------------------------------------------------------------------- 3. first iteration
def _measured_row(row: dict, uva: bool, dev: torch.device, budget: Budget, need_s: float,
                  measure: Callable[[], dict]) -> dict:
    """``row`` with what ``measure()`` returns and ``status`` "ok", or why it did not run or failed."""
    if uva and dev.type != "cuda":
        row["status"] = "skipped: --uva needs a GPU"
    elif budget.left() < need_s:
        row["status"] = f"not run: {budget.left():.0f} s of the budget left"
    else:
        try:
            row.update(measure())
            row["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one failed row must not hide the others
            row["status"] = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
            row["traceback"] = traceback.format_exc()[-4000:]
    return row


def _first_iteration(ds, dev: torch.device, system: str, uva: bool, fanouts, batch: int) -> dict:
    from gsplit.run.trainer import TrainConfig, train_rank

    cfg = TrainConfig(system=system, uva=uva, epochs=1, max_iters=3, eval_every=0, device=str(dev),
                      fanouts=list(fanouts), batch_size=batch, hidden=HIDDEN, log_iterations=True,
                      final_eval=False)
    t0 = time.monotonic()
    log = train_rank(0, 1, cfg, ds, None)
    wall = time.monotonic() - t0
    epoch = log["epochs"][0]
    first = epoch["ranks"][0]["per_iteration"][0]
    setup = wall - epoch["epoch_s"]
    return {"setup_s": setup, "first_iteration_s": setup + first["sample_s"] + first["load_s"] + first["train_s"],
            "wall_s": wall}


def first_iteration(ds, dev: torch.device, folder: Path, fanouts, batch: int, budget: Budget) -> dict:
    out = {"rows": []}
    t0 = time.monotonic()
    if not (folder / "meta.json").exists():
        gsplit.datasets.save_folder(ds, folder)
    out["write_folder_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    from_folder = gsplit.datasets.load(f"folder:{folder}")
    out["load_folder_s"] = time.monotonic() - t0
    for source, data in (("folder", from_folder), ("memory", ds)):
        for name, system, uva in SYSTEMS:
            row = _measured_row({"source": source, "system": name}, uva, dev, budget, 30,
                                lambda: _first_iteration(data, dev, system, uva, fanouts, batch))
            if row["status"] == "ok" and row["first_iteration_s"] > 10:
                row["status"] = "SLOW (> 10 s)"
            out["rows"].append(row)
    return out


# ---------------------------------------------------------------------------------------- 4-6. rates
def bandwidth(dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    n = (1 << 28) if dev.type == "cuda" and not quick else (1 << 22)
    x = torch.ones(n, device=dev)
    y = torch.empty_like(x)
    out = {"bytes": 4 * n}
    out["copy_ms"] = median_ms(lambda: y.copy_(x), repeats, sync)
    out["copy_GBps_read_plus_written"] = 2 * 4 * n / out["copy_ms"] / 1e6
    if dev.type == "cuda":
        h = torch.ones(n, pin_memory=True)
        out["h2d_pinned_ms"] = median_ms(lambda: y.copy_(h, non_blocking=True), repeats, sync)
        out["h2d_pinned_GBps"] = 4 * n / out["h2d_pinned_ms"] / 1e6
    return out


def kernels(ds, dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    """Sampling, relabelling and the feature gather on the benchmark graph; the rates the floors use."""
    gen = torch.Generator().manual_seed(0)
    nodes = ds.graph.num_nodes
    graph = ds.graph.to(dev)
    pinned = ds.graph.pin_memory() if dev.type == "cuda" else None
    uva = pinned is not None and sample_cuda.graph_readable(pinned, dev)
    key = counter_rng.stream_key(0, 0, 0, 0)
    on_gpu = dev.type == "cuda" and cuda.cupy_available()
    rows = []
    for count in ((256, 1024, 4096) if quick else (1024, 8192, 65536)):
        seeds = torch.randperm(nodes, generator=gen)[:count].to(dev)
        ref = torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key)
        row = {"seeds": count, "edges": int(ref[0].numel())}
        row["sample_torch_ms"] = median_ms(lambda: torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key),
                                           repeats, sync)
        row["sample_ms"] = median_ms(lambda: gsplit.ops.sample_neighbors(graph, seeds, 15, False, key), repeats, sync)
        dst = torch.unique(seeds)
        row["relabel_torch_ms"] = median_ms(lambda: torch_ops.relabel(dst, ref[0]), repeats, sync)
        if on_gpu:
            got = sample_cuda.sample_neighbors(graph, seeds, 15, False, key)
            row["sample_same"] = all(torch.equal(a, b) for a, b in zip(got, ref))
            a, b = cuda.relabel(dst, ref[0]), torch_ops.relabel(dst, ref[0])
            row["relabel_same"] = all(torch.equal(u, v) for u, v in zip(a, b))
            row["relabel_kernel_ms"] = median_ms(lambda: cuda.relabel(dst, ref[0]), repeats, sync)
            if uva:
                row["sample_uva_same"] = all(torch.equal(u, v) for u, v in
                                             zip(sample_cuda.sample_neighbors(pinned, seeds, 15, False, key), got))
                row["sample_uva_ms"] = median_ms(lambda: sample_cuda.sample_neighbors(pinned, seeds, 15, False, key),
                                                 repeats, sync)
        row["sampled_edges_per_s"] = row["edges"] / row["sample_ms"] * 1e3
        if "sample_uva_ms" in row:
            row["sampled_edges_per_s_uva"] = row["edges"] / row["sample_uva_ms"] * 1e3
        rows.append(row)
    feats = ds.features
    ids = torch.randint(0, nodes, (20_000 if quick else 200_000,), generator=gen)
    ids_dev = ids.to(dev)
    nbytes = ids.numel() * feats.shape[1] * feats.element_size()
    gather = {"rows": ids.numel(), "width": feats.shape[1]}
    t0 = time.monotonic()
    store = FeatureStore(feats, device=dev, cache_size=0)
    gather["store_setup_s"] = time.monotonic() - t0
    gather["store_mode"] = store.mode
    gather["store_same"] = torch.equal(store.gather(ids_dev).cpu(), feats[ids])
    gather["store_ms"] = median_ms(lambda: store.gather(ids_dev), repeats, sync)
    gather["host_gather_copy_ms"] = median_ms(lambda: feats[ids].to(dev), repeats, sync)
    resident = feats.to(dev)
    gather["resident_index_select_ms"] = median_ms(lambda: resident.index_select(0, ids_dev), repeats, sync)
    for k in ("store", "host_gather_copy", "resident_index_select"):
        gather[f"{k}_GBps"] = nbytes / gather[f"{k}_ms"] / 1e6
    best = rows[-1]  # the most seeds: the rate a large frontier reaches
    rates = {"sample_edges_per_s": best["sampled_edges_per_s"],
             "sample_edges_per_s_uva": best.get("sampled_edges_per_s_uva", best["sampled_edges_per_s"]),
             "gather_Bps": gather["store_GBps"] * 1e9}
    return {"nodes": nodes, "edges": ds.graph.num_edges, "cupy_kernels": on_gpu, "per_seed_count": rows,
            "gather": gather, "rates": rates}


def layers(ds, dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    from gsplit.nn.layers import GATConv, SAGEConv
    from gsplit.ops import aggregate as agg

    gen = torch.Generator().manual_seed(1)
    graph = ds.graph.to(dev)
    seeds = torch.randperm(graph.num_nodes, generator=gen)[:64 if quick else 8192].to(dev)
    block = gsplit.NeighborSampler([15, 10, 5], seed=0).sample_blocks(graph, seeds)[0]
    src, dst = block.edges()
    num_src, num_dst = block.num_src_nodes(), block.num_dst_nodes()
    width = HIDDEN
    h = torch.randn(num_src, width, device=dev, requires_grad=True)
    out = {"num_src": num_src, "num_dst": num_dst, "edges": int(src.numel()), "width": width}

    def fwd_bwd(fn):
        def run():
            h.grad = None
            fn().sum().backward()
        return median_ms(run, repeats, sync)

    mean_bytes = (src.numel() + num_dst) * width * 4
    out["copy_u_mean_fwd_ms"] = median_ms(lambda: agg.copy_u_mean(h.detach(), src, dst, num_dst), repeats, sync)
    out["copy_u_mean_GBps"] = mean_bytes / out["copy_u_mean_fwd_ms"] / 1e6
    torch.manual_seed(0)
    sage, gat = SAGEConv(width, width, "mean").to(dev), GATConv(width, width // 4, num_heads=4).to(dev)
    out["gsplit_sage_ms"] = fwd_bwd(lambda: sage(block, h))
    out["gsplit_gat_ms"] = fwd_bwd(lambda: gat(block, h))
    try:
        import torch_geometric.nn as pyg
    except ImportError as exc:
        out["pyg"] = f"not importable ({type(exc).__name__})"
        return out
    out["pyg"] = __import__("torch_geometric").__version__
    edge_index = torch.stack([src, dst])
    psage = pyg.SAGEConv((width, width), width, aggr="mean").to(dev)
    pgat = pyg.GATConv((width, width), width // 4, heads=4, add_self_loops=False).to(dev)
    size = (num_src, num_dst)
    out["pyg_sage_ms"] = fwd_bwd(lambda: psage((h, h[:num_dst]), edge_index, size=size))
    out["pyg_gat_ms"] = fwd_bwd(lambda: pgat((h, h[:num_dst]), edge_index, size=size))
    out["sage_gsplit_over_pyg"] = out["gsplit_sage_ms"] / out["pyg_sage_ms"]
    out["gat_gsplit_over_pyg"] = out["gsplit_gat_ms"] / out["pyg_gat_ms"]
    return out


# ---------------------------------------------------------------------------------------- 7. the issue's rows
def floor(stats: dict, rates: dict, uva: bool, feat_dim: int, num_classes: int) -> dict:
    """The iteration's floor in ms: sampled edges over the sampling kernel's measured rate, feature bytes over
    the measured gather bandwidth, and each layer's bytes over the device's copy bandwidth. A layer's bytes
    (SAGE, mean): its forward reads a source row per edge and writes a destination row (the aggregation),
    then reads two rows and writes one per destination (the dense part); backward moves about twice that."""
    rate = rates["sample_edges_per_s_uva" if uva else "sample_edges_per_s"]
    sample = sum(stats["edges"]) / rate
    feature = stats["input_rows"] * feat_dim * 4 / rates["gather_Bps"]
    layer_bytes = 0
    depth = len(stats["edges"])
    for i, (e, d) in enumerate(zip(stats["edges"], stats["dst_vertices"])):
        w_in = feat_dim if i == 0 else HIDDEN
        w_out = num_classes if i == depth - 1 else HIDDEN
        layer_bytes += 3 * 4 * ((e + d) * w_in + d * (2 * w_in + w_out))
    compute = layer_bytes / rates["device_Bps"]
    return {"sample_ms": 1e3 * sample, "feature_ms": 1e3 * feature, "layers_ms": 1e3 * compute,
            "total_ms": 1e3 * (sample + feature + compute)}


def _busy(prof, wall_s: float, on_gpu: bool) -> dict:
    """GPU-busy share (union of device intervals / wall) and the top kernels and host operations."""
    from torch.autograd import DeviceType

    out: dict = {"busy_share": None}
    averages = prof.key_averages()
    if on_gpu:
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)
        busy, cur_start, cur_end = 0.0, None, None
        for s, e in spans:
            if cur_end is None or s > cur_end:
                if cur_end is not None:
                    busy += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        if cur_end is not None:
            busy += cur_end - cur_start
        out["busy_share"] = busy / 1e6 / wall_s
        key = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
        top = sorted(averages, key=lambda a: -getattr(a, key))[:8]
        out["top_device"] = [(a.key[:80], a.count, getattr(a, key) / 1e3) for a in top if getattr(a, key) > 0]
    top_cpu = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:8]
    out["top_host"] = [(a.key[:80], a.count, a.self_cpu_time_total / 1e3) for a in top_cpu]
    return out


def train_row(ds, dev: torch.device, sync, system: str, uva: bool, batch: int, fanouts, warmup: int, iters: int,
              profile_iters: int, rates: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from gsplit.nn import build_model
    from gsplit.run.trainer import SYSTEMS as TRAIN_SYSTEMS
    from gsplit.run.trainer import TrainConfig, rank_graph

    cfg = TrainConfig(system=system, uva=uva, fanouts=list(fanouts), batch_size=batch, hidden=HIDDEN,
                      device=str(dev), eval_every=0)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.monotonic()
    impl = TRAIN_SYSTEMS[system]
    sampler = gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed)
    graph = rank_graph(ds.graph, dev, uva)
    loader = impl.make_loader(cfg, ds, graph, ds.train_idx, None, dev, sampler, True, cache_size=cfg.cache_size,
                              prefetch=cfg.prefetch, input_features=cfg.input_features)
    torch.manual_seed(0)
    model = build_model("sage", ds.features.shape[1], HIDDEN, ds.num_classes, num_layers=len(fanouts),
                        dropout=cfg.dropout).to(dev)
    model = impl.prepare_model(cfg, model, loader)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    setup_s = time.monotonic() - t0
    state = {"epoch": 0, "it": None, "stats": []}

    def batches():
        while True:
            loader.set_epoch(state["epoch"])
            for _, _, blocks in loader:
                yield blocks
            state["epoch"] += 1

    stream = batches()

    def step():
        blocks = next(stream)
        state["stats"].append(loader.last_stats)
        opt.zero_grad()
        logits = model(blocks, blocks[0].srcdata["feat"], loader.comm)
        impl.loss(logits, blocks[-1].dstdata["label"], blocks[-1], 1).backward()
        opt.step()

    step()
    sync()
    first_s = time.monotonic() - t0
    for _ in range(warmup):
        step()
    sync()
    state["stats"] = []
    t1 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    ms = 1e3 * (time.perf_counter() - t1) / iters
    stats = state["stats"]
    mean = {"edges": [statistics.mean(s.edges[i] for s in stats) for i in range(len(fanouts))],
            "dst_vertices": [statistics.mean(s.dst_vertices[i] for s in stats) for i in range(len(fanouts))],
            "input_rows": statistics.mean(s.input_rows for s in stats),
            "sample_ms": 1e3 * statistics.mean(s.sample_s for s in stats),
            "load_ms": 1e3 * statistics.mean(s.load_s for s in stats)}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t2 = time.perf_counter()
        for _ in range(profile_iters):
            step()
        sync()
        profiled_s = time.perf_counter() - t2
    row = {"setup_s": setup_s, "to_first_iteration_s": first_s, "ms_per_iteration": ms,
           "host_sample_ms": mean["sample_ms"], "host_load_ms": mean["load_ms"],
           "sampled_edges": sum(mean["edges"]), "input_rows": mean["input_rows"],
           "feature_store": getattr(getattr(loader, "feature_store", None), "mode", None),
           "floor": floor(mean, rates, uva, ds.features.shape[1], ds.num_classes),
           "profiled_ms_per_iteration": 1e3 * profiled_s / profile_iters}
    row["over_floor"] = ms / row["floor"]["total_ms"]
    busy = _busy(prof, profiled_s, dev.type == "cuda")
    row["gpu_busy_share"] = busy["busy_share"]
    if row["over_floor"] > 3:
        row["where_the_rest_goes"] = {k: v for k, v in busy.items() if k != "busy_share"}
    if dev.type == "cuda":
        row["peak_device_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def train(ds, dev: torch.device, sync, rows_spec, warmup: int, iters: int, profile_iters: int, rates: dict,
          budget: Budget) -> dict:
    rows = []
    for batch, fanouts in rows_spec:
        for name, system, uva in SYSTEMS:
            row = _measured_row({"system": name, "targets": batch, "fanouts": ",".join(map(str, fanouts))}, uva,
                                dev, budget, 20, lambda: train_row(ds, dev, sync, system, uva, batch, fanouts, warmup,
                                                                   iters, profile_iters, rates))
            rows.append(row)
            print(f"  {name:9s} {batch:5d} {row['fanouts']:9s} {row.get('ms_per_iteration', float('nan')):8.2f} ms "
                  f"(floor {row.get('floor', {}).get('total_ms', float('nan')):.2f}) {row['status']}", flush=True)
    return {"hidden": HIDDEN, "warmup": warmup, "iters": iters, "profile_iters": profile_iters, "rows": rows}


# ---------------------------------------------------------------------------------------- 8. full graph
def full_graph(nodes: int, dev: torch.device, sync, epochs: int) -> dict:
    ds = gsplit.datasets.load("synthetic", num_nodes=nodes, feature_dim=128, seed=1)
    out = {"nodes": nodes, "edges": ds.graph.num_edges, "hidden": HIDDEN, "layers": 3}
    for system in ("gsplit", "pyg"):
        try:
            out[system] = _timed_epochs(runs.full_graph_step(system, ds, dev, HIDDEN), epochs, sync, dev)
        except ImportError as exc:
            out[system] = {"status": f"not importable ({type(exc).__name__})"}
        except torch.cuda.OutOfMemoryError as exc:
            out[system] = {"status": f"out of memory: {str(exc)[:200]}"}
    if "ms_per_epoch" in out["pyg"]:
        import torch_geometric

        out["pyg"]["version"] = torch_geometric.__version__
    if "ms_per_epoch" in out["gsplit"] and "ms_per_epoch" in out["pyg"]:
        out["gsplit_over_pyg"] = out["gsplit"]["ms_per_epoch"] / out["pyg"]["ms_per_epoch"]
    return out


def _timed_epochs(step, epochs: int, sync, dev: torch.device) -> dict:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    out = {"ms_per_epoch": median_ms(step, epochs, sync), "status": "ok"}  # the first epoch (the warm-up) builds
    if dev.type == "cuda":
        out["peak_device_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return out


# ---------------------------------------------------------------------------------------- the table
def sample_call_floor_s(kernels_part: Optional[dict]) -> Optional[float]:
    """Seconds of one sampled layer's kernels (sampling and relabelling) at the smallest size the kernels part timed:
    on a GPU what a layer costs whatever its size (2026-11-27, H100: 0.55 ms at 1,024 seeds, 0.66 ms at 65,536),
    which the shares, all of three layers, cannot tell from their per-row cost. ``None`` without that part.

    Example:
        >>> sample_call_floor_s({"per_seed_count": [{"seeds": 8192, "sample_ms": 0.3, "relabel_kernel_ms": 0.4},
        ...                                         {"seeds": 1024, "sample_ms": 0.2, "relabel_kernel_ms": 0.3}]})
        0.0005
    """
    rows = [r for r in (kernels_part or {}).get("per_seed_count", ()) if "sample_ms" in r]
    if not rows:
        return None
    row = min(rows, key=lambda r: r["seeds"])
    relabel = row["relabel_kernel_ms"] if "relabel_kernel_ms" in row else row["relabel_torch_ms"]  # CuPy's, else torch's
    return (row["sample_ms"] + relabel) * 1e-3


def shares(ds, dev: torch.device, iters: int, budget: Budget, out: str, kernels_part: Optional[dict] = None) -> dict:
    """Issue 34: each rank's share of the 1/2/4/8-rank split plans timed on this device; a fitted device profile
    (its per-layer sampling cost held at the kernels part's :func:`sample_call_floor_s` when that part ran)."""
    from gsplit.estimate import ModelShape
    from gsplit.estimate.calibrate import fit_device, time_shares, time_steps
    from gsplit.run.trainer import TrainConfig

    sampler = gsplit.NeighborSampler([15, 10, 5], seed=0)
    owners = {1: None, **{w: gsplit.partition(ds.graph, w, method="edge").assignment for w in (2, 4, 8)}}
    records, steps, shapes = {}, {}, {}
    for model in ("sage", "gat"):
        if budget.left() < 40:
            break
        shapes[model] = ModelShape(model, ds.feature_dim, 256, ds.num_classes, 3)
        records[model] = time_shares(ds, shapes[model], sampler, 1024, owners, iterations=1, device=str(dev),
                                     repeats=5, input_features="shuffle")
        cfg = TrainConfig(model=model, system="split", hidden=256, epochs=1, max_iters=max(iters, 3), eval_every=0,
                          final_eval=False, device=str(dev), overlap=False)
        steps[model] = time_steps(ds, cfg)
    call_s = sample_call_floor_s(kernels_part)
    profile, load, quality = fit_device(f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}",
                                        records, shapes, steps, source=f"experiments/gpu_bench.py --parts shares on {dev}",
                                        sample_call_s=call_s)
    if dev.type == "cuda":  # for gsplit estimate's check that a rank's graph and batch fit the card
        profile.memory_bytes = torch.cuda.get_device_properties(dev).total_memory
    path = Path(out).with_name(Path(out).stem + "_profile.json")
    report.write_json(path, {"device": profile.to_dict(), "load": load, "fit_quality": quality, "steps": steps,
                             "shapes": {m: dataclasses.asdict(sh) for m, sh in shapes.items()},
                             "sample_call_s": call_s, "records": records})
    return {"profile_file": str(path), "load": load,
            "fit_median_error_pct": {k: round(v["median_pct"], 1) for k, v in quality.items()},
            "step_ms": {m: round(v["step_s"] * 1e3, 2) for m, v in steps.items()},
            "sample_ms_median": statistics.median(r["sample_s"] for rs in records.values() for r in rs) * 1e3}


def macrobatch(ds, dev: torch.device, sizes, iters: int, budget: Budget) -> dict:
    """Issue 33: UVA bytes and time per iteration with B mini-batches per macrobatch (split and dp, one rank)."""
    from gsplit.run.trainer import TrainConfig, train_rank

    rows = []
    for system in ("split", "dp"):
        for size in sizes:
            if budget.left() < 30:
                rows.append({"system": system, "macrobatch": size, "status": f"not run: {budget.left():.0f} s left"})
                continue
            cfg = TrainConfig(system=system, epochs=1, max_iters=iters, eval_every=0, device=str(dev), hidden=HIDDEN,
                              macrobatch=size, final_eval=False)
            epoch = train_rank(0, 1, cfg, ds, None)["epochs"][0]
            its = epoch["ranks"][0]["per_iteration"]
            n = max(1, len(its))
            rows.append({"system": system, "macrobatch": size, "iterations": len(its),
                         "ms_per_iteration": 1e3 * epoch["epoch_s"] / n,
                         "sample_ms": 1e3 * sum(it["sample_s"] for it in its) / n,
                         "load_ms": 1e3 * sum(it["load_s"] for it in its) / n,
                         "input_rows_per_iteration": sum(it["input_rows"] for it in its) / n,
                         "host_MB_per_iteration": sum(it["host_bytes"] for it in its) / n / 1e6})
    return {"rows": rows}


def print_table(result: dict) -> None:
    parts = result["parts"]
    lines = ["", "gsplit GPU benchmark: " + " | ".join(
        f"{k} {parts.get('system', {}).get(k)}" for k in ("device", "gpu", "driver", "kernel"))]
    rows = parts.get("train", {}).get("rows", [])
    if rows:
        lines.append(f"{'system':10s} {'targets':>7s} {'fanouts':>9s} {'ms/it':>8s} {'floor':>7s} {'x floor':>7s} "
                     f"{'sample':>7s} {'feature':>7s} {'layers':>7s} {'GPU busy':>8s} {'peak GiB':>8s} status")
        for r in rows:
            f = r.get("floor", {})

            def num(v, fmt="8.2f"):
                return format(v, fmt) if isinstance(v, (int, float)) else format("-", ">" + fmt.split(".")[0])
            lines.append(f"{r['system']:10s} {r['targets']:7d} {r['fanouts']:>9s} {num(r.get('ms_per_iteration'))} "
                         f"{num(f.get('total_ms'), '7.2f')} {num(r.get('over_floor'), '7.1f')} "
                         f"{num(f.get('sample_ms'), '7.2f')} {num(f.get('feature_ms'), '7.2f')} "
                         f"{num(f.get('layers_ms'), '7.2f')} {num(r.get('gpu_busy_share'), '8.0%')} "
                         f"{num(r.get('peak_device_GiB'), '8.2f')} {r['status']}")
    start = parts.get("gpu_start", {})
    for run in ("cold_cache", "warm_cache"):
        if "phases" in start.get(run, {}):
            phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in start[run]["phases"].items())
            lines.append(f"GPU start, {run.replace('_', ' ')}: {start[run]['total_s']:.2f} s ({phases}); "
                         f"process with imports {start[run]['process_s']:.1f} s")
    first = parts.get("first_iteration", {}).get("rows", [])
    if first:
        lines.append("")
        lines.append(f"{'first iteration':16s} {'system':10s} {'setup s':>8s} {'to 1st it s':>11s} status")
        for r in first:
            lines.append(f"{r['source']:16s} {r['system']:10s} {r.get('setup_s', float('nan')):8.2f} "
                         f"{r.get('first_iteration_s', float('nan')):11.2f} {r['status']}")
    full = parts.get("full_graph", {})
    if "gsplit" in full:
        lines.append("")
        for who in ("gsplit", "pyg"):
            r = full.get(who, {})
            lines.append(f"full graph {who:6s} {full['nodes']:,} vertices: {r.get('ms_per_epoch', float('nan')):.1f} "
                         f"ms/epoch, peak {r.get('peak_device_GiB', float('nan')):.2f} GiB ({r.get('status')})")
    macro = [r for r in parts.get("macrobatch", {}).get("rows", []) if "ms_per_iteration" in r]
    if macro:
        lines.append("")
        lines.append("macrobatch: system, B, ms/iteration, load ms/iteration, input rows/iteration, host MB/iteration")
        for r in macro:
            lines.append(f"  {r['system']:6s} {r['macrobatch']:3d} {r['ms_per_iteration']:8.2f} {r['load_ms']:8.2f} "
                         f"{r['input_rows_per_iteration']:12.0f} {r['host_MB_per_iteration']:9.2f}")
    probe = parts.get("pin_probe", {})
    if probe.get("rows"):
        lines.append("")
        how = "cudaHostRegister" if probe.get("backend") == "cuda" else "long-term pin by io_uring (no GPU)"
        lines.append(f"{how} of {probe['MiB']} MiB: kind, flags, seconds, anon/file RSS growth MiB, "
                     "pins taken, pages migrated, status, top kernel stack")
        for r in probe["rows"]:
            rss = r.get("rss_delta_MiB", {})
            vm = r.get("vmstat_delta", {})
            stack = r.get("top_stacks") or [["", 0]]
            lines.append(f"  {r.get('kind', ''):22s} {r.get('flags', ''):9s} {str(r.get('register_s', '')):>8.8s} "
                         f"{rss.get('RssAnon', 0):7.0f} {rss.get('RssFile', 0):7.0f} "
                         f"{vm.get('nr_foll_pin_acquired', 0):9d} {vm.get('pgmigrate_success', 0):7d} "
                         f"{r.get('error') or r.get('status', '')} {stack[0][0][:90]}")
    for name, part in parts.items():
        if isinstance(part, dict) and ("error" in part or str(part.get("status", "")).startswith("not run")):
            lines.append(f"{name}: {part.get('error') or part.get('status')}")
    print("\n".join(lines), flush=True)


# ---------------------------------------------------------------------------------------- driver
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
            if part in ("first_iteration", "kernels", "layers", "train", "shares", "macrobatch") and ds is None:
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
            elif part == "full_graph":
                got = full_graph(full_nodes, dev, sync, 2 if quick else 3)
            elif part == "shares":
                got = shares(ds, dev, iters, budget, args.out, result["parts"].get("kernels"))
            elif part == "macrobatch":
                got = macrobatch(ds, dev, [int(b) for b in args.macrobatches.split(",")], iters, budget)
            else:
                raise SystemExit(f"unknown part {part!r}; parts are system, gpu_start, pin_probe, first_iteration, bandwidth, "
                                 "kernels, layers, train, full_graph, macrobatch, shares")
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
