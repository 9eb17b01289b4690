"""Count the calls that make the host wait for the GPU (host-device syncs), per call site.

A CUDA kernel launch returns at once; the host only waits where it needs a value or a size from the
device: ``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``, a boolean-mask index, ``unique``,
``bincount`` (it reads the maximum to size its output), ``repeat_interleave`` without ``output_size``,
a copy from pageable host memory, ... Each wait drains the device's queue, so a training iteration
should have as few as its sizes force. :class:`HostSyncCounter` is a ``TorchFunctionMode`` that sees
every Python-level torch call, counts the sync-inducing ones and names the line that made each.

It also runs on a machine without a GPU, for tests: with ``cpu_is_device=True`` CPU tensors stand for
device tensors, except those listed in ``host=`` (e.g. the host feature table), those that come out
of a counted device-to-host read (``.cpu()``) or are computed from host tensors only, and those made by
a factory that names no device (``torch.zeros(3)`` is in host memory on a GPU machine too). A copy of a host
tensor with ``.to(device)`` then counts as a blocking (pageable) copy unless it is ``non_blocking``;
on a GPU a copy counts unless it is ``non_blocking`` from pinned memory. A ``.to(...)`` of a device
tensor counts only on a real GPU (a stand-in cannot tell "to the host" from "to the device"): library
code reads values to the host with ``.cpu()`` / ``.tolist()``, which count everywhere.

Not seen: syncs inside C++ code (an extension, ``torch.cuda.synchronize``) and inside collectives.

Example:
    >>> counter = HostSyncCounter(cpu_is_device=True)
    >>> with counter:
    ...     n = int(torch.arange(5, device="cpu").sum())   # one read of a "device" value
    >>> counter.total, counter.events[0].kind
    (1, '__int__')
"""

from __future__ import annotations

import collections
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

__all__ = ["HostSyncCounter", "SyncEvent"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_THIS_FILE)))

_READS = {
    torch.Tensor.item: "item", torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy",
    torch.Tensor.cpu: "cpu", torch.Tensor.__bool__: "__bool__", torch.Tensor.__int__: "__int__",
    torch.Tensor.__float__: "__float__", torch.Tensor.__index__: "__index__",
}
"""Tensor methods that read a device value into host memory."""

_SIZED_BY_DATA = {
    torch.nonzero: "nonzero", torch.Tensor.nonzero: "nonzero", torch.argwhere: "nonzero",
    torch.Tensor.argwhere: "nonzero", torch.masked_select: "masked_select",
    torch.Tensor.masked_select: "masked_select", torch.bincount: "bincount", torch.Tensor.bincount: "bincount",
    torch.unique: "unique", torch.Tensor.unique: "unique", torch.unique_consecutive: "unique",
    torch.Tensor.unique_consecutive: "unique",
}
"""Functions whose output size depends on the data (the host must read it to allocate)."""


@dataclass(frozen=True)
class SyncEvent:
    """One call that makes the host wait for the device."""

    kind: str
    """What forced it: ``"tolist"``, ``"nonzero"``, ``"bool-mask index"``, ``"pageable copy"``, ..."""
    site: str
    """Where: ``path:line (function)`` of the innermost caller outside torch."""


@dataclass
class _HostSet:
    """Tensors known to be in host memory, by identity (tensors are not hashable by value)."""

    refs: Dict[int, Any] = field(default_factory=dict)

    def add(self, t: torch.Tensor) -> None:
        self.refs[id(t)] = weakref.ref(t)

    def __contains__(self, t: torch.Tensor) -> bool:
        ref = self.refs.get(id(t))
        return ref is not None and ref() is t


class HostSyncCounter(TorchFunctionMode):
    """Count host-device syncs made while it is active (``with counter:``), by kind and call site.

    Args:
        cpu_is_device: let CPU tensors stand for device tensors (tests on a machine without a GPU).
        host: tensors that are in host memory in the run being modelled (``cpu_is_device`` only),
            e.g. a loader's host feature and label tables.

    Example:
        >>> counter = HostSyncCounter(cpu_is_device=True)
        >>> with counter:
        ...     x = torch.arange(6, device="cpu")
        ...     y = x[x > 2]                              # a boolean mask: the size is data-dependent
        >>> [(e.kind, e.site.split(" ")[0].rsplit(":", 1)[0]) for e in counter.events]  # doctest: +ELLIPSIS
        [('bool-mask index', ...)]
    """

    def __init__(self, cpu_is_device: bool = False, host: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.cpu_is_device = bool(cpu_is_device)
        self.events: List[SyncEvent] = []
        self._host = _HostSet()
        for t in host:
            self._host.add(t)

    # ------------------------------------------------------------------ results
    @property
    def total(self) -> int:
        return len(self.events)

    def by_site(self) -> Dict[str, int]:
        """``{"site: kind": count}``, most frequent first."""
        return dict(collections.Counter(f"{e.site}: {e.kind}" for e in self.events).most_common())

    def report(self) -> str:
        """One line per call site and kind, with the count; for assertion messages and logs."""
        lines = [f"{n:4d}  {key}" for key, n in self.by_site().items()]
        return f"{self.total} host-device syncs\n" + "\n".join(lines)

    def mark_host(self, t: torch.Tensor) -> None:
        """Declare ``t`` to be in host memory (``cpu_is_device`` runs)."""
        self._host.add(t)

    # ------------------------------------------------------------------ classification
    def _on_device(self, t: Any) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if t.device.type == "cpu":
            return self.cpu_is_device and t not in self._host
        return t.device.type != "meta"

    def _record(self, kind: str) -> None:
        frame = sys._getframe(2)
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if not path.startswith(_TORCH_DIR) and path != _THIS_FILE:
                break
            frame = frame.f_back
        if frame is None:
            site = "<unknown>"
        else:
            path = os.path.abspath(frame.f_code.co_filename)
            shown = os.path.relpath(path, _REPO_ROOT) if path.startswith(_REPO_ROOT) else path
            site = f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
        self.events.append(SyncEvent(kind, site))

    def _classify(self, func: Callable, args: tuple, kwargs: dict) -> Optional[str]:
        """The kind of sync ``func(*args, **kwargs)`` forces, or ``None``."""
        if func in _READS:
            return _READS[func] if self._on_device(args[0]) else None
        if func in _SIZED_BY_DATA:
            return _SIZED_BY_DATA[func] if self._on_device(args[0]) else None
        if func is torch.where and len(args) + len(kwargs) == 1:
            return "nonzero" if self._on_device(args[0]) else None
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            for i in index:
                if isinstance(i, torch.Tensor) and i.dtype == torch.bool and self._on_device(i):
                    return "bool-mask index"
            return self._host_indexed_by_device(args[0], index)
        if func in (torch.index_select, torch.Tensor.index_select):
            return self._host_indexed_by_device(args[0], (args[2] if len(args) > 2 else kwargs.get("index"),))
        if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
            if isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None \
                    and self._on_device(repeats):
                return "repeat_interleave"
            return None
        if func in (torch.tensor, torch.as_tensor, torch.Tensor.new_tensor):
            data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data"))
            if isinstance(data, (list, tuple)):
                leaves, _ = tree_flatten(data)
                if any(self._on_device(x) for x in leaves):
                    return "tensor from device values"
            if not isinstance(data, torch.Tensor) and kwargs.get("device") is not None:
                # Python values to the device: a copy from pageable memory
                target = torch.device(kwargs["device"])
                if target.type == "cuda" or (self.cpu_is_device and target.type == "cpu"):
                    return "pageable copy"
            return None
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return self._copy_kind(args[0], _target_device(func, args, kwargs), _non_blocking(args, kwargs))
        if func is torch.Tensor.copy_:
            dst, src = args[0], args[1]
            non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
            if self._on_device(src) and not self._on_device(dst):
                return "device-to-host copy"
            if not self._on_device(src) and self._on_device(dst):
                return self._h2d_kind(src, non_blocking, stand_in=dst.device.type == "cpu")
        return None

    def _host_indexed_by_device(self, table: torch.Tensor, index: tuple) -> Optional[str]:
        # A stand-in cannot see a device tensor's .to("cpu") (see the module doc), but a host tensor
        # indexed by device-resident ids shows that the ids went to the host.
        if not self.cpu_is_device or self._on_device(table):
            return None
        if any(isinstance(i, torch.Tensor) and i.dtype != torch.bool and self._on_device(i) for i in index):
            return "device-to-host copy (index)"
        return None

    def _copy_kind(self, src: torch.Tensor, target: Optional[torch.device], non_blocking: bool) -> Optional[str]:
        if target is None:  # a dtype change only
            return None
        if self._on_device(src):
            # device -> host, or a move between devices; on a stand-in CPU the two look alike (see module doc)
            return "device-to-host copy" if src.is_cuda and target.type == "cpu" else None
        if target.type == "cuda" or (self.cpu_is_device and target.type == "cpu"):
            return self._h2d_kind(src, non_blocking, stand_in=target.type == "cpu")
        return None

    def _h2d_kind(self, src: torch.Tensor, non_blocking: bool, stand_in: bool) -> Optional[str]:
        if not non_blocking:
            return "pageable copy"
        # Code that copies to a stand-in CPU "device" does not pin (that needs an accelerator): non_blocking is
        # what it can show there, also on a machine that has a GPU (the first GPU run found the stand-in tests
        # failing there when this looked at torch.cuda.is_available()).
        return None if stand_in or src.is_pinned() else "pageable copy"

    def _mark_outputs(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> None:
        """Propagate "in host memory": D2H reads, and results computed from host tensors only."""
        if not self.cpu_is_device:
            return
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs:
            return
        if func in (torch.Tensor.cpu, torch.Tensor.numpy):
            host = True
        elif func in (torch.Tensor.to, torch.Tensor.cuda):
            host = args[0] in self._host and _target_device(func, args, kwargs) is None
        else:
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if not inputs:  # a factory: host memory unless it names a device, as on a GPU machine
                host = kwargs.get("device") is None
            elif any(o is inputs[0] for o in outs):  # in place: the tensor stays where it is
                host = False
            elif func in (torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select):
                host = inputs[0] in self._host  # rows of a host table are in host memory
            else:
                host = all(t in self._host for t in inputs)
        if host:
            for t in outs:
                self._host.add(t)

    # ------------------------------------------------------------------ the mode
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._classify(func, args, kwargs)
        if kind is not None:
            self._record(kind)
        if func in (torch.Tensor.backward, torch.autograd.backward):
            out = self._backward_counted(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
            if out is args[0] and self.cpu_is_device and self._crosses(func, args, kwargs):
                # On a stand-in CPU a move between host and "device" returns the tensor itself; make it
                # a new tensor, as on a GPU, so that each side keeps its own mark.
                out = out.clone()
        self._mark_outputs(func, args, kwargs, out)
        return out

    def _crosses(self, func, args, kwargs) -> bool:
        """Whether a call moves a tensor between host and device memory (``.cpu()``, ``.to(device)`` of a host tensor)."""
        if func is torch.Tensor.cpu:
            return self._on_device(args[0])
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return not self._on_device(args[0]) and _target_device(func, args, kwargs) is not None
        return False

    def _backward_counted(self, func, args, kwargs):
        """Run backward with the mode active, so Python ``backward`` methods of autograd Functions count too."""
        try:
            from torch.autograd.graph import _engine_run_backward
        except ImportError:  # a torch without it: backward runs uncounted
            return func(*args, **kwargs)
        tensors = args[0]
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        grads = args[1] if len(args) > 1 else kwargs.get("gradient", kwargs.get("grad_tensors"))
        if grads is None:
            grads = tuple(torch.ones_like(t) for t in tensors)
        elif isinstance(grads, torch.Tensor):
            grads = (grads,)
        retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
        create = bool(kwargs.get("create_graph", args[3] if len(args) > 3 else False))
        inputs = kwargs.get("inputs")
        inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
        with self:
            _engine_run_backward(tensors, tuple(grads), create if retain is None else retain, create, inputs,
                                 allow_unreachable=True, accumulate_grad=True)
        return None


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return any(isinstance(a, bool) and a for a in args[1:3])


def _target_device(func: Callable, args: tuple, kwargs: dict) -> Optional[torch.device]:
    """The device a ``Tensor.to`` / ``Tensor.cuda`` call copies to, or ``None`` for a dtype change."""
    if func is torch.Tensor.cuda:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        return torch.device("cuda") if dev is None else torch.device("cuda", dev) if isinstance(dev, int) \
            else torch.device(dev)
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"])
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, torch.Tensor):  # .to(other): other's device
            return a.device
    return None
