//! The 16 x 16 in-register transpose of `f32` vectors (AVX-512F), shared by the pixel-major
//! image copy, the channel gather and the GEMM's packing of a transposed operand. It only
//! permutes, so its results are exact.

use std::arch::x86_64::*;

/// Transposes the 16 x 16 matrix `r` (row `i` = `r[i]`) in registers: afterwards `r[j]`
/// holds what was column `j`. Four rounds of 16 two-source shuffles: 32-bit and 64-bit
/// interleaves inside 128-bit lanes, then two rounds of 128-bit lane selection.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        // Lane L of t[2i]: r[2i][4L], r[2i+1][4L], r[2i][4L+1], r[2i+1][4L+1]; t[2i+1]: +2, +3.
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for j in 0..4 {
        // Lane L of u[4j + m]: column 4L + m of rows 4j .. 4j + 3.
        let (a, b) = (_mm512_castps_pd(t[4 * j]), _mm512_castps_pd(t[4 * j + 2]));
        let (c, d) = (
            _mm512_castps_pd(t[4 * j + 1]),
            _mm512_castps_pd(t[4 * j + 3]),
        );
        u[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for m in 0..4 {
        // Column 4L + m is lane L of u[m], u[4 + m], u[8 + m], u[12 + m], in that order.
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
        let v1 = _mm512_shuffle_f32x4::<0xDD>(u[m], u[4 + m]);
        let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
        let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + m], u[12 + m]);
        r[m] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        r[4 + m] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        r[8 + m] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
        r[12 + m] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
    }
}

/// A mask of the first `n <= 16` lanes.
#[inline]
pub(crate) fn first_lanes(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}
