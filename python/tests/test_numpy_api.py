"""The numpy front end: dtypes, parameters, strides, the selective backward, dense conv, layouts,
conventions, threads and the GIL."""

import threading
import time

import numpy as np
import pytest

import deformconv
from deformconv import Padding, layout, reference


def problem(rng, dtype=np.float32, n=2, c_in=4, c_out=6, h=9, w=8, k=(3, 3), og=2, groups=2, mask=True, **p):
    """Random operands for `deform_conv2d` with output size from the parameters."""
    stride = p.get("stride", (1, 1))
    pad = Padding(*p.get("padding", (1, 1, 1, 1)))
    dil = p.get("dilation", (1, 1))
    h_out = (h + pad.top + pad.bottom - (dil[0] * (k[0] - 1) + 1)) // stride[0] + 1
    w_out = (w + pad.left + pad.right - (dil[1] * (k[1] - 1) + 1)) // stride[1] + 1
    taps = k[0] * k[1]
    ops = dict(
        input=rng.uniform(-1, 1, (n, c_in, h, w)).astype(dtype),
        offset=rng.uniform(-2.5, 2.5, (n, 2 * og * taps, h_out, w_out)).astype(dtype),
        weight=rng.uniform(-1, 1, (c_out, c_in // groups, *k)).astype(dtype),
        bias=rng.uniform(-1, 1, c_out).astype(dtype),
        mask=rng.uniform(-0.5, 1.5, (n, og * taps, h_out, w_out)).astype(dtype) if mask else None,
    )
    params = dict(stride=stride, padding=pad, dilation=dil, groups=groups, offset_groups=og)
    grad_out = rng.uniform(-1, 1, (n, c_out, h_out, w_out)).astype(dtype)
    return ops, params, grad_out


def fwd(module, ops, params):
    return module.deform_conv2d(
        ops["input"], ops["offset"], ops["weight"], ops["bias"], mask=ops["mask"], **params
    )


def bwd(module, ops, params, grad_out, **kw):
    return module.deform_conv2d_backward(
        grad_out, ops["input"], ops["offset"], ops["weight"], ops["mask"], **params, **kw
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_and_every_gradient_match_the_oracle(rng, dtype):
    ops, params, g = problem(rng, dtype, stride=(2, 1), padding=(2, 0, 1, 3), dilation=(1, 2))
    out = fwd(deformconv, ops, params)
    assert out.dtype == dtype and out.shape == (2, 6, 5, 8)
    grads = bwd(deformconv, ops, params, g)
    assert all(a.dtype == dtype for a in grads)
    report = deformconv.assert_close({"out": out, **{f"grad_{k}": v for k, v in grads._asdict().items()}}, grad_out=g, **ops, **params)
    assert len(report.tensors) == 6 and report.passed
    if dtype == np.float64:
        exact = fwd(reference, ops, params)
        np.testing.assert_allclose(out, exact, rtol=0, atol=1e-12 * np.abs(exact).max())


def test_only_the_gradients_asked_for_are_returned(rng):
    ops, params, g = problem(rng)
    all_grads = bwd(deformconv, ops, params, g)
    for needs in [("input",), ("offset", "mask"), ("grad_weight",), ("bias",), ()]:
        grads = bwd(deformconv, ops, params, g, needs=needs)
        asked = {n.removeprefix("grad_") for n in needs}
        for name in deformconv.Grads._fields:
            got = getattr(grads, name)
            if name in asked:
                # The combined backward gives the same bits whatever else it computes.
                np.testing.assert_array_equal(got, getattr(all_grads, name))
            else:
                assert got is None, name
    # Without a mask, no mask gradient unless asked for (then the one of a unit mask).
    ops["mask"] = None
    assert bwd(deformconv, ops, params, g).mask is None
    unit = bwd(deformconv, ops, params, g, needs=("mask",)).mask
    exact = bwd(reference, ops, params, g, needs=("mask",)).mask
    np.testing.assert_allclose(unit, exact, rtol=1e-4, atol=1e-4)


def test_any_strides_give_the_same_bits(rng):
    ops, params, g = problem(rng)
    want = fwd(deformconv, ops, params)
    want_grads = bwd(deformconv, ops, params, g)

    def strided(a):
        if a is None:
            return None
        # A reversed, Fortran-ordered view of a copy with every other element.
        big = np.repeat(a[::-1].copy(order="F"), 2, axis=-1)[..., ::2]
        view = big[::-1]
        assert not view.flags.c_contiguous and np.array_equal(view, a)
        return view

    s_ops = {k: strided(v) for k, v in ops.items()}
    np.testing.assert_array_equal(fwd(deformconv, s_ops, params), want)
    for a, b in zip(bwd(deformconv, s_ops, params, strided(g)), want_grads):
        np.testing.assert_array_equal(a, b)
    # Big-endian arrays are accepted too.
    be = {k: None if v is None else v.astype(v.dtype.newbyteorder(">")) for k, v in ops.items()}
    np.testing.assert_array_equal(fwd(deformconv, be, params), want)


def test_int_pair_and_per_side_parameters(rng):
    ops, _, _ = problem(rng, groups=1, og=1, h=8, w=8)
    ops["offset"] = ops["offset"][:, :, :, :]
    base = dict(groups=1, offset_groups=1)
    a = fwd(deformconv, ops, dict(stride=1, padding=1, dilation=1, **base))
    b = fwd(deformconv, ops, dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), **base))
    c = fwd(deformconv, ops, dict(stride=[1, 1], padding=(1, 1, 1, 1), dilation=[1, 1], **base))
    d = fwd(deformconv, ops, dict(stride=1, padding=Padding(top=1, bottom=1, left=1, right=1), dilation=1, **base))
    for x in (b, c, d):
        np.testing.assert_array_equal(a, x)
    # groups and offset groups are inferred from the shapes as torchvision does.
    e = deformconv.deform_conv2d(ops["input"], ops["offset"], ops["weight"], ops["bias"], 1, 1, 1, ops["mask"])
    np.testing.assert_array_equal(a, e)


def test_asymmetric_padding_is_explicit_zero_padding(rng):
    """Per-side padding equals padding the image by hand, for the dense convolution."""
    x = rng.uniform(-1, 1, (2, 3, 7, 6))
    w = rng.uniform(-1, 1, (4, 3, 3, 2))
    pad = Padding(top=2, bottom=0, left=1, right=3)
    got = deformconv.conv2d(x, w, None, 1, pad)
    padded = np.pad(x, ((0, 0), (0, 0), (pad.top, pad.bottom), (pad.left, pad.right)))
    want = deformconv.conv2d(padded, w)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_dense_conv_is_deformable_conv_at_zero_offsets(rng):
    x = rng.uniform(-1, 1, (2, 4, 9, 9))
    w = rng.uniform(-1, 1, (6, 2, 3, 3))
    b = rng.uniform(-1, 1, 6)
    kw = dict(stride=2, padding=1, dilation=2, groups=2)
    out = deformconv.conv2d(x, w, b, **kw)
    zero = np.zeros((2, 18, *out.shape[2:]))
    np.testing.assert_allclose(out, deformconv.deform_conv2d(x, zero, w, b, **kw), atol=1e-13)
    np.testing.assert_allclose(out, reference.conv2d(x, w, b, **kw), atol=1e-13)
    g = rng.uniform(-1, 1, out.shape)
    dense = deformconv.conv2d_backward(g, x, w, **kw)
    assert dense.offset is None and dense.mask is None
    exact = reference.conv2d_backward(g, x, w, **kw)
    deform = deformconv.deform_conv2d_backward(g, x, zero, w, **kw)
    for name in ("input", "weight", "bias"):
        np.testing.assert_allclose(getattr(dense, name), getattr(exact, name), atol=1e-12)
        np.testing.assert_allclose(getattr(dense, name), getattr(deform, name), atol=1e-12)
    only = deformconv.conv2d_backward(g, x, w, **kw, needs=["weight"])
    assert only.input is None and only.bias is None and only.weight is not None


def test_conventions_differ_only_where_documented():
    """A sample exactly on row -1: torchvision takes the right-hand derivative, mmcv gives 0;
    DCN v1 reads nothing in (-1, 0) where torchvision interpolates."""
    x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 1, 1))
    g = np.ones((1, 1, 3, 3))
    off = np.zeros((1, 2, 3, 3))
    off[0, 0, 0, 0] = -1.0  # pixel (0, 0) samples at row -1
    grads = {c: deformconv.deform_conv2d_backward(g, x, off, w, convention=c).offset for c in deformconv.CONVENTIONS}
    assert grads["torchvision"][0, 0, 0, 0] == 1.0  # v(0, 0) - 0
    assert grads["mmcv"][0, 0, 0, 0] == 0.0
    np.testing.assert_array_equal(grads["torchvision"][0, :, 1:], grads["mmcv"][0, :, 1:])
    for c in deformconv.CONVENTIONS:
        np.testing.assert_array_equal(grads[c], reference.deform_conv2d_backward(g, x, off, w, convention=c).offset)
    off[0, 0, 0, 0] = -0.5
    tv = deformconv.deform_conv2d(x, off, w)[0, 0, 0, 0]
    v1 = deformconv.deform_conv2d(x, off, w, convention="dcn_v1")[0, 0, 0, 0]
    assert (tv, v1) == (0.5, 0.0)


def test_layout_converters_round_trip_and_match_numpy(rng):
    w = rng.uniform(-1, 1, (6, 4, 3, 2)).astype(np.float32)
    hwio = layout.from_oihw(w, "hwio")
    np.testing.assert_array_equal(hwio, w.transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(layout.to_oihw(hwio, "hwio"), w)
    flipped = layout.to_oihw(w, "oihw", flip=True)
    np.testing.assert_array_equal(flipped, w[:, :, ::-1, ::-1])
    x = rng.uniform(-1, 1, (2, 3, 4, 5))
    np.testing.assert_array_equal(layout.nchw_to_nhwc(x), x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(layout.nhwc_to_nchw(layout.nchw_to_nhwc(x)), x)
    off = rng.uniform(-1, 1, (1, 2 * 2 * 9, 3, 3))
    planar = layout.convert_offset(off, "interleaved_yx", "planar_yx", offset_groups=2)
    np.testing.assert_array_equal(planar[0, :9], off[0, 0:18:2])  # group 0: every dy first
    np.testing.assert_array_equal(layout.convert_offset(planar, "planar_yx", "interleaved_yx", 2), off)
    mask = rng.uniform(0, 1, (1, 18, 3, 3))
    packed = layout.pack_offset_mask(off, mask, "mmcv_chunks", 2)
    np.testing.assert_array_equal(packed, np.concatenate([off, mask], axis=1))
    o2, m2 = layout.unpack_offset_mask(packed, "mmcv_chunks", 2)
    np.testing.assert_array_equal(o2, off)
    np.testing.assert_array_equal(m2, mask)
    with pytest.raises(ValueError, match="offset has 36 channels; expected a multiple of 2 \\* offset_groups\\(5\\) = 10"):
        layout.convert_offset(off, "interleaved_yx", "planar_yx", offset_groups=5)
    with pytest.raises(ValueError, match='layout: unknown "nchw"'):
        layout.to_oihw(w, "nchw")


def test_results_do_not_depend_on_the_thread_count(rng):
    ops, params, g = problem(rng, n=3, c_in=8, c_out=8, h=12, w=12)
    want = fwd(deformconv, ops, params), bwd(deformconv, ops, params, g)
    try:
        for n in (1, 3):
            deformconv.set_num_threads(n)
            assert deformconv.get_num_threads() == n
            np.testing.assert_array_equal(fwd(deformconv, ops, params), want[0])
            for a, b in zip(bwd(deformconv, ops, params, g), want[1]):
                np.testing.assert_array_equal(a, b)
        deformconv.release_cached_scratch()
    finally:
        deformconv.set_num_threads(2)
    assert deformconv.get_num_threads() == 2


def test_the_gil_is_released_while_computing(rng):
    """A Python thread keeps running while another thread is inside one long oracle call."""
    done = threading.Event()
    ticks = []

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        # Grow the problem until one call lasts long enough to tell (the oracle's speed varies).
        for n in (2, 8, 32, 128):
            ops, params, g = problem(rng, dtype=np.float64, n=n, c_in=16, c_out=16, h=24, w=24, groups=1, og=1)
            start = time.perf_counter()
            bwd(reference, ops, params, g, needs=("weight", "offset", "input"))
            elapsed = time.perf_counter() - start
            if elapsed > 0.1:
                break
    finally:
        done.set()
        t.join()
    during = [x for x in ticks if start < x < start + elapsed]
    assert elapsed > 0.1, f"the call is too short to tell ({elapsed:.3f} s)"
    # Holding the GIL would starve the counter for the whole call.
    assert len(during) >= 10, f"{len(during)} ticks in {elapsed:.3f} s"


def test_empty_batch(rng):
    ops, params, g = problem(rng, n=0)
    out = fwd(deformconv, ops, params)
    assert out.shape == (0, 6, 9, 8)
    grads = bwd(deformconv, ops, params, g)
    assert grads.input.shape == (0, 4, 9, 8)
    np.testing.assert_array_equal(grads.weight, 0)
