//! Per-sample work that reads the input: the coordinate gradient (`grad_offset`), the mask
//! gradient (`grad_mask`) and the masked bilinear columns that `grad_weight` multiplies by
//! `grad_out`, all from the same four corner reads of the padded input planes.
//!
//! For channel `c`, tap `k`, pixel `p` with column gradient `g = gcol[c, k, p]`, mask `m` and
//! corner values `v00, v01, v10, v11` (border cells read 0):
//!
//! ```text
//! Wy = lx (v11 - v01) + (1 - lx)(v10 - v00)      dy[k, p] += (g m) Wy
//! Wx = ly (v11 - v10) + (1 - ly)(v01 - v00)      dx[k, p] += (g m) Wx
//! B  = w00 v00 + w01 v01 + w10 v10 + w11 v11     (0 outside the window)
//! mask[k, p] += g B                              cols[c, k, p] = m B
//! ```
//!
//! `Wy`, `Wx` are `sample::tests::coordinate_weights_in` evaluated on the padded plane (a unit
//! test pins the two bitwise); the sums over `c` run in ascending channel order.

use std::ops::Range;

use crate::float::Float;
use crate::kernels::col2im::{TileShape, CHUNK};
use crate::kernels::taps::Tap;

/// What [`sample_gradients`] produces; slices not wanted may be empty.
pub(crate) struct SampleOut<'a, T> {
    /// `[k][tile]` accumulators of the `dy` offset gradient.
    pub dy: &'a mut [T],
    /// `[k][tile]` accumulators of the `dx` offset gradient.
    pub dx: &'a mut [T],
    /// `[k][tile]` accumulators of the mask gradient.
    pub mask: &'a mut [T],
    /// `[(c - channels.start) * K + k][tile]` masked bilinear columns.
    pub cols: &'a mut [T],
}

/// Which outputs [`sample_gradients`] computes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleWant {
    /// `dy` and `dx`.
    pub offset: bool,
    /// `mask`.
    pub mask: bool,
    /// `cols`.
    pub cols: bool,
}

/// For the local channels `channels` of the padded input `planes`, accumulates the offset and
/// mask gradients and writes the columns, as in the module docs. `gcol` rows follow `cols`' and
/// are only read when the offset or mask gradient is wanted.
pub(crate) fn sample_gradients<T: Float>(
    planes: &[T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
    want: SampleWant,
    out: SampleOut<'_, T>,
) {
    macro_rules! go {
        ($o:literal, $m:literal, $c:literal) => {
            run::<T, $o, $m, $c>(planes, shape, taps, gcol, channels, out)
        };
    }
    match (want.offset, want.mask, want.cols) {
        (true, true, true) => go!(true, true, true),
        (true, true, false) => go!(true, true, false),
        (true, false, true) => go!(true, false, true),
        (true, false, false) => go!(true, false, false),
        (false, true, true) => go!(false, true, true),
        (false, true, false) => go!(false, true, false),
        (false, false, true) => go!(false, false, true),
        (false, false, false) => {}
    }
}

/// `(Wy, Wx)` from the corner values (the formula of the module docs).
#[inline(always)]
fn coordinate_weights<T: Float>(ly: T, lx: T, [v00, v01, v10, v11]: [T; 4]) -> (T, T) {
    let wy = lx * (v11 - v01) + (T::ONE - lx) * (v10 - v00);
    let wx = ly * (v11 - v10) + (T::ONE - ly) * (v01 - v00);
    (wy, wx)
}

/// [`run_body`] compiled for the best instruction set (VEX encoding, `floor` inline; the same
/// IEEE operations, so bitwise the same results).
#[inline(never)]
fn run<T: Float, const OFFSET: bool, const MASK: bool, const COLS: bool>(
    planes: &[T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
    out: SampleOut<'_, T>,
) {
    use crate::kernels::backend::isa;
    #[cfg(target_arch = "x86_64")]
    use crate::kernels::backend::Isa;
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA (or AVX-512, a superset here) were detected.
        Isa::Avx2 | Isa::Avx512 => unsafe {
            run_avx2::<T, OFFSET, MASK, COLS>(planes, shape, taps, gcol, channels, out)
        },
        _ => run_body::<T, OFFSET, MASK, COLS>(planes, shape, taps, gcol, channels, out),
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<T: Float, const OFFSET: bool, const MASK: bool, const COLS: bool>(
    planes: &[T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
    out: SampleOut<'_, T>,
) {
    run_body::<T, OFFSET, MASK, COLS>(planes, shape, taps, gcol, channels, out)
}

#[inline(always)]
fn run_body<T: Float, const OFFSET: bool, const MASK: bool, const COLS: bool>(
    planes: &[T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
    out: SampleOut<'_, T>,
) {
    let TileShape {
        channel_stride,
        pitch,
        tile,
        taps: k_taps,
        dense,
    } = shape;
    let rows = channels.len() * k_taps * tile;
    debug_assert_eq!(taps.len(), k_taps * tile);
    debug_assert!(!(OFFSET || MASK) || gcol.len() >= rows);
    debug_assert!(!COLS || out.cols.len() >= rows);
    debug_assert!(!OFFSET || (out.dy.len() >= k_taps * tile && out.dx.len() >= k_taps * tile));
    debug_assert!(!MASK || out.mask.len() >= k_taps * tile);
    // One pass over the table (1 / channels of the work) proves every access in bounds.
    let max_base = taps.iter().map(|t| t.gather).max().unwrap_or(0);
    let reach = max_base + pitch + 2;
    if channels.is_empty() {
        return;
    }
    assert!(
        (channels.end - 1) * channel_stride + reach <= planes.len(),
        "planes too short"
    );
    let (first, count) = (channels.start, channels.len());
    let SampleOut { dy, dx, mask, cols } = out;
    if dense && COLS && !OFFSET && !MASK {
        // Dense columns: the sample's cell itself (a border zero in the padding), im2col; the
        // table in chunks whose cells every channel reuses (as in `col2im::scatter_dense`).
        let mut cells = [0usize; CHUNK];
        for k in 0..k_taps {
            for q0 in (0..tile).step_by(CHUNK) {
                let n = CHUNK.min(tile - q0);
                for (d, e) in cells.iter_mut().zip(&taps[k * tile + q0..][..n]) {
                    *d = e.gather;
                }
                for ci in 0..count {
                    let plane = &planes[(first + ci) * channel_stride..][..reach];
                    let row = &mut cols[(ci * k_taps + k) * tile + q0..][..n];
                    for (d, &b) in row.iter_mut().zip(&cells[..n]) {
                        *d = plane[b];
                    }
                }
            }
        }
        return;
    }
    // Four channels per table entry: the entry, the accumulators and the per-entry arithmetic
    // are shared, and the four channels' terms are still added in ascending channel order.
    let mut ci = 0;
    while ci < count {
        let lanes = if count - ci >= LANES { LANES } else { 1 };
        let planes_l: [&[T]; LANES] = std::array::from_fn(|l| {
            let c = first + ci + l.min(lanes - 1);
            &planes[c * channel_stride..][..reach]
        });
        for k in 0..k_taps {
            let tk = &taps[k * tile..][..tile];
            let r0: [usize; LANES] =
                std::array::from_fn(|l| ((ci + l.min(lanes - 1)) * k_taps + k) * tile);
            for (q, e) in tk.iter().enumerate() {
                let at = k * tile + q;
                let (mut sy, mut sx, mut sm) = if OFFSET || MASK {
                    (
                        if OFFSET { dy[at] } else { T::ZERO },
                        if OFFSET { dx[at] } else { T::ZERO },
                        if MASK { mask[at] } else { T::ZERO },
                    )
                } else {
                    (T::ZERO, T::ZERO, T::ZERO)
                };
                for l in 0..lanes {
                    let v = corners(planes_l[l], e.gather, pitch);
                    let bil = if e.inside {
                        e.weights[0] * v[0]
                            + e.weights[1] * v[1]
                            + e.weights[2] * v[2]
                            + e.weights[3] * v[3]
                    } else {
                        T::ZERO
                    };
                    if OFFSET || MASK {
                        let g = gcol[r0[l] + q];
                        if OFFSET {
                            let (wy, wx) = coordinate_weights(e.ly, e.lx, v);
                            let gm = g * e.m;
                            sy += gm * wy;
                            sx += gm * wx;
                        }
                        if MASK {
                            sm += g * bil;
                        }
                    }
                    if COLS {
                        cols[r0[l] + q] = e.m * bil;
                    }
                }
                if OFFSET {
                    dy[at] = sy;
                    dx[at] = sx;
                }
                if MASK {
                    mask[at] = sm;
                }
            }
        }
        ci += lanes;
    }
}

/// Channels processed per table entry.
const LANES: usize = 4;

/// The four corner values of the cell at `b`.
#[inline(always)]
fn corners<T: Float>(plane: &[T], b: usize, pitch: usize) -> [T; 4] {
    debug_assert!(b + pitch + 1 < plane.len());
    // SAFETY: every plane slice is `reach = max_base + pitch + 2` long and b <= max_base (the
    // bases come from the same table), so b + pitch + 1 < plane.len().
    unsafe {
        [
            *plane.get_unchecked(b),
            *plane.get_unchecked(b + 1),
            *plane.get_unchecked(b + pitch),
            *plane.get_unchecked(b + pitch + 1),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convention::Convention;
    use crate::kernels::taps::{DcnV1Rule, MmcvRule, PlaneLayout, Rule, TorchvisionRule};
    use crate::sample;

    /// Under rule `R`, the padded-plane evaluation equals `sample::tests::coordinate_weights_in` bit
    /// for bit, and the bilinear value `sample::locate_in`'s, including integer positions on
    /// the border, outside positions and NaN.
    fn coordinate_weights_match_for<R: Rule>() {
        let conv = R::CONVENTION;
        let (h, w) = (3usize, 4usize);
        let l = PlaneLayout::for_convention(conv, h, w);
        let image: Vec<f64> = (0..h * w).map(|i| ((i * 7919) % 13) as f64 - 6.5).collect();
        let plane = sample::tests::Plane {
            values: &image,
            h,
            w,
        };
        let mut padded = vec![0.0; l.len()];
        for r in 0..h {
            for s in 0..w {
                padded[l.index(r as isize, s as isize)] = image[r * w + s];
            }
        }
        l.replicate_border(&mut padded);
        let offsets = [
            -2.5, -1.5, -1.0, -0.999, -0.5, 0.0, 0.25, 1.0, 2.0, 2.5, 2.999, 3.0, 3.5, 4.0, 9.0,
        ];
        for &dy in &offsets {
            for &dx in offsets.iter().chain([f64::NAN, f64::INFINITY, 1e30].iter()) {
                let t = Tap::with_rule::<R>(l, 0, (0, dy), (0, dx), 1.0);
                let cell = &padded[t.gather..];
                let v = [cell[0], cell[1], cell[l.pitch()], cell[l.pitch() + 1]];
                let got = coordinate_weights(t.ly, t.lx, v);
                let want = sample::tests::coordinate_weights_in(conv, 0, dy, 0, dx, plane);
                let same =
                    |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                assert!(
                    same(got.0, want.0) && same(got.1, want.1),
                    "{conv:?} ({dy}, {dx}): {got:?} vs {want:?}"
                );
                let bil = if t.inside {
                    t.weights[0] * v[0]
                        + t.weights[1] * v[1]
                        + t.weights[2] * v[2]
                        + t.weights[3] * v[3]
                } else {
                    0.0
                };
                let want_b = match sample::locate_in(conv, 0, dy, 0, dx, h, w) {
                    sample::Sample::Inside(c) => sample::tests::interpolate(&c, &image),
                    sample::Sample::Outside => 0.0,
                    sample::Sample::Nan => f64::NAN,
                };
                assert!(
                    same(bil, want_b),
                    "{conv:?} B({dy}, {dx}): {bil} vs {want_b}"
                );
            }
        }
    }

    #[test]
    fn coordinate_weights_match_the_sampling_rule() {
        coordinate_weights_match_for::<TorchvisionRule>();
        coordinate_weights_match_for::<MmcvRule>();
        coordinate_weights_match_for::<DcnV1Rule>();
        assert_eq!(DcnV1Rule::CONVENTION, Convention::DcnV1);
    }
}
