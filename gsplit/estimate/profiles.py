"""Device profiles: the per-unit costs of one rank's device, from the last one-device measurements.

``h100`` is derived from the one GPU run this project has had (experiments/results/gpu_h100/3_gpu_bench.json,
2026-11-26, one NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, CuPy 14.2.0): the layer
benchmark (one layer-0 block of 997,629 sources, 398,056 destinations, 5,872,211 edges, width 256: mean
aggregation forward 15.34 ms, SAGE forward + backward 40.65 ms, GAT with 4 heads 88.41 ms), the sampling
kernel and relabelling (one layer at 1,024 / 8,192 / 65,536 seeds), the UVA gather (41.5 GB/s, the link
table's ``host_bw``) and one rank training (``train_rank``, split at world size 1, synthetic 1M vertices,
64-d features, SAGE hidden 128, fanouts 15,10,5, batch 1,024: 5.84 ms sampling, 0.73 ms loading from the
cache, 17.30 ms training, 25.63 ms per iteration of wall time; that day's code drew the dropout masks on the
host, ~12 ms of it, which today's code does on the GPU: the step leaves it out). Each coefficient below says how it follows
from those numbers and what was assumed to separate them. When a GPU is lent again,
``python experiments/gpu_bench.py --parts shares`` times every rank's share of a mini-batch on the GPU
(:func:`gsplit.estimate.calibrate.time_shares`) and writes a fitted profile that ``gsplit estimate
--device-profile FILE`` reads.

``v100`` is ``h100`` scaled by published ratios (V100 SXM2 against H100 SXM 80GB): memory bandwidth
0.9 / 3.35 TB/s for edge-, row- and sampling terms, FP32 15.7 / 67 TFLOPS for multiply-adds (no measurement
on a V100 exists here); fixed per-call costs are kept (they are host-side: an equally fast host is assumed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

from gsplit.estimate.model import DeviceProfile, LayerCosts, ModelShape, layer_features

# ---- recorded measurements (experiments/results/gpu_h100/3_gpu_bench.json, parts "layers", "kernels", "cache")
_BLOCK = dict(src=997_629, dst=398_056, edges=5_872_211, width=256)
_COPY_U_MEAN_FWD_S = 15.337854500010906e-3
_SAGE_FWD_BWD_S = 40.64678200000316e-3
_GAT_FWD_BWD_S = 88.41416949999825e-3
_SAMPLE_KERNEL = [(15_094, 0.2994130000004702e-3), (120_862, 0.2111229999997022e-3), (966_463, 0.28234300000207213e-3)]
_RELABEL = [(15_094, 0.36294849999762846e-3), (966_463, 0.4682014999914941e-3)]
_W1_SAMPLE_S = 5.8372481999995784e-3      # cache part, 100 % row (the process already warm)
_W1_LOAD_S = 0.7280299000001378e-3
_W1_ITERATION_S = 25.63479390000083e-3
_W1_UVA_LOAD_CALL_S = 0.6131326000016202e-3  # 0 % row: the load call's host time (the gather runs on the stream)
# That run drew the dropout mask banks on the host (the version of that day, commit 0ed4f60); since commit b459ab1
# they are drawn on the GPU with no host work. Its iteration thus held two banks of 4096 x 128 cells (SAGE, hidden
# 128: one after each hidden layer) drawn on the host at 12 ms per 4096 x 256 bank (torch.rand on one thread,
# measured here, commit 3fd9378): ~12 ms that today's code does not spend. The step below leaves it out; the
# host's speed on the GPU machine is not known, so this correction is uncertain by a few ms.
_W1_HOST_BANKS_S = 2 * 12e-3 * 128 / 256
# the work of that world-1 run, counted with gsplit.estimate.count_work (mean of its first 10 iterations):
#   python -c "import gsplit; from gsplit.estimate import count_work; ds = gsplit.datasets.load('synthetic',
#   num_nodes=1_000_000, seed=0); count_work(ds.graph, ds.train_idx, gsplit.NeighborSampler([15, 10, 5]), 1024, 1,
#   None, iterations=10, systems=('dp',))"
_W1_EDGES = (552_550.7, 51_881.2, 4_875.2)
_W1_DST = (45_101.7, 5_770.1, 1_024)
_W1_SRC = (324_650.6, 45_101.7, 5_770.1)
_W1_SHAPE = ModelShape("sage", feat_dim=64, hidden=128, num_classes=8, num_layers=3)

# ---- published figures
_H100_FP32_MACS = 67e12 / 2          # H100 SXM FP32 67 TFLOPS (NVIDIA H100 datasheet); torch keeps TF32 off for matmul
_GEMM_EFFICIENCY = 0.7               # assumed share of that peak reached by torch's FP32 GEMMs at these shapes
_H100_HBM = 3.35e12                  # H100 SXM 80GB HBM3, bytes/s (datasheet)
_V100_HBM = 0.9e12                   # V100 SXM2, bytes/s (datasheet)
_V100_FP32_MACS = 15.7e12 / 2        # V100 SXM2 FP32 15.7 TFLOPS (datasheet)
_HOST_WAIT_S = 25e-6                 # assumed: one device-to-host read (~10 us) plus relaunching the queue behind it


def _h100() -> DeviceProfile:
    e, d, s, w = _BLOCK["edges"], _BLOCK["dst"], _BLOCK["src"], _BLOCK["width"]
    k_mac = 1.0 / (_GEMM_EFFICIENCY * _H100_FP32_MACS)
    # SAGE: the mean aggregation's forward is measured; its backward (a gather of the output gradient and a
    # scatter-add into the sources) is assumed to cost the same. GEMMs at k_mac (the backward features count
    # twice the forward's multiply-adds); what is left of the 40.65 ms is element-wise work, half each way.
    sage = layer_features("sage", (w, w, 1), e, d, s)
    k_edge_sage = _COPY_U_MEAN_FWD_S / sage[0]
    k_row = (_SAGE_FWD_BWD_S - 2 * _COPY_U_MEAN_FWD_S - 3 * k_mac * sage[1]) / (2 * sage[2])
    # GAT: the same GEMM and element-wise costs per unit; the rest is its per-edge work (scores, softmax,
    # weighted sum), split 1 : 2 between forward and backward (assumed: backward recomputes and scatters twice)
    gat = layer_features("gat", (w, w, 4), e, d, s)
    edge_total = (_GAT_FWD_BWD_S - 3 * k_mac * gat[1] - 2 * k_row * gat[2]) / gat[0]
    layers = {"sage": LayerCosts(forward=[k_edge_sage, k_mac, k_row, 0.0], backward=[k_edge_sage, k_mac, k_row, 0.0]),
              "gat": LayerCosts(forward=[edge_total / 3, k_mac, k_row, 0.0],
                                backward=[2 * edge_total / 3, k_mac, k_row, 0.0])}
    layers["gcn"] = layers["sage"]
    # sampling: the kernel reaches 3.4e9 edges/s at 65,536 seeds; relabelling adds its slope per edge; what the
    # world-1 run spent beyond that per layer (host waits for sizes, launches, Python) is the per-layer cost.
    # Split's exchange sorts and de-duplicates its ids: assumed twice the per-edge cost per id.
    per_edge = _SAMPLE_KERNEL[-1][1] / _SAMPLE_KERNEL[-1][0] + (_RELABEL[1][1] - _RELABEL[0][1]) / (_RELABEL[1][0] - _RELABEL[0][0])
    per_layer = (_W1_SAMPLE_S - per_edge * sum(_W1_EDGES)) / len(_W1_EDGES)
    profile = DeviceProfile(name="h100", sample=[per_edge, 0.0, 2 * per_edge, per_layer], load_call_s=_W1_UVA_LOAD_CALL_S,
                            layers=layers, step=[0.0, 0.0], host_wait_s=_HOST_WAIT_S, memory_bytes=80 * 2**30)
    # the step: the world-1 iteration's wall time less its sampling, loading and predicted layers (optimiser,
    # loss, launches of ~a thousand small kernels, the trainer's bookkeeping)
    dims = _W1_SHAPE.dims()
    layers_s = sum(sum(c * f for c, f in zip(coef, layer_features("sage", dims[i], _W1_EDGES[i], _W1_DST[i], _W1_SRC[i],
                                                                   backward, i > 0)))
                   for i in range(3) for backward, coef in ((False, layers["sage"].forward),
                                                            (True, layers["sage"].backward)))
    profile.step = [0.0, _W1_ITERATION_S - _W1_SAMPLE_S - _W1_LOAD_S - layers_s - _W1_HOST_BANKS_S]
    profile.source = ("experiments/results/gpu_h100/3_gpu_bench.json (2026-11-26, NVIDIA H100 80GB HBM3, torch "
                      "2.11.0+cu130): layer benchmark, sampling kernel, world-1 training run")
    profile.notes = {
        "layers": f"GEMMs at {_GEMM_EFFICIENCY:.0%} of the FP32 peak (assumed); SAGE aggregation backward = forward "
                  "(assumed); GAT's per-edge work split 1:2 forward:backward (assumed); no per-layer fixed cost (it is "
                  "in the step)",
        "sample": "per-layer cost from the world-1 run (5.84 ms for 3 layers, mostly fixed); ids at 2x per edge (assumed)",
        "step": "world-1 wall time 25.63 ms less sampling, loading, the predicted layers and ~12 ms of host-drawn "
                "dropout banks (gone since; uncertain by a few ms); GAT assumed to have SAGE's fixed cost",
        "host_wait_s": "25 us per added host wait (assumed)"}
    return profile


def _v100(h100: DeviceProfile) -> DeviceProfile:
    bw, mac = _H100_HBM / _V100_HBM, _H100_FP32_MACS / _V100_FP32_MACS

    def scaled(coef):
        return [coef[0] * bw, coef[1] * mac, coef[2] * bw, coef[3]]

    layers = {k: LayerCosts(forward=scaled(v.forward), backward=scaled(v.backward)) for k, v in h100.layers.items()}
    return DeviceProfile(name="v100", sample=[h100.sample[0] * bw, h100.sample[1] * bw, h100.sample[2] * bw, h100.sample[3]],
                         load_call_s=h100.load_call_s, layers=layers, step=list(h100.step), host_wait_s=h100.host_wait_s,
                         memory_bytes=32 * 2**30,
                         source="h100 scaled by V100/H100 datasheet ratios: memory bandwidth 0.9/3.35 TB/s, FP32 "
                                "15.7/67 TFLOPS; no V100 was measured",
                         notes={"fixed costs": "per-layer and per-step costs kept from the H100 run (host-bound; "
                                               "an equally fast host assumed)", **h100.notes})


def _builtin() -> Dict[str, DeviceProfile]:
    h100 = _h100()
    return {"h100": h100, "v100": _v100(h100)}


DEVICES = ("h100", "v100")
"""The built-in GPU profiles."""


def get_device(name: str) -> DeviceProfile:
    """A built-in profile (``h100``, ``v100``) or one written by calibration (a JSON file path).

    Example:
        >>> get_device("h100").name, get_device("v100").layers["sage"].forward[0] > get_device("h100").layers["sage"].forward[0]
        ('h100', True)
    """
    builtin = _builtin()
    if name in builtin:
        return builtin[name]
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"device profile {name!r} is neither a built-in one ({', '.join(DEVICES)}) nor a file; "
                         "pass h100, v100 or a profile JSON written by experiments/estimate_validation.py")
    data = json.loads(path.read_text())
    return DeviceProfile.from_dict(data.get("device", data))
