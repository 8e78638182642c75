"""channels_last tensors through deformconv.torch: results in the operands' memory layout (as
torch.nn.functional.conv2d's), bitwise equal to the NCHW results, on the eager path, the custom
op's path and torchvision's operator after use_for_torchvision(); the numpy API reads NHWC-strided
arrays as they are."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import deformconv  # noqa: E402
import deformconv.torch as dct  # noqa: E402

CL = torch.channels_last


def operands(dtype, og=2, mask=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    n, c_in, c_out, h, w = 2, 24, 20, 9, 11

    def r(*s, scale=1.0):
        return (torch.rand(*s, generator=g, dtype=dtype) * 2 - 1) * scale

    return dict(
        input=r(n, c_in, h, w),
        offset=r(n, 2 * og * 9, h, w, scale=3.0),
        weight=r(c_out, c_in // 2, 3, 3),
        bias=r(c_out),
        mask=r(n, og * 9, h, w) if mask else None,
        grad=r(n, c_out, h, w),
    )


def run(fn, t, layout):
    """Output and every gradient, with the 4-D operands (and the incoming gradient) in
    ``layout``; checks each result's layout."""
    leaves = {}
    for k, v in t.items():
        if v is None:
            leaves[k] = None
            continue
        v = v.detach().to(memory_format=layout if v.dim() == 4 else torch.contiguous_format, copy=True)
        leaves[k] = v.requires_grad_(k != "grad")
    out = fn(leaves["input"], leaves["offset"], leaves["weight"], leaves["bias"], padding=1, mask=leaves["mask"])
    out.backward(leaves["grad"])
    res = {"out": out.detach()}
    for k in ("input", "offset", "weight", "mask", "bias"):
        if leaves[k] is not None:
            res[k] = leaves[k].grad
            assert res[k].is_contiguous(memory_format=layout if res[k].dim() == 4 else torch.contiguous_format), k
    assert out.is_contiguous(memory_format=layout)
    return res


class _PassThrough(torch.overrides.TorchFunctionMode):
    """Any active mode makes deformconv.torch take the custom op instead of the eager shortcut."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("og,mask", [(1, True), (2, True), (2, False)])
def test_channels_last_in_channels_last_out_same_bits(dtype, og, mask):
    t = operands(dtype, og, mask)
    nchw = run(dct.deform_conv2d, t, torch.contiguous_format)
    nhwc = run(dct.deform_conv2d, t, CL)
    with _PassThrough():
        through_op = run(dct.deform_conv2d, t, CL)
    for k in nchw:
        assert torch.equal(nchw[k], nhwc[k]), k
        assert torch.equal(nchw[k], through_op[k]), k


def test_torchvision_operator_keeps_channels_last():
    t = operands(torch.float32)
    with dct.use_for_torchvision():
        nhwc = run(torchvision.ops.deform_conv2d, t, CL)
    nchw = run(dct.deform_conv2d, t, torch.contiguous_format)
    for k in nchw:
        assert torch.equal(nchw[k], nhwc[k]), k


def test_compiled_channels_last_matches_eager():
    """The fake kernel's strides agree with the real ones (torch.compile checks them)."""
    t = operands(torch.float32, seed=1)
    args = [t["input"], t["offset"], t["weight"], t["bias"]]
    args = [a.contiguous(memory_format=CL) if a.dim() == 4 else a for a in args]
    mask = t["mask"].contiguous(memory_format=CL)
    compiled = torch.compile(lambda *a: dct.deform_conv2d(*a, padding=1, mask=mask), backend="aot_eager", fullgraph=True)
    out = compiled(*args)
    assert out.is_contiguous(memory_format=CL)
    assert torch.equal(out, dct.deform_conv2d(*args, padding=1, mask=mask))


def test_numpy_api_reads_nhwc_strided_arrays():
    t = {k: None if v is None else v.numpy() for k, v in operands(torch.float32).items()}
    nhwc = {k: None if v is None or v.ndim != 4 else np.ascontiguousarray(v.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) for k, v in t.items()}
    assert not nhwc["input"].flags.c_contiguous
    want = deformconv.deform_conv2d(t["input"], t["offset"], t["weight"], t["bias"], padding=1, mask=t["mask"])
    got = deformconv.deform_conv2d(nhwc["input"], nhwc["offset"], nhwc["weight"], t["bias"], padding=1, mask=nhwc["mask"])
    assert np.array_equal(want, got)
    grads = [
        deformconv.deform_conv2d_backward(
            a["grad"], a["input"], a["offset"], a["weight"], padding=1, mask=a["mask"], needs=("input", "offset", "mask", "weight", "bias")
        )
        for a in (t, nhwc)
    ]
    for name in ("input", "offset", "mask", "weight", "bias"):
        assert np.array_equal(getattr(grads[0], name), getattr(grads[1], name)), name
