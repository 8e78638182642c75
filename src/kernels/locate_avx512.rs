//! The forward sampling-table build for 16 pixels at once (`f32`, AVX-512F, torchvision's and
//! mmcv's rule): [`crate::sample::locate_flat`] in vector form.
//!
//! On the small MNIST layer (W1: 8 channels per offset group, so each table entry serves only
//! 8 samples) the scalar build was 40% of the forward after the channel gather; this version
//! makes it a few percent. Blocks holding an offset of magnitude `2^22` or more, or NaN, are
//! handed to the scalar rule entry by entry, so the values are the scalar ones bit for bit
//! (same IEEE operations in the same order; tested in `gather`).

use std::arch::x86_64::*;

use crate::sample::locate_flat;

/// One tap's row of the table being built (all slices of the row's length `len`).
pub(crate) struct RowOut<'a> {
    pub index: [&'a mut [i32]; 4],
    pub weight: [&'a mut [f32]; 4],
}

/// One axis of a row of samples: sample `q` sits at `base[q] + tap + offset[q]` on an axis of
/// `size` pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AxisSamples<'a> {
    /// The undeformed position of each pixel's kernel origin.
    pub base: &'a [i32],
    /// The tap's displacement from the origin (`i * dil` or `j * dil`).
    pub tap: i32,
    /// The learned offset of each sample.
    pub offset: &'a [f32],
    /// The plane's extent along the axis (`H` or `W`).
    pub size: usize,
}

/// Fills `out` for the samples `(y.base[q] + y.tap + y.offset[q], x.base[q] + x.tap +
/// x.offset[q])`, `q < len`, in a `y.size x x.size` plane, as [`locate_flat`] does.
///
/// # Safety
/// AVX-512F. Every slice holds at least `len` values; `|base + tap| < 2^30` on both axes and
/// `y.size * x.size <= i32::MAX` (so the corner offsets and `base + floor(d)` fit `i32`).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn locate_row(
    y: AxisSamples<'_>,
    x: AxisSamples<'_>,
    len: usize,
    out: RowOut<'_>,
) {
    let AxisSamples {
        base: base_y,
        tap: tap_y,
        offset: dy,
        size: h,
    } = y;
    let AxisSamples {
        base: base_x,
        tap: tap_x,
        offset: dx,
        size: w,
    } = x;
    debug_assert!(base_y.len() >= len && base_x.len() >= len && dy.len() >= len && dx.len() >= len);
    debug_assert!(
        out.index.iter().all(|s| s.len() >= len) && out.weight.iter().all(|s| s.len() >= len)
    );
    debug_assert!(h.checked_mul(w).is_some_and(|p| p <= i32::MAX as usize));
    let RowOut { index, weight } = out;
    let limit = _mm512_set1_ps((1u32 << 22) as f32);
    let one = _mm512_set1_ps(1.0);
    let zero = _mm512_setzero_ps();
    let (hv, wv) = (_mm512_set1_epi32(h as i32), _mm512_set1_epi32(w as i32));
    let minus_one = _mm512_set1_epi32(-1);
    let izero = _mm512_setzero_si512();
    let ione = _mm512_set1_epi32(1);
    for q in (0..len).step_by(16) {
        let n = 16.min(len - q);
        let lanes = ((1u32 << n) - 1) as __mmask16;
        // SAFETY: lanes q .. q + n are inside every slice (len checked by the caller).
        let (dyv, dxv, by, bx) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes, dy.as_ptr().add(q)),
                _mm512_maskz_loadu_ps(lanes, dx.as_ptr().add(q)),
                _mm512_add_epi32(
                    _mm512_maskz_loadu_epi32(lanes, base_y.as_ptr().add(q)),
                    _mm512_set1_epi32(tap_y),
                ),
                _mm512_add_epi32(
                    _mm512_maskz_loadu_epi32(lanes, base_x.as_ptr().add(q)),
                    _mm512_set1_epi32(tap_x),
                ),
            )
        };
        // |d| < 2^22 on every live lane (false for NaN), else the scalar rule for this block.
        let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(dyv), limit)
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(dxv), limit);
        if small & lanes != lanes {
            for r in q..q + n {
                let (by, bx) = (base_y[r] + tap_y, base_x[r] + tap_x);
                let (c, wt) = locate_flat(by as isize, dy[r], bx as isize, dx[r], h, w);
                for t in 0..4 {
                    index[t][r] = c[t] as i32;
                    weight[t][r] = wt[t];
                }
            }
            continue;
        }
        let fy = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(dyv);
        let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(dxv);
        let (ly, lx) = (_mm512_sub_ps(dyv, fy), _mm512_sub_ps(dxv, fx));
        let hy = _mm512_sub_ps(_mm512_add_ps(fy, one), dyv);
        let hx = _mm512_sub_ps(_mm512_add_ps(fx, one), dxv);
        // |floor(d)| <= 2^22 converts exactly; |base| < 2^30, so the sums fit i32.
        let y0 = _mm512_add_epi32(by, _mm512_cvtps_epi32(fy));
        let x0 = _mm512_add_epi32(bx, _mm512_cvtps_epi32(fx));
        // p > -1  <=>  floor(p) >= 0, or floor(p) == -1 with a nonzero fraction;  p < size.
        let y_ok = _mm512_cmpge_epi32_mask(y0, izero)
            | (_mm512_cmpeq_epi32_mask(y0, minus_one) & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(ly, zero));
        let x_ok = _mm512_cmpge_epi32_mask(x0, izero)
            | (_mm512_cmpeq_epi32_mask(x0, minus_one) & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(lx, zero));
        let inside =
            y_ok & x_ok & _mm512_cmplt_epi32_mask(y0, hv) & _mm512_cmplt_epi32_mask(x0, wv);
        let vy0 = _mm512_cmpge_epi32_mask(y0, izero);
        let vy1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(y0, ione), hv);
        let vx0 = _mm512_cmpge_epi32_mask(x0, izero);
        let vx1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(x0, ione), wv);
        // Wrapping products on lanes outside the image are masked away below.
        let base = _mm512_add_epi32(_mm512_mullo_epi32(y0, wv), x0);
        let corner = [
            (inside & vy0 & vx0, base),
            (inside & vy0 & vx1, _mm512_add_epi32(base, ione)),
            (inside & vy1 & vx0, _mm512_add_epi32(base, wv)),
            (
                inside & vy1 & vx1,
                _mm512_add_epi32(_mm512_add_epi32(base, wv), ione),
            ),
        ];
        let wts = [
            _mm512_mul_ps(hy, hx),
            _mm512_mul_ps(hy, lx),
            _mm512_mul_ps(ly, hx),
            _mm512_mul_ps(ly, lx),
        ];
        for t in 0..4 {
            let (valid, at) = corner[t];
            let idx = _mm512_mask_mov_epi32(minus_one, valid, at);
            let wt = _mm512_maskz_mov_ps(inside, wts[t]);
            // SAFETY: lanes q .. q + n are inside the output rows.
            unsafe {
                _mm512_mask_storeu_epi32(index[t].as_mut_ptr().add(q), lanes, idx);
                _mm512_mask_storeu_ps(weight[t].as_mut_ptr().add(q), lanes, wt);
            }
        }
    }
}
