"""deformconv.torch: the custom op against torchvision's CPU op, gradcheck, opcheck,
torch.compile, the selective backward, DeformConv2d, and use_for_torchvision()."""

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import deformconv  # noqa: E402
import deformconv.torch as dct  # noqa: E402
from deformconv.testing import problems  # noqa: E402

RESULTS = ("out", "grad_input", "grad_offset", "grad_mask", "grad_weight", "grad_bias")


def run(fn, p, dtype):
    """Forward and every gradient of ``fn`` (torchvision's signature) on problem ``p``."""
    t = {k: None if v is None else torch.tensor(v, dtype=dtype) for k, v in p.operands().items()}
    for k in ("input", "offset", "mask", "weight", "bias"):
        if t[k] is not None:
            t[k].requires_grad_(True)
    out = fn(t["input"], t["offset"], t["weight"], t["bias"], mask=t["mask"], **p.torch_params())
    out.backward(t["grad_out"].to(out.dtype))
    res = {"out": out.detach()}
    for k in ("input", "offset", "mask", "weight", "bias"):
        if t[k] is not None:
            res[f"grad_{k}"] = t[k].grad
    return res


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems(np.float32, symmetric_padding=True))
def test_our_op_matches_torchvision_within_the_bound(p):
    """Our float32 op against torchvision's float64 CPU op (as the exact values), forward and
    every gradient, under the f32 bound; and our float64 op under the f64 bound."""
    tv = run(torchvision.ops.deform_conv2d, p, torch.float64)
    ours = run(dct.deform_conv2d, p, torch.float32)
    assert set(ours) == set(tv)
    assert all(v.dtype == torch.float32 for v in ours.values())
    p.assert_close(**ours)  # against the oracle
    deformconv.assert_close(ours, expected={k: v.numpy() for k, v in tv.items()}, **p.operands(), **p.params())
    ours64 = run(dct.deform_conv2d, p, torch.float64)
    deformconv.assert_close(ours64, expected={k: v.numpy() for k, v in tv.items()}, **p.operands(), **p.params())


CONFIGS = [
    dict(n=2, c_in=4, c_out=4, hw=(6, 7), k=(3, 3), stride=1, padding=1, dilation=1, og=1, mask=True, bias=True),
    dict(n=1, c_in=4, c_out=6, hw=(7, 6), k=(2, 3), stride=(2, 1), padding=(0, 2), dilation=(1, 2), og=2, mask=False, bias=False),
    dict(n=2, c_in=6, c_out=4, hw=(5, 5), k=(3, 3), stride=1, padding=0, dilation=1, og=3, mask=True, bias=False, groups=2),
]


def make(cfg, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kh, kw = cfg["k"]
    sh, sw = torch.nn.modules.utils._pair(cfg["stride"])
    ph, pw = torch.nn.modules.utils._pair(cfg["padding"])
    dh, dw = torch.nn.modules.utils._pair(cfg["dilation"])
    h, w = cfg["hw"]
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    groups, og, n = cfg.get("groups", 1), cfg["og"], cfg["n"]

    def r(*s, scale=1.0):
        return (torch.rand(*s, generator=g, dtype=dtype) * 2 - 1) * scale

    x = r(n, cfg["c_in"], h, w)
    # Offsets away from integers, where the sampling is smooth (finite differences straddle no kink).
    off = torch.round(r(n, 2 * og * kh * kw, ho, wo, scale=2.0)) + 0.25 + 0.5 * torch.rand(n, 2 * og * kh * kw, ho, wo, generator=g, dtype=dtype)
    weight = r(cfg["c_out"], cfg["c_in"] // groups, kh, kw)
    mask = r(n, og * kh * kw, ho, wo) if cfg["mask"] else None
    bias = r(cfg["c_out"]) if cfg["bias"] else None
    kw_args = dict(stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))
    return x, off, weight, mask, bias, kw_args


@pytest.mark.parametrize("cfg", CONFIGS, ids=["v2-bias", "v1-strided-dilated-og2", "v2-groups-og3"])
def test_gradcheck_float64(cfg):
    x, off, weight, mask, bias, kw = make(cfg)
    tensors = [t.requires_grad_(True) for t in (x, off, weight, mask, bias) if t is not None]

    def f(*ts):
        it = iter(ts)
        x, off, w = next(it), next(it), next(it)
        m = next(it) if mask is not None else None
        b = next(it) if bias is not None else None
        return dct.deform_conv2d(x, off, w, b, mask=m, **kw)

    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-5)


def op_args(cfg, dtype=torch.float64):
    x, off, weight, mask, bias, kw = make(cfg, dtype)
    sh, sw = kw["stride"]
    ph, pw = kw["padding"]
    dh, dw = kw["dilation"]
    params = [sh, sw, ph, ph, pw, pw, dh, dw, cfg.get("groups", 1), cfg["og"]]
    return x, off, weight, mask, bias, params


@pytest.mark.parametrize("cfg", CONFIGS, ids=["v2-bias", "v1-strided-dilated-og2", "v2-groups-og3"])
def test_opcheck(cfg):
    x, off, weight, mask, bias, params = op_args(cfg)
    for t in (x, off, weight, mask, bias):
        if t is not None:
            t.requires_grad_(True)
    res = torch.library.opcheck(torch.ops.deformconv.deform_conv2d.default, (x, off, weight, mask, bias, params, "torchvision"))
    assert set(res.values()) == {"SUCCESS"}, res
    g = torch.rand(x.shape[0], weight.shape[0], off.shape[2], off.shape[3], dtype=x.dtype)
    needs = [True, False, mask is not None, True, False]
    res = torch.library.opcheck(
        torch.ops.deformconv.deform_conv2d_backward.default,
        (g, x.detach(), off.detach(), weight.detach(), None if mask is None else mask.detach(), params, "mmcv", needs),
    )
    assert set(res.values()) == {"SUCCESS"}, res


def test_torch_compile_matches_eager():
    torch._dynamo.reset()
    model = dct.DeformConv2d(4, 6, 3, padding=1).double()
    x, off, _, mask, _, _ = make(CONFIGS[0])
    off = off.repeat(1, 1, 1, 1)
    x.requires_grad_(True)

    def step(x, off, mask):
        return model(x, off, mask).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    eager_loss = step(x, off, mask)
    (eager_gx,) = torch.autograd.grad(eager_loss, x)
    loss = compiled(x, off, mask)
    (gx,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, eager_gx, rtol=1e-12, atol=1e-12)


def test_the_backward_computes_only_what_autograd_needs(monkeypatch):
    calls = []
    real = dct._native.backward

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(dct._native, "backward", spy)
    x, off, weight, mask, bias, kw = make(CONFIGS[0], torch.float32)
    weight.requires_grad_(True)
    dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw).sum().backward()
    assert calls == [(False, False, False, True, False)]  # (input, offset, mask, weight, bias)
    assert weight.grad is not None
    calls.clear()
    off.requires_grad_(True)
    bias.requires_grad_(True)
    dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw).sum().backward()
    assert calls == [(False, True, False, True, True)]
    calls.clear()
    x.requires_grad_(True)
    mask.requires_grad_(True)
    dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw).sum().backward()
    assert calls == [(True, True, True, True, True)]


def test_state_dicts_move_between_torchvision_and_ours():
    torch.manual_seed(0)
    tv = torchvision.ops.DeformConv2d(4, 6, (3, 2), stride=2, padding=1, dilation=(1, 2), groups=2)
    ours = dct.DeformConv2d(4, 6, (3, 2), stride=2, padding=1, dilation=(1, 2), groups=2)
    assert set(ours.state_dict()) == set(tv.state_dict()) == {"weight", "bias"}
    assert ours.weight.shape == tv.weight.shape
    ours.load_state_dict(tv.state_dict())
    x = torch.randn(2, 4, 9, 9)
    off = torch.randn(2, 12, 5, 5) * 2
    torch.testing.assert_close(ours(x, off), tv(x, off), rtol=1e-5, atol=1e-5)
    back = torchvision.ops.DeformConv2d(4, 6, (3, 2), stride=2, padding=1, dilation=(1, 2), groups=2)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back.weight, tv.weight, rtol=0, atol=0)
    nb = dct.DeformConv2d(4, 6, 3, bias=False)
    assert nb.bias is None and "bias=False" in repr(nb)
    # torchvision's initialisation bounds.
    assert ours.weight.abs().max() <= 1 / (2 * 3 * 2) ** 0.5 + 1e-6


def seed001_model():
    """Seed 001's network, with torchvision's DeformConv2d."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.bn1 = torch.nn.BatchNorm2d(8)
            self.offset = torch.nn.Conv2d(8, 18, 3)
            self.deform = torchvision.ops.DeformConv2d(8, 16, 3)
            self.bn2 = torch.nn.BatchNorm2d(16)
            self.fc = torch.nn.Linear(576, 10)

        def forward(self, x):
            x = torch.relu(self.bn1(torch.max_pool2d(self.conv1(x), 2)))
            x = self.deform(x, self.offset(x))
            x = torch.relu(self.bn2(torch.max_pool2d(x, 2)))
            return self.fc(x.flatten(1))

    return Net()


def train_step(model, x, y):
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def test_use_for_torchvision_same_model_same_results_faster():
    torch.manual_seed(1)
    model = seed001_model()
    with torch.no_grad():
        model.offset.weight.mul_(30)  # offsets of a few pixels
    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    before = train_step(model, x, y)

    def once():
        t = time.perf_counter()
        train_step(model, x, y)
        return time.perf_counter() - t

    handle = dct.use_for_torchvision()
    try:
        assert handle.active and dct.use_for_torchvision() is handle
        after = train_step(model, x, y)
    finally:
        handle.undo()
    assert not handle.active
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-5)
    for k in before[1]:
        torch.testing.assert_close(after[1][k], before[1][k], rtol=1e-3, atol=1e-4, msg=k)
    # Undone: torchvision's own kernels again, bit for bit.
    again = train_step(model, x, y)
    assert torch.equal(again[0], before[0])
    assert all(torch.equal(again[1][k], before[1][k]) for k in before[1])
    # Faster: steps alternated between the two (so that the machine's other load hits both),
    # medians compared. Typically 10x (benches/torch_bench.py); only "faster" is asserted,
    # because bursts of load on a shared 2-core machine hit our 2-thread kernels hardest.
    t_tv, t_ours = [], []
    for _ in range(7):
        t_tv.append(once())
        with dct.use_for_torchvision():
            t_ours.append(once())
    med_tv, med_ours = sorted(t_tv)[3], sorted(t_ours)[3]
    assert med_ours < med_tv, f"ours {sorted(t_ours)} s vs torchvision {sorted(t_tv)} s"
    # As a context manager, and for the functional op with a mask.
    x = torch.randn(2, 4, 6, 6)
    off = torch.randn(2, 18, 4, 4)
    w = torch.randn(3, 4, 3, 3)
    m = torch.rand(2, 9, 4, 4)
    tv = torchvision.ops.deform_conv2d(x, off, w, mask=m)
    with dct.use_for_torchvision():
        mine = torchvision.ops.deform_conv2d(x, off, w, mask=m)
    torch.testing.assert_close(mine, tv, rtol=1e-5, atol=1e-5)
    assert torch.equal(torchvision.ops.deform_conv2d(x, off, w, mask=m), tv)


def test_torch_errors_carry_the_crates_message():
    x, off, w = torch.zeros(2, 4, 6, 6), torch.zeros(2, 10, 4, 4), torch.zeros(3, 4, 3, 3)
    with pytest.raises(ValueError, match=re.escape("offset has 10 channels; expected 2 * offset_groups(1) * kh(3) * kw(3) = 18")):
        dct.deform_conv2d(x, off, w)
    with pytest.raises(TypeError, match="input has dtype torch.bfloat16"):
        dct.deform_conv2d(x.bfloat16(), off.bfloat16(), w.bfloat16())
    with pytest.raises(TypeError, match="weight has dtype torch.float64; expected torch.float32"):
        dct.deform_conv2d(x, off, w.double())
    with pytest.raises(ValueError, match=re.escape("mask has 3 dimensions")):
        dct.deform_conv2d(x, torch.zeros(2, 18, 4, 4), w, mask=torch.zeros(2, 9, 4))
    with pytest.raises(ValueError, match="stride"):
        dct.deform_conv2d(x, torch.zeros(2, 18, 4, 4), w, stride=0)
    # The eager path words these only after the native call fails: the same messages, with
    # operands that require gradients too.
    off18 = torch.zeros(2, 18, 4, 4)
    with pytest.raises(ValueError, match="weight is on meta; deformconv computes on the CPU"):
        dct.deform_conv2d(x, off18, w.to("meta"))
    with pytest.raises(TypeError, match="input has dtype torch.float16"):
        dct.deform_conv2d(x.half(), off18.half(), w.half())
    with pytest.raises(ValueError, match=re.escape("weight has 3 dimensions (shape (3, 4, 3))")):
        dct.deform_conv2d(x.requires_grad_(), off18, torch.zeros(3, 4, 3, requires_grad=True))
    with pytest.raises(TypeError, match="bias has dtype torch.float64; expected torch.float32"):
        dct.deform_conv2d(x, off18, w, torch.zeros(3, dtype=torch.float64, requires_grad=True))
    with dct.use_for_torchvision():
        with pytest.raises(ValueError, match=re.escape("mask has 5 channels; expected")):
            torchvision.ops.deform_conv2d(x, torch.zeros(2, 18, 4, 4), w, mask=torch.zeros(2, 5, 4, 4))


def test_openmp_hosting_gives_the_same_bits_and_errors():
    """From its import, `deformconv.torch` runs the kernels on PyTorch's OpenMP threads (libgomp
    is loaded with torch), sized by ``torch.set_num_threads``: the same bits as deformconv's own
    pool, forward and every gradient, for 1 and 2 threads and from several Python threads at
    once; the same errors; ``use_openmp(False)`` goes back to the pool. The numpy API's thread
    count stays deformconv's."""
    import threading

    from deformconv import _native

    x, off, weight, mask, bias, kw = make(CONFIGS[0], torch.float32)
    leaves = [t.requires_grad_() for t in (x, off, weight, mask, bias)]

    def forward_and_grads():
        for t in leaves:
            t.grad = None
        out = dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw)
        out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).reshape(out.shape))
        return [out.detach()] + [t.grad for t in leaves]

    assert dct.use_openmp(True), "hosting is on after the import where libgomp is loaded"
    torch_threads = torch.get_num_threads()
    try:
        assert not dct.use_openmp(False)
        assert deformconv.get_num_threads() == 2
        want = forward_and_grads()
        assert dct.use_openmp()
        for n in (2, 1):
            torch.set_num_threads(n)
            assert _native.openmp_threads() == n
            assert deformconv.get_num_threads() == 2
            got = forward_and_grads()
            for a, b in zip(got, want):
                assert torch.equal(a, b)
        torch.set_num_threads(2)
        # Several Python threads at once (the GIL is released while computing): forwards only,
        # since the autograd leaves are shared.
        with torch.no_grad():
            outs = [None] * 3

            def fwd(i):
                outs[i] = dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw)

            threads = [threading.Thread(target=fwd, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for o in outs:
            assert torch.equal(o, want[0])
        with pytest.raises(ValueError, match="offset has 10 channels"):
            dct.deform_conv2d(x, off[:, :10], weight, bias, mask=mask, **kw)
    finally:
        torch.set_num_threads(torch_threads)
        assert dct.use_openmp(True)
    assert deformconv.get_num_threads() == 2


def test_eager_calls_skip_the_dispatcher_with_the_same_bits():
    """A plain eager call runs the kernels through an ``autograd.Function`` (no dispatcher);
    the custom op, which tracers and modes see, gives the same bits, forward and every
    gradient; ``needs_input_grad`` is honoured the same way."""
    x, off, weight, mask, bias, kw = make(CONFIGS[0], torch.float32)
    p = list(dct._args.params(kw["stride"], kw["padding"], kw["dilation"], 1, 1, "torchvision")[:10])
    g = torch.cos(torch.arange(2 * 4 * 6 * 7, dtype=torch.float32)).reshape(2, 4, 6, 7)

    def forward_and_grads(call, needs_grad):
        leaves = [t.detach().clone().requires_grad_(r) for t, r in zip((x, off, weight, mask, bias), needs_grad)]
        out = call(*leaves)
        out.backward(g)
        return out, [out.detach()] + [t.grad for t in leaves]

    def eager(x, off, weight, mask, bias):
        return dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw)

    def op(x, off, weight, mask, bias):
        return dct._deform_conv2d_op(x, off, weight, mask, bias, p, "torchvision")

    for needs_grad in ((True,) * 5, (False, True, True, False, False), (True, False, False, False, True)):
        out_e, got = forward_and_grads(eager, needs_grad)
        out_o, want = forward_and_grads(op, needs_grad)
        assert type(out_e.grad_fn).__name__.startswith("_EagerDeformConv2d")
        assert "deformconv" in type(out_o.grad_fn).__name__
        for a, b in zip(got, want):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b)


def test_modes_and_fake_tensors_see_the_custom_op():
    """Under a ``__torch_dispatch__`` mode, with fake tensors and under ``make_fx`` the call
    goes through ``torch.ops.deformconv.deform_conv2d`` (which such tracers record), not the
    eager shortcut."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    x, off, weight, mask, bias, kw = make(CONFIGS[0], torch.float32)

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        out = dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw)
    assert "deformconv.deform_conv2d.default" in rec.ops
    assert torch.equal(out, dct.deform_conv2d(x, off, weight, bias, mask=mask, **kw))

    with FakeTensorMode() as mode:
        fx, foff, fw, fm, fb = (mode.from_tensor(t) for t in (x, off, weight, mask, bias))
        fake = dct.deform_conv2d(fx, foff, fw, fb, mask=fm, **kw)
    assert fake.shape == out.shape

    gm = make_fx(lambda *a: dct.deform_conv2d(*a[:4], mask=a[4], **kw))(x, off, weight, bias, mask)
    assert "deformconv.deform_conv2d" in gm.code


def test_use_for_torchvision_runs_eager_calls_through_our_autograd():
    """After `use_for_torchvision`, a plain eager ``torchvision.ops.deform_conv2d`` with
    gradients goes through our ``autograd.Function`` (the same bits as
    ``deformconv.torch.deform_conv2d``), while ``torch.compile`` and fake tensors keep
    torchvision's own autograd formula over our CPU kernels, with the same values."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, off, weight, mask, bias, kw = make(CONFIGS[0], torch.float32)
    g = torch.cos(torch.arange(2 * 4 * 6 * 7, dtype=torch.float32)).reshape(2, 4, 6, 7)

    def forward_and_grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, off, weight, mask, bias)]
        out = fn(leaves[0], leaves[1], leaves[2], leaves[4], mask=leaves[3], **kw)
        out.backward(g)
        return out, [out.detach()] + [t.grad for t in leaves]

    _, ours = forward_and_grads(dct.deform_conv2d)
    with dct.use_for_torchvision():
        out, tv = forward_and_grads(torchvision.ops.deform_conv2d)
        assert type(out.grad_fn).__name__.startswith("_EagerDeformConv2d")
        for a, b in zip(tv, ours):
            assert torch.equal(a, b)
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: torchvision.ops.deform_conv2d(*a[:4], mask=a[4], **kw), fullgraph=True)
        leaves = [t.detach().clone().requires_grad_() for t in (x, off, weight, bias, mask)]
        out = compiled(*leaves)
        out.backward(g)
        torch.testing.assert_close(out, ours[0], rtol=1e-5, atol=1e-5)
        for t, want in zip(leaves, (ours[1], ours[2], ours[3], ours[5], ours[4])):
            torch.testing.assert_close(t.grad, want, rtol=1e-4, atol=1e-4)
        with FakeTensorMode() as mode:
            fx, foff, fw, fb, fm = (mode.from_tensor(t) for t in (x, off, weight, bias, mask))
            fake = torchvision.ops.deform_conv2d(fx, foff, fw, fb, mask=fm, **kw)
        assert fake.shape == out.shape
    out, _ = forward_and_grads(torchvision.ops.deform_conv2d)
    assert not type(out.grad_fn).__name__.startswith("_EagerDeformConv2d")
