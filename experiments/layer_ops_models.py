"""What ``bench_layer_ops.py`` and its DGL peer share: the saved blocks' file format and the timing/profiling loop.

Imports neither gsplit nor DGL (the peer runs under ``.venv-dgl`` with torch 2.2, gsplit's side under
``.venv``): each side passes its own model and block type.

Blocks file (``.npz``): ``meta`` = [batches, layers, in_feats, num_classes]; for batch ``b`` and layer ``l``
(0 = input layer) ``b{b}_l{l}_src`` / ``_dst`` (int64 local edge ends, grouped by destination) and
``b{b}_l{l}_n`` = [num_src, num_dst]; ``b{b}_feat`` (float32 rows of layer 0's sources) and ``b{b}_label``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Sequence

import numpy as np
import torch
import torch.nn.functional as F


def read_blocks(path) -> dict:
    """The batches of a blocks file: ``{"meta": ..., "batches": [{"layers": [(src, dst, n_src, n_dst)], "feat", "label"}]}``."""
    z = np.load(path)
    batches_n, layers_n, in_feats, num_classes = (int(x) for x in z["meta"])
    batches = []
    for b in range(batches_n):
        layers = []
        for l in range(layers_n):
            n_src, n_dst = (int(x) for x in z[f"b{b}_l{l}_n"])
            layers.append((torch.from_numpy(z[f"b{b}_l{l}_src"]), torch.from_numpy(z[f"b{b}_l{l}_dst"]), n_src, n_dst))
        batches.append({"layers": layers, "feat": torch.from_numpy(z[f"b{b}_feat"]),
                        "label": torch.from_numpy(z[f"b{b}_label"])})
    return {"in_feats": in_feats, "num_classes": num_classes, "num_layers": layers_n, "batches": batches}


def time_and_profile(model: torch.nn.Module, batches: Sequence[dict], run_forward: Callable, repeats: int,
                     top: int = 30) -> dict:
    """Median forward / backward ms per iteration over ``repeats`` passes of ``batches`` (after one warm-up
    pass), then one pass under ``torch.profiler`` (``record_shapes``): ms per iteration of each op, self time.

    ``run_forward(model, batch)`` returns the logits of a batch's targets; the loss is cross-entropy.
    """
    model.train()

    def step(batch) -> tuple:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = F.cross_entropy(run_forward(model, batch), batch["label"])
        t1 = time.perf_counter()
        loss.backward()
        return t1 - t0, time.perf_counter() - t1

    for batch in batches:  # warm-up: first-use allocations, kernel loads
        step(batch)
    fwd: List[float] = []
    bwd: List[float] = []
    for _ in range(repeats):
        f = b = 0.0
        for batch in batches:
            tf, tb = step(batch)
            f, b = f + tf, b + tb
        fwd.append(1e3 * f / len(batches))
        bwd.append(1e3 * b / len(batches))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for batch in batches:
            step(batch)
    ops: Dict[str, dict] = {}
    for evt in prof.key_averages():
        ops[evt.key] = {"self_ms": evt.self_cpu_time_total / 1e3 / len(batches),
                        "total_ms": evt.cpu_time_total / 1e3 / len(batches), "calls": evt.count / len(batches)}
    shapes = []
    for evt in sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)[:top]:
        shapes.append({"op": evt.key, "shapes": str(evt.input_shapes)[:200],
                       "self_ms": evt.self_cpu_time_total / 1e3 / len(batches), "calls": evt.count / len(batches)})
    return {"forward_ms": statistics.median(fwd), "backward_ms": statistics.median(bwd),
            "forward_ms_runs": fwd, "backward_ms_runs": bwd, "ops": ops, "top_by_shape": shapes,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
