"""The README's CPU install, the way a user types it: a fresh virtual environment, torch pinned first, then the
README's gsplit line(s) run from a copy of the clone, then ``import gsplit`` and the ``gsplit`` command.

gsplit is on no package index, so a line like ``pip install "gsplit[pyg]"`` fails for every user
(``No matching distribution found for gsplit``); this test runs the lines that are there instead. It installs
torch itself, pinned (``torch==2.13.0``, what ``./dev`` installs): never an open range, which would pull a
multi-gigabyte CUDA build.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"


def readme_cpu_install() -> list:
    """The ``pip install`` lines of the README's block marked ``<!-- install: cpu ...-->``."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- install: cpu.*?-->\n```bash\n(.*?)```", text, flags=re.S)
    assert m, "README.md lost its <!-- install: cpu --> block"
    return [line.split(" #")[0].strip() for line in m.group(1).splitlines() if line.startswith("pip install")]


def test_readme_cpu_install_block_pins_torch_first():
    lines = readme_cpu_install()
    assert lines and TORCH in lines[0].split(), f"the README must install {TORCH} first: {lines}"
    gsplit_lines = lines[1:]
    assert gsplit_lines and all("torch" not in line for line in gsplit_lines), lines


def copy_of_the_clone(dest: Path) -> Path:
    """What a clone holds: the tracked and the not-ignored files of this checkout (its working state)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def run(cmd, cwd, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


@pytest.mark.slow
def test_readme_cpu_install_works_in_a_fresh_venv(tmp_path):
    clone = copy_of_the_clone(tmp_path / "clone")      # not "gsplit": python -c from tmp_path would import it
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "--quiet", TORCH], tmp_path)
    for line in readme_cpu_install()[1:]:                    # the README's gsplit line(s), as typed in the clone
        run([*pip, *shlex.split(line)[1:]], clone)
    out = run([str(venv / "bin" / "python"), "-c",
               "import gsplit, torch; print(gsplit.__file__); print(torch.__version__)"], tmp_path)
    where, torch_version = out.split()
    assert Path(where).is_relative_to(clone), f"gsplit imported from {where}, not from the clone {clone}"
    assert torch_version.startswith("2.13.0"), f"installing gsplit replaced the pinned torch: {torch_version}"
    assert "gsplit" in run([str(venv / "bin" / "gsplit"), "--version"], tmp_path)
