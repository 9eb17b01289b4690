"""Issue 34: validate the cost model of ``gsplit.estimate`` where ranks really run -- CPU ranks over gloo.

Three parts, runnable separately (``--parts``; each writes its JSON, the next reads it):

1. ``calibrate`` (``refit``: only the fits again, from its stored timings) (one process, one torch thread, as a rank of 2 or 4 on this 2-core host has): partition
   maps (gsplit method, expected weights) for every world size; every rank's share of real mini-batches for
   world sizes 1, 2 and 4 replayed in this process (``gsplit.estimate.calibrate.time_shares``: split sampling
   with the exchange answered from the plan, the input gather, each layer forward and backward); one rank of
   the real trainer per model (what a step costs beyond its layers, and the loader's gather), and the same
   one-rank run in as many independent processes as the host has cores, at once, against it in one fresh
   process just before (how much slower a rank computes while every core is busy: ``contention``); gloo
   all-to-all and all-reduce micro-benchmarks at 2 and 4 ranks (each call alone, after memory work, as training
   issues them); the last-level cache a rank effectively has (``effective_cache_bytes``: random row gathers, not
   sysfs's socket-wide size). Fits the CPU device profile (``cores`` = this host's cores: ranks beyond them share cores) and
   the ``cpu-gloo`` link. Nothing here runs the multi-rank training it predicts.
2. ``measure``: the real multi-rank runs (``gsplit.run.trainer.train_rank`` on ``gsplit.launch``'s CPU ranks),
   2 and 4 ranks x SAGE/GAT x the graphs x split/dp, ``--iters`` iterations each (``--no-overlap``; CPU
   defaults otherwise: direct input rows), per iteration the slowest rank's sample + load + train, the first
   ``--warmup`` left out (the heap is still being faulted in there); with ``--prime`` (default) every job runs twice
   in its launch and the second run is measured (a fresh rank's heap still grows past the warm-up).
3. ``report``: the work of exactly those iterations counted in one process (``gsplit.estimate.count_work``),
   predicted with the calibrated profile, against the measured medians (the warm-up excluded in both);
   the split/dp ratios; the table and the JSON.

Both phases also time a fixed workload (``gsplit.estimate.calibrate.host_speed_reference``, ~50 ms in a fresh
one-thread process): the calibration at its start, after each graph and at its end, the measurement just
before and after each launch; the report's "host speed" is the runs' time of it over the calibration's, and
"error host-corrected" the prediction scaled by that ratio (never fitted, never part of a prediction: it tells
the host's drift apart from the model's error).

``--rounds R`` runs calibrate-then-measure R times in turn and compares the medians over the rounds (and,
beside them, each round's calibration against its own runs). This host's speed drifts 1.5-2x over minutes
(other guests on the same machine), and one calibration pass and one measured pass, taken twenty minutes
apart, can land on different sides of a drift: that, not the model, was most of the error of single passes.

    python experiments/estimate_validation.py                       # everything (~8 min on 2 quiet cores)
    python experiments/estimate_validation.py --rounds 3 --calibration estimate_calibration_rounds \
        --measured estimate_measured_rounds                         # a recorded pass (~25-35 min)
    python experiments/estimate_validation.py --rounds 5 --calibration estimate_calibration_rounds5 \
        --measured estimate_measured_rounds5                        # the latest recorded pass (~50 min)
    python experiments/estimate_validation.py --parts calibrate      # then --parts measure, then --parts report
    python experiments/estimate_validation.py --quick                # 20k vertices, 2 ranks, SAGE (~3 min)

Writes ``OUT/estimate_calibration[_quick].json`` (raw timings, fits, and ``device``/``link`` profiles that
``gsplit estimate --device-profile`` reads), ``OUT/estimate_measured[_quick].json`` and
``OUT/estimate_validation[_quick].json`` (the table).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from harness import report, rounds, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.estimate import ModelShape, count_work, predict
from gsplit.estimate.calibrate import (corun_effects, corun_steps, effective_cache_bytes, fit_device, fit_link,
                                       host_speed_reference, last_level_cache_bytes, time_shares, time_steps,
                                       transport_profile)
from gsplit.estimate.links import LinkProfile
from gsplit.estimate.model import DeviceProfile
from gsplit.run.trainer import TrainConfig

FANOUTS = [15, 10, 5]
BATCH = 1024
HIDDEN = 128
TRANSPORT_SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def parse_args(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--parts", default="calibrate,measure,report")
    p.add_sized("--nodes", quick=[20_000], full=[100_000, 1_000_000], type=setup.int_list,
                help="graph sizes, comma-separated (default 100000,1000000; quick 20000)")
    p.add_sized("--worlds", quick=[2], full=[2, 4], type=setup.int_list, help="rank counts (default 2,4; quick 2)")
    p.add_sized("--models", quick=["sage"], full=["sage", "gat"], type=lambda text: [m for m in text.split(",") if m],
                help="default sage,gat; quick sage")
    p.add_sized("--iters", quick=4, full=12, type=int,
                help="iterations per measured run, warm-up included (default 12; quick 4)")
    p.add_sized("--warmup", quick=1, full=4, type=int,
                help="iterations left out at the start of every measured and one-rank calibration run (default 4; "
                     "quick 1): a fresh rank faults its heap in over the first few, ~40k pages an iteration for GAT "
                     "on 1M vertices, which doubled their backward; the model predicts the steady state")
    p.add_sized("--shares-iters", quick=1, full=2, type=int,
                help="mini-batches per world size in calibration (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="timings per share (median)")
    p.add_argument("--prime", action=argparse.BooleanOptionalAction, default=True,
                   help="run every measured job twice in its launch and measure the later run (default; "
                        "--no-prime: once): a 12-iteration run on fresh ranks still grows its heap after the "
                        "warm-up, at ~10 us a page here, while an epoch runs on a grown heap")
    p.add_argument("--rounds", type=int, default=1,
                   help="calibrate-then-measure rounds (default 1); the JSONs hold the medians over the rounds, each "
                        "round's own files are *_round<k>.json beside them. The recorded validation uses 3: this "
                        "host's speed drifts 1.5-2x over minutes")
    p.add_argument("--calibration", default="estimate_calibration",
                   help="name of the calibration's JSON in --out (default estimate_calibration)")
    p.add_argument("--measured", default="estimate_measured",
                   help="name of the measured runs' JSON in --out (a second measure pass under another name shows "
                        "the runs' own spread; report reads this one)")
    args = p.parse_args(argv)
    args.parts = args.parts.split(",")
    if not 0 <= args.warmup < args.iters:
        raise SystemExit(f"--warmup {args.warmup} --iters {args.iters}: leave at least one measured iteration "
                         "after the warm-up")
    return args


def say(message: str) -> None:
    print(message, flush=True)


def shape_of(ds, model: str) -> ModelShape:
    return ModelShape(model, ds.feature_dim, HIDDEN, ds.num_classes, len(FANOUTS))


def owner_map(ds, nodes: int, world: int, seed: int) -> torch.Tensor:
    """The gsplit map for ``world`` ranks, made once and kept in results/scratch (calibration and runs share it)."""
    path = setup.scratch(setup.RESULTS) / f"estimate_map_{nodes}_{world}_{seed}.pt"
    if path.exists():
        return torch.load(path)
    pmap, info, _ = setup.make_map(ds, world, "gsplit", FANOUTS, BATCH, seed)
    say(f"  map for {world} ranks: {info['presample_s'] + info['partition_s']:.1f}s")
    torch.save(pmap.assignment, path)
    return pmap.assignment


def run_config(model: str, system: str, iters: int, seed: int) -> TrainConfig:
    return TrainConfig(model=model, system=system, fanouts=FANOUTS, batch_size=BATCH, hidden=HIDDEN, epochs=1,
                       max_iters=iters, eval_every=0, final_eval=False, overlap=False, seed=seed, log_iterations=True)


# ------------------------------------------------------------------------------------------- calibrate
def calibrate(args) -> dict:
    """The raw timings of one calibration pass (:func:`fit` turns them into profiles)."""
    torch.set_num_threads(1)  # a rank's share of this host at 2 and 4 ranks (gsplit.launcher.limit_threads)
    cores = report.cpu_cores()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=args.seed)
    shares = {m: [] for m in args.models}
    steps = {m: [] for m in args.models}
    shapes = {}
    t0 = time.perf_counter()
    references = [host_speed_reference()]  # the host's speed while calibrating: at the start, per graph, at the end
    for nodes in args.nodes:
        ds = setup.load_named("synthetic", nodes, args.seed)
        say(f"synthetic-{nodes // 1000}k: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges")
        owners = {1: None, **{w: owner_map(ds, nodes, w, args.seed) for w in args.worlds}}
        for model in args.models:
            shapes[model] = shape_of(ds, model)
            for rec in time_shares(ds, shapes[model], sampler, BATCH, owners, iterations=args.shares_iters,
                                   repeats=args.repeats, seed=args.seed, input_features="direct", progress=say):
                shares[model].append({"nodes": nodes, **rec})
            cfg = run_config(model, "split", 5 + args.warmup, args.seed)
            got = time_steps(ds, cfg, progress=say, warmup=args.warmup)
            # the same one-rank run in `cores` independent processes at once: how much slower a rank computes
            # while every core is busy (no process group, nothing exchanged), against the same run in one fresh
            # process just before (not this process's run above: a fresh process's heap and caches, and the
            # host's speed of that minute, which drifts here by more than the effect measured)
            alone = corun_steps(ds, cfg, copies=1, warmup=args.warmup)[0]
            together = corun_steps(ds, cfg, copies=cores, warmup=args.warmup)
            slowdown = statistics.median(r["iteration_s"] for r in together) / alone["iteration_s"]
            say(f"  {cores} one-rank runs at once: {slowdown:.2f}x the time of one alone")
            steps[model].append({"nodes": nodes, **got, "num_classes": ds.num_classes, "corun": together,
                                 "corun_alone": alone, "corun_slowdown": slowdown})
        references.append(host_speed_reference())
    _, raw = transport_profile(args.worlds, TRANSPORT_SIZES, host_bw=1.0, progress=say)
    references.append(host_speed_reference())
    say(f"calibration: {time.perf_counter() - t0:.0f}s; host speed reference "
        f"{', '.join(f'{r * 1e3:.0f}' for r in references)} ms")
    return {"shares": shares, "steps": steps, "transport": raw, "cores": cores,
            "cache_bytes": effective_cache_bytes(), "cache_bytes_nominal": last_level_cache_bytes(),
            "host_reference_s": statistics.median(references)}


def fit(cal: dict) -> dict:
    """The CPU device and link profiles fitted to the calibration's raw timings (and nothing else)."""
    # the synthetic graphs' shape (64-d features, 8 classes), as the one-rank runs recorded it
    shapes = {m: ModelShape(m, v[0]["feat_dim"], HIDDEN, v[0].get("num_classes", 8), len(FANOUTS))
              for m, v in cal["steps"].items()}
    step_medians = {m: {"step_s": statistics.median(s["step_s"] for s in v)} for m, v in cal["steps"].items()}
    load_runs = [s for v in cal["steps"].values() for s in v]
    cores = int(cal.get("cores") or cal["machine"]["cores"])
    device, load, quality = fit_device("cpu-1thread", cal["shares"], shapes, step_medians, cores=cores,
                                       load_runs=load_runs, cache_bytes=cal.get("cache_bytes", last_level_cache_bytes()),
                                       source="experiments/estimate_validation.py --parts calibrate (one process, "
                                              "one torch thread, this host)")
    effects = [corun_effects(s.get("corun_alone", s), s["corun"]) for s in load_runs]
    device.contention = {k: statistics.median(e["contention"][k] for e in effects) for k in ("sample", "load", "compute")}
    device.noise = statistics.median(e["noise"] for e in effects)
    say(f"  with {cores} cores busy: " + ", ".join(f"{k} {v:.2f}x" for k, v in device.contention.items()) +
        f" (medians of the workloads); speed noise {device.noise:.1%} per step of work")
    if device.copy_bw:
        say(f"  a split rank's row copies around its shuffles: {device.copy_bw / 1e9:.2f} GB/s")
    say("  fits (relative error, median / max %): " + ", ".join(
        f"{k} {v['median_pct']:.0f}/{v['max_pct']:.0f}" for k, v in quality.items()))
    link = fit_link(cal["transport"], host_bw=load["host_bw"])
    return {"fit_quality": quality, "device": device.to_dict(), "link": link.to_dict()}


# ------------------------------------------------------------------------------------------- measure
def measure(args) -> dict:
    measured = []
    for nodes in args.nodes:
        ds = setup.load_named("synthetic", nodes, args.seed)
        say(f"synthetic-{nodes // 1000}k: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges")
        for world in args.worlds:
            owner = owner_map(ds, nodes, world, args.seed)
            keys = [(m, s) for m in args.models for s in ("split", "dp")]
            jobs = {k: (run_config(k[0], k[1], args.iters, args.seed), owner if k[1] == "split" else None) for k in keys}
            before = host_speed_reference()  # the host's speed just before and after these runs (idle otherwise)
            # with --prime every job runs twice in the launch (ABBA) and only its later run is measured: by then
            # the ranks' heap has grown to the largest batch of every job (see heap_primed)
            logs = heap_primed(runs.run_repeated(ds, world, jobs, repeats=2 if args.prime else 1))
            reference = (before + host_speed_reference()) / 2
            for (model, system), job_logs in logs.items():
                times = runs.iteration_times(job_logs, skip_first=args.warmup)
                per_it = [max(sum(r) for r in row) for row in times["per_iteration"]]
                first = job_logs[0]["epochs"][0]
                measured.append({"nodes": nodes, "world": world, "model": model, "system": system,
                                 "iteration_s": times["total_s"], "per_iteration_s": per_it,
                                 "sample_s": times["sample_s"], "load_s": times["load_s"], "train_s": times["train_s"],
                                 "edges": first["edges"], "input_rows": first["input_rows"],
                                 "terms": measured_terms(job_logs, args.warmup), "host_reference_s": reference,
                                 "faults_per_iteration": faults_per_iteration(job_logs, args.warmup)})
                say(f"  {model} {system} {world} ranks: {times['total_s'] * 1e3:.0f} ms per iteration "
                    f"(sample {times['sample_s'] * 1e3:.0f}, load {times['load_s'] * 1e3:.0f}, "
                    f"train {times['train_s'] * 1e3:.0f})")
    return {"runs": measured}


def heap_primed(logs: dict) -> dict:
    """Each job's later run only (``key -> [log]``), from :func:`harness.runs.run_repeated`'s ``key -> logs``.

    A rank's heap grows whenever a batch needs more memory than any before it, and on this VM a fresh page costs
    ~10 us (the guest's memory is backed on first touch): ~40k pages, +0.4 s on one rank's backward, several times
    in a 12-iteration GAT run on 1M vertices, on whichever rank and iteration meet a new largest batch (beyond
    the warm-up too). An epoch of hundreds of iterations meets its largest batches early and runs on a grown heap
    after that; the model predicts that steady state. A job's later run in the same ranks starts on the heap its
    first run (and every job before) grew.

    Example:
        >>> heap_primed({"a": [1, 2], "b": [3]})
        {'a': [2], 'b': [3]}
    """
    return {key: job_logs[-1:] for key, job_logs in logs.items()}


def faults_per_iteration(job_logs: list, warmup: int = 1) -> list:
    """Per measured iteration (the first ``warmup`` of each run left out), the most minor page faults one rank had
    in it (:func:`gsplit.runtime.resources.minor_page_faults` as the trainer records it); ``None`` where a log has no
    count. A fault storm (thousands: the heap growing) marks an iteration that ran slower for it.

    Example:
        >>> rank = lambda *f: {"per_iteration": [{"minor_faults": x} for x in f]}
        >>> faults_per_iteration([{"epochs": [{"ranks": [rank(9, 3, 40000), rank(9, 5, 2)]}]}])
        [5, 40000]
    """
    out = []
    for log in job_logs:
        ranks = [r["per_iteration"][warmup:] for r in log["epochs"][0]["ranks"]]
        for its in zip(*ranks):
            counts = [it.get("minor_faults") for it in its]
            out.append(None if None in counts else max(counts))
    return out


MEASURED_TERMS = ("forward", "backward", "id exchange", "feature shuffle", "layer shuffles", "all-reduce", "waiting")
"""What :func:`measured_terms` splits a measured iteration's training into (named as the model's terms)."""


def _collective_term(tag: str) -> str:
    if tag.startswith("ids/"):
        return "id exchange"
    if tag.startswith("shuffle/layer0"):
        return "feature shuffle"
    return "layer shuffles" if tag.startswith("shuffle/") else "all-reduce"


def measured_terms(job_logs: list, warmup: int = 1) -> dict:
    """Seconds per iteration of the measured runs by term, means over ranks and iterations (the first ``warmup`` of
    each run left out): each layer's forward and backward (``LayerClock``, waits excluded), each kind of collective's
    transfer (its least seconds over ranks: the last rank to arrive waits for no one) and, summed over every
    collective, the waiting beyond it (:func:`gsplit.run.counters.iteration_balance`). The same names as the model's
    terms, so that a miss can be placed; measured layers run under the co-run contention that the model books
    as ``cores shared``."""
    from gsplit.run.counters import iteration_balance

    totals, iterations = dict.fromkeys(MEASURED_TERMS, 0.0), 0
    for log in job_logs:
        ranks = [{**r, "per_iteration": r["per_iteration"][warmup:]} for r in log["epochs"][0]["ranks"]]
        bal = iteration_balance(ranks)
        iterations += len(bal["per_iteration"])
        totals["forward"] += sum(bal["layer_fwd_s_mean"])
        totals["backward"] += sum(bal["layer_bwd_s_mean"])
        for tag, sec in bal["transfer_s_by_tag"].items():
            totals[_collective_term(tag)] += sec
        totals["waiting"] += sum(bal["wait_s_by_tag"].values())
        # the gradient all-reduce on the job's own group (data parallelism) is not in the loader's tags: the step's
        # collective seconds beyond its tagged shuffles are it, transfer and waiting together
        tagged = sum(sec for r in bal["per_iteration"] for tag, sec in r["collective_s_mean"].items()
                     if not tag.startswith("ids/"))
        totals["all-reduce"] += max(0.0, bal["step_collective_s_mean"] - tagged)
    return {k: v / max(iterations, 1) for k, v in totals.items()}


# ------------------------------------------------------------------------------------------- report
def count_works(args) -> dict:
    """``{(nodes, world): (work, iterations per epoch, {model: shape})}``: the work of exactly the measured
    iterations, counted once in this process (every round's prediction reuses it)."""
    sampler = gsplit.NeighborSampler(FANOUTS, seed=args.seed)
    works = {}
    for nodes in args.nodes:
        ds = setup.load_named("synthetic", nodes, args.seed)
        for world in args.worlds:
            owner = owner_map(ds, nodes, world, args.seed)
            work = count_work(ds.graph, ds.train_idx, sampler, BATCH, world, owner, iterations=args.iters,
                              seed=args.seed, input_features="direct")
            works[nodes, world] = (work, -(-ds.train_idx.numel() // (BATCH * world)),
                                   {m: shape_of(ds, m) for m in args.models})
    return works


def summarise(records: list) -> dict:
    """How many predictions are within 20 %, and the median and largest |error|.

    Example:
        >>> summarise([{"error": 0.1}, {"error": -0.3}, {"error": 0.05}])
        {'records': 3, 'within_20pct': 2, 'max_abs_error': 0.3, 'median_abs_error': 0.1}
    """
    errors = [abs(r["error"]) for r in records]
    return {"records": len(records), "within_20pct": sum(e <= 0.20 for e in errors),
            "max_abs_error": max(errors) if errors else None,
            "median_abs_error": statistics.median(errors) if errors else None}


def report_table(args, works: dict, cal: dict, meas: dict, quiet: bool = False) -> dict:
    device = DeviceProfile.from_dict(cal["device"])
    link = LinkProfile.from_dict(cal["link"])
    rows, records, term_rows = [], [], []
    by_key = {(r["nodes"], r["world"], r["model"], r["system"]): r for r in meas["runs"]}
    for nodes in args.nodes:
        for world in args.worlds:
            work, iters_per_epoch, shapes = works[nodes, world]
            for model in args.models:
                shape = shapes[model]
                pred = {s: predict(work[s][args.warmup:], shape, device, link) for s in ("split", "dp")}
                got = {s: by_key.get((nodes, world, model, s)) for s in ("split", "dp")}
                recs = {}
                for s in ("split", "dp"):
                    if got[s] is None:
                        continue
                    err = pred[s].iteration_s / got[s]["iteration_s"] - 1
                    speed = host_speed_ratio(cal, got[s])
                    rec = {"nodes": nodes, "world": world, "model": model, "system": s,
                           "measured_s": got[s]["iteration_s"], "predicted_s": pred[s].iteration_s, "error": err,
                           "host_speed_ratio": speed,
                           "error_host_corrected": None if speed is None else
                           pred[s].iteration_s * speed / got[s]["iteration_s"] - 1,
                           "epoch_iterations": iters_per_epoch, "terms": pred[s].terms,
                           "predicted_per_iteration_s": pred[s].per_iteration_s,
                           "measured_per_iteration_s": got[s]["per_iteration_s"],
                           "measured_terms": got[s].get("terms")}
                    records.append(rec)
                    recs[s] = rec
                    if rec["measured_terms"]:
                        term_rows.append([f"synthetic-{nodes // 1000}k", model, world, s,
                                          *_terms_side_by_side(rec["measured_terms"], pred[s].terms),
                                          _faults_cell(got[s].get("faults_per_iteration"))])
                if got["split"] and got["dp"]:
                    m_ratio = got["split"]["iteration_s"] / got["dp"]["iteration_s"]
                    p_ratio = pred["split"].iteration_s / pred["dp"].iteration_s
                    decisive = abs(m_ratio - 1) > 0.10
                    right = (m_ratio > 1) == (p_ratio > 1) if decisive else None
                    for s in ("split", "dp"):
                        rows.append([f"synthetic-{nodes // 1000}k", model, world, s,
                                     got[s]["iteration_s"] * 1e3, pred[s].iteration_s * 1e3,
                                     got[s]["iteration_s"] * iters_per_epoch, pred[s].iteration_s * iters_per_epoch,
                                     f"{(pred[s].iteration_s / got[s]['iteration_s'] - 1) * 100:+.1f}",
                                     f"{m_ratio:.2f}" if s == "split" else "", f"{p_ratio:.2f}" if s == "split" else "",
                                     ("yes" if right else "NO") if (s == "split" and decisive) else
                                     ("(within 10 %)" if s == "split" else ""),
                                     _cell(recs[s]["host_speed_ratio"], "{:.2f}"),
                                     _cell(recs[s]["error_host_corrected"], "{:+.1%}"),
                                     ", ".join(f"{k} {v:.0%}" for k, v in pred[s].dominant(3))])
    headers = ["graph", "model", "ranks", "system", "measured ms/it", "predicted ms/it", "measured epoch s",
               "predicted epoch s", "error %", "split/dp measured", "split/dp predicted", "ratio side right",
               "host speed measured/calibration", "error host-corrected", "largest predicted terms"]
    table = report.format_table(headers, rows, floatfmt=".1f")
    terms_table = report.format_table(["graph", "model", "ranks", "system", *TERM_COLUMNS, FAULTS_COLUMN], term_rows,
                                      floatfmt=".1f")
    summary = summarise(records)
    corrected = [{"error": r["error_host_corrected"]} for r in records if r["error_host_corrected"] is not None]
    summary_corrected = summarise(corrected) if len(corrected) == len(records) else None
    if not quiet:
        print(table)
        print(f"\n{describe(summary)}")
        if summary_corrected:
            print(f"host-corrected (each prediction times the host speed reference's ratio, measured runs against "
                  f"calibration): {describe(summary_corrected)}")
        if term_rows:
            print("\nms per iteration, measured / predicted (measured layers include the co-run contention the model "
                  "books as 'cores shared'; predicted waiting = waiting + uneven speed):")
            print(terms_table)
    return {"table": table, "headers": headers, "rows": rows, "records": records, "summary": summary,
            "summary_host_corrected": summary_corrected, "terms_table": terms_table}


def host_speed_ratio(cal: dict, run: dict):
    """How much slower the host was around a measured run than while calibrating: the fixed workload's seconds
    (:func:`gsplit.estimate.calibrate.host_speed_reference`) beside the run over its seconds in the calibration;
    ``None`` for files written before it was timed. Above 1: the runs met a slower host than the calibration.

    Example:
        >>> host_speed_ratio({"host_reference_s": 0.05}, {"host_reference_s": 0.06}), host_speed_ratio({}, {})
        (1.2, None)
    """
    if not cal.get("host_reference_s") or not run.get("host_reference_s"):
        return None
    return round(run["host_reference_s"] / cal["host_reference_s"], 12)


def _cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


TERM_COLUMNS = ("forward", "backward", "collectives", "waiting", "cores shared (pred.)")


def _terms_side_by_side(measured: dict, predicted: dict) -> list:
    """``TERM_COLUMNS`` cells, ``"measured / predicted"`` ms per iteration.

    Example:
        >>> _terms_side_by_side({"forward": 0.01, "backward": 0.02, "all-reduce": 0.001, "waiting": 0.003},
        ...                     {"forward": 0.012, "backward": 0.02, "all-reduce": 0.002, "waiting": 0.001,
        ...                      "uneven speed": 0.001, "cores shared": 0.004})
        ['10.0 / 12.0', '20.0 / 20.0', '1.0 / 2.0', '3.0 / 2.0', '4.0']
    """
    collectives = ("id exchange", "feature shuffle", "layer shuffles", "all-reduce")
    pairs = [(measured.get("forward", 0.0), predicted.get("forward", 0.0)),
             (measured.get("backward", 0.0), predicted.get("backward", 0.0)),
             (sum(measured.get(k, 0.0) for k in collectives), sum(predicted.get(k, 0.0) for k in collectives)),
             (measured.get("waiting", 0.0), predicted.get("waiting", 0.0) + predicted.get("uneven speed", 0.0))]
    return [f"{m * 1e3:.1f} / {p * 1e3:.1f}" for m, p in pairs] + [f"{predicted.get('cores shared', 0.0) * 1e3:.1f}"]


FAULTS_COLUMN = "page faults, most on a rank per iteration: median / largest"


def _faults_cell(faults) -> str:
    """``"median / largest"`` of :func:`faults_per_iteration` (``-`` for runs measured before it was recorded).

    Example:
        >>> _faults_cell([3, 5, 40000]), _faults_cell(None), _faults_cell([None, 3])
        ('5 / 40000', '-', '-')
    """
    if not faults or None in faults:
        return "-"
    return f"{statistics.median(faults):.0f} / {max(faults)}"


def describe(summary: dict) -> str:
    return (f"{summary['within_20pct']} of {summary['records']} predictions within 20 %; median |error| "
            f"{(summary['median_abs_error'] or 0) * 100:.1f} %, largest {(summary['max_abs_error'] or 0) * 100:.1f} %")


def round_stem(stem: Path, k: int) -> Path:
    return stem.with_name(f"{stem.name}_round{k}")


def round_numbers(rounds_done: int) -> range:
    """The ``k`` of the ``*_round<k>`` files a run of ``rounds_done`` rounds wrote (none for a single round)."""
    return range(1, rounds_done + 1) if rounds_done > 1 else range(0)


def main(argv=None) -> int:
    args = parse_args(argv)
    cal_stem, meas_stem = report.output_stem(args, args.calibration), report.output_stem(args, args.measured)
    cal_path, meas_path = Path(f"{cal_stem}.json"), Path(f"{meas_stem}.json")
    settings = {"nodes": args.nodes, "worlds": args.worlds, "models": args.models, "iters": args.iters,
                "warmup": args.warmup, "prime": args.prime,
                "fanouts": FANOUTS, "batch_size": BATCH, "hidden": HIDDEN, "seed": args.seed}
    # Rounds alternate calibration and measurement, so that both see the host's speed at its drifts (it
    # changes 1.5-2x over minutes here); the main JSONs hold the medians over the rounds so far (rewritten
    # after every round: a stopped run keeps what it finished), each round's own pair is kept beside them.
    cals, meas_rounds = [], []
    for k in range(1, args.rounds + 1):
        if args.rounds > 1:
            say(f"round {k} of {args.rounds}")
        if "calibrate" in args.parts:
            cals.append(calibrate(args))
            if args.rounds > 1:
                report.save_json(round_stem(cal_stem, k),
                                 {"settings": settings, "round": k, **cals[-1], **fit(cals[-1])})
            merged = rounds.median_of_rounds(cals)
            report.save_json(cal_stem, {"settings": settings, "rounds": len(cals), **merged, **fit(merged)})
        if "measure" in args.parts:
            meas_rounds.append(measure(args))
            if args.rounds > 1:
                report.save_json(round_stem(meas_stem, k), {"settings": settings, "round": k, **meas_rounds[-1]})
            report.save_json(meas_stem, {"settings": settings, "rounds": len(meas_rounds),
                                         **rounds.median_of_rounds(meas_rounds)})
    if "refit" in args.parts:  # the fits again from the stored raw timings (no new measurement), rounds' too
        rounds_done = report.read_json(cal_path).get("rounds", 1)
        for path in [cal_path] + [Path(f"{round_stem(cal_stem, k)}.json") for k in round_numbers(rounds_done)]:
            cal = report.read_json(path)
            cal.update(fit(cal))
            report.write_json(path, cal)
            print(f"refitted {path}")
    if "report" in args.parts:
        cal, meas = report.read_json(cal_path), report.read_json(meas_path)
        # the iterations the runs had and left out (files measured before --warmup existed left out one)
        args.iters = meas.get("settings", {}).get("iters", args.iters)
        args.warmup = meas.get("settings", {}).get("warmup", 1)
        # and whether each job was measured on its second run (files from before --prime: once)
        settings.update(iters=args.iters, warmup=args.warmup, prime=meas.get("settings", {}).get("prime", False))
        works = count_works(args)
        result = report_table(args, works, cal, meas)
        # each round's calibration against the same round's runs: how far one round alone would have been off
        per_round, per_round_corrected = [], []
        n_rounds = min(cal.get("rounds", 1), meas.get("rounds", 1))
        for k in round_numbers(n_rounds):
            got = report_table(args, works, report.read_json(f"{round_stem(cal_stem, k)}.json"),
                               report.read_json(f"{round_stem(meas_stem, k)}.json"), quiet=True)
            per_round.append(got["summary"])
            per_round_corrected.append(got["summary_host_corrected"])
            say(f"  round {k} alone: {describe(got['summary'])}" + (
                f"; host-corrected: {describe(got['summary_host_corrected'])}" if got["summary_host_corrected"] else ""))
        name = "estimate_validation" + args.measured[len("estimate_measured"):]  # e.g. _repeat for a second pass
        report.save_json(report.output_stem(args, name),
                         {"settings": settings, "calibration_file": cal_path.name, "measured_file": meas_path.name,
                          "rounds": n_rounds, "per_round": per_round,
                          "per_round_host_corrected": per_round_corrected,
                          "calibration_machine": cal["machine"], "measured_machine": meas["machine"], **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
