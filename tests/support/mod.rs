//! Random small problems for the reference-oracle tests: a deterministic RNG, a problem spec
//! (shapes and parameters), and the operands built from it.
#![allow(dead_code)]

use deformconv::{reference, ConvParams, Padding};
use ndarray::{Array1, Array4};

/// SplitMix64: tiny, deterministic, good enough to fill test tensors.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x005e_ed0f_def0_4c0e)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
    /// Uniform in `lo..=hi`.
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        self.int(lo as i64, hi as i64) as usize
    }
    pub fn array4(&mut self, shape: [usize; 4], lo: f64, hi: f64) -> Array4<f64> {
        Array4::from_shape_simple_fn(shape, || self.uniform(lo, hi))
    }
    /// Small integers in `lo..=hi` as `f64`: sums of their products are exact in any order.
    pub fn int_array4(&mut self, shape: [usize; 4], lo: i64, hi: i64) -> Array4<f64> {
        Array4::from_shape_simple_fn(shape, || self.int(lo, hi) as f64)
    }
}

/// Shapes and parameters of one problem, always valid by construction.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub n: usize,
    pub groups: usize,
    /// Input channels per conv group.
    pub cin_per_group: usize,
    /// Output channels per conv group.
    pub cout_per_group: usize,
    pub offset_groups: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: (usize, usize),
    pub dilation: (usize, usize),
    pub padding: Padding,
    pub h: usize,
    pub w: usize,
}

impl Spec {
    /// Builds a valid spec from free "knobs": `og_pick` chooses among the divisors of `C_in`,
    /// `extra_h`/`extra_w` are the input rows/columns beyond the smallest that fits the kernel.
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
        Spec {
            n,
            groups,
            cin_per_group,
            cout_per_group,
            offset_groups,
            kh,
            kw,
            stride,
            dilation,
            padding,
            h: fit(kh, dilation.0, padding.top + padding.bottom) + extra_h,
            w: fit(kw, dilation.1, padding.left + padding.right) + extra_w,
        }
    }

    /// A random small spec (every parameter of the contract varies).
    pub fn random(rng: &mut Rng) -> Self {
        let padding = Padding {
            top: rng.size(0, 2),
            bottom: rng.size(0, 2),
            left: rng.size(0, 2),
            right: rng.size(0, 2),
        };
        Spec::from_knobs(
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

    pub fn c_in(&self) -> usize {
        self.groups * self.cin_per_group
    }
    pub fn c_out(&self) -> usize {
        self.groups * self.cout_per_group
    }
    pub fn taps(&self) -> usize {
        self.kh * self.kw
    }
    pub fn params(&self) -> ConvParams {
        ConvParams::default()
            .stride(self.stride.0, self.stride.1)
            .padding_sides(self.padding)
            .dilation(self.dilation.0, self.dilation.1)
            .groups(self.groups)
            .offset_groups(self.offset_groups)
    }
    /// `(H_out, W_out)` by the DESIGN.md §1 formula, computed here independently.
    pub fn out_hw(&self) -> (usize, usize) {
        let p = self.padding;
        let ho =
            (self.h + p.top + p.bottom - (self.dilation.0 * (self.kh - 1) + 1)) / self.stride.0 + 1;
        let wo =
            (self.w + p.left + p.right - (self.dilation.1 * (self.kw - 1) + 1)) / self.stride.1 + 1;
        (ho, wo)
    }
    pub fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in(), self.h, self.w]
    }
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.c_out(), self.cin_per_group, self.kh, self.kw]
    }
    pub fn out_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, self.c_out(), ho, wo]
    }
    pub fn offset_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, 2 * self.offset_groups * self.taps(), ho, wo]
    }
    pub fn mask_shape(&self) -> [usize; 4] {
        let (ho, wo) = self.out_hw();
        [self.n, self.offset_groups * self.taps(), ho, wo]
    }
    /// The integer grid position `(row, col)` of tap `(i, j)` at output pixel `(y, x)`,
    /// before the offset.
    pub fn base(&self, i: usize, j: usize, y: usize, x: usize) -> (f64, f64) {
        let r = (y * self.stride.0 + i * self.dilation.0) as f64 - self.padding.top as f64;
        let c = (x * self.stride.1 + j * self.dilation.1) as f64 - self.padding.left as f64;
        (r, c)
    }
}

/// How offsets are drawn.
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

/// The operands of one problem, in `f64`.
pub struct Problem {
    pub spec: Spec,
    pub input: Array4<f64>,
    pub offset: Array4<f64>,
    pub mask: Array4<f64>,
    pub weight: Array4<f64>,
    pub bias: Array1<f64>,
    pub grad_out: Array4<f64>,
}

impl Problem {
    pub fn random(spec: Spec, offsets: Offsets, rng: &mut Rng) -> Self {
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
            bias: Array1::from_shape_simple_fn(spec.c_out(), || rng.uniform(-1.0, 1.0)),
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
            for g in 0..s.offset_groups {
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
            &self.spec.params(),
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
            &self.spec.params(),
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
