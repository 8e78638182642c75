//! Dense (strided, dilated, grouped) im2col: no bilinear work, one copy per sample.

use super::Source;
use crate::float::Float;

/// The half-open range of output columns `x` whose tap column `s = x * stride - pad + off` lies
/// in `0 .. w`, intersected with `x_lo .. x_hi`.
#[inline]
fn valid_columns(
    x_lo: usize,
    x_hi: usize,
    stride: usize,
    pad: usize,
    off: usize,
    w: usize,
) -> (usize, usize) {
    // s >= 0  <=>  x * stride >= pad - off;   s < w  <=>  x * stride < w + pad - off.
    let lo = if pad > off {
        (pad - off).div_ceil(stride)
    } else {
        0
    };
    let hi = if w + pad > off {
        (w + pad - off).div_ceil(stride)
    } else {
        0
    };
    let lo = lo.clamp(x_lo, x_hi);
    let hi = hi.clamp(lo, x_hi);
    (lo, hi)
}

/// Fills the dense column tile of `(image, group, start .. start + len)`:
/// `cols[(c' * K + k) * len + q] = input[n, c, y * sh - pad_top + i * dh, x * sw - pad_left + j * dw]`
/// (0 in the padding), for the pixel `start + q = y * W_out + x`, row `r = c' * K + k` at
/// `cols[r * ld ..][..len]` (`ld >= len`).
pub(crate) fn im2col_columns<T: Float>(
    src: &Source<'_, T>,
    image: usize,
    group: usize,
    start: usize,
    len: usize,
    cols: &mut [T],
    ld: usize,
) {
    let g = src.geo;
    let (h, w, w_out, taps) = (g.h, g.w, g.w_out, g.taps());
    let cg = g.c_in_per_group();
    let plane_len = h * w;
    debug_assert!(ld >= len && (cg * taps == 0 || cols.len() >= (cg * taps - 1) * ld + len));
    debug_assert!(start + len <= g.out_pixels());
    for ci in 0..cg {
        let c = group * cg + ci;
        let plane = &src.input[(image * g.c_in + c) * plane_len..][..plane_len];
        for k in 0..taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let row = &mut cols[(ci * taps + k) * ld..][..len];
            let (off_y, off_x) = (i * g.dil_h, j * g.dil_w);
            // Walk the tile one output row at a time.
            let mut q = 0;
            while q < len {
                let p = start + q;
                let (y, x0) = (p / w_out, p % w_out);
                let x1 = w_out.min(x0 + (len - q));
                let seg = &mut row[q..q + (x1 - x0)];
                q += x1 - x0;
                let r = (y * g.stride_h + off_y) as isize - g.pad_top as isize;
                if r < 0 || r >= h as isize {
                    seg.fill(T::ZERO);
                    continue;
                }
                let line = &plane[r as usize * w..][..w];
                let (lo, hi) = valid_columns(x0, x1, g.stride_w, g.pad_left, off_x, w);
                seg[..lo - x0].fill(T::ZERO);
                seg[hi - x0..].fill(T::ZERO);
                if lo < hi {
                    let s0 = lo * g.stride_w + off_x - g.pad_left;
                    let dst = &mut seg[lo - x0..hi - x0];
                    if g.stride_w == 1 {
                        dst.copy_from_slice(&line[s0..s0 + dst.len()]);
                    } else {
                        for (t, d) in dst.iter_mut().enumerate() {
                            *d = line[s0 + t * g.stride_w];
                        }
                    }
                }
            }
        }
    }
}
