"""Old module paths that moved into packages keep importing, with a DeprecationWarning.

gsplit's modules used to sit loose in ``gsplit/`` (``gsplit.trainer``, ``gsplit.graph``, ...) and the launcher
was the package ``gsplit.launch``, the same name as the function :func:`gsplit.launch`. A user's script that
imports an old path gets the new module itself (one module object, so ``isinstance`` and monkeypatching work
as before). The finder only answers for the names in :data:`MOVED`; everything else is imported as usual.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     from gsplit.checkpoint import Checkpoint
    >>> Checkpoint.__module__
    'gsplit.run.checkpoint'
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

MOVED = {
    "gsplit.graph": "gsplit.data.graph",
    "gsplit.feature_store": "gsplit.data.feature_store",
    "gsplit.finite": "gsplit.data.finite",
    "gsplit.resources": "gsplit.runtime.resources",
    "gsplit.timing": "gsplit.runtime.timing",
    "gsplit.io": "gsplit.runtime.io",
    "gsplit.loader": "gsplit.minibatch.loader",
    "gsplit.prefetch": "gsplit.minibatch.prefetch",
    "gsplit.overlap": "gsplit.minibatch.overlap",
    "gsplit.parallel": "gsplit.minibatch.parallel",
    "gsplit.inference": "gsplit.minibatch.inference",
    "gsplit.fullgraph_overlap": "gsplit.fullgraph.overlap",
    "gsplit.trainer": "gsplit.run.trainer",
    "gsplit.systems": "gsplit.run.systems",
    "gsplit.counters": "gsplit.run.counters",
    "gsplit.checkpoint": "gsplit.run.checkpoint",
    "gsplit.resume": "gsplit.run.resume",
    "gsplit.model_io": "gsplit.run.model_io",
    "gsplit.predict": "gsplit.run.predict",
    "gsplit.plot": "gsplit.run.plot",
    "gsplit.sampling.counter_rng": "gsplit.ops.counter_rng",
    "gsplit.launch": "gsplit.launcher",
}
"""Old module path -> where it lives now. ``gsplit.launch.X`` maps to ``gsplit.launcher.X`` for any X."""


def new_name(old: str) -> str | None:
    """Where module ``old`` lives now, or None if it did not move.

    Example:
        >>> new_name("gsplit.launch.start"), new_name("gsplit.nn")
        ('gsplit.launcher.start', None)
    """
    if old in MOVED:
        return MOVED[old]
    if old.startswith("gsplit.launch."):
        return "gsplit.launcher." + old[len("gsplit.launch."):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # the target ran when it was imported


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers an import of an old path with the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        target_name = new_name(fullname)
        if target_name is None:
            return None
        warnings.warn(f"{fullname} moved to {target_name}; import it from there (the old path goes in a later "
                      f"release)", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(target_name))


def install_finder() -> None:
    """Register the finder (once per interpreter; :mod:`gsplit` calls it first thing)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())  # first: the launcher answers to its old name in sys.modules, and
        # the path finder would load its submodules a second time under old names


def alias_launcher() -> None:
    """Enter the launcher in ``sys.modules`` as ``gsplit.launch`` too (:mod:`gsplit` calls it once the launcher
    is imported).

    ``gsplit.launch`` must stay the function on the package, but an import system that loads a module named
    ``gsplit.launch`` sets the package's attribute to that module. With the launcher already in
    ``sys.modules`` under the old name, ``import gsplit.launch`` finds it there and leaves the attribute alone.
    """
    sys.modules.setdefault("gsplit.launch", sys.modules["gsplit.launcher"])
