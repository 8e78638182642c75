//! The AVX2 backend: 8 `f32` or 4 `f64` lanes, masked loads and stores for tails.
//!
//! Every vector value here was made from an [`Avx2`] token (the fields are private), so the
//! CPU has AVX2 and FMA wherever one exists; that is the invariant each `SAFETY` comment relies
//! on. (FMA is part of the feature set so that scalar code compiled with it may use it for
//! other instructions; Rust never contracts a multiply and an add into one.)

use super::{Backend, Isa, Lanes, WithBackend};
use std::arch::x86_64::*;

/// The AVX2 backend's token: exists only on a CPU with AVX2 and FMA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// The token, if the CPU has AVX2 and FMA.
    pub(crate) fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Avx2(()))
    }

    /// The token without the check.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    pub(crate) unsafe fn new_unchecked() -> Self {
        debug_assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        Avx2(())
    }
}

/// 8 `f32` lanes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct F32x8(__m256);

/// 4 `f64` lanes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct F64x4(__m256d);

impl Backend for Avx2 {
    const ISA: Isa = Isa::Avx2;
    /// Ours (6 x 16 `f32`, 6 x 8 `f64`). The forward's GEMM alone (`fwd_probe W2|W4 gemm`,
    /// Intel Xeon, one run of 3 alternating rounds, medians, GFLOP/s at 1 / 2 threads): ours
    /// W2 73 / 123, W4 75 / 150; matrixmultiply's AVX2 kernel 48 / 97, 63 / 109; OpenBLAS's
    /// Haswell sgemm on the same tiles (numpy, `OPENBLAS_CORETYPE=Haswell`) 71 / 137,
    /// 76 / 127. The earlier finding that matrixmultiply was faster here (its 83 / 146,
    /// 115 / 216 in that run) compared with its AVX-512 kernel: matrixmultiply detects the
    /// CPU itself, whatever `DEFORMCONV_ISA` says, so on an AVX-512 machine the capped path
    /// ran AVX-512 code (its AVX2 kernel is timed by building it with
    /// `MMTEST_FEATURE=avx2,fma`). Our loop (per depth step 12 FMAs, 2 loads, 6 broadcasts)
    /// runs at 85-90% of the core's 256-bit FMA rate with its operands in L1 (a loop of
    /// independent FMAs alone: 94.5 GFLOP/s on the same core). The whole path (`isa_probe
    /// W2 W4`, 2 threads, 3 alternating runs) against matrixmultiply's AVX2 kernel: faster or
    /// level in every `f32` row and in the `f64` forwards, but the `f64` W4 full backward is
    /// slower (386-410 ms against 349-358).
    ///
    /// On AMD Zen 5 that backward does not lose: ours 241-268 ms (median 246), matrixmultiply's
    /// AVX2 kernel 248-266 (257), its AVX-512 kernel (what `OWN_GEMM = false` runs on an
    /// AVX-512 machine) 158-183 (164); 5 alternating runs, `isa_probe W4`, 2 threads. The
    /// backward's three products alone (`gemm_shapes_timing`, 1 thread, `f64`, GFLOP/s, ours /
    /// matrixmultiply AVX2): column gradient `weightᵀ · grad_out` 2304x256x512 55-59 / 47-49,
    /// weight gradient 256x512x2304 50-54 / 45-47, forward-shaped 256x2304x512 50-52 / 48-49;
    /// `f32` 101-120 / 89-96. So the `f64` kernel, its packing and tiles run at the `f32` rate per
    /// lane here. The Intel loss was the column gradient streaming its 4.7 MB packed `weightᵀ`
    /// from L3 once per 8-column `B` panel (8 bytes per 16 flops in `f64`), beyond a mesh
    /// L3's bandwidth per core: `A` now goes in 256 KiB row chunks (`gemm::kernel`'s
    /// `CHUNK_BYTES`), 33 -> 49 GFLOP/s on that product on an Intel Xeon.
    const OWN_GEMM: bool = true;
    type F32 = F32x8;
    type F64 = F64x4;

    #[inline(always)]
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output {
        /// # Safety
        /// The CPU has AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn with_avx2<O: WithBackend>(b: Avx2, op: O) -> O::Output {
            op.run(b)
        }
        // SAFETY: the token exists, so the CPU has AVX2 and FMA.
        unsafe { with_avx2(self, op) }
    }
}

/// All ones in the 32-bit lanes `i < n` of 8.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn first32(n: usize) -> __m256i {
    debug_assert!(n <= 8);
    // SAFETY: AVX2 by the contract.
    unsafe {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }
}

/// All ones in the 64-bit lanes `i < n` of 4.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn first64(n: usize) -> __m256i {
    debug_assert!(n <= 4);
    // SAFETY: AVX2 by the contract.
    unsafe { _mm256_cmpgt_epi64(_mm256_set1_epi64x(n as i64), _mm256_setr_epi64x(0, 1, 2, 3)) }
}

impl Lanes<f32, Avx2> for F32x8 {
    const N: usize = 8;

    #[inline(always)]
    fn splat(_: Avx2, v: f32) -> Self {
        // SAFETY: the token proves AVX2.
        F32x8(unsafe { _mm256_set1_ps(v) })
    }
    #[inline(always)]
    fn load(_: Avx2, src: &[f32]) -> Self {
        assert!(src.len() >= 8);
        // SAFETY: AVX2 (token); 8 values are readable (asserted).
        F32x8(unsafe { _mm256_loadu_ps(src.as_ptr()) })
    }
    #[inline(always)]
    fn load_partial(_: Avx2, src: &[f32]) -> Self {
        debug_assert!(src.len() < 8);
        // SAFETY: AVX2 (token); only the first min(len, 8) lanes are read (masked load).
        F32x8(unsafe { _mm256_maskload_ps(src.as_ptr(), first32(src.len().min(8))) })
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32]) {
        assert!(dst.len() >= 8);
        // SAFETY: AVX2 (a value exists); 8 values are writable (asserted).
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn store_partial(self, dst: &mut [f32]) {
        debug_assert!(dst.len() < 8);
        // SAFETY: AVX2 (a value exists); only the first min(len, 8) lanes are written.
        unsafe { _mm256_maskstore_ps(dst.as_mut_ptr(), first32(dst.len().min(8)), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul_add(self, m: Self, a: Self) -> Self {
        // SAFETY: FMA (a value exists).
        F32x8(unsafe { _mm256_fmadd_ps(self.0, m.0, a.0) })
    }
    #[inline(always)]
    fn floor(self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_floor_ps(self.0) })
    }
    #[inline(always)]
    fn abs(self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0) })
    }
    #[inline(always)]
    fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F32x8(unsafe { _mm256_blendv_ps(no.0, yes.0, _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0)) })
    }
    #[inline(always)]
    fn store_i32(self, dst: &mut [i32]) {
        let n = dst.len();
        assert!(n <= 8);
        // A whole vector by a plain store: AMD's Zen 1-3 run a masked store (`vpmaskmovd`) as
        // microcode, about 12 cycles each (Intel and Zen 4 about one). On Zen 3 the forward's
        // table build (4 index stores a vector) spent a quarter of its time on them. W1 `f32`,
        // AVX2, 1 thread, AMD Zen 3, minimum of 8 alternating rounds: forward 1.29 -> 1.16 ms
        // (dense forward 0.69); full backward (3 stores a vector in its table), 5 rounds,
        // 3.12 -> 3.01.
        // SAFETY: AVX2 (a value exists); n values are writable, and only the first n lanes are
        // written (a full store when n = 8, else a masked one).
        unsafe {
            let v = _mm256_cvttps_epi32(self.0);
            if n == 8 {
                _mm256_storeu_si256(dst.as_mut_ptr().cast(), v)
            } else {
                _mm256_maskstore_epi32(dst.as_mut_ptr(), first32(n), v)
            }
        }
    }
    const GEMM_ROWS: usize = 6;
    const GEMM_VECTORS: usize = 2;
    /// 8 x 8 in three rounds of 8 shuffles: 32-bit interleaves of row pairs, 64-bit picks of
    /// those pairs (4 x 4 blocks inside each 128-bit half), then 128-bit halves swapped.
    #[inline(always)]
    fn transpose(_: Avx2, rows: &mut [Self]) {
        let r: &mut [Self; 8] = rows.try_into().expect("8 rows");
        // SAFETY: AVX2 (a value exists).
        unsafe {
            // t[2j]: rows 2j, 2j+1 interleaved from lanes 0, 1 of each half; t[2j+1]: 2, 3. (A
            // loop, not `std::array::from_fn`: a closure left out of line loses the features.)
            let mut t = [_mm256_setzero_ps(); 8];
            for (i, x) in t.iter_mut().enumerate() {
                let (a, b) = (r[i / 2 * 2].0, r[i / 2 * 2 + 1].0);
                *x = if i % 2 == 0 {
                    _mm256_unpacklo_ps(a, b)
                } else {
                    _mm256_unpackhi_ps(a, b)
                };
            }
            // u[4h + m]: column m (of each half) of rows 4h .. 4h + 3.
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            for m in 0..4 {
                r[m] = F32x8(_mm256_permute2f128_ps::<0x20>(u[m], u[4 + m]));
                r[4 + m] = F32x8(_mm256_permute2f128_ps::<0x31>(u[m], u[4 + m]));
            }
        }
    }
}

impl Lanes<f64, Avx2> for F64x4 {
    const N: usize = 4;

    #[inline(always)]
    fn splat(_: Avx2, v: f64) -> Self {
        // SAFETY: the token proves AVX2.
        F64x4(unsafe { _mm256_set1_pd(v) })
    }
    #[inline(always)]
    fn load(_: Avx2, src: &[f64]) -> Self {
        assert!(src.len() >= 4);
        // SAFETY: AVX2 (token); 4 values are readable (asserted).
        F64x4(unsafe { _mm256_loadu_pd(src.as_ptr()) })
    }
    #[inline(always)]
    fn load_partial(_: Avx2, src: &[f64]) -> Self {
        debug_assert!(src.len() < 4);
        // SAFETY: AVX2 (token); only the first min(len, 4) lanes are read (masked load).
        F64x4(unsafe { _mm256_maskload_pd(src.as_ptr(), first64(src.len().min(4))) })
    }
    #[inline(always)]
    fn store(self, dst: &mut [f64]) {
        assert!(dst.len() >= 4);
        // SAFETY: AVX2 (a value exists); 4 values are writable (asserted).
        unsafe { _mm256_storeu_pd(dst.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn store_partial(self, dst: &mut [f64]) {
        debug_assert!(dst.len() < 4);
        // SAFETY: AVX2 (a value exists); only the first min(len, 4) lanes are written.
        unsafe { _mm256_maskstore_pd(dst.as_mut_ptr(), first64(dst.len().min(4)), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_add_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_sub_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_mul_pd(self.0, o.0) })
    }
    #[inline(always)]
    fn mul_add(self, m: Self, a: Self) -> Self {
        // SAFETY: FMA (a value exists).
        F64x4(unsafe { _mm256_fmadd_pd(self.0, m.0, a.0) })
    }
    #[inline(always)]
    fn floor(self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_floor_pd(self.0) })
    }
    #[inline(always)]
    fn abs(self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_andnot_pd(_mm256_set1_pd(-0.0), self.0) })
    }
    #[inline(always)]
    fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
        // SAFETY: AVX2 (a value exists).
        F64x4(unsafe { _mm256_blendv_pd(no.0, yes.0, _mm256_cmp_pd::<_CMP_LT_OQ>(self.0, o.0)) })
    }
    #[inline(always)]
    fn store_i32(self, dst: &mut [i32]) {
        let n = dst.len();
        assert!(n <= 4);
        // SAFETY: AVX2 (a value exists); n values are writable, and only the first n lanes are
        // written (a full store when n = 4, else a masked one: see the `f32` form).
        unsafe {
            let v = _mm256_cvttpd_epi32(self.0);
            if n == 4 {
                _mm_storeu_si128(dst.as_mut_ptr().cast(), v)
            } else {
                _mm_maskstore_epi32(dst.as_mut_ptr(), _mm256_castsi256_si128(first32(n)), v)
            }
        }
    }
    const GEMM_ROWS: usize = 6;
    const GEMM_VECTORS: usize = 2;
    /// 4 x 4 in two rounds of 4 shuffles: 64-bit interleaves of row pairs, then 128-bit halves
    /// swapped.
    #[inline(always)]
    fn transpose(_: Avx2, rows: &mut [Self]) {
        let r: &mut [Self; 4] = rows.try_into().expect("4 rows");
        // SAFETY: AVX2 (a value exists).
        unsafe {
            // t[2j]: lanes 0 and 2 of rows 2j, 2j + 1; t[2j + 1]: lanes 1 and 3.
            let t = [
                _mm256_unpacklo_pd(r[0].0, r[1].0),
                _mm256_unpackhi_pd(r[0].0, r[1].0),
                _mm256_unpacklo_pd(r[2].0, r[3].0),
                _mm256_unpackhi_pd(r[2].0, r[3].0),
            ];
            r[0] = F64x4(_mm256_permute2f128_pd::<0x20>(t[0], t[2]));
            r[1] = F64x4(_mm256_permute2f128_pd::<0x20>(t[1], t[3]));
            r[2] = F64x4(_mm256_permute2f128_pd::<0x31>(t[0], t[2]));
            r[3] = F64x4(_mm256_permute2f128_pd::<0x31>(t[1], t[3]));
        }
    }
}
