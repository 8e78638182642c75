"""Every golden case (torchvision 0.29.2 float64 results, in the repository) through the numpy
API, the fast path and the reference, at the Rust tests' tolerance: 1e-10 relative to the
largest magnitude of each expected tensor."""

import numpy as np
import pytest

import deformconv
from conftest import GOLDEN, golden_names, load_golden

TOL = 1e-10
NAMES = golden_names()


def test_the_golden_set_is_in_the_repository():
    assert GOLDEN.is_dir(), f"golden cases not found at {GOLDEN}"
    assert len(NAMES) >= 50, f"expected the full golden set, found {len(NAMES)}"


def assert_rel_close(case, tensor, got, want):
    assert got.shape == want.shape, f"{case}: {tensor} shape {got.shape} != {want.shape}"
    assert got.dtype == np.float64, f"{case}: {tensor} dtype {got.dtype}"
    scale = max(np.abs(want).max(initial=0.0), np.finfo(np.float64).tiny)
    err = np.abs(got - want) / scale
    if err.size and err.max() > TOL:
        i = np.unravel_index(np.argmax(err), err.shape)
        pytest.fail(f"{case}: {tensor} differs at {i}: got {got[i]:e}, want {want[i]:e} (relative {err[i]:e} > {TOL:e})")


@pytest.mark.parametrize("module", [deformconv, deformconv.reference], ids=["fast", "reference"])
@pytest.mark.parametrize("name", NAMES)
def test_golden_case(name, module):
    a, params = load_golden(name)
    ops = dict(mask=a.get("mask"), **params)
    out = module.deform_conv2d(a["input"], a["offset"], a["weight"], a.get("bias"), **ops)
    assert_rel_close(name, "out", out, a["out"])
    grads = module.deform_conv2d_backward(a["grad_out"], a["input"], a["offset"], a["weight"], **ops)
    assert_rel_close(name, "grad_input", grads.input, a["grad_input"])
    assert_rel_close(name, "grad_offset", grads.offset, a["grad_offset"])
    assert_rel_close(name, "grad_weight", grads.weight, a["grad_weight"])
    if "grad_mask" in a:
        assert_rel_close(name, "grad_mask", grads.mask, a["grad_mask"])
    else:
        assert grads.mask is None
    if "grad_bias" in a:
        assert_rel_close(name, "grad_bias", grads.bias, a["grad_bias"])


@pytest.mark.parametrize("name", NAMES[::7])
def test_golden_case_in_float32_within_the_bound(name):
    """The fast f32 path on the golden operands (rounded to f32) is within the DESIGN §5 bound of
    the exact results of those f32 operands, for every result."""
    a, params = load_golden(name)
    f = {k: v.astype(np.float32) for k, v in a.items()}
    ops = dict(mask=f.get("mask"), **params)
    out = deformconv.deform_conv2d(f["input"], f["offset"], f["weight"], f.get("bias"), **ops)
    grads = deformconv.deform_conv2d_backward(f["grad_out"], f["input"], f["offset"], f["weight"], **ops)
    assert out.dtype == np.float32
    results = {"out": out, **{f"grad_{k}": v for k, v in grads._asdict().items() if v is not None}}
    if "bias" not in a:
        del results["grad_bias"]
    report = deformconv.assert_close(
        results,
        input=f["input"],
        offset=f["offset"],
        mask=f.get("mask"),
        weight=f["weight"],
        bias=f.get("bias"),
        grad_out=f["grad_out"],
        **params,
    )
    assert {t.name for t in report.tensors} == set(results)
