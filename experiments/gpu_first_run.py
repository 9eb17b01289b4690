"""The first run on a GPU host, in one command and under 10 minutes: everything it must check, one report.

Run it through ``experiments/gpu_first_run.sh`` (which sets the environment). Parts, in order, each with
a time cap inside an overall budget (``--budget``, default 570 s):

1. ``environment``: GPUs and driver (``nvidia-smi``), torch / CUDA / CuPy versions, the CuPy probe (a
   kernel compiled and launched) and, when it fails, which CuPy to install.
2. ``gpu-tests``: ``GSPLIT_REQUIRE_GPU=1 python -m pytest -m gpu`` (a skipped GPU test is a failure).
3. ``sanitizer``: ``compute-sanitizer --tool memcheck`` on the kernel tests (``tests/ops/test_kernels.py -m gpu``).
4. ``suite``: the rest of the suite (``-m "not gpu"``; with part 2, the whole suite once). It runs in the
   background from the start, alongside every other part, so their timings share the host's cores with it.
5. ``cpu-kernel-timings``: ``experiments/bench_sampler.py`` and ``bench_layers.py`` at small sizes
   (the compiled C++ kernels against torch, on the host's CPU).
6. ``gpu-bench``: ``experiments/gpu_bench.py`` (its own report: the pinning probe, time to the first
   iteration, the CUDA kernels against torch, layers against PyG, split / split ``--uva`` / data parallel
   against their floors, full-graph against PyG) on a synthetic graph of ``--big-nodes`` vertices, in what
   is left of the budget; its JSON lands beside the report.

Without a GPU, the GPU parts are reported as skipped for lack of one (and the run is no GPU run);
``--require-gpu`` makes that a failure. ``--quick`` (for the test suite) runs a one-file stand-in of the
suite and skips the slow CPU parts. The report (Markdown, with every number also as one JSON block at
the end) goes to ``--report``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from harness import rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads

NO_GPU = "skipped: no CUDA GPU on this machine"
SKIPPED = "skipped: --skip"
PARTS = ("environment", "gpu-tests", "sanitizer", "suite", "cpu-kernel-timings", "gpu-bench")
"""The parts in report order (``--skip`` takes these names)."""


@dataclass
class Part:
    """One check of the first GPU run and what came of it."""

    name: str
    """Short name used in the report."""
    status: str = "not run"
    """``passed``, ``FAILED``, ``skipped: <why>`` or ``not run: <why>``."""
    seconds: float = 0.0
    """Wall time the part took."""
    command: str = ""
    """What ran (a shell command, or the Python function for in-process parts)."""
    numbers: Dict[str, object] = field(default_factory=dict)
    """Measured numbers (timings, counts, versions)."""
    output: str = ""
    """Tail of the part's output."""
    log: str = ""
    """The part's whole output, written beside the report as ``<report>.<part>.log`` (the first GPU run kept
    only tails and lost the names of two failing tests)."""


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(part: Part, argv: List[str], timeout: float, env: Optional[dict] = None) -> None:
    """Run ``argv`` for ``part`` with a timeout (its whole process group is stopped at the limit)."""
    part.command = " ".join(argv)
    done = rounds.run_command(argv, cwd=setup.REPO, env={**os.environ, **(env or {})}, timeout=max(1.0, timeout),
                              check=False, own_group=True)
    if done.returncode is None:
        part.status = f"FAILED (incomplete: stopped at its time cap, {timeout:.0f} s)"
    else:
        part.status = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
    part.seconds = done.seconds
    part.log = done.output
    part.output = _tail(part.log)


def _pytest_summary(part: Part) -> None:
    for line in reversed(part.output.splitlines()):
        if " passed" in line or " failed" in line or " error" in line or "no tests ran" in line:
            part.numbers["pytest"] = line.strip("= ")
            break


# ---------------------------------------------------------------------------------------- parts
def environment() -> Part:
    import torch

    import gsplit
    from gsplit.ops import cuda

    part = Part("environment", command="nvidia-smi; torch/CuPy versions; gsplit.ops.cuda.cupy_available()")
    t0 = time.monotonic()
    n = part.numbers
    n.update(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
             gsplit=gsplit.__version__, cuda_available=torch.cuda.is_available(),
             gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0, cpus=os.cpu_count(),
             driver_cuda=cuda.driver_cuda_version())
    if shutil.which("nvidia-smi"):
        smi = rounds.run_command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
                                  "--format=csv,noheader"], timeout=60, check=False)
        n["nvidia_smi"] = smi.output.strip().splitlines()
    try:
        import cupy

        n["cupy"] = cupy.__version__
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        n["cupy"] = f"not importable ({type(exc).__name__})"
    n["cupy_kernels_work"] = bool(torch.cuda.is_available() and cuda.cupy_available())
    if torch.cuda.is_available() and not n["cupy_kernels_work"]:
        n["cupy_hint"] = cuda.cupy_install_hint(torch.version.cuda, n["driver_cuda"], cuda.installed_cupy())
    part.status = "passed" if n["cupy_kernels_work"] or not torch.cuda.is_available() else \
        "FAILED (CUDA works but the CuPy kernels do not; see cupy_hint)"
    part.seconds = time.monotonic() - t0
    return part


# ---------------------------------------------------------------------------------------- driver
def write_report(path: Path, parts: List[Part], gpu: bool, started: float, args) -> None:
    lines = ["# gsplit first GPU run", ""]
    if not gpu:
        skipped = [p.name for p in parts if p.status == NO_GPU]
        lines += [f"**NOT A GPU RUN: this machine has no CUDA GPU.** Skipped for lack of a GPU: {', '.join(skipped)}.",
                  ""]
    lines += [f"Command: `{' '.join(sys.argv)}`  ", f"Host: {platform.node()}, {os.cpu_count()} CPUs; "
              f"total {time.monotonic() - started:.0f} s of a {args.budget:.0f} s budget", "",
              "| part | status | seconds |", "|---|---|---:|"]
    lines += [f"| {p.name} | {p.status} | {p.seconds:.1f} |" for p in parts]
    for p in parts:
        lines += ["", f"## {p.name}: {p.status}", "", f"`{p.command}`" if p.command else ""]
        if p.numbers:
            lines += ["", "```json", json.dumps(p.numbers, indent=1, default=str), "```"]
        if p.output:
            lines += ["", "```", p.output, "```"]
    lines += ["", "## All numbers", "", "```json",
              json.dumps({p.name: {k: v for k, v in asdict(p).items() if k != "log"} for p in parts}, indent=1,
                         default=str), "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    for p in parts:
        if p.log:
            path.with_name(f"{path.stem}.{p.name}.log").write_text(p.log)


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], out=False, seed=False,
                          quick_help="stand-in suite (one file), no slow CPU parts")
    p.add_argument("--report", default=str(setup.RESULTS / "gpu_first_run.md"))
    p.add_argument("--budget", type=float, default=570.0, help="seconds for everything (default 570)")
    p.add_argument("--big-nodes", type=int, default=2_000_000, help="vertices of gpu-bench's graph")
    p.add_argument("--require-gpu", action="store_true", help="a machine without a GPU is a failure")
    p.add_argument("--skip", default="", help="comma-separated parts not to run (e.g. cpu-kernel-timings,sanitizer)")
    p.add_argument("--suite-workers", type=int, default=0,
                   help="run the background suite with pytest-xdist on this many workers (0: serially)")
    p.add_argument("--cap", type=float, default=150.0, help="seconds at most for each of gpu-tests and sanitizer")
    args = p.parse_args(argv)
    started = time.monotonic()
    budget = rounds.Budget(args.budget)
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = skip - set(PARTS)
    if unknown:
        p.error(f"--skip names unknown parts {sorted(unknown)}; parts are {', '.join(PARTS)}")
    py = sys.executable
    parts: List[Part] = [environment()]
    gpu = bool(parts[0].numbers["cuda_available"])
    print(f"environment: {parts[0].status} {json.dumps(parts[0].numbers, default=str)}", flush=True)

    # the rest of the suite in the background from the start: the longest part, and it needs no GPU
    suite = Part("suite")
    suite_argv = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu"]
    if args.suite_workers:
        suite_argv += ["-n", str(args.suite_workers), "--dist", "loadfile"]
        suite.numbers["workers"] = args.suite_workers
    if args.quick:
        suite_argv += ["tests/datasets/test_graph.py"]
        suite.numbers["note"] = "--quick: tests/datasets/test_graph.py stands in for the suite"
    suite_log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    suite.command = " ".join(suite_argv)
    suite_t0 = time.monotonic()
    # each xdist worker keeps to its share of the threads: 16 workers of 16 threads would slow each other down
    threads = str(max(1, (os.cpu_count() or 2) // max(1, args.suite_workers or 1)))
    suite_env = {**os.environ, "OMP_NUM_THREADS": threads} if args.suite_workers else None
    suite_proc = None
    if "suite" in skip:
        suite.status = SKIPPED
    else:
        suite_proc = subprocess.Popen(suite_argv, cwd=setup.REPO, stdout=suite_log, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True, env=suite_env)

    gpu_tests = Part("gpu-tests")
    if "gpu-tests" in skip:
        gpu_tests.status = SKIPPED
    elif gpu:
        _run(gpu_tests, [py, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"],
             min(args.cap, budget.left()), env={"GSPLIT_REQUIRE_GPU": "1"})
        _pytest_summary(gpu_tests)
    else:
        gpu_tests.status, gpu_tests.command = NO_GPU, "GSPLIT_REQUIRE_GPU=1 python -m pytest -m gpu"
    parts.append(gpu_tests)

    sanitizer = Part("sanitizer", command="compute-sanitizer --tool memcheck python -m pytest tests/ops/test_kernels.py -m gpu")
    if "sanitizer" in skip:
        sanitizer.status = SKIPPED
    elif not gpu:
        sanitizer.status = NO_GPU
    elif not shutil.which("compute-sanitizer"):
        sanitizer.status = "skipped: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)"
    else:
        _run(sanitizer, ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3", py, "-m", "pytest",
                         "tests/ops/test_kernels.py", "-m", "gpu", "-x", "-q", "-p", "no:cacheprovider"],
             min(args.cap, budget.left()))
        _pytest_summary(sanitizer)
    parts.append(sanitizer)

    cpu_timings = Part("cpu-kernel-timings")
    if args.quick or "cpu-kernel-timings" in skip:
        cpu_timings.status = "skipped: --quick" if args.quick else SKIPPED
    else:
        with tempfile.TemporaryDirectory() as out:
            _run(cpu_timings, [py, "experiments/bench_sampler.py", "--quick", "--skip-partition", "--graphs", "uniform",
                               "--batches", "5", "--out", out], min(120, budget.left()))
            first = cpu_timings.output
            if cpu_timings.status == "passed":
                _run(cpu_timings, [py, "experiments/bench_layers.py", "--quick", "--widths", "64", "--out", out],
                     min(120, budget.left()))
                cpu_timings.output = first + "\n" + cpu_timings.output
    parts.append(cpu_timings)

    bench = Part("gpu-bench")
    bench_json = Path(args.report).with_suffix(".gpu_bench.json")
    if "gpu-bench" in skip:
        bench.status = SKIPPED
    elif gpu and budget.left() > 90:
        _run(bench, [py, "experiments/gpu_bench.py", "--nodes", str(args.big_nodes), "--budget",
                     str(max(60, budget.left() - 20)), "--out", str(bench_json)], budget.left() - 10)
        bench.numbers["json"] = str(bench_json)
    else:
        bench.status = NO_GPU if not gpu else f"not run: {budget.left():.0f} s of the budget left"
        bench.command = f"experiments/gpu_bench.py --nodes {args.big_nodes}"
    parts.append(bench)

    if suite_proc is not None:
        try:
            suite_proc.wait(timeout=max(1.0, budget.left()))
            suite.status = "passed" if suite_proc.returncode == 0 else f"FAILED (exit {suite_proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(suite_proc.pid, signal.SIGKILL)
            suite_proc.wait()
            suite.status = "FAILED (stopped at the end of the budget)"
        suite.seconds = time.monotonic() - suite_t0
        suite_log.seek(0)
        suite.log = suite_log.read()
        suite.output = _tail(suite.log)
        _pytest_summary(suite)
        suite.numbers["ran_alongside"] = "every other part (their timings share the host's cores with it)"
    suite_log.close()
    os.unlink(suite_log.name)
    parts.insert(3, suite)

    report = Path(args.report)
    write_report(report, parts, gpu, started, args)
    failed = [p.name for p in parts if p.status.startswith("FAILED")]
    for p in parts:
        print(f"{p.name:20s} {p.status} ({p.seconds:.0f} s)", flush=True)
    print(f"report: {report}" + ("" if gpu else " (NOT A GPU RUN: the GPU parts were skipped for lack of a GPU)"))
    if failed:
        return 1
    return 3 if (args.require_gpu and not gpu) else 0


if __name__ == "__main__":
    sys.exit(main())
