"""Second (and higher) derivatives of the deformable convolution: the derivative of its backward.

The fast kernels compute the forward ``F(input, offset, mask, weight, bias)`` and its
vector-Jacobian product, the backward ``B(grad_out, input, offset, mask, weight) =
grad_out^T dF``. A gradient penalty (WGAN-GP, R1), MAML or a Hessian-vector product
differentiates ``B`` once more. Here ``B``'s own vector-Jacobian product is obtained by
autograd: the forward is written again in differentiable PyTorch operations
(`forward_by_torch_ops`), ``B`` is formed from it with ``create_graph=True`` and differentiated
against the incoming cotangents. That costs memory proportional to the deformable columns
(``N * C_in * kh * kw * H_out * W_out`` values) and runs at PyTorch's speed, not the kernels':
second derivatives are rare and exactness is what matters. The result is itself built from
differentiable operations, so third and further derivatives are right too.

The sampling rule (``DESIGN.md`` §3, ``deformconv.CONVENTIONS``): a sample at ``(py, px)`` in an
``H x W`` plane is the bilinear interpolation of its four corners ``floor(p)``, ``floor(p) + 1``
(corners outside the image read 0), and counts only inside the convention's window
(torchvision, mmcv: ``-1 < p < size``; DCN v1: ``0 <= p < size``, with the cell collapsed onto
the last row or column when ``floor(p) >= size - 1``). The conventions differ in their first
derivative only at samples exactly on a window border, a set of measure zero on which this
module takes the derivative of the formula inside the window. At integer positions, where the
bilinear interpolation has a kink, the derivative is the right-hand one (as the kernels'). NaN
positions give NaN and infinite ones 0, as the kernels do.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _out_extent(size: int, before: int, after: int, k: int, dil: int, stride: int) -> int:
    return (size + before + after - (dil * (k - 1) + 1)) // stride + 1


def _axis(p: Tensor, size: int, convention: str):
    """``(lo, hi, frac, inside)`` of a sample coordinate along one axis: the two corner indices
    (float, integral), the fraction with its gradient to ``p``, and the window test."""
    finite = torch.isfinite(p)
    if convention == "dcn_v1":
        inside = finite & (p >= 0) & (p < size)
    else:
        inside = finite & (p > -1) & (p < size)
    # Outside the window the sample is 0 whatever `p` is; a neutral position keeps NaN and inf
    # out of the arithmetic (and of the gradient) there.
    p = torch.where(inside, p, torch.zeros_like(p))
    lo = torch.floor(p).detach()
    frac = p - lo
    hi = lo + 1
    if convention == "dcn_v1":
        last = torch.full_like(lo, size - 1)
        collapsed = lo >= size - 1
        lo = torch.where(collapsed, last, lo)
        hi = torch.where(collapsed, last, hi)
        frac = torch.where(collapsed, torch.zeros_like(frac), frac)
    return lo, hi, frac, inside


def forward_by_torch_ops(input, offset, weight, mask, bias, params, convention) -> Tensor:
    """The deformable convolution in differentiable PyTorch operations (any dtype and device),
    with the custom op's arguments: ``params = [stride_h, stride_w, top, bottom, left, right,
    dil_h, dil_w, groups, offset_groups]``."""
    sh, sw, top, bottom, left, right, dh, dw, groups, og = params
    n, c_in, h, w = input.shape
    c_out, cig, kh, kw = weight.shape
    taps = kh * kw
    h_out = _out_extent(h, top, bottom, kh, dh, sh)
    w_out = _out_extent(w, left, right, kw, dw, sw)
    pixels = h_out * w_out

    def base(out_len, stride, pad, k, dil):
        o = torch.arange(out_len, dtype=input.dtype, device=input.device)
        t = torch.arange(k, dtype=input.dtype, device=input.device)
        return t[:, None] * dil + (o * stride - pad)[None, :]  # [k, out]

    by = base(h_out, sh, top, kh, dh)[:, None, :, None]  # [kh, 1, h_out, 1]
    bx = base(w_out, sw, left, kw, dw)[None, :, None, :]  # [1, kw, 1, w_out]
    base_y = by.expand(kh, kw, h_out, w_out).reshape(taps, h_out, w_out)
    base_x = bx.expand(kh, kw, h_out, w_out).reshape(taps, h_out, w_out)
    off = offset.reshape(n, og, taps, 2, h_out, w_out)
    y0, y1, ly, in_y = _axis(base_y + off[:, :, :, 0], h, convention)  # [n, og, taps, h_out, w_out]
    x0, x1, lx, in_x = _axis(base_x + off[:, :, :, 1], w, convention)
    counts = (in_y & in_x).to(input.dtype)
    if mask is not None:
        counts = counts * mask.reshape(n, og, taps, h_out, w_out)

    planes = input.reshape(n, og, c_in // og, h * w)
    cols = None
    for r, wr in ((y0, 1 - ly), (y1, ly)):
        for s, ws in ((x0, 1 - lx), (x1, lx)):
            in_image = ((r >= 0) & (r < h) & (s >= 0) & (s < w)).to(input.dtype)
            index = (r.clamp(0, h - 1) * w + s.clamp(0, w - 1)).long().reshape(n, og, 1, -1)
            values = torch.gather(planes, 3, index.expand(n, og, c_in // og, index.shape[-1]))
            weight_k = (wr * ws * in_image * counts).reshape(n, og, 1, -1)
            term = values * weight_k
            cols = term if cols is None else cols + term
    # [n, og, c/og, taps * pixels] -> [n, groups, cig * taps, pixels]
    cols = cols.reshape(n, groups, cig * taps, pixels)
    out = torch.einsum("gok,ngkp->ngop", weight.reshape(groups, c_out // groups, cig * taps), cols)
    out = out.reshape(n, c_out, h_out, w_out)
    if bias is not None:
        out = out + bias[None, :, None, None]
    return out


def _alias(t: Tensor) -> Tensor:
    """``t`` as a tensor autograd can differentiate against: a view that carries gradients on to
    ``t`` when ``t`` is part of a graph, else a fresh leaf."""
    return t.view_as(t) if t.requires_grad else t.detach().requires_grad_()


def backward_of_backward(saved, cotangents, params, convention, needs):
    """The vector-Jacobian product of the backward ``(grad_input, grad_offset, grad_mask,
    grad_weight, grad_bias) = B(grad_out, input, offset, mask, weight)`` (the flags ``needs``
    say which of them were computed) against ``cotangents`` (same order, ``None`` where
    absent). Returns the gradients for ``(grad_out, input, offset, weight, mask)``, ``None``
    where nothing flows. Differentiable again when grad mode is on (``create_graph=True``)."""
    create_graph = torch.is_grad_enabled()
    grad_out, input, offset, weight, mask = saved
    pairs = [(k, c) for k, c in enumerate(cotangents) if needs[k] and c is not None and c.numel()]
    if not pairs:
        return None, None, None, None, None
    with torch.enable_grad():
        go, x, o, w = (_alias(t) for t in (grad_out, input, offset, weight))
        m = None if mask is None else _alias(mask)
        y = forward_by_torch_ops(x, o, w, m, None, params, convention)
        # The first derivatives as functions of (go, x, o, m, w); the bias gradient, the sum of
        # grad_out over (n, y, x), needs no forward.
        wrt = (x, o, m, w)
        firsts_wanted = [k for k, _ in pairs if k < 4]
        firsts = torch.autograd.grad(
            y, [wrt[k] for k in firsts_wanted], go, create_graph=True, allow_unused=True
        )
        first = dict(zip(firsts_wanted, firsts))
        total = None
        for k, c in pairs:
            f = go.sum((0, 2, 3)) if k == 4 else first[k]
            if f is None:  # a first derivative independent of every operand (e.g. no taps)
                continue
            term = (f * c).sum()
            total = term if total is None else total + term
        operands = [go, x, o, w] + ([m] if m is not None else [])
        if total is None or not total.requires_grad:
            grads = [None] * len(operands)
        else:
            grads = list(torch.autograd.grad(total, operands, allow_unused=True, create_graph=create_graph))
    if m is None:
        grads.append(None)
    return tuple(grads)
