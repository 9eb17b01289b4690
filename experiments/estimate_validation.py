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
    python experiments/estimate_validation.py --rounds 3 --calibration estimate_calibration_rounds_cache2 \
        --measured estimate_measured_rounds_cache2                  # the latest recorded pass (~20 min)
    python experiments/estimate_validation.py --rounds 3 --calibration estimate_calibration_rounds_cache2 \
        --measured estimate_measured_rounds_cache2 --parts report   # its report again from the stored files
    python experiments/estimate_validation.py --parts calibrate      # then --parts measure, then --parts report
    python experiments/estimate_validation.py --quick                # 20k vertices, 2 ranks, SAGE (~3 min)

The measured logs' reading and the report's table live in ``experiments/validation/`` (``logs``, ``table``).

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
from gsplit.estimate import ModelShape, count_work
from gsplit.estimate.calibrate import (corun_effects, corun_steps, effective_cache_bytes, fit_device, fit_link,
                                       host_speed_reference, last_level_cache_bytes, time_shares, time_steps,
                                       transport_profile)
from gsplit.run.trainer import TrainConfig

from validation.logs import faults_per_iteration, heap_primed, measured_terms
from validation.table import describe, report_table

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
