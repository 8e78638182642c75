//! Problem generators shared by the fast-forward tests: random shapes and deterministic
//! pseudo-random tensors (offsets mixing fractions, exact integers and far-outside values).
#![allow(dead_code)]

use deformconv::{ConvParams, Geometry, Padding};
use ndarray::{Array1, Array4};
use proptest::prelude::*;

/// A small deterministic generator (64-bit LCG), so that one proptest seed fixes all tensors.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
    /// Uniform in `[-1, 1)`, rounded to f32 so f32 and f64 runs see the same values.
    pub fn value(&mut self) -> f64 {
        (2.0 * self.next_unit() - 1.0) as f32 as f64
    }
    /// An offset: a fraction in (-3, 3), an exact integer in -3..=3, or far outside.
    pub fn offset(&mut self) -> f64 {
        let u = self.next_unit();
        if u < 0.6 {
            ((6.0 * self.next_unit() - 3.0) as f32) as f64
        } else if u < 0.9 {
            (7.0 * self.next_unit()).floor() - 3.0
        } else if u < 0.95 {
            -1.0
        } else {
            if self.next_unit() < 0.5 {
                40.0
            } else {
                -25.5
            }
        }
    }
}

/// One problem: shapes, parameters and whether mask and bias are present.
#[derive(Debug, Clone)]
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
    pub fn geometry(&self) -> Geometry {
        Geometry::new(
            [self.n, self.c_in, self.h, self.w],
            [self.c_out, self.c_in / self.params.groups, self.kh, self.kw],
            &self.params,
        )
        .expect("generated cases are valid")
    }

    pub fn tensors(&self) -> Tensors {
        let g = self.geometry();
        let mut r = Lcg(self.seed);
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
                let h = dh * (kh - 1) + 1 + eh;
                let w = dw * (kw - 1) + 1 + ew;
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
                    h,
                    w,
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
pub fn border_position(r: &mut Lcg, size: usize) -> f64 {
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
    let u = r.next_unit();
    if u < 0.55 {
        special[(r.next_unit() * special.len() as f64) as usize % special.len()]
    } else if u < 0.85 {
        (r.next_unit() * (s + 2.0)).floor() - 1.0
    } else {
        -1.5 + (s + 2.0) * r.next_unit()
    }
}

/// Offsets that move every sample of `case` to a [`border_position`] on each axis, whatever
/// its undeformed tap position, rounded to `f32` (so f32 and f64 runs see the same offsets).
pub fn border_offsets(case: &Case, seed: u64) -> Array4<f64> {
    let g = case.geometry();
    let mut r = Lcg(seed ^ 0x0b0d_e75e_ed00_0001);
    let mut offset = Array4::zeros(g.offset_shape());
    for n in 0..g.n {
        for ch in 0..g.offset_groups * g.taps() {
            let k = ch % g.taps();
            let (i, j) = (k / g.kw, k % g.kw);
            for y in 0..g.h_out {
                for x in 0..g.w_out {
                    let by = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64;
                    let bx = (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64;
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

/// Checks an f32 result element by element against `|fast - exact| <= 4 (L + 4) eps sum|terms|`,
/// `L = C_in/groups * kh * kw` products (+ bias), and reports the worst element.
///
/// `sum|terms|` is the reference run on `|input|`, `|weight|`, `|mask|`, `|bias|`: because the
/// bilinear weights are non-negative, `B(|input|) >= |B(input)|`, so this bounds
/// `|bias| + sum |weight * m * B|` from above (a valid, slightly looser bound).
pub fn assert_f32_within_bound(
    case: &Case,
    fast: &Array4<f32>,
    exact: &Array4<f64>,
    abs_sum: &Array4<f64>,
) {
    let g = case.geometry();
    let terms = (g.c_in_per_group() * g.taps() + 4) as f64;
    let eps = f32::EPSILON as f64 / 2.0;
    let mut worst = (0.0f64, [0usize; 4]);
    for ((idx, &f), (&e, &s)) in fast.indexed_iter().zip(exact.iter().zip(abs_sum.iter())) {
        let bound = 4.0 * terms * eps * s + f64::MIN_POSITIVE;
        let err = (f as f64 - e).abs();
        let ratio = err / bound;
        assert!(
            err <= bound,
            "{case:?}: out{idx:?} = {f:e}, exact {e:e}: error {err:e} > bound {bound:e}"
        );
        if ratio > worst.0 {
            worst = (ratio, [idx.0, idx.1, idx.2, idx.3]);
        }
    }
    assert!(
        worst.0 <= 1.0,
        "worst element {:?} at ratio {}",
        worst.1,
        worst.0
    );
}
