"""Argument normalisation shared by the numpy, reference and torch front ends.

Everything a user can get wrong before the crate sees the problem is checked here, with messages
in the crate's style (which tensor or parameter, expected, got); everything else (shapes against
each other, groups, output size) is left to the crate, whose message the `ValueError` carries.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

CONVENTIONS = ("torchvision", "mmcv", "dcn_v1")

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# What each operand's axes are, for messages.
AXES = {
    "input": "[N, C_in, H, W]",
    "offset": "[N, 2 * offset_groups * kh * kw, H_out, W_out]",
    "mask": "[N, offset_groups * kh * kw, H_out, W_out]",
    "weight": "[C_out, C_in / groups, kh, kw]",
    "bias": "[C_out]",
    "grad_out": "[N, C_out, H_out, W_out]",
}


class Padding(NamedTuple):
    """Zero padding per side, in pixels: ``Padding(top, bottom, left, right)``.

    Anywhere a ``padding`` is accepted, an int ``p`` means ``Padding(p, p, p, p)``, a pair
    ``(ph, pw)`` means ``Padding(ph, ph, pw, pw)`` (torchvision's), and a 4-tuple is read in this
    order: top, bottom, left, right. (ONNX writes ``pads`` as ``[top, left, bottom, right]``:
    reorder before passing it.) Only ``top`` and ``left`` shift the sample positions; ``bottom``
    and ``right`` only enlarge the output.
    """

    top: int
    bottom: int
    left: int
    right: int


# The largest parameter value: what a 64-bit signed integer holds, as the torch ops carry their
# parameters. A larger one is refused here, naming the parameter, rather than further down by a
# conversion that cannot name it (the torch op's schema check: "Expected a value of type
# 'List[int]' for argument 'params'").
INT_MAX = 2**63 - 1


def _index(name: str, v) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{name}: expected an int, got bool {v!r}")
    try:
        n = operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}") from None
    if n > INT_MAX:
        raise OverflowError(f"{name}: {n} is too large (at most {INT_MAX})")
    return n


def pair(name: str, v) -> tuple[int, int]:
    """An int, or a pair ``(h, w)``, as a pair; each at least 1 (stride, dilation)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name}: expected an int or a pair (h, w), got {len(v)} values {tuple(v)!r}")
        h, w = _index(name, v[0]), _index(name, v[1])
    else:
        h = w = _index(name, v)
    if h < 1 or w < 1:
        raise ValueError(f"{name}: ({h}, {w}) must be at least 1 on both axes")
    return h, w


def padding(v) -> Padding:
    """An int, a pair ``(ph, pw)`` or ``(top, bottom, left, right)``, as a `Padding`."""
    if isinstance(v, (tuple, list)):
        vals = tuple(_index("padding", x) for x in v)
        if len(vals) == 2:
            p = Padding(vals[0], vals[0], vals[1], vals[1])
        elif len(vals) == 4:
            p = Padding(*vals)
        else:
            raise ValueError(
                "padding: expected an int, a pair (pad_h, pad_w) or four values "
                f"(top, bottom, left, right), got {len(vals)} values {vals!r}"
            )
    else:
        q = _index("padding", v)
        p = Padding(q, q, q, q)
    if min(p) < 0:
        raise ValueError(f"padding: {tuple(p)!r} (top, bottom, left, right) must be non-negative")
    return p


def positive(name: str, v) -> int:
    """A count that must be at least 1 (groups, offset groups)."""
    n = _index(name, v)
    if n < 1:
        raise ValueError(f"{name}: {n} must be at least 1")
    return n


def convention(v) -> str:
    if v not in CONVENTIONS:
        raise ValueError(f"convention: unknown {v!r}; expected one of {', '.join(map(repr, CONVENTIONS))}")
    return v


def array(name: str, x, ndim: int, dtype=None) -> np.ndarray:
    """`x` as a float32 or float64 numpy array of rank `ndim` (no copy when it already is one,
    whatever its strides), of `dtype` when given (the dtype of the first operand)."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; deformconv computes on the CPU")
        x = x.detach()
    a = np.asarray(x)
    if not a.dtype.isnative and a.dtype.newbyteorder("=") in _FLOATS:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype not in _FLOATS:
        raise TypeError(f"{name} has dtype {a.dtype}; expected float32 or float64")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} has dtype {a.dtype}; expected {dtype}, the dtype of input")
    if a.ndim != ndim:
        raise ValueError(
            f"{name} has {a.ndim} dimensions (shape {a.shape}); expected {ndim}: {AXES.get(name, '')}".rstrip(": ")
        )
    return a


def optional(name: str, x, ndim: int, dtype) -> np.ndarray | None:
    return None if x is None else array(name, x, ndim, dtype)


def infer_groups(input: np.ndarray, weight: np.ndarray, groups) -> int:
    """torchvision's rule: ``C_in // weight.shape[1]`` unless given (at least 1; the crate checks
    the rest)."""
    if groups is not None:
        return positive("groups", groups)
    per_group = weight.shape[1]
    return max(1, input.shape[1] // per_group) if per_group else 1


def infer_offset_groups(offset_channels: int, weight_shape, offset_groups) -> int:
    """torchvision's rule: ``offset.shape[1] // (2 * kh * kw)`` unless given."""
    if offset_groups is not None:
        return positive("offset_groups", offset_groups)
    taps = 2 * weight_shape[2] * weight_shape[3]
    return max(1, offset_channels // taps) if taps else 1


def params(stride, pad, dilation, groups: int, offset_groups: int, conv: str) -> tuple:
    """The parameter tuple of the native functions."""
    sh, sw = pair("stride", stride)
    dh, dw = pair("dilation", dilation)
    p = padding(pad)
    return (sh, sw, p.top, p.bottom, p.left, p.right, dh, dw, groups, offset_groups, convention(conv))


GRADS = ("input", "offset", "mask", "weight", "bias")


def needs(names, *, dense: bool = False) -> tuple[bool, bool, bool, bool, bool]:
    """``needs`` (names among input, offset, mask, weight, bias; ``grad_`` prefixes allowed) as
    flags in that order."""
    if isinstance(names, str):
        names = (names,)
    allowed = ("input", "weight", "bias") if dense else GRADS
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(
            f"needs: expected a gradient name or names among {', '.join(allowed)}, "
            f"got {type(names).__name__} {names!r}"
        ) from None
    flags = dict.fromkeys(GRADS, False)
    for n in names:
        key = n[5:] if isinstance(n, str) and n.startswith("grad_") else n
        if not isinstance(key, str) or key not in flags or (dense and key in ("offset", "mask")):
            raise ValueError(f"needs: unknown gradient {n!r}; expected some of {', '.join(allowed)}")
        flags[key] = True
    return tuple(flags[g] for g in GRADS)
