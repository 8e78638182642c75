//! The deformable backward's per-sample work on pixel-major planes, a vector of channels at a
//! time, for every backend and element type: col2im into `grad_input`, and the offset gradient,
//! mask gradient and masked columns, fused so that each table entry and column-gradient value
//! is read once. For channel `c`, tap `k`, pixel `p` with column gradient `g = gcol[c, k, p]`,
//! mask `m`, corner weights `w` and corner values `v00, v01, v10, v11` (border cells read 0):
//!
//! ```text
//! grad_input[c, corner] += (g m) w_corner
//! Wy = lx (v11 - v01) + (1 - lx)(v10 - v00)      dy[k, p] += (g m) Wy
//! Wx = ly (v11 - v10) + (1 - ly)(v01 - v00)      dx[k, p] += (g m) Wx
//! B  = ((w00 v00 + w01 v01) + w10 v10) + w11 v11 (0 outside the window)
//! mask[k, p] += g B                              cols[c, k, p] = m B
//! ```
//!
//! `Wy`, `Wx` on the table's cells are the sampling rule's coordinate weights (a unit test in
//! `taps` pins the two bitwise for every convention).
//!
//! Planes are pixel-major, `[cell][channels]` over the padded cells of the task's
//! [`super::taps::PlaneLayout`] (a tap's base already includes its image's plane), so one
//! corner of `N` channels is one vector load, or one vector read-modify-write for the
//! scatter. `gcol` and `cols` are pixel-major too, `[(q K + k) * C_seg + c]`: the driver's
//! GEMMs produce and consume them in that orientation, so no transposes are needed.
//!
//! Per (channel, sample) the IEEE operations are those above (plain multiplies and adds, no
//! fused multiply-add), so `cols` is bitwise the scalar definition. Two orders differ from a
//! plain loop over channels and samples, both fixed by the shape and the backend alone (so results stay
//! independent of the thread count and of which gradients are asked for):
//! - a sample's sums over channels (`dy`, `dx`, `mask`) are `N` running lane sums over the
//!   channel blocks, reduced by a fixed halving tree, instead of one ascending chain;
//! - each grad_input cell receives its additions ordered by (pixel, tap) rather than (tap,
//!   pixel): a pixel's taps touch the same few input rows, and `gcol` / `cols` stream in
//!   memory order.
//!
//! Loop order: pixels, then taps, then channel blocks, so that two read-modify-writes of one
//! cell (neighbouring taps and pixels share corners) are a whole channel loop apart and never
//! wait on each other. On AVX-512, `f32` segments of at most 8 channels (W1) take [`pairs`],
//! two samples a vector.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod pairs;

use crate::float::Float;
use crate::kernels::backend::{dispatch, Backend, Element, Isa, Lanes, WithBackend};
use crate::kernels::columns::TapColumns;

/// Where the pass accumulates the offset and mask gradients and writes the columns; slices
/// not wanted may be empty.
pub(crate) struct SampleOut<'a, T> {
    /// `[k][tile]` accumulators of the `dy` offset gradient.
    pub dy: &'a mut [T],
    /// `[k][tile]` accumulators of the `dx` offset gradient.
    pub dx: &'a mut [T],
    /// `[k][tile]` accumulators of the mask gradient.
    pub mask: &'a mut [T],
    /// `[pixel][k][channel]` masked bilinear columns.
    pub cols: &'a mut [T],
}

/// Geometry of one pass over a tile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CellShape {
    /// Channels per cell: the planes' channel count and the stride between cells.
    pub channels: usize,
    /// Cells per padded row.
    pub pitch: usize,
    /// Columns (pixels) of the tile.
    pub tile: usize,
    /// Kernel taps `K`.
    pub taps: usize,
}

/// Which outputs a pass produces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outputs {
    /// Scatter `gcol * m` into the grad_input planes.
    pub scatter: bool,
    /// Accumulate the `dy`, `dx` offset gradients.
    pub offset: bool,
    /// Accumulate the mask gradient.
    pub mask: bool,
    /// Write the masked bilinear columns.
    pub cols: bool,
}

/// The task's pixel-major planes: the input read, the `grad_input` scattered into.
pub(crate) struct Planes<'a, T> {
    /// Input planes, `[cell][channels]`.
    pub input: &'a [T],
    /// `grad_input` planes, laid out as `input`.
    pub grad: &'a mut [T],
}

/// One pass: what [`run`] hands to the backend.
struct Pass<'a, 'o, T> {
    planes: Planes<'a, T>,
    shape: CellShape,
    table: &'a TapColumns<T>,
    gcol: &'a [T],
    channels: Range<usize>,
    want: Outputs,
    out: SampleOut<'o, T>,
}

/// For the channels `channels` (indices inside a cell) of one segment: scatters `gcol`
/// (`[(q K + k) * channels.len() + c - channels.start]`) into `grad`, accumulates the offset
/// and mask gradients into `out.dy`, `out.dx`, `out.mask` (`[k][tile]`) and writes `out.cols`
/// (laid out as `gcol`), as [`Outputs`] asks, reading corners of `input`, on the backend of
/// [`crate::kernels::backend::isa`]. Slices not needed may be empty.
///
/// # Panics
/// If a table base (up to `max_base` / `max_scatter`) reaches past the planes, or a slice is
/// shorter than the pass needs.
pub(crate) fn run<T: Float>(
    planes: Planes<'_, T>,
    shape: CellShape,
    table: &TapColumns<T>,
    gcol: &[T],
    channels: Range<usize>,
    want: Outputs,
    out: SampleOut<'_, T>,
) {
    dispatch(Pass {
        planes,
        shape,
        table,
        gcol,
        channels,
        want,
        out,
    })
}

impl<T: Float> WithBackend for Pass<'_, '_, T> {
    type Output = ();

    #[inline(always)]
    fn run<B: Backend>(self, b: B) {
        macro_rules! go {
            ($s:literal, $o:literal, $m:literal, $c:literal) => {
                pass::<B, T, $s, $o, $m, $c>(b, self)
            };
        }
        let want = self.want;
        match (want.scatter, want.offset, want.mask, want.cols) {
            (false, false, false, false) => {}
            (false, false, false, true) => go!(false, false, false, true),
            (false, false, true, false) => go!(false, false, true, false),
            (false, false, true, true) => go!(false, false, true, true),
            (false, true, false, false) => go!(false, true, false, false),
            (false, true, false, true) => go!(false, true, false, true),
            (false, true, true, false) => go!(false, true, true, false),
            (false, true, true, true) => go!(false, true, true, true),
            (true, false, false, false) => go!(true, false, false, false),
            (true, false, false, true) => go!(true, false, false, true),
            (true, false, true, false) => go!(true, false, true, false),
            (true, false, true, true) => go!(true, false, true, true),
            (true, true, false, false) => go!(true, true, false, false),
            (true, true, false, true) => go!(true, true, false, true),
            (true, true, true, false) => go!(true, true, true, false),
            (true, true, true, true) => go!(true, true, true, true),
        }
    }
}

/// [`run`] for one combination of outputs on backend `b`.
#[inline(always)]
fn pass<
    B: Backend,
    T: Float,
    const SCATTER: bool,
    const OFFSET: bool,
    const MASK: bool,
    const COLS: bool,
>(
    b: B,
    op: Pass<'_, '_, T>,
) {
    let Pass {
        planes: Planes { input, grad },
        shape,
        table,
        gcol,
        channels,
        want: _,
        out,
    } = op;
    let n = <T::V<B> as Lanes<T, B>>::N;
    let CellShape {
        channels: cpc,
        pitch,
        tile,
        taps: k_taps,
    } = shape;
    let need_g = SCATTER || OFFSET || MASK;
    let need_in = OFFSET || MASK || COLS;
    let entries = k_taps * tile;
    let count = channels.len();
    assert!(table.len() == entries && table.scatter.len() == entries);
    assert!(table.m.len() == entries && table.inside.len() == entries);
    assert!(table.ly.len() == entries && table.lx.len() == entries);
    assert!(table.weights.iter().all(|w| w.len() == entries));
    assert!(channels.end <= cpc, "segment channels outside the cell");
    assert!(!need_g || gcol.len() >= count * entries);
    assert!(!COLS || out.cols.len() >= count * entries);
    assert!(!OFFSET || (out.dy.len() >= entries && out.dx.len() >= entries));
    assert!(!MASK || out.mask.len() >= entries);
    assert!(n <= 16);
    if count == 0 || entries == 0 {
        return;
    }
    // Every corner cell of every entry, `base + {0, 1, pitch, pitch + 1}`, ends inside.
    let cells_needed = |max: usize| (max + pitch + 2).saturating_mul(cpc);
    assert!(!need_in || cells_needed(table.max_base) <= input.len());
    assert!(!SCATTER || cells_needed(table.max_scatter) <= grad.len());
    #[cfg(target_arch = "x86_64")]
    if B::ISA == crate::kernels::backend::Isa::Avx512 && count <= 8 {
        let (input, grad, gcol, table) = (
            T::as_f32(input),
            T::as_f32_mut(grad),
            T::as_f32(gcol),
            table.as_f32(),
        );
        if let (Some(input), Some(grad), Some(gcol), Some(table)) = (input, grad, gcol, table) {
            let SampleOut { dy, dx, mask, cols } = out;
            let out = (
                T::as_f32_mut(dy),
                T::as_f32_mut(dx),
                T::as_f32_mut(mask),
                T::as_f32_mut(cols),
            );
            let (Some(dy), Some(dx), Some(mask), Some(cols)) = out else {
                unreachable!("T is f32");
            };
            let out = SampleOut { dy, dx, mask, cols };
            // SAFETY: a backend value of ISA Avx512 exists only where AVX-512F was detected;
            // the bounds `pairs::pass` relies on are asserted above.
            unsafe {
                if count == 8 {
                    pairs::pass::<SCATTER, OFFSET, MASK, COLS, true>(
                        input, grad, shape, table, gcol, channels, out,
                    )
                } else {
                    pairs::pass::<SCATTER, OFFSET, MASK, COLS, false>(
                        input, grad, shape, table, gcol, channels, out,
                    )
                }
            };
            return;
        }
    }
    let SampleOut { dy, dx, mask, cols } = out;
    type V<B, T> = <T as Element>::V<B>;
    let corner = [0, cpc, pitch * cpc, (pitch + 1) * cpc];
    let zero = V::<B, T>::splat(b, T::ZERO);
    let one = V::<B, T>::splat(b, T::ONE);
    // `len` values at `at` of `s` as a vector, zeros after (`len <= n`).
    macro_rules! load {
        ($s:expr, $at:expr, $len:expr) => {{
            let (at, len) = ($at, $len);
            debug_assert!(at + len <= $s.len());
            // SAFETY: every call site's range lies inside its slice (see there).
            let src = unsafe { $s.get_unchecked(at..at + len) };
            if len == n {
                V::<B, T>::load(b, src)
            } else {
                V::<B, T>::load_partial(b, src)
            }
        }};
    }
    macro_rules! store {
        ($v:expr, $s:expr, $at:expr, $len:expr) => {{
            let (v, at, len) = ($v, $at, $len);
            debug_assert!(at + len <= $s.len());
            // SAFETY: every call site's range lies inside its slice (see there).
            let dst = unsafe { $s.get_unchecked_mut(at..at + len) };
            if len == n {
                v.store(dst)
            } else {
                v.store_partial(dst)
            }
        }};
    }

    // The channel sums of the current `N` pixels' samples, `sums[(s * K + k) * N + p]` for
    // sum `s` (dy, dx, mask), tap `k` and pixel `q0 + p`, reduced `N` samples at a time by
    // [`add_lane_sums`]. Entries past the current pixels hold earlier values; their lanes are
    // never stored.
    let mut sums = vec![zero; if OFFSET || MASK { 3 * k_taps * n } else { 0 }];
    for q0 in (0..tile).step_by(n) {
        let pixels = n.min(tile - q0);
        for p in 0..pixels {
            let q = q0 + p;
            for k in 0..k_taps {
                let e = k * tile + q;
                // This sample's row of `gcol` and `cols`.
                let row = (q * k_taps + k) * count;
                let m = V::<B, T>::splat(b, table.m[e]);
                // Loops, not `std::array::from_fn`: a closure left out of line loses the
                // backend's features (see `load!`).
                let mut w = [zero; 4];
                for (j, wj) in w.iter_mut().enumerate() {
                    *wj = V::<B, T>::splat(b, table.weights[j][e]);
                }
                let (ly, lx) = (
                    V::<B, T>::splat(b, table.ly[e]),
                    V::<B, T>::splat(b, table.lx[e]),
                );
                let inside = table.inside[e] != 0;
                let gather = table.gather[e] as usize * cpc + channels.start;
                let scatter = table.scatter[e] as usize * cpc + channels.start;
                debug_assert!(table.gather[e] as usize <= table.max_base);
                debug_assert!(table.scatter[e] as usize <= table.max_scatter);
                let (mut sy, mut sx, mut sm) = (zero, zero, zero);
                // One channel block `o .. o + lanes`. A macro, not a closure (which, left out of
                // line, loses the backend's features), so that the whole blocks below are
                // compiled with `lanes == N` known: plain loads and stores, no lane masks.
                macro_rules! block {
                    ($o:expr, $lanes:expr) => {{
                        let (o, lanes) = ($o, $lanes);
                        // Rows `row .. row + count` of gcol and cols lie in them (asserted).
                        // Lanes past the segment read and write nothing and hold zeros, also in
                        // `m`, `ly` and `lx`, so that they add exactly zero to the sums below
                        // even where those are infinite or NaN.
                        let (m, ly, lx) = if lanes == n {
                            (m, ly, lx)
                        } else {
                            // Macro, not closure: a closure left out of line loses the backend's
                            // features.
                            macro_rules! live {
                                ($x:expr) => {
                                    V::<B, T>::load_partial(b, &[$x; 16][..lanes])
                                };
                            }
                            (live!(table.m[e]), live!(table.ly[e]), live!(table.lx[e]))
                        };
                        let g = if need_g {
                            load!(gcol, row + o, lanes)
                        } else {
                            zero
                        };
                        let gm = g.mul(m);
                        if need_in {
                            // The entry's gather base is at most max_base, so its corner cells end
                            // inside `input` (asserted above), and channels.end <= cpc.
                            let mut v = [zero; 4];
                            for (j, vj) in v.iter_mut().enumerate() {
                                *vj = load!(input, gather + corner[j] + o, lanes);
                            }
                            let bil = bilinear::<B, T>(&w, &v);
                            let bil = if inside { bil } else { zero };
                            if COLS {
                                store!(m.mul(bil), cols, row + o, lanes);
                            }
                            if OFFSET {
                                let (wy, wx) = corner_derivatives::<B, T>(&v, ly, lx, one);
                                sy = sy.add(gm.mul(wy));
                                sx = sx.add(gm.mul(wx));
                            }
                            if MASK {
                                sm = sm.add(g.mul(bil));
                            }
                        }
                        if SCATTER {
                            // As for the gather, with max_scatter and `grad`; this task owns the
                            // planes. Neighbouring samples update the same cells soon after each
                            // other, so the next load is forwarded from this store.
                            for (j, &d) in corner.iter().enumerate() {
                                let at = scatter + d + o;
                                let new = load!(grad, at, lanes).add(gm.mul(w[j]));
                                store!(new, grad, at, lanes);
                            }
                        }
                    }};
                }
                let whole = count / n * n;
                for o in (0..whole).step_by(n) {
                    block!(o, n);
                }
                if whole < count {
                    block!(whole, count - whole);
                }
                if OFFSET {
                    sums[k * n + p] = sy;
                    sums[(k_taps + k) * n + p] = sx;
                }
                if MASK {
                    sums[(2 * k_taps + k) * n + p] = sm;
                }
            }
        }
        for k in 0..k_taps {
            let e = k * tile + q0..k * tile + q0 + pixels;
            if OFFSET {
                add_lane_sums::<B, T>(b, &mut sums[k * n..][..n], &mut dy[e.clone()]);
                add_lane_sums::<B, T>(b, &mut sums[(k_taps + k) * n..][..n], &mut dx[e.clone()]);
            }
            if MASK {
                add_lane_sums::<B, T>(b, &mut sums[(2 * k_taps + k) * n..][..n], &mut mask[e]);
            }
        }
    }
}

/// Adds to `dst[p]` the sum of the lanes of `sums[p]` (`p < dst.len() <= N`), each by the
/// halving tree `(i, i + N/2)`, ..., `(i, i + 1)` (the order of AVX-512's `reduce_add`):
/// after a transpose, lane `p` of `sums[i] + sums[i + N/2]` is the first step of sample
/// `p`'s tree, so `N` samples take one transpose and `N - 1` vector adds instead of `N`
/// horizontal reductions. Overwrites `sums`.
///
/// W1 `f32` full backward, AMD Zen 3, 1 thread, min / median of 8 alternating rounds: AVX2
/// 3.27 / 3.45 -> 3.17 / 3.24 ms. The portable backend (`wide`'s `f32x8` on SSE2) lost with
/// the transpose (3.50 / 3.58 -> 4.04 / 4.34 ms) and keeps one tree per sample.
#[inline(always)]
fn add_lane_sums<B: Backend, T: Float>(b: B, sums: &mut [T::V<B>], dst: &mut [T]) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    assert!(sums.len() == n && dst.len() <= n);
    if matches!(B::ISA, Isa::Portable | Isa::Scalar) {
        for (v, d) in sums.iter().zip(dst) {
            let mut a = [T::ZERO; 16];
            v.store(&mut a[..n]);
            let mut half = n / 2;
            while half > 0 {
                for i in 0..half {
                    a[i] += a[i + half];
                }
                half /= 2;
            }
            *d += a[0];
        }
        return;
    }
    T::V::<B>::transpose(b, sums);
    let mut half = n / 2;
    while half > 0 {
        for i in 0..half {
            sums[i] = sums[i].add(sums[i + half]);
        }
        half /= 2;
    }
    if dst.len() == n {
        T::V::<B>::load(b, dst).add(sums[0]).store(dst);
    } else {
        T::V::<B>::load_partial(b, dst)
            .add(sums[0])
            .store_partial(dst);
    }
}

/// `((w0 v0 + w1 v1) + w2 v2) + w3 v3`: the bilinear value of corners `v` (order `(y0,x0),
/// (y0,x1), (y1,x0), (y1,x1)`), in the scalar definition's order.
#[inline(always)]
fn bilinear<B: Backend, T: Element>(w: &[T::V<B>; 4], v: &[T::V<B>; 4]) -> T::V<B> {
    w[0].mul(v[0])
        .add(w[1].mul(v[1]))
        .add(w[2].mul(v[2]))
        .add(w[3].mul(v[3]))
}

/// The bilinear value's derivatives along y and x at fractions `(ly, lx)`:
/// `wy = lx (v3 - v1) + (1 - lx)(v2 - v0)`, `wx = ly (v3 - v2) + (1 - ly)(v1 - v0)`.
#[inline(always)]
fn corner_derivatives<B: Backend, T: Element>(
    v: &[T::V<B>; 4],
    ly: T::V<B>,
    lx: T::V<B>,
    one: T::V<B>,
) -> (T::V<B>, T::V<B>) {
    let wy = lx.mul(v[3].sub(v[1])).add(one.sub(lx).mul(v[2].sub(v[0])));
    let wx = ly.mul(v[3].sub(v[2])).add(one.sub(ly).mul(v[1].sub(v[0])));
    (wy, wx)
}

#[cfg(test)]
mod tests;
