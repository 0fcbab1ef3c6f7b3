"""Input checks shared by the credit estimators (private).

Every public credit function validates its arguments here so that bad input fails with a ``ValueError`` that
names the argument, instead of an ``IndexError`` or a silent NaN deep inside the maths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def finite_float(value: object, name: str) -> float:
    """``value`` as a Python float; ValueError if it is not a finite real number."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a real number, got a bool ({value!r})")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def as_int(value: object, name: str) -> int:
    """An integer (Python, numpy or 0-d torch); bools and floats are refused."""
    if not isinstance(value, bool):
        try:
            return value.__index__()  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
    raise ValueError(f"{name} must be an int, got {value!r}")


def float_list(values: Sequence[float] | Tensor, name: str, *, min_len: int = 0) -> list[float]:
    """A sequence of finite floats as a list; ValueError naming ``name[i]`` for the first bad entry."""
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
        values = values.tolist()
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = [finite_float(v, f"{name}[{i}]") for i, v in enumerate(values)]
    if len(out) < min_len:
        raise ValueError(f"{name} needs at least {min_len} value(s), got {len(out)}")
    return out


def unit_interval(value: float, name: str) -> float:
    """A finite float in [0, 1] (discounts, GAE lambda)."""
    out = finite_float(value, name)
    if not 0.0 <= out <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {out}")
    return out


def choice(value: str, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def float_tensor(t: object, name: str) -> Tensor:
    """A floating-point tensor (float16/32/64, bfloat16). Integer tensors are refused: the caller decides the
    precision, and the results keep it."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def as_mask(mask: object, name: str, shape: torch.Size) -> Tensor:
    """A bool tensor from a bool or 0/1 (integer or float) mask of the given shape."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor (bool or 0/1), got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{name} must be bool or 0/1, got dtype {mask.dtype}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)]
        raise ValueError(f"{name} must contain only 0 and 1 (or be bool); found {bad.flatten()[0].item()!r}")
    return mask != 0


def same_shape(tensors: dict[str, Tensor], *, ndim: int | None = None) -> torch.Size:
    """All tensors share one shape (and, if given, that many dimensions); returns the shape."""
    names = list(tensors)
    first = names[0]
    shape = tensors[first].shape
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{first} must have {ndim} dimension(s), got shape {tuple(shape)}")
    for other in names[1:]:
        if tensors[other].shape != shape:
            raise ValueError(
                f"{other} has shape {tuple(tensors[other].shape)} but {first} has shape {tuple(shape)}; "
                "they must match"
            )
    return shape


def result_dtype(*tensors: Tensor) -> torch.dtype:
    """The promoted floating dtype of the inputs (float32 + float64 -> float64)."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def finite_where(t: Tensor, name: str, where: Tensor | None = None) -> None:
    """ValueError if ``t`` holds NaN or +-inf (only at ``where`` positions when given), naming the index."""
    bad = ~torch.isfinite(t)
    if where is not None:
        bad &= where
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        at = index[0] if len(index) == 1 else index
        raise ValueError(f"{name} must be finite; {name}[{at}] = {t[index].item()}")
