"""A run can be seen, reproduced and reused: ``gsplit --version``, help with defaults, the run log's record of
what built the run, the self-describing ``model.pt``, ``gsplit eval`` / ``predict`` / ``plot`` and
``--tensorboard`` (issue 21)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

import gsplit
from gsplit.cli import build_parser, main
from gsplit.runtime.io import read_run_log
from gsplit.run.model_io import load_model

DATA = ["--dataset", "synthetic", "-D", "num_nodes=1500", "-D", "feature_dim=8", "-D", "num_classes=4"]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"gsplit {gsplit.__version__} (torch {torch.__version__}")


def test_every_option_of_every_subcommand_has_help_with_its_default():
    """Fails on the old main: half of train's options had no help, and none showed a computed default."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"prepare", "train", "stats", "bench", "eval", "predict", "plot"} <= set(subs)
    missing = []
    for name, p in subs.items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            text = action.help or ""
            if not text or not ("default" in text or "required" in text or not action.option_strings):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: {text!r}")
        p.format_help()  # every %(default)s expands
    assert not missing, "options without a help line that shows the default:\n" + "\n".join(missing)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small run on one rank with every output asked for."""
    tmp = tmp_path_factory.mktemp("run")
    argv = ["train", *DATA, "--epochs", "2", "--batch-size", "64", "--fanouts", "4,4", "--num-ranks", "1",
            "--device", "cpu", "--hidden", "16", "--seed", "3", "--checkpoint", str(tmp / "ck"),
            "--log", str(tmp / "run.jsonl")]
    tb = None
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401

        tb = tmp / "tb"
        argv += ["--tensorboard", str(tb)]
    except ImportError:
        pass
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return {"dir": tmp, "stdout": out.getvalue(), "tb": tb, "log": read_run_log(tmp / "run.jsonl")}


def test_final_accuracy_is_printed(trained):
    log = trained["log"]
    line = [ln for ln in trained["stdout"].splitlines() if ln.startswith("final accuracy")]
    assert line == [f"final accuracy (layer-wise inference over the whole graph): val {log['final_val_acc']:.4f}  "
                    f"test {log['final_test_acc']:.4f}"]


def test_run_log_rebuilds_the_run(trained):
    """Fails on the old main: the log had no dataset options, versions or command."""
    log = trained["log"]
    spec = log["dataset_spec"]
    assert spec == {"name": "synthetic", "options": {"num_nodes": 1500, "feature_dim": 8, "num_classes": 4}}
    again = gsplit.datasets.load(spec["name"], **spec["options"])
    assert again.graph.fingerprint() == gsplit.datasets.load("synthetic", num_nodes=1500, feature_dim=8,
                                                             num_classes=4).graph.fingerprint()
    assert log["seed"] == 3 and log["config"]["seed"] == 3 and log["config"]["fanouts"] == [4, 4]
    assert log["versions"]["torch"] == str(torch.__version__) and log["versions"]["gsplit"] == gsplit.__version__
    assert log["command"].startswith("gsplit ") and log["options"]["hidden"] == 16
    json.dumps(log)  # all of it is plain JSON


def test_model_file_describes_itself(trained):
    """Fails on the old main: model.pt was a bare state_dict."""
    mf = load_model(trained["dir"] / "ck")               # nothing about the model is given here
    assert type(mf.model).__name__ == "SAGE" and mf.spec["hidden"] == 16 and mf.spec["num_layers"] == 2
    assert mf.train_config["fanouts"] == [4, 4] and mf.dataset["options"]["num_nodes"] == 1500
    ds = gsplit.datasets.load(mf.dataset["name"], **mf.dataset["options"])
    res = gsplit.layerwise_inference(mf.model, ds.graph, ds.features)
    acc = gsplit.minibatch.inference.accuracy(res, ds.labels, ds.test_idx)
    assert acc == pytest.approx(trained["log"]["final_test_acc"], abs=1e-12)  # the same model as trained


def test_eval_reproduces_the_final_accuracy(trained, capsys):
    assert main(["eval", "--checkpoint", str(trained["dir"] / "ck"), "--num-ranks", "1", "--device", "cpu",
                 "--split", "val,test"]) == 0
    out = capsys.readouterr().out
    log = trained["log"]
    assert f"val accuracy {log['final_val_acc']:.4f}" in out and f"test accuracy {log['final_test_acc']:.4f}" in out


@pytest.mark.slow
def test_eval_split_parallel_equals_one_process(trained):
    from gsplit.run.predict import evaluate_model

    ds = gsplit.datasets.load("synthetic", num_nodes=1500, feature_dim=8, num_classes=4)
    ids = {"test": ds.test_idx, "some": torch.arange(0, 1500, 7)}
    one = evaluate_model(trained["dir"] / "ck" / "model.pt", ds, ids, predict_ids=ids["some"], device="cpu")
    two = evaluate_model(trained["dir"] / "ck" / "model.pt", ds, ids, predict_ids=ids["some"], num_ranks=2,
                         device="cpu")
    assert one.accuracy == pytest.approx(two.accuracy, abs=1e-12)
    assert torch.allclose(one.predictions, two.predictions, atol=1e-5)


def test_predict_writes_any_vertex_set(trained, tmp_path, capsys):
    ids = np.array([5, 0, 1499, 7])
    np.save(tmp_path / "ids.npy", ids)
    ck = str(trained["dir"] / "ck")
    assert main(["predict", "--checkpoint", ck, "--num-ranks", "1", "--device", "cpu", "--ids",
                 str(tmp_path / "ids.npy"), "--out", str(tmp_path / "p.npz")]) == 0
    got = np.load(tmp_path / "p.npz")
    assert got["ids"].tolist() == ids.tolist() and got["logits"].shape == (4, 4)
    mf = load_model(ck)
    ds = gsplit.datasets.load("synthetic", num_nodes=1500, feature_dim=8, num_classes=4)
    expected = gsplit.layerwise_inference(mf.model, ds.graph, ds.features).output[torch.from_numpy(ids)]
    assert got["prediction"].tolist() == expected.argmax(1).tolist()
    assert main(["predict", "--checkpoint", ck, "--num-ranks", "1", "--device", "cpu", "--out",
                 str(tmp_path / "p.csv")]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "vertex,prediction" and len(lines) == 1501


def test_plot_draws_a_png(trained, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.png"
    assert main(["plot", str(trained["dir"] / "run.jsonl"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "loss, accuracy, time per epoch" in capsys.readouterr().out


def test_tensorboard_has_the_same_figures(trained):
    if trained["tb"] is None:
        pytest.skip("tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags, values = set(), {}
    for events in trained["tb"].glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.add(tag)
            values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    assert {"loss", "accuracy/val", "accuracy/test", "time/epoch", "time/sample", "time/load",
            "time/forward-backward", "final_accuracy/test"} <= tags
    log = trained["log"]
    assert values["loss"] == pytest.approx([e["loss"] for e in log["epochs"]], rel=1e-6)
    assert values["final_accuracy/test"] == pytest.approx([log["final_test_acc"]], rel=1e-6)


def test_reuse_commands_refuse_mistakes_in_one_line(trained, tmp_path, capsys):
    ck = str(trained["dir"] / "ck")
    bare = tmp_path / "bare.pt"
    torch.save(load_model(ck).model.state_dict(), bare)
    cases = [
        (["eval", "--checkpoint", str(bare)], "bare state_dict"),
        (["eval", "--checkpoint", str(tmp_path / "nothing")], "does not exist"),
        (["eval", "--checkpoint", ck, "--split", "tset"], "unknown set"),
        (["predict", "--checkpoint", ck, "--out", str(tmp_path / "p.txt")], "write .csv, .npy or .npz"),
        (["plot", str(tmp_path / "missing.jsonl")], "no such run log"),
        (["eval", "--checkpoint", ck, "--dataset", "synthetic", "-D", "num_nodes=500", "-D", "feature_dim=3"],
         "takes 8 input features"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gsplit: error:") and message in err[0], (argv, err)


def test_kernels_are_prepared_before_any_timed_work_and_a_failure_is_said_once(tmp_path, monkeypatch, capsys):
    """Fails on the old main: the first-use build ran silently inside the first epoch (or the split
    statistics), and every rank warned about a failed build on its own."""
    from gsplit.ops import aggregate, cpu_ext

    monkeypatch.delenv("GSPLIT_NO_EXTENSIONS", raising=False)
    monkeypatch.delenv("GSPLIT_SKIP_EXTENSIONS", raising=False)
    calls = []

    def failing_build(name, sources):
        calls.append(name)
        raise RuntimeError(f"no compiler for {name}\nsecond line of the compiler's output")

    monkeypatch.setattr(cpu_ext, "_build", failing_build)
    monkeypatch.setattr(cpu_ext, "is_built", lambda name, sources: False)  # a first use: nothing in the cache
    monkeypatch.setattr(cpu_ext, "_failed_before", {})
    cpu_ext._build_or_none.cache_clear()
    aggregate._cached_extension.cache_clear()
    try:
        argv = ["train", *DATA, "--epochs", "1", "--batch-size", "64", "--fanouts", "4,4", "--num-ranks", "1",
                "--device", "cpu", "--hidden", "8", "--eval-every", "0"]
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert sorted(calls) == ["gsplit_aggregate", "gsplit_sample_cpu"]   # tried once each, by the CLI only
        said = [line for line in err.splitlines() if "compiled CPU kernel" in line or "cannot build" in line]
        assert len(said) == 2 and all("RuntimeError: no compiler for" in line and "plain-torch" in line
                                      for line in said), err
        assert "second line" not in err
        lines = out.splitlines()
        first_kernel = next(i for i, line in enumerate(lines) if line.startswith("preparing the compiled CPU kernels"))
        assert first_kernel < next(i for i, line in enumerate(lines) if line.startswith("training sage"))
        import os
        assert set(os.environ["GSPLIT_SKIP_EXTENSIONS"].split(",")) == {"gsplit_aggregate", "gsplit_sample_cpu"}
    finally:
        cpu_ext._build_or_none.cache_clear()
        aggregate._cached_extension.cache_clear()


def test_kernels_report_when_they_load(monkeypatch, capsys):
    from gsplit.cli.common import _prepare_kernels

    monkeypatch.delenv("GSPLIT_NO_EXTENSIONS", raising=False)
    monkeypatch.delenv("GSPLIT_SKIP_EXTENSIONS", raising=False)
    _prepare_kernels()
    out = capsys.readouterr()
    assert "compiled CPU kernels gsplit_sample_cpu, gsplit_aggregate" in out.out or "unavailable" in out.err
    if "loaded from the cache" in out.out:  # old: "the first build takes about a minute" before every cached load
        assert "first build" not in out.out, out.out


def test_the_cli_and_the_readme_give_the_same_build_time():
    """Old: the CLI said 'about a minute', the README 'about 40 s on 2 cores'."""
    from pathlib import Path

    from gsplit.ops.cpu_ext import BUILD_TIME

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"({BUILD_TIME}," in readme


SPAWN_WITH_TQDM = '''
import gsplit
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm


def run(rank):
    for _ in tqdm(range(3), disable=rank != 0):
        pass
    for _ in auto_tqdm(range(3)):
        pass


if __name__ == "__main__":
    gsplit.spawn(run, nprocs=2)
    print("done")
'''


def test_tqdm_in_ranks_leaks_no_semaphore(tmp_path):
    """Fails on the old main: resource_tracker: There appear to be 2 leaked semaphore objects."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "bars.py").write_text(SPAWN_WITH_TQDM)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "bars.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "leaked semaphore" not in proc.stderr, proc.stderr
