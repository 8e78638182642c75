"""Bad input raises ValueError or TypeError (OverflowError for an int too large) carrying the
crate's message (which tensor or parameter, what was expected, what was got): never a crash,
never a silent wrong answer."""

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


# ---------------------------------------------------------------------------------------------
# Every bad parameter is named in its message, with the value given, whatever the front end.
# ---------------------------------------------------------------------------------------------

BIG = 2**70  # more than any integer type the parameters travel in

# (value, exception, what the message must show of the value)
BAD_COUNTS = [
    (BIG, OverflowError, str(BIG)),
    (-1, ValueError, "-1"),
    ("a", TypeError, "'a'"),
    (1.5, TypeError, "1.5"),
    ((1, 2, 3), TypeError, "(1, 2, 3)"),
]
BAD_PAIRS = BAD_COUNTS[:-1] + [
    (None, TypeError, "None"),
    ((1, 2, 3), ValueError, "(1, 2, 3)"),
    ((1, BIG), OverflowError, str(BIG)),
]
BAD_PADDINGS = BAD_PAIRS + [((0, 0, 0, -2), ValueError, "-2")]
BAD_CONVENTIONS = [("onnx", ValueError, "'onnx'"), (5, ValueError, "5"), (BIG, ValueError, str(BIG))]

BAD_PARAMS = (
    [("stride", *b) for b in BAD_PAIRS]
    + [("padding", *b) for b in BAD_PADDINGS]
    + [("dilation", *b) for b in BAD_PAIRS]
    + [("groups", *b) for b in BAD_COUNTS]  # None: inferred from the shapes
    + [("offset_groups", *b) for b in BAD_COUNTS]
    + [("convention", *b) for b in BAD_CONVENTIONS]
)


def numpy_front_ends():
    o = ops()
    g = np.zeros((2, 3, 4, 4), np.float32)
    return {
        "deform_conv2d": lambda **kw: deformconv.deform_conv2d(**o, **kw),
        "conv2d": lambda **kw: deformconv.conv2d(o["input"], o["weight"], **kw),
        "deform_conv2d_backward": lambda **kw: deformconv.deform_conv2d_backward(g, **o, **kw),
        "conv2d_backward": lambda **kw: deformconv.conv2d_backward(g, o["input"], o["weight"], **kw),
        "reference.deform_conv2d": lambda **kw: reference.deform_conv2d(**o, **kw),
    }


def torch_front_ends():
    torch = pytest.importorskip("torch")
    import deformconv.torch as dct

    t = {k: torch.from_numpy(v) for k, v in ops().items()}

    def module(**kw):
        m = dct.DeformConv2d(4, 3, 3, **kw)
        return m(t["input"], t["offset"])

    return {
        "torch.deform_conv2d": lambda **kw: dct.deform_conv2d(t["input"], t["offset"], t["weight"], **kw),
        "torch.DeformConv2d": module,
    }


# The parameters each front end takes. (DeformConv2d's groups sizes its weight in its
# constructor, with torch's own errors.)
DEFORM = ("stride", "padding", "dilation", "groups", "offset_groups", "convention")
DENSE = ("stride", "padding", "dilation", "groups")
TORCH = ("stride", "padding", "dilation", "convention")
TAKES = {
    "deform_conv2d": DEFORM,
    "conv2d": DENSE,
    "deform_conv2d_backward": DEFORM,
    "conv2d_backward": DENSE,
    "reference.deform_conv2d": DEFORM,
    "torch.deform_conv2d": TORCH,
    "torch.DeformConv2d": TORCH,
}
BAD_CALLS = [(end, *bad) for end, takes in TAKES.items() for bad in BAD_PARAMS if bad[0] in takes]


def assert_names(excinfo, exc, name, shown):
    """The message starts with the parameter's name and shows the value given."""
    assert excinfo.type is exc, f"{excinfo.type.__name__}: {excinfo.value}"
    message = str(excinfo.value)
    assert message.startswith(f"{name}: "), message
    assert shown in message, message


@pytest.mark.parametrize(
    "front_end, name, value, exc, shown", BAD_CALLS, ids=[f"{c[0]}-{c[1]}={c[2]!r}"[:60] for c in BAD_CALLS]
)
def test_each_bad_parameter_is_named_with_its_value(front_end, name, value, exc, shown):
    ends = torch_front_ends() if front_end.startswith("torch") else numpy_front_ends()
    if front_end == "torch.DeformConv2d" and isinstance(value, str) and name in ("stride", "dilation"):
        exc = ValueError  # its constructor's `_pair` (torch's) makes "a" the 1-tuple ("a",)
    with pytest.raises(Exception) as excinfo:
        ends[front_end](**{name: value})
    assert_names(excinfo, exc, name, shown)


def test_stride_2_pow_70_through_every_front_end():
    """The case that once said "failed to extract field Params.0"."""
    ends = numpy_front_ends() | torch_front_ends()
    for call in ends.values():
        with pytest.raises(OverflowError, match=re.escape(f"stride: {2**70} is too large")):
            call(stride=2**70)
        with pytest.raises(OverflowError, match=re.escape(f"stride: {2**70} is too large")):
            call(stride=(1, 2**70))


NATIVE_NAMES = ["stride"] * 2 + ["padding"] * 4 + ["dilation"] * 2 + ["groups", "offset_groups"]


@pytest.mark.parametrize("value, exc, shown", [
    (BIG, OverflowError, str(BIG)),
    (2**64, OverflowError, str(2**64)),
    (-1, ValueError, "-1"),
    ("a", TypeError, "str 'a'"),
    (1.5, TypeError, "float 1.5"),
    (True, TypeError, "bool True"),
])
def test_the_native_functions_name_each_parameter(value, exc, shown):
    """``deformconv._native`` checks the parameter tuple itself, naming each value as the Python
    API spells it (for a direct call, or a value the Python layer passes through)."""
    from deformconv import _native

    o = ops()
    g = np.zeros((2, 3, 4, 4), np.float32)
    calls = [
        lambda p: _native.deform_conv2d(o["input"], o["offset"], None, o["weight"], None, p),
        lambda p: _native.conv2d(o["input"], o["weight"], None, p),
        lambda p: _native.backward(g, o["input"], o["offset"], None, o["weight"], p, (True,) * 5),
        lambda p: _native.ref_forward(o["input"], o["offset"], None, o["weight"], None, p),
    ]
    good = (1, 1, 0, 0, 0, 0, 1, 1, 1, 1, "torchvision")
    for i, name in enumerate(NATIVE_NAMES):
        bad = good[:i] + (value,) + good[i + 1:]
        for call in calls:
            with pytest.raises(Exception) as excinfo:
                call(bad)
            assert_names(excinfo, exc, name, shown)
    # numpy integers are ints
    out = _native.deform_conv2d(o["input"], o["offset"], None, o["weight"], None, tuple(map(np.int64, good[:10])) + ("mmcv",))
    assert out.shape == (2, 3, 4, 4)


def test_the_native_functions_name_the_convention_the_tuple_and_needs():
    from deformconv import _native

    o = ops()
    g = np.zeros((2, 3, 4, 4), np.float32)
    good = (1, 1, 0, 0, 0, 0, 1, 1, 1, 1)

    def fwd(params):
        return _native.deform_conv2d(o["input"], o["offset"], None, o["weight"], None, params)

    with pytest.raises(TypeError, match=re.escape("convention: expected a str, got int 5")):
        fwd(good + (5,))
    with pytest.raises(ValueError, match=re.escape('convention: unknown "onnx"')):
        fwd(good + ("onnx",))
    with pytest.raises(ValueError, match=re.escape("params: expected 11 values (stride_h, stride_w")):
        fwd(good)
    with pytest.raises(TypeError, match=re.escape("params: expected a tuple (stride_h, stride_w")):
        fwd(list(good) + ["torchvision"])
    with pytest.raises(TypeError, match=re.escape("needs: expected a tuple of 5 bools")):
        _native.backward(g, o["input"], o["offset"], None, o["weight"], good + ("torchvision",), (True,) * 4)
    with pytest.raises(TypeError, match=re.escape("input: expected a float32 or float64 array, got a 4-dimensional int32 array")):
        _native.conv2d(o["input"].astype(np.int32), o["weight"], None, good + ("mmcv",))
    with pytest.raises(TypeError, match=re.escape("offset: expected a 4-dimensional float32 array, got a 3-dimensional")):
        _native.deform_conv2d(o["input"], o["offset"][0], None, o["weight"], None, good + ("mmcv",))


@pytest.mark.parametrize("needs, exc, shown", [
    (5, TypeError, "int 5"),
    (("input", 3), ValueError, "3"),
    ([["input"]], ValueError, "['input']"),
    (("inputs",), ValueError, "'inputs'"),
])
def test_needs_is_named(needs, exc, shown):
    o = ops()
    g = np.zeros((2, 3, 4, 4), np.float32)
    for call in (deformconv.deform_conv2d_backward, reference.deform_conv2d_backward):
        with pytest.raises(exc) as excinfo:
            call(g, **o, needs=needs)
        assert_names(excinfo, exc, "needs", shown)
    with pytest.raises(exc) as excinfo:
        deformconv.conv2d_backward(g, o["input"], o["weight"], needs=needs)
    assert_names(excinfo, exc, "needs", shown)


@pytest.mark.parametrize("n, exc, shown", [
    (-1, ValueError, "-1"),
    (BIG, OverflowError, str(BIG)),
    ("a", TypeError, "str 'a'"),
    (1.5, TypeError, "float 1.5"),
    (True, TypeError, "bool True"),
    (10**6, ValueError, str(10**6)),
])
def test_set_num_threads_names_its_argument(n, exc, shown):
    with pytest.raises(exc) as excinfo:
        deformconv.set_num_threads(n)
    assert_names(excinfo, exc, "n", shown)
    assert deformconv.get_num_threads() == 2  # unchanged
    deformconv.set_num_threads(np.int64(2))  # numpy integers are ints
    assert deformconv.get_num_threads() == 2
