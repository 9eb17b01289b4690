"""``gsplit estimate``: predicted epoch time and memory per GPU of split and data parallelism on a GPU host.

The command's arguments (:func:`add_arguments`) and its run (:func:`main`); :func:`add_parser` registers it
with the dispatcher (:mod:`gsplit.cli`). The model itself is :mod:`gsplit.estimate`.
"""

from __future__ import annotations

import argparse
import math
import textwrap
import time
from pathlib import Path

from gsplit.cli.estimate_hosts import add_host_arguments, check_hosts, main_hosts
from gsplit.estimate.links import LINKS, default_device_for, get_link
from gsplit.estimate.model import ModelShape
from gsplit.estimate.profiles import DEVICES, get_device
from gsplit.estimate.setting import SHAPES, GraphShape, estimate_setting, shaped_graph

DESCRIPTION = "predict the epoch time and memory per GPU of split and data parallelism on a GPU host"

EPILOG = """\
What the numbers rest on: every rank's work (edges, rows, ids and rows exchanged per layer) is counted
exactly, in this process, from the mini-batches a run with the same seed samples on the graph (or on a
synthetic graph of the given shape, at up to --sample-nodes vertices). Seconds come from per-unit costs
measured on ONE GPU (an H100, 2026-11-27: every rank's share of 1-, 2-, 4- and 8-rank split plans timed on it
and fitted, gsplit/estimate/data/h100_2026-11-27.json; the V100 is that profile with its layers' per-unit
costs scaled by datasheet ratios) and from a table of published link figures (NVLink, PCIe, nccl-tests;
sources in gsplit/estimate/links.py); the model and all its assumptions are in gsplit/estimate/model.py.
No multi-GPU host has been measured: the GPU predictions are unvalidated. The same model, calibrated on CPU
ranks of one host over gloo, predicted measured iterations of 2 and 4 ranks {validation} (docs/guides/estimate.md).
Predicted: gsplit train --no-overlap, no feature cache, the steady state (the first iterations, which fault
the heap in, excluded).
"""

VALIDATION_SUMMARY = ("within 20 % in 16, 16 and 16 of 16 runs in the three latest passes (each the median of three "
                      "calibrate-and-measure rounds; every run measured on a grown heap, the cache a rank has "
                      "measured; the first is the timings of a pass that assumed sysfs's cache, refitted): "
                      "median |error| 11 %, 9 % and 7 %, largest 17 %, 20 % and 16 %, most runs under-predicted; the "
                      "split/dp choice right in every case more than 10 % apart (6 of 6, 6 of 6 and 6 of 6); in 10 to 16 "
                      "of 16 in 12 earlier passes on hosts whose speed drifts up to 2x within minutes, the choice "
                      "wrong in at most 1 case of 6: SAGE at 4 ranks on 1M vertices, measured 0.80 to 1.22 from pass "
                      "to pass")
"""How far off the CPU validation found the model: the latest passes are :data:`LATEST_PASSES`
(``experiments/results/estimate_validation_rounds_<name>.json``), the earlier ones :data:`EARLIER_PASSES`;
tests/estimate/test_estimate.py checks the text against those files."""

LATEST_PASSES = ("primedcache", "cache", "cache2")
"""The latest validation passes, oldest first (2026-11-28, a Xeon VM: each job measured on its second run in the
launch, the cache measured; ``primedcache`` is the ``primed`` pass's timings refitted with the measured cache)."""

EARLIER_PASSES = ("0902", "1010", "rounds", "rounds5", "gather", "rows", "quiet1128", "cold", "cold2", "warm", "warm2",
                  "primed")
"""The earlier validation passes (``experiments/results/estimate_validation_rounds_<name>.json``; ``rounds`` and
``rounds5`` are ``estimate_validation_rounds.json`` and ``estimate_validation_rounds5.json``), oldest first."""


MAX_GPUS = 8
"""The largest host the link table describes: an NVLink 4 (NVSwitch) host such as an HGX/DGX H100 holds 8 GPUs, a
DGX-1 (NVLink 2) 8, and the measured H100 shares cover 1 to 8 ranks."""

MAX_NODES = 10**12
"""The largest graph ``--nodes`` takes: its CSC alone would be some 100 TB, beyond any one host."""

MAX_STAND_IN_EDGES = 10**8
"""The largest synthetic stand-in (vertices x degree) whose work this command counts in minutes."""

MEASURED = {"batch_size": (1024, "the per-unit costs were fitted at 1,024 targets per GPU"),
            "hidden": (256, "the H100 profile was measured at hidden 256 (the CPU validation at 128)")}
"""Inputs the costs were measured at: a value more than 4x away from it is an extrapolation (said once, as a
warning line)."""


def _count(text: str) -> int:
    """An integer option that also takes ``1e6`` or ``1_000_000`` (a size is often written so)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count: {text!r}; pass a whole number such as 1000000 or 1e6")
    if not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"invalid count: {text!r}; pass a whole number such as 1000000 or 1e6")
    return int(value)


def _fanouts(text: str):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v == 0 or v < -1 for v in values):
        raise ValueError(f"--fanouts {text!r}: pass positive neighbour counts (or -1 for all), comma-separated, "
                         "e.g. 15,10,5")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``gsplit estimate``."""
    p.description = DESCRIPTION
    # one paragraph, filled to the terminal's usual width (the quoted validation is one long line)
    p.epilog = textwrap.fill(" ".join(EPILOG.format(validation=VALIDATION_SUMMARY).split()), 110)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--gpus", type=int, required=True, help=f"GPUs of the host (one rank each; 1 to {MAX_GPUS})")
    p.add_argument("--link", choices=sorted(LINKS), default="nvlink4",
                   help="how the GPUs are joined: nvlink4 (H100 SXM), nvlink2 (V100 SXM2), pcie4, pcie5")
    p.add_argument("--device-profile", default=None,
                   help=f"per-unit costs: {', '.join(DEVICES)} (default: the link's GPU, V100 for nvlink2, else "
                        "H100) or a profile JSON (experiments/estimate_validation.py, gpu_bench.py --parts shares)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--dataset", default=None,
                      help="a dataset gsplit loads (npz:PATH, folder:PATH, edgelist:PATH, synthetic): its real graph")
    what.add_argument("--shape", choices=sorted(SHAPES), default=None,
                      help="a published graph by its size: synthetic stand-in with its degree and training share")
    what.add_argument("--nodes", type=_count, default=None,
                      help="a graph given by its size: vertices (with --avg-degree, --feature-dim, --classes, "
                           "--train-fraction)")
    p.add_argument("--avg-degree", type=float, default=15.0, help="with --nodes: in-edges per vertex")
    p.add_argument("--feature-dim", type=int, default=128, help="with --nodes: feature width")
    p.add_argument("--classes", type=int, default=16, help="with --nodes: classes")
    p.add_argument("--train-fraction", type=float, default=0.1, help="with --nodes: share of training vertices")
    p.add_argument("--model", choices=("sage", "gat", "gcn"), default="sage")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per layer from the input up")
    p.add_argument("--batch-size", type=_count, default=1024, help="targets per GPU per iteration")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (GAT: all heads)")
    p.add_argument("--heads", type=int, default=4, help="GAT's heads")
    p.add_argument("--feature-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype the input features are stored and moved in (bfloat16/float16: 2 bytes per value)")
    p.add_argument("--partition", default=None, help="a partition folder (gsplit prepare --num-parts GPUS) for --dataset")
    p.add_argument("--iterations", type=int, default=2, help="mini-batches whose work is counted")
    p.add_argument("--sample-nodes", type=int, default=100_000,
                   help="largest synthetic stand-in for --shape / --nodes (work is counted on it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the estimate here")
    add_host_arguments(p)


def _check(args) -> None:
    """Refuse, before any work, what the estimate cannot answer (one line each: the option, its value, the fix)."""
    for name in ("gpus", "batch_size", "iterations", "sample_nodes", "hidden", "heads", "feature_dim", "classes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.gpus > MAX_GPUS:
        host = {"nvlink4": "an NVLink 4 (NVSwitch) host such as an HGX or DGX H100 holds 8 GPUs",
                "nvlink2": "an NVLink 2 host such as a DGX-1 holds 8 GPUs"}.get(
                    args.link, "the link table describes hosts of up to 8 GPUs")
        raise ValueError(f"--gpus {args.gpus} with --link {args.link}: {host}, and gsplit estimate models one host "
                         f"(the measured shares cover 1 to {MAX_GPUS} ranks); pass --gpus {MAX_GPUS} or fewer")
    if args.nodes is not None and args.nodes < 2:
        raise ValueError(f"--nodes must be at least 2, got {args.nodes}")
    if args.nodes is not None and args.nodes > MAX_NODES:
        raise ValueError(f"--nodes {args.nodes:.3g} is beyond any graph one host holds (its CSC alone would take "
                         f"{8 * args.nodes * (1 + args.avg_degree) / 1e12:.3g} TB); pass at most {MAX_NODES:.0e}")
    if not 0 < args.train_fraction <= 1:
        raise ValueError(f"--train-fraction must be in (0, 1], got {args.train_fraction}")
    if not (math.isfinite(args.avg_degree) and args.avg_degree > 0):
        raise ValueError(f"--avg-degree must be a positive finite number, got {args.avg_degree}")
    if args.dataset is None:
        nodes = args.nodes if args.nodes else 1_000_000
        if args.nodes is not None and args.avg_degree > nodes - 1:
            raise ValueError(f"--avg-degree {args.avg_degree:g} with --nodes {nodes}: a vertex has at most "
                             f"{nodes - 1} in-neighbours; pass a smaller degree")
        stand_in = min(nodes, args.sample_nodes) * args.avg_degree
        if args.shape is None and stand_in > MAX_STAND_IN_EDGES:
            raise ValueError(f"--avg-degree {args.avg_degree:g}: the synthetic stand-in of "
                             f"{min(nodes, args.sample_nodes):,} vertices would have {stand_in:.3g} edges (this "
                             f"command counts work on at most {MAX_STAND_IN_EDGES:.0e}); lower --sample-nodes or "
                             "--avg-degree")
    if args.partition and not args.dataset:
        raise ValueError("--partition needs --dataset: a map belongs to one graph (a synthetic stand-in has none)")
    if args.model == "gat" and args.hidden % args.heads:
        raise ValueError(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    if args.json:
        _check_json_path(args.json)


def _check_batch(args, train: int) -> None:
    """A global batch larger than the training set is one short iteration, not the batch asked for: refused."""
    if args.batch_size * args.gpus > train:
        raise ValueError(f"--batch-size {args.batch_size:,} x --gpus {args.gpus} is more than the graph's "
                         f"{train:,} training vertices: an epoch would be one short iteration, not batches of "
                         f"{args.batch_size:,}; pass --batch-size {max(1, train // args.gpus):,} or less")


def _check_json_path(path: str) -> None:
    """``--json``'s file can be written (checked before the estimate; nothing is left behind by the check)."""
    from gsplit.cli.common import check_output_folder
    from gsplit.cli.options import CliError

    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--json {p} is a folder; pass a file path, e.g. {p / 'estimate.json'}")
    try:
        check_output_folder(str(p.parent), f"--json {p}: its folder")
    except CliError as e:
        raise ValueError(str(e)) from None


def extrapolations(args) -> list:
    """The inputs outside what the costs were measured at: ``["--batch-size 100000 (the per-unit costs were
    fitted at 1,024 targets per GPU)", ...]``; empty where every input is inside.

    Example:
        >>> import argparse
        >>> extrapolations(argparse.Namespace(batch_size=1024, hidden=256, model="gcn"))
        ["--model gcn (GCN's layers are costed as SAGE's: no GCN layer was measured)"]
    """
    out = []
    for name, (measured, why) in MEASURED.items():
        value = getattr(args, name)
        if not measured / 4 <= value <= measured * 4:
            out.append(f"--{name.replace('_', '-')} {value:,} ({why})")
    if args.model == "gcn":
        out.append("--model gcn (GCN's layers are costed as SAGE's: no GCN layer was measured)")
    return out


def confidence_lines(device_name: str) -> list:
    """How far to trust the numbers, as a few short lines (the full account: the help's epilog, the guide).

    Example:
        >>> print(confidence_lines("h100")[-1])
          no multi-GPU host has been measured: the GPU seconds are unvalidated.
    """
    counts, total, medians = _latest_passes()
    return ["how far to trust this (docs/guides/estimate.md):",
            "  on CPU ranks (2 and 4, over gloo) the model came within 20 % of the measured iteration",
            f"  in {counts} of {total} runs of the latest passes (median error {medians}),",
            "  and chose split or dp right wherever they were more than 10 % apart in those passes;",
            f"  the GPU seconds rest on one {device_name} profile and published link figures:",
            "  no multi-GPU host has been measured: the GPU seconds are unvalidated."]


def _latest_passes():
    """``("16, 16 and 16", "16", "11 %, 9 % and 7 %")``: the latest passes as :data:`VALIDATION_SUMMARY` quotes
    them (tests/estimate/test_estimate.py checks that against the result files)."""
    import re

    counts = re.search(r"within 20 % in ([\d, and]+) of (\d+) runs", VALIDATION_SUMMARY)
    medians = re.search(r"median \|error\| ([\d %,and]+?), largest", VALIDATION_SUMMARY)
    return counts.group(1), counts.group(2), medians.group(1)


def _graph(args):
    """``(graph, train_idx, feat_dim, classes, full_train, graph_bytes, description)``."""
    if args.dataset:
        from gsplit import datasets

        ds = datasets.load(args.dataset)
        return (ds.graph, ds.train_idx, ds.feature_dim, ds.num_classes, None, None,
                f"{ds.name}: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges")
    shape = SHAPES[args.shape] if args.shape else GraphShape(
        "graph", args.nodes if args.nodes else 1_000_000,
        round((args.nodes or 1_000_000) * args.avg_degree), args.feature_dim, args.classes,
        max(1, round((args.nodes or 1_000_000) * args.train_fraction)))
    graph, train = shaped_graph(shape, args.sample_nodes, args.seed, min_train=args.iterations * args.gpus * args.batch_size)
    scaled = graph.num_nodes < shape.num_nodes
    desc = (f"{shape.name}: {shape.num_nodes:,} vertices, {shape.num_edges:,} edges, {shape.train:,} training; work "
            f"counted on a synthetic stand-in of {graph.num_nodes:,} vertices" + (
                " (smaller: neighbourhoods overlap more than on the full graph, which favours split)" if scaled else ""))
    return (graph, train, shape.feat_dim, shape.num_classes, shape.train, 8 * (shape.num_nodes + 1 + shape.num_edges),
            desc)


def _gib(b: int) -> str:
    return f"{b / 2**30:.2f}"


def main(args) -> int:
    """Run ``gsplit estimate``: print both systems' predicted epoch time and memory per GPU, and which to choose."""
    t0 = time.perf_counter()
    fanouts = _fanouts(args.fanouts)
    _check(args)
    check_hosts(args, args.layers or len(fanouts))
    if args.hosts:  # full-graph training across hosts: no mini-batches, the graph at its full size
        graph, _, feat_dim, classes, _, _, desc = _graph(args)
        full = None if args.dataset else (SHAPES[args.shape].num_nodes if args.shape else args.nodes or 1_000_000)
        if full and graph.num_nodes < full:  # the stand-in's counts are scaled up (gsplit/estimate/hosts.py)
            desc = desc.split(" (smaller")[0] + f" (its counts scaled by {full / graph.num_nodes:.3g})"
        return main_hosts(args, graph, feat_dim, classes, full, desc, args.layers or len(fanouts))
    device = get_device(args.device_profile or default_device_for(args.link))
    link = get_link(args.link)
    if args.dataset is None:
        shape = SHAPES[args.shape] if args.shape else None
        _check_batch(args, shape.train if shape else max(1, round((args.nodes or 1_000_000) * args.train_fraction)))
    graph, train, feat_dim, classes, full_train, gbytes, desc = _graph(args)
    if args.dataset:
        _check_batch(args, int(train.numel()))
    shape = ModelShape(args.model, feat_dim, args.hidden, classes, len(fanouts), args.heads,
                       feature_bytes=2 if args.feature_dtype != "float32" else 4)
    owner = None
    if args.partition:
        from gsplit.partitioning.partition_map import PartitionMap

        pmap = PartitionMap.load(args.partition)
        if pmap.num_parts != args.gpus:
            raise ValueError(f"--partition {args.partition} has {pmap.num_parts} parts but --gpus is {args.gpus}; "
                             f"use a map made with gsplit prepare --num-parts {args.gpus}")
        pmap.check_graph(graph)
        owner = pmap.assignment
    print(desc, flush=True)
    est = estimate_setting(graph, train, shape, fanouts, args.batch_size, args.gpus, device, link, owner=owner,
                           iterations=args.iterations, seed=args.seed, full_train=full_train, graph_bytes=gbytes)
    print(f"{args.gpus} x {device.name} over {link.name}, {args.model.upper()} hidden {args.hidden}, fanouts "
          f"{args.fanouts}, {args.batch_size} targets per GPU: {est.iterations_per_epoch:,} iterations per epoch")
    header = f"{'system':>7} {'ms/iteration':>13} {'epoch s':>9} {'GiB/GPU':>8} {'(graph)':>8}  largest terms"
    print(header)
    for system in ("split", "dp"):
        pred, mem = est.predictions[system], est.memory[system]
        terms = ", ".join(f"{k} {v:.0%}" for k, v in pred.dominant(3))
        print(f"{system:>7} {pred.iteration_s * 1e3:>13.2f} {est.epoch_s(system):>9.2f} {_gib(mem.total):>8} "
              f"{_gib(mem.graph):>8}  {terms}")
    choice = est.choice()
    ratio = est.epoch_s("dp") / est.epoch_s("split")
    print(f"choose: {choice} (dp / split = {ratio:.2f}; 'either' within 5 %)")
    if not device.memory_bytes:
        print(f"note: the profile {device.name} gives no device memory (memory_bytes): whether a rank fits its "
              "device is not checked")
    else:
        for system in ("split", "dp"):
            if est.memory[system].total > device.memory_bytes:
                print(f"note: {system} needs {_gib(est.memory[system].total)} GiB per GPU, more than the "
                      f"{_gib(device.memory_bytes)} GiB of a {device.name}; --uva keeps the graph in host memory")
    outside = extrapolations(args)
    if outside:
        print(f"warning: this estimate extrapolates beyond what was measured: {'; '.join(outside)}")
    print("\n".join(confidence_lines(device.name)))
    if args.json:
        from gsplit.runtime.io import atomic_write_json

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.json, {"description": desc, "extrapolates": outside, **est.to_dict()}, default=float)
    print(f"({time.perf_counter() - t0:.1f}s)")
    return 0


def add_parser(sub) -> None:
    """``gsplit estimate``'s options."""
    p = sub.add_parser("estimate", help=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=main)
