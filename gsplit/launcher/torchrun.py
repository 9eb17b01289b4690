"""Join the job torchrun started: a rank whose environment torchrun set initialises its process group from it.

``gsplit train`` under torchrun (``torchrun --nnodes N --nproc-per-node G -m gsplit train ...``) calls
:func:`started_by_torchrun` and then :func:`init_from_env` instead of starting ranks itself; the host
groups of such a job are :func:`gsplit.comm.hosts.host_groups`'.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gsplit.launcher.rank import init_process_group


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and Slurm scripts that mimic it) sets in every rank's environment."""


def started_by_torchrun() -> bool:
    """Whether this process is a rank that torchrun started (its environment variables are all set).

    Example:
        >>> started_by_torchrun()          # doctest: +SKIP
        False
    """
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def init_from_env(device: str = "auto") -> torch.device:
    """Join the job torchrun started: ``init_process_group`` from the environment, this rank's device.

    ``device``: ``auto`` (GPU ``LOCAL_RANK`` when CUDA is available, else the CPU), ``cpu`` or
    ``cuda``. GPUs talk over NCCL, CPU ranks over gloo. Returns the device.

    Example:
        >>> device = init_from_env()      # in a rank started by torchrun  # doctest: +SKIP
    """
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set; start the ranks with torchrun (torchrun --nnodes N "
                         f"--nproc-per-node G -m gsplit train ...)")
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        raise ValueError("device='cuda' but CUDA is not available on this host; use --device cpu")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={local_rank} but this host has {torch.cuda.device_count()} GPU(s); start "
                             f"at most one rank per GPU (--nproc-per-node)")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        init_process_group("nccl" if use_cuda else "gloo", dev)  # a GPU's communicator is made now, not mid-batch
    return dev
