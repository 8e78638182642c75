"""ONNX export of ``torch.ops.deformconv.deform_conv2d``.

Once ``deformconv.torch`` is imported, ``torch.onnx.export(model, args, dynamo=True)`` writes each
call of our op as one standard ONNX ``DeformConv`` node (domain ``ai.onnx``, opset 19), the node
torchvision's ``deform_conv2d`` exports to: mask or none (none means a mask of ones), bias or
none, stride, per-side padding (ONNX ``pads`` is ``[top, left, bottom, right]``), dilation,
groups and offset groups. ONNX ``DeformConv`` has torchvision's border rule, so only convention
``"torchvision"`` exports; ``"mmcv"`` and ``"dcn_v1"`` stop the export with an error naming the
convention rather than write a graph that computes something else.

How the exporter finds it. torch 2.15's exporter builds a fresh ``ONNXRegistry`` for every
export (``ONNXRegistry.from_torchlib``) from two sources: torch's private
``torch.onnx._internal.exporter._torchlib`` and onnxscript's torch_lib registry
(``onnxscript.function_libs.torch_lib.registration.default_registry``), read through onnxscript's
versioned ``_framework_apis`` module. The only public way in, ``torch.onnx.export(...,
custom_translation_table=...)``, needs the caller to pass the table at every export (it works
with `deform_conv2d_onnx`: ``{torch.ops.deformconv.deform_conv2d.default: deform_conv2d_onnx}``).
So we register `deform_conv2d_onnx` in onnxscript's registry with its ``torch_op`` decorator:
that package is public (no underscore in its path), it is where torchvision's own
``torchvision::deform_conv2d`` translation lives, and torch reads it at export time, so a
registration made before or after ``import torch.onnx`` counts. If torch ever stops reading it,
torchvision's export breaks with ours (and tests/test_onnx.py fails). We chose this over a
decomposition to ``torchvision::deform_conv2d``: torch's decomposition table is global state
other tools read, that op has no per-side padding, and the export would then need torchvision.

Importing onnxscript takes about a second, which a model that never exports should not pay. So
when onnxscript's registry module is not loaded yet, `_install` puts a finder on
``sys.meta_path`` (the documented import hook) that steps aside for every other module and,
for that one, registers our translation just after the module has run, then removes itself.
"""

import importlib.abc
import sys
from typing import Sequence

OP = "deformconv::deform_conv2d"
REGISTRY_MODULE = "onnxscript.function_libs.torch_lib.registration"


def onnx_attributes(params: Sequence[int], convention: str) -> dict:
    """The ``DeformConv`` attributes for the op's ``params`` (``[stride_h, stride_w, top, bottom,
    left, right, dil_h, dil_w, groups, offset_groups]``); raises ``ValueError`` for a convention
    ONNX cannot express."""
    if convention != "torchvision":
        raise ValueError(
            f"deformconv: cannot export convention {convention!r} to ONNX: ONNX DeformConv uses "
            "torchvision's border rule, so only convention 'torchvision' exports (the graph would "
            f"compute differently from a {convention!r} layer)"
        )
    if len(params) != 10:
        raise ValueError(f"deformconv: expected 10 params, got {len(params)}: {list(params)}")
    sh, sw, top, bottom, left, right, dh, dw, groups, offset_groups = (int(p) for p in params)
    return dict(
        strides=[sh, sw],
        pads=[top, left, bottom, right],
        dilations=[dh, dw],
        group=groups,
        offset_group=offset_groups,
    )


# The tensors are left unannotated (any type; ONNX DeformConv takes float16, float, double) so
# that this module need not import onnxscript for its tensor types.
def deform_conv2d_onnx(input, offset, weight, mask, bias, params: Sequence[int], convention: str):
    """The ONNX translation of ``deformconv::deform_conv2d``: one ``DeformConv`` node. (ONNX
    orders the inputs X, W, offset, B, mask; ours are input, offset, weight, mask, bias.)"""
    from onnxscript import opset19

    attributes = onnx_attributes(params, convention)
    return opset19.DeformConv(input, weight, offset, bias, mask, **attributes)


def _register(registration) -> None:
    """Adds `deform_conv2d_onnx` to onnxscript's torch_lib registry (``registration`` is the
    loaded registry module); once."""
    if OP not in registration.default_registry:
        registration.torch_op(OP, trace_only=True)(deform_conv2d_onnx)


class _RegisterAfterLoad(importlib.abc.Loader):
    """Runs the real loader of onnxscript's registry module, then `_register`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the real loader's
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for onnxscript's registry module it takes the spec the other
    finders give and wraps its loader in `_RegisterAfterLoad`; it then leaves ``sys.meta_path``."""

    def find_spec(self, name, path, target=None):
        if name != REGISTRY_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisterAfterLoad(spec.loader)
            _remove_finder()
        return spec


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def _install() -> None:
    """Registers now if onnxscript's registry is loaded, else when it loads."""
    loaded = sys.modules.get(REGISTRY_MODULE)
    if loaded is not None:
        _register(loaded)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


_install()
