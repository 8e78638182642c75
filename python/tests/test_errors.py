"""Bad input raises ValueError or TypeError carrying the crate's message (which tensor or
parameter, what was expected, what was got): never a crash, never a silent wrong answer."""

import re

import numpy as np
import pytest

import deformconv
from deformconv import reference


def ops(dtype=np.float32):
    return dict(
        input=np.zeros((2, 4, 6, 6), dtype),
        offset=np.zeros((2, 18, 4, 4), dtype),
        weight=np.zeros((3, 4, 3, 3), dtype),
    )


def call(module, input, offset, weight, **kw):
    return module.deform_conv2d(input, offset, weight, **kw)


# (change to the operands or keyword arguments, exception, the crate's exact message)
CASES = [
    (dict(offset=np.zeros((2, 10, 4, 4), np.float32)), ValueError,
     "offset has 10 channels; expected 2 * offset_groups(1) * kh(3) * kw(3) = 18"),
    (dict(offset=np.zeros((2, 18, 5, 4), np.float32)), ValueError,
     "offset has 5 rows; expected"),
    (dict(offset=np.zeros((3, 18, 4, 4), np.float32)), ValueError,
     "offset has 3 images; expected"),
    (dict(mask=np.zeros((2, 8, 4, 4), np.float32)), ValueError,
     "mask has 8 channels; expected"),
    (dict(bias=np.zeros(5, np.float32)), ValueError, "bias has 5 elements; expected"),
    (dict(groups=3), ValueError, "groups: 3 must divide input channels (4)"),
    (dict(offset_groups=3), ValueError, "offset_groups: 3 must divide input channels (4)"),
    (dict(weight=np.zeros((3, 3, 3, 3), np.float32)), ValueError,
     "weight has 3 input channels per group (axis 1); expected input channels(4) / groups(1) = 4"),
    (dict(weight=np.zeros((3, 4, 9, 9), np.float32)), ValueError, "rows"),
    (dict(stride=0), ValueError, "stride: (0, 0) must be at least 1 on both axes"),
    (dict(stride=(1, -2)), ValueError, "stride: (1, -2) must be at least 1 on both axes"),
    (dict(dilation=(0, 1)), ValueError, "dilation: (0, 1) must be at least 1 on both axes"),
    (dict(padding=-1), ValueError, "padding: (-1, -1, -1, -1) (top, bottom, left, right) must be non-negative"),
    (dict(padding=(1, 2, 3)), ValueError, "padding: expected an int, a pair (pad_h, pad_w) or four values"),
    (dict(stride=1.5), TypeError, "stride: expected an int, got float 1.5"),
    (dict(convention="onnx"), ValueError, "convention: unknown 'onnx'"),
    (dict(input=np.zeros((2, 4, 6), np.float32)), ValueError,
     "input has 3 dimensions (shape (2, 4, 6)); expected 4: [N, C_in, H, W]"),
    (dict(input=np.zeros((2, 4, 6, 6), np.int64)), TypeError, "input has dtype int64; expected float32 or float64"),
    (dict(weight=np.zeros((3, 4, 3, 3), np.float64)), TypeError,
     "weight has dtype float64; expected float32, the dtype of input"),
    (dict(input=np.zeros((2, 4, 6, 6), np.float16)), TypeError, "input has dtype float16"),
    (dict(input=np.zeros((2, 0, 6, 6), np.float32), weight=np.zeros((3, 0, 3, 3), np.float32)), ValueError,
     "input has 0 channels; expected at least 1"),
]


@pytest.mark.parametrize("module", [deformconv, reference], ids=["fast", "reference"])
@pytest.mark.parametrize("change, exc, message", CASES, ids=[c[2][:40] for c in CASES])
def test_bad_input_raises_with_the_crates_message(module, change, exc, message):
    o = ops()
    kw = {k: v for k, v in change.items() if k not in o}
    o.update({k: v for k, v in change.items() if k in o})
    with pytest.raises(exc, match=re.escape(message)):
        call(module, o["input"], o["offset"], o["weight"], **kw)


def test_backward_and_dense_errors():
    o = ops()
    g = np.zeros((2, 3, 4, 4), np.float32)
    with pytest.raises(ValueError, match=re.escape("grad_out has 5 channels; expected")):
        deformconv.deform_conv2d_backward(np.zeros((2, 5, 4, 4), np.float32), **o)
    with pytest.raises(ValueError, match=re.escape("needs: unknown gradient 'inputs'")):
        deformconv.deform_conv2d_backward(g, **o, needs=("inputs",))
    with pytest.raises(ValueError, match=re.escape("needs: unknown gradient 'offset'; expected some of input, weight, bias")):
        deformconv.conv2d_backward(g, o["input"], o["weight"], needs=("offset",))
    with pytest.raises(ValueError, match=re.escape("groups: 0 must be at least 1")):
        deformconv.conv2d(o["input"], o["weight"], groups=0)
    with pytest.raises(TypeError, match=re.escape("grad_out has dtype float64; expected float32")):
        deformconv.deform_conv2d_backward(g.astype(np.float64), **o)


def test_too_large_is_an_error_not_a_crash():
    # Zero-stride views: numpy accepts their shapes, the crate's size arithmetic refuses them.
    big = 2**20
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (1, big, big, big), (0, 0, 0, 0))
    w = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (1, big, 1, 1), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="too large"):
        deformconv.conv2d(x, w)


def test_non_finite_values_propagate_without_a_crash():
    o = ops()
    o["input"] = np.full_like(o["input"], 1.0)
    o["offset"][0, 0, 0, 0] = np.nan
    o["offset"][1, 1, 0, 0] = np.inf
    o["weight"] = np.ones_like(o["weight"])
    out = deformconv.deform_conv2d(**o)
    assert np.isnan(out[0, :, 0, 0]).all()
    assert np.isfinite(out[1]).all() and np.isfinite(out[0, :, 1:]).all()
