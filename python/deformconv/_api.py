"""The numpy front end: `deform_conv2d`, `conv2d` and their backward passes, fast or reference."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from . import _args, _native


class Grads(NamedTuple):
    """Gradients of a backward pass; ``None`` for those not asked for (``needs``)."""

    input: Optional[np.ndarray]
    offset: Optional[np.ndarray]
    mask: Optional[np.ndarray]
    weight: Optional[np.ndarray]
    bias: Optional[np.ndarray]


def _deform_operands(input, offset, weight, bias, mask, grad_out=None):
    x = _args.array("input", input, 4)
    dt = x.dtype
    return (
        x,
        _args.array("offset", offset, 4, dt),
        _args.array("weight", weight, 4, dt),
        _args.optional("bias", bias, 1, dt),
        _args.optional("mask", mask, 4, dt),
        _args.optional("grad_out", grad_out, 4, dt),
    )


def _forward(native, input, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups, convention):
    x, off, w, b, m, _ = _deform_operands(input, offset, weight, bias, mask)
    p = _args.params(
        stride,
        padding,
        dilation,
        _args.infer_groups(x, w, groups),
        _args.infer_offset_groups(off.shape[1], w.shape, offset_groups),
        convention,
    )
    return native(x, off, m, w, b, p)


def _dense_forward(native, input, weight, bias, stride, padding, dilation, groups):
    x = _args.array("input", input, 4)
    w = _args.array("weight", weight, 4, x.dtype)
    b = _args.optional("bias", bias, 1, x.dtype)
    p = _args.params(stride, padding, dilation, _args.infer_groups(x, w, groups), 1, "torchvision")
    return native(x, w, b, p)


def _backward(native, grad_out, input, offset, weight, mask, stride, padding, dilation, groups, offset_groups, convention, needs):
    x, off, w, _, m, g = _deform_operands(input, offset, weight, None, mask, grad_out)
    if g is None:
        raise TypeError("grad_out: expected an array, got None")
    if needs is None:
        needs = ("input", "offset", "weight", "bias") + (("mask",) if m is not None else ())
    p = _args.params(
        stride,
        padding,
        dilation,
        _args.infer_groups(x, w, groups),
        _args.infer_offset_groups(off.shape[1], w.shape, offset_groups),
        convention,
    )
    return Grads(*native(g, x, off, m, w, p, _args.needs(needs)))


def _dense_backward(native, grad_out, input, weight, stride, padding, dilation, groups, needs):
    x = _args.array("input", input, 4)
    w = _args.array("weight", weight, 4, x.dtype)
    g = _args.array("grad_out", grad_out, 4, x.dtype)
    if needs is None:
        needs = ("input", "weight", "bias")
    p = _args.params(stride, padding, dilation, _args.infer_groups(x, w, groups), 1, "torchvision")
    return Grads(*native(g, x, None, None, w, p, _args.needs(needs, dense=True)))


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
    """Deformable convolution (DCN v1, or v2 with ``mask``), forward, in the dtype of ``input``.

    Arguments in torchvision's order and with its shapes: ``input [N, C_in, H, W]``,
    ``offset [N, 2 * offset_groups * kh * kw, H_out, W_out]`` (``(dy, dx)`` per group and tap),
    ``weight [C_out, C_in / groups, kh, kw]``, ``bias [C_out]``,
    ``mask [N, offset_groups * kh * kw, H_out, W_out]``; ``stride`` and ``dilation`` an int or
    ``(h, w)``; ``padding`` an int, ``(pad_h, pad_w)`` or ``(top, bottom, left, right)``
    (`Padding`). ``groups`` and ``offset_groups`` are inferred from the shapes as torchvision
    does unless given. ``convention``: ``"torchvision"`` (default), ``"mmcv"`` or ``"dcn_v1"``
    (the border rules of `deformconv::Convention`). All arrays float32, or all float64, any
    strides. Returns ``[N, C_out, H_out, W_out]``.
    """
    return _forward(
        _native.deform_conv2d, input, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups, convention
    )


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=None) -> np.ndarray:
    """Dense (strided, dilated, grouped) 2-D cross-correlation, as ``torch.nn.functional.conv2d``
    (with per-side padding allowed): equal to `deform_conv2d` with zero offsets and no mask."""
    return _dense_forward(_native.conv2d, input, weight, bias, stride, padding, dilation, groups)


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
    """The gradients of `deform_conv2d` for the output gradient ``grad_out``, as a `Grads`
    ``(input, offset, mask, weight, bias)``.

    Only the gradients named in ``needs`` (some of ``"input"``, ``"offset"``, ``"mask"``,
    ``"weight"``, ``"bias"``) are computed; the others are ``None``. By default every gradient
    (``"mask"`` only when a mask is given: without one, it is the gradient with respect to a
    unit mask). They are computed in one pass that shares the sampling between them.
    """
    return _backward(
        _native.backward, grad_out, input, offset, weight, mask, stride, padding, dilation, groups, offset_groups, convention, needs
    )


def conv2d_backward(grad_out, input, weight, stride=1, padding=0, dilation=1, groups=None, *, needs=None) -> Grads:
    """The gradients of `conv2d` (``needs``: some of ``"input"``, ``"weight"``, ``"bias"``, all by
    default); ``offset`` and ``mask`` are ``None``."""
    return _dense_backward(_native.backward, grad_out, input, weight, stride, padding, dilation, groups, needs)
