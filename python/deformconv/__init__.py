"""deformconv: deformable convolution (DCN v1/v2) and dense convolution on the CPU, forward and
every gradient, with torchvision's semantics, and an exact f64 oracle to test other kernels.

- numpy: `deform_conv2d`, `conv2d`, `deform_conv2d_backward`, `conv2d_backward` (float32 or
  float64, any strides, the GIL released while computing);
- `deformconv.reference`: the f64 oracle, same signatures;
- `compare` / `assert_close`: a kernel's results against the oracle under the per-element bound;
- `deformconv.testing`: Hypothesis strategies generating valid problems;
- `deformconv.torch`: the PyTorch op and ``DeformConv2d`` module, and ``use_for_torchvision()``;
- `deformconv.layout`: other frameworks' weight, activation and offset layouts.

Threads: the numpy API runs on a rayon pool of its own, not on PyTorch's threads:
``RAYON_NUM_THREADS`` (read once, at the first call) or one thread per core by default;
`set_num_threads` replaces it at any time. The torch ops of `deformconv.torch` run on PyTorch's
OpenMP threads instead (``torch.set_num_threads``; see `deformconv.torch.use_openmp`).
"""

from . import layout, reference
from ._api import Grads, conv2d, conv2d_backward, deform_conv2d, deform_conv2d_backward
from ._args import CONVENTIONS, Padding
from ._compare import DEFAULT_BOUND_FACTOR, Report, TensorReport, assert_close, compare
from ._native import get_num_threads, release_cached_scratch, set_num_threads

__version__ = "0.1.0"

__all__ = [
    "CONVENTIONS",
    "DEFAULT_BOUND_FACTOR",
    "Grads",
    "Padding",
    "Report",
    "TensorReport",
    "assert_close",
    "compare",
    "conv2d",
    "conv2d_backward",
    "deform_conv2d",
    "deform_conv2d_backward",
    "get_num_threads",
    "layout",
    "reference",
    "release_cached_scratch",
    "set_num_threads",
]
