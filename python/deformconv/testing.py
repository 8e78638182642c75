"""Property-testing a deformable convolution kernel against the oracle, with Hypothesis.

`problems` generates valid problems with the distributions of the Rust crate's
``deformconv::testing::problems``: the shape (batch, groups, offset groups, channels, kernel,
stride, dilation, symmetric or per-side padding, image size, DCN v1 or v2, bias or not) is drawn
by Hypothesis, which shrinks it towards the smallest valid problem; the values are filled by the
crate's own generator from a seed, so they are exactly those of the Rust strategies: offsets
free, integer, half-integer, placed exactly on (and just inside or beyond) the borders ``-1``,
``0``, ``H-1``, ``H``, or far outside; masks with zeros, ones, negatives and values above 1.

A kernel under test (here torchvision's own CPU op)::

    import torch, torchvision
    from hypothesis import given, settings
    from deformconv.testing import problems

    @settings(max_examples=50, deadline=None)
    @given(problems(symmetric_padding=True))  # torchvision pads symmetrically only
    def test_torchvision_matches_the_oracle(p):
        t = p.tensors(requires_grad=True)      # torch tensors of p's operands
        out = torchvision.ops.deform_conv2d(t.input, t.offset, t.weight, t.bias, mask=t.mask, **p.torch_params())
        out.backward(t.grad_out)
        p.assert_close(out=out, grad_input=t.input.grad, grad_offset=t.offset.grad,
                       grad_weight=t.weight.grad)
"""

from dataclasses import dataclass, fields, replace
from math import gcd
from types import SimpleNamespace
from typing import Optional

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("deformconv.testing needs Hypothesis: pip install hypothesis") from e

from . import _native
from ._args import Padding
from ._compare import DEFAULT_BOUND_FACTOR, Report, assert_close, compare

__all__ = ["Limits", "Problem", "ProblemShape", "problem_shapes", "problems"]


@dataclass(frozen=True)
class Limits:
    """Bounds on the generated problems (the defaults are the Rust crate's ``Limits``). Every
    range starts at its smallest valid value, which is where shrinking goes."""

    min_batch: int = 1
    max_batch: int = 2
    max_groups: int = 3
    max_offset_groups: int = 3
    max_input_multiple: int = 2
    """``C_in = lcm(groups, offset_groups) * m`` with ``m`` up to this."""
    max_output_per_group: int = 2
    max_kernel: int = 3
    max_stride: int = 2
    max_dilation: int = 2
    max_padding: int = 2
    max_extra_size: int = 6
    """Image rows (columns) beyond the fewest that give one output row (column)."""
    mask: Optional[bool] = None
    """``True``: always a mask (DCN v2); ``False``: never (DCN v1); ``None``: either."""
    bias: Optional[bool] = None
    symmetric_padding: bool = False
    """Only torchvision-style padding (``top == bottom``, ``left == right``)."""


@dataclass(frozen=True)
class ProblemShape:
    """The shape of a problem; with a seed it names the problem forever."""

    input: tuple
    weight: tuple
    stride: tuple
    padding: Padding
    dilation: tuple
    groups: int
    offset_groups: int
    mask: bool
    bias: bool


def _min_extent(k: int, dil: int, pad_sum: int) -> int:
    return max(1, dil * (k - 1) + 1 - pad_sum)


def _presence(flag: Optional[bool]):
    return st.booleans() if flag is None else st.just(flag)


def problem_shapes(limits: Limits = Limits()):
    """Strategy for valid `ProblemShape` values within ``limits`` (the Rust
    ``testing::problem_shapes``)."""
    lim = limits

    def upto(m):
        return st.integers(1, max(1, m))

    @st.composite
    def shapes(draw):
        n = draw(st.integers(lim.min_batch, max(lim.max_batch, lim.min_batch)))
        groups, og = draw(upto(lim.max_groups)), draw(upto(lim.max_offset_groups))
        c_mult, o_mult = draw(upto(lim.max_input_multiple)), draw(upto(lim.max_output_per_group))
        kh, kw = draw(upto(lim.max_kernel)), draw(upto(lim.max_kernel))
        sh, sw = draw(upto(lim.max_stride)), draw(upto(lim.max_stride))
        dh, dw = draw(upto(lim.max_dilation)), draw(upto(lim.max_dilation))
        asymmetric = False if lim.symmetric_padding else draw(st.booleans())
        pads = [draw(st.integers(0, lim.max_padding)) for _ in range(4)]
        extra_h, extra_w = draw(st.integers(0, lim.max_extra_size)), draw(st.integers(0, lim.max_extra_size))
        mask, bias = draw(_presence(lim.mask)), draw(_presence(lim.bias))
        top, bottom, left, right = pads
        pad = Padding(top, bottom, left, right) if asymmetric else Padding(top, top, left, left)
        c_in = (groups // gcd(groups, og)) * og * c_mult
        h = _min_extent(kh, dh, pad.top + pad.bottom) + extra_h
        w = _min_extent(kw, dw, pad.left + pad.right) + extra_w
        return ProblemShape(
            input=(n, c_in, h, w),
            weight=(groups * o_mult, c_in // groups, kh, kw),
            stride=(sh, sw),
            padding=pad,
            dilation=(dh, dw),
            groups=groups,
            offset_groups=og,
            mask=mask,
            bias=bias,
        )

    return shapes()


@dataclass(frozen=True, eq=False, repr=False)
class Problem:
    """A complete problem: every operand of the forward and of every gradient, and its
    parameters. Arrays are numpy, of the dtype asked for."""

    input: np.ndarray
    offset: np.ndarray
    mask: Optional[np.ndarray]
    weight: np.ndarray
    bias: Optional[np.ndarray]
    grad_out: np.ndarray
    """The gradient flowing into the output."""
    stride: tuple
    padding: Padding
    dilation: tuple
    groups: int
    offset_groups: int
    seed: int = 0

    @classmethod
    def random(cls, shape: ProblemShape, seed: int, dtype=np.float32) -> "Problem":
        """The problem of ``shape`` filled from ``seed`` by the crate's generator
        (``deformconv::testing::Problem::random``): the same pair always gives the same values."""
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype: expected float32 or float64, got {dt}")
        p = (*shape.stride, *shape.padding, *shape.dilation, shape.groups, shape.offset_groups, "torchvision")
        a = _native.random_problem(
            tuple(shape.input), tuple(shape.weight), p, shape.mask, shape.bias, seed, dt == np.dtype(np.float32)
        )
        return cls(
            stride=tuple(shape.stride),
            padding=Padding(*shape.padding),
            dilation=tuple(shape.dilation),
            groups=shape.groups,
            offset_groups=shape.offset_groups,
            seed=seed,
            **a,
        )

    @property
    def symmetric(self) -> bool:
        """Whether the padding is torchvision-style (``top == bottom``, ``left == right``)."""
        return self.padding.top == self.padding.bottom and self.padding.left == self.padding.right

    def params(self) -> dict:
        """Keyword arguments for `deformconv.deform_conv2d` and `deformconv.compare`."""
        return dict(
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            offset_groups=self.offset_groups,
        )

    def torch_params(self) -> dict:
        """``stride``, ``padding`` and ``dilation`` for ``torchvision.ops.deform_conv2d`` (which
        infers the groups from the shapes); requires symmetric padding."""
        if not self.symmetric:
            raise ValueError(f"padding {tuple(self.padding)} is not symmetric: torchvision cannot express it")
        return dict(stride=self.stride, padding=(self.padding.top, self.padding.left), dilation=self.dilation)

    def operands(self) -> dict:
        """``input``, ``offset``, ``mask``, ``weight``, ``bias``, ``grad_out``."""
        return dict(
            input=self.input,
            offset=self.offset,
            mask=self.mask,
            weight=self.weight,
            bias=self.bias,
            grad_out=self.grad_out,
        )

    def tensors(self, requires_grad: bool = False) -> SimpleNamespace:
        """The operands as CPU torch tensors (copies), ``requires_grad`` on all but ``grad_out``."""
        import torch

        def t(a, grad=requires_grad):
            return None if a is None else torch.tensor(a).requires_grad_(grad)

        ops = self.operands()
        return SimpleNamespace(**{k: t(v, requires_grad and k != "grad_out") for k, v in ops.items()})

    @property
    def outputs(self) -> tuple:
        """The results this problem defines (``grad_mask`` with a mask, ``grad_bias`` with a bias)."""
        names = ["out", "grad_input", "grad_offset"]
        names += ["grad_mask"] if self.mask is not None else []
        names += ["grad_weight"]
        names += ["grad_bias"] if self.bias is not None else []
        return tuple(names)

    def report(
        self,
        precision=None,
        bound_factor=DEFAULT_BOUND_FACTOR,
        strict_positions=False,
        statistical=True,
        **actual,
    ) -> Report:
        """`deformconv.compare` of the named results (``out=...``, ``grad_input=...``, ...) with
        the oracle's."""
        return compare(
            actual,
            precision=precision,
            bound_factor=bound_factor,
            strict_positions=strict_positions,
            statistical=statistical,
            **self.operands(),
            **self.params(),
        )

    def assert_close(
        self,
        precision=None,
        bound_factor=DEFAULT_BOUND_FACTOR,
        strict_positions=False,
        statistical=True,
        **actual,
    ) -> Report:
        """`deformconv.assert_close` of the named results; the failure message names the problem
        (shape, parameters, seed) and shows the worst element of each result."""
        __tracebackhide__ = True
        try:
            return assert_close(
                actual,
                precision=precision,
                bound_factor=bound_factor,
                strict_positions=strict_positions,
                statistical=statistical,
                **self.operands(),
                **self.params(),
            )
        except AssertionError as e:
            raise AssertionError(f"{self.describe()}\n{e}") from None

    def __repr__(self) -> str:
        return f"<Problem {self.describe()}>"

    def describe(self) -> str:
        m = "mask" if self.mask is not None else "no mask"
        b = "bias" if self.bias is not None else "no bias"
        return (
            f"problem: input {self.input.shape} {self.input.dtype}, weight {self.weight.shape}, "
            f"offset {self.offset.shape}, {m}, {b}, stride {self.stride}, padding {tuple(self.padding)} "
            f"(top, bottom, left, right), dilation {self.dilation}, groups {self.groups}, "
            f"offset_groups {self.offset_groups}, seed {self.seed}"
        )


def problems(dtype=np.float32, limits: Optional[Limits] = None, **overrides):
    """Strategy for valid `Problem` values of ``dtype`` (float32 or float64) within ``limits``
    (default `Limits`), any field of which may be overridden by keyword:
    ``problems(symmetric_padding=True, mask=True, max_batch=1)``."""
    lim = limits or Limits()
    if overrides:
        unknown = set(overrides) - {f.name for f in fields(Limits)}
        if unknown:
            raise TypeError(f"problems: unknown limits {sorted(unknown)}")
        lim = replace(lim, **overrides)
    seeds = st.integers(0, 2**64 - 1)
    return st.builds(lambda shape, seed: Problem.random(shape, seed, dtype), problem_shapes(lim), seeds)
