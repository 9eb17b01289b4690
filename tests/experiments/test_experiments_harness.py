"""Every script in experiments/ runs on the one harness, experiments/harness/ (issue 32, item 4).

A script takes its arguments from ``harness.setup.make_parser`` and writes its JSON through
``harness.report.save_json`` (a DGL peer: ``harness.peer.make_parser`` and ``harness.peer.write_json``), with
the machine, its load and the command line that the harness adds; it times, runs other processes and reads
the host through the harness, not through its own copy. A new script with its own argument parser, JSON
writer, load average or subprocess runner fails here, as does a DGL peer that would import gsplit.
"""

import ast
import doctest
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
HARNESS = EXPERIMENTS / "harness"
LIBRARIES = {"layer_ops_models": "bench_layer_ops.py's block file and timing loop, shared with its DGL peer"}
"""Modules of experiments/ that are no script (no ``__main__``), and what they are."""
NO_JSON = {"gpu_first_run": "writes a Markdown report; the JSON is gpu_bench.py's, which it runs"}
"""Scripts whose output is not the harness's JSON, and why."""
LEGACY: dict = {}
"""Scripts not yet on the harness, and why."""
FORBIDDEN_CALLS = {
    ("argparse", "ArgumentParser"): "setup.make_parser (peer.make_parser in a DGL peer)",
    ("json", "dump"): "report.write_json / report.save_json",
    ("os", "getloadavg"): "report.load_average (report.save_json records it)",
    ("os", "sched_getaffinity"): "report.cpu_cores",
    ("subprocess", "run"): "rounds.run_command",
    ("common", None): "the harness (experiments/harness/)",
}
"""``module.function`` calls a script makes itself only through the harness (``None``: any function)."""


def _scripts():
    out = []
    for path in sorted(EXPERIMENTS.glob("*.py")):
        if path.stem in LIBRARIES:
            continue
        tree = ast.parse(path.read_text())
        main_guard = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)
        assert main_guard, (f"experiments/{path.name} has no `if __name__ == '__main__'`: a script, "
                            "or add it to LIBRARIES")
        out.append(path)
    return out


SCRIPTS = _scripts()
PEERS = [p for p in SCRIPTS if p.stem.startswith("dgl_")]


def _calls(tree) -> set:
    """``(object, attribute)`` of every ``object.attribute(...)`` call, and ``(None, name)`` of ``name(...)``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.add((f.value.id, f.attr))
            elif isinstance(f, ast.Name):
                out.add((None, f.id))
    return out


def _writes_json_text(tree) -> bool:
    """``x.write_text(json.dumps(...))`` or ``f.write(json.dumps(...))``: a JSON file written by hand."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("write_text", "write") and node.args
                and isinstance(node.args[0], ast.Call) and "json.dumps" in ast.unparse(node.args[0].func)):
            return True
    return False


def _first_import_beyond_the_standard_library(tree) -> str:
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        if any(r not in sys.stdlib_module_names for r in roots):
            return ast.unparse(node)
    return ""


def _harness_functions() -> set:
    names = set()
    for path in HARNESS.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                names.add(node.name)
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_script_takes_its_arguments_and_writes_its_output_through_the_harness(path):
    if path.stem in LEGACY:
        pytest.skip(LEGACY[path.stem])
    tree = ast.parse(path.read_text())
    calls = _calls(tree)
    side = "peer" if path in PEERS else "setup"
    assert (side, "make_parser") in calls, f"{path.name}: arguments through {side}.make_parser"
    if path.stem not in NO_JSON:
        writer = ("peer", "write_json") if path in PEERS else ("report", "save_json")
        assert writer in calls, f"{path.name}: output through {'.'.join(writer)}"
    assert _first_import_beyond_the_standard_library(tree).startswith("from harness import"), (
        f"{path.name}: import the harness before torch, numpy or gsplit (it sets OpenMP's wait policy first)")
    for (module, name), use in FORBIDDEN_CALLS.items():
        hits = sorted(f"{m}.{n}" for m, n in calls if m == module and (name is None or n == name))
        assert not hits, f"{path.name} calls {hits}: use {use}"
    assert (None, "ArgumentParser") not in calls, f"{path.name}: arguments through setup.make_parser"
    assert not _writes_json_text(tree), f"{path.name} writes a JSON file itself: use report.write_json"
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    copies = sorted(_harness_functions() & defined)
    assert not copies, f"{path.name} defines {copies}, which the harness has: use the harness's"


@pytest.fixture
def isolated_imports():
    """Import experiment modules here and forget them after (sys.path, the experiments' modules, the environment).

    Only modules of experiments/ are forgotten: torch, numpy or gsplit imported by a script stay (a second
    import of torch in one process fails)."""
    path, modules, environ = list(sys.path), set(sys.modules), dict(os.environ)
    sys.path.insert(0, str(EXPERIMENTS))
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if Path(origin).resolve().is_relative_to(EXPERIMENTS):
            del sys.modules[name]
    os.environ.clear()
    os.environ.update(environ)


def test_every_script_imports_without_running_and_has_a_main(isolated_imports):
    for path in SCRIPTS:
        module = importlib.import_module(path.stem)
        assert callable(getattr(module, "main", None)), f"experiments/{path.name} has no main()"


def test_harness_examples_hold(isolated_imports):
    for name in ("setup", "rounds", "report"):
        module = importlib.import_module(f"harness.{name}")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, (name, result)


@pytest.mark.parametrize("name, examples", [("validation.logs", 2), ("validation.table", 4), ("host_corun", 1)])
def test_the_cost_model_validation_examples_hold(isolated_imports, name, examples):
    """The validation's helpers (estimate_validation.py's parts: the logs' reading, the summary, host-speed ratio
    and terms table; host_corun's summary) do what their examples say: they decide what the validation reports."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= examples and result.failed == 0, result


def test_peers_and_the_first_gpu_run_load_neither_gsplit_nor_a_plotting_library():
    """The DGL peers run under DGL's venv (torch 2.2; gsplit needs a newer torch), so importing one must not
    import gsplit; gpu_first_run.py reports even when gsplit or torch does not import, so importing it loads
    neither."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gpu_first_run; "
            "assert not {'gsplit', 'torch', 'matplotlib'} & set(sys.modules), sorted(sys.modules); "
            "[__import__(m) for m in sys.argv[2:]]; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('gsplit', 'matplotlib')); "
            "assert not bad, bad")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(EXPERIMENTS), *(p.stem for p in PEERS)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


PART_MODULES = sorted(p for p in EXPERIMENTS.glob("*/*.py") if p.parent != HARNESS and p.parent.name != "results")
"""Modules of a script's parts (``experiments/gpu/`` for gpu_bench.py): held to the scripts' rules on the harness."""

MAX_LINES = 410
"""No experiment script or part module longer (a longer one is split into its parts, shared code to the harness)."""


def test_the_parts_of_a_script_use_the_harness_and_copy_none_of_it():
    assert PART_MODULES, "experiments/gpu/ holds gpu_bench.py's parts"
    for path in PART_MODULES:
        tree = ast.parse(path.read_text())
        calls = _calls(tree)
        for (module, name), use in FORBIDDEN_CALLS.items():
            hits = sorted(f"{m}.{n}" for m, n in calls if m == module and (name is None or n == name))
            assert not hits, f"{path.relative_to(EXPERIMENTS)} calls {hits}: use {use}"
        assert (None, "ArgumentParser") not in calls, f"{path.relative_to(EXPERIMENTS)}: the script parses arguments"
        assert not _writes_json_text(tree), f"{path.relative_to(EXPERIMENTS)} writes a JSON file itself"
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        copies = sorted(_harness_functions() & defined)
        assert not copies, f"{path.relative_to(EXPERIMENTS)} defines {copies}, which the harness has"


def test_no_experiment_script_is_longer_than_its_job():
    long = {str(p.relative_to(EXPERIMENTS)): n for p in [*SCRIPTS, *PART_MODULES, *HARNESS.glob("*.py")]
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}; split them into their parts (see experiments/gpu/)"


@pytest.mark.parametrize("system", ["gsplit", "pyg"])
def test_full_graph_step_under_bf16_runs_the_products_in_bfloat16(isolated_imports, system):
    """gpu_bench.py's ``full_graph_bf16`` part times ``harness.runs.full_graph_step(..., precision="bf16")``: both
    models' linear layers must run under bfloat16 autocast on the bfloat16 features (and the weights stay
    float32 and move), or the part would time float32 under a bf16 label."""
    if system == "pyg":
        pytest.importorskip("torch_geometric")
    import torch

    import gsplit

    runs = importlib.import_module("harness.runs")
    ds = gsplit.datasets.load("synthetic", num_nodes=300, feature_dim=8, seed=0, feature_dtype="bfloat16")
    seen, params = [], []

    def linear(mod, args, out):  # torch's nn.Linear and PyG's own Linear
        if type(mod).__name__ == "Linear":
            seen.append(out.dtype)
            params.extend(mod.parameters(recurse=False))

    hook = torch.nn.modules.module.register_module_forward_hook(linear)
    try:
        step = runs.full_graph_step(system, ds, torch.device("cpu"), hidden=16, num_layers=2, precision="bf16")
        step()
        before = [p.detach().clone() for p in params]
        step()
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}, seen
    assert all(p.dtype == torch.float32 for p in params)
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, params)), "the optimiser steps"
