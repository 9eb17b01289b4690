"""Counter-based random numbers: a pure function of ``(seed, epoch, iteration, layer, vertex, draw)``.

Split parallelism needs every rank to pick the same neighbours for a vertex as a single process would,
whatever rank samples it and in whatever order. So there is no random *state*: each pick is a hash
(SplitMix64's finaliser) of its coordinates. The same arithmetic is implemented in
``kernels/sample.cu``; change both together (tests compare them).

torch has no uint64, so the 64-bit arithmetic runs on int64 with wrap-around multiplication, and right
shifts are made logical by masking off the sign-extended bits.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _signed(x: int) -> int:
    """Reinterpret an unsigned 64-bit Python int as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def mix64_int(z: int) -> int:
    """SplitMix64 finaliser on a Python int (unsigned 64-bit semantics)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, epoch: int, iteration: int, layer: int) -> int:
    """One 64-bit key per ``(seed, epoch, iteration, layer)``; vertices and draws are mixed in later."""
    k = mix64_int(seed + GOLDEN)
    for c in (epoch, iteration, layer):
        k = mix64_int(k ^ ((c + GOLDEN) & _MASK64))
    return k


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser, element-wise on int64 tensors holding 64-bit patterns."""
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    return z ^ _shr(z, 31)


def vertex_keys(key: int, vertices: torch.Tensor) -> torch.Tensor:
    """Per-vertex 64-bit keys: ``mix64(key ^ (v * GOLDEN))``."""
    return mix64(vertices.to(torch.int64) * _signed(GOLDEN) ^ _signed(key))


def keep_threshold(p: float) -> int:
    """The 63-bit draw below which a cell is dropped, so that it is dropped with probability ``p``."""
    return int(p * float(1 << 63))


def keep_cells(key: int, n: int, threshold: int, device=None) -> torch.Tensor:
    """``bool[n]``: cell ``c`` is kept when its draw ``mix64(key ^ c * GOLDEN) >> 1`` (63 bits) is at least
    ``threshold``. Integer arithmetic only, so every device type gives the same bits (the compiled CPU
    version, :func:`gsplit.ops.keep_cells`, too).

    Example:
        >>> keep = keep_cells(stream_key(0, 0, 0, 0), 10_000, keep_threshold(0.25))
        >>> 0.72 < keep.double().mean().item() < 0.78
        True
    """
    return _shr(vertex_keys(key, torch.arange(int(n), dtype=torch.int64, device=device)), 1) >= int(threshold)


def draw_below(vkeys: torch.Tensor, draw: int, bound: torch.Tensor) -> torch.Tensor:
    """Draw number ``draw`` for each vertex key: an integer uniform in ``[0, bound)`` (``bound >= 1``).

    Uses the top 63 bits modulo ``bound``; the bias is below ``bound / 2**63``, negligible for graphs.
    """
    r = mix64(vkeys + _signed((draw + 1) * GOLDEN))
    return _shr(r, 1) % bound


def draws_below(vkeys: torch.Tensor, count: int, bound: torch.Tensor) -> torch.Tensor:
    """Draws ``0..count-1`` for every vertex key at once: ``[n, count]``, column ``i`` in ``[0, bound[:, i])``.

    Column ``i`` equals ``draw_below(vkeys, i, bound[:, i])``; one pass over an ``[n, count]`` tensor
    costs far fewer kernel launches than ``count`` passes over ``[n]``.
    """
    # (i + 1) * GOLDEN with int64 wrap-around: the same bits as the unsigned product, made on the device
    # (a tensor built from a Python list would be a blocking copy from pageable memory on a GPU)
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=vkeys.device) * _signed(GOLDEN)
    r = mix64(vkeys[:, None] + steps[None, :])
    return _shr(r, 1) % bound
