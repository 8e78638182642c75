//! The one random generator of the tests: SplitMix64, tiny and deterministic, so that a seed
//! names the same tensors forever (whatever proptest's own generator does).

use ndarray::Array4;

/// SplitMix64.
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
    /// Uniform in `[0, 1)`, 53 random bits.
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
    /// Uniform in `[-1, 1)`, rounded to f32 so f32 and f64 runs see the same values.
    pub fn value(&mut self) -> f64 {
        (2.0 * self.unit() - 1.0) as f32 as f64
    }
    /// An offset: a fraction in (-3, 3), an exact integer in -3..=3, or far outside.
    pub fn offset(&mut self) -> f64 {
        let u = self.unit();
        if u < 0.6 {
            ((6.0 * self.unit() - 3.0) as f32) as f64
        } else if u < 0.9 {
            (7.0 * self.unit()).floor() - 3.0
        } else if u < 0.95 {
            -1.0
        } else if self.unit() < 0.5 {
            40.0
        } else {
            -25.5
        }
    }
}
