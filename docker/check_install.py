"""The checks the Docker image runs on its installed gsplit, at build time (``docker/Dockerfile`` calls this file).

It checks what a user of the image gets, not the source tree: run it from a folder outside the checkout
(the image runs it from ``/``). It fails (exit 1, one line per problem) unless

* the core dependencies and gsplit import, from an installed package (not a source checkout);
* every kernel source (``kernels/*.cu`` for CuPy, ``kernels/*.cpp`` for the C++ CPU kernels) arrived as
  package data of ``gsplit._kernels`` and is read through the real module, :mod:`gsplit.ops.cuda`;
* the ``gsplit`` command runs (``python -m gsplit --help``);
* CuPy imports (the image's ``gpu`` extra). The build has no GPU, so no kernel is launched here.

``GSPLIT_CHECK_WITHOUT=cupy`` leaves out the CuPy import: ``tests/docs/test_docker_checks.py`` runs this file,
exactly as the Dockerfile does, against a wheel installed on a machine without CuPy.
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import subprocess
import sys
from pathlib import Path

KERNEL_SOURCES = ("sample.cu", "relabel.cu", "gather.cu", "sample_cpu.cpp", "aggregate_cpu.cpp")
"""Every file of ``kernels/`` the library reads at run time."""


def main() -> int:
    skip = {name.strip() for name in os.environ.get("GSPLIT_CHECK_WITHOUT", "").split(",") if name.strip()}
    problems = []
    versions = {}
    for module in ("torch", "numpy", "scipy", "pymetis", "gsplit") + (() if "cupy" in skip else ("cupy",)):
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - any import failure is a broken image; report them all
            problems.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
    if "gsplit" in versions:
        import gsplit
        from gsplit.ops import cuda

        package = Path(gsplit.__file__).resolve().parent
        if (package.parent / "kernels").is_dir() and (package.parent / "pyproject.toml").is_file():
            problems.append(f"gsplit was imported from a source checkout ({package}), not an installed package; "
                            "run this check from outside the checkout")
        shipped = Path(str(importlib.resources.files("gsplit._kernels")))
        for name in KERNEL_SOURCES:
            try:
                path = cuda.kernel_source_path(name)
                text = cuda.kernel_source(name)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"kernel source {name}: {type(exc).__name__}: {exc}")
                continue
            if path.resolve().parent != shipped.resolve():
                problems.append(f"kernel source {name} was read from {path}, not from the package data {shipped}")
            elif not text.strip():
                problems.append(f"kernel source {name} is empty")
    cli = subprocess.run([sys.executable, "-m", "gsplit", "--help"], capture_output=True, text=True)
    if cli.returncode != 0 or "train" not in cli.stdout:
        problems.append(f"`python -m gsplit --help` exited {cli.returncode}: {cli.stderr.strip()[-300:]}")
    for line in problems:
        print(f"check_install: {line}", file=sys.stderr)
    print("check_install: " + ("FAILED" if problems else "ok") + " " +
          " ".join(f"{k}={v}" for k, v in versions.items()) + (f" (left out: {','.join(sorted(skip))})" if skip else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
