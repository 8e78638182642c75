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

PRECISIONS = ("f64", "f32", "tf32", "bf16", "f16")
"""The precision profiles of ``precision=`` (unit round-off 2^-53, 2^-24, 2^-11, 2^-8, 2^-11)."""

# The profile of each dtype a result can have (numpy or torch names).
_DTYPE_PRECISION = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_ALIASES = {
    **_DTYPE_PRECISION,
    **{p: p for p in PRECISIONS},
    "double": "f64",
    "float": "f32",
    "half": "f16",
}
# A unit round-off given as a number: 2^-11 is both tf32's and f16's, so it must be named.
_ROUNDOFF = {2.0**-53: "f64", 2.0**-24: "f32", 2.0**-8: "bf16"}


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
    accepted_by_rounding: int
    """Elements over tolerance against the exact value but within it against the value at the
    sample positions as the declared precision rounds them (a sample on the other side of an
    integer or window edge once rounded): accepted, not counted in ``over_tolerance``."""
    statistic: Optional[float]
    """The statistical check's figure: the RMS over elements of ``error / (eps * rms scale)``
    (``None`` when it cannot be formed)."""
    bound_passed: bool
    """Every element within the per-element bound (or the ``rtol``/``atol`` rule)."""
    statistical_passed: bool
    """The statistical check passes (also true when it is off or does not apply: fewer than 64
    elements, or ``rtol``/``atol`` given)."""
    passed: bool
    """``bound_passed and statistical_passed``."""
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
    ambiguous_samples: int
    """Samples whose exact position and the position as the declared precision forms it lie on
    different sides of an integer or window edge (0 with ``strict_positions=True``)."""
    text: str = field(repr=False)

    @property
    def passed(self) -> bool:
        """Whether every element of every tensor is within tolerance and every tensor passes the
        statistical check."""
        return all(t.passed for t in self.tensors)

    @property
    def bound_passed(self) -> bool:
        """Whether every element of every tensor is within tolerance."""
        return all(t.bound_passed for t in self.tensors)

    @property
    def statistical_passed(self) -> bool:
        """Whether every tensor passes the statistical check."""
        return all(t.statistical_passed for t in self.tensors)

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


def _precision(precision) -> Optional[str]:
    """``precision=`` as a profile name (``None``: each result's dtype decides)."""
    if precision is None:
        return None
    if isinstance(precision, float):
        if precision in _ROUNDOFF:
            return _ROUNDOFF[precision]
        raise ValueError(
            f"precision: {precision!r} is not the unit round-off of a profile (2**-53, 2**-24, 2**-8); "
            f"name the profile instead: one of {', '.join(PRECISIONS)}"
            + (" (2**-11 is both tf32 and f16)" if precision == 2.0**-11 else "")
        )
    if isinstance(precision, str):
        name = precision.lower()
    elif type(precision).__module__ == "torch":  # a torch dtype
        name = str(precision).replace("torch.", "")
    else:
        try:
            name = np.dtype(precision).name
        except TypeError:
            name = repr(precision)
    if name not in _ALIASES:
        raise ValueError(
            f"precision: {precision!r} is not a precision profile; expected one of {', '.join(PRECISIONS)} "
            "(or float32, float64, float16, bfloat16 as a name or dtype)"
        )
    return _ALIASES[name]


def _dtype_precision(name: str, dtype: str) -> str:
    if dtype not in _DTYPE_PRECISION:
        raise ValueError(
            f"{name} has dtype {dtype}: the bound knows float64, float32, float16 and bfloat16; "
            f"pass precision= (one of {', '.join(PRECISIONS)})"
        )
    return _DTYPE_PRECISION[dtype]


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
    strict_positions=False,
    statistical=True,
) -> Report:
    """Compares a kernel's results with the exact ones, element by element.

    ``actual``: the forward result (an array), or a mapping from result names (``out``,
    ``grad_input``, ``grad_offset``, ``grad_mask``, ``grad_weight``, ``grad_bias``) to arrays,
    or a `Grads`. Numpy arrays or CPU torch tensors. The operands and parameters are those the
    kernel was given (``offset=None``: a dense convolution); ``grad_out`` is needed to compare
    gradients. The exact results come from the f64 oracle, or from ``expected`` (a mapping of the
    same names) where given.

    Rule (the same as ``deformconv compare``): DESIGN §5's per-element bound
    ``|actual - exact| <= c * u * (L * sum|terms| + P)`` with ``c = bound_factor`` and ``u`` the
    unit round-off of the precision the kernel computed in: ``precision`` — a profile name
    (``"f64"``, ``"f32"``, ``"tf32"``, ``"bf16"``, ``"f16"``: u = 2^-53, 2^-24, 2^-11, 2^-8,
    2^-11), a numpy or torch dtype, or u itself (2**-53, 2**-24, 2**-8) — or, by default, each
    result's dtype (float64, float32, float16, bfloat16). Where that precision rounds a sample
    position ``base + offset`` across an integer or window edge, the value and derivative of
    either side are accepted (``Report.ambiguous_samples``, ``TensorReport.accepted_by_rounding``);
    ``strict_positions=True`` keeps the exact positions everywhere. Beside the bound, a
    statistical check (``statistical=False`` turns it off) fails a tensor of 64+ elements whose
    RMS of ``error / (u * rms scale)`` exceeds 1: the error profile of a kernel that computes in
    a lower precision than declared (e.g. an "f32" kernel using TF32 or fp16 accumulation on a
    large layer). With ``rtol``/``atol``, numpy's ``allclose`` rule decides instead (no positions
    within rounding, no statistical check; the bound ratio is still reported). Returns a
    `Report`; `assert_close` raises when it fails.
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

    declared = _precision(precision)
    got = []
    for name, a in results.items():
        if name not in RESULTS:
            raise ValueError(f"unknown result {name!r}; expected one of {', '.join(RESULTS)}")
        a = _as_numpy(name, a)
        if isinstance(a, tuple):  # a torch tensor of a dtype numpy cannot hold
            t, dt = a
            prec = declared or _dtype_precision(name, dt)
            a = t.double().numpy()
        else:
            prec = declared or _dtype_precision(name, a.dtype.name)
        got.append((name, np.ascontiguousarray(a, dtype=np.float64), prec))
    exp = [(k, np.asarray(v, dtype=np.float64)) for k, v in _results(expected or {}).items()]
    allclose = None
    if rtol is not None or atol is not None:
        allclose = (float(rtol or 0.0), float(atol or 0.0))
    rows, ambiguous, text = _native.compare(
        got, exp, x, off, m, w, b, g, p, float(bound_factor), allclose, bool(strict_positions), bool(statistical)
    )
    tensors = []
    for r in rows:
        r = dict(r)
        r["shape"] = tuple(r["shape"])
        if "worst_index" in r:
            r["worst_index"] = tuple(r["worst_index"])
        tensors.append(TensorReport(**r))
    return Report(tuple(tensors), ambiguous, text)


def assert_close(actual, **problem) -> Report:
    """`compare`, raising ``AssertionError`` with the report (the worst element's index, both
    values and its error relative to the bound, the statistical figure) unless every element
    and the statistical check pass. Returns the
    report. Takes the same arguments as `compare`."""
    __tracebackhide__ = True  # pytest shows the caller's line
    report = compare(actual, **problem)
    if not report.passed:
        raise AssertionError("results differ from the deformconv oracle\n" + report.text)
    return report
