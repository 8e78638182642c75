//! The one problem generator of the tests: a [`Case`] (shapes, parameters, whether mask and
//! bias are present, a seed), built by hand, from free "knobs", at random from an [`Rng`] or by
//! the proptest strategy [`cases`]; and the operands of a case, drawn from the seed
//! ([`Case::tensors`]) or for the oracle's own tests with a chosen offset distribution
//! ([`Problem`]).

use deformconv::{reference, ConvParams, Geometry, Padding};
use ndarray::{Array1, Array4};
use proptest::prelude::*;

use super::Rng;

/// One problem's shapes and parameters, valid by construction (or by the hand that wrote it),
/// and whether mask and bias are present.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub n: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub params: ConvParams,
    pub mask: bool,
    pub bias: bool,
    pub seed: u64,
}

/// Tensors of a [`Case`], in f64 (values exactly representable in f32).
pub struct Tensors {
    pub input: Array4<f64>,
    pub offset: Array4<f64>,
    pub mask: Option<Array4<f64>>,
    pub weight: Array4<f64>,
    pub bias: Option<Array1<f64>>,
}

impl Case {
    /// Builds a valid case from free "knobs": `og_pick` chooses among the divisors of `C_in`,
    /// `extra_h`/`extra_w` are the input rows/columns beyond the smallest that fits the kernel.
    /// No mask, no bias, seed 0.
    #[allow(clippy::too_many_arguments)]
    pub fn from_knobs(
        n: usize,
        groups: usize,
        cin_per_group: usize,
        cout_per_group: usize,
        og_pick: usize,
        (kh, kw): (usize, usize),
        stride: (usize, usize),
        dilation: (usize, usize),
        padding: Padding,
        (extra_h, extra_w): (usize, usize),
    ) -> Self {
        let c_in = groups * cin_per_group;
        let divisors: Vec<usize> = (1..=c_in).filter(|d| c_in.is_multiple_of(*d)).collect();
        let offset_groups = divisors[og_pick % divisors.len()];
        let fit =
            |k: usize, dil: usize, pads: usize| (dil * (k - 1) + 1).saturating_sub(pads).max(1);
        Case {
            n,
            c_in,
            c_out: groups * cout_per_group,
            h: fit(kh, dilation.0, padding.top + padding.bottom) + extra_h,
            w: fit(kw, dilation.1, padding.left + padding.right) + extra_w,
            kh,
            kw,
            params: ConvParams::default()
                .stride(stride.0, stride.1)
                .padding_sides(padding)
                .dilation(dilation.0, dilation.1)
                .groups(groups)
                .offset_groups(offset_groups),
            mask: false,
            bias: false,
            seed: 0,
        }
    }

    /// A random small case (every parameter of the contract varies).
    pub fn random(rng: &mut Rng) -> Self {
        let padding = Padding {
            top: rng.size(0, 2),
            bottom: rng.size(0, 2),
            left: rng.size(0, 2),
            right: rng.size(0, 2),
        };
        Case::from_knobs(
            rng.size(1, 2),
            rng.size(1, 3),
            rng.size(1, 2),
            rng.size(1, 2),
            rng.size(0, 3),
            (rng.size(1, 3), rng.size(1, 3)),
            (rng.size(1, 2), rng.size(1, 2)),
            (rng.size(1, 2), rng.size(1, 2)),
            padding,
            (rng.size(0, 3), rng.size(0, 3)),
        )
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.input_shape(), self.weight_shape(), &self.params)
            .expect("generated cases are valid")
    }

    pub fn groups(&self) -> usize {
        self.params.groups
    }
    pub fn offset_groups(&self) -> usize {
        self.params.offset_groups
    }
    pub fn cin_per_group(&self) -> usize {
        self.c_in / self.params.groups
    }
    pub fn cout_per_group(&self) -> usize {
        self.c_out / self.params.groups
    }
    pub fn stride(&self) -> (usize, usize) {
        self.params.stride
    }
    pub fn dilation(&self) -> (usize, usize) {
        self.params.dilation
    }
    pub fn padding(&self) -> Padding {
        self.params.padding
    }
    pub fn taps(&self) -> usize {
        self.kh * self.kw
    }
    /// `(H_out, W_out)` by the DESIGN.md §1 formula, computed here independently.
    pub fn out_hw(&self) -> (usize, usize) {
        let (p, (sh, sw), (dh, dw)) = (self.padding(), self.stride(), self.dilation());
        let ho = (self.h + p.top + p.bottom - (dh * (self.kh - 1) + 1)) / sh + 1;
        let wo = (self.w + p.left + p.right - (dw * (self.kw - 1) + 1)) / sw + 1;
        (ho, wo)
    }
    pub fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in, self.h, self.w]
    }
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.c_out, self.cin_per_group(), self.kh, self.kw]
    }
    pub fn out_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, self.c_out, ho, wo]
    }
    pub fn offset_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, 2 * self.offset_groups() * self.taps(), ho, wo]
    }
    pub fn mask_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, self.offset_groups() * self.taps(), ho, wo]
    }
    /// The integer grid position `(row, col)` of tap `(i, j)` at output pixel `(y, x)`,
    /// before the offset.
    pub fn base(&self, i: usize, j: usize, y: usize, x: usize) -> (f64, f64) {
        let (p, (sh, sw), (dh, dw)) = (self.padding(), self.stride(), self.dilation());
        let r = (y * sh + i * dh) as f64 - p.top as f64;
        let c = (x * sw + j * dw) as f64 - p.left as f64;
        (r, c)
    }

    /// The operands drawn from the seed: values uniform in `[-1, 1)` (masks in `[-1.5, 1.5)`),
    /// offsets mixing fractions, exact integers, `-1` and far-outside values ([`Rng::offset`]),
    /// all exactly representable in f32.
    pub fn tensors(&self) -> Tensors {
        let g = self.geometry();
        let mut r = Rng::new(self.seed);
        let input = Array4::from_shape_fn(g.input_shape(), |_| r.value());
        let offset = Array4::from_shape_fn(g.offset_shape(), |_| r.offset());
        let mask = self
            .mask
            .then(|| Array4::from_shape_fn(g.mask_shape(), |_| r.value() * 1.5));
        let weight = Array4::from_shape_fn(g.weight_shape(), |_| r.value());
        let bias = self
            .bias
            .then(|| Array1::from_shape_fn(g.c_out, |_| r.value()));
        Tensors {
            input,
            offset,
            mask,
            weight,
            bias,
        }
    }
}

/// Random valid cases: groups, offset groups, non-square kernels, strides, dilations and
/// asymmetric padding; the image is always at least as large as the dilated kernel.
pub fn cases() -> impl Strategy<Value = Case> {
    (
        (1usize..=3, 1usize..=3, 1usize..=3, 1usize..=3),
        (
            1usize..=3,
            1usize..=4,
            1usize..=3,
            1usize..=3,
            1usize..=2,
            1usize..=2,
        ),
        (0usize..=2, 0usize..=2, 0usize..=2, 0usize..=2),
        (
            0usize..=6,
            0usize..=6,
            0usize..=3,
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (n, groups, cin_g, cout_g),
                (kh, kw, sh, sw, dh, dw),
                (pt, pb, pl, pr),
                (eh, ew, og_pick, mask, bias, seed),
            )| {
                let c_in = groups * cin_g;
                let divisors: Vec<usize> = (1..=c_in).filter(|d| c_in % d == 0).collect();
                let offset_groups = divisors[og_pick % divisors.len()];
                let params = ConvParams::default()
                    .stride(sh, sw)
                    .padding_sides(Padding {
                        top: pt,
                        bottom: pb,
                        left: pl,
                        right: pr,
                    })
                    .dilation(dh, dw)
                    .groups(groups)
                    .offset_groups(offset_groups);
                Case {
                    n,
                    c_in,
                    c_out: groups * cout_g,
                    h: dh * (kh - 1) + 1 + eh,
                    w: dw * (kw - 1) + 1 + ew,
                    kh,
                    kw,
                    params,
                    mask,
                    bias,
                    seed,
                }
            },
        )
}

/// Problems whose offset groups span 16 to 40 channels, with conv groups of up to 128
/// outputs or of 129 to 136 (so the forward runs both column-tile layouts of its plan), and
/// conv and offset groups that cut each other (segments of unequal width).
pub fn wide_cases() -> impl Strategy<Value = Case> {
    (
        (
            1usize..=2,
            1usize..=2,
            16usize..=40,
            prop_oneof![1usize..=20, 126usize..=136],
        ),
        (1usize..=3, 1usize..=3, 1usize..=2, 1usize..=2),
        (0usize..=1, 0usize..=4, 0usize..=4),
        (any::<bool>(), any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(
                (n, groups, cin_g, cout_g),
                (kh, kw, stride, dil),
                (pad, eh, ew),
                (mask, bias, seed),
            )| {
                let c_in = groups * cin_g;
                // The widest divisor of c_in of at most 40 channels and at least 16.
                let per_og = (16..=40).rev().find(|d| c_in % d == 0).unwrap_or(c_in);
                let params = ConvParams::default()
                    .stride(stride, stride)
                    .padding(pad, pad)
                    .dilation(dil, dil)
                    .groups(groups)
                    .offset_groups(c_in / per_og);
                Case {
                    n,
                    c_in,
                    c_out: groups * cout_g,
                    h: dil * (kh - 1) + 1 + eh,
                    w: dil * (kw - 1) + 1 + ew,
                    kh,
                    kw,
                    params,
                    mask,
                    bias,
                    seed,
                }
            },
        )
}

/// A position along an axis of `size` pixels: a border special (on and around `-1`, `0`,
/// `size - 1` and `size`), a whole number in `-1 ..= size`, or any fraction in
/// `(-1.5, size + 0.5)`.
pub fn border_position(r: &mut Rng, size: usize) -> f64 {
    let s = size as f64;
    let special = [
        -1.0,
        -1.0 + 1e-3,
        -0.5,
        0.0,
        s - 1.0,
        s - 1.0 + 1e-3,
        s - 1e-3,
        s,
        s + 0.5,
    ];
    let u = r.unit();
    if u < 0.55 {
        special[(r.unit() * special.len() as f64) as usize % special.len()]
    } else if u < 0.85 {
        (r.unit() * (s + 2.0)).floor() - 1.0
    } else {
        -1.5 + (s + 2.0) * r.unit()
    }
}

/// Offsets that move every sample of `case` to a [`border_position`] on each axis, whatever
/// its undeformed tap position, rounded to `f32` (so f32 and f64 runs see the same offsets).
pub fn border_offsets(case: &Case, seed: u64) -> Array4<f64> {
    let g = case.geometry();
    let mut r = Rng::new(seed ^ 0x0b0d_e75e_ed00_0001);
    let mut offset = Array4::zeros(g.offset_shape());
    for n in 0..g.n {
        for ch in 0..g.offset_groups * g.taps() {
            let k = ch % g.taps();
            let (i, j) = (k / g.kw, k % g.kw);
            for y in 0..g.h_out {
                for x in 0..g.w_out {
                    let (by, bx) = case.base(i, j, y, x);
                    let py = border_position(&mut r, g.h);
                    let px = border_position(&mut r, g.w);
                    offset[[n, 2 * ch, y, x]] = (py - by) as f32 as f64;
                    offset[[n, 2 * ch + 1, y, x]] = (px - bx) as f32 as f64;
                }
            }
        }
    }
    offset
}

pub fn to_f32(a: &Array4<f64>) -> Array4<f32> {
    a.mapv(|v| v as f32)
}

pub fn to_f32_1(a: &Array1<f64>) -> Array1<f32> {
    a.mapv(|v| v as f32)
}

/// Whether two arrays hold the same bits (NaN payloads included) in the same logical order.
pub fn same_bits<T: Copy + Into<f64>>(a: &Array4<T>, b: &Array4<T>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(&x, &y)| x.into().to_bits() == y.into().to_bits())
}

/// How the offsets of a [`Problem`] are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offsets {
    /// Integer part in `-3..=2`, fractional part in `[0.1, 0.9]`: every sample sits at least
    /// 0.1 from an integer row and column (where the bilinear derivative jumps), and many are
    /// partly or fully outside the image.
    AwayFromIntegers,
    /// Anything in `[-2.5, 2.5]`.
    Any,
    /// A third whole numbers in `-3..=2` (samples exactly on grid points, on the `-1` and `H`
    /// window edges), a third multiples of 0.5, a third anything in `[-2.5, 2.5]`.
    Mixed,
}

/// The operands of one case for the reference-oracle tests, in `f64` (not rounded to f32),
/// with a mask, a bias and a gradient of the output always drawn.
pub struct Problem {
    pub spec: Case,
    pub input: Array4<f64>,
    pub offset: Array4<f64>,
    pub mask: Array4<f64>,
    pub weight: Array4<f64>,
    pub bias: Array1<f64>,
    pub grad_out: Array4<f64>,
}

impl Problem {
    pub fn random(spec: Case, offsets: Offsets, rng: &mut Rng) -> Self {
        let offset = match offsets {
            Offsets::AwayFromIntegers => Array4::from_shape_simple_fn(spec.offset_shape(), || {
                rng.int(-3, 2) as f64 + rng.uniform(0.1, 0.9)
            }),
            Offsets::Any => rng.array4(spec.offset_shape(), -2.5, 2.5),
            Offsets::Mixed => {
                Array4::from_shape_simple_fn(spec.offset_shape(), || match rng.int(0, 2) {
                    0 => rng.int(-3, 2) as f64,
                    1 => rng.int(-6, 4) as f64 * 0.5,
                    _ => rng.uniform(-2.5, 2.5),
                })
            }
        };
        Problem {
            input: rng.array4(spec.input_shape(), -1.0, 1.0),
            offset,
            mask: rng.array4(spec.mask_shape(), -0.5, 1.5),
            weight: rng.array4(spec.weight_shape(), -1.0, 1.0),
            bias: Array1::from_shape_simple_fn(spec.c_out, || rng.uniform(-1.0, 1.0)),
            grad_out: rng.array4(spec.out_shape(), -1.0, 1.0),
            spec,
        }
    }

    /// Every sample position `(py, px)` of the problem (one per image, offset group, tap and
    /// output pixel).
    pub fn sample_positions(&self) -> Vec<(f64, f64)> {
        let s = &self.spec;
        let (ho, wo) = s.out_hw();
        let mut out = Vec::new();
        for n in 0..s.n {
            for g in 0..s.offset_groups() {
                for i in 0..s.kh {
                    for j in 0..s.kw {
                        let ch = g * s.taps() + i * s.kw + j;
                        for y in 0..ho {
                            for x in 0..wo {
                                let (r, c) = s.base(i, j, y, x);
                                out.push((
                                    r + self.offset[[n, 2 * ch, y, x]],
                                    c + self.offset[[n, 2 * ch + 1, y, x]],
                                ));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The reference forward with these operands (mask optional, bias optional).
    pub fn forward(&self, mask: bool, bias: bool) -> Array4<f64> {
        reference::deform_conv2d(
            self.input.view(),
            self.offset.view(),
            mask.then(|| self.mask.view()),
            self.weight.view(),
            bias.then(|| self.bias.view()),
            &self.spec.params,
        )
        .unwrap()
    }

    /// The forward of the absolute values `|input|, |mask|, |weight|, |bias|` at the same
    /// sample positions: elementwise the sum of `|terms|` of each output (bilinear weights are
    /// non-negative), the scale every rounding error is measured against.
    pub fn forward_abs(&self, mask: bool, bias: bool) -> Array4<f64> {
        reference::deform_conv2d(
            self.input.mapv(f64::abs).view(),
            self.offset.view(),
            mask.then(|| self.mask.mapv(f64::abs))
                .as_ref()
                .map(|m| m.view()),
            self.weight.mapv(f64::abs).view(),
            bias.then(|| self.bias.mapv(f64::abs))
                .as_ref()
                .map(|b| b.view()),
            &self.spec.params,
        )
        .unwrap()
    }
}

/// `sum a * b` over all elements (same shapes).
pub fn dot(a: &Array4<f64>, b: &Array4<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `sum |a| * |b|`.
pub fn dot_abs(a: &Array4<f64>, b: &Array4<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
}
