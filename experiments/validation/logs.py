"""What the measured runs' logs say, in the cost model's terms (``experiments/estimate_validation.py --parts
measure`` records it)."""
from __future__ import annotations




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
