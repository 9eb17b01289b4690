"""CPU ranks keep freed large temporaries' pages for reuse (``gsplit.runtime.resources.keep_freed_heap``).

Counted, not timed: the minor page faults of allocating and filling a 40 MB buffer ten times. With glibc's
defaults every such buffer is a fresh ``mmap`` (40 MB is above the largest mmap threshold glibc picks by
itself), so each iteration faults its ~10,000 pages in again; with the heap kept, only the first few do.
"""

import os
import resource
import subprocess
import sys
import textwrap

import pytest
import torch

import gsplit
from gsplit.runtime import resources

ROWS = 40 * 1024 * 1024 // (256 * 4)  # a 40 MB float32 buffer of 256 columns
PAGES_PER_BUFFER = 40 * 1024 * 1024 // 4096

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux) only")


def faults_per_step(steps: int = 10) -> float:
    """Minor page faults of one allocate-fill-free of a 40 MB buffer, the median over ``steps`` after as many
    warm-up steps (a kept heap grows to its working set over the first few). The median, not the mean: under a
    loaded full suite a launched rank once faulted one whole buffer in again in ten steps (1024 per step on
    average; another thread's allocation can take the freed space once), which says nothing about reuse."""
    for _ in range(steps):
        torch.empty(ROWS, 256).fill_(1.0)
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(ROWS, 256).fill_(1.0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return float(sorted(faults)[steps // 2])


def _in_fresh_process(env_value: str) -> float:
    code = textwrap.dedent("""
        import torch
        from gsplit.runtime import resources
        from tests.run.test_keep_heap import faults_per_step
        torch.set_num_threads(1)
        resources.keep_freed_heap()
        print(faults_per_step())
    """)
    env = {**os.environ, "GSPLIT_KEEP_HEAP": env_value, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def test_kept_heap_reuses_pages_and_the_opt_out_restores_glibc_defaults():
    kept, default = _in_fresh_process("1"), _in_fresh_process("0")
    assert default > PAGES_PER_BUFFER / 2, f"glibc's defaults should fault a fresh 40 MB mapping in: {default}"
    assert kept < PAGES_PER_BUFFER / 20, f"a kept heap should reuse the freed buffer's pages: {kept} faults per step"


def _rank_faults(rank, world_size):
    torch.set_num_threads(1)
    return faults_per_step()


def test_launched_cpu_ranks_keep_the_heap():
    faults = gsplit.launch(_rank_faults, 2, devices="cpu", backend="gloo", timeout=300)
    assert all(f < PAGES_PER_BUFFER / 20 for f in faults), f"page faults per step in each rank: {faults}"


def test_opt_out_returns_false(monkeypatch):
    monkeypatch.setenv("GSPLIT_KEEP_HEAP", "0")
    assert resources.keep_freed_heap() is False
