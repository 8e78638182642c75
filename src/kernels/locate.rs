//! The sampling table built `N` samples at a time on the backend's vectors, for `f32` and
//! `f64`, under every convention ([`fill_columns`]): [`Tap::with_rule`] in vector form, per
//! axis torchvision's window ([`AxisRule::new`], mmcv's too) or DCN v1's
//! ([`AxisRule::clamped`]). The forward writes the columns its gather reads, the backward
//! all of them ([`Fields`]).
//!
//! Positions stay in `T`: the base coordinates, `floor` of the offsets and the corner offsets
//! or cells are integers well inside `T`'s exact range (the callers keep bases below `2^22` and
//! planes below `2^24` cells), so every comparison is exact, and the fractions and weights are
//! the scalar rule's IEEE operations in its order: the tables are the scalar ones bit for bit
//! (tested here and in `gather`). A block holding an offset of magnitude `2^22` or more, or
//! NaN, is handed to the scalar rule entry by entry.
//!
//! On the small MNIST layer (W1: 8 channels per offset group, so each table entry serves only
//! 8 samples) the scalar forward build was 40% of the AVX-512 forward and a third of the AVX2
//! one.

use super::backend::{Backend, Element, Lanes, WithBackend};
use super::columns::TapColumns;
use super::taps::{DcnV1Rule, MmcvRule, PlaneLayout, Rule, Tap, TorchvisionRule};
use crate::convention::Convention;
use crate::float::Float;
use std::marker::PhantomData;

/// Largest offset magnitude (exclusive) and base coordinate for the vector form.
pub(crate) const LIMIT: usize = 1 << 22;

/// Largest plane (pixels, exclusive) for the vector form: corner offsets stay exact in `f32`.
/// Each side must also stay below [`LIMIT`].
pub(crate) const MAX_PLANE: usize = 1 << 24;

/// One run of a tile's table: one tap over consecutive pixels of one image, written to
/// entries `at ..` of [`TapColumns`].
pub(crate) struct ColumnRun<'a, T> {
    /// First entry of the run in the table.
    pub at: usize,
    /// Base row `y * stride - pad` of each pixel (an integer, `|base| < LIMIT`).
    pub base_y: &'a [T],
    /// Base column `x * stride - pad` of each pixel.
    pub base_x: &'a [T],
    /// The tap's row shift `i * dil` (below [`LIMIT`]).
    pub tap_y: T,
    /// The tap's column shift `j * dil`.
    pub tap_x: T,
    /// Row offsets of the pixels.
    pub dy: &'a [T],
    /// Column offsets of the pixels.
    pub dx: &'a [T],
    /// Mask values (`None`: 1).
    pub m: Option<&'a [T]>,
    /// First cell of the image's planes in the task's buffer.
    pub plane0: usize,
}

/// Which columns of the table a build writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fields {
    /// What the forward's gather reads: `scatter` (the cell of a sample's value), `weights`,
    /// and `m` where the run has a mask.
    Forward,
    /// Every column (the backward's fused pass).
    All,
}

/// Writes the entries of `run` into `cols` (whose columns hold at least `run.at +
/// run.dy.len()` entries) on `layout`, the planes of `convention`, as
/// [`Tap::with_rule`] and [`TapColumns::set`] would (only the columns of `fields`): the table
/// built straight into its column form, a vector of pixels at a time.
///
/// Measured on W1 (1 thread): the row table and its copy into columns were a third of the
/// backward.
///
/// # Panics
/// If a slice of `run` is shorter than `run.dy`, a column of `cols` is too short, `layout`
/// is not the convention's, or the cells reach [`MAX_PLANE`] or a plane side [`LIMIT`] (the
/// callers keep below them).
pub(crate) fn fill_columns<T: Float>(
    cols: &mut TapColumns<T>,
    convention: Convention,
    layout: PlaneLayout,
    run: &ColumnRun<'_, T>,
    fields: Fields,
) {
    match (convention, fields) {
        (Convention::Torchvision, Fields::All) => {
            build::<T, TorchvisionRule, true>(cols, layout, run)
        }
        (Convention::Mmcv, Fields::All) => build::<T, MmcvRule, true>(cols, layout, run),
        (Convention::DcnV1, Fields::All) => build::<T, DcnV1Rule, true>(cols, layout, run),
        // The forward's columns are the same under torchvision's and mmcv's rules.
        (Convention::Torchvision | Convention::Mmcv, Fields::Forward) => {
            build::<T, TorchvisionRule, false>(cols, layout, run)
        }
        (Convention::DcnV1, Fields::Forward) => build::<T, DcnV1Rule, false>(cols, layout, run),
    }
}

/// [`fill_columns`] under rule `R`, every column if `ALL`.
fn build<T: Float, R: Rule, const ALL: bool>(
    cols: &mut TapColumns<T>,
    layout: PlaneLayout,
    run: &ColumnRun<'_, T>,
) {
    super::backend::dispatch(Build::<T, R, ALL> {
        cols,
        layout,
        run,
        rule: PhantomData,
    })
}

/// [`build`]'s arguments, run on a backend.
struct Build<'a, 'r, T, R, const ALL: bool> {
    cols: &'a mut TapColumns<T>,
    layout: PlaneLayout,
    run: &'a ColumnRun<'r, T>,
    rule: PhantomData<R>,
}

impl<T: Float, R: Rule, const ALL: bool> WithBackend for Build<'_, '_, T, R, ALL> {
    type Output = ();

    #[inline(always)]
    fn run<B: Backend>(self, b: B) {
        let Build {
            cols, layout, run, ..
        } = self;
        let len = run.dy.len();
        let end = run.at + len;
        assert!(run.dx.len() == len && run.base_y.len() == len && run.base_x.len() == len);
        assert!(run.m.is_none_or(|m| m.len() == len));
        assert!(cols.gather.len() >= end && cols.scatter.len() >= end && cols.m.len() >= end);
        assert!(cols.ly.len() >= end && cols.lx.len() >= end && cols.inside.len() >= end);
        assert!(cols.weights.iter().all(|w| w.len() >= end));
        assert!(run.plane0 + layout.len() < MAX_PLANE && layout.h.max(layout.w) < LIMIT);
        assert_eq!(
            layout,
            PlaneLayout::for_convention(R::CONVENTION, layout.h, layout.w)
        );
        let n = <T::V<B> as Lanes<T, B>>::N;
        // Macros, not closures: out of line a closure loses the backend's features.
        macro_rules! splat {
            ($v:expr) => {
                V::<B, T>::splat(b, $v)
            };
        }
        let (zero, one) = (splat!(T::ZERO), splat!(T::ONE));
        let (hv, wv) = (
            splat!(T::from_usize(layout.h)),
            splat!(T::from_usize(layout.w)),
        );
        let (tap_y, tap_x) = (splat!(run.tap_y), splat!(run.tap_x));
        let pitch = splat!(T::from_usize(layout.pitch()));
        // plane0 + index(y, x) = y * pitch + x + (plane0 + pitch + 1).
        let cell0 = splat!(T::from_usize(run.plane0 + layout.pitch() + 1));
        let zero_cell = splat!(T::from_usize(run.plane0 + layout.zero_base()));
        // The closure in argument position, marked `#[inline(always)]`: out of line it would
        // lose the backend's features (see `WithBackend`).
        by_blocks::<T, B>(
            len,
            run.dy,
            run.dx,
            #[inline(always)]
            |q: usize, lanes: usize, vector: bool| {
                if !vector {
                    for r in q..q + lanes {
                        // `match`, not `map_or`: a closure left out of line loses the features.
                        let m = match run.m {
                            Some(m) => m[r],
                            None => T::ONE,
                        };
                        let t = Tap::with_rule::<R>(
                            layout,
                            run.plane0,
                            ((run.base_y[r] + run.tap_y).to_f64() as isize, run.dy[r]),
                            ((run.base_x[r] + run.tap_x).to_f64() as isize, run.dx[r]),
                            m,
                        );
                        cols.set(run.at + r, &t);
                    }
                    return;
                }
                macro_rules! load {
                    ($s:expr) => {
                        load_lanes(b, $s, q, lanes)
                    };
                }
                let e = run.at + q..run.at + q + lanes;
                let (dy, dx) = (load!(run.dy), load!(run.dx));
                let (base_y, base_x) = (load!(run.base_y).add(tap_y), load!(run.base_x).add(tap_x));
                let (ry, rx) = match R::CONVENTION {
                    Convention::DcnV1 => (
                        AxisRule::clamped(b, base_y, dy, hv),
                        AxisRule::clamped(b, base_x, dx, wv),
                    ),
                    Convention::Torchvision | Convention::Mmcv => (
                        AxisRule::new(b, base_y, dy, hv),
                        AxisRule::new(b, base_x, dx, wv),
                    ),
                };
                let inside = ry.inside.mul(rx.inside);
                // Exact where it is kept: cells below 2^24.
                let cell = ry.floor.mul(pitch).add(rx.floor).add(cell0);
                zero.lt_select(inside, cell, zero_cell)
                    .store_i32(&mut cols.scatter[e.clone()]);
                let weights = bilinear_weights(&ry, &rx);
                for (col, w) in cols.weights.iter_mut().zip(weights) {
                    // Weights are at least 0, so an outside sample's are +0, as the scalar
                    // rule's.
                    store_lanes(w.mul(inside), &mut col[e.clone()], n);
                }
                let m = match run.m {
                    Some(m) => Some(load!(m)),
                    None if ALL => Some(one),
                    None => None,
                };
                if let Some(m) = m {
                    store_lanes(m, &mut cols.m[e.clone()], n);
                }
                if !ALL {
                    return;
                }
                // Torchvision reads every sample with a corner cell in the image or its zero
                // border (inside implies it) for the coordinate gradient; mmcv and DCN v1 only
                // the samples inside. Elsewhere the table points at zero cells.
                let reach = match R::CONVENTION {
                    Convention::Torchvision => ry.reach.mul(rx.reach),
                    Convention::Mmcv | Convention::DcnV1 => inside,
                };
                zero.lt_select(reach, cell, zero_cell)
                    .store_i32(&mut cols.gather[e.clone()]);
                store_lanes(ry.low.mul(reach), &mut cols.ly[e.clone()], n);
                store_lanes(rx.low.mul(reach), &mut cols.lx[e.clone()], n);
                zero.sub(inside).store_i32(&mut cols.inside[e]);
            },
        );
    }
}

type V<B, T> = <T as Element>::V<B>;

/// Calls `block(q, lanes, vector)` for each block of `N` samples `q .. q + lanes` (the last
/// one possibly shorter): `vector` when all its offsets have `|d| < LIMIT`, else (an offset
/// that large, or NaN) the block is for the scalar rule.
#[inline(always)]
fn by_blocks<T: Float, B: Backend>(
    len: usize,
    dy: &[T],
    dx: &[T],
    mut block: impl FnMut(usize, usize, bool),
) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let limit = T::from_usize(LIMIT);
    // A fold without early exit, so that it vectorises (with `all`, the AVX-512 W1 forward
    // ran 12% longer).
    let small = |d: &[T]| d.iter().fold(true, |all, v| all & (v.abs() < limit));
    let row_small = small(&dy[..len]) && small(&dx[..len]);
    for q in (0..len).step_by(n) {
        let lanes = n.min(len - q);
        let r = q..q + lanes;
        block(
            q,
            lanes,
            row_small || small(&dy[r.clone()]) && small(&dx[r]),
        );
    }
}

/// Lanes `q .. q + lanes` of `s` (`lanes <= N`), zeros after.
#[inline(always)]
fn load_lanes<T: Float, B: Backend>(b: B, s: &[T], q: usize, lanes: usize) -> V<B, T> {
    if lanes == <T::V<B> as Lanes<T, B>>::N {
        V::<B, T>::load(b, &s[q..q + lanes])
    } else {
        V::<B, T>::load_partial(b, &s[q..q + lanes])
    }
}

/// Writes the first `dst.len()` lanes of `v` (`dst.len() <= n`, the lane count).
#[inline(always)]
fn store_lanes<T: Float, B: Backend>(v: V<B, T>, dst: &mut [T], n: usize) {
    if dst.len() == n {
        v.store(dst);
    } else {
        v.store_partial(dst);
    }
}

/// Torchvision's rule along one axis for a vector of samples `p = base + d` (integer `base`,
/// `|base|, |d| < LIMIT`) on an axis of `size` pixels. The tests on `p` and `floor(p)` are
/// exact comparisons of `d` with integers; each is 1 or 0 per lane.
struct AxisRule<V> {
    /// `floor(p)`, the first corner's coordinate.
    floor: V,
    /// `d - floor(d)`, the fraction towards the second corner.
    low: V,
    /// `floor(d) + 1 - d`.
    high: V,
    /// `-1 < p < size`: the sample counts along this axis (`floor(p) >= 0`, or `-1` with a
    /// nonzero fraction).
    inside: V,
    /// `-1 <= p < size`: the corners lie in the image or its one-cell zero border.
    reach: V,
}

impl<V> AxisRule<V> {
    #[inline(always)]
    fn new<T: Float, B: Backend>(b: B, base: V, d: V, size: V) -> Self
    where
        V: Lanes<T, B>,
    {
        let (zero, one) = (V::splat(b, T::ZERO), V::splat(b, T::ONE));
        let minus_one = V::splat(b, -T::ONE);
        let f = d.floor();
        let below = d.lt_select(size.sub(base), one, zero);
        AxisRule {
            floor: base.add(f),
            low: d.sub(f),
            high: f.add(one).sub(d),
            inside: minus_one.sub(base).lt_select(d, one, zero).mul(below),
            reach: d.lt_select(minus_one.sub(base), zero, one).mul(below),
        }
    }

    /// DCN v1's rule ([`Tap::with_rule`] for [`DcnV1Rule`]): the sample counts iff `0 <=
    /// floor(p) < size`, and on the last row (column) its fraction is 0 and the complement 1,
    /// formed as `low * 0` and `high * 0 + 1` there and `low * 1`, `high * 1 + 0` elsewhere
    /// (the same bits: the fractions are finite). `reach` is `inside`.
    #[inline(always)]
    fn clamped<T: Float, B: Backend>(b: B, base: V, d: V, size: V) -> Self
    where
        V: Lanes<T, B>,
    {
        let (zero, one) = (V::splat(b, T::ZERO), V::splat(b, T::ONE));
        let f = d.floor();
        let above = f.lt_select(zero.sub(base), zero, one);
        let below = f.lt_select(size.sub(base), one, zero);
        let before_last = f.lt_select(size.sub(one).sub(base), one, zero);
        // 1 on the last row (column), else 0.
        let last = below.sub(before_last);
        let keep = one.sub(last);
        let inside = above.mul(below);
        AxisRule {
            floor: base.add(f),
            low: d.sub(f).mul(keep),
            high: f.add(one).sub(d).mul(keep).add(last),
            inside,
            reach: inside,
        }
    }
}

/// The four corner weights `hy hx, hy lx, ly hx, ly lx`, as the scalar rule forms them.
#[inline(always)]
fn bilinear_weights<T: Float, B: Backend, V: Lanes<T, B>>(
    y: &AxisRule<V>,
    x: &AxisRule<V>,
) -> [V; 4] {
    [
        y.high.mul(x.high),
        y.high.mul(x.low),
        y.low.mul(x.high),
        y.low.mul(x.low),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector column build (on the backend of the CI cap) gives exactly the columns of
    /// the scalar table under every convention, all of them or the forward's, in `f32` and
    /// `f64`, on random, border, integer, tiny, far, infinite and NaN offsets, with and
    /// without a mask, on a ragged run.
    #[test]
    fn column_build_equals_the_scalar_table() {
        column_build_case::<f32>();
        column_build_case::<f64>();
    }

    fn column_build_case<T: Float>() {
        for convention in [Convention::Torchvision, Convention::Mmcv, Convention::DcnV1] {
            match convention {
                Convention::Torchvision => column_build_under::<T, TorchvisionRule>(),
                Convention::Mmcv => column_build_under::<T, MmcvRule>(),
                Convention::DcnV1 => column_build_under::<T, DcnV1Rule>(),
            }
        }
    }

    fn column_build_under<T: Float, R: Rule>() {
        let layout = PlaneLayout::for_convention(R::CONVENTION, 5, 7);
        let len = 203;
        let mut next = crate::kernels::test_stream(777);
        let specials = [
            f64::NAN,
            -1.0,
            5.0,
            40.0,
            -0.999,
            4.999,
            f64::INFINITY,
            0.0,
            -7.0,
            1e30,
            -4194304.0,
            4194303.5,
            1e-30,
            -1e-30,
            -0.0,
            -2.0,
            -3.0,
        ]
        .map(T::from_f64);
        let base_y: Vec<i32> = (0..len).map(|i| (i % 9) as i32 - 2).collect();
        let base_x: Vec<i32> = (0..len).map(|i| (i % 11) as i32 - 2).collect();
        let mut offsets = |every: usize| -> Vec<T> {
            (0..len)
                .map(|i| {
                    if i % every == 0 {
                        specials[i / every % specials.len()]
                    } else {
                        T::from_f64(f64::from(8.0 * next() - 4.0))
                    }
                })
                .collect()
        };
        let (dy, dx) = (offsets(5), offsets(7));
        let m: Vec<T> = (0..len).map(|_| T::from_f64(f64::from(next()))).collect();
        let as_t = |v: &[i32]| {
            v.iter()
                .map(|&b| T::from_f64(f64::from(b)))
                .collect::<Vec<T>>()
        };
        let (by, bx) = (as_t(&base_y), as_t(&base_x));
        for (mask, fields) in [None, Some(&m[..])]
            .into_iter()
            .flat_map(|m| [(m, Fields::All), (m, Fields::Forward)])
        {
            let plane0 = 3 * layout.len();
            let taps: Vec<Tap<T>> = (0..len)
                .map(|i| {
                    Tap::with_rule::<R>(
                        layout,
                        plane0,
                        (base_y[i] as isize + 1, dy[i]),
                        (base_x[i] as isize + 2, dx[i]),
                        mask.map_or(T::ONE, |m| m[i]),
                    )
                })
                .collect();
            let mut want = TapColumns::default();
            want.fill(&taps);
            let mut got = TapColumns::default();
            got.resize(len + 1);
            let run = ColumnRun {
                at: 1,
                base_y: &by,
                base_x: &bx,
                tap_y: T::ONE,
                tap_x: T::from_usize(2),
                dy: &dy,
                dx: &dx,
                m: mask,
                plane0,
            };
            fill_columns(&mut got, R::CONVENTION, layout, &run, fields);
            let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
            let at = format!("{:?} {fields:?} mask {}", R::CONVENTION, mask.is_some());
            assert_eq!(&got.scatter[1..], &want.scatter[..], "{at}");
            for c in 0..4 {
                assert_eq!(
                    bits(&got.weights[c][1..]),
                    bits(&want.weights[c]),
                    "w{c} {at}"
                );
            }
            if fields == Fields::All || mask.is_some() {
                assert_eq!(bits(&got.m[1..]), bits(&want.m), "{at}");
            }
            if fields == Fields::All {
                assert_eq!(&got.gather[1..], &want.gather[..], "{at}");
                assert_eq!(&got.inside[1..], &want.inside[..], "{at}");
                assert_eq!(bits(&got.ly[1..]), bits(&want.ly), "{at}");
                assert_eq!(bits(&got.lx[1..]), bits(&want.lx), "{at}");
            }
        }
    }
}
