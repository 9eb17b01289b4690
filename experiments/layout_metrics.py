"""The house in numbers: modules, packages, import depth, cycles and the largest modules of `gsplit/`.

    python experiments/layout_metrics.py [--root CHECKOUT] [--out experiments/results/layout_metrics]

Reads the source as text (ast), runs none of it. Every `import`/`from ... import` of a gsplit module counts, at
module level or inside a function (a lazy import is still a dependency a reader must follow). Prints a table and
writes the numbers as JSON; the layout test uses `import_graph` and `cycles` to keep the tree acyclic. To compare
with an earlier commit: `git worktree add /tmp/old REV` (or `git archive REV | tar -x -C DIR`), then `--root`.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import report, setup

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    """`gsplit/ops/rows.py` -> `gsplit.ops.rows`; a package's `__init__.py` -> the package's name."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of a dotted name that is a module of the tree (`gsplit.comm.shuffle_rows` -> `gsplit.comm`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _runtime_nodes(tree: ast.AST):
    """Every node of the tree except the bodies of ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph(package: str = "gsplit", root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the tree's modules it imports (absolute and relative imports, at any depth of the code; those
    under ``if TYPE_CHECKING:`` left out).

    Example:
        >>> graph = import_graph()
        >>> "gsplit.ops" in graph["gsplit.ops.rows"] or True
        True
    """
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` depends on pkg.sub alone; `from pkg import name` on pkg
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                found = _resolve(target, modules)
                if found == package and name != package:
                    deps.add(found)  # a name taken from the front door: an import pointing back up
                # importing a.b.c runs a/b/__init__ too: a dependency on every package above the target
                # that does not already contain the importing module
                while found and found != name and not name.startswith(found + "."):
                    deps.add(found)
                    found = found.rpartition(".")[0]
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]], ignore_parents: bool = True) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan). A package's `__init__` importing its own
    submodules and those submodules importing a sibling through the package is the ordinary re-export
    pattern, not a cycle a reader trips on, so edges from a module to its own parent packages are left out
    when `ignore_parents`."""
    def parents(m: str) -> set[str]:
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    edges = {m: {d for d in deps if not (ignore_parents and d in parents(m))} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def depth(graph: dict[str, set[str]], packages: frozenset[str] = frozenset()) -> int:
    """The longest chain of imports, in modules on it (a package's ``__init__`` in ``packages`` is passed
    through without counting: it is the door to its modules, not a level of its own), back edges ignored."""
    memo: dict[str, int] = {}

    def longest(v: str, seen: frozenset[str]) -> int:
        if v in memo:
            return memo[v]
        own = 0 if v in packages else 1
        best = own + max((longest(w, seen | {v}) for w in graph[v] if w not in seen and w != v), default=0)
        memo[v] = best
        return best

    return max((longest(v, frozenset()) for v in graph), default=0)


@dataclass
class LayoutMetrics:
    """What the house measures."""

    lines: int
    """Lines of `gsplit/**/*.py`."""
    modules: int
    """Python files under `gsplit/`."""
    packages: int
    """Folders of `gsplit/` with an `__init__.py` (the root included)."""
    root_modules: list[str]
    """Modules sitting loose in `gsplit/` (besides `__init__`)."""
    import_depth: int
    """Modules on the longest import chain (packages' ``__init__`` not counted)."""
    imports_up: int
    """Imports of the root package (`gsplit`) from inside a subpackage: code pointing back up at the front door."""
    cycles: list[list[str]]
    """Groups of modules that import each other (parent-package re-exports left out)."""
    largest: list[tuple[str, int]]
    """The ten largest modules and their lines."""
    results_files: int
    """Files under experiments/results/."""
    experiment_lines: int
    """Lines of experiments/**/*.py."""
    largest_experiment: tuple[str, int]
    """The longest experiment script."""
    test_files: int
    """test_*.py files under tests/."""


def measure(root: Path = ROOT) -> LayoutMetrics:
    graph = import_graph("gsplit", root)
    files = sorted((root / "gsplit").rglob("*.py"))
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in files}
    exp = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in (root / "experiments").rglob("*.py")}
    results = root / "experiments" / "results"
    return LayoutMetrics(
        lines=sum(sizes.values()),
        modules=len(files),
        packages=sum(1 for p in (root / "gsplit").rglob("__init__.py")),
        root_modules=sorted(p.stem for p in (root / "gsplit").glob("*.py") if p.stem != "__init__"),
        import_depth=depth(graph, frozenset(module_name(p, root) for p in (root / "gsplit").rglob("__init__.py"))),
        imports_up=sum(1 for m, deps in graph.items() if m.count(".") >= 1 and "gsplit" in deps),
        cycles=cycles(graph),
        largest=sorted(sizes.items(), key=lambda kv: -kv[1])[:10],
        results_files=sum(1 for p in results.rglob("*") if p.is_file()) if results.exists() else 0,
        experiment_lines=sum(exp.values()),
        largest_experiment=max(exp.items(), key=lambda kv: kv[1]) if exp else ("", 0),
        test_files=sum(1 for _ in (root / "tests").rglob("test_*.py")),
    )


def main(argv: list[str] | None = None) -> int:
    parser = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "layout_metrics", seed=False,
                               quick_help="no effect: the measurement takes a second")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    m = measure(args.root.resolve())
    rows = [["lines in gsplit/", m.lines], ["modules", m.modules], ["packages", m.packages],
            ["modules loose in gsplit/", len(m.root_modules)], ["import depth (modules)", m.import_depth],
            ["imports of the front door from inside the package", m.imports_up], ["import cycles", len(m.cycles)],
            ["files in experiments/results/", m.results_files], ["lines in experiments/", m.experiment_lines],
            ["longest experiment", f"{m.largest_experiment[0]} ({m.largest_experiment[1]})"],
            ["test files", m.test_files]]
    print(report.format_table(["measure", "value"], rows))
    for group in m.cycles:
        print("cycle:", " <-> ".join(group))
    print("largest modules:", ", ".join(f"{p} ({n})" for p, n in m.largest[:5]))
    report.save_json(Path(str(args.out).removesuffix(".json")), {"root": str(args.root), **asdict(m)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
