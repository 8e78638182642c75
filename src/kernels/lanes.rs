//! The per-pixel bilinear interpolation of one sampling-table row, written once over the
//! backend's vectors ([`super::backend`]) for `f32` and `f64`.
//!
//! It does the same IEEE operations in the same order on every backend (plain multiplies and
//! adds, no fused multiply-add), so the results are bitwise the same whichever backend runs.

use super::backend::{Backend, Element, Lanes};

/// One tap's row of the sampling table, for [`interpolate`].
#[derive(Clone, Copy)]
pub(crate) struct TapRow<'a, T> {
    /// Corner offsets into the plane, `-1` for no corner, per corner.
    pub index: [&'a [i32]; 4],
    /// Corner weights, per corner.
    pub weight: [&'a [T]; 4],
    /// The modulation mask, if any.
    pub mask: Option<&'a [T]>,
}

/// `row[q] = m[q] * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)` for `q < row.len()`, where
/// `v_t = plane[index_t[q]]`, or 0 (nothing read) where `index_t[q] < 0`, and `m = 1` without
/// a mask: `B::V::N` pixels a vector, the tail in one partial vector.
///
/// The table's slices must hold at least `row.len()` entries (checked).
///
/// # Safety
/// Every non-negative `index_t[q]`, `q < row.len()`, is below `plane.len()` (checked in debug
/// builds).
#[inline(always)]
pub(crate) unsafe fn interpolate<B: Backend, T: Element>(
    b: B,
    plane: &[T],
    tap: &TapRow<'_, T>,
    row: &mut [T],
) {
    let len = row.len();
    assert!(
        tap.index.iter().all(|i| i.len() >= len)
            && tap.weight.iter().all(|w| w.len() >= len)
            && tap.mask.is_none_or(|m| m.len() >= len),
        "sampling-table row shorter than its output row"
    );
    debug_assert!(tap.index.iter().all(|i| i[..len]
        .iter()
        .all(|&v| v < 0 || (v as usize) < plane.len())));
    let n = <T::V<B> as Lanes<T, B>>::N;
    let full = len - len % n;
    let mut q = 0;
    while q < full {
        // SAFETY: q + n <= len; the index bounds are the caller's contract.
        let v = unsafe { pixels::<B, T, true>(b, plane, tap, q..q + n) };
        v.store(&mut row[q..q + n]);
        q += n;
    }
    if full < len {
        // SAFETY: as above, for the lanes full..len.
        let v = unsafe { pixels::<B, T, false>(b, plane, tap, full..len) };
        v.store_partial(&mut row[full..len]);
    }
}

/// The interpolated values of pixels `r` (`r.len()` is `N` if `FULL`, else below `N`; the
/// lanes past it are 0).
///
/// # Safety
/// As for [`interpolate`], for the pixels `r`.
#[inline(always)]
unsafe fn pixels<B: Backend, T: Element, const FULL: bool>(
    b: B,
    plane: &[T],
    tap: &TapRow<'_, T>,
    r: std::ops::Range<usize>,
) -> T::V<B> {
    // Macros, not closures: a closure left out of line is compiled without the backend's
    // target features, and every intrinsic in it becomes a call (seen in a profile of the W2
    // forward under DEFORMCONV_ISA=avx2).
    macro_rules! load {
        ($s:expr) => {
            if FULL {
                T::V::<B>::load(b, &$s[r.clone()])
            } else {
                T::V::<B>::load_partial(b, &$s[r.clone()])
            }
        };
    }
    macro_rules! gather {
        ($i:expr) => {
            // SAFETY: the caller's contract: non-negative indices of `r` are below plane.len().
            unsafe {
                if FULL {
                    T::V::<B>::gather(b, plane, &$i[r.clone()])
                } else {
                    T::V::<B>::gather_partial(b, plane, &$i[r.clone()])
                }
            }
        };
    }
    let [i0, i1, i2, i3] = tap.index;
    let [w0, w1, w2, w3] = tap.weight;
    let mut acc = load!(w0).mul(gather!(i0));
    acc = acc.add(load!(w1).mul(gather!(i1)));
    acc = acc.add(load!(w2).mul(gather!(i2)));
    acc = acc.add(load!(w3).mul(gather!(i3)));
    match tap.mask {
        Some(m) => load!(m).mul(acc),
        None => acc,
    }
}
