"""A rank's own set-up and questions: its device, the world size, its share of the CPU threads, and its
process group (:func:`init_process_group`). The launcher, torchrun joining, the trainer and the CLI use them."""

from __future__ import annotations

import inspect
import os
from typing import Optional, Union

import torch
import torch.distributed as dist


_ENV_DEVICE = "GSPLIT_DEVICE"


def world_size(group=None) -> int:
    """Number of ranks in the job (or in ``group``): ``torch.distributed.get_world_size()``, 1 without a process group.

    Ranks started by :func:`spawn` get ``fn(rank, *args)`` like ``torch.multiprocessing.spawn``; this
    is where they read how many there are.

    Example:
        >>> world_size()  # the launching process itself has no process group
        1
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def current_device() -> torch.device:
    """The device :func:`launch` assigned to the calling rank; in a rank torchrun started (``LOCAL_RANK``
    set), GPU ``LOCAL_RANK`` when CUDA is available; else ``cpu``.

    Example:
        >>> current_device()  # in the launching process itself
        device(type='cpu')
    """
    if _ENV_DEVICE in os.environ:
        return torch.device(os.environ[_ENV_DEVICE])
    if "LOCAL_RANK" in os.environ and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")


def resolve_device(name: Union[str, torch.device] = "auto") -> torch.device:
    """The device a rank computes on, from a user's choice (the one rule; the trainer and CLI use it).

    ``"auto"``: in a rank started by :func:`launch`, the device it assigned (:func:`current_device`);
    elsewhere the first GPU when there is one, else the CPU. ``"cuda"``: this rank's GPU (an error
    without CUDA). Anything else is taken as a torch device name.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    name = str(name)
    if name == "auto":
        if _ENV_DEVICE in os.environ or "LOCAL_RANK" in os.environ:  # gsplit.launch or torchrun
            return current_device()
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available; use device='cpu' or 'auto'")
        dev = current_device()
        return dev if dev.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def limit_threads(ranks_on_host: int) -> Optional[int]:
    """Give this rank its share of the host's cores for torch's CPU threads, unless ``OMP_NUM_THREADS`` is set.

    Every rank of a host runs CPU work, GPU ranks too (host-side sampling and gathers, the CPU parts of
    evaluation, the prefetch thread); torch's default of all cores per rank oversubscribes the host
    ``ranks_on_host`` times. Returns the thread count set, ``None`` when the user's setting stands.

    Example:
        >>> limit_threads(1) is None or torch.get_num_threads() >= 1
        True
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // max(1, int(ranks_on_host)))
    torch.set_num_threads(threads)
    return threads


def init_process_group(backend: Optional[str], device: torch.device, **options) -> None:
    """``torch.distributed.init_process_group`` for a rank computing on ``device``.

    A CUDA rank passes its GPU as ``device_id`` where torch supports it (2.3+): the NCCL communicator is
    then created here, by every rank at once, instead of lazily inside the first collective while the
    first mini-batch is in flight (and later groups split from it). torch 2.2 has no ``device_id``.

    Example:
        >>> init_process_group("nccl", torch.device("cuda", 1), store=store, rank=1, world_size=8)  # doctest: +SKIP
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None and _accepts_device_id():
        options["device_id"] = device
    dist.init_process_group(backend, **options)


def _accepts_device_id() -> bool:
    try:
        return "device_id" in inspect.signature(dist.init_process_group).parameters
    except (TypeError, ValueError):
        return False
