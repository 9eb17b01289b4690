"""The machine the GPU benchmark runs on (part ``system``), what the first row of a process pays before its own
work (``gpu_start``) and the pinning stall's mechanism (``pin_probe``). Both run workers in fresh processes
through ``experiments/gpu_bench.py``'s hidden ``--probe-worker`` / ``--gpu-start-worker`` options."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from harness import memory
from harness.rounds import Budget, run_command
import torch

import gsplit
from gsplit.ops import cuda

from gpu import PROBE_KINDS, VMSTAT_KEYS

DRIVER = Path(__file__).resolve().parents[1] / "gpu_bench.py"
"""The one command line; the probe\'s and the GPU start\'s workers are its hidden options."""



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
        argv = [sys.executable, str(DRIVER), "--probe-worker", kind, "--probe-mib", str(size >> 20),
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
        done = run_command([sys.executable, str(DRIVER), "--gpu-start-worker", cache], timeout=120, check=False)
        lines = [line for line in done.output.splitlines() if line.startswith("{")]
        out[run] = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "status": f"exit {done.returncode}", "output": done.output[-1500:]}
        out[run]["process_s"] = done.seconds  # with Python, torch and gsplit imports
    return out
