//! The AVX-512F backend: 16 `f32` or 8 `f64` lanes, masked loads and stores for tails.
//!
//! Every vector value here was made from an [`Avx512`] token (the fields are private), so the
//! CPU has AVX-512F wherever one exists; that is the invariant each `SAFETY` comment relies on.

use super::{Backend, Isa, Lanes, WithBackend};
use std::arch::x86_64::*;

/// The AVX-512F backend's token: exists only on a CPU with AVX-512F.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// The token, if the CPU has AVX-512F.
    pub(crate) fn new() -> Option<Self> {
        is_x86_feature_detected!("avx512f").then_some(Avx512(()))
    }

    /// The token without the check.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    pub(crate) unsafe fn new_unchecked() -> Self {
        debug_assert!(is_x86_feature_detected!("avx512f"));
        Avx512(())
    }
}

/// 16 `f32` lanes (`repr(transparent)`: its arrays are arrays of `__m512`, see `transpose`).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub(crate) struct F32x16(__m512);

/// 8 `f64` lanes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct F64x8(__m512d);

impl Backend for Avx512 {
    const ISA: Isa = Isa::Avx512;
    const OWN_GEMM: bool = true;
    type F32 = F32x16;
    type F64 = F64x8;

    #[inline(always)]
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output {
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn with_avx512<O: WithBackend>(b: Avx512, op: O) -> O::Output {
            op.run(b)
        }
        // SAFETY: the token exists, so the CPU has AVX-512F.
        unsafe { with_avx512(self, op) }
    }
}

/// The mask of the first `n` of 16 lanes (`n <= 16`).
#[inline(always)]
fn first(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}

impl Lanes<f32, Avx512> for F32x16 {
    const N: usize = 16;

    #[inline(always)]
    fn splat(_: Avx512, v: f32) -> Self {
        // SAFETY: the token proves AVX-512F.
        F32x16(unsafe { _mm512_set1_ps(v) })
    }
    #[inline(always)]
    fn load(_: Avx512, src: &[f32]) -> Self {
        assert!(src.len() >= 16);
        // SAFETY: AVX-512F (token); 16 values are readable (asserted).
        F32x16(unsafe { _mm512_loadu_ps(src.as_ptr()) })
    }
    #[inline(always)]
    fn load_partial(_: Avx512, src: &[f32]) -> Self {
        debug_assert!(src.len() < 16);
        let n = src.len().min(16);
        // SAFETY: AVX-512F (token); only the first n <= src.len() lanes are read.
        F32x16(unsafe { _mm512_maskz_loadu_ps(first(n), src.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32]) {
        assert!(dst.len() >= 16);
        // SAFETY: AVX-512F (a value exists); 16 values are writable (asserted).
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn store_partial(self, dst: &mut [f32]) {
        debug_assert!(dst.len() < 16);
        let n = dst.len().min(16);
        // SAFETY: AVX-512F (a value exists); only the first n <= dst.len() lanes are written.
        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), first(n), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe { _mm512_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe { _mm512_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe { _mm512_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul_add(self, m: Self, a: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe { _mm512_fmadd_ps(self.0, m.0, a.0) })
    }
    #[inline(always)]
    fn floor(self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe {
            _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(self.0)
        })
    }
    #[inline(always)]
    fn abs(self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe { _mm512_abs_ps(self.0) })
    }
    #[inline(always)]
    fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F32x16(unsafe {
            let lt = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, o.0);
            _mm512_mask_blend_ps(lt, no.0, yes.0)
        })
    }
    #[inline(always)]
    fn store_i32(self, dst: &mut [i32]) {
        assert!(dst.len() <= 16);
        // SAFETY: AVX-512F (a value exists); only the first dst.len() lanes are written.
        unsafe {
            let v = _mm512_cvttps_epi32(self.0);
            _mm512_mask_storeu_epi32(dst.as_mut_ptr(), first(dst.len()), v)
        }
    }
    const GEMM_ROWS: usize = 8;
    const GEMM_VECTORS: usize = 3;
    #[inline(always)]
    fn transpose_block(
        _: Avx512,
        src: &[f32],
        stride: usize,
        rows: usize,
        dst: &mut [f32],
        ld: usize,
    ) {
        assert!(dst.len() >= 15 * ld + 16);
        assert!((1..=16).contains(&rows) && src.len() >= (rows - 1) * stride + 16);
        // (A loop, not `std::array::from_fn`: a closure left out of line loses the features.)
        // SAFETY: AVX-512F (token).
        let mut r = [unsafe { _mm512_setzero_ps() }; 16];
        for (i, x) in r.iter_mut().enumerate().take(rows) {
            // SAFETY: AVX-512F (token); row i < rows ends at i * stride + 16 <= src.len()
            // (asserted).
            *x = unsafe { _mm512_loadu_ps(src.as_ptr().add(i * stride)) };
        }
        // SAFETY: AVX-512F (token).
        unsafe { crate::kernels::transpose::transpose16(&mut r) };
        for (k, v) in r.iter().enumerate() {
            // SAFETY: AVX-512F (token); k * ld + 16 <= dst.len() (asserted).
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(k * ld), *v) };
        }
    }
    /// 16 x 16 by [`crate::kernels::transpose::transpose16`].
    #[inline(always)]
    fn transpose(_: Avx512, rows: &mut [Self]) {
        let r: &mut [Self; 16] = rows.try_into().expect("16 rows");
        // In place: `r.map(|v| v.0)` and back went out of line through `array::try_map` and
        // two `memcpy`s (3% of the W4 forward, 1 thread, AMD Zen 4 profile).
        // SAFETY: `F32x16` is `repr(transparent)` over `__m512`, so both arrays have one
        // layout; AVX-512F (a value exists).
        unsafe {
            let block = &mut *(r as *mut [Self; 16]).cast::<[__m512; 16]>();
            crate::kernels::transpose::transpose16(block)
        };
    }
}

impl Lanes<f64, Avx512> for F64x8 {
    const N: usize = 8;

    #[inline(always)]
    fn splat(_: Avx512, v: f64) -> Self {
        // SAFETY: the token proves AVX-512F.
        F64x8(unsafe { _mm512_set1_pd(v) })
    }
    #[inline(always)]
    fn load(_: Avx512, src: &[f64]) -> Self {
        assert!(src.len() >= 8);
        // SAFETY: AVX-512F (token); 8 values are readable (asserted).
        F64x8(unsafe { _mm512_loadu_pd(src.as_ptr()) })
    }
    #[inline(always)]
    fn load_partial(_: Avx512, src: &[f64]) -> Self {
        debug_assert!(src.len() < 8);
        let n = src.len().min(8);
        // SAFETY: AVX-512F (token); only the first n <= src.len() lanes are read.
        F64x8(unsafe { _mm512_maskz_loadu_pd(first(n) as __mmask8, src.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, dst: &mut [f64]) {
        assert!(dst.len() >= 8);
        // SAFETY: AVX-512F (a value exists); 8 values are writable (asserted).
        unsafe { _mm512_storeu_pd(dst.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn store_partial(self, dst: &mut [f64]) {
        debug_assert!(dst.len() < 8);
        let n = dst.len().min(8);
        // SAFETY: AVX-512F (a value exists); only the first n <= dst.len() lanes are written.
        unsafe { _mm512_mask_storeu_pd(dst.as_mut_ptr(), first(n) as __mmask8, self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe { _mm512_add_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe { _mm512_sub_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe { _mm512_mul_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn mul_add(self, m: Self, a: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe { _mm512_fmadd_pd(self.0, m.0, a.0) })
    }
    #[inline(always)]
    fn floor(self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe {
            _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(self.0)
        })
    }
    #[inline(always)]
    fn abs(self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe { _mm512_abs_pd(self.0) })
    }
    #[inline(always)]
    fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
        // SAFETY: AVX-512F (a value exists).
        F64x8(unsafe {
            let lt = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(self.0, o.0);
            _mm512_mask_blend_pd(lt, no.0, yes.0)
        })
    }
    #[inline(always)]
    fn store_i32(self, dst: &mut [i32]) {
        assert!(dst.len() <= 8);
        // SAFETY: AVX-512F (a value exists); only the first dst.len() lanes are written.
        unsafe {
            let v = _mm512_cvttpd_epi32(self.0);
            let m = first(dst.len());
            _mm512_mask_storeu_epi32(dst.as_mut_ptr(), m, _mm512_castsi256_si512(v))
        }
    }
    const GEMM_ROWS: usize = 8;
    const GEMM_VECTORS: usize = 3;
    /// 8 x 8 in three rounds of 8 shuffles: 64-bit interleaves of row pairs, two-source
    /// permutes of 128-bit pairs (4 x 4 blocks inside each 256-bit half), then 256-bit halves
    /// swapped.
    #[inline(always)]
    fn transpose(_: Avx512, rows: &mut [Self]) {
        let r: &mut [Self; 8] = rows.try_into().expect("8 rows");
        // SAFETY: AVX-512F (a value exists).
        unsafe {
            // t[2j]: even lanes of rows 2j, 2j + 1 interleaved; t[2j + 1]: the odd lanes.
            // (A loop, not `std::array::from_fn`: a closure left out of line loses the features.)
            let mut t = [_mm512_setzero_pd(); 8];
            for (i, x) in t.iter_mut().enumerate() {
                let (a, b) = (r[i / 2 * 2].0, r[i / 2 * 2 + 1].0);
                *x = if i % 2 == 0 {
                    _mm512_unpacklo_pd(a, b)
                } else {
                    _mm512_unpackhi_pd(a, b)
                };
            }
            // Columns {0, 4} ({2, 6}) of four rows from the even (odd) pairs of 128-bit lanes.
            let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
            let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
            // u[m], rows 0-3, and u[4 + m], rows 4-7: columns c and c + 4 for c = [0, 2, 1, 3][m].
            let u = [
                _mm512_permutex2var_pd(t[0], even, t[2]),
                _mm512_permutex2var_pd(t[0], odd, t[2]),
                _mm512_permutex2var_pd(t[1], even, t[3]),
                _mm512_permutex2var_pd(t[1], odd, t[3]),
                _mm512_permutex2var_pd(t[4], even, t[6]),
                _mm512_permutex2var_pd(t[4], odd, t[6]),
                _mm512_permutex2var_pd(t[5], even, t[7]),
                _mm512_permutex2var_pd(t[5], odd, t[7]),
            ];
            for (m, c) in [0, 2, 1, 3].into_iter().enumerate() {
                r[c] = F64x8(_mm512_shuffle_f64x2::<0x44>(u[m], u[4 + m]));
                r[c + 4] = F64x8(_mm512_shuffle_f64x2::<0xEE>(u[m], u[4 + m]));
            }
        }
    }
}
