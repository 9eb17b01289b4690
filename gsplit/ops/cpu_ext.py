"""Compiled CPU kernels (C++ with OpenMP in ``kernels/*.cpp``), built at first use.

The extensions are compiled on the user's machine by ``torch.utils.cpp_extension.load`` the first time a
process needs them (tens of seconds, then cached), so installing gsplit never builds against a torch
that pip picked in an isolated build environment. When the build fails (no compiler, no ninja, an
unusual platform) :func:`load` logs a warning once and returns ``None``, and callers run their
plain-torch fallback, which computes the same results.

``GSPLIT_NO_EXTENSIONS=1`` skips the build (the fallbacks run), e.g. to compare both paths;
``GSPLIT_SKIP_EXTENSIONS=name,...`` skips the named ones (``gsplit train`` sets it for its ranks when
:func:`prebuild` failed in the launching process, so the ranks neither retry nor warn again).

Builds are cached in ``~/.cache/gsplit/extensions/<build key>/<name>-<content digest>/`` (or under
``GSPLIT_EXTENSION_DIR``). The build key (:func:`build_key`) is what the binary depends on besides its
sources: a library built against one torch does not load in another (torch's C++ ABI changes between
versions: ``undefined symbol ... incref_pyobject`` when torch 2.2.1 met a 2.13 build), so two
environments with different torch versions never share a build. The content digest
(:func:`source_digest`) is the sources' bytes and the compiler flags. Nothing else enters: two
virtual environments with the same torch and Python (or a source checkout and an installed copy of the
same gsplit) share one build. torch's ``cpp_extension.load`` would not let them: its ninja file holds the
absolute paths of the sources and of the environment's torch headers, so every switch between two
environments rewrote it and recompiled (about 45 s each time). So a finished build is loaded straight
from its folder, and a new one compiles copies of the sources kept in that folder (``src/``), so the
paths it records do not depend on where gsplit is installed.

A build that runs inside a user's script (not :func:`prebuild`, whose caller reports it) says so once
at WARNING: what it builds, about how long it takes, and where it caches.

A library is code this process runs, so it is loaded only from a place no other user can change
(:func:`check_kernel_path`): the library, every folder from it up to the cache root and the root itself
must belong to this user (or to root) and be writable by nobody else; above the root a world-writable
folder is accepted only with the sticky bit (``/tmp``), where others cannot replace what is ours.
Otherwise the kernel is refused with one line (:class:`UnsafeKernelPath`, naming the path and what to do)
and the plain-torch fallback runs. Folders the cache creates are private (``0700``), and so are the
files it writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import stat
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

_lock = threading.Lock()  # a prefetching thread and the main thread may ask at once


def kernel_path(name: str) -> Path:
    """Path of a kernel source file (``kernels/`` in a checkout, ``gsplit._kernels`` when installed)."""
    from gsplit.ops.cuda import kernel_source_path

    return kernel_source_path(name)


def build_key() -> str:
    """What a compiled extension depends on besides its sources: torch version (and its CUDA and C++ ABI
    flag) and the Python ABI; one cache folder per key.

    Example:
        >>> build_key().startswith("torch2.")
        True
    """
    import torch

    abi = sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag  # e.g. cpython-311-x86_64-linux-gnu
    cxx11 = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False)))
    key = f"torch{torch.__version__}-cuda{torch.version.cuda or 'none'}-cxx11abi{cxx11}-{abi}"
    return "".join(c if c.isalnum() or c in ".-_" else "_" for c in key)  # '+' of local versions too


def source_digest(sources: Sequence[str]) -> str:
    """What a build of ``sources`` (file names in ``kernels/``) compiles: their names and bytes, and the flags.

    The same for every copy of the same kernels, wherever gsplit is installed.

    Example:
        >>> len(source_digest(["sample_cpu.cpp"]))
        16
    """
    h = hashlib.sha256(repr((_CFLAGS, _LDFLAGS)).encode())
    for s in sources:
        h.update(f"\0{s}\0".encode())
        h.update(kernel_path(s).read_bytes())
    return h.hexdigest()[:16]


def build_folder(name: str, sources: Sequence[str]) -> Path:
    """The folder where extension ``name`` built from ``sources`` is cached, for this torch and Python
    (:func:`build_key`) and these sources and flags (:func:`source_digest`).

    Example:
        >>> build_folder("gsplit_sample_cpu", ["sample_cpu.cpp"]).name.startswith("gsplit_sample_cpu-")
        True
    """
    return extension_root() / build_key() / f"{name}-{source_digest(sources)}"


def extension_root() -> Path:
    """The kernel cache's root: ``GSPLIT_EXTENSION_DIR``, else ``~/.cache/gsplit/extensions``.

    Example:
        >>> extension_root().is_absolute()
        True
    """
    env = os.environ.get("GSPLIT_EXTENSION_DIR")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "gsplit" / "extensions"


class UnsafeKernelPath(PermissionError):
    """A compiled kernel, or a folder on its way, that another user could have written: it is not loaded."""


def check_kernel_path(path: Path, root: Optional[Path] = None) -> None:
    """Raise :class:`UnsafeKernelPath` unless no other user can have changed ``path`` (a kernel library or a
    build folder at or below the cache ``root``, default :func:`extension_root`).

    ``path`` and every folder above it (symbolic links resolved) must be owned by this user or by root.
    At or below ``root`` none may be writable by the group or others; above it a folder writable by
    others is accepted only with the sticky bit (``/tmp``: others cannot rename or remove our entries).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> check_kernel_path(d, d)                  # mkdtemp makes it 0700: fine
        >>> d.chmod(0o777); check_kernel_path(d, d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        gsplit.ops.cpu_ext.UnsafeKernelPath: kernel folder ... is writable by its group and others (mode 0777)...chmod go-w ...
    """
    real = Path(os.path.realpath(path))
    real_root = Path(os.path.realpath(root if root is not None else extension_root()))
    me = os.geteuid()
    fix_owner = ("set GSPLIT_EXTENSION_DIR to a folder of your own (or unset it for ~/.cache/gsplit/extensions)")
    for p in (real, *real.parents):
        st = os.stat(p)
        kind = "kernel folder" if stat.S_ISDIR(st.st_mode) else "kernel file"
        if st.st_uid not in (me, 0):
            raise UnsafeKernelPath(f"{kind} {p} is owned by uid {st.st_uid}, not by you (uid {me}) or root: another "
                                   f"user could have planted the compiled kernel; not loading it; {fix_owner}")
        writable = st.st_mode & 0o022
        inside = p == real_root or real_root in p.parents
        if writable and (inside or not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)):
            who = {0o020: "its group", 0o002: "others", 0o022: "its group and others"}[writable]
            raise UnsafeKernelPath(f"{kind} {p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): another "
                                   f"user could plant a compiled kernel there; not loading it; run chmod go-w {p} or "
                                   f"{fix_owner}")


def _make_private_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents with mode ``0700`` (``Path.mkdir`` gives parents the umask's mode)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(p, 0o700)


_CFLAGS = ("-O3", "-fopenmp")  # the C++ standard is the one torch builds its headers with
_LDFLAGS = ("-fopenmp",)
_DONE = "built.json"  # written once a build loaded: the folder holds a finished library

BUILD_TIME = "about 40 s on 2 cores"
"""How long a first build of the kernels takes, as the CLI and the README say it (both CPU kernels, 2 cores)."""


@functools.lru_cache(maxsize=None)
def _build(name: str, sources: tuple):
    """The extension, loaded from its cache folder, or compiled there first (once per process)."""
    build_dir = build_folder(name, sources)
    library = build_dir / f"{name}{_library_suffix()}"
    if (build_dir / _DONE).is_file() and library.is_file():  # the common case: no lock, no ninja
        check_kernel_path(library)
        return _import_library(name, library)
    check_kernel_path(next(p for p in (build_dir, *build_dir.parents) if p.exists()))  # before creating in it
    _make_private_dirs(build_dir)
    check_kernel_path(build_dir)  # before anything is compiled into it (or its lock file is trusted)
    with _exclusive_build(build_dir):
        if (build_dir / _DONE).is_file() and library.is_file():  # another process built it while we waited
            check_kernel_path(library)
            return _import_library(name, library)
        return _compile(name, sources, build_dir)


def _compile(name: str, sources: tuple, build_dir: Path):
    import torch
    import torch.utils.cpp_extension as ext

    from gsplit.runtime.io import atomic_write_bytes, atomic_write_json

    log.warning("building the compiled CPU kernel %s for torch %s (%s, once per torch and kernel version; cached "
                "in %s)", name, torch.__version__, BUILD_TIME, build_dir)
    t0 = time.perf_counter()
    copies = []
    for s in sources:  # compiled from here: the paths ninja records are the same for every installation
        copy = build_dir / "src" / s
        copy.parent.mkdir(mode=0o700, exist_ok=True)
        atomic_write_bytes(copy, kernel_path(s).read_bytes(), private=True)
        copies.append(str(copy))
    module = ext.load(name=name, sources=copies, extra_cflags=list(_CFLAGS), extra_ldflags=list(_LDFLAGS),
                      build_directory=str(build_dir), verbose=False)
    seconds = time.perf_counter() - t0
    library = build_dir / f"{name}{_library_suffix()}"
    with contextlib.suppress(OSError):  # the linker gave it the umask's mode: group-writable under umask 002
        os.chmod(library, stat.S_IMODE(os.stat(library).st_mode) & ~0o022)
    atomic_write_json(build_dir / _DONE, {"name": name, "sources": list(sources), "torch": torch.__version__,
                                          "build_key": build_key(), "seconds": round(seconds, 1)}, private=True)
    log.info("built %s in %.1f s", name, seconds)
    return module


def _library_suffix() -> str:
    return ".pyd" if sys.platform == "win32" else ".so"  # what cpp_extension names a Python module's library


def _import_library(name: str, library: Path):
    """Load a finished extension module from its file (what ``cpp_extension.load`` does after its build)."""
    import importlib.util

    import torch  # noqa: F401 - the library links against torch's, which must be loaded first

    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library} as a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _exclusive_build(build_dir: Path):
    """Hold an exclusive ``flock`` on ``<build_dir>.lock`` for the duration of a build or load.

    torch's ``cpp_extension.load`` guards a build with a plain ``lock`` file in the build folder and waits,
    silently and forever, while that file exists; a build killed half-way (a signal, a test timeout) leaves
    it behind and every later process hangs. gsplit's builders take this kernel lock first (released by the
    kernel when a process dies), so whoever holds it knows no gsplit build is running, and a ``lock`` file
    found then is a leftover: it is removed with a warning.
    """
    with open(build_dir.with_name(build_dir.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing %s left by an interrupted build of %s", stale, build_dir.name)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(name: str, sources: Sequence[str]) -> Optional[object]:
    """The compiled extension ``name`` built from ``sources`` (file names in ``kernels/``), or ``None``.

    Example:
        >>> mod = load("gsplit_example", ["example.cpp"])   # doctest: +SKIP
    """
    if os.environ.get("GSPLIT_NO_EXTENSIONS") or name in _failed_before or \
            name in os.environ.get("GSPLIT_SKIP_EXTENSIONS", "").split(","):
        return None
    with _lock:
        return _build_or_none(name, tuple(sources))


@functools.lru_cache(maxsize=None)
def _build_or_none(name: str, sources: tuple):
    # A failed build is remembered too: callers ask once per kernel call, and a retry would recompile.
    try:
        return _build(name, sources)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the torch fallback
        _warn_once(name, f"{type(exc).__name__}: {exc}")
        return None


@functools.lru_cache(maxsize=None)
def _warn_once(name: str, reason: str) -> None:
    log.warning("cannot build the C++ extension %s (%s); using the plain-torch kernels instead", name,
                reason.splitlines()[0] if reason else "unknown error")


@dataclass
class BuildReport:
    """What :func:`prebuild` did: which extensions are ready, which failed and why, and how long it took."""

    ready: List[str]
    """Extensions loaded (built now, or found in the cache)."""
    failed: Dict[str, str]
    """``name -> reason`` of each extension that could not be built or loaded (its callers fall back to torch)."""
    seconds: float
    """Wall time of the whole preparation (a build from scratch takes tens of seconds, a cached load < 1 s)."""
    disabled: bool = False
    """``GSPLIT_NO_EXTENSIONS`` is set: nothing was tried."""


def prebuild(extensions: Sequence[Tuple[str, Sequence[str]]]) -> BuildReport:
    """Build (or load from the cache) every extension of ``extensions`` now, instead of at first use.

    Called before training starts (``gsplit train`` does, through :func:`gsplit.ops.prepare_kernels`), so
    that a first-use build is not timed as part of the first epoch and its outcome is said once. A
    failure is reported in the result (not logged) and remembered: later :func:`load` calls in this
    process return ``None`` without retrying.

    Example:
        >>> prebuild([]).ready
        []
    """
    t0 = time.perf_counter()
    if os.environ.get("GSPLIT_NO_EXTENSIONS"):
        return BuildReport(ready=[], failed={}, seconds=0.0, disabled=True)
    ready, failed = [], {}
    with _lock:
        for name, sources in extensions:
            try:
                _build(name, tuple(sources))
                ready.append(name)
            except Exception as exc:  # noqa: BLE001 - any build failure means: use the torch fallback
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
                failed[name] = reason
                _failed_before[name] = reason
    return BuildReport(ready=ready, failed=failed, seconds=time.perf_counter() - t0)


# name -> reason, for extensions prebuild() could not build: load() then gives None without a retry or a
# second warning (the caller of prebuild has said it once).
_failed_before: Dict[str, str] = {}


def is_built(name: str, sources: Sequence[str]) -> bool:
    """Whether a finished build of extension ``name`` is in its cache folder (then loading it takes well under a
    second, and no build message is due).

    Example:
        >>> is_built("no_such_kernel", ["sample_cpu.cpp"])
        False
    """
    build_dir = build_folder(name, sources)
    return (build_dir / _DONE).is_file() and (build_dir / f"{name}{_library_suffix()}").is_file()
