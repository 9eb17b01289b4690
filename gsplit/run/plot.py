"""Pictures of one's own run: loss, accuracy and the per-epoch time breakdown, as a PNG or in TensorBoard.

Both read the same numbers from the run log's epoch records (:func:`epoch_scalars`): ``gsplit plot
run.jsonl`` draws them with matplotlib (``pip install -e ".[plot]"`` in a clone); ``gsplit train --tensorboard DIR``
writes them as TensorBoard scalars while the run goes (``pip install tensorboard``).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

__all__ = ["epoch_scalars", "final_scalars", "plot_run", "TensorBoardWriter", "TIME_PARTS"]

TIME_PARTS = (("sample_s", "sample"), ("load_s", "load"), ("train_s", "forward-backward"))
"""The parts of an epoch's time in the run log, as the CLI prints them (slowest rank's seconds)."""


def epoch_scalars(record: dict) -> Dict[str, float]:
    """``tag -> value`` of one epoch record: ``loss``, ``accuracy/val`` / ``accuracy/test`` (when evaluated),
    ``time/epoch`` and ``time/<part>`` in seconds.

    Example:
        >>> epoch_scalars({"epoch": 0, "loss": 1.5, "epoch_s": 3.0, "sample_s": 1.0, "load_s": 0.5,
        ...                "train_s": 1.2, "val_acc": 0.7})
        {'loss': 1.5, 'accuracy/val': 0.7, 'time/epoch': 3.0, 'time/sample': 1.0, 'time/load': 0.5, 'time/forward-backward': 1.2}
    """
    out = {"loss": float(record["loss"])}
    for key, name in (("val_acc", "val"), ("test_acc", "test")):
        if key in record:
            out[f"accuracy/{name}"] = float(record[key])
    out["time/epoch"] = float(record["epoch_s"])
    for key, name in TIME_PARTS:
        if key in record:
            out[f"time/{name}"] = float(record[key])
    return out


def final_scalars(summary: dict) -> Dict[str, float]:
    """The final layer-wise accuracies of a run's summary (``final_val_acc`` / ``final_test_acc``), and a link
    prediction run's MRR and Hits@K (``final_val_mrr``, ``final_test_hits@50``, ...).

    Example:
        >>> final_scalars({"final_test_acc": 0.9, "wall_s": 3})
        {'final_accuracy/test': 0.9}
        >>> final_scalars({"final_test_mrr": 0.5, "final_test_hits@50": 0.7})
        {'final_mrr/test': 0.5, 'final_hits@50/test': 0.7}
    """
    out = {f"final_accuracy/{name}": float(summary[f"final_{name}_acc"]) for name in ("val", "test")
           if f"final_{name}_acc" in summary}
    for key, value in summary.items():  # link prediction: final_{val,test}_{mrr,hits@K}
        parts = key.split("_", 2)
        if len(parts) == 3 and parts[0] == "final" and parts[1] in ("val", "test") and \
                (parts[2] == "mrr" or parts[2].startswith("hits@")):
            out[f"final_{parts[2]}/{parts[1]}"] = float(value)
    return out


def plot_run(log: Union[str, os.PathLike, dict], out: Union[str, os.PathLike]) -> List[str]:
    """Draw a run log's loss, accuracy and per-epoch time breakdown into one PNG; returns the panels drawn.

    ``log`` is a path (``gsplit train --log``) or the dict of :func:`gsplit.runtime.io.read_run_log`.

    Example:
        >>> import tempfile, pathlib, pytest; _ = pytest.importorskip("matplotlib")
        >>> log = {"epochs": [{"epoch": e, "loss": 2 - e, "epoch_s": 2.0, "sample_s": 0.5, "load_s": 0.2,
        ...                    "train_s": 1.1, "val_acc": 0.5 + e / 10} for e in range(3)], "complete": True}
        >>> plot_run(log, pathlib.Path(tempfile.mkdtemp()) / "run.png")
        ['loss', 'accuracy', 'time per epoch']
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"gsplit plot needs matplotlib ({e}); pip install 'gsplit[plot]'") from e
    from gsplit.runtime.io import atomic_write_bytes, read_run_log

    run = read_run_log(log) if not isinstance(log, dict) else log
    epochs = run.get("epochs", [])
    if not epochs:
        raise ValueError(f"the run log {log if not isinstance(log, dict) else ''} has no finished epoch to plot; "
                         "plot a log that `gsplit train --log` wrote after its first epoch")
    xs = [int(r["epoch"]) for r in epochs]
    scalars = [epoch_scalars(r) for r in epochs]
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs
    panels = []
    ax = axes[0]
    ax.plot(xs, [s["loss"] for s in scalars], marker="o")
    ax.set(title="training loss (global mini-batch mean)", xlabel="epoch", ylabel="loss")
    panels.append("loss")
    ax = axes[1]
    for name in ("val", "test"):
        pts = [(x, s[f"accuracy/{name}"]) for x, s in zip(xs, scalars) if f"accuracy/{name}" in s]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name} (mini-batch)")
    for name, value in final_scalars(run).items():
        ax.axhline(value, linestyle="--", color="gray")
        ax.annotate(f"{name.split('/')[1]} layer-wise {value:.3f}", (xs[-1], value), textcoords="offset points",
                    xytext=(-5, 4), ha="right", fontsize=8)
    ax.set(title="accuracy", xlabel="epoch", ylabel="accuracy")
    if ax.lines:
        ax.legend(loc="lower right")
    panels.append("accuracy")
    ax = axes[2]
    bottom = [0.0] * len(xs)
    for key, name in TIME_PARTS:
        values = [float(r.get(key, 0.0)) for r in epochs]
        ax.bar(xs, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(xs, [s["time/epoch"] for s in scalars], color="black", marker="_", linestyle="", markersize=20,
            label="epoch (wall)")
    ax.set(title="time per epoch (slowest rank)", xlabel="epoch", ylabel="seconds")
    ax.legend(loc="upper right", fontsize=8)
    panels.append("time per epoch")
    title = run.get("dataset") or ""
    if run.get("config"):
        cfg = run["config"]
        title = f"{title} {cfg.get('model', '')} {cfg.get('system', '')}, {run.get('world_size', '?')} ranks".strip()
    fig.suptitle(title)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return panels


class TensorBoardWriter:
    """Rank 0's TensorBoard scalars: the figures of :func:`epoch_scalars` per epoch, the final accuracies.

    Picklable until first used (it crosses into the rank processes); the ``SummaryWriter`` is made on the
    first record. Needs the ``tensorboard`` package (``torch.utils.tensorboard`` imports it).
    """

    def __init__(self, log_dir: Union[str, os.PathLike]):
        self.log_dir = os.fspath(log_dir)
        """Folder of the event files (``tensorboard --logdir`` it)."""
        self._writer = None

    @staticmethod
    def check_available() -> None:
        """Raise ``ImportError`` saying what to install when TensorBoard is missing (before any work)."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as e:
            raise ImportError(f"--tensorboard needs the tensorboard package ({e}); pip install tensorboard") from e

    def _get(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir)
        return self._writer

    def epoch(self, record: dict) -> None:
        writer = self._get()
        for tag, value in epoch_scalars(record).items():
            writer.add_scalar(tag, value, int(record["epoch"]))
        writer.flush()

    def final(self, summary: dict, step: Optional[int] = None) -> None:
        writer = self._get()
        for tag, value in final_scalars(summary).items():
            writer.add_scalar(tag, value, step or 0)
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self):
        return {"log_dir": self.log_dir, "_writer": None}
