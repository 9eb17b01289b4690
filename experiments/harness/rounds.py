"""How the experiments repeat and time things, and run other processes.

* interleaved rounds (:func:`orders`): every compared thing once per round, the order reversed on odd rounds
  (ABBA), so that warm-up and drifts of a shared machine's load hit them alike; medians over rounds (of whole
  result documents: :func:`median_of_rounds`);
* repeats after a warm-up (:func:`time_repeats`, :func:`median_ms`), one call's wall and CPU time
  (:func:`timed_call`), per-batch sampler timings (:func:`time_batches`), a time budget (:class:`Budget`);
* subprocesses (:func:`run_command`): workers of the same script, other checkouts of gsplit
  (:func:`checkout_env`), the DGL peers (:func:`peer_env`), and the JSON they hand back (:func:`run_json`).

Only the standard library: the DGL peers use this module too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import report


# ---------------------------------------------------------------------------------------- rounds
def alternate(names: Sequence, i: int) -> list:
    """``names`` in order for even ``i``, reversed for odd ``i``.

    Example:
        >>> alternate("ab", 0), alternate("ab", 1)
        (['a', 'b'], ['b', 'a'])
    """
    return list(names) if i % 2 == 0 else list(names)[::-1]


def orders(names: Sequence, rounds: int, alternate_order: bool = True) -> Iterator[Tuple[int, list]]:
    """``(round, names in that round's order)`` for ``rounds`` interleaved rounds (reversed on odd rounds unless
    ``alternate_order`` is false).

    Example:
        >>> list(orders(["a", "b"], 3))
        [(0, ['a', 'b']), (1, ['b', 'a']), (2, ['a', 'b'])]
    """
    for r in range(rounds):
        yield r, alternate(names, r) if alternate_order else list(names)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def median_of_rounds(docs: Sequence, where: str = "") -> object:
    """One document from several rounds' documents of the same shape (dicts with the same keys, lists of the
    same length): every number is the median over the rounds (ints: the lower median, so counts stay ints);
    every list of numbers is the list of the round whose sum is the median, so a per-iteration series keeps
    one real run's spread instead of being smoothed; anything else is the first round's.

    Example:
        >>> median_of_rounds([{"s": 1.0, "n": 3, "it": [1, 9]}, {"s": 3.0, "n": 3, "it": [2, 2]},
        ...                   {"s": 2.0, "n": 3, "it": [4, 4]}])
        {'s': 2.0, 'n': 3, 'it': [4, 4]}
        >>> median_of_rounds([{"a": 1}, {"b": 1}])
        Traceback (most recent call last):
        ...
        ValueError: rounds differ in shape at '': keys ['a'] against ['b']; merge rounds of the same run only
    """
    first = docs[0]
    if len(docs) == 1:
        return first
    if all(_is_number(d) for d in docs):
        if all(isinstance(d, int) for d in docs):
            return statistics.median_low(docs)
        return statistics.median(docs)
    if all(isinstance(d, dict) for d in docs):
        for d in docs[1:]:
            if sorted(d) != sorted(first):
                raise ValueError(f"rounds differ in shape at {where!r}: keys {sorted(first)} against {sorted(d)}; "
                                 "merge rounds of the same run only")
        return {k: median_of_rounds([d[k] for d in docs], f"{where}.{k}") for k in first}
    if all(isinstance(d, list) for d in docs):
        if any(len(d) != len(first) for d in docs):
            raise ValueError(f"rounds differ in shape at {where!r}: lists of {[len(d) for d in docs]} entries; "
                             "merge rounds of the same run only")
        if first and all(_is_number(x) for d in docs for x in d):
            by_sum = sorted(docs, key=sum)
            return list(by_sum[(len(by_sum) - 1) // 2])
        return [median_of_rounds([d[i] for d in docs], f"{where}[{i}]") for i in range(len(first))]
    return first


# ---------------------------------------------------------------------------------------- timing
def time_repeats(fn: Callable[[], object], repeats: int, *, warmup: int = 1, before: Optional[Callable] = None,
                 after: Optional[Callable] = None) -> List[float]:
    """Wall seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (first use: compilation,
    allocation). ``before()`` runs untimed before every timed call (a barrier); ``after()`` runs inside the
    timing after each call, warm-up included (a device synchronisation).

    Example:
        >>> len(time_repeats(lambda: sum(range(100)), 3))
        3
    """
    for _ in range(warmup):
        fn()
        if after is not None:
            after()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if after is not None:
            after()
        times.append(time.perf_counter() - t0)
    return times


def median_ms(fn: Callable[[], object], repeats: int, sync: Optional[Callable[[], None]] = None) -> float:
    """Median wall ms of ``fn`` over ``repeats`` runs after one warm-up, with ``sync()`` after each run."""
    return 1e3 * statistics.median(time_repeats(fn, repeats, after=sync))


def timed_call(fn: Callable, *args) -> tuple:
    """``(fn(*args), wall seconds, CPU seconds of this process)``: CPU time (summed over threads) is much less
    sensitive to other processes on a shared machine than wall time."""
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def batch_summary(times: Sequence[float], edges: Sequence[float], inputs: Sequence[float]) -> dict:
    """Per-batch sampler timings: median / mean / min ms, sampled edges and input vertices per batch."""
    return {"num_batches": len(times), "ms_per_batch": 1e3 * statistics.median(times),
            "ms_mean": 1e3 * statistics.fmean(times), "ms_min": 1e3 * min(times),
            "edges_per_batch": statistics.fmean(edges), "input_nodes_per_batch": statistics.fmean(inputs),
            "ms_all": [1e3 * x for x in times]}


def time_batches(sample: Callable[[int, object], tuple], batches: Iterable, warmup: int) -> dict:
    """Time ``sample(i, seeds) -> (blocks, input_nodes)`` on every batch; the first ``warmup`` are not counted.
    Returns :func:`batch_summary` of the rest (edges: every block's ``num_edges()`` summed)."""
    times, edges, inputs = [], [], []
    for i, seeds in enumerate(batches):
        t0 = time.perf_counter()
        blocks, input_nodes = sample(i, seeds)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
            edges.append(sum(int(b.num_edges()) for b in blocks))
            inputs.append(int(input_nodes))
    return batch_summary(times, edges, inputs)


class Budget:
    """Seconds left of an overall time budget; each part gets at most its cap and what is left."""

    def __init__(self, total: float):
        self.deadline = time.monotonic() + total

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


# ---------------------------------------------------------------------------------------- subprocesses
@dataclass
class Finished:
    """What a command of :func:`run_command` left."""

    argv: List[str]
    """The command."""
    returncode: Optional[int]
    """Its exit status; ``None`` when it was stopped at its timeout."""
    seconds: float
    """Wall time from start to end."""
    output: str = ""
    """Its stdout and stderr together, when captured."""
    log: Optional[Path] = None
    """The file its output went to instead, if any."""
    watched: object = None
    """What ``watch`` made of its process id (e.g. a :class:`harness.memory.ProcessTree` with its peaks)."""

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of its output."""
        text = self.log.read_text(errors="replace") if self.log is not None and self.log.exists() else self.output
        return "\n".join(text.strip().splitlines()[-lines:])


def run_command(argv: Sequence, *, log: Optional[Union[str, Path]] = None, capture: bool = True,
                timeout: Optional[float] = None, env: Optional[dict] = None, cwd: Optional[Union[str, Path]] = None,
                check: bool = True, own_group: bool = False, watch: Optional[Callable[[int], object]] = None
                ) -> Finished:
    """Run ``argv`` (items made strings) and wait; its output goes to ``log``, is captured (``capture``), or is
    shown as it comes (``capture=False``). At ``timeout`` seconds it is killed (with ``own_group``, its whole
    process group: it starts a session of its own). With ``check`` a failure or a timeout raises an error
    that names the command and shows the last lines of its output. ``watch(pid)``, a context manager, is
    entered while the command runs (``Finished.watched``).

    Example:
        >>> run_command(["echo", "hi"]).output
        'hi\\n'
    """
    argv = [str(a) for a in argv]
    sink = open(log, "w") if log is not None else (subprocess.PIPE if capture else None)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None,
                                text=True, start_new_session=own_group)
        watched = watch(proc.pid) if watch is not None else None
        with watched if watched is not None else contextlib.nullcontext():
            try:
                out, _ = proc.communicate(timeout=timeout)
                code: Optional[int] = proc.returncode
            except subprocess.TimeoutExpired:
                if own_group:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
                out, _ = proc.communicate()
                code = None
    finally:
        if log is not None:
            sink.close()
    done = Finished(argv, code, time.perf_counter() - t0, out or "", Path(log) if log is not None else None, watched)
    if check and code != 0:
        what = f"stopped after {timeout:.0f} s" if code is None else f"exit status {code}"
        where = f"last lines of {done.log}" if done.log is not None else "last lines of its output"
        tail = done.tail() if (done.log is not None or capture) else "(shown above)"
        raise RuntimeError(f"{what} of\n  {' '.join(argv)}\n{where}:\n{tail}")
    return done


def checkout_env(repo: Union[str, Path], **extra: str) -> Dict[str, str]:
    """This environment with ``gsplit`` imported from the checkout ``repo`` (its ``PYTHONPATH``) and ``extra``
    variables (e.g. ``GSPLIT_EXTENSION_DIR``: another checkout's compiled kernels need their own cache)."""
    return {**os.environ, "PYTHONPATH": str(Path(repo).resolve()), **extra}


def peer_env(**extra: str) -> Dict[str, str]:
    """The environment of a DGL peer (``.venv-dgl``): this one with ``DGLBACKEND=pytorch``, no ``PYTHONPATH``
    (the DGL venv has its own torch; gsplit is never imported there) and ``extra`` variables."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "DGLBACKEND": "pytorch", **extra}


def run_json(argv: Sequence, *, flag: str = "--json", path: Optional[Union[str, Path]] = None, **kwargs) -> dict:
    """Run ``argv`` with ``flag PATH`` appended and return the JSON the command wrote to ``PATH``
    (:func:`harness.report.write_json`; ``path`` default: a temporary file, removed after). ``kwargs`` go to
    :func:`run_command` (output shown as it comes unless told otherwise)."""
    kwargs.setdefault("capture", False)
    temporary = path is None
    if temporary:
        fd, name = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        path = Path(name)
    try:
        run_command([*argv, flag, path], **kwargs)
        return report.read_json(path)
    finally:
        if temporary:
            Path(path).unlink(missing_ok=True)
