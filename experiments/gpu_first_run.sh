#!/usr/bin/env bash
# The first run of gsplit on a GPU host: one command, under 10 minutes on one GPU, one report file.
#
#   experiments/gpu_first_run.sh                      # report: experiments/results/gpu_first_run.md
#   experiments/gpu_first_run.sh --report /tmp/r.md   # elsewhere
#   experiments/gpu_first_run.sh --quick              # a fast dry run (what the test suite runs)
#
# It runs GSPLIT_REQUIRE_GPU=1 pytest -m gpu, the rest of the suite, compute-sanitizer on the kernel
# tests, the C++ kernels against torch, and experiments/gpu_bench.py (the GPU benchmark: pinning probe,
# first iteration, kernels, split / --uva / data parallel against their floors, full graph against PyG)
# at 2M vertices (see experiments/gpu_first_run.py for each part and its time cap). On a machine without
# a GPU it still runs, and the report says which parts were skipped for lack of one.
# Exit status: 0 all ran parts passed, 1 a part failed, 3 no GPU with --require-gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_WAIT_POLICY=PASSIVE   # spinning OpenMP waits slow down processes that share cores
exec "$PYTHON" experiments/gpu_first_run.py "$@"
