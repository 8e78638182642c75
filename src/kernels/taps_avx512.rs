//! The torchvision sampling table for `f32` built straight into its column form
//! ([`TapColumns`]) with AVX-512, sixteen pixels at once.
//!
//! Each lane performs the operations of [`Tap::with_rule`] for [`TorchvisionRule`] on offsets
//! with `|d| < 2^22` (exact `floor`, the same subtractions and products, integer compares
//! instead of `isize` ones on values far inside `i32`), so the columns are bitwise those of
//! [`TapColumns::fill`] on the scalar table; lanes with larger, infinite or NaN offsets are
//! built by the scalar [`Tap::with_rule`] itself. A unit test compares the two on random,
//! border, far and NaN offsets.

#[cfg(target_arch = "x86_64")]
use crate::kernels::columns::TapColumns;
#[cfg(target_arch = "x86_64")]
use crate::kernels::taps::{PlaneLayout, Tap, TorchvisionRule};

/// One run of consecutive table entries: one tap over consecutive pixels of one image.
pub(crate) struct Run<'a> {
    /// First entry of the run in the table.
    pub at: usize,
    /// Base row `y * stride - pad` of each pixel, as `i32`.
    pub base_y: &'a [i32],
    /// Base column `x * stride - pad` of each pixel.
    pub base_x: &'a [i32],
    /// The tap's row shift `i * dil`, added to `base_y`.
    pub tap_y: i32,
    /// The tap's column shift `j * dil`, added to `base_x`.
    pub tap_x: i32,
    /// Row offsets `dy` of the pixels.
    pub dy: &'a [f32],
    /// Column offsets `dx` of the pixels.
    pub dx: &'a [f32],
    /// Mask values (`None`: 1).
    pub m: Option<&'a [f32]>,
    /// First cell of the image's planes in the task's buffer.
    pub plane0: usize,
}

/// Largest magnitude of a base coordinate, a plane cell or a cell index for which
/// [`fill_run`] may be used: every intermediate stays far inside `i32`.
pub(crate) const LIMIT: usize = 1 << 28;

/// Writes the table entries of `run` into `cols` (whose columns hold at least
/// `run.at + run.dy.len()` entries), as [`Tap::with_rule::<TorchvisionRule>`] would.
///
/// # Safety
/// The CPU must support AVX-512F.
///
/// # Panics
/// If a slice of `run` is shorter than `run.dy`, a column of `cols` is too short, or the plane
/// or layout exceed [`LIMIT`] (the caller keeps to the limit; the panic guards soundness).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn fill_run(cols: &mut TapColumns<f32>, layout: PlaneLayout, run: &Run<'_>) {
    use std::arch::x86_64::*;
    let len = run.dy.len();
    let end = run.at + len;
    assert!(run.dx.len() == len && run.base_y.len() == len && run.base_x.len() == len);
    assert!(run.m.is_none_or(|m| m.len() == len));
    assert!(cols.gather.len() >= end && cols.scatter.len() >= end && cols.m.len() >= end);
    assert!(cols.ly.len() >= end && cols.lx.len() >= end && cols.inside.len() >= end);
    assert!(cols.weights.iter().all(|w| w.len() >= end));
    assert!(run.plane0 + layout.len() < LIMIT && layout.pitch() < LIMIT);
    let shift_ok = |s: i32| s.unsigned_abs() < LIMIT as u32;
    let base_ok = |v: &[i32]| v.iter().all(|&b| b.unsigned_abs() < LIMIT as u32);
    assert!(shift_ok(run.tap_y) && shift_ok(run.tap_x));
    debug_assert!(base_ok(run.base_y) && base_ok(run.base_x));
    let (h, w) = (layout.h as i32, layout.w as i32);
    let zero_cell = (run.plane0 + layout.zero_base()) as i32;
    let limit = _mm512_set1_ps((1u32 << 22) as f32);
    let one = _mm512_set1_ps(1.0);
    let zero = _mm512_setzero_ps();
    let (vh, vw, m1) = (
        _mm512_set1_epi32(h),
        _mm512_set1_epi32(w),
        _mm512_set1_epi32(-1),
    );
    let zero_i = _mm512_setzero_si512();
    let (pitch, cell0) = (
        _mm512_set1_epi32(layout.pitch() as i32),
        _mm512_set1_epi32(run.plane0 as i32 + layout.pitch() as i32 + 1),
    );
    let zero_v = _mm512_set1_epi32(zero_cell);
    let mut q = 0;
    while q < len {
        let rem = len - q;
        let live: __mmask16 = if rem >= 16 { 0xFFFF } else { (1u16 << rem) - 1 };
        let e = run.at + q;
        // SAFETY: lanes below `rem` address entries q..q+rem of the run's slices and
        // e..e+rem of the columns (lengths asserted above); masked-off lanes are not accessed.
        unsafe {
            let dy = _mm512_maskz_loadu_ps(live, run.dy.as_ptr().add(q));
            let dx = _mm512_maskz_loadu_ps(live, run.dx.as_ptr().add(q));
            let m = match run.m {
                Some(m) => _mm512_maskz_loadu_ps(live, m.as_ptr().add(q)),
                None => one,
            };
            let by = _mm512_add_epi32(
                _mm512_maskz_loadu_epi32(live, run.base_y.as_ptr().add(q)),
                _mm512_set1_epi32(run.tap_y),
            );
            let bx = _mm512_add_epi32(
                _mm512_maskz_loadu_epi32(live, run.base_x.as_ptr().add(q)),
                _mm512_set1_epi32(run.tap_x),
            );
            // Tap::is_plain: |d| < 2^22, false for NaN.
            let plain = _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(live, _mm512_abs_ps(dy), limit)
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(dx), limit);
            let fy = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(dy);
            let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(dx);
            let (ly, lx) = (_mm512_sub_ps(dy, fy), _mm512_sub_ps(dx, fx));
            let hy = _mm512_sub_ps(_mm512_add_ps(fy, one), dy);
            let hx = _mm512_sub_ps(_mm512_add_ps(fx, one), dx);
            // Exact for plain lanes (|floor| <= 2^22); other lanes are rebuilt below.
            let y0 = _mm512_add_epi32(by, _mm512_cvttps_epi32(fy));
            let x0 = _mm512_add_epi32(bx, _mm512_cvttps_epi32(fx));
            let below_h = _mm512_cmplt_epi32_mask(y0, vh);
            let below_w = _mm512_cmplt_epi32_mask(x0, vw);
            let y_in = _mm512_cmpge_epi32_mask(y0, zero_i)
                | (_mm512_cmpeq_epi32_mask(y0, m1) & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(ly, zero));
            let x_in = _mm512_cmpge_epi32_mask(x0, zero_i)
                | (_mm512_cmpeq_epi32_mask(x0, m1) & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(lx, zero));
            let inside = y_in & x_in & below_h & below_w;
            let addressable = _mm512_cmpge_epi32_mask(y0, m1)
                & _mm512_cmpge_epi32_mask(x0, m1)
                & below_h
                & below_w;
            // plane0 + (clamp(y0, -1, H) + 1) * pitch + clamp(x0, -1, W) + 1.
            let cy = _mm512_min_epi32(_mm512_max_epi32(y0, m1), vh);
            let cx = _mm512_min_epi32(_mm512_max_epi32(x0, m1), vw);
            let cell = _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(cy, pitch), cx), cell0);
            // Torchvision reads every addressable sample (inside implies addressable).
            let gather = _mm512_mask_blend_epi32(addressable, zero_v, cell);
            let scatter = _mm512_mask_blend_epi32(inside, zero_v, cell);
            _mm512_mask_storeu_epi32(cols.gather.as_mut_ptr().add(e), live, gather);
            _mm512_mask_storeu_epi32(cols.scatter.as_mut_ptr().add(e), live, scatter);
            let ws = [
                _mm512_maskz_mul_ps(inside, hy, hx),
                _mm512_maskz_mul_ps(inside, hy, lx),
                _mm512_maskz_mul_ps(inside, ly, hx),
                _mm512_maskz_mul_ps(inside, ly, lx),
            ];
            for (col, v) in cols.weights.iter_mut().zip(ws) {
                _mm512_mask_storeu_ps(col.as_mut_ptr().add(e), live, v);
            }
            let ly = _mm512_maskz_mov_ps(addressable, ly);
            let lx = _mm512_maskz_mov_ps(addressable, lx);
            _mm512_mask_storeu_ps(cols.ly.as_mut_ptr().add(e), live, ly);
            _mm512_mask_storeu_ps(cols.lx.as_mut_ptr().add(e), live, lx);
            _mm512_mask_storeu_ps(cols.m.as_mut_ptr().add(e), live, m);
            let ins = _mm512_maskz_mov_epi32(inside, m1);
            _mm512_mask_storeu_epi32(cols.inside.as_mut_ptr().add(e), live, ins);
            // NaN, infinite and huge offsets: the scalar rule.
            let mut odd = live & !plain;
            while odd != 0 {
                let l = odd.trailing_zeros() as usize;
                odd &= odd - 1;
                let t = Tap::with_rule::<TorchvisionRule>(
                    layout,
                    run.plane0,
                    ((run.base_y[q + l] + run.tap_y) as isize, run.dy[q + l]),
                    ((run.base_x[q + l] + run.tap_x) as isize, run.dx[q + l]),
                    run.m.map_or(1.0, |m| m[q + l]),
                );
                cols.set(e + l, &t);
            }
        }
        q += 16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lanes::{isa, Isa};

    /// The vector build gives exactly the columns of the scalar table, on random, border,
    /// integer, far, infinite and NaN offsets, with and without a mask, on a ragged run.
    #[test]
    fn vector_build_equals_the_scalar_table() {
        if isa() != Isa::Avx512 {
            return;
        }
        let layout = PlaneLayout::zero_bordered(5, 7);
        let len = 203;
        let mut next = crate::kernels::test_stream(777);
        let specials = [
            f32::NAN,
            -1.0,
            5.0,
            40.0,
            -0.999,
            4.999,
            f32::INFINITY,
            0.0,
            -7.0,
            1e30,
            -4194304.0,
            4194303.5,
        ];
        let base_y: Vec<i32> = (0..len).map(|i| (i % 9) as i32 - 2).collect();
        let base_x: Vec<i32> = (0..len).map(|i| (i % 11) as i32 - 2).collect();
        let dy: Vec<f32> = (0..len)
            .map(|i| {
                if i % 5 == 0 {
                    specials[i / 5 % specials.len()]
                } else {
                    8.0 * next() - 4.0
                }
            })
            .collect();
        let dx: Vec<f32> = (0..len)
            .map(|i| {
                if i % 7 == 0 {
                    specials[i / 7 % specials.len()]
                } else {
                    8.0 * next() - 4.0
                }
            })
            .collect();
        let m: Vec<f32> = (0..len).map(|_| next()).collect();
        for mask in [None, Some(&m[..])] {
            let plane0 = 3 * layout.len();
            let taps: Vec<Tap<f32>> = (0..len)
                .map(|i| {
                    Tap::with_rule::<TorchvisionRule>(
                        layout,
                        plane0,
                        (base_y[i] as isize + 1, dy[i]),
                        (base_x[i] as isize - 1, dx[i]),
                        mask.map_or(1.0, |m| m[i]),
                    )
                })
                .collect();
            let mut want = TapColumns::default();
            want.fill(&taps);
            let mut got = TapColumns::default();
            got.resize(len + 1);
            let run = Run {
                at: 1,
                base_y: &base_y,
                base_x: &base_x,
                tap_y: 1,
                tap_x: -1,
                dy: &dy,
                dx: &dx,
                m: mask,
                plane0,
            };
            // SAFETY: AVX-512F detected.
            unsafe { fill_run(&mut got, layout, &run) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(&got.gather[1..], &want.gather[..]);
            assert_eq!(&got.scatter[1..], &want.scatter[..]);
            assert_eq!(&got.inside[1..], &want.inside[..]);
            assert_eq!(bits(&got.ly[1..]), bits(&want.ly));
            assert_eq!(bits(&got.lx[1..]), bits(&want.lx));
            assert_eq!(bits(&got.m[1..]), bits(&want.m));
            for c in 0..4 {
                assert_eq!(bits(&got.weights[c][1..]), bits(&want.weights[c]), "w{c}");
            }
        }
    }
}
