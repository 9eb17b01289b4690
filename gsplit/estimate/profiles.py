"""Device profiles: the per-unit costs of one rank's device, measured on one device.

``h100`` is measured. On 2026-11-27 ``python experiments/gpu_bench.py --parts ...,shares`` timed, on one NVIDIA
H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130, CuPy 14.2.0), every rank's share of real mini-batches of
the split plans for 1, 2, 4 and 8 ranks, each plan built in one process (:func:`gsplit.estimate.calibrate.time_shares`:
split sampling with the id exchange answered from the plan, the UVA gather of the input rows, each layer's
forward and backward, the shuffles' row copies; SAGE and GAT, hidden 256, fanouts 15,10,5, 1,024 targets per
rank, a 2M-vertex synthetic graph with 128-d features) and one rank of the trainer per model. The profile ships
as package data, ``gsplit/estimate/data/h100_2026-11-27.json``: :func:`gsplit.estimate.calibrate.fit_device`
on those stored timings (``experiments/results/gpu_h100/4_gpu_bench_profile.json``), as the run fitted them
except for one term: the cost per sampled layer, which the shares (all of three layers) cannot separate from
the per-row cost and the free fit put at 0, is held at what the same run timed for one layer's sampling and
relabelling kernels at 1,024 seeds (0.55 ms; 0.66 ms at 65,536: a fixed cost). Median errors against the
timings: sampling 15 %, loading 3.4 %, SAGE layers 15 %, GAT 6-11 %, the step 41 % (two points); a whole
share (sampling, loading, layers) 8 % (SAGE) and 6 % (GAT). Not measured: ``memory_bytes`` (80 GiB, the
card's), ``host_wait_s`` (0: the replayed split sampling already contains its host waits), GCN's layers
(SAGE's costs).

Before it, ``h100`` was derived by hand from the 2026-11-26 run (experiments/results/gpu_h100/3_gpu_bench.json:
one large layer's benchmark, the sampling kernel and one world-1 run, with an assumed GEMM efficiency and
forward/backward splits); against the 2026-11-27 shares it under-predicted the layers 2-5x at the median
(it had no per-call costs: it put that time in the step).

``v100`` is ``h100`` scaled by published ratios (V100 SXM2 against H100 SXM 80GB; no V100 was measured): the
layers' per-edge- and per-row-element costs by memory bandwidth, 0.9 / 3.35 TB/s, and their multiply-adds by
FP32 throughput, 15.7 / 67 TFLOPS. Everything else is kept, as the H100 run shows it host-bound (an equally fast
host is assumed): per-call layer costs, the step, loading's fixed cost, the shuffle copies (274 GB/s, 8 % of
the H100's memory bandwidth) and sampling (one layer of the sampling and relabelling kernels took 0.55 ms at
1,024 seeds and 0.66 ms at 65,536, 4_gpu_bench.json's part ``kernels``).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Dict

from gsplit.estimate.model import DeviceProfile, LayerCosts

H100_PROFILE = "h100_2026-11-27.json"
"""The measured H100 profile's file in the package data folder ``gsplit/estimate/data``."""

# published figures (datasheets), for scaling the measured H100 to a V100
_H100_HBM, _V100_HBM = 3.35e12, 0.9e12                # bytes/s: H100 SXM 80GB HBM3, V100 SXM2
_H100_FP32, _V100_FP32 = 67e12, 15.7e12               # FP32 FLOPS (torch keeps TF32 off for matmul)


def builtin_profile_path(name: str = H100_PROFILE) -> Path:
    """Where the package data file ``name`` is: ``gsplit/estimate/data`` of a source tree or an installed wheel.

    Example:
        >>> builtin_profile_path().name
        'h100_2026-11-27.json'
    """
    res = importlib.resources.files("gsplit.estimate").joinpath("data").joinpath(name)
    if not res.is_file():
        raise FileNotFoundError(f"the built-in device profile {name!r} is missing from gsplit/estimate/data "
                                f"({res}); reinstall gsplit (it ships as package data) or run from a full checkout")
    return Path(str(res))


def _h100() -> DeviceProfile:
    data = json.loads(builtin_profile_path().read_text())
    return DeviceProfile.from_dict(data["device"])


def _v100(h100: DeviceProfile) -> DeviceProfile:
    bw, fp32 = _H100_HBM / _V100_HBM, _H100_FP32 / _V100_FP32

    def scaled(coef):  # LAYER_FEATURES: edge-elements, multiply-adds, row-elements, calls, beyond the cache
        return [coef[0] * bw, coef[1] * fp32, coef[2] * bw, coef[3]] + [c * bw for c in coef[4:]]

    layers = {k: LayerCosts(forward=scaled(v.forward), backward=scaled(v.backward)) for k, v in h100.layers.items()}
    return DeviceProfile(
        name="v100", sample=list(h100.sample), load_call_s=h100.load_call_s, layers=layers, step=list(h100.step),
        host_wait_s=h100.host_wait_s, memory_bytes=32 * 2**30, copy_bw=h100.copy_bw,
        source=f"the measured h100 (gsplit/estimate/data/{H100_PROFILE}) scaled by V100/H100 datasheet ratios: "
               "memory bandwidth 0.9/3.35 TB/s, FP32 15.7/67 TFLOPS; no V100 was measured",
        notes={**h100.notes,
               "scaled": "the layers' per-edge- and per-row-element costs by memory bandwidth, their multiply-adds "
                         "by FP32 throughput; per-call costs, sampling, loading's fixed cost, the step and the "
                         "shuffle copies kept (host-bound on the H100; an equally fast host assumed)",
               "memory_bytes": "32 GiB: the V100 SXM2 32GB's"})


def _builtin() -> Dict[str, DeviceProfile]:
    h100 = _h100()
    return {"h100": h100, "v100": _v100(h100)}


DEVICES = ("h100", "v100")
"""The built-in GPU profiles."""


def get_device(name: str) -> DeviceProfile:
    """A built-in profile (``h100``, ``v100``) or one written by calibration (a JSON file path).

    Example:
        >>> get_device("h100").name, get_device("v100").layers["sage"].forward[1] > get_device("h100").layers["sage"].forward[1]
        ('h100', True)
    """
    builtin = _builtin()
    if name in builtin:
        return builtin[name]
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"device profile {name!r} is neither a built-in one ({', '.join(DEVICES)}) nor a file; "
                         "pass h100, v100 or a profile JSON written by experiments/estimate_validation.py or "
                         "experiments/gpu_bench.py --parts shares")
    return _profile_file(path)


def _profile_file(path: Path) -> DeviceProfile:
    """The profile in the JSON file ``path``; a ``ValueError`` naming the file when it is not one."""
    fix = "pass h100, v100 or a profile JSON written by experiments/estimate_validation.py or gpu_bench.py"
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"device profile {path} is not JSON ({e}); {fix}") from None
    if isinstance(data, dict) and isinstance(data.get("device"), dict):
        data = data["device"]
    if not isinstance(data, dict):
        raise ValueError(f"device profile {path} holds a {type(data).__name__}, not a profile (an object with "
                         f"name, sample, layers, ...); {fix}")
    try:
        return DeviceProfile.from_dict(data)
    except KeyError as e:
        raise ValueError(f"device profile {path} lacks the field {e.args[0]!r}; {fix}") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"device profile {path} is not a profile ({e}); {fix}") from None
