"""The f64 oracle: `deformconv::reference`, plain loops straight from the formulas.

Same signatures as the fast functions of `deformconv`; results are always float64 whatever the
dtype of the operands (float32 operands are widened exactly). Slow by design: use it on test-sized
problems to judge a kernel (`deformconv.compare`), not in a model.
"""

from __future__ import annotations

import numpy as np

from . import _api, _native
from ._api import Grads

__all__ = ["deform_conv2d", "conv2d", "deform_conv2d_backward", "conv2d_backward", "Grads"]


def _dense(x, w, b, p):
    return _native.ref_forward(x, None, None, w, b, p)


def deform_conv2d(
    input,
    offset,
    weight,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    mask=None,
    *,
    groups=None,
    offset_groups=None,
    convention="torchvision",
) -> np.ndarray:
    """The exact forward of `deformconv.deform_conv2d`, in float64."""
    return _api._forward(
        _native.ref_forward, input, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups, convention
    )


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=None) -> np.ndarray:
    """The exact forward of `deformconv.conv2d`, in float64."""
    return _api._dense_forward(_dense, input, weight, bias, stride, padding, dilation, groups)


def deform_conv2d_backward(
    grad_out,
    input,
    offset,
    weight,
    mask=None,
    stride=1,
    padding=0,
    dilation=1,
    *,
    groups=None,
    offset_groups=None,
    convention="torchvision",
    needs=None,
) -> Grads:
    """The exact gradients of `deformconv.deform_conv2d_backward`, in float64 (each computed by
    its own reference loop)."""
    return _api._backward(
        _native.ref_backward, grad_out, input, offset, weight, mask, stride, padding, dilation, groups, offset_groups, convention, needs
    )


def conv2d_backward(grad_out, input, weight, stride=1, padding=0, dilation=1, groups=None, *, needs=None) -> Grads:
    """The exact gradients of `deformconv.conv2d_backward`, in float64."""
    return _api._dense_backward(_native.ref_backward, grad_out, input, weight, stride, padding, dilation, groups, needs)
