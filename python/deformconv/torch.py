"""PyTorch: deformconv's CPU kernels as ``torch.library`` custom ops with autograd.

- `deform_conv2d`: ``torchvision.ops.deform_conv2d``'s signature (plus a keyword-only
  ``convention``; ``padding`` may also be ``(top, bottom, left, right)``);
- `DeformConv2d`: ``torchvision.ops.DeformConv2d``'s constructor, parameters (``weight``,
  ``bias``) and initialisation, so a ``state_dict`` loads either way;
- `use_for_torchvision`: our CPU kernels for torchvision's own ``torchvision::deform_conv2d``
  and ``torchvision::_deform_conv2d_backward`` operators, so an unchanged model built on
  ``torchvision.ops`` gets them; `restore_torchvision` (or the handle's ``undo()``, or leaving
  its ``with`` block) puts torchvision's kernels back.

The ops are ``torch.ops.deformconv.deform_conv2d`` and ``torch.ops.deformconv.deform_conv2d_backward``
(CPU only; float32 and float64). They pass ``torch.library.opcheck`` and run under
``torch.compile``; a plain eager call of `deform_conv2d` runs the same kernels through an
``autograd.Function`` instead, which skips the dispatcher's per-call cost (same bits; what
``torch.compile``, export, fake tensors, modes and functorch transforms see is the op). The
backward computes only the gradients autograd asks for (``ctx.needs_input_grad``): an offset
branch that is frozen, or an input that needs no gradient, costs nothing.

Second derivatives (``create_graph=True``: gradient penalties, MAML, Hessian-vector products)
are exact for every operand and convention: the backward op has its own derivative, computed by
autograd through the forward written in PyTorch operations (`_second_order`; slower than the
kernels, and memory proportional to the deformable columns). First derivatives always run on
the kernels. torchvision's operator gets the same after `use_for_torchvision` (torchvision's own
kernel refuses double backward).

Threads: this module's ops run our kernels on PyTorch's own OpenMP threads (the libgomp team of
its operators), as many as ``torch.set_num_threads`` says (`use_openmp`, on from the import). Why: after every parallel PyTorch operator libgomp's idle threads spin for
milliseconds, and a thread pool of our own would share the cores with them; running on the team
itself leaves nothing to compete. Seed 001's training step (2 cores, ``benches/torch_bench.py``):
7.51 ms instead of 8.68 ms on deformconv's own pool, against 4.60 ms for the dense network
(AMD Zen 5).
``use_openmp(False)`` goes back to deformconv's rayon pool (`deformconv.set_num_threads`). Results
are bitwise the same either way, and for any thread count. In a child made by ``fork`` the ops
run on deformconv's pool (libgomp cannot start a team in a fork child whose parent had one).

Memory layout: channels_last operands are read as they are, and the output and each gradient
come back in their operand's layout (`_channels_last`), as ``torch.nn.functional.conv2d``'s do.
Export: importing this module registers the op's ONNX translation (`_onnx`).
"""


import math
from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn import init
from torch.nn.modules.utils import _pair

from . import _args, _native, _second_order

__all__ = ["DeformConv2d", "deform_conv2d", "use_for_torchvision", "restore_torchvision", "use_openmp"]

_SUPPORTED = (torch.float32, torch.float64)


def _np(t: Tensor):
    """A numpy view of a CPU tensor (no copy, whatever its strides)."""
    return t.detach().numpy()


def _check_dtype(t: Tensor, name: str):
    if t.dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {t.dtype}; deformconv computes in torch.float32 or torch.float64")


def _out_extent(size, before, after, k, dil, stride):
    return (size + before + after - (dil * (k - 1) + 1)) // stride + 1


# ---------------------------------------------------------------------------------------------
# The custom ops. `params` is [stride_h, stride_w, top, bottom, left, right, dil_h, dil_w,
# groups, offset_groups].
# ---------------------------------------------------------------------------------------------


def _forward_kernel(input, offset, weight, mask, bias, params, convention) -> Tensor:
    """The forward on our kernels: the custom op's implementation and the eager path's."""
    out = _native.deform_conv2d(
        _np(input),
        _np(offset),
        None if mask is None else _np(mask),
        _np(weight),
        None if bias is None else _np(bias),
        (*params, convention),
        openmp=_openmp,
    )
    out = torch.from_numpy(out)
    return out.contiguous(memory_format=torch.channels_last) if _channels_last(input) else out


def _backward_kernel(grad_out, input, offset, weight, mask, params, convention, needs) -> list:
    """``[grad_input, grad_offset, grad_mask, grad_weight, grad_bias]``, ``None`` where the
    ``needs`` flag (same order) is false."""
    grads = _native.backward(
        _np(grad_out),
        _np(input),
        _np(offset),
        None if mask is None else _np(mask),
        _np(weight),
        (*params, convention),
        tuple(needs),
        openmp=_openmp,
    )
    operands = (input, offset, mask, weight, None)
    return [None if g is None else _like(torch.from_numpy(g), t) for g, t in zip(grads, operands)]


def _channels_last(t: Tensor) -> bool:
    """Whether ``t`` is stored channels_last (NHWC) rather than NCHW. The kernels read any
    strides; results follow the operands' layout, as ``torch.nn.functional.conv2d``'s do."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def _like(g: Tensor, t: Optional[Tensor]) -> Tensor:
    """Gradient ``g`` (NCHW) in the memory layout of its operand ``t`` (channels_last stays
    channels_last)."""
    return g.contiguous(memory_format=torch.channels_last) if t is not None and _channels_last(t) else g


@torch.library.custom_op("deformconv::deform_conv2d", mutates_args=(), device_types="cpu")
def _deform_conv2d_op(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    mask: Optional[Tensor],
    bias: Optional[Tensor],
    params: list[int],
    convention: str,
) -> Tensor:
    return _forward_kernel(input, offset, weight, mask, bias, params, convention)


@_deform_conv2d_op.register_fake
def _(input, offset, weight, mask, bias, params, convention):
    sh, sw, top, bottom, left, right, dh, dw = params[:8]
    h_out = _out_extent(input.shape[2], top, bottom, weight.shape[2], dh, sh)
    w_out = _out_extent(input.shape[3], left, right, weight.shape[3], dw, sw)
    out = input.new_empty((input.shape[0], weight.shape[0], h_out, w_out))
    return out.contiguous(memory_format=torch.channels_last) if _channels_last(input) else out


@torch.library.custom_op("deformconv::deform_conv2d_backward", mutates_args=(), device_types="cpu")
def _deform_conv2d_backward_op(
    grad_out: Tensor,
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    mask: Optional[Tensor],
    params: list[int],
    convention: str,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(grad_input, grad_offset, grad_mask, grad_weight, grad_bias)``; an empty tensor (shape
    ``[0]``) for each gradient whose ``needs`` flag (same order) is false."""
    grads = _backward_kernel(grad_out, input, offset, weight, mask, params, convention, needs)
    return tuple(input.new_empty(0) if g is None else g for g in grads)


@_deform_conv2d_backward_op.register_fake
def _(grad_out, input, offset, weight, mask, params, convention, needs):
    n_taps = weight.shape[2] * weight.shape[3]
    og = params[9]
    shapes = (
        input.shape,
        offset.shape,
        (offset.shape[0], og * n_taps, offset.shape[2], offset.shape[3]),
        weight.shape,
        (weight.shape[0],),
    )
    operands = (input, offset, mask, weight, None)
    return tuple(
        _like(input.new_empty(s), t) if need else input.new_empty(0)
        for s, need, t in zip(shapes, needs, operands)
    )


def _setup_context(ctx, inputs, output):
    input, offset, weight, mask, bias, params, convention = inputs
    ctx.save_for_backward(input, offset, weight, mask)
    ctx.params = params
    ctx.convention = convention
    ctx.has_mask = mask is not None
    ctx.has_bias = bias is not None


def _gradients(ctx, grad, backward):
    """The forward's input gradients from ``backward`` (the backward op, or its kernel on the
    eager path), computing only those autograd needs."""
    input, offset, weight, mask = ctx.saved_tensors
    gi, go, gw, gm, gb = ctx.needs_input_grad[:5]
    needs = [gi, go, gm and ctx.has_mask, gw, gb and ctx.has_bias]
    if not any(needs):
        return None, None, None, None, None, None, None
    r = backward(grad, input, offset, weight, mask, ctx.params, ctx.convention, needs)
    pick = [r[i] if needs[i] else None for i in range(5)]
    # The backward's order is (input, offset, mask, weight, bias); the forward's (input,
    # offset, weight, mask, bias).
    return pick[0], pick[1], pick[3], pick[2], pick[4], None, None


def _backward(ctx, grad):
    return _gradients(ctx, grad, _deform_conv2d_backward_op)


_deform_conv2d_op.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output):
    grad_out, input, offset, weight, mask, params, convention, needs = inputs
    ctx.save_for_backward(grad_out, input, offset, weight, mask)
    ctx.params = params
    ctx.convention = convention
    ctx.needs = needs


def _backward_of_backward(ctx, *cotangents):
    """The backward op's own derivative (second derivatives of the convolution): see
    `_second_order`. The backward's outputs are ``(input, offset, mask, weight, bias)``
    gradients; its differentiable inputs ``(grad_out, input, offset, weight, mask)``."""
    grads = _second_order.backward_of_backward(
        ctx.saved_tensors, cotangents, ctx.params, ctx.convention, ctx.needs
    )
    return (*grads, None, None, None)


_deform_conv2d_backward_op.register_autograd(_backward_of_backward, setup_context=_setup_backward_context)


class _EagerDeformConv2d(torch.autograd.Function):
    """The custom op's forward and backward without PyTorch's dispatcher, for plain eager calls.

    A custom op's call costs about 0.1 ms more than a plain ``autograd.Function`` (argument
    schema checks, the dispatcher and its Python autograd wrapper): on W1 (seed 001's layer)
    forward + backward through autograd took 1.15 ms by the op against 1.04 ms this way and
    0.96 ms for the bare kernels (AMD Zen 5, 2 threads, medians of 400 alternating runs).
    Same kernels, so the same bits (tested); `deform_conv2d` takes this path only where
    `_eager` says no tracer, mode or transform could see the difference."""

    # The forward takes `ctx` itself: with a separate `setup_context`, every `apply` binds its
    # arguments to the signature with `inspect` (about 0.1 ms a call, measured).
    @staticmethod
    def forward(ctx, input, offset, weight, mask, bias, params, convention):
        inputs = (input, offset, weight, mask, bias, params, convention)
        _setup_context(ctx, inputs, None)
        return _forward_kernel(*inputs)

    @staticmethod
    def backward(ctx, grad):
        # Under `create_graph=True` (grad mode on here) the gradients must themselves be
        # differentiable: the backward op carries its own derivative (`_second_order`).
        if torch.is_grad_enabled():
            return _gradients(ctx, grad, _deform_conv2d_backward_op)
        return _gradients(ctx, grad, _backward_kernel)


_PLAIN = (Tensor, nn.Parameter)


def _eager(tensors) -> bool:
    """Whether a call may skip the custom op: plain tensors (no fake or other subclass), and no
    ``torch.compile`` / export tracing, ``__torch_function__`` or ``__torch_dispatch__`` mode
    or functorch transform active. Anything unknown keeps the op (opcheck-tested) path."""
    if not all(t is None or type(t) in _PLAIN for t in tensors):
        return False
    try:
        return not (
            torch.compiler.is_compiling()
            or torch._C._len_torch_function_stack() != 0
            or torch._C._len_torch_dispatch_stack() != 0
            or torch._C._are_functorch_transforms_active()
        )
    except AttributeError:  # a PyTorch without these queries
        return False


# ---------------------------------------------------------------------------------------------
# torchvision's signature
# ---------------------------------------------------------------------------------------------


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride=(1, 1),
    padding=(0, 0),
    dilation=(1, 1),
    mask: Optional[Tensor] = None,
    *,
    convention: str = "torchvision",
) -> Tensor:
    """``torchvision.ops.deform_conv2d`` computed by deformconv (CPU, float32 or float64), with
    autograd. Same arguments, same results within float rounding; groups and offset groups are
    inferred from the shapes as torchvision does. ``convention``: ``"torchvision"``,
    ``"mmcv"`` or ``"dcn_v1"``. Bad shapes raise ``ValueError`` with the crate's message."""
    geometry = _args.params(stride, padding, dilation, 1, 1, convention)
    return _call(input, offset, weight, mask, bias, geometry)


def _call(input, offset, weight, mask, bias, geometry) -> Tensor:
    """`deform_conv2d` with its parameters already normalised (`_args.params`; its groups and
    offset groups are replaced by those the shapes imply)."""
    tensors = (input, offset, weight, mask, bias)
    if not _eager(tensors):
        _check_operands(tensors)
        return _deform_conv2d_op(*_op_args(tensors, geometry))
    # The eager path checks the operands only when the call fails: the native call's own
    # checks catch every mistake, and `_check_operands` then words the commonest ones (device,
    # dtype, rank) in the crate's style. It saves about 4 us a call (W1: 0.1-0.2%).
    try:
        return _EagerDeformConv2d.apply(*_op_args(tensors, geometry))
    except Exception:
        _check_operands(tensors)
        raise


def _op_args(tensors, geometry) -> tuple:
    """The custom op's arguments: groups and offset groups inferred as torchvision does."""
    input, offset, weight, mask, bias = tensors
    groups = input.shape[1] // weight.shape[1] if weight.shape[1] else 1
    taps = 2 * weight.shape[2] * weight.shape[3]
    offset_groups = offset.shape[1] // taps if taps else 1
    params = [*geometry[:8], max(groups, 1), max(offset_groups, 1)]
    return (input, offset, weight, mask, bias, params, geometry[10])


_NAMES = ("input", "offset", "weight", "mask", "bias")


def _check_operands(tensors) -> None:
    """Raises for an operand on another device, of an unsupported or mixed dtype, or of the wrong
    rank (the crate checks the rest)."""
    input = tensors[0]
    for name, t in zip(_NAMES, tensors):
        if t is None:
            continue
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; deformconv computes on the CPU")
        _check_dtype(t, name)
        if t.dtype != input.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; expected {input.dtype}, the dtype of input")
        want = 1 if name == "bias" else 4
        if t.dim() != want:
            raise ValueError(
                f"{name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected {want}: {_args.AXES[name]}"
            )


class DeformConv2d(nn.Module):
    """``torchvision.ops.DeformConv2d`` on deformconv's kernels: the same constructor,
    parameters (``weight [out, in / groups, kh, kw]``, ``bias [out]`` or ``None``), initialisation
    and ``forward(input, offset, mask=None)``, so a ``state_dict`` moves between the two
    unchanged. ``convention`` (keyword-only) picks the border rule."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        *,
        convention: str = "torchvision",
    ):
        super().__init__()
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding) if not (isinstance(padding, (tuple, list)) and len(padding) == 4) else tuple(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.convention = _args.convention(convention)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's initialisation: Kaiming-uniform weight, bias uniform in ``±1/sqrt(fan_in)``."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return deform_conv2d(
            input,
            offset,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            mask=mask,
            convention=self.convention,
        )

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        s += f", padding={self.padding}" if self.padding != (0, 0) else ""
        s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        s += f", groups={self.groups}" if self.groups != 1 else ""
        s += ", bias=False" if self.bias is None else ""
        s += f", convention={self.convention!r}" if self.convention != "torchvision" else ""
        return s


_openmp = False


def use_openmp(on: bool = True) -> bool:
    """Runs this module's computations on the OpenMP threads PyTorch uses (its libgomp team, as
    many as ``torch.get_num_threads()``) instead of deformconv's own rayon pool, so that the two
    do not compete for the cores. On from the import of this module; ``use_openmp(False)`` goes
    back to the rayon pool (`deformconv.set_num_threads`). Results are bitwise the same. Returns
    whether it is on (never without a libgomp in the process). The numpy API always runs on
    the rayon pool."""
    global _openmp
    _openmp = bool(on) and _native.openmp_threads() is not None
    return _openmp


use_openmp(True)


# ---------------------------------------------------------------------------------------------
# torchvision's operators on our kernels
# ---------------------------------------------------------------------------------------------


def _tv_params(sh, sw, ph, pw, dh, dw, groups, og):
    return [sh, sw, ph, ph, pw, pw, dh, dw, groups, og]


def _tv_forward(input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
    for name, t in (("input", input), ("weight", weight), ("offset", offset), ("bias", bias)):
        _check_dtype(t, name)
    params = _tv_params(sh, sw, ph, pw, dh, dw, groups, og)
    return _forward_kernel(input, offset, weight, mask if use_mask else None, bias, params, "torchvision")


def _tv_backward(grad, input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
    for name, t in (("grad", grad), ("input", input), ("weight", weight), ("offset", offset)):
        _check_dtype(t, name)
    params = _tv_params(sh, sw, ph, pw, dh, dw, groups, og)
    needs = (True, True, bool(use_mask), True, True)
    gi, go, gm, gw, gb = _backward_kernel(
        grad, input, offset, weight, mask if use_mask else None, params, "torchvision", needs
    )
    grad_mask = gm if use_mask else torch.zeros_like(mask)
    # torchvision's order: (input, weight, offset, mask, bias).
    return gi, gw, go, grad_mask, gb


def _tv_autograd_kernel():
    """Our kernel for ``torchvision::deform_conv2d`` at the ``AutogradCPU`` key, or ``None``.

    torchvision 0.29 states its autograd formula in Python through ``torch.library``, whose
    generic wrapper costs about 0.1 ms a call (argument defaults refilled, redispatch): seed
    001's step through `use_for_torchvision` was 0.2-0.6 ms slower than through our own
    module. A plain eager call therefore goes to `_EagerDeformConv2d` (our kernels, the same
    bits); every other call (``torch.compile``, fake tensors, modes) gets torchvision's own
    formula, rebuilt from its functions by ``torch.library``'s wrapper as torchvision does.
    ``None`` where those private pieces are missing: torchvision's autograd then stays."""
    try:
        from torch._library.autograd import Info, make_autograd_impl
        from torchvision import _autograd_registrations as tv

        generic = make_autograd_impl(
            torch.ops.torchvision.deform_conv2d.default,
            Info(tv._deform_conv2d_backward, tv._deform_conv2d_setup_context),
        )
    except (ImportError, AttributeError):
        return None

    def kernel(keyset, input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask):
        args = (input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, og, use_mask)
        tensors = (input, weight, offset, mask, bias)
        if not (_eager(tensors) and all(t.dtype in _SUPPORTED for t in tensors)):
            return generic(keyset, *args)
        params = _tv_params(sh, sw, ph, pw, dh, dw, groups, og)
        return _EagerDeformConv2d.apply(
            input, offset, weight, mask if use_mask else None, bias, params, "torchvision"
        )

    return kernel


class TorchvisionOverride:
    """The handle `use_for_torchvision` returns: ``undo()`` (or leaving a ``with`` block)
    restores torchvision's own CPU kernels."""

    def __init__(self, lib):
        self._lib = lib

    @property
    def active(self) -> bool:
        return self._lib is not None and _override is self

    def undo(self) -> None:
        global _override
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if _override is self:
            _override = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


_override: Optional[TorchvisionOverride] = None


def use_for_torchvision() -> TorchvisionOverride:
    """Registers deformconv's kernels as the CPU kernels of ``torchvision::deform_conv2d`` and
    ``torchvision::_deform_conv2d_backward``: ``torchvision.ops.deform_conv2d`` and
    ``torchvision.ops.DeformConv2d`` then compute with them on CPU tensors (float32, float64),
    with no change to the model. Plain eager calls also take our autograd (the CPU autograd
    kernel, see `_tv_autograd_kernel`); ``torch.compile``, fake tensors and modes keep
    torchvision's formula. CUDA tensors keep torchvision's kernels. Idempotent; returns a handle
    whose ``undo()`` restores torchvision's kernels (also a context manager). PyTorch prints a
    warning for each kernel overridden."""
    global _override
    if _override is not None:
        return _override
    import torchvision  # noqa: F401  (loads torchvision's operators, which we override)

    lib = torch.library.Library("torchvision", "IMPL")
    lib.impl("deform_conv2d", _tv_forward, "CPU")
    lib.impl("_deform_conv2d_backward", _tv_backward, "CPU")
    autograd = _tv_autograd_kernel()
    if autograd is not None:
        lib.impl("deform_conv2d", autograd, "AutogradCPU", with_keyset=True)
    _override = TorchvisionOverride(lib)
    return _override


def restore_torchvision() -> None:
    """Undoes `use_for_torchvision` (nothing if it is not in effect)."""
    if _override is not None:
        _override.undo()


from . import _onnx  # noqa: E402,F401  (registers the ONNX export of the op)
