//! The fast backward pass: one function per gradient, and a combined backward that computes any
//! chosen subset in one pass, sharing the column gradient and the sampling between them.
//!
//! With `G = grad_out`, `gcol[c, k, n, y, x] = sum_{o in group(c)} weight[o, c', k] * G[n, o, y, x]`
//! and the sample of tap `k` at `(y, x)` at position `(py, px)` with mask `m` (`../DESIGN.md` §3):
//!
//! ```text
//! grad_input[n, c, r, s]        = sum_{k, y, x} gcol * m * dB/dv(r, s)
//! grad_offset[n, 2(gK+k), y, x] = sum_{c in g} gcol * m * Wy        (+1: Wx)
//! grad_mask[n, gK+k, y, x]      = sum_{c in g} gcol * B(input[n, c], py, px)
//! grad_weight[o, c', k]         = sum_{n, y, x} G[n, o, y, x] * m * B(input[n, c], py, px)
//! grad_bias[o]                  = sum_{n, y, x} G[n, o, y, x]
//! ```
//!
//! `B`, `Wy`, `Wx` and which samples count follow `params.convention` ([`Convention`]): by default
//! torchvision's (`Wy`, `Wx` the one-sided derivatives, forward difference at integer positions,
//! no window cut-off); mmcv's cuts `Wy`, `Wx` off outside the window; DCN v1's has the window
//! `0 <= p < size` and collapses the corners of the last row and column (the collapsed pixel
//! receives the full weight in `grad_input`). The dense backward ignores the convention: it
//! samples integer positions only, where all of them agree.
//!
//! **Determinism.** The work is split by a partition that depends only on the shapes (see
//! `driver`): every output element has one owner task, sums over channels run in a fixed order
//! inside that task (ascending; on the `f32` AVX-512 path sixteen lane sums reduced by a fixed
//! tree), and `grad_weight` is a fixed number of partials added in fixed order.
//! Results are bitwise identical for any rayon thread count, and the combined backward returns
//! bitwise the same tensors as the separate functions.
//!
//! **Non-finite values.** A NaN offset makes its sample NaN: NaN in the `grad_offset`,
//! `grad_mask` and `grad_weight` entries it contributes to, nothing sent to `grad_input`.
//! Infinite or huge offsets put the sample outside the image (contributing 0). NaN or infinity
//! in the other tensors propagates by ordinary arithmetic into the outputs they feed.
//!
//! **Workspace.** Per running task: the offset group's padded input and `grad_input` planes of
//! one image group, a column tile and a column-gradient tile of at most 512 pixels (on the
//! `f32` AVX-512 path about 512 KiB each), a packed `grad_out` tile and the tile's sampling
//! table; plus, for `grad_weight`, at most `R - 1 <= 3` weight-sized partials (one more if the
//! caller's `grad_weight` view is not row-major; `R` partials and a packed tap-major copy of the
//! weight on the `f32` AVX-512 path). None of it grows with the batch size
//! (`examples/workspace_probe.rs` measures the peak).
//!
//! **Kept between calls.** To spare the page faults of fresh multi-megabyte buffers, each
//! thread keeps up to 32 MiB of scratch (tiles, planes, packed weights; the forward's too) for
//! the next call (W4, 2 threads: about 36 MiB in all; W2: 26-30 MiB); [`release_cached_scratch`]
//! frees it.
//!
//! Threads come from the caller's rayon pool (`ThreadPool::install`).

mod driver;

use std::borrow::Cow;

use ndarray::{Array1, Array4, ArrayView4, ArrayViewMut1, ArrayViewMut3, ArrayViewMut4, Axis};
use rayon::prelude::*;

use crate::convention::Convention;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::{try_zeros, Geometry};
use crate::kernels::columns::MAX_CELLS;
use crate::params::ConvParams;

use driver::{ImageOut, Needs, Operands, Stats};

/// Which gradients a combined backward computes.
///
/// ```
/// use deformconv::Want;
/// let w = Want::NONE.input().weight();
/// assert!(w.input && w.weight && !w.offset);
/// assert_eq!(Want::ALL, Want::NONE.input().offset().mask().weight().bias());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Want {
    /// `grad_input`.
    pub input: bool,
    /// `grad_offset` (ignored by the dense backward).
    pub offset: bool,
    /// `grad_mask` (ignored by the dense backward).
    pub mask: bool,
    /// `grad_weight`.
    pub weight: bool,
    /// `grad_bias`.
    pub bias: bool,
}

impl Want {
    /// No gradient.
    pub const NONE: Want = Want {
        input: false,
        offset: false,
        mask: false,
        weight: false,
        bias: false,
    };
    /// Every gradient.
    pub const ALL: Want = Want {
        input: true,
        offset: true,
        mask: true,
        weight: true,
        bias: true,
    };
    /// Also `grad_input`.
    pub const fn input(mut self) -> Want {
        self.input = true;
        self
    }
    /// Also `grad_offset`.
    pub const fn offset(mut self) -> Want {
        self.offset = true;
        self
    }
    /// Also `grad_mask`.
    pub const fn mask(mut self) -> Want {
        self.mask = true;
        self
    }
    /// Also `grad_weight`.
    pub const fn weight(mut self) -> Want {
        self.weight = true;
        self
    }
    /// Also `grad_bias`.
    pub const fn bias(mut self) -> Want {
        self.bias = true;
        self
    }
}

/// The gradients a backward computed; `None` for those not asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads<T> {
    /// `grad_input`, `[N, C_in, H, W]`.
    pub input: Option<Array4<T>>,
    /// `grad_offset`, `[N, 2 G_off K, H_out, W_out]`.
    pub offset: Option<Array4<T>>,
    /// `grad_mask`, `[N, G_off K, H_out, W_out]`.
    pub mask: Option<Array4<T>>,
    /// `grad_weight`, `[C_out, C_in / groups, kh, kw]`.
    pub weight: Option<Array4<T>>,
    /// `grad_bias`, `[C_out]`.
    pub bias: Option<Array1<T>>,
}

/// Caller-provided outputs of a combined backward: the gradients whose view is `Some` are
/// computed, each view (any strides) fully overwritten.
#[derive(Debug, Default)]
pub struct GradsMut<'a, T> {
    /// `grad_input`, `[N, C_in, H, W]`.
    pub input: Option<ArrayViewMut4<'a, T>>,
    /// `grad_offset`, `[N, 2 G_off K, H_out, W_out]`.
    pub offset: Option<ArrayViewMut4<'a, T>>,
    /// `grad_mask`, `[N, G_off K, H_out, W_out]`.
    pub mask: Option<ArrayViewMut4<'a, T>>,
    /// `grad_weight`, `[C_out, C_in / groups, kh, kw]`.
    pub weight: Option<ArrayViewMut4<'a, T>>,
    /// `grad_bias`, `[C_out]`.
    pub bias: Option<ArrayViewMut1<'a, T>>,
}

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The elements in row-major order, borrowed when the view already is.
fn row_major<'a, T: Float>(v: &ArrayView4<'a, T>) -> Cow<'a, [T]> {
    match v.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(v.iter().copied().collect()),
    }
}

/// The problem's tensors, shape-checked.
struct Problem<'a, T> {
    g: Geometry,
    grad_out: ArrayView4<'a, T>,
    input: Option<ArrayView4<'a, T>>,
    offset: Option<ArrayView4<'a, T>>,
    mask: Option<ArrayView4<'a, T>>,
    weight: Option<ArrayView4<'a, T>>,
    /// The sampling convention (torchvision for a dense problem).
    convention: Convention,
}

impl<'a, T: Float> Problem<'a, T> {
    /// Validates a deformable problem (`offset` present) or a dense one (`offset` absent, offset
    /// groups forced to 1, convention forced to torchvision: a dense convolution samples integer
    /// positions only, where every convention reads the same pixel or nothing).
    #[allow(clippy::too_many_arguments)]
    fn new(
        grad_out: ArrayView4<'a, T>,
        input_shape: [usize; 4],
        input: Option<ArrayView4<'a, T>>,
        offset: Option<ArrayView4<'a, T>>,
        mask: Option<ArrayView4<'a, T>>,
        weight_shape: [usize; 4],
        weight: Option<ArrayView4<'a, T>>,
        params: &ConvParams,
    ) -> Result<Self> {
        let params = if offset.is_some() {
            *params
        } else {
            params.offset_groups(1).convention(Convention::Torchvision)
        };
        let g = Geometry::new(input_shape, weight_shape, &params)?;
        if let Some(o) = &offset {
            g.check_offset(o.shape())?;
        }
        if let Some(m) = &mask {
            g.check_mask(m.shape())?;
        }
        g.check_out("grad_out", grad_out.shape())?;
        if offset.is_some() {
            check_plane(&g)?;
        }
        Ok(Problem {
            g,
            grad_out,
            input,
            offset,
            mask,
            weight,
            convention: params.convention,
        })
    }

    /// Allocates the wanted gradients and computes them.
    fn solve(&self, want: Want) -> Result<Grads<T>> {
        let g = &self.g;
        let dense = self.offset.is_none();
        let mk = |on: bool, what: &str, shape: [usize; 4]| -> Result<Option<Array4<T>>> {
            on.then(|| try_zeros(what, shape, T::ZERO)).transpose()
        };
        let mut grads = Grads {
            input: mk(want.input, "grad_input", g.input_shape())?,
            offset: mk(want.offset && !dense, "grad_offset", g.offset_shape())?,
            mask: mk(want.mask && !dense, "grad_mask", g.mask_shape())?,
            weight: mk(want.weight, "grad_weight", g.weight_shape())?,
            bias: want.bias.then(|| Array1::<T>::from_elem(g.c_out, T::ZERO)),
        };
        let out = GradsMut {
            input: grads.input.as_mut().map(|a| a.view_mut()),
            offset: grads.offset.as_mut().map(|a| a.view_mut()),
            mask: grads.mask.as_mut().map(|a| a.view_mut()),
            weight: grads.weight.as_mut().map(|a| a.view_mut()),
            bias: grads.bias.as_mut().map(|a| a.view_mut()),
        };
        self.solve_into(out);
        Ok(grads)
    }

    /// Checks the shapes of caller-provided outputs, then computes them.
    fn solve_checked(&self, out: GradsMut<'_, T>) -> Result<Stats> {
        let g = &self.g;
        if let Some(v) = &out.input {
            g.check_exact("grad_input", v.shape(), &g.input_shape())?;
        }
        if let Some(v) = &out.offset {
            g.check_exact("grad_offset", v.shape(), &g.offset_shape())?;
        }
        if let Some(v) = &out.mask {
            g.check_exact("grad_mask", v.shape(), &g.mask_shape())?;
        }
        if let Some(v) = &out.weight {
            g.check_exact("grad_weight", v.shape(), &g.weight_shape())?;
        }
        if let Some(v) = &out.bias {
            g.check_exact("grad_bias", v.shape(), &[g.c_out])?;
        }
        if self.offset.is_none() && (out.offset.is_some() || out.mask.is_some()) {
            return Err(Error::Param {
                name: "grad_offset",
                rule: "a dense convolution has no offset or mask gradient; pass None".into(),
            });
        }
        Ok(self.solve_into(out))
    }

    /// Computes every gradient whose view is `Some` (shapes already checked).
    fn solve_into(&self, out: GradsMut<'_, T>) -> Stats {
        let g = &self.g;
        let needs = Needs {
            input: out.input.is_some(),
            offset: out.offset.is_some(),
            mask: out.mask.is_some(),
            weight: out.weight.is_some(),
        };
        let grad_out = row_major(&self.grad_out);
        if let Some(b) = out.bias {
            grad_bias_into(g, &grad_out, b);
        }
        if !(needs.gcol() || needs.weight) {
            return Stats::default();
        }
        let offset = self.offset.as_ref().map(row_major);
        let mask = self.mask.as_ref().map(row_major);
        let weight = if needs.gcol() {
            self.weight.as_ref().map(row_major)
        } else {
            None
        };
        let ops = Operands {
            grad_out: &grad_out,
            input: if needs.input_planes() {
                self.input
            } else {
                None
            },
            offset: offset.as_deref(),
            mask: mask.as_deref(),
            weight: weight.as_deref(),
            convention: self.convention,
        };
        let k = g.taps();
        let mut inputs = split_per_image_group(g.n, out.input, g.c_per_offset_group());
        let mut offsets = split_per_image_group(g.n, out.offset, 2 * k);
        let mut masks = split_per_image_group(g.n, out.mask, k);
        let outs: Vec<ImageOut<'_, T>> = (0..g.n * g.offset_groups)
            .map(|i| ImageOut {
                input: inputs.get_mut(i).and_then(Option::take),
                offset: offsets.get_mut(i).and_then(Option::take),
                mask: masks.get_mut(i).and_then(Option::take),
            })
            .collect();
        match out.weight {
            Some(mut wv) => match wv.as_slice_mut() {
                // A row-major output is written in place.
                Some(w) => driver::run(g, &ops, needs, outs, Some(w)),
                None => {
                    let mut w = vec![T::ZERO; g.c_out * g.c_in_per_group() * k];
                    let stats = driver::run(g, &ops, needs, outs, Some(&mut w));
                    for (d, &s) in wv.iter_mut().zip(&w) {
                        *d = s;
                    }
                    stats
                }
            },
            None => driver::run(g, &ops, needs, outs, None),
        }
    }
}

/// Refuses input planes whose padded copy, `(H + 2) x (W + 3)` cells, exceeds
/// [`MAX_CELLS`]: the deformable backward addresses a task's planes with `i32` bases.
fn check_plane(g: &Geometry) -> Result<()> {
    let cells = (g.h.max(1) + 2).checked_mul(g.w.saturating_add(3));
    if matches!(cells, Some(c) if c <= MAX_CELLS) {
        return Ok(());
    }
    Err(Error::TooLarge {
        what: format!(
            "input plane of {} x {} pixels for the deformable backward (at most 2^30 - 1 cells \
             with its border, (H + 2) * (W + 3))",
            g.h, g.w
        ),
    })
}

/// Splits `[N, G * chunk, ., .]` into the `N * G` views `[chunk, ., .]`, image-major (empty for
/// `None`).
fn split_per_image_group<T>(
    n: usize,
    v: Option<ArrayViewMut4<'_, T>>,
    chunk: usize,
) -> Vec<Option<ArrayViewMut3<'_, T>>> {
    let mut out = Vec::new();
    let Some(mut rest) = v else {
        return out;
    };
    for _ in 0..n {
        let (head, tail) = rest.split_at(Axis(0), 1);
        rest = tail;
        let mut img = head.index_axis_move(Axis(0), 0);
        while img.len_of(Axis(0)) > chunk {
            let (part, tail) = img.split_at(Axis(0), chunk);
            out.push(Some(part));
            img = tail;
        }
        out.push(Some(img));
    }
    out
}

/// `grad_bias[o] = sum_{n, y, x} G[n, o, y, x]`, in the fixed order described inside.
fn grad_bias_into<T: Float>(g: &Geometry, grad_out: &[T], mut out: ArrayViewMut1<'_, T>) {
    const LANES: usize = 16;
    let hw = g.out_pixels();
    let sums: Vec<T> = (0..g.c_out)
        .into_par_iter()
        .map(|o| {
            // Sixteen running sums (element i of a plane into sum i mod 16, planes in image
            // order), added pairwise at the end: a fixed order, so the same bits for any
            // thread count, and no single chain of N H_out W_out dependent additions (W1:
            // 9216 per channel; the 2-thread backward 0.98 -> 0.95 ms, min of 100).
            let mut acc = [T::ZERO; LANES];
            for n in 0..g.n {
                let plane = &grad_out[(n * g.c_out + o) * hw..][..hw];
                let mut chunks = plane.chunks_exact(LANES);
                for c in &mut chunks {
                    for (a, &v) in acc.iter_mut().zip(c) {
                        *a += v;
                    }
                }
                for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
                    *a += v;
                }
            }
            let mut width = LANES;
            while width > 1 {
                width /= 2;
                for i in 0..width {
                    acc[i] += acc[i + width];
                }
            }
            acc[0]
        })
        .collect();
    for (d, s) in out.iter_mut().zip(sums) {
        *d = s;
    }
}

/// Every gradient of the deformable convolution selected by `want`, in one pass that shares the
/// column gradient `weightᵀ · grad_out` and the sampling between them (see the module docs for
/// the formulas). Gradients not wanted are `None` and are neither computed nor allocated;
/// `want.mask` without a `mask` gives the gradient with respect to a unit mask.
pub fn deform_conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    p.solve(want)
}

/// [`deform_conv2d_backward`] into caller-provided outputs: the gradients whose view is `Some`.
pub fn deform_conv2d_backward_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: GradsMut<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    p.solve_checked(out).map(|_| ())
}

/// `grad_input[n, c, r, s] = sum_{k, y, x} gcol[c, k, n, y, x] * m * dB/dv(r, s)`: each sample
/// hands its column gradient, times the mask, to the corners it read with the forward's
/// bilinear weights. `input_shape = [N, C_in, H, W]`.
pub fn deform_conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let ws = dims(weight.shape());
    let p = Problem::new(
        grad_out,
        input_shape,
        None,
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    Ok(p.solve(Want::NONE.input())?.input.unwrap_or_default())
}

/// [`deform_conv2d_grad_input`] into `out` (`[N, C_in, H, W]`, any strides).
pub fn deform_conv2d_grad_input_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(out.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        None,
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    let out = GradsMut {
        input: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_offset[n, 2(gK+k), y, x] = sum_{c in g} gcol * m * Wy` and `[.., 2(gK+k)+1, ..]` with
/// `Wx`: the bilinear derivatives of `params.convention` (by default torchvision's one-sided
/// ones, no window cut-off, corners outside the image reading 0; see [`Convention`]).
pub fn deform_conv2d_grad_offset<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    Ok(p.solve(Want::NONE.offset())?.offset.unwrap_or_default())
}

/// [`deform_conv2d_grad_offset`] into `out` (`[N, 2 G_off K, H_out, W_out]`, any strides).
pub fn deform_conv2d_grad_offset_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        ws,
        Some(weight),
        params,
    )?;
    let out = GradsMut {
        offset: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_mask[n, gK+k, y, x] = sum_{c in g} gcol[c, k, n, y, x] * B(input[n, c], py, px)`. It does
/// not depend on the mask, so none is taken.
pub fn deform_conv2d_grad_mask<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        None,
        ws,
        Some(weight),
        params,
    )?;
    Ok(p.solve(Want::NONE.mask())?.mask.unwrap_or_default())
}

/// [`deform_conv2d_grad_mask`] into `out` (`[N, G_off K, H_out, W_out]`, any strides).
pub fn deform_conv2d_grad_mask_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        None,
        ws,
        Some(weight),
        params,
    )?;
    let out = GradsMut {
        mask: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * m * B(input[n, c], py, px)`,
/// i.e. `grad_out · colsᵀ`; `weight_shape = [C_out, C_in / groups, kh, kw]`.
pub fn deform_conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let is = dims(input.shape());
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        weight_shape,
        None,
        params,
    )?;
    Ok(p.solve(Want::NONE.weight())?.weight.unwrap_or_default())
}

/// [`deform_conv2d_grad_weight`] into `out` (`[C_out, C_in / groups, kh, kw]`, any strides).
pub fn deform_conv2d_grad_weight_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(out.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        Some(offset),
        mask,
        ws,
        None,
        params,
    )?;
    let out = GradsMut {
        weight: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_bias[o] = sum_{n, y, x} grad_out[n, o, y, x]` (the same for the dense convolution).
pub fn deform_conv2d_grad_bias<T: Float>(grad_out: ArrayView4<'_, T>) -> Result<Array1<T>> {
    let mut out = Array1::from_elem(grad_out.shape()[1], T::ZERO);
    deform_conv2d_grad_bias_into(grad_out, out.view_mut())?;
    Ok(out)
}

/// [`deform_conv2d_grad_bias`] into `out` (`[C_out]`, any stride).
pub fn deform_conv2d_grad_bias_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    out: ArrayViewMut1<'_, T>,
) -> Result<()> {
    let s = dims(grad_out.shape());
    if out.len() != s[1] {
        return Err(Error::Shape {
            tensor: "grad_bias",
            axis: "elements",
            expected: format!("grad_out channels = {}", s[1]),
            got: out.len(),
        });
    }
    let g = Geometry {
        n: s[0],
        c_out: s[1],
        h_out: s[2],
        w_out: s[3],
        ..Geometry::new([1, 1, 1, 1], [1, 1, 1, 1], &ConvParams::default())?
    };
    grad_bias_into(&g, &row_major(&grad_out), out);
    Ok(())
}

/// The gradients of the dense (strided, dilated, grouped) convolution selected by `want`
/// (`want.offset` and `want.mask` are ignored and their fields are `None`): the deformable
/// formulas with zero offsets and a unit mask.
pub fn conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        None,
        None,
        ws,
        Some(weight),
        params,
    )?;
    p.solve(want)
}

/// [`conv2d_backward`] into caller-provided outputs (`offset` and `mask` must be `None`).
pub fn conv2d_backward_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: GradsMut<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(weight.shape()));
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        None,
        None,
        ws,
        Some(weight),
        params,
    )?;
    p.solve_checked(out).map(|_| ())
}

/// Dense `grad_input[n, c, r, s] = sum_{o, i, j : r = y sh - pad_top + i dh, s = x sw - pad_left + j dw}
/// weight[o, c', i, j] * grad_out[n, o, y, x]` (col2im of `weightᵀ · grad_out`).
pub fn conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let ws = dims(weight.shape());
    let p = Problem::new(
        grad_out,
        input_shape,
        None,
        None,
        None,
        ws,
        Some(weight),
        params,
    )?;
    Ok(p.solve(Want::NONE.input())?.input.unwrap_or_default())
}

/// [`conv2d_grad_input`] into `out` (`[N, C_in, H, W]`, any strides).
pub fn conv2d_grad_input_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(out.shape()), dims(weight.shape()));
    let p = Problem::new(grad_out, is, None, None, None, ws, Some(weight), params)?;
    let out = GradsMut {
        input: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// Dense `grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * input[n, c, y sh - pad_top + i dh, x sw - pad_left + j dw]`
/// (`grad_out · im2colᵀ`; pixels outside the image read 0).
pub fn conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let is = dims(input.shape());
    let p = Problem::new(
        grad_out,
        is,
        Some(input),
        None,
        None,
        weight_shape,
        None,
        params,
    )?;
    Ok(p.solve(Want::NONE.weight())?.weight.unwrap_or_default())
}

/// [`conv2d_grad_weight`] into `out` (`[C_out, C_in / groups, kh, kw]`, any strides).
pub fn conv2d_grad_weight_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let (is, ws) = (dims(input.shape()), dims(out.shape()));
    let p = Problem::new(grad_out, is, Some(input), None, None, ws, None, params)?;
    let out = GradsMut {
        weight: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// Frees the scratch buffers the backward keeps between calls (at most 32 MiB per thread) on
/// every thread of the current rayon pool and on the calling thread. Call it from inside
/// `ThreadPool::install` for a pool of your own. The next backward allocates them again.
pub fn release_cached_scratch() {
    crate::scratch::clear_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array;

    type Tensors = (
        Array4<f64>,
        Array4<f64>,
        Option<Array4<f64>>,
        Array4<f64>,
        Array4<f64>,
    );

    fn problem(n: usize, mask: bool) -> Tensors {
        let val = |i: usize| ((i * 2654435761usize) % 1000) as f64 / 500.0 - 1.0;
        let input = Array::from_shape_fn((n, 4, 5, 6), |(a, b, c, d)| {
            val(a * 1000 + b * 100 + c * 10 + d)
        });
        let offset = Array::from_shape_fn((n, 2 * 2 * 9, 5, 6), |(a, b, c, d)| {
            1.3 * val(7 + a * 999 + b * 37 + c * 11 + d)
        });
        let m = mask.then(|| {
            Array::from_shape_fn((n, 2 * 9, 5, 6), |(a, b, c, d)| {
                val(3 + a * 91 + b * 17 + c * 5 + d)
            })
        });
        let weight = Array::from_shape_fn((6, 4, 3, 3), |(a, b, c, d)| {
            val(11 + a * 77 + b * 9 + c * 3 + d)
        });
        let grad_out = Array::from_shape_fn((n, 6, 5, 6), |(a, b, c, d)| {
            val(5 + a * 313 + b * 31 + c * 7 + d)
        });
        (input, offset, m, weight, grad_out)
    }

    fn stats_for(want: Want) -> (Stats, Grads<f64>) {
        let (input, offset, mask, weight, grad_out) = problem(3, true);
        let params = ConvParams::default().padding(1, 1).offset_groups(2);
        let p = Problem::new(
            grad_out.view(),
            dims(input.shape()),
            Some(input.view()),
            Some(offset.view()),
            mask.as_ref().map(|m| m.view()),
            dims(weight.shape()),
            Some(weight.view()),
            &params,
        )
        .unwrap();
        let grads = p.solve(want).unwrap();
        let mut g2 = p.solve(want).unwrap();
        let out = GradsMut {
            input: g2.input.as_mut().map(|a| a.view_mut()),
            offset: g2.offset.as_mut().map(|a| a.view_mut()),
            mask: g2.mask.as_mut().map(|a| a.view_mut()),
            weight: g2.weight.as_mut().map(|a| a.view_mut()),
            bias: g2.bias.as_mut().map(|a| a.view_mut()),
        };
        (p.solve_checked(out).unwrap(), grads)
    }

    #[test]
    fn a_subset_runs_only_its_kernels_and_allocates_only_its_outputs() {
        let (s, g) = stats_for(Want::NONE.input());
        assert!(g.offset.is_none() && g.mask.is_none() && g.weight.is_none() && g.bias.is_none());
        assert!(s.gcol_gemms > 0 && s.scatters > 0);
        assert_eq!(
            (
                s.sample_passes,
                s.weight_gemms,
                s.input_copies,
                s.col_elems > 0
            ),
            (0, 0, 0, true)
        );
        assert_eq!(s.weight_part_elems, 0);

        let (s, g) = stats_for(Want::NONE.weight());
        assert!(g.input.is_none() && g.offset.is_none() && g.weight.is_some());
        assert_eq!((s.gcol_gemms, s.scatters, s.grad_plane_elems), (0, 0, 0));
        assert!(s.weight_gemms > 0 && s.sample_passes > 0);

        let (s, _) = stats_for(Want::NONE.offset().mask());
        assert!(s.gcol_gemms > 0 && s.sample_passes > 0);
        assert_eq!(
            (
                s.scatters,
                s.weight_gemms,
                s.grad_plane_elems,
                s.weight_part_elems
            ),
            (0, 0, 0, 0)
        );

        let (s, g) = stats_for(Want::NONE.bias());
        assert_eq!(s, Stats::default());
        assert!(g.bias.is_some() && g.input.is_none());

        let (s, _) = stats_for(Want::NONE);
        assert_eq!(s, Stats::default());

        // Everything at once shares the column gradient: one GEMM per (tile, segment), as for
        // grad_input alone.
        let (all, _) = stats_for(Want::ALL);
        let (only_input, _) = stats_for(Want::NONE.input());
        assert_eq!(all.gcol_gemms, only_input.gcol_gemms);
        assert_eq!(all.sample_passes, all.scatters);
    }

    /// Small output images of large planes: a pixel-major image group stays within the cells
    /// the column table's `i32` bases reach; the channel-major plan is not capped.
    #[test]
    fn pixel_major_groups_stay_within_the_cell_limit() {
        let params = ConvParams::default().stride(4096, 4096);
        let g = Geometry::new([64, 1, 16384, 16384], [1, 1, 1, 1], &params).unwrap();
        let layout = crate::kernels::taps::PlaneLayout::zero_bordered(g.h, g.w);
        let plan = driver::Plan::new(&g, layout, true);
        assert!(plan.max_images() > 1);
        assert!(plan.max_images() * layout.len() <= MAX_CELLS);
        let channel_major = driver::Plan::new(&g, layout, false);
        assert!(channel_major.max_images() * layout.len() > MAX_CELLS);
    }

    #[test]
    fn w4_full_backward_workspace_is_below_64_mib() {
        let params = ConvParams::default().padding(1, 1);
        let g = Geometry::new([2, 256, 64, 64], [256, 256, 3, 3], &params).unwrap();
        let layout = crate::kernels::taps::PlaneLayout::zero_bordered(64, 64);
        let plan = driver::Plan::new(&g, layout, true);
        let all = Needs {
            input: true,
            offset: true,
            mask: true,
            weight: true,
        };
        let tap_elems = std::mem::size_of::<crate::kernels::taps::Tap<f32>>().div_ceil(4);
        let bytes = 4 * plan.workspace_elements(&g, all, 2, tap_elems);
        eprintln!(
            "W4 full backward workspace (f32, 2 threads): {:.1} MiB",
            bytes as f64 / 1048576.0
        );
        assert!(bytes < 64 << 20, "{} MiB", bytes >> 20);
        // Past MIN_TASKS images the workspace no longer depends on the batch size.
        let at = |n: usize| {
            let g = Geometry::new([n, 256, 64, 64], [256, 256, 3, 3], &params).unwrap();
            4 * driver::Plan::new(&g, layout, true).workspace_elements(&g, all, 2, tap_elems)
        };
        assert_eq!(at(16), at(128));
        assert!(at(16) < 64 << 20, "{} MiB", at(16) >> 20);
    }
}
