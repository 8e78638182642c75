"""deformconv.testing: the documented example (torchvision's CPU op as the kernel under test),
a buggy kernel caught, and the generated problems' distributions."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deformconv
from deformconv.testing import Limits, Problem, ProblemShape, problem_shapes, problems

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


# The example of python/README.md and of deformconv.testing's docs, as written there.
@settings(max_examples=50, deadline=None)
@given(problems(symmetric_padding=True))  # torchvision pads symmetrically only
def test_torchvision_matches_the_oracle(p):
    t = p.tensors(requires_grad=True)  # torch tensors of p's operands
    out = torchvision.ops.deform_conv2d(t.input, t.offset, t.weight, t.bias, mask=t.mask, **p.torch_params())
    out.backward(t.grad_out)
    p.assert_close(out=out, grad_input=t.input.grad, grad_offset=t.offset.grad, grad_weight=t.weight.grad)


def test_a_buggy_kernel_is_caught_and_shrunk():
    """torchvision's op with the mmcv rule injected (grad_offset zeroed where a sample sits
    exactly on row -1 or column -1) must fail the same property, on a small problem."""
    failures = []

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(problems(symmetric_padding=True, mask=False, bias=False))
    def prop(p):
        t = p.tensors(requires_grad=True)
        out = torchvision.ops.deform_conv2d(t.input, t.offset, t.weight, **p.torch_params())
        out.backward(t.grad_out)
        g = t.offset.grad.clone()
        kh, kw = p.weight.shape[2:]
        sh, sw = p.stride
        dh, dw = p.dilation
        taps = kh * kw
        for ch in range(g.shape[1]):
            k = (ch // 2) % taps
            i, j = divmod(k, kw)
            y = np.arange(g.shape[2])[:, None] * sh - p.padding.top + i * dh
            x = np.arange(g.shape[3])[None, :] * sw - p.padding.left + j * dw
            dy = p.offset[:, 2 * (ch // 2)]
            dx = p.offset[:, 2 * (ch // 2) + 1]
            on_edge = ((y + dy) == -1) | ((x + dx) == -1)
            g[:, ch][torch.from_numpy(on_edge)] = 0
        try:
            p.assert_close(grad_offset=g)
        except AssertionError as e:
            failures.append(p)
            raise e

    with pytest.raises(AssertionError, match="grad_offset"):
        prop()
    assert failures, "the bug was never exercised"
    smallest = failures[-1]
    assert smallest.input.shape[0] == 1 and smallest.groups == 1  # shrunk


def test_same_shape_and_seed_give_the_same_problem():
    shape = ProblemShape(
        input=(2, 6, 7, 5),
        weight=(4, 3, 3, 2),
        stride=(2, 1),
        padding=deformconv.Padding(1, 0, 2, 1),
        dilation=(1, 2),
        groups=2,
        offset_groups=3,
        mask=True,
        bias=True,
    )
    a, b = Problem.random(shape, 7), Problem.random(shape, 7)
    c = Problem.random(shape, 8)
    for k, v in a.operands().items():
        np.testing.assert_array_equal(v, b.operands()[k])
    assert not np.array_equal(a.offset, c.offset)
    assert a.input.dtype == np.float32 and Problem.random(shape, 7, np.float64).input.dtype == np.float64
    assert a.offset.shape == (2, 36, 3, 6) and a.mask.shape == (2, 18, 3, 6)
    # Every generated problem is valid: the fast path accepts it.
    deformconv.deform_conv2d(a.input, a.offset, a.weight, a.bias, mask=a.mask, **a.params())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem_shapes(Limits(max_batch=3, symmetric_padding=False)))
def test_every_shape_is_valid(shape):
    p = Problem.random(shape, 1)
    assert 1 <= p.input.shape[0] <= 3
    out = deformconv.deform_conv2d(p.input, p.offset, p.weight, p.bias, mask=p.mask, **p.params())
    assert out.shape == p.grad_out.shape


def test_the_distributions_reach_the_borders_and_the_odd_masks():
    """Across problems: offsets landing exactly on -1, 0, H-1 and H, integer and half-integer
    positions, far outside; masks with zeros, ones, negatives and values over 1."""
    rows, masks = [], []
    for seed in range(40):
        shape = ProblemShape((1, 2, 6, 6), (2, 2, 3, 3), (1, 1), deformconv.Padding(1, 1, 1, 1), (1, 1), 1, 1, True, False)
        p = Problem.random(shape, seed)
        base = np.arange(6)[:, None] - 1 + np.repeat(np.arange(3), 3)[:, None, None]  # [tap, y, 1]
        rows.append((base[None] + p.offset[:, 0::2]).ravel())
        masks.append(p.mask.ravel())
    pos, m = np.concatenate(rows), np.concatenate(masks)
    for edge in (-1.0, 0.0, 5.0, 6.0):
        assert (pos == edge).any(), edge
    assert ((pos % 1) == 0.5).any() and (np.abs(pos) > 9).any()
    assert (m == 0).any() and (m == 1).any() and (m < 0).any() and (m > 1).any()


def test_limits_are_checked():
    with pytest.raises(TypeError, match="unknown limits"):
        problems(max_size=3)
    with pytest.raises(TypeError, match="expected float32 or float64"):
        Problem.random(ProblemShape((1, 1, 3, 3), (1, 1, 3, 3), (1, 1), deformconv.Padding(0, 0, 0, 0), (1, 1), 1, 1, False, False), 0, np.float16)
    st.just(1)  # hypothesis' strategies module is importable alongside


def test_torchvision_f32_grad_input_with_a_tiny_corner_weight_passes():
    """Once a false alarm (issue 17): torchvision forms the bilinear fractions in f32, which
    rounds a tiny corner weight relative to 1; the bound's position term now covers it."""
    shape = ProblemShape(
        input=(1, 6, 2, 2),
        weight=(1, 6, 2, 2),
        stride=(1, 1),
        padding=deformconv.Padding(top=0, bottom=0, left=2, right=2),
        dilation=(1, 1),
        groups=1,
        offset_groups=3,
        mask=False,
        bias=False,
    )
    p = Problem.random(shape, 58750368)
    t = p.tensors(requires_grad=True)
    out = torchvision.ops.deform_conv2d(t.input, t.offset, t.weight, **p.torch_params())
    out.backward(t.grad_out)
    # Our own f32 fast path is well inside the bound on the same problem.
    ours = deformconv.deform_conv2d_backward(p.grad_out, p.input, p.offset, p.weight, **p.params(), needs=("input",))
    assert p.report(grad_input=ours.input)["grad_input"].max_bound_ratio < 0.5
    p.assert_close(grad_input=t.input.grad)
