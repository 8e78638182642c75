//! A backward call's tensors, validated ([`Problem::new`]), and the plumbing every public
//! wrapper shares: output allocation and shape checks, row-major copies, the split of the
//! outputs per (image, offset group) for the driver, and `grad_bias`.

use ndarray::{Array1, Array4, ArrayView4, ArrayViewMut1, ArrayViewMut3, ArrayViewMut4, Axis};
use rayon::prelude::*;

use super::driver;
use super::operands::{ImageOut, Needs, Operands, Stats};
use super::{Grads, GradsMut, Want};
use crate::convention::Convention;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::{try_zeros, Geometry};
use crate::kernels::columns::MAX_CELLS;
use crate::params::ConvParams;
use crate::row_major::row_major;

pub(super) fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// A tensor of a backward call: its view, or only its shape when the asked gradients do not
/// read it (`grad_input` needs no input values, `grad_weight` no weight values).
#[derive(Clone, Copy)]
pub(super) enum Operand<'a, T> {
    /// The tensor itself.
    View(ArrayView4<'a, T>),
    /// Its shape alone.
    Shape([usize; 4]),
}

impl<'a, T> Operand<'a, T> {
    fn shape(&self) -> [usize; 4] {
        match self {
            Operand::View(v) => dims(v.shape()),
            Operand::Shape(s) => *s,
        }
    }
    fn view(self) -> Option<ArrayView4<'a, T>> {
        match self {
            Operand::View(v) => Some(v),
            Operand::Shape(_) => None,
        }
    }
}

/// The tensors of a backward call by name (all 4-D; `offset` absent for a dense convolution).
pub(super) struct Tensors<'a, T> {
    pub(super) grad_out: ArrayView4<'a, T>,
    pub(super) input: Operand<'a, T>,
    pub(super) offset: Option<ArrayView4<'a, T>>,
    pub(super) mask: Option<ArrayView4<'a, T>>,
    pub(super) weight: Operand<'a, T>,
}

/// The problem's tensors, shape-checked.
pub(super) struct Problem<'a, T> {
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
    pub(super) fn new(t: Tensors<'a, T>, params: &ConvParams) -> Result<Self> {
        let params = if t.offset.is_some() {
            *params
        } else {
            params.offset_groups(1).convention(Convention::Torchvision)
        };
        let g = Geometry::new(t.input.shape(), t.weight.shape(), &params)?;
        if let Some(o) = &t.offset {
            g.check_offset(o.shape())?;
        }
        if let Some(m) = &t.mask {
            g.check_mask(m.shape())?;
        }
        g.check_out("grad_out", t.grad_out.shape())?;
        if t.offset.is_some() {
            check_plane(&g)?;
        }
        Ok(Problem {
            g,
            grad_out: t.grad_out,
            input: t.input.view(),
            offset: t.offset,
            mask: t.mask,
            weight: t.weight.view(),
            convention: params.convention,
        })
    }

    /// Allocates the wanted gradients and computes them, inside the rayon pool.
    pub(super) fn solve(&self, want: Want) -> Result<Grads<T>> {
        crate::pool::on_pool(|| self.allocate_and_solve(want))
    }

    fn allocate_and_solve(&self, want: Want) -> Result<Grads<T>> {
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
    pub(super) fn solve_checked(&self, out: GradsMut<'_, T>) -> Result<Stats> {
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
        Ok(crate::pool::on_pool(|| self.solve_into(out)))
    }

    /// Computes every gradient whose view is `Some` (shapes already checked); called inside
    /// the rayon pool ([`crate::pool`]).
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
pub(super) fn grad_bias_into<T: Float>(
    g: &Geometry,
    grad_out: &[T],
    mut out: ArrayViewMut1<'_, T>,
) {
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
