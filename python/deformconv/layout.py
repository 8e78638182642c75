"""Weight, activation and offset layouts of other frameworks, to and from ours (NCHW tensors,
OIHW weights, torchvision's interleaved ``(dy, dx)`` offsets): `deformconv::layout` and
`deformconv::offset_layout`.

Weight layouts: ``"oihw"`` (PyTorch, torchvision, ONNX, mmcv, MindSpore, Theano), ``"iohw"``
(Lasagne ``DilatedConv2DLayer``), ``"hwio"`` (TensorFlow, Keras), ``"ohwi"`` (TensorFlow Lite);
``flip=True`` for frameworks applying the kernel as a true convolution (Theano ``conv2d`` and
Lasagne ``Conv2DLayer`` by default). Offset layouts: ``"interleaved_yx"`` (ours, torchvision),
``"interleaved_xy"``, ``"planar_yx"``, ``"blocks_xy"`` (MindSpore, Ascend). Packed offset + mask
layouts: ``"mmcv_chunks"`` (mmcv ``ModulatedDeformConv2dPack``, DCNv2), ``"xy_mask_blocks"``
(MindSpore, Ascend). Every result is a new C-ordered array of the input's dtype.
"""

from __future__ import annotations

import numpy as np

from . import _args, _native

__all__ = [
    "to_oihw",
    "from_oihw",
    "nhwc_to_nchw",
    "nchw_to_nhwc",
    "convert_offset",
    "unpack_offset_mask",
    "pack_offset_mask",
]


def to_oihw(weight, layout: str, flip: bool = False) -> np.ndarray:
    """A weight stored in ``layout`` as our ``[C_out, C_in / groups, kh, kw]``."""
    return _native.convert_layout(_args.array("weight", weight, 4), "to_oihw", layout, flip)


def from_oihw(weight, layout: str, flip: bool = False) -> np.ndarray:
    """Our OIHW weight in ``layout`` (the inverse of `to_oihw`)."""
    return _native.convert_layout(_args.array("weight", weight, 4), "from_oihw", layout, flip)


def nhwc_to_nchw(tensor) -> np.ndarray:
    """``[N, H, W, C]`` to ``[N, C, H, W]`` (activations, offsets and masks alike)."""
    return _native.convert_layout(_args.array("tensor", tensor, 4), "nhwc_to_nchw", "oihw", False)


def nchw_to_nhwc(tensor) -> np.ndarray:
    """``[N, C, H, W]`` to ``[N, H, W, C]``."""
    return _native.convert_layout(_args.array("tensor", tensor, 4), "nchw_to_nhwc", "oihw", False)


def convert_offset(offset, source: str, target: str, offset_groups: int = 1) -> np.ndarray:
    """Offsets whose ``2 * G * K`` channels are in ``source`` layout, reordered to ``target``."""
    g = _args.positive("offset_groups", offset_groups)
    return _native.convert_offset(_args.array("offset", offset, 4), source, target, g)


def unpack_offset_mask(packed, layout: str, offset_groups: int = 1) -> tuple:
    """``(offset, mask)`` in our layouts from one tensor of ``3 * G * K`` channels."""
    g = _args.positive("offset_groups", offset_groups)
    return _native.unpack_offset_mask(_args.array("packed", packed, 4), layout, g)


def pack_offset_mask(offset, mask, layout: str, offset_groups: int = 1) -> np.ndarray:
    """Our offset and mask packed into one tensor of ``3 * G * K`` channels in ``layout``."""
    o = _args.array("offset", offset, 4)
    m = _args.array("mask", mask, 4, o.dtype)
    return _native.pack_offset_mask(o, m, layout, _args.positive("offset_groups", offset_groups))
