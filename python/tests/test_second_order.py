"""Second derivatives (double backward) of deformconv.torch: gradgradcheck in float64 on random
problems for every operand, with and without mask, under each convention, on the eager path,
the custom op's path and torchvision's operator after use_for_torchvision(); and a gradient
penalty's parameter gradients against autograd run through the differentiable formulation."""

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import deformconv.torch as dct  # noqa: E402
from deformconv import _second_order  # noqa: E402


def operands(mask, groups=2, og=2, stride=1, dilation=1, padding=1, seed=0):
    """``(input, offset, weight, bias, mask, geometry)`` in float64, requiring grad. Offsets sit
    at least 0.25 from an integer, where the sampling is smooth: the finite differences of
    gradgradcheck straddle no corner change."""
    g = torch.Generator().manual_seed(seed)
    n, c_in, c_out, h, w, k = 1, 4, 4, 5, 4, 3
    h_out = (h + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    w_out = (w + 2 * padding - dilation * (k - 1) - 1) // stride + 1

    def r(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * scale).requires_grad_()

    taps = og * k * k
    whole = torch.randint(-2, 2, (n, 2 * taps, h_out, w_out), generator=g).double()
    offset = (whole + 0.25 + 0.5 * torch.rand(n, 2 * taps, h_out, w_out, generator=g, dtype=torch.float64))
    geometry = dict(stride=stride, padding=padding, dilation=dilation)
    return (
        r(n, c_in, h, w),
        offset.requires_grad_(),
        r(c_out, c_in // groups, k, k),
        r(c_out),
        r(n, taps, h_out, w_out) if mask else None,
        geometry,
    )


def check(fn, mask, **kw):
    x, off, w, b, m, geometry = operands(mask, **kw)
    args = (x, off, w, b) + ((m,) if mask else ())

    def f(x, off, w, b, m=None):
        return fn(x, off, w, b, mask=m, **geometry)

    return torch.autograd.gradgradcheck(f, args, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("convention", ["torchvision", "mmcv", "dcn_v1"])
@pytest.mark.parametrize("mask", [True, False])
def test_gradgradcheck_every_operand(convention, mask):
    """Every second derivative (grad_out, input, offset, mask, weight, bias pairs) against finite
    differences of the backward kernels; groups 2 and offset groups 2, with a stride or a
    dilation."""

    def fn(*a, **kw):
        return dct.deform_conv2d(*a, **kw, convention=convention)

    extra = dict(stride=2) if mask else dict(dilation=2, padding=2)
    assert check(fn, mask, **extra)


class _PassThrough(torch.overrides.TorchFunctionMode):
    """Any active mode makes deformconv.torch take the custom op instead of the eager shortcut."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_gradgradcheck_through_the_custom_op():
    with _PassThrough():
        assert check(dct.deform_conv2d, mask=True, og=1, seed=1)


def test_gradgradcheck_torchvision_operator_on_our_kernels():
    x, off, w, b, m, geometry = operands(True, seed=2)
    with pytest.raises(RuntimeError, match="double backwards"):
        # torchvision's own CPU kernel refuses; ours computes it.
        out = torchvision.ops.deform_conv2d(x, off, w, b, mask=m, **geometry)
        (g,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        g.sum().backward()
    with dct.use_for_torchvision():
        assert check(torchvision.ops.deform_conv2d, mask=True, seed=2)
        with _PassThrough():
            assert check(torchvision.ops.deform_conv2d, mask=False, seed=3)


def gradient_penalty_grads(conv_fn, x, off, w, b, m, geometry):
    """The parameter gradients of an R1-style penalty ``|d loss / d input|^2`` (grad_outputs that
    do not require grad: the case a once-differentiable backward would silently get wrong)."""
    loss = conv_fn(x, off, w, b, m, geometry).tanh().sum()
    (gx,) = torch.autograd.grad(loss, x, create_graph=True)
    penalty = gx.square().sum()
    return torch.autograd.grad(penalty, (off, w, b, m))


def test_gradient_penalty_matches_autograd_of_the_formulation():
    x, off, w, b, m, geometry = operands(True, seed=4)

    def ours(x, off, w, b, m, geo):
        return dct.deform_conv2d(x, off, w, b, mask=m, **geo)

    def formulation(x, off, w, b, m, geo):
        s, p, d = geo["stride"], geo["padding"], geo["dilation"]
        params = [s, s, p, p, p, p, d, d, 2, 2]
        return _second_order.forward_by_torch_ops(x, off, w, m, b, params, "torchvision")

    got = gradient_penalty_grads(ours, x, off, w, b, m, geometry)
    want = gradient_penalty_grads(formulation, x, off, w, b, m, geometry)
    for name, a, e in zip(("offset", "weight", "bias", "mask"), got, want):
        assert a.abs().max() > 0, name
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)


def test_third_derivative_is_differentiable():
    """A Hessian-vector product differentiated once more runs and matches the formulation."""
    x, off, w, b, m, geometry = operands(True, og=1, seed=5)
    v = torch.randn_like(x)

    def third(fn):
        y = fn(x).square().sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (hv,) = torch.autograd.grad((g * v).sum(), x, create_graph=True)
        return torch.autograd.grad(hv.square().sum(), w)[0]

    s, p, d = geometry["stride"], geometry["padding"], geometry["dilation"]
    params = [s, s, p, p, p, p, d, d, 2, 1]
    got = third(lambda t: dct.deform_conv2d(t, off, w, b, mask=m, **geometry))
    want = third(lambda t: _second_order.forward_by_torch_ops(t, off, w, m, b, params, "torchvision"))
    assert got.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
