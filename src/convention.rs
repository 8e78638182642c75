//! Sampling conventions: how the deformable convolutions found in the wild treat a sample at or
//! near the image border, forward and backward.
//!
//! Inside the image, away from the last row and column, every convention is the same bilinear
//! interpolation with the same derivatives; they differ only in which positions count, what a
//! corner outside the image reads, and where the offset gradient is cut off. Each variant below
//! states its rule exactly, with the source file it was read from. Notation: a sample at
//! `(py, px)` in an `H x W` plane, `y0 = floor(py)`, `ly = py - y0`, likewise `x0`, `lx`;
//! `v(r, s)` a pixel; "window" is the set of positions whose sample counts (value and input
//! gradient), a sample outside it being 0 and sending nothing to the input.
//!
//! Whatever the convention, a NaN position gives a NaN value and NaN coordinate weights and
//! touches no pixel, and an infinite position is outside (this crate's rule; the C sources
//! leave it undefined).

/// Which framework's border rule to follow: see the module docs for the notation.
///
/// ```
/// use deformconv::{Convention, ConvParams};
/// let p = ConvParams::default().convention(Convention::Mmcv);
/// assert_eq!(p.convention, Convention::Mmcv);
/// assert_eq!(ConvParams::default().convention, Convention::Torchvision);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Convention {
    /// `torchvision.ops.deform_conv2d` (CPU and CUDA), the default and the contract of
    /// `DESIGN.md`. From `torchvision/csrc/ops/cpu/deform_conv2d_kernel.cpp`
    /// (`bilinear_interpolate`, `deformable_col2im_kernel`, `get_coordinate_weight`).
    ///
    /// - Window: `-1 < py < H` and `-1 < px < W` (open at both ends).
    /// - Value: `B = (1-ly)(1-lx) v(y0,x0) + (1-ly) lx v(y0,x0+1) + ly (1-lx) v(y0+1,x0)
    ///   + ly lx v(y0+1,x0+1)`, a corner outside the image reading 0.
    /// - `grad_input`: each corner inside the image receives its bilinear weight (the adjoint
    ///   of the value), nothing outside the window.
    /// - `grad_offset`: `Wy = lx (v(y1,x1) - v(y0,x1)) + (1-lx)(v(y1,x0) - v(y0,x0))`,
    ///   `Wx = ly (v(y1,x1) - v(y1,x0)) + (1-ly)(v(y0,x1) - v(y0,x0))` with `y1 = y0+1`,
    ///   `x1 = x0+1`, corners outside reading 0 and **no window cut-off**. At an integer
    ///   position this is the forward difference (right-hand derivative), also at `py = -1`
    ///   exactly, where the value itself is 0 (`Wy = (1-lx) v(0,x0) + lx v(0,x1)`).
    /// - `grad_mask`, `grad_weight`: from the value `B`.
    ///
    /// OpenVINO's `DeformableConvolution-8` with `bilinear_interpolation_pad = true` has the
    /// same forward (its window test `int(p) > -1 && int(p) < size` truncates toward zero,
    /// which selects the same open interval).
    #[default]
    Torchvision,
    /// mmcv's `DeformConv2d` / `ModulatedDeformConv2d` and MSRA's DCNv2 operator. From
    /// `mmcv/ops/csrc/common/cuda/modulated_deform_conv_cuda_kernel.cuh` and
    /// `deform_conv_cuda_kernel.cuh` (`dmcn_im2col_bilinear`, `dmcn_get_gradient_weight`,
    /// `dmcn_get_coordinate_weight`, the `inv_h = inv_w = -2` reset of the coord kernel) and
    /// `msracver/Deformable-ConvNets` `DCNv2_op/nn/deformable_im2col.cuh` (the same code).
    ///
    /// - Window, value, `grad_input`, `grad_mask`, `grad_weight`: exactly [`Torchvision`]'s.
    /// - `grad_offset`: [`Torchvision`]'s `Wy`, `Wx` inside the window; **0 outside it**
    ///   (`py <= -1 || py >= H || px <= -1 || px >= W`). Since torchvision's derivative is
    ///   already 0 wherever no corner is in the image, the two differ only at samples exactly
    ///   on `py = -1` or `px = -1` (the other coordinate reaching a corner inside): there mmcv
    ///   gives 0, the left-hand derivative, and torchvision the right-hand one.
    ///
    /// [`Torchvision`]: Convention::Torchvision
    Mmcv,
    /// The original DCN v1 operator of MXNet (`msracver/Deformable-ConvNets`
    /// `rfcn/operator_cxx/nn/deformable_im2col.cuh`, the same code as MXNet's
    /// `contrib.DeformableConvolution`), also OpenVINO's `DeformableConvolution-1` and
    /// `-8` with `bilinear_interpolation_pad = false` (its default; `reference/
    /// deformable_convolution.hpp`, forward only). The issue text's "corners clamped to
    /// the edge" is right but only the last row/column is concerned: the window already
    /// starts at 0.
    ///
    /// - Window: `0 <= py < H` and `0 <= px < W` (closed at 0, open at `H`): a sample in
    ///   `(-1, 0)` is 0, unlike torchvision.
    /// - Corners, per axis: if `y0 = floor(py) >= H - 1` (i.e. `py` in `[H-1, H)`) then
    ///   `y0 = y1 = H - 1` and `ly = 0` (the sample replicates the last row); otherwise
    ///   `y1 = y0 + 1`, `ly = py - y0`. Likewise for `x`. Every corner is then inside the image.
    /// - Value: the bilinear formula on those corners. (OpenVINO computes the last band as
    ///   `(1-ly) v(H-1) + ly v(H-1)` with `y1 = min(ceil(py), H-1)`: the same value up to
    ///   rounding.)
    /// - `grad_input`: the adjoint of the value (the collapsed corner receives the full weight
    ///   of its row/column; `get_gradient_weight` with the `|p - pixel| < 1` scan).
    /// - `grad_offset`: 0 outside the window (the coord kernel resets such positions to
    ///   `-1`); inside, the `Wy`, `Wx` formulas on the collapsed corners: so `Wy = 0` when
    ///   `py` is in `[H-1, H)` (the value is constant there) and `Wx = 0` when `px` is in
    ///   `[W-1, W)`; at other integer positions, including `py = 0`, the forward difference.
    /// - `grad_mask`, `grad_weight`: from the value `B` (DCN v1 has no mask; with one, it
    ///   multiplies the sample as in the modulated operators).
    ///
    /// Not the same as current TVM: `topi.nn.deformable_conv2d_nchw` uses this window
    /// (`h < 0 || h >= H` is outside) but, since apache/tvm PR #7397 (2021), corners outside
    /// the image read 0 (`bilinear_sample_nchw`) instead of being clamped; before it TVM
    /// clamped the upper corner to `H - 1` like DCN v1. TVM has no backward for it.
    DcnV1,
}

impl Convention {
    /// Every convention, in declaration order.
    pub const ALL: [Convention; 3] = [Convention::Torchvision, Convention::Mmcv, Convention::DcnV1];
}
