//! SIMD kernels chosen at run time: AVX-512F or AVX2 on x86_64 when the CPU has them
//! (detected once and cached), portable scalar code everywhere else. No compiler flags needed.
//!
//! Every variant does the same IEEE operations in the same order as the scalar code (plain
//! multiplies and adds, no fused multiply-add), so the results are bitwise the same whichever
//! variant runs.

#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction set the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable code.
    Scalar,
    /// AVX2 with FMA available (x86_64).
    Avx2,
    /// AVX-512F available (x86_64).
    Avx512,
}

/// The instruction set the kernels use: the best the CPU has (capped by `DEFORMCONV_ISA`, see
/// [`capped`]), detected once and cached.
pub(crate) fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        static CACHE: AtomicU8 = AtomicU8::new(0);
        match CACHE.load(Ordering::Relaxed) {
            1 => Isa::Scalar,
            2 => Isa::Avx2,
            3 => Isa::Avx512,
            _ => {
                let detected = if is_x86_feature_detected!("avx512f") {
                    Isa::Avx512
                } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    Isa::Avx2
                } else {
                    Isa::Scalar
                };
                let found = capped(detected);
                let code = match found {
                    Isa::Scalar => 1,
                    Isa::Avx2 => 2,
                    Isa::Avx512 => 3,
                };
                CACHE.store(code, Ordering::Relaxed);
                found
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// `detected`, lowered to the cap named by the environment variable `DEFORMCONV_ISA`
/// (`scalar`, `avx2`; anything else, or unset, leaves it as detected). It lets one machine
/// run the whole test suite on every code path (CI does), and users compare paths.
#[cfg(target_arch = "x86_64")]
fn capped(detected: Isa) -> Isa {
    match (std::env::var("DEFORMCONV_ISA").as_deref(), detected) {
        (Ok("scalar"), _) => Isa::Scalar,
        (Ok("avx2"), Isa::Avx512) => Isa::Avx2,
        _ => detected,
    }
}

/// One tap's row of the sampling table, for [`interpolate_f32`].
#[derive(Clone, Copy)]
pub(crate) struct TapRow<'a, T> {
    /// Corner offsets into the plane, `-1` for no corner, per corner.
    pub index: [&'a [i32]; 4],
    /// Corner weights, per corner.
    pub weight: [&'a [T]; 4],
    /// The modulation mask, if any.
    pub mask: Option<&'a [T]>,
}

/// `row[q] = m[q] * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)`, `v_t = plane[index_t[q]]` or 0 where
/// `index_t[q] < 0`: the scalar definition every variant reproduces bit for bit.
#[inline(always)]
pub(crate) fn interpolate_scalar<T: crate::Float>(plane: &[T], tap: &TapRow<'_, T>, row: &mut [T]) {
    let read = |i: i32| if i >= 0 { plane[i as usize] } else { T::ZERO };
    let [i0, i1, i2, i3] = tap.index;
    let [w0, w1, w2, w3] = tap.weight;
    for q in 0..row.len() {
        row[q] =
            w0[q] * read(i0[q]) + w1[q] * read(i1[q]) + w2[q] * read(i2[q]) + w3[q] * read(i3[q]);
    }
    if let Some(m) = tap.mask {
        for (v, &m) in row.iter_mut().zip(m) {
            *v = m * *v;
        }
    }
}

/// [`interpolate_scalar`] for `f32` with the best available gather instructions.
///
/// Every corner index that is not negative must be below `plane.len()` (the table guarantees
/// it); this is checked in debug builds.
pub(crate) fn interpolate_f32(plane: &[f32], tap: &TapRow<'_, f32>, row: &mut [f32]) {
    let len = row.len();
    debug_assert!(tap.index.iter().all(|i| i.len() >= len));
    debug_assert!(tap.weight.iter().all(|w| w.len() >= len));
    debug_assert!(tap.mask.is_none_or(|m| m.len() >= len));
    debug_assert!(tap.index.iter().all(|i| i[..len]
        .iter()
        .all(|&v| v < 0 || (v as usize) < plane.len())));
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected; lengths and index bounds as asserted above.
        Isa::Avx512 => unsafe { x86::interpolate_avx512(plane, tap, row) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected; lengths and index bounds as asserted above.
        Isa::Avx2 => unsafe { x86::interpolate_avx2(plane, tap, row) },
        _ => interpolate_scalar(plane, tap, row),
    }
}

/// Runs `f` compiled for the best available instruction set (so that `floor` and the
/// comparisons of the sampling-table build are single instructions instead of library calls).
#[inline(always)]
pub(crate) fn with_best_isa<R>(f: impl FnOnce() -> R) -> R {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features the wrapper enables were detected.
        Isa::Avx512 | Isa::Avx2 => unsafe { x86::run_avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TapRow;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// # Safety
    /// The CPU must support AVX-512F; the table's slices hold at least `row.len()` entries and
    /// its non-negative indices are below `plane.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn interpolate_avx512(plane: &[f32], tap: &TapRow<'_, f32>, row: &mut [f32]) {
        let len = row.len();
        let base = plane.as_ptr();
        let zero_i = _mm512_setzero_si512();
        let zero = _mm512_setzero_ps();
        let mut q = 0;
        while q < len {
            let rem = len - q;
            let lanes: __mmask16 = if rem >= 16 { 0xFFFF } else { (1u16 << rem) - 1 };
            let mut acc = zero;
            for t in 0..4 {
                // SAFETY: lanes < rem are inside every slice (len checked by the caller); the
                // masked-off lanes are not accessed; gathered lanes have 0 <= index < plane.len().
                unsafe {
                    let idx = _mm512_maskz_loadu_epi32(lanes, tap.index[t].as_ptr().add(q));
                    let w = _mm512_maskz_loadu_ps(lanes, tap.weight[t].as_ptr().add(q));
                    let valid = _mm512_mask_cmpge_epi32_mask(lanes, idx, zero_i);
                    let v = _mm512_mask_i32gather_ps::<4>(zero, valid, idx, base);
                    let p = _mm512_mul_ps(w, v);
                    acc = if t == 0 { p } else { _mm512_add_ps(acc, p) };
                }
            }
            // SAFETY: as above for the mask slice and the output row.
            unsafe {
                if let Some(m) = tap.mask {
                    let mv = _mm512_maskz_loadu_ps(lanes, m.as_ptr().add(q));
                    acc = _mm512_mul_ps(mv, acc);
                }
                _mm512_mask_storeu_ps(row.as_mut_ptr().add(q), lanes, acc);
            }
            q += 16;
        }
    }

    /// # Safety
    /// The CPU must support AVX2; as [`interpolate_avx512`] otherwise.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn interpolate_avx2(plane: &[f32], tap: &TapRow<'_, f32>, row: &mut [f32]) {
        let len = row.len();
        let base = plane.as_ptr();
        let full = len / 8 * 8;
        let minus_one = _mm256_set1_epi32(-1);
        let mut q = 0;
        while q < full {
            let mut acc = _mm256_setzero_ps();
            for t in 0..4 {
                // SAFETY: q + 8 <= len, inside every slice; lanes with a negative index are
                // masked off (not accessed), the others are below plane.len().
                unsafe {
                    let idx = _mm256_loadu_si256(tap.index[t].as_ptr().add(q) as *const __m256i);
                    let w = _mm256_loadu_ps(tap.weight[t].as_ptr().add(q));
                    let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, minus_one));
                    let v = _mm256_mask_i32gather_ps::<4>(_mm256_setzero_ps(), base, idx, valid);
                    let p = _mm256_mul_ps(w, v);
                    acc = if t == 0 { p } else { _mm256_add_ps(acc, p) };
                }
            }
            // SAFETY: as above.
            unsafe {
                if let Some(m) = tap.mask {
                    acc = _mm256_mul_ps(_mm256_loadu_ps(m.as_ptr().add(q)), acc);
                }
                _mm256_storeu_ps(row.as_mut_ptr().add(q), acc);
            }
            q += 8;
        }
        if full < len {
            let tail = TapRow {
                index: tap.index.map(|i| &i[full..len]),
                weight: tap.weight.map(|w| &w[full..len]),
                mask: tap.mask.map(|m| &m[full..len]),
            };
            super::interpolate_scalar(plane, &tail, &mut row[full..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant the CPU supports gives the scalar definition's bits, for every tail length.
    #[test]
    fn variants_agree_bitwise_with_scalar() {
        let plane: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut state = 7u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state >> 8
        };
        for len in [1usize, 7, 8, 15, 16, 17, 40] {
            let index: Vec<Vec<i32>> = (0..4)
                .map(|_| (0..len).map(|_| (next() % 60) as i32 - 10).collect())
                .collect();
            let weight: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..len).map(|_| next() as f32 / 16_777_216.0).collect())
                .collect();
            let mask: Vec<f32> = (0..len)
                .map(|_| next() as f32 / 8_388_608.0 - 1.0)
                .collect();
            let index: Vec<Vec<i32>> = index
                .into_iter()
                .map(|v| {
                    v.into_iter()
                        .map(|i| if i >= 50 { -1 } else { i })
                        .collect()
                })
                .collect();
            for with_mask in [false, true] {
                let tap = TapRow {
                    index: [0, 1, 2, 3].map(|t| index[t].as_slice()),
                    weight: [0, 1, 2, 3].map(|t| weight[t].as_slice()),
                    mask: with_mask.then_some(mask.as_slice()),
                };
                let mut want = vec![f32::NAN; len];
                interpolate_scalar(&plane, &tap, &mut want);
                let mut got = vec![f32::NAN; len];
                interpolate_f32(&plane, &tap, &mut got);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "dispatched, len {len}"
                );
                #[cfg(target_arch = "x86_64")]
                {
                    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                        let mut got = vec![f32::NAN; len];
                        // SAFETY: AVX2 and FMA detected; indices are -1 or below plane.len().
                        unsafe { x86::interpolate_avx2(&plane, &tap, &mut got) };
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "avx2, len {len}"
                        );
                    }
                    if is_x86_feature_detected!("avx512f") {
                        let mut got = vec![f32::NAN; len];
                        // SAFETY: AVX-512F detected; indices are -1 or below plane.len().
                        unsafe { x86::interpolate_avx512(&plane, &tap, &mut got) };
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "avx512, len {len}"
                        );
                    }
                }
            }
        }
    }
}
