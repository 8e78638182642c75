"""Judging a kernel's results against the oracle under the per-element bound of DESIGN §5."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from . import _args, _native
from ._api import Grads

DEFAULT_BOUND_FACTOR: float = _native.DEFAULT_BOUND_FACTOR
"""The constant ``c`` of the bound ``|actual - exact| <= c * eps * (L * sum|terms| + P)``."""

RESULTS = ("out", "grad_input", "grad_offset", "grad_mask", "grad_weight", "grad_bias")

_EPS = {np.dtype(np.float32): _native.EPS_F32, np.dtype(np.float64): _native.EPS_F64}


@dataclass(frozen=True)
class TensorReport:
    """How one result tensor compares with the exact one."""

    name: str
    """``out``, ``grad_input``, ``grad_offset``, ``grad_mask``, ``grad_weight`` or ``grad_bias``."""
    shape: tuple
    max_abs_err: float
    """``max |actual - expected|`` (NaN against a number counts as infinite)."""
    max_rel_err: float
    """``max |actual - expected| / |expected|`` (infinite where ``expected == 0 != actual``)."""
    over_tolerance: int
    """Elements whose error exceeds what the criterion allows."""
    elements: int
    max_bound_ratio: Optional[float]
    """``max error / (c * eps * scale)``: at most 1 means every element is within the bound."""
    passed: bool
    criterion: str
    worst_index: Optional[tuple] = None
    """The element with the largest ``error / allowed`` (``None`` for an empty tensor)."""
    worst_expected: Optional[float] = None
    worst_actual: Optional[float] = None
    worst_allowed: Optional[float] = None


@dataclass(frozen=True)
class Report:
    """The comparison of every result given to `compare`; ``str(report)`` is the table of
    ``deformconv compare`` (worst index, both values, count over tolerance, err/bound)."""

    tensors: tuple
    text: str = field(repr=False)

    @property
    def passed(self) -> bool:
        """Whether every element of every tensor is within tolerance."""
        return all(t.passed for t in self.tensors)

    def __getitem__(self, name: str) -> TensorReport:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def __str__(self) -> str:
        return self.text


def _results(actual) -> dict:
    """``actual`` as ``{name: array}``: an array is ``out``; a `Grads` names its gradients."""
    if isinstance(actual, Grads):
        return {f"grad_{k}": v for k, v in actual._asdict().items() if v is not None}
    if isinstance(actual, Mapping):
        return dict(actual)
    return {"out": actual}


def _as_numpy(name: str, a):
    if hasattr(a, "detach") and hasattr(a, "numpy"):  # a torch tensor
        a = a.detach().cpu()
        if str(a.dtype) in ("torch.float32", "torch.float64"):
            return a.numpy()
        return a, str(a.dtype).replace("torch.", "")
    if a is None:
        raise ValueError(f"{name}: got None; pass only the results to compare")
    return np.asarray(a)


def _eps(name: str, a, precision) -> float:
    if precision is not None:
        if isinstance(precision, float):
            return precision
        dt = np.dtype(precision)
        if dt not in _EPS:
            raise ValueError(f"precision: {precision!r} is not float32, float64 or a unit round-off (float)")
        return _EPS[dt]
    dt = a.dtype
    if dt not in _EPS:
        raise ValueError(
            f"{name} has dtype {dt}: the bound knows float32 and float64; pass precision= "
            "(a dtype, or the unit round-off the kernel computed with, e.g. 2**-11 for float16)"
        )
    return _EPS[dt]


def compare(
    actual,
    *,
    input,
    weight,
    offset=None,
    mask=None,
    bias=None,
    grad_out=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=None,
    offset_groups=None,
    convention="torchvision",
    expected=None,
    precision=None,
    rtol=None,
    atol=None,
    bound_factor=DEFAULT_BOUND_FACTOR,
) -> Report:
    """Compares a kernel's results with the exact ones, element by element.

    ``actual``: the forward result (an array), or a mapping from result names (``out``,
    ``grad_input``, ``grad_offset``, ``grad_mask``, ``grad_weight``, ``grad_bias``) to arrays,
    or a `Grads`. Numpy arrays or CPU torch tensors. The operands and parameters are those the
    kernel was given (``offset=None``: a dense convolution); ``grad_out`` is needed to compare
    gradients. The exact results come from the f64 oracle, or from ``expected`` (a mapping of the
    same names) where given.

    Rule: DESIGN §5's per-element bound ``|actual - exact| <= c * eps * (L * sum|terms| + P)``
    with ``c = bound_factor`` and ``eps`` the unit round-off of each result's dtype (float32:
    2^-24, float64: 2^-53) unless ``precision`` (a dtype, or ``eps`` itself) says otherwise.
    With ``rtol``/``atol``, numpy's ``allclose`` rule decides instead (the bound ratio is still
    reported). Returns a `Report`; `assert_close` raises when it fails.
    """
    results = _results(actual)
    if not results:
        raise ValueError("actual: nothing to compare")
    x = _args.array("input", input, 4).astype(np.float64, copy=False)
    w = _args.array("weight", weight, 4).astype(np.float64, copy=False)
    off = None if offset is None else _args.array("offset", offset, 4).astype(np.float64, copy=False)
    m = None if mask is None else _args.array("mask", mask, 4).astype(np.float64, copy=False)
    b = None if bias is None else _args.array("bias", bias, 1).astype(np.float64, copy=False)
    g = None if grad_out is None else _args.array("grad_out", grad_out, 4).astype(np.float64, copy=False)
    og = 1 if off is None else _args.infer_offset_groups(off.shape[1], w.shape, offset_groups)
    p = _args.params(stride, padding, dilation, _args.infer_groups(x, w, groups), og, convention)

    got = []
    for name, a in results.items():
        if name not in RESULTS:
            raise ValueError(f"unknown result {name!r}; expected one of {', '.join(RESULTS)}")
        a = _as_numpy(name, a)
        if isinstance(a, tuple):  # a torch tensor of a dtype numpy cannot hold
            t, dt = a
            if precision is None:
                raise ValueError(
                    f"{name} has dtype {dt}: the bound knows float32 and float64; pass precision= "
                    "(a dtype, or the unit round-off the kernel computed with, e.g. 2**-8 for bfloat16)"
                )
            a = t.double().numpy()
        eps = _eps(name, a, precision)
        got.append((name, np.ascontiguousarray(a, dtype=np.float64), eps))
    exp = [(k, np.asarray(v, dtype=np.float64)) for k, v in _results(expected or {}).items()]
    allclose = None
    if rtol is not None or atol is not None:
        allclose = (float(rtol or 0.0), float(atol or 0.0))
    rows, text = _native.compare(got, exp, x, off, m, w, b, g, p, float(bound_factor), allclose)
    tensors = []
    for r in rows:
        r = dict(r)
        r["shape"] = tuple(r["shape"])
        if "worst_index" in r:
            r["worst_index"] = tuple(r["worst_index"])
        tensors.append(TensorReport(**r))
    return Report(tuple(tensors), text)


def assert_close(actual, **problem) -> Report:
    """`compare`, raising ``AssertionError`` with the report (the worst element's index, both
    values and its error relative to the bound) unless every element passes. Returns the
    report. Takes the same arguments as `compare`."""
    __tracebackhide__ = True  # pytest shows the caller's line
    report = compare(actual, **problem)
    if not report.passed:
        raise AssertionError("results differ from the deformconv oracle\n" + report.text)
    return report
