"""The validation's report: every measured run beside its prediction, and how far off they are
(``experiments/estimate_validation.py --parts report``)."""
from __future__ import annotations

import statistics

from harness import report

from gsplit.estimate import predict
from gsplit.estimate.links import LinkProfile
from gsplit.estimate.model import DeviceProfile


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
