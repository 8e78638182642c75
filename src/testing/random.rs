//! The values of a problem, drawn deterministically from a seed: [`Problem::random`].

use ndarray::{Array1, Array4};

use super::{Placement, Problem, ProblemShape};
use crate::error::Result;
use crate::float::Float;
use crate::geometry::Geometry;

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
}
