//! Property-testing other kernels against the oracle (cargo feature `testing`).
//!
//! - [`problems`] / [`problems_with`]: proptest strategies generating **valid** deformable
//!   convolution problems ([`Problem`]): shapes, stride, symmetric and asymmetric padding,
//!   dilation, groups, offset groups, DCN v1 and v2, with and without bias. Offsets mix free
//!   values, exact integers, half-integers, samples placed exactly at `-1`, `0`, `H-1`, `H` (and
//!   just inside or beyond them) and far outside the image; masks include zeros, ones, negatives
//!   and values above 1. Shrinking acts on the shape only (the values come from a seed that does
//!   not shrink), so a failure shrinks to a small problem quickly.
//! - [`Problem::report`] and [`assert_close`]: compare a kernel's results with
//!   [`reference`](mod@crate::reference) under the per-element DESIGN §5 bound of
//!   [`compare`](crate::compare), the same rule as `deformconv compare`.
//!
//! # A downstream crate testing its own kernel
//!
//! ```
//! use deformconv::testing::{assert_close, problems, Output, Problem};
//! use proptest::prelude::*;
//!
//! /// The kernel under test (here this crate's fast path stands in for yours).
//! fn my_forward(p: &Problem<f32>) -> ndarray::Array4<f32> {
//!     let mask = p.mask.as_ref().map(|m| m.view());
//!     let bias = p.bias.as_ref().map(|b| b.view());
//!     let (x, off, w) = (p.input.view(), p.offset.view(), p.weight.view());
//!     deformconv::deform_conv2d(x, off, mask, w, bias, &p.params).unwrap()
//! }
//!
//! proptest! {
//!     #![proptest_config(ProptestConfig::with_cases(16))]
//!     // In your crate's `tests/`, put `#[test]` on the next line.
//!     fn forward_matches_the_oracle(p in problems::<f32>()) {
//!         assert_close(&p, Output::Out, my_forward(&p).view());
//!     }
//! }
//! # fn main() { forward_matches_the_oracle(); }
//! ```

use std::fmt::Write as _;

use ndarray::{Array1, Array4, ArrayD, ArrayView, ArrayView4, ArrayViewD, Dimension};
use proptest::prelude::*;

use crate::compare::{compare_tensor, error_scales, Operands};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::params::{ConvParams, Padding};
use crate::reference;

pub use crate::compare::{Output, Report, TensorReport, Tolerance};

/// Whether an optional operand (mask, bias) is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Never present.
    Never,
    /// Always present.
    Always,
    /// Either, shrinking towards absent.
    Either,
}

impl Presence {
    fn strategy(self) -> BoxedStrategy<bool> {
        match self {
            Presence::Never => Just(false).boxed(),
            Presence::Always => Just(true).boxed(),
            Presence::Either => any::<bool>().boxed(),
        }
    }
}

/// Bounds on the generated problems. Every range starts at its smallest valid value, which is
/// where shrinking goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Smallest batch (0 is valid and gives empty results).
    pub min_batch: usize,
    /// Largest batch.
    pub max_batch: usize,
    /// Largest number of convolution groups.
    pub max_groups: usize,
    /// Largest number of offset groups.
    pub max_offset_groups: usize,
    /// `C_in = lcm(groups, offset_groups) * m` with `m` up to this.
    pub max_input_multiple: usize,
    /// `C_out = groups * m` with `m` up to this.
    pub max_output_per_group: usize,
    /// Largest kernel extent (rows and columns independently).
    pub max_kernel: usize,
    /// Largest stride on each axis.
    pub max_stride: usize,
    /// Largest dilation on each axis.
    pub max_dilation: usize,
    /// Largest padding on each side.
    pub max_padding: usize,
    /// Image rows (columns) beyond the fewest that give one output row (column).
    pub max_extra_size: usize,
    /// Whether a mask (DCN v2) is generated.
    pub mask: Presence,
    /// Whether a bias is generated.
    pub bias: Presence,
}

impl Default for Limits {
    /// Batch 1–2, up to 3 groups and 3 offset groups, kernels up to 3x3, stride, dilation and
    /// padding up to 2, images up to 6 pixels beyond the minimum, mask and bias either way.
    fn default() -> Self {
        Limits {
            min_batch: 1,
            max_batch: 2,
            max_groups: 3,
            max_offset_groups: 3,
            max_input_multiple: 2,
            max_output_per_group: 2,
            max_kernel: 3,
            max_stride: 2,
            max_dilation: 2,
            max_padding: 2,
            max_extra_size: 6,
            mask: Presence::Either,
            bias: Presence::Either,
        }
    }
}

/// The shape of a problem: tensor extents, parameters, which optional operands exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemShape {
    /// `[N, C_in, H, W]`.
    pub input: [usize; 4],
    /// `[C_out, C_in / groups, kh, kw]`.
    pub weight: [usize; 4],
    /// Stride, padding, dilation, groups, offset groups.
    pub params: ConvParams,
    /// Whether there is a mask (DCN v2).
    pub mask: bool,
    /// Whether there is a bias.
    pub bias: bool,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Rows (or columns) needed for one output: `max(1, dil * (k - 1) + 1 - pads)`.
fn min_extent(k: usize, dil: usize, pad_sum: usize) -> usize {
    dil.saturating_mul(k - 1)
        .saturating_add(1)
        .saturating_sub(pad_sum)
        .max(1)
}

/// Strategy for valid [`ProblemShape`]s within `limits`; shrinks every extent and parameter
/// towards its minimum, padding towards symmetric, mask and bias towards absent.
pub fn problem_shapes(limits: Limits) -> BoxedStrategy<ProblemShape> {
    let l = limits;
    let at_least_1 = |m: usize| 1..=m.max(1);
    let channels = (
        l.min_batch..=l.max_batch.max(l.min_batch),
        at_least_1(l.max_groups),
        at_least_1(l.max_offset_groups),
        at_least_1(l.max_input_multiple),
        at_least_1(l.max_output_per_group),
    );
    let kernel = (
        at_least_1(l.max_kernel),
        at_least_1(l.max_kernel),
        at_least_1(l.max_stride),
        at_least_1(l.max_stride),
        at_least_1(l.max_dilation),
        at_least_1(l.max_dilation),
    );
    let padding = (
        any::<bool>(),
        [
            0..=l.max_padding,
            0..=l.max_padding,
            0..=l.max_padding,
            0..=l.max_padding,
        ],
    );
    let rest = (
        0..=l.max_extra_size,
        0..=l.max_extra_size,
        l.mask.strategy(),
        l.bias.strategy(),
    );
    (channels, kernel, padding, rest)
        .prop_map(
            |(
                (n, groups, og, c_mult, o_mult),
                (kh, kw, sh, sw, dh, dw),
                (asymmetric, [top, bottom, left, right]),
                (extra_h, extra_w, mask, bias),
            )| {
                let padding = if asymmetric {
                    Padding {
                        top,
                        bottom,
                        left,
                        right,
                    }
                } else {
                    Padding::symmetric(top, left)
                };
                let c_in = (groups / gcd(groups, og))
                    .saturating_mul(og)
                    .saturating_mul(c_mult);
                let h = min_extent(kh, dh, padding.top.saturating_add(padding.bottom)) + extra_h;
                let w = min_extent(kw, dw, padding.left.saturating_add(padding.right)) + extra_w;
                let params = ConvParams::default()
                    .stride(sh, sw)
                    .padding_sides(padding)
                    .dilation(dh, dw)
                    .groups(groups)
                    .offset_groups(og);
                ProblemShape {
                    input: [n, c_in, h, w],
                    weight: [groups * o_mult, c_in / groups, kh, kw],
                    params,
                    mask,
                    bias,
                }
            },
        )
        .boxed()
}

/// Strategy for valid problems within the default [`Limits`].
pub fn problems<T: Float>() -> BoxedStrategy<Problem<T>> {
    problems_with(Limits::default())
}

/// Strategy for valid problems within `limits`: a [`ProblemShape`] (which shrinks) filled by
/// [`Problem::random`] from a seed (which does not).
pub fn problems_with<T: Float>(limits: Limits) -> BoxedStrategy<Problem<T>> {
    (problem_shapes(limits), any::<u64>().no_shrink())
        .prop_filter_map("problem shape must be valid", |(shape, seed)| {
            Problem::random(&shape, seed).ok()
        })
        .boxed()
}

/// SplitMix64: a tiny deterministic generator, so that a (shape, seed) pair names a problem
/// forever, whatever proptest's own generator does.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`, 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in `lo..=hi`.
    fn int(&mut self, lo: i64, hi: i64) -> f64 {
        (lo + (self.next_u64() % (hi - lo + 1) as u64) as i64) as f64
    }
    fn pick<const N: usize>(&mut self, items: [f64; N]) -> f64 {
        items[(self.next_u64() % N as u64) as usize]
    }
}

/// A pixel value: mostly uniform in `[-2, 2)`, sometimes a small exact integer.
fn pixel_value(rng: &mut SplitMix) -> f64 {
    if rng.unit() < 0.3 {
        rng.int(-2, 2)
    } else {
        rng.uniform(-2.0, 2.0)
    }
}

/// A mask value: uniform in `[-0.5, 1.5)`, or exactly 0 or 1, or negative, or above 1.
fn mask_value(rng: &mut SplitMix) -> f64 {
    match rng.unit() {
        u if u < 0.5 => rng.uniform(-0.5, 1.5),
        u if u < 0.65 => 0.0,
        u if u < 0.8 => 1.0,
        u if u < 0.9 => rng.uniform(-1.5, -0.5),
        _ => rng.uniform(1.0, 2.0),
    }
}

/// One offset component for a sample whose base position is `base` on an axis of `size`
/// pixels: free, integer, half-integer, placed exactly on a border position, or far away.
fn offset_value(rng: &mut SplitMix, base: f64, size: f64) -> f64 {
    match rng.unit() {
        u if u < 0.35 => rng.uniform(-2.5, 2.5),
        u if u < 0.5 => rng.int(-2, 2),
        u if u < 0.65 => rng.int(-3, 2) + 0.5,
        u if u < 0.9 => {
            // Exactly representable in f32 for the small sizes generated here.
            let eps = 1.0 / 1024.0;
            let target = rng.pick([
                -1.5,
                -1.0,
                -1.0 + eps,
                -0.5,
                0.0,
                size - 1.0,
                size - 0.5,
                size - eps,
                size,
                size + 0.5,
            ]);
            target - base
        }
        _ => {
            let far = size + 3.0 + rng.int(0, 4);
            if rng.unit() < 0.5 {
                far
            } else {
                -far
            }
        }
    }
}

fn filled<T: Float>(shape: [usize; 4], mut value: impl FnMut([usize; 4]) -> f64) -> Array4<T> {
    Array4::from_shape_fn(shape, |(a, b, c, d)| T::from_f64(value([a, b, c, d])))
}

/// A complete problem: every operand of the forward and of every gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem<T> {
    /// `[N, C_in, H, W]`.
    pub input: Array4<T>,
    /// `[N, 2 * G_off * kh * kw, H_out, W_out]`.
    pub offset: Array4<T>,
    /// `[N, G_off * kh * kw, H_out, W_out]`, or `None` (DCN v1).
    pub mask: Option<Array4<T>>,
    /// `[C_out, C_in / groups, kh, kw]`.
    pub weight: Array4<T>,
    /// `[C_out]`, or `None`.
    pub bias: Option<Array1<T>>,
    /// `[N, C_out, H_out, W_out]`: the gradient flowing into the output.
    pub grad_out: Array4<T>,
    /// The convolution parameters.
    pub params: ConvParams,
}

impl<T: Float> Problem<T> {
    /// The problem of `shape` with values drawn deterministically from `seed` (the same pair
    /// always gives the same problem: keep shrunk failures as named regression tests).
    ///
    /// Errors if the shape breaks a validation rule.
    pub fn random(shape: &ProblemShape, seed: u64) -> Result<Self> {
        let g = Geometry::new(shape.input, shape.weight, &shape.params)?;
        let mut rng = SplitMix(seed);
        let input = filled(g.input_shape(), |_| pixel_value(&mut rng));
        let weight = filled(g.weight_shape(), |_| {
            if rng.unit() < 0.2 {
                rng.int(-2, 2) / 2.0
            } else {
                rng.uniform(-1.0, 1.0)
            }
        });
        let offset = filled(g.offset_shape(), |[_, ch, y, x]| {
            let k = (ch / 2) % g.taps();
            let (i, j) = (k / g.kw, k % g.kw);
            if ch % 2 == 0 {
                let base = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64;
                offset_value(&mut rng, base, g.h as f64)
            } else {
                let base = (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64;
                offset_value(&mut rng, base, g.w as f64)
            }
        });
        let mask = shape
            .mask
            .then(|| filled(g.mask_shape(), |_| mask_value(&mut rng)));
        let bias = shape
            .bias
            .then(|| Array1::from_shape_fn(g.c_out, |_| T::from_f64(rng.uniform(-1.0, 1.0))));
        let grad_out = filled(g.out_shape(), |_| rng.uniform(-1.0, 1.0));
        Ok(Problem {
            input,
            offset,
            mask,
            weight,
            bias,
            grad_out,
            params: shape.params,
        })
    }

    /// Validates every operand and returns the problem's geometry.
    pub fn geometry(&self) -> Result<Geometry> {
        let g = Geometry::new(dims(&self.input), dims(&self.weight), &self.params)?;
        g.check_offset(self.offset.shape())?;
        if let Some(m) = &self.mask {
            g.check_mask(m.shape())?;
        }
        if let Some(b) = &self.bias {
            g.check_bias(b.len())?;
        }
        g.check_out("grad_out", self.grad_out.shape())?;
        Ok(g)
    }

    /// The results this problem defines: `out`, `grad_input`, `grad_offset`, `grad_mask`
    /// (with a mask), `grad_weight`, `grad_bias` (with a bias).
    pub fn outputs(&self) -> Vec<Output> {
        Output::ALL
            .into_iter()
            .filter(|o| match o {
                Output::GradMask => self.mask.is_some(),
                Output::GradBias => self.bias.is_some(),
                _ => true,
            })
            .collect()
    }

    fn mask_view(&self) -> Option<ArrayView4<'_, T>> {
        self.mask.as_ref().map(|m| m.view())
    }

    /// The exact (f64 [`reference`](mod@crate::reference)) value of `output`.
    ///
    /// Errors if the problem is invalid or does not define `output` (`grad_mask` without a
    /// mask, `grad_bias` without a bias).
    pub fn exact(&self, output: Output) -> Result<ArrayD<f64>> {
        let p = &self.params;
        let (x, off, w, go) = (
            self.input.view(),
            self.offset.view(),
            self.weight.view(),
            self.grad_out.view(),
        );
        let m = self.mask_view();
        let result = match output {
            Output::Out => {
                let b = self.bias.as_ref().map(|b| b.view());
                reference::deform_conv2d(x, off, m, w, b, p)?.into_dyn()
            }
            Output::GradInput => {
                reference::grad_input(go, off, m, w, dims(&self.input), p)?.into_dyn()
            }
            Output::GradOffset => reference::grad_offset(go, x, off, m, w, p)?.into_dyn(),
            Output::GradMask => {
                if self.mask.is_none() {
                    return Err(not_defined(output, "a mask"));
                }
                reference::grad_mask(go, x, off, w, p)?.into_dyn()
            }
            Output::GradWeight => {
                reference::grad_weight(go, x, off, m, dims(&self.weight), p)?.into_dyn()
            }
            Output::GradBias => {
                if self.bias.is_none() {
                    return Err(not_defined(output, "a bias"));
                }
                self.geometry()?;
                reference::grad_bias(go)?.into_dyn()
            }
        };
        Ok(result)
    }

    /// Compares `actual` results with the exact ones under the DESIGN §5 bound for `T`
    /// ([`Tolerance::bound`]).
    pub fn report(&self, actual: &[(Output, ArrayViewD<'_, T>)]) -> Result<Report> {
        self.report_with(actual, &Tolerance::bound::<T>())
    }

    /// Compares `actual` results with the exact ones under `tol`.
    pub fn report_with(
        &self,
        actual: &[(Output, ArrayViewD<'_, T>)],
        tol: &Tolerance,
    ) -> Result<Report> {
        let to64 = |a: &Array4<T>| a.mapv(T::to_f64);
        let (input, offset, weight, grad_out) = (
            to64(&self.input),
            to64(&self.offset),
            to64(&self.weight),
            to64(&self.grad_out),
        );
        let mask = self.mask.as_ref().map(to64);
        let bias = self.bias.as_ref().map(|b| b.mapv(T::to_f64));
        let scales = error_scales(&Operands {
            input: input.view(),
            offset: offset.view(),
            mask: mask.as_ref().map(|m| m.view()),
            weight: weight.view(),
            bias: bias.as_ref().map(|b| b.view()),
            grad_out: Some(grad_out.view()),
            params: self.params,
        })?;
        let mut report = Report::default();
        for (output, got) in actual {
            let exact = self.exact(*output)?;
            let got = got.mapv(T::to_f64);
            let scale = scales.get(*output);
            report.tensors.push(compare_tensor(
                *output,
                exact.view(),
                got.view(),
                scale,
                tol,
            )?);
        }
        Ok(report)
    }
}

fn not_defined(output: Output, needs: &str) -> Error {
    Error::Param {
        name: output.name(),
        rule: format!("is only defined for a problem with {needs}"),
    }
}

fn dims<T>(a: &Array4<T>) -> [usize; 4] {
    let s = a.shape();
    [s[0], s[1], s[2], s[3]]
}

/// Panics (for use inside a test) unless `actual` is within the DESIGN §5 bound of the exact
/// `output` of `problem`; the message is the full comparison report and the problem's shape.
pub fn assert_close<T: Float, D: Dimension>(
    problem: &Problem<T>,
    output: Output,
    actual: ArrayView<'_, T, D>,
) {
    let result = problem.report(&[(output, actual.into_dyn())]);
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!("{}", failure_message(problem, &report.to_string())),
        Err(e) => panic!(
            "{}",
            failure_message(problem, &format!("cannot compare: {e}"))
        ),
    }
}

fn failure_message<T: Float>(problem: &Problem<T>, body: &str) -> String {
    let mut msg = String::new();
    let _ = writeln!(
        msg,
        "result differs from the oracle for input {:?}, weight {:?}, offset {:?}, mask {}, bias {}, {:?}",
        problem.input.shape(),
        problem.weight.shape(),
        problem.offset.shape(),
        problem.mask.is_some(),
        problem.bias.is_some(),
        problem.params
    );
    msg.push_str(body);
    msg
}
