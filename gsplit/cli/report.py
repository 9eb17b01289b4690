"""What a training command prints and logs per epoch: the epoch line, the run log's records, TensorBoard.

Shared by ``gsplit train`` (:mod:`gsplit.cli.train`) and its link prediction task (:mod:`gsplit.cli.train_link`).
"""

from __future__ import annotations

from typing import Optional

from gsplit.runtime.io import append_jsonl


def print_epoch(record: dict) -> None:
    """Per-epoch line printed from rank 0 (picklable, so it can cross into the rank processes).

    Its parts (sample / load / fwd-bwd, the slowest rank's each) are measured within the epoch's time,
    so none exceeds it; the setup before the first epoch is in neither (the log's ``setup_s``)."""
    acc = "  ".join(f"{k[:-4]} acc {record[k]:.4f}" for k in ("val_acc", "test_acc") if k in record)
    if record.get("co_batches"):  # full-graph training in co-batches: one step of this many batches per host
        acc = f"{record['co_batches']} co-batches  {acc}"
    print(f"epoch {record['epoch']:>3}  loss {record['loss']:.4f}  time {record['epoch_s']:.2f}s "
          f"(sample {record['sample_s']:.2f} / load {record['load_s']:.2f} / fwd-bwd {record['train_s']:.2f})  "
          f"{acc}", flush=True)


class EpochReport:
    """Rank 0's per-epoch callback: print the epoch line and, with a log file, append the record to it.

    Picklable (it crosses into the rank processes). Appending as epochs finish keeps the epochs done
    when a later one crashes.
    """

    def __init__(self, log_path: Optional[str] = None, tensorboard=None):
        self.log_path = log_path
        """JSON Lines file to append ``{"type": "epoch", ...}`` records to; None: print only."""
        self.tensorboard = tensorboard
        """A :class:`gsplit.run.plot.TensorBoardWriter` for the same numbers (``--tensorboard``), or None."""

    def __call__(self, record: dict) -> None:
        print_epoch(record)
        if self.log_path:
            append_jsonl(self.log_path, {"type": "epoch", **record})
        if self.tensorboard is not None:
            self.tensorboard.epoch(record)


def tensorboard_writer(args):
    """``--tensorboard DIR``'s writer (checked importable before any work), or None."""
    folder = getattr(args, "tensorboard", None)
    if not folder:
        return None
    from gsplit.run.plot import TensorBoardWriter

    TensorBoardWriter.check_available()
    return TensorBoardWriter(folder)
