"""Files that are complete or absent, and loads that check what they read.

Every file gsplit writes (graphs, partition maps, pre-sampling weights, run logs) goes through this
module. A single file is written atomically: to a temporary file in the same folder, flushed to disk
(``fsync``), renamed over the target (atomic on POSIX and Windows), and the folder entry synced, so a
crash leaves either the old file or the new one, never half of one. Files get the permissions the
user's umask gives a new file (``0644`` under umask ``022``: a shared dataset folder is readable by
colleagues) unless the writer asks for a private one (``private=True``: ``0600``, for checkpoints and the
compiled kernels' cache). A *folder* of arrays is complete
only when its metadata file exists: writers remove an old one first, write the arrays, and write the
metadata LAST; a reader that finds arrays without metadata knows the writer died and says so.

Loads validate: an ``.npy`` is read with ``allow_pickle=False`` and its dtype and shape checked, JSON
must parse and hold the required keys. Every failure is one ``ValueError`` (``FileNotFoundError`` for
a missing folder) whose message names the file, what is wrong with it and what to do.

The run log of ``gsplit train --log`` is JSON Lines: one record per line, appended and flushed as
epochs finish, so a crash keeps the epochs done; :func:`read_run_log` turns it back into one dict.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["atomic_file", "atomic_write_bytes", "atomic_write_json", "atomic_save_npy", "write_array_dir", "read_meta",
           "load_npy", "check_writable", "append_jsonl", "read_run_log", "trim_run_log", "file_stamp",
           "stamp_status", "file_error_line"]

PathLike = Union[str, os.PathLike]


def _fsync_dir(folder: Path) -> None:
    """Make a rename or unlink in ``folder`` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems do not support fsync on a folder
        pass
    finally:
        os.close(fd)


def _new_temp_file(path: Path, private: bool) -> Tuple[int, str]:
    """A new, empty temporary file beside ``path`` (``.NAME.RANDOM.tmp``), open for writing: ``(fd, name)``.

    Created with mode ``0600`` when ``private``, else ``0666`` less the umask, as ``open()`` creates files
    (``tempfile.mkstemp`` always gives ``0600``, which made every dataset folder unreadable to colleagues).
    """
    mode = 0o600 if private else 0o666
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, mode), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name after 100 tries", str(path))


@contextlib.contextmanager
def atomic_file(path: PathLike, private: bool = False) -> Iterator[Any]:
    """Yield a binary file that replaces ``path`` only when the block finishes without an exception.

    For writers that need a file object (``torch.save``, ``np.save``); the same guarantees as
    :func:`atomic_write_bytes`. A failed write is an ``OSError`` naming ``path``, also where the writer
    wrapped it (``torch.save`` on a full disk raises ``RuntimeError: ... unexpected pos`` while handling the
    ``OSError``). The file gets the umask's permissions, or ``0600`` with ``private=True``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "state.bin"
        >>> with atomic_file(p, private=True) as f:
        ...     _ = f.write(b"secret")
        >>> oct(p.stat().st_mode & 0o777)
        '0o600'
    """
    path = Path(path)
    fd, tmp = _new_temp_file(path, private)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 - re-raised unless an OSError lies under it
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os_error = _os_error_under(e)
        if os_error is None:
            raise
        raise _naming(os_error, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _os_error_under(e: BaseException) -> Optional[OSError]:
    """``e`` if it is an ``OSError``, else the first one it was raised from or while handling, else None.

    Example:
        >>> try:
        ...     try:
        ...         raise OSError(errno.ENOSPC, "No space left on device")
        ...     except OSError:
        ...         raise RuntimeError("unexpected pos 8000 vs 7952")
        ... except RuntimeError as e:
        ...     _os_error_under(e).errno == errno.ENOSPC
        True
    """
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` with the file it was about; a short write that numpy reports without an errno is called ENOSPC
    when the folder's file system is (nearly) full, as it then is."""
    code, text = e.errno, e.strerror or str(e)
    if code is None:
        with contextlib.suppress(OSError):
            st = os.statvfs(path.parent)
            if st.f_bavail * st.f_frsize < (1 << 20):
                code, text = errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({text})"
    return OSError(code, text, str(path))


def atomic_write_bytes(path: PathLike, data: Union[bytes, str], private: bool = False) -> None:
    """Write ``data`` (``str`` is UTF-8 encoded) to ``path`` atomically: the old content or the new, never a mix.

    The file gets the umask's permissions (``0644`` under umask ``022``), or ``0600`` with ``private=True``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> atomic_write_bytes(p, "hello"); p.read_text()
        'hello'
    """
    with atomic_file(path, private) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def atomic_write_json(path: PathLike, obj: Any, default=None, private: bool = False) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (``default`` as in :func:`json.dumps`; ``private``
    as in :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=default), private)


def atomic_save_npy(path: PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an ``.npy`` file to ``path`` atomically (object arrays are refused: no pickles)."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        raise TypeError(f"{path}: refusing to save an object array (it would need pickling); pass numbers")
    with atomic_file(path) as f:
        np.save(f, array, allow_pickle=False)


def write_array_dir(path: PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                    meta_name: str = "meta.json", default=None, stamp: bool = False) -> None:
    """Write folder ``path``: every ``name -> array`` as ``name`` (``.npy``), then ``meta_name`` LAST.

    An existing ``meta_name`` is removed first, so a writer that dies midway leaves a folder that
    :func:`read_meta` reports as incomplete instead of old metadata describing new arrays. With
    ``stamp``, the metadata also records, under ``"files"``, the :func:`file_stamp` of every ``.npy``
    in the folder and its subfolders (those written before, too), so a reader can tell which files
    were replaced since (:func:`stamp_status`).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> write_array_dir(d, {"x.npy": np.arange(3)}, {"n": 3})
        >>> read_meta(d, required=["n"], what="test folder", fix="rewrite it")["n"]
        3
    """
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    meta_path = p / meta_name
    if meta_path.exists():
        meta_path.unlink()
        _fsync_dir(p)
    for name, array in arrays.items():
        atomic_save_npy(p / name, array)
    if stamp:
        meta = {**meta, "files": {f.relative_to(p).as_posix(): file_stamp(f) for f in sorted(p.rglob("*.npy"))}}
    atomic_write_json(meta_path, dict(meta), default=default)


_SAMPLE_BLOCKS, _SAMPLE_BYTES = 64, 4096


def file_stamp(path: PathLike) -> Dict[str, Any]:
    """What identifies a written file cheaply: its size, modification time and a digest of 64 blocks of
    4 KiB spread over it (the whole file when smaller): milliseconds for any size.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.bin"; p.write_bytes(b"x" * 10)
        10
        >>> sorted(file_stamp(p))
        ['mtime_ns', 'sample', 'size']
    """
    st = os.stat(path)
    h = hashlib.blake2b(np.int64(st.st_size).tobytes(), digest_size=12)
    with open(path, "rb") as f:
        if st.st_size <= _SAMPLE_BLOCKS * _SAMPLE_BYTES:
            h.update(f.read())
        else:
            for i in range(_SAMPLE_BLOCKS):
                f.seek((st.st_size - _SAMPLE_BYTES) * i // (_SAMPLE_BLOCKS - 1))
                h.update(f.read(_SAMPLE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": h.hexdigest()}


def stamp_status(folder: PathLike, name: str, stamps: Optional[Mapping[str, Any]]) -> str:
    """How ``folder/name`` compares with the stamp a writer recorded (``write_array_dir(stamp=True)``).

    ``"same"``: size and modification time as written (the file was not touched since); ``"copy"``: another
    time but the same size and sampled blocks (e.g. the folder was copied); ``"changed"``: another size or
    other blocks; ``"unknown"``: no stamp was recorded (older folders) or the file is gone.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> write_array_dir(d, {"x.npy": np.arange(3)}, {}, stamp=True)
        >>> stamps = json.loads((d / "meta.json").read_text())["files"]
        >>> stamp_status(d, "x.npy", stamps)
        'same'
        >>> np.save(d / "x.npy", np.arange(4)); stamp_status(d, "x.npy", stamps)
        'changed'
    """
    want = (stamps or {}).get(name)
    path = Path(folder) / name
    if not isinstance(want, dict) or not path.is_file():
        return "unknown"
    st = os.stat(path)
    if st.st_size != want.get("size"):
        return "changed"
    if st.st_mtime_ns == want.get("mtime_ns"):
        return "same"
    return "copy" if file_stamp(path)["sample"] == want.get("sample") else "changed"


def read_meta(path: PathLike, required: Sequence[str], what: str, fix: str, meta_name: str = "meta.json",
              written_first: Optional[Sequence[str]] = None) -> Dict:
    """The metadata of a folder written by :func:`write_array_dir`, with the ``required`` keys checked.

    ``what`` names the folder's kind in messages ("partition map"), ``fix`` says what to do.
    ``written_first`` names the files a writer puts there before the metadata (default: any ``.npy``);
    finding one of them without the metadata means the writer was interrupted.
    Raises ``FileNotFoundError`` when ``path`` holds nothing of the kind, ``ValueError`` when it is
    incomplete (arrays without metadata: the writer died), not JSON, or lacks a required key.
    """
    p = Path(path)
    meta_path = p / meta_name
    if not meta_path.exists():
        partial = any(p.glob("*.npy")) if written_first is None else any((p / f).exists() for f in written_first)
        if p.is_dir() and partial:
            raise ValueError(f"{p} is an incomplete {what}: it has data files but no {meta_name}, which is written "
                             f"last, so writing it was interrupted; {fix}")
        raise FileNotFoundError(f"{p} holds no saved {what} (no {meta_name}); {fix}")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{meta_path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} holds a JSON {type(meta).__name__}, not an object; {fix}")
    missing = [k for k in required if k not in meta]
    if missing:
        raise ValueError(f"{meta_path} lacks the required key{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(k) for k in missing)}; {fix}")
    return meta


def load_npy(path: PathLike, fix: str, kind: str = "iu", ndim: Optional[int] = 1,
             length: Optional[int] = None, mmap: bool = False) -> np.ndarray:
    """Read an ``.npy`` file without pickles and check it: dtype kind(s) ``kind``, ``ndim`` dims, ``length`` rows.

    ``kind`` holds numpy kind letters (``"iu"`` integers, ``"f"`` floats, ``"b"`` booleans). With
    ``mmap=True`` the file is mapped copy-on-write (lazy; writable for ``torch.from_numpy``).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p} is missing; {fix}")
    try:
        arr = np.load(p, mmap_mode="c" if mmap else None, allow_pickle=False)
    except ValueError as e:
        # numpy says "Cannot load file containing pickled data" for any file without the .npy magic,
        # which sends users hunting for pickles; the truth is the file is not an .npy at all.
        why = "it is not a valid .npy file" if "pickle" in str(e) else f"it is not a valid .npy file ({e})"
        raise ValueError(f"{p}: {why}; {fix}") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"{p}: cannot read it as .npy ({type(e).__name__}: {e}); the file is truncated or "
                         f"corrupt; {fix}") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{p}: it is not a single .npy array; {fix}")
    if arr.dtype.kind not in kind:
        raise ValueError(f"{p} holds dtype {arr.dtype}, expected {_kind_names(kind)}; {fix}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{p} has shape {arr.shape}, expected {ndim} dimension(s); {fix}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{p} has {arr.shape[0]} entries, expected {length}; {fix}")
    return arr


def _kind_names(kind: str) -> str:
    names = {"i": "signed integers", "u": "unsigned integers", "f": "floats", "b": "booleans"}
    return " or ".join(names.get(k, k) for k in kind)


def check_writable(path: PathLike, what: str = "file", replace: bool = False) -> Path:
    """Make sure records can be appended at ``path`` (creating it and its folder); ``ValueError`` naming it if not.

    Called before long work whose results go to ``path``, so a typo fails in a second, not after hours.
    An existing file is kept as it is (logs are appended to); an empty one is probed with a byte that is
    truncated again, which catches files that open but refuse writes (``/proc/version``).
    ``replace=True`` is for a file that will be written whole by :func:`atomic_write_bytes` (``predict --out``,
    ``plot --out``): ``path`` itself is not created (a run that fails later leaves no empty file); a
    temporary file is created and removed in its folder instead, which is what the atomic write needs.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "out" / "pred.csv"
        >>> _ = check_writable(p, "--out file", replace=True); p.exists(), p.parent.is_dir()
        (False, True)
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} {p} is a directory; pass a file path, e.g. {p / 'run.jsonl'}")
    if p.parent.exists() and not p.parent.is_dir():
        raise ValueError(f"{what} {p}: {p.parent} is a file, not a folder; pass a path in a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if replace:
            fd, tmp = _new_temp_file(p, private=True)
            os.close(fd)
            os.unlink(tmp)
            return p
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask decides, as for open()
        try:
            if os.fstat(fd).st_size == 0:
                os.write(fd, b"\n")
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
    except OSError as e:
        raise ValueError(f"cannot write {what} {p} ({e.strerror or e}); pass a path in a writable folder") from None
    return p


def append_jsonl(path: PathLike, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` and flush it to disk (a crash keeps every finished line).

    The line goes out in one ``write``; when the disk fills midway the part written is cut off again and
    an ``OSError`` says so, so the file never holds a torn line.
    """
    line = (json.dumps(record, default=_json_default) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask decides, as for open()
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: only {written} of {len(line)} bytes "
                                            f"could be written")
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise OSError(e.errno, f"cannot append a record to {path} ({e.strerror or e}); the records before "
                                   f"it are intact") from None
    finally:
        os.close(fd)


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "tolist"):  # numpy arrays, torch tensors
        return x.tolist()
    raise TypeError(f"{type(x).__name__} {x!r} is not JSON-serialisable")


def read_run_log(path: PathLike) -> Dict[str, Any]:
    """The run log of ``gsplit train --log`` as one dict: the run's fields and ``"epochs"``, a list of records.

    The file is JSON Lines: a ``{"type": "run", ...}`` record written before training, one
    ``{"type": "epoch", ...}`` per finished epoch, and a ``{"type": "summary", ...}`` at the end (absent
    when the run crashed: then ``"complete"`` is False and the epochs done are still there). A log
    written by older versions (a single JSON object) is read as it is.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "run.jsonl"
        >>> append_jsonl(p, {"type": "run", "world_size": 2}); append_jsonl(p, {"type": "epoch", "epoch": 0})
        >>> log = read_run_log(p); log["world_size"], len(log["epochs"]), log["complete"]
        (2, 1, False)
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" not in stripped.rstrip():
        with contextlib.suppress(json.JSONDecodeError):
            obj = json.loads(stripped)
            if "type" not in obj:  # the old single-object log
                obj.setdefault("complete", True)
                return obj
    out: Dict[str, Any] = {"epochs": [], "complete": False}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(text.splitlines()):  # a line cut short by a crash: the lines before it stand
                break
            raise ValueError(f"{p}: line {n} is not JSON ({e}); is this a gsplit run log?") from None
        kind = rec.pop("type", None)
        if kind == "epoch":
            out["epochs"].append(rec)
        elif kind in ("run", "summary"):
            out.update(rec)
            out["complete"] = out["complete"] or kind == "summary"
        else:
            raise ValueError(f"{p}: line {n} has record type {kind!r}; is this a gsplit run log?")
    return out


def trim_run_log(path: PathLike, first_epoch: int) -> int:
    """Before a resumed run appends to its log: drop the epoch records from ``first_epoch`` on and any summary.

    The resumed run trains (and logs) every epoch from ``first_epoch`` on again, a partial one included, so a
    record the stopped run wrote for one of them (written before the stop, its checkpoint never saved) would
    appear twice; the run's earlier records and its ``run`` records stay, and the file is rewritten
    atomically. A missing or empty file is left alone. Returns the number of records dropped.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "run.jsonl"
        >>> for rec in ({"type": "run"}, {"type": "epoch", "epoch": 0}, {"type": "epoch", "epoch": 1}):
        ...     append_jsonl(p, rec)
        >>> trim_run_log(p, 1), [e["epoch"] for e in read_run_log(p)["epochs"]]
        (1, [0])
    """
    p = Path(path)
    if not p.is_file():
        return 0
    lines = p.read_text(encoding="utf-8").splitlines()
    kept, dropped = [], 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):  # a line cut short by the stop
                dropped += 1
                break
            raise ValueError(f"{p}: line {n} is not JSON ({e}); pass --log a gsplit run log, or a new file") from None
        kind = rec.get("type") if isinstance(rec, dict) else None
        if kind == "summary" or (kind == "epoch" and int(rec.get("epoch", 0)) >= first_epoch):
            dropped += 1
        else:
            kept.append(line + "\n")
    if dropped:
        atomic_write_bytes(p, "".join(kept))
    return dropped


# what to do about a file operation that failed, by errno (the rest: the message says enough)
_FIXES = {errno.ENOSPC: "the disk is full: free space on that file system, or write elsewhere (--checkpoint, --log, "
                        "--out, --dataset-out)",
          errno.EDQUOT: "free space within your quota, or write elsewhere (--checkpoint, --log, --out, --dataset-out)",
          errno.EROFS: "write to a writable file system (--checkpoint, --log, --out)",
          errno.EACCES: "write to a folder you may write to (--checkpoint, --log, --out)"}
_ERRNO_TEXT = re.compile(r"^\[Errno (\d+)\] (.*?)(?:: '(.*)')?$", re.S)


def file_error_line(exc: BaseException) -> Optional[str]:
    """One line for a failed file operation, the process's own or a rank's (a :class:`gsplit.LaunchError`
    whose root cause is an ``OSError``): what failed, the file, what to do. ``None`` for other errors.

    Example:
        >>> file_error_line(OSError(errno.ENOSPC, "No space left on device", "/ck/state.pt"))
        'No space left on device (/ck/state.pt); the disk is full: free space on that file system, or write elsewhere (--checkpoint, --log, --out, --dataset-out)'
        >>> file_error_line(ValueError("x")) is None
        True
    """
    rank = ""
    if isinstance(exc, OSError):
        code, text, filename = exc.errno, exc.strerror or str(exc), exc.filename
    else:
        failures = getattr(exc, "failures", None)  # LaunchError: the root cause first
        root = failures[0] if failures else None
        import builtins

        kind = getattr(builtins, getattr(root, "exc_type", None) or "", None)
        if not (isinstance(kind, type) and issubclass(kind, OSError)):
            return None
        m = _ERRNO_TEXT.match(root.message)
        code, text, filename = (int(m.group(1)), m.group(2), m.group(3)) if m else (None, root.message, None)
        rank = f"rank {root.rank}: "
    where = f" ({filename})" if filename else ""
    fix = _FIXES.get(code)
    return f"{rank}{text}{where}" + (f"; {fix}" if fix else "")
