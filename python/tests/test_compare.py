"""`compare` / `assert_close`: the DESIGN §5 report as a Python object and a pytest-friendly
assertion whose failure message shows the worst element."""

import numpy as np
import pytest

import deformconv
from deformconv import reference


@pytest.fixture
def case(rng):
    x = rng.uniform(-1, 1, (2, 4, 7, 7)).astype(np.float32)
    off = rng.uniform(-2, 2, (2, 36, 5, 5)).astype(np.float32)
    m = rng.uniform(0, 1, (2, 18, 5, 5)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 4, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 3).astype(np.float32)
    g = rng.uniform(-1, 1, (2, 3, 5, 5)).astype(np.float32)
    return dict(input=x, offset=off, mask=m, weight=w, bias=b, grad_out=g)


def results(c):
    out = deformconv.deform_conv2d(c["input"], c["offset"], c["weight"], c["bias"], mask=c["mask"])
    grads = deformconv.deform_conv2d_backward(c["grad_out"], c["input"], c["offset"], c["weight"], c["mask"])
    return {"out": out, **{f"grad_{k}": v for k, v in grads._asdict().items()}}


def test_a_correct_f32_kernel_passes_with_its_figures(case):
    r = deformconv.compare(results(case), **case)
    assert r.passed
    assert [t.name for t in r.tensors] == list(deformconv._compare.RESULTS)
    out = r["out"]
    assert out.shape == (2, 3, 5, 5) and out.elements == 150 and out.over_tolerance == 0
    assert 0 < out.max_bound_ratio <= 1 and out.max_abs_err > 0 and out.worst_index is not None
    assert "PASS" in str(r) and "err/bound" in str(r)
    with pytest.raises(KeyError):
        r["grad_nothing"]


def test_one_wrong_element_is_found_with_its_index_and_values(case):
    res = results(case)
    bad = res["grad_offset"].copy()
    bad[1, 7, 2, 3] += 1e-3
    res["grad_offset"] = bad
    r = deformconv.compare(res, **case)
    assert not r.passed
    t = r["grad_offset"]
    assert t.over_tolerance == 1 and t.worst_index == (1, 7, 2, 3) and t.max_bound_ratio > 1
    assert t.worst_actual == pytest.approx(float(bad[1, 7, 2, 3]))
    assert all(x.passed for x in r.tensors if x.name != "grad_offset")
    with pytest.raises(AssertionError) as e:
        deformconv.assert_close(res, **case)
    msg = str(e.value)
    assert "[1, 7, 2, 3]" in msg and "FAIL: 1 element(s) over tolerance in 1 of 6 tensor(s): grad_offset" in msg


def test_float64_results_are_judged_at_float64_precision(case):
    c64 = {k: v.astype(np.float64) for k, v in case.items()}
    res = results(c64)
    assert deformconv.compare(res, **c64).passed
    # An f32-sized error in an f64 result fails; it passes when declared an f32 kernel.
    out = res["out"] * (1 + 2e-7)
    assert not deformconv.compare(out, **c64).passed
    assert deformconv.compare(out, precision=np.float32, **c64).passed
    assert deformconv.compare(out, precision=2.0**-24, **c64).passed


def test_allclose_rule_expected_values_and_grads_objects(case):
    out = results(case)["out"]
    r = deformconv.compare(out + 1e-3, rtol=0, atol=2e-3, **case)
    assert r.passed and r["out"].max_bound_ratio > 1  # the bound ratio is still reported
    assert not deformconv.compare(out + 1e-3, rtol=0, atol=5e-4, **case).passed
    # `expected` replaces the oracle's values where given.
    r = deformconv.compare(out, expected={"out": out}, **case)
    assert r["out"].max_abs_err == 0
    grads = deformconv.deform_conv2d_backward(
        case["grad_out"], case["input"], case["offset"], case["weight"], case["mask"], needs=("weight", "input")
    )
    r = deformconv.assert_close(grads, **case)
    assert [t.name for t in r.tensors] == ["grad_input", "grad_weight"]


def test_dense_problems_and_torch_tensors(case):
    torch = pytest.importorskip("torch")
    x, w, g = case["input"], case["weight"], case["grad_out"]
    out = deformconv.conv2d(x, w, padding=0)
    assert deformconv.compare(torch.from_numpy(out), input=x, weight=w).passed
    dense = deformconv.conv2d_backward(g, x, w, needs=("input", "weight"))
    assert deformconv.compare(dense, input=torch.from_numpy(x), weight=w, grad_out=g).passed
    # A bfloat16 tensor is judged as a bf16 kernel's result unless precision= says otherwise.
    half = torch.from_numpy(out).to(torch.bfloat16)
    r = deformconv.compare(half, input=x, weight=w)
    assert r.passed and "2^-8" in r["out"].criterion
    assert deformconv.compare(half, input=x, weight=w, precision=2.0**-8).passed
    assert deformconv.compare(half, input=x, weight=w, precision=torch.bfloat16).passed
    assert not deformconv.compare(half, input=x, weight=w, precision="f32").passed
    with pytest.raises(ValueError, match="int32: the bound knows float64, float32, float16 and bfloat16; pass precision="):
        deformconv.compare(torch.from_numpy(out).to(torch.int32), input=x, weight=w)


def test_compare_refuses_what_it_cannot_judge(case):
    out = results(case)["out"]
    with pytest.raises(ValueError, match="unknown result 'output'"):
        deformconv.compare({"output": out}, **case)
    no_bias = {k: v for k, v in case.items() if k != "bias"}
    with pytest.raises(ValueError, match="grad_bias: is only defined for a problem with a bias"):
        deformconv.compare({"grad_bias": np.zeros(3, np.float32)}, **no_bias)
    no_grad = {k: v for k, v in case.items() if k != "grad_out"}
    with pytest.raises(ValueError, match="grad_out: is required to compare gradients"):
        deformconv.compare({"grad_input": np.zeros((2, 4, 7, 7), np.float32)}, **no_grad)
    with pytest.raises(ValueError, match="out: actual has shape \\[2, 3, 5\\] but the expected result has shape"):
        deformconv.compare(out[..., 0], **case)
    with pytest.raises(ValueError, match="got None"):
        deformconv.compare({"out": None}, **case)
    with pytest.raises(ValueError, match="precision: 'fp8' is not a precision profile; expected one of f64, f32, tf32, bf16, f16"):
        deformconv.compare(out, precision="fp8", **case)
    with pytest.raises(ValueError, match="2\\*\\*-11 is both tf32 and f16"):
        deformconv.compare(out, precision=2.0**-11, **case)


def test_the_reference_is_the_oracle_compare_uses(case):
    exact = reference.deform_conv2d(case["input"], case["offset"], case["weight"], case["bias"], mask=case["mask"])
    assert exact.dtype == np.float64
    r = deformconv.compare(exact, precision=np.float64, **case)
    assert r["out"].max_abs_err == 0.0


def round_to_bf16(a):
    """float32 ``a`` rounded to bfloat16 (to nearest, ties to even), kept in float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def test_bf16_rounded_results_fail_as_f32_and_pass_as_bf16(case):
    res = {k: round_to_bf16(v) for k, v in results(case).items()}  # a bf16 kernel's results, saved as f32
    r = deformconv.compare(res, **case)
    assert not r.passed and not r.bound_passed
    assert all(t.over_tolerance > 0 for t in r.tensors if t.name != "grad_bias")
    r = deformconv.assert_close(res, precision="bf16", **case)
    assert all("2^-8" in t.criterion for t in r.tensors)
    assert r.bound_passed and r.statistical_passed
    assert all(t.statistic is not None and 0 < t.statistic <= 1 for t in r.tensors if t.elements >= 64)
    assert deformconv.compare(res, precision="bfloat16", **case).passed


@pytest.mark.parametrize("name", ["f16", "tf32"])
def test_f16_rounded_results_pass_as_f16_and_tf32_and_fail_as_f32(case, name):
    res = {k: v.astype(np.float16) for k, v in results(case).items()}  # stored in binary16
    assert not deformconv.compare(res, precision="f32", **case).passed
    assert deformconv.compare(res, **case).passed  # float16 arrays: the f16 profile
    r = deformconv.compare(res, precision=name, **case)
    assert r.passed and all("2^-11" in t.criterion for t in r.tensors)


def test_the_statistical_check_is_reported_and_can_be_turned_off(case):
    r = deformconv.compare(results(case), **case)
    for t in r.tensors:
        assert t.bound_passed and t.statistical_passed and t.passed
        assert t.statistic is not None and t.statistic < 1
    assert "rms stat" in str(r) and "statistical check" in str(r)
    off = deformconv.compare(results(case), statistical=False, **case)
    assert off.passed and all(t.statistical_passed for t in off.tensors)
    assert "statistical check" not in str(off)


def test_tiny_offsets_through_torchvision_f32_pass_within_rounding():
    """issue 17's false alarm: a DCN layer whose offset conv has just left its zero init gives
    offsets of ~1e-7; torchvision's float32 kernel forms ``base + dy`` in f32, which rounds onto
    the integer, and takes the one-sided slope there. The oracle accepts either side."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    off = (1e-7 * rng.standard_normal((2, 18, 12, 12))).astype(np.float32)
    g = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    t = {k: torch.from_numpy(v).requires_grad_() for k, v in dict(x=x, w=w, off=off).items()}
    out = torchvision.ops.deform_conv2d(t["x"], t["off"], t["w"], padding=1)
    out.backward(torch.from_numpy(g))
    res = dict(out=out, grad_input=t["x"].grad, grad_offset=t["off"].grad, grad_weight=t["w"].grad)
    problem = dict(input=x, offset=off, weight=w, grad_out=g, padding=1)

    r = deformconv.assert_close(res, **problem)
    assert r.ambiguous_samples > 0
    assert r["grad_offset"].accepted_by_rounding > 0
    assert "positions within rounding" in str(r)
    strict = deformconv.compare(res, strict_positions=True, **problem)
    assert strict.ambiguous_samples == 0
    assert not strict.passed and not strict["grad_offset"].bound_passed
    assert strict["grad_offset"].accepted_by_rounding == 0 and strict["grad_offset"].over_tolerance > 0
