//! Property-testing other kernels against the oracle (cargo feature `testing`).
//!
//! - [`problems`] / [`problems_with`]: proptest strategies generating **valid** deformable
//!   convolution problems ([`Problem`]): shapes, stride, symmetric and asymmetric padding,
//!   dilation, groups, offset groups, DCN v1 and v2, with and without bias. Offsets mix free
//!   values, exact integers, half-integers, samples placed exactly at `-1`, `0`, `H-1`, `H` (and
//!   just inside or beyond them) and far outside the image; masks include zeros, ones, negatives
//!   and values above 1. Shrinking acts on the shape only (the values come from a seed that does
//!   not shrink), so a failure shrinks to a small problem quickly. [`Limits`] narrows them
//!   (symmetric padding only, mask and bias presence, and [`Placement`]: where samples land).
//! - [`Problem::report`], [`assert_close`], and for a proptest body [`Problem::check`] /
//!   [`Problem::check_grads`] (owned arrays or a [`Grads`], returning `TestCaseError`):
//!   compare a kernel's results with [`reference`](mod@crate::reference) as
//!   [`compare::Oracle`](crate::compare::Oracle) judges results computed in `T`: the
//!   per-element DESIGN §5 bound with positions within rounding, and the statistical check.
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
use proptest::test_runner::TestCaseError;

use crate::backward::Grads;
use crate::compare::{compare_tensor_within, error_scales, Expected, Operands, Oracle};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::params::{ConvParams, Padding};
use crate::reference;

pub use crate::compare::{Options, Output, Precision, Report, TensorReport, Tolerance};

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
///
/// Build them with struct update syntax from another crate
/// (`Limits { mask: Presence::Never, ..Limits::default() }`) or with the builder methods
/// (`Limits::default().mask(Presence::Never).symmetric_padding()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Only symmetric padding (`top == bottom`, `left == right`), for kernels that cannot
    /// express asymmetric padding.
    pub symmetric_padding_only: bool,
    /// Where the samples land.
    pub placement: Placement,
}

/// Where the generated samples land (the offsets' distribution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// A mix of every kind below (free values, integers, half-integers, borders, far outside).
    #[default]
    Mixed,
    /// Strictly inside the image, away from every border and integer (`0 < p < H - 1`,
    /// fractional part in `[0.05, 0.95]`), where every convention agrees.
    Interior,
    /// Exactly on `-1`, `0`, `H - 1` or `H` (or `1/1024` inside or beyond them).
    Borders,
    /// Exact integers (offsets in `-2..=2`).
    Integers,
    /// Far outside the image (at least 3 pixels beyond an edge).
    FarOutside,
}

impl Limits {
    /// The same limits with `mask` presence.
    pub fn mask(self, mask: Presence) -> Self {
        Limits { mask, ..self }
    }

    /// The same limits with `bias` presence.
    pub fn bias(self, bias: Presence) -> Self {
        Limits { bias, ..self }
    }

    /// The same limits with symmetric padding only.
    pub fn symmetric_padding(self) -> Self {
        Limits {
            symmetric_padding_only: true,
            ..self
        }
    }

    /// The same limits with samples placed by `placement`.
    pub fn placement(self, placement: Placement) -> Self {
        Limits { placement, ..self }
    }

    /// The same limits with batches `min..=max`.
    pub fn batch(self, min: usize, max: usize) -> Self {
        Limits {
            min_batch: min,
            max_batch: max,
            ..self
        }
    }

    /// The same limits with at most `groups` groups and `offset_groups` offset groups.
    pub fn groups(self, groups: usize, offset_groups: usize) -> Self {
        Limits {
            max_groups: groups,
            max_offset_groups: offset_groups,
            ..self
        }
    }
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
            symmetric_padding_only: false,
            placement: Placement::Mixed,
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
    let asymmetric = if l.symmetric_padding_only {
        Just(false).boxed()
    } else {
        any::<bool>().boxed()
    };
    let padding = (
        asymmetric,
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
        .prop_filter_map("problem shape must be valid", move |(shape, seed)| {
            Problem::random_placed(&shape, seed, limits.placement).ok()
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
fn offset_value(rng: &mut SplitMix, base: f64, size: f64, placement: Placement) -> f64 {
    let border = |rng: &mut SplitMix| {
        // Exactly representable in f32 for the small sizes generated here.
        let eps = 1.0 / 1024.0;
        rng.pick([
            -1.0 - eps,
            -1.0,
            -1.0 + eps,
            -eps,
            0.0,
            size - 1.0,
            size - 1.0 + eps,
            size - eps,
            size,
            size + eps,
        ]) - base
    };
    let far = |rng: &mut SplitMix| {
        let far = size + 3.0 + rng.int(0, 4);
        if rng.unit() < 0.5 {
            far - base
        } else {
            -3.0 - rng.int(0, 4) - base
        }
    };
    match placement {
        Placement::Mixed => {}
        Placement::Interior => {
            if size < 2.0 {
                // No interior away from the borders: half a pixel in.
                return 0.5 - base;
            }
            let cell = rng.int(0, size as i64 - 2);
            // A multiple of 1/1024, exact in f32.
            let frac = (rng.uniform(0.05, 0.95) * 1024.0).round() / 1024.0;
            return cell + frac - base;
        }
        Placement::Borders => return border(rng),
        Placement::Integers => return rng.int(-2, 2),
        Placement::FarOutside => return far(rng),
    }
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
        Self::random_placed(shape, seed, Placement::Mixed)
    }

    /// [`Problem::random`] with the samples placed by `placement`.
    pub fn random_placed(shape: &ProblemShape, seed: u64, placement: Placement) -> Result<Self> {
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
                offset_value(&mut rng, base, g.h as f64, placement)
            } else {
                let base = (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64;
                offset_value(&mut rng, base, g.w as f64, placement)
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

    /// The operands in `f64`.
    fn operands64(&self) -> Operands64 {
        let to64 = |a: &Array4<T>| a.mapv(T::to_f64);
        Operands64 {
            input: to64(&self.input),
            offset: to64(&self.offset),
            mask: self.mask.as_ref().map(to64),
            weight: to64(&self.weight),
            bias: self.bias.as_ref().map(|b| b.mapv(T::to_f64)),
            grad_out: to64(&self.grad_out),
        }
    }

    /// Compares `actual` results with the exact ones as [`Oracle`] judges results computed in
    /// `T` ([`precision_of`]): the DESIGN §5 bound with positions within rounding, and the
    /// statistical check.
    pub fn report(&self, actual: &[(Output, ArrayViewD<'_, T>)]) -> Result<Report> {
        self.report_with_options(actual, &Options::precision(precision_of::<T>()))
    }

    /// Compares `actual` results with the exact ones as an [`Oracle`] with `options` judges.
    pub fn report_with_options(
        &self,
        actual: &[(Output, ArrayViewD<'_, T>)],
        options: &Options,
    ) -> Result<Report> {
        let o = self.operands64();
        let oracle = Oracle::new(&o.view(self.params), options)?;
        let mut report = Report {
            ambiguous_samples: oracle.ambiguous_samples(),
            ..Report::default()
        };
        for (output, got) in actual {
            let exact = self.exact(*output)?;
            let got = got.mapv(T::to_f64);
            report
                .tensors
                .push(oracle.compare(*output, exact.view(), got.view())?);
        }
        Ok(report)
    }

    /// Compares `actual` results with the exact ones under `tol`, at the exact positions.
    pub fn report_with(
        &self,
        actual: &[(Output, ArrayViewD<'_, T>)],
        tol: &Tolerance,
    ) -> Result<Report> {
        let o = self.operands64();
        let scales = error_scales(&o.view(self.params))?;
        let mut report = Report::default();
        for (output, got) in actual {
            let exact = self.exact(*output)?;
            let got = got.mapv(T::to_f64);
            let expected = Expected {
                values: exact.view(),
                scale: scales.get(*output),
                rms_scale: scales.rms(*output),
            };
            report.tensors.push(compare_tensor_within(
                *output,
                expected,
                None,
                got.view(),
                tol,
            )?);
        }
        Ok(report)
    }

    /// For a proptest body: `Ok(())` when every given result passes ([`Problem::report`]),
    /// else a [`TestCaseError::Fail`] carrying the report and the problem's shape (so
    /// `p.check(results)?` is all a property needs). Takes owned arrays of any dimension.
    ///
    /// ```
    /// use deformconv::testing::{problems, Output, Problem};
    /// use proptest::prelude::*;
    ///
    /// proptest! {
    ///     #![proptest_config(ProptestConfig::with_cases(4))]
    ///     fn forward_and_input_gradient(p in problems::<f32>()) {
    ///         let m = p.mask.as_ref().map(|m| m.view());
    ///         let b = p.bias.as_ref().map(|b| b.view());
    ///         let out = deformconv::deform_conv2d(p.input.view(), p.offset.view(), m,
    ///                                             p.weight.view(), b, &p.params).unwrap();
    ///         let gi = deformconv::deform_conv2d_grad_input(p.grad_out.view(), p.offset.view(),
    ///             m, p.weight.view(), [p.input.shape()[0], p.input.shape()[1],
    ///             p.input.shape()[2], p.input.shape()[3]], &p.params).unwrap();
    ///         p.check([(Output::Out, out), (Output::GradInput, gi)])?;
    ///     }
    /// }
    /// # fn main() { forward_and_input_gradient(); }
    /// ```
    pub fn check<D: Dimension>(
        &self,
        results: impl IntoIterator<Item = (Output, ndarray::Array<T, D>)>,
    ) -> std::result::Result<(), TestCaseError> {
        let owned: Vec<(Output, ArrayD<T>)> = results
            .into_iter()
            .map(|(o, a)| (o, a.into_dyn()))
            .collect();
        let views: Vec<(Output, ArrayViewD<'_, T>)> =
            owned.iter().map(|(o, a)| (*o, a.view())).collect();
        match self.report(&views) {
            Ok(report) if report.passed() => Ok(()),
            Ok(report) => Err(TestCaseError::fail(failure_message(
                self,
                &report.to_string(),
            ))),
            Err(e) => Err(TestCaseError::fail(failure_message(
                self,
                &format!("cannot compare: {e}"),
            ))),
        }
    }

    /// [`Problem::check`] of the gradients a backward returned (those present).
    pub fn check_grads(&self, grads: &Grads<T>) -> std::result::Result<(), TestCaseError> {
        let mut results: Vec<(Output, ArrayD<T>)> = Vec::new();
        let four = [
            (Output::GradInput, &grads.input),
            (Output::GradOffset, &grads.offset),
            (Output::GradMask, &grads.mask),
            (Output::GradWeight, &grads.weight),
        ];
        for (o, g) in four {
            if let Some(g) = g {
                results.push((o, g.clone().into_dyn()));
            }
        }
        if let Some(b) = &grads.bias {
            results.push((Output::GradBias, b.clone().into_dyn()));
        }
        self.check(results)
    }
}

/// The operands of a [`Problem`] in `f64`.
struct Operands64 {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    weight: Array4<f64>,
    bias: Option<Array1<f64>>,
    grad_out: Array4<f64>,
}

impl Operands64 {
    fn view(&self, params: ConvParams) -> Operands<'_> {
        Operands {
            input: self.input.view(),
            offset: self.offset.view(),
            mask: self.mask.as_ref().map(|m| m.view()),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            grad_out: Some(self.grad_out.view()),
            params,
        }
    }
}

/// The precision profile of results computed in `T`: [`Precision::F32`] or
/// [`Precision::F64`].
pub fn precision_of<T: Float>() -> Precision {
    Precision::from_name(T::NAME).unwrap_or(Precision::F64)
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
