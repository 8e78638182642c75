//! Precision profiles: the unit round-off of the bound, and how a kernel of that precision
//! stores values and forms sample positions.

use std::fmt;

/// The precision a kernel under test computes in, for [`Tolerance::precision`](super::Tolerance::precision) and the
/// position rule of [`Oracle`](super::Oracle).
///
/// Each profile is one unit round-off `u` (the largest relative error of one rounding to
/// nearest), used for storage *and* accumulation in the bound `c * u * (L * sum|terms| + P)`
/// and in the statistical check:
///
/// | profile | significand bits | `u`     | model |
/// |---------|------------------|---------|-------|
/// | `F64`   | 53               | `2^-53` | IEEE binary64 throughout |
/// | `F32`   | 24               | `2^-24` | IEEE binary32 throughout |
/// | `Tf32`  | 11               | `2^-11` | f32 storage and accumulation, products of TF32-rounded operands (NVIDIA tensor cores): one TF32 rounding of each factor dominates, so `u = 2^-11` |
/// | `Bf16`  | 8                | `2^-8`  | bfloat16 storage, accumulation in bf16 or wider: `u` of bf16 |
/// | `F16`   | 11               | `2^-11` | IEEE binary16 storage, accumulation in f16 or wider: `u` of f16 |
///
/// (bfloat16 has 7 stored significand bits plus the implicit one, so its unit round-off is
/// `2^-8`, machine epsilon `2^-7`.) Taking the storage precision's `u` for the accumulation
/// too keeps the bound a worst case for kernels that accumulate in that precision, and only
/// loosens it for kernels that accumulate wider.
///
/// Sample positions `base + d` (`base = y * stride - pad + i * dil`, an integer) are formed as
/// torchvision's kernels form them: in `f64` for `F64`, in `f32` for `F32` and `Tf32` (tensor
/// cores take no part in the sampling), and rounded to the storage type for `Bf16` and `F16`
/// (torchvision's half kernels hold the position in `scalar_t`): see [`Precision::position`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Precision {
    /// IEEE binary64, `u = 2^-53`.
    F64,
    /// IEEE binary32, `u = 2^-24` (the default).
    #[default]
    F32,
    /// TF32 products with f32 storage and accumulation, `u = 2^-11`.
    Tf32,
    /// bfloat16, `u = 2^-8`.
    Bf16,
    /// IEEE binary16, `u = 2^-11`.
    F16,
}

impl Precision {
    /// Every profile, widest first.
    pub const ALL: [Precision; 5] = [
        Precision::F64,
        Precision::F32,
        Precision::Tf32,
        Precision::F16,
        Precision::Bf16,
    ];

    /// The unit round-off `u`: `2^-53`, `2^-24`, `2^-11`, `2^-8`, `2^-11`.
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            Precision::F64 => f64::EPSILON / 2.0,
            Precision::F32 => f32::EPSILON as f64 / 2.0,
            Precision::Tf32 | Precision::F16 => 1.0 / 2048.0,
            Precision::Bf16 => 1.0 / 256.0,
        }
    }

    /// Significand bits, the implicit one included: 53, 24, 11, 8, 11.
    pub const fn significand_bits(self) -> u32 {
        match self {
            Precision::F64 => 53,
            Precision::F32 => 24,
            Precision::Tf32 | Precision::F16 => 11,
            Precision::Bf16 => 8,
        }
    }

    /// The name used on command lines and in case files: `f64`, `f32`, `tf32`, `bf16`, `f16`.
    pub const fn name(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The profile called `name` (also accepts `float64`, `float32`, `bfloat16`, `float16`,
    /// `half`).
    pub fn from_name(name: &str) -> Option<Precision> {
        match name.to_ascii_lowercase().as_str() {
            "f64" | "float64" | "double" => Some(Precision::F64),
            "f32" | "float32" | "float" => Some(Precision::F32),
            "tf32" => Some(Precision::Tf32),
            "bf16" | "bfloat16" => Some(Precision::Bf16),
            "f16" | "float16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }

    /// `x` rounded to nearest (ties to even) in this precision's storage format: `f64`
    /// unchanged, `f32` by a cast, TF32 and bf16 to 11 and 8 significand bits with f32's
    /// exponent range, f16 to 11 bits with its own range (subnormals below `2^-14`, overflow
    /// to infinity past 65504). NaN and infinities pass through.
    pub fn round(self, x: f64) -> f64 {
        match self {
            Precision::F64 => x,
            Precision::F32 => x as f32 as f64,
            Precision::Tf32 | Precision::Bf16 => round_significand(
                x as f32 as f64,
                self.significand_bits(),
                -126,
                f32::MAX as f64,
            ),
            Precision::F16 => round_significand(x, 11, -14, 65504.0),
        }
    }

    /// The sample position `base + d` as a kernel of this precision forms it: the offset `d`
    /// stored in the precision, the sum formed in `f64` (`F64`) or `f32` (the others) and, for
    /// `Bf16` and `F16`, rounded to the storage type.
    pub fn position(self, base: f64, d: f64) -> f64 {
        match self {
            Precision::F64 => base + d,
            Precision::F32 | Precision::Tf32 => ((base as f32) + (d as f32)) as f64,
            Precision::Bf16 | Precision::F16 => {
                self.round(((base as f32) + (self.round(d) as f32)) as f64)
            }
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to `bits` significand bits, ties to even, with normal exponents down to
/// `min_exp` (below it, the spacing of the subnormals) and `max` the largest finite value.
fn round_significand(x: f64, bits: u32, min_exp: i32, max: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    // The exponent of x (x = m * 2^e, 1 <= m < 2), exact from the bits of a normal f64.
    let e = ((x.abs().to_bits() >> 52) as i32 - 1023).max(min_exp);
    let ulp = 2f64.powi(e - (bits as i32 - 1));
    let r = (x / ulp).round_ties_even() * ulp;
    if r.abs() > max {
        // Past the largest finite value by at least half an ulp: infinity.
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_the_formats() {
        // f16: 1 + 2^-10 is representable, 1 + 2^-11 ties to even (1).
        assert_eq!(
            Precision::F16.round(1.0 + 2f64.powi(-10)),
            1.0 + 2f64.powi(-10)
        );
        assert_eq!(Precision::F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(Precision::F16.round(65519.0), 65504.0);
        assert_eq!(Precision::F16.round(65520.0), f64::INFINITY);
        assert_eq!(Precision::F16.round(2f64.powi(-25)), 0.0);
        assert_eq!(Precision::F16.round(3.0 * 2f64.powi(-25)), 2f64.powi(-23));
        // bf16: 8 significand bits.
        assert_eq!(
            Precision::Bf16.round(1.0 + 2f64.powi(-7)),
            1.0 + 2f64.powi(-7)
        );
        assert_eq!(
            Precision::Bf16.round(1.0 + 3.0 * 2f64.powi(-9)),
            1.0 + 2f64.powi(-7)
        );
        assert_eq!(
            Precision::Tf32.round(1.0 + 2f64.powi(-10)),
            1.0 + 2f64.powi(-10)
        );
        assert_eq!(Precision::Tf32.round(-(1.0 + 2f64.powi(-12))), -1.0);
        for p in Precision::ALL {
            let u = p.unit_roundoff();
            assert_eq!(u, 2f64.powi(-(p.significand_bits() as i32)));
            for x in [0.1, -3.7, 1234.567, 1e-3] {
                let r = p.round(x);
                assert!((r - x).abs() <= u * x.abs(), "{p}: {x} -> {r}");
                assert_eq!(p.round(r), r, "{p}: rounding is idempotent");
            }
            assert_eq!(Precision::from_name(p.name()), Some(p));
        }
    }

    #[test]
    fn positions_round_like_the_kernels() {
        // 5 + 1e-9 is 5 in f32, not in f64.
        assert_eq!(Precision::F32.position(5.0, 1e-9), 5.0);
        assert_eq!(Precision::F64.position(5.0, 1e-9), 5.0 + 1e-9);
        // 37 + 0.3 in f16: spacing 2^-5 near 37.
        let p = Precision::F16.position(37.0, 0.3);
        assert_eq!(p, 37.3125);
    }
}
