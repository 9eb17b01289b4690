"""Suite-wide switches.

``GSPLIT_REQUIRE_GPU=1`` (set it on a GPU machine) turns every ``gpu``-marked test that would skip for lack
of CUDA or of working CuPy kernels into a failure, so a GPU run cannot look green while testing nothing.

Each test gets the environment back as it found it: the command line sets variables for the ranks it starts
(``GSPLIT_SKIP_EXTENSIONS`` after a failed kernel build, ``OMP_WAIT_POLICY``), and a test that runs it in
this process must not switch the compiled kernels off for every test after it.

Ranks start from a fork server (``GSPLIT_START_METHOD=forkserver``, unless the environment says otherwise):
the suite launches some 250 rank processes, and each spawned one imports torch anew (2-4 s of CPU on this
2-core CI), which made up 40 % of the suite's time. The tests of the spawn path itself (the user's default)
ask for it by name.

The tests sit in one folder per package of gsplit (``tests/minibatch/`` for ``gsplit/minibatch/``, ...); the shared
helpers (``parity_helpers``, ``kernel_emulation``, the fakes) stay here. Some test modules reuse another's problem
or workers by name (``from test_split_parity import make_problem``): every test folder goes on ``sys.path``, as
pytest puts a test's own folder there, and ranks started from a test inherit it.
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GSPLIT_START_METHOD", "forkserver")

_TESTS = Path(__file__).resolve().parent
for _folder in sorted(p for p in _TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


@pytest.hookimpl(tryfirst=True)  # before the skipif markers are evaluated
def pytest_runtest_setup(item):
    if os.environ.get("GSPLIT_REQUIRE_GPU") and item.get_closest_marker("gpu") is not None:
        import torch

        from gsplit.ops import cuda

        if not (torch.cuda.is_available() and cuda.cupy_available()):
            pytest.fail(f"GSPLIT_REQUIRE_GPU is set but CUDA available={torch.cuda.is_available()}, "
                        f"CuPy kernels working={torch.cuda.is_available() and cuda.cupy_available()}; "
                        "a GPU run must not skip its GPU tests (see the WARNING from gsplit.ops.cuda)")


@pytest.fixture(autouse=True)
def _restore_environment():
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
