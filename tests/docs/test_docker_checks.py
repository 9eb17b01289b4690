"""What a GPU user installs: the Docker image's own checks on a built wheel, the GPU extras and the CuPy
probe's advice, and the build cache of the compiled CPU kernels (one folder per torch and Python)."""

import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SRC = "/tmp/gsplit-src"  # where the Dockerfile copies the sources


def _dockerfile_steps():
    """The Dockerfile's RUN commands (continuation lines joined) and its COPY instructions."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    runs, copies = [], []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("RUN "):
            runs.append(line[4:])
        elif line.startswith("COPY "):
            copies.append(line[5:].split())
    return runs, copies


def _check_commands():
    """The commands of the RUN step that follow the install, split at ``&&``: what the image checks."""
    runs, _ = _dockerfile_steps()
    step = next(r for r in runs if "pip install" in r)
    commands = [shlex.split(c) for c in step.split("&&")]
    after = next(i for i, c in enumerate(commands) if c[:2] == ["pip", "install"]) + 1
    return [c for c in commands[after:] if c[:2] != ["rm", "-rf"]]


def test_dockerfile_checks_the_install_with_the_real_module():
    commands = _check_commands()
    assert ["cd", "/"] in commands
    scripts = [c for c in commands if c and c[0] == "python"]
    assert scripts == [["python", f"{SRC}/docker/check_install.py"]]
    # the script the image runs is copied into the image, and the build context lets it in
    _, copies = _dockerfile_steps()
    assert ["docker/check_install.py", f"{SRC}/docker/check_install.py"] in copies
    assert "!docker/check_install.py" in (ROOT / "docker" / "Dockerfile.dockerignore").read_text().split()
    # nothing in the image or the kernels names the module that no longer exists
    for path in [DOCKERFILE, *sorted((ROOT / "kernels").glob("*.cu"))]:
        assert not re.search(r"gsplit[./]gpu\b|from gsplit import gpu", path.read_text()), path


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """gsplit built into a wheel from what the Dockerfile copies, then installed (no dependencies) in a folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    _, copies = _dockerfile_steps()
    for *sources, dest in copies:  # the same files the image gets, at the same places
        for s in sources:
            target = src / dest.replace(SRC, "").lstrip("/")
            if (ROOT / s).is_dir():
                shutil.copytree(ROOT / s, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target = target / s if dest.endswith("/") else target
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / s, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src / "")],
                   check=True, cwd=tmp, timeout=300)
    wheel = next((tmp / "dist").glob("gsplit-*.whl"))
    target = tmp / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=300)
    return wheel, target, src


def test_wheel_ships_every_kernel_source(installed_wheel):
    wheel, _, _ = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cpp")):
        assert f"gsplit/_kernels/{source}" in names, sorted(n for n in names if "_kernels" in n)
    # gsplit estimate and its measured device profile (package data that get_device("h100") reads)
    assert {"gsplit/estimate/profiles.py", "gsplit/estimate/data/h100_2026-11-27.json"} <= names, \
        sorted(n for n in names if "estimate" in n)


def test_the_images_own_checks_pass_on_the_installed_wheel(installed_wheel):
    """Runs exactly the Dockerfile's check commands (its `cd /` included), all but the CuPy import."""
    _, site, src = installed_wheel
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "GSPLIT_CHECK_WITHOUT": "cupy",
           "HOME": str(Path.home()), "GSPLIT_NO_EXTENSIONS": "1"}
    cwd = ROOT
    for command in _check_commands():
        if command[0] == "cd":
            cwd = Path(command[1])
            continue
        argv = [sys.executable if command[0] == "python" else command[0]] + \
            [a.replace(SRC, str(src)) for a in command[1:]]
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "check_install: ok" in done.stdout and "left out: cupy" in done.stdout, done.stdout


def test_the_check_fails_when_a_kernel_source_is_missing(installed_wheel, tmp_path):
    """The check is not a formality: the same install without gather.cu fails it, naming the file."""
    _, site, src = installed_wheel
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    (broken / "gsplit" / "_kernels" / "gather.cu").unlink()
    done = subprocess.run([sys.executable, str(src / "docker" / "check_install.py")], cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(broken), "GSPLIT_CHECK_WITHOUT": "cupy",
                               "HOME": str(Path.home())}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "gather.cu" in done.stderr, done.stdout + done.stderr


# ------------------------------------------------------------------ GPU extras and the CuPy probe's advice
def test_gpu_extras_offer_both_cuda_majors():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["gpu-cuda12"]] == ["cupy-cuda12x"]
    assert [r.split(">")[0] for r in extras["gpu-cuda13"]] == ["cupy-cuda13x"]
    assert extras["gpu"] == extras["gpu-cuda12"]  # documented: the one every driver from 525 on runs
    readme = (ROOT / "docker" / "README.md").read_text()
    for extra, driver in (("gpu-cuda12", "525"), ("gpu-cuda13", "580")):
        assert re.search(rf"`{extra}`.*\|\s*{driver} or newer", readme), extra


@pytest.mark.parametrize("torch_cuda, driver, extra, package", [
    ("12.4", 12040, "gpu-cuda12", "cupy-cuda12x"),
    ("13.0", 13000, "gpu-cuda13", "cupy-cuda13x"),
])
def test_probe_warning_says_which_cupy_to_install(monkeypatch, caplog, torch_cuda, driver, extra, package):
    """On a CUDA machine whose CuPy cannot run, the WARNING names the CuPy package for torch's CUDA (installable
    as it is: gsplit is on no package index, so `pip install "gsplit[extra]"` would fail) and the driver."""
    from gsplit.ops import cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    monkeypatch.setattr(cuda, "driver_cuda_version", lambda: driver)
    monkeypatch.setattr(cuda, "installed_cupy", lambda: ["cupy-cuda13x"] if extra == "gpu-cuda12" else [])
    cuda.cupy_available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="gsplit.ops.cuda"):
            assert cuda.cupy_available() is False
    finally:
        cuda.cupy_available.cache_clear()
    text = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"CUDA {torch_cuda}" in text and f'pip install "{package}>=13"' in text, text
    assert "gsplit[" not in text, text
    if extra == "gpu-cuda12":  # the wrong CuPy that is installed must go first
        assert "pip uninstall cupy-cuda13x" in text, text


def test_probe_warning_names_a_driver_too_old_for_torchs_cuda():
    from gsplit.ops import cuda

    hint = cuda.cupy_install_hint("13.0", 12080, [])
    assert "driver supports CUDA 12.8" in hint and "too old for CUDA 13" in hint and "580" in hint, hint


# ------------------------------------------------------------------ compiled CPU kernels: one build per torch
def test_extension_build_folder_depends_on_torch_and_python(monkeypatch, tmp_path):
    from gsplit.ops import cpu_ext

    monkeypatch.setenv("GSPLIT_EXTENSION_DIR", str(tmp_path))
    sources = ["sample_cpu.cpp"]
    monkeypatch.setattr(torch, "__version__", "2.2.1+cpu")
    old = cpu_ext.build_folder("gsplit_sample_cpu", sources)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    new = cpu_ext.build_folder("gsplit_sample_cpu", sources)
    assert old != new and old.name == new.name and old.name.startswith("gsplit_sample_cpu-")
    assert old.parent.parent == new.parent.parent == tmp_path  # one cache root, one folder per build key
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert cpu_ext.build_folder("gsplit_sample_cpu", sources) != new
    monkeypatch.setattr(sys.implementation, "cache_tag", "cpython-310")
    monkeypatch.setattr("sysconfig.get_config_var", lambda name: "cpython-310-x86_64-linux-gnu")
    assert "cpython-310" in str(cpu_ext.build_folder("gsplit_sample_cpu", sources))


# ------------------------------------------------------------------ the first-GPU-run script
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host run experiments/gpu_first_run.sh itself")
def test_first_gpu_run_script_reports_what_it_skipped_without_a_gpu(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(["bash", str(ROOT / "experiments" / "gpu_first_run.sh"), "--quick", "--require-gpu",
                           "--report", str(report)], env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                          "HOME": str(Path.home())},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr  # --require-gpu: no GPU is a failure
    text = report.read_text()
    assert "NOT A GPU RUN" in text
    for part in ("gpu-tests", "sanitizer", "gpu-bench"):
        assert f"| {part} | skipped: no CUDA GPU on this machine |" in text, part
    for part in ("environment", "suite"):  # what runs without a GPU, runs
        assert f"| {part} | passed |" in text, part
    assert "GSPLIT_REQUIRE_GPU=1 python -m pytest -m gpu" in text and "compute-sanitizer" in text


def test_first_gpu_run_script_keeps_whole_logs_and_checks_skip_names(tmp_path):
    report = tmp_path / "report.md"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(Path.home())}
    argv = ["bash", str(ROOT / "experiments" / "gpu_first_run.sh"), "--quick", "--report", str(report)]
    done = subprocess.run(argv + ["--skip", "sanitizer,gpu-bench"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    assert "| sanitizer | skipped: --skip |" in text and "| gpu-bench | skipped: --skip |" in text
    assert " passed" in (tmp_path / "report.suite.log").read_text()  # the whole output, not only its tail
    wrong = subprocess.run(argv + ["--skip", "sanitiser"], env=env, capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "unknown parts ['sanitiser']" in wrong.stderr


@pytest.mark.slow
def test_gpu_bench_full_graph_bf16_part_times_both_models_in_bfloat16(tmp_path):
    """The part the next GPU run adds (not in the default parts): gsplit and PyG full-graph under bf16."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_bench.py"), "--quick", "--device", "cpu",
                           "--parts", "system,full_graph_bf16", "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    part = json.loads(out.read_text())["parts"]["full_graph_bf16"]
    assert (part["precision"], part["feature_dtype"]) == ("bf16", "bfloat16")
    assert part["gsplit"]["status"] == "ok" and part["gsplit"]["ms_per_epoch"] > 0
    assert "full graph bf16 gsplit" in done.stdout


@pytest.mark.slow
def test_gpu_bench_quick_runs_every_part_on_the_cpu(tmp_path):
    """The five-minute GPU benchmark's code path at small sizes: the same parts, JSON and table (the GPU-only
    parts and rows say they were skipped)."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_bench.py"), "--quick", "--device", "cpu",
                           "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    parts = result["parts"]
    assert set(parts) == {"system", "gpu_start", "pin_probe", "first_iteration", "bandwidth", "kernels", "layers",
                          "train", "full_graph", "macrobatch"}
    assert "kernel" in parts["system"] and parts["gpu_start"]["status"] == "skipped: needs a GPU"
    probe = {r["kind"]: r for r in parts["pin_probe"]["rows"]}  # io_uring's long-term pin stands in for CUDA's
    assert set(probe) == {"anonymous", "private-file", "shared-file-read-only", "dev-shm"}
    if probe["private-file"].get("error") is None and "rss_delta_MiB" in probe["private-file"]:
        assert probe["private-file"]["rss_delta_MiB"]["RssAnon"] >= 15  # every page of 16 MiB copied
        assert abs(probe["anonymous"]["rss_delta_MiB"]["RssAnon"]) < 1
    assert parts["kernels"]["gather"]["store_same"] is True and parts["kernels"]["rates"]["sample_edges_per_s"] > 0
    rows = parts["train"]["rows"]
    assert [(r["system"], r["targets"], r["fanouts"]) for r in rows[:3]] == \
        [("split", 16, "15,10,5"), ("split_uva", 16, "15,10,5"), ("dp", 16, "15,10,5")]
    for row in rows:
        if row["system"] == "split_uva":
            assert row["status"] == "skipped: --uva needs a GPU"
            continue
        assert row["status"] == "ok", row
        floor = row["floor"]
        assert row["ms_per_iteration"] > 0 and floor["total_ms"] == pytest.approx(
            floor["sample_ms"] + floor["feature_ms"] + floor["layers_ms"])
        assert row["over_floor"] == pytest.approx(row["ms_per_iteration"] / floor["total_ms"])
    first = [r for r in parts["first_iteration"]["rows"] if r["status"] == "ok"]
    assert {(r["source"], r["system"]) for r in first} == {(s, y) for s in ("folder", "memory") for y in ("split", "dp")}
    assert parts["full_graph"]["gsplit"]["status"] == "ok"
    macro = {(r["system"], r["macrobatch"]): r for r in parts["macrobatch"]["rows"]}
    assert set(macro) == {(s, b) for s in ("split", "dp") for b in (1, 16)}
    assert all(r["ms_per_iteration"] > 0 and r["input_rows_per_iteration"] > 0 for r in macro.values())
    assert "ms/it" in done.stdout and "first iteration" in done.stdout  # the table

@pytest.mark.slow
def test_gpu_forked_ranks_runs_on_the_cpu(tmp_path):
    """The forked-GPU-ranks check of a GPU run, on CPU ranks: spawned and forked ranks give the same losses."""
    out = tmp_path / "forked.json"
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_forked_ranks.py"), "--device", "cpu",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"spawn", "forkserver"}
    assert all(r["same_losses_as_spawn"] and len(r["ranks"][0]["losses"]) == 2 for r in rows.values()), rows
