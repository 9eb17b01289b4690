"""Feature dtypes and training precisions: the names users pass, and exact conversions between them.

Features may be stored and moved in ``float32`` (default), ``bfloat16`` or ``float16``: half the bytes per
row in host memory, the GPU cache, every gather and the feature shuffle. A model's first layer upcasts
them to its weights' dtype (float32), so half-precision *features* change only the stored values (each
rounded once, to nearest), never the arithmetic. A training *precision* (``fp32``, ``bf16``, ``fp16``) is
the dtype ``torch.autocast`` runs the layers' matrix products in; master weights and the optimiser stay
float32. float16 holds magnitudes up to 65504: a float32 table with larger values cannot be stored in it
(:func:`cast_features` refuses it, naming the row), and fp16 training needs a gradient scaler
(``torch.amp.GradScaler``) because small gradients underflow; bfloat16 has float32's range and needs none.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from gsplit.data.finite import known_finite, mark_finite

FEATURE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes features may be stored in, by name (``--feature-dtype``)."""

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Training precisions (``--precision``) and the dtype autocast runs in (``None``: no autocast)."""

HALF_DTYPES = (torch.bfloat16, torch.float16)
"""The 2-byte feature dtypes."""

_FLOAT16_MAX = 65504.0
_CHUNK_BYTES = 64 << 20  # conversion reads the source in chunks: no second float32 copy of a large table


def feature_dtype(value: Union[str, torch.dtype, None]) -> torch.dtype:
    """The torch dtype of a feature dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``, or the dtype
    itself); ``None`` is float32. Anything else is one ``ValueError`` saying what is accepted.

    Example:
        >>> feature_dtype("bfloat16")
        torch.bfloat16
        >>> feature_dtype("int8")
        Traceback (most recent call last):
        ...
        ValueError: feature dtype 'int8' is not supported; use one of float32, bfloat16, float16
    """
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        if value in FEATURE_DTYPES.values():
            return value
        value = str(value).replace("torch.", "")
    if isinstance(value, str) and value in FEATURE_DTYPES:
        return FEATURE_DTYPES[value]
    raise ValueError(f"feature dtype {value!r} is not supported; use one of {', '.join(FEATURE_DTYPES)}")


def dtype_name(dtype: torch.dtype) -> str:
    """The name :func:`feature_dtype` reads back (``torch.bfloat16`` -> ``"bfloat16"``).

    Example:
        >>> dtype_name(torch.float16)
        'float16'
    """
    return str(dtype).replace("torch.", "")


def autocast_dtype(precision: Optional[str]) -> Optional[torch.dtype]:
    """The dtype ``torch.autocast`` runs in for a training precision (``None`` for ``"fp32"``).

    Example:
        >>> autocast_dtype("bf16"), autocast_dtype("fp32")
        (torch.bfloat16, None)
    """
    key = "fp32" if precision is None else precision
    if key not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not supported; use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[key]


def cast_features(features: torch.Tensor, dtype: Union[str, torch.dtype]) -> torch.Tensor:
    """``features`` in ``dtype`` (a new tensor; the same one when it already is), converted in chunks.

    Each value is rounded to the nearest value of ``dtype`` (torch's ``Tensor.to``). A value beyond
    float16's range (65504) would become inf: converting such a table to float16 raises ``ValueError``
    naming the first such row and value (use bfloat16, which has float32's range, or scale the features).

    Example:
        >>> cast_features(torch.tensor([[1.0, 1 / 3]]), "bfloat16")
        tensor([[1.0000, 0.3340]], dtype=torch.bfloat16)
        >>> cast_features(torch.tensor([[1e5]]), "float16")
        Traceback (most recent call last):
        ...
        ValueError: features row 0 holds 100000.0, beyond float16's range (65504); store them as bfloat16 (float32's range) or scale them
    """
    dtype = feature_dtype(dtype)
    if features.dtype == dtype:
        return features
    check_range(features, dtype)
    out = torch.empty(features.shape, dtype=dtype, device=features.device)
    rows = max(1, _CHUNK_BYTES // max(1, features[:1].numel() * features.element_size()))
    for start in range(0, features.shape[0], rows):
        out[start:start + rows] = features[start:start + rows]  # copy_ rounds to nearest
    if known_finite(features):  # in range, so finite still: the loaders need not scan it again
        mark_finite(out)
    return out


def check_range(features: torch.Tensor, dtype: Union[str, torch.dtype]) -> None:
    """Raise ``ValueError`` naming the first row of ``features`` with a finite value beyond ``dtype``'s range
    (float16: 65504; bfloat16: about 3.4e38, float32's), which converting would turn into inf.

    Example:
        >>> check_range(torch.tensor([[7e4]]), "bfloat16")   # fits: no error
    """
    dtype = feature_dtype(dtype)
    top = torch.finfo(dtype).max
    if features.numel() == 0 or torch.finfo(features.dtype).max <= top:
        return
    rows = max(1, _CHUNK_BYTES // max(1, features[:1].numel() * features.element_size()))
    for start in range(0, features.shape[0], rows):
        chunk = features[start:start + rows]
        big = chunk.abs() > top  # NaN compares False: the finite checks report those; inf is inf in any dtype
        big &= torch.isfinite(chunk)
        if bool(big.any()):
            row = int(big.reshape(chunk.shape[0], -1).any(1).nonzero()[0, 0])
            value = float(chunk[row].reshape(-1)[big[row].reshape(-1)][0])
            hint = "store them as bfloat16 (float32's range) or scale them" if dtype == torch.float16 else "scale them"
            raise ValueError(f"features row {start + row} holds {value}, beyond {dtype_name(dtype)}'s range "
                             f"({top:g}); {hint}")


def input_rows(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A model's input rows in its weights' dtype: half-precision features upcast exactly (every bfloat16 and
    float16 value is a float32 value), float32 and float64 rows as they are.

    Example:
        >>> input_rows(torch.ones(2, 3, dtype=torch.bfloat16), torch.zeros(1)).dtype
        torch.float32
    """
    if x.dtype in HALF_DTYPES and like.dtype.is_floating_point and like.dtype != x.dtype:
        return x.to(like.dtype)
    return x


def model_input(feat: torch.Tensor, layers: Sequence[Any]) -> torch.Tensor:
    """The input rows of ``layers`` in their weights' dtype: bfloat16/float16 features are upcast, exactly, to the
    first floating parameter's dtype (float32: master weights; under ``torch.autocast`` the layers' products then
    run in the autocast dtype as usual); float32 rows pass as they are.

    Example:
        >>> model_input(torch.ones(2, 3, dtype=torch.bfloat16), [torch.nn.Linear(3, 1)]).dtype
        torch.float32
    """
    like = next((p for m in layers for p in m.parameters() if p.is_floating_point()), None)
    return input_rows(feat, like if like is not None else feat.new_empty(0, dtype=torch.float32))


__all__ = ["FEATURE_DTYPES", "PRECISIONS", "HALF_DTYPES", "feature_dtype", "dtype_name", "autocast_dtype",
           "cast_features", "check_range", "input_rows", "model_input"]
