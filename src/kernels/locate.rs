//! The forward sampling-table build under torchvision's (and mmcv's) rule, `N` samples at a
//! time on the backend's vectors, for `f32` and `f64`: [`crate::sample::locate_flat`] in
//! vector form.
//!
//! Positions stay in `T`: the base coordinates, `floor` of the offsets and the corner offsets
//! `row * W + col` are integers well inside `T`'s exact range (the caller keeps bases below
//! `2^22` and planes below `2^24` pixels), so every comparison is exact, and the fractions and
//! weights are the scalar rule's IEEE operations in its order: the table is the scalar one bit
//! for bit (tested below). A block holding an offset of magnitude `2^22` or more, or NaN, is
//! handed to the scalar rule entry by entry.
//!
//! On the small MNIST layer (W1: 8 channels per offset group, so each table entry serves only
//! 8 samples) the scalar build was 40% of the AVX-512 forward and a third of the AVX2 one.

use super::backend::{Backend, Element, Lanes, WithBackend};
use crate::float::Float;
use crate::sample::locate_flat;

/// Largest offset magnitude (exclusive) and base coordinate for the vector form.
pub(crate) const LIMIT: usize = 1 << 22;

/// Largest plane (pixels, exclusive) for the vector form: corner offsets stay exact in `f32`.
/// Each side must also stay below [`LIMIT`].
pub(crate) const MAX_PLANE: usize = 1 << 24;

/// One axis of a row of samples: sample `q` sits at `base[q] + tap + offset[q]` on an axis of
/// `size` pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AxisSamples<'a, T> {
    /// The undeformed position of each pixel's kernel origin (an integer, `|base| < LIMIT`).
    pub base: &'a [T],
    /// The tap's displacement from the origin (`i * dil` or `j * dil`, below [`LIMIT`]).
    pub tap: T,
    /// The learned offset of each sample.
    pub offset: &'a [T],
    /// The plane's extent along the axis (`H` or `W`).
    pub size: usize,
}

/// One tap's row of the table being built (all slices of the row's length).
pub(crate) struct RowOut<'a, T> {
    /// Corner offsets `row * W + col` per corner, `-1` for none.
    pub index: [&'a mut [i32]; 4],
    /// Corner weights per corner.
    pub weight: [&'a mut [T]; 4],
}

/// Fills `out` for the samples `(y.base[q] + y.tap + y.offset[q], x.base[q] + x.tap +
/// x.offset[q])`, `q < len`, in a `y.size x x.size` plane, as [`locate_flat`] does, on the
/// backend of [`super::backend::isa`].
///
/// # Panics
/// If a slice is shorter than `len`, or the plane or a base exceeds the limits above.
pub(crate) fn locate_row<T: Float>(
    y: AxisSamples<'_, T>,
    x: AxisSamples<'_, T>,
    len: usize,
    out: RowOut<'_, T>,
) {
    super::backend::dispatch(Row { y, x, len, out })
}

/// [`locate_row`]'s arguments, run on a backend.
struct Row<'a, T> {
    y: AxisSamples<'a, T>,
    x: AxisSamples<'a, T>,
    len: usize,
    out: RowOut<'a, T>,
}

impl<T: Float> WithBackend for Row<'_, T> {
    type Output = ();

    #[inline(always)]
    fn run<B: Backend>(self, b: B) {
        let Row { y, x, len, out } = self;
        let RowOut { index, weight } = out;
        assert!(y.base.len() >= len && x.base.len() >= len);
        assert!(y.offset.len() >= len && x.offset.len() >= len);
        assert!(index.iter().all(|s| s.len() >= len) && weight.iter().all(|s| s.len() >= len));
        assert!(y.size.checked_mul(x.size).is_some_and(|p| p < MAX_PLANE));
        assert!(y.size < LIMIT && x.size < LIMIT);
        let limit = T::from_usize(LIMIT);
        let n = <T::V<B> as Lanes<T, B>>::N;
        assert!(n <= 16);
        type V<B, T> = <T as Element>::V<B>;
        macro_rules! splat {
            ($v:expr) => {
                V::<B, T>::splat(b, $v)
            };
        }
        let (zero, one) = (splat!(T::ZERO), splat!(T::ONE));
        let (hv, wv) = (splat!(T::from_usize(y.size)), splat!(T::from_usize(x.size)));
        let (tap_y, tap_x) = (splat!(y.tap), splat!(x.tap));
        let minus_one = splat!(-T::ONE);
        // |d| < 2^22 on every sample of the row (false for NaN), else the scalar rule for the
        // blocks that hold one. A fold without early exit, so that it vectorises.
        let small = |d: &[T]| d.iter().fold(true, |all, v| all & (v.abs() < limit));
        let row_small = small(&y.offset[..len]) && small(&x.offset[..len]);
        for q in (0..len).step_by(n) {
            let lanes = n.min(len - q);
            let block_small =
                row_small || small(&y.offset[q..q + lanes]) && small(&x.offset[q..q + lanes]);
            if !block_small {
                for r in q..q + lanes {
                    let by = (y.base[r] + y.tap).to_f64() as isize;
                    let bx = (x.base[r] + x.tap).to_f64() as isize;
                    let (c, wt) = locate_flat(by, y.offset[r], bx, x.offset[r], y.size, x.size);
                    for t in 0..4 {
                        index[t][r] = c[t] as i32;
                        weight[t][r] = wt[t];
                    }
                }
                continue;
            }
            // Lanes q .. q + lanes of a slice (asserted long enough), zeros after.
            macro_rules! load {
                ($s:expr) => {
                    if lanes == n {
                        V::<B, T>::load(b, &$s[q..q + n])
                    } else {
                        V::<B, T>::load_partial(b, &$s[q..q + lanes])
                    }
                };
            }
            let (dy, dx) = (load!(y.offset), load!(x.offset));
            let (by, bx) = (load!(y.base).add(tap_y), load!(x.base).add(tap_x));
            let (fy, fx) = (dy.floor(), dx.floor());
            let (ly, lx) = (dy.sub(fy), dx.sub(fx));
            let (hy, hx) = (fy.add(one).sub(dy), fx.add(one).sub(dx));
            let (y0, x0) = (by.add(fy), bx.add(fx));
            // The rule's tests on `p = base + d` and `floor(p)`, as exact comparisons of `d`
            // with integers: p > -1 (inside from below: floor(p) >= 0, or -1 with a nonzero
            // fraction), p < size (floor(p) < size), p >= 0 (first corner inside),
            // p < size - 1 (second corner inside). Each gives 1 or 0.
            macro_rules! axis {
                ($d:expr, $b:expr, $size:expr) => {{
                    let above = minus_one.sub($b).lt_select($d, one, zero);
                    let below = $d.lt_select($size.sub($b), one, zero);
                    let first = $d.lt_select(zero.sub($b), zero, one);
                    let second = $d.lt_select($size.sub(one).sub($b), one, zero);
                    (above.mul(below), first, second)
                }};
            }
            let (in_y, vy0, vy1) = axis!(dy, by, hv);
            let (in_x, vx0, vx1) = axis!(dx, bx, wv);
            let inside = in_y.mul(in_x);
            let base = y0.mul(wv).add(x0);
            let corners = [
                (vy0.mul(vx0), base),
                (vy0.mul(vx1), base.add(one)),
                (vy1.mul(vx0), base.add(wv)),
                (vy1.mul(vx1), base.add(wv).add(one)),
            ];
            let weights = [hy.mul(hx), hy.mul(lx), ly.mul(hx), ly.mul(lx)];
            for (t, (valid, at)) in corners.into_iter().enumerate() {
                // (at + 1) * ok - 1: the corner offset where it counts, else -1 (exact: both
                // are below 2^24 where ok is 1; finite times 0 elsewhere).
                let ok = valid.mul(inside);
                at.add(one)
                    .mul(ok)
                    .sub(one)
                    .store_i32(&mut index[t][q..q + lanes]);
                // Weights are at least 0, so an outside sample's are +0, as the scalar rule's.
                let w = weights[t].mul(inside);
                if lanes == n {
                    w.store(&mut weight[t][q..q + n]);
                } else {
                    w.store_partial(&mut weight[t][q..q + lanes]);
                }
            }
        }
    }
}
