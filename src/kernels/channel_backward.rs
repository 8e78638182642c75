//! The backward's per-sample work for `f32` on AVX-512, sixteen channels per vector, on
//! pixel-major planes: the col2im scatter of [`super::col2im`] and the offset, mask and column
//! outputs of [`super::coord`], fused so that each table entry and column-gradient value is
//! read once.
//!
//! Planes are pixel-major, `[cell][channels]` over the padded cells of the task's
//! [`super::taps::PlaneLayout`] (a tap's base already includes its image's plane), so one
//! corner of sixteen channels is one vector load, or one vector read-modify-write for the
//! scatter. `gcol` and `cols` are pixel-major too, `[(q K + k) * C_seg + c]`: the driver's
//! GEMMs produce and consume them in that orientation, so no transposes are needed.
//!
//! Per (channel, sample) the IEEE operations are those of `coord` and `col2im` (plain
//! multiplies and adds, no fused multiply-add), so `cols` is bitwise the scalar definition.
//! Two things differ, both fixed by the shape alone (so results stay independent of the thread
//! count and of which gradients are asked for):
//! - a sample's sums over channels (`dy`, `dx`, `mask`) are sixteen running lane sums over the
//!   channel blocks, reduced by a fixed tree, instead of one ascending chain;
//! - each grad_input cell receives its additions ordered by (pixel, tap) rather than (tap,
//!   pixel): a pixel's taps touch the same few input rows, and `gcol` / `cols` stream in
//!   memory order.
//!
//! Loop order: pixels, then taps, then channel blocks, so that two read-modify-writes of one
//! cell (neighbouring taps and pixels share corners) are a whole channel loop apart and never
//! wait on each other.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod pairs;

use crate::kernels::columns::TapColumns;
use crate::kernels::coord::SampleOut;

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
pub(crate) struct Planes<'a> {
    /// Input planes, `[cell][channels]`.
    pub input: &'a [f32],
    /// `grad_input` planes, laid out as `input`.
    pub grad: &'a mut [f32],
}

/// For the channels `channels` (indices inside a cell) of one segment: scatters `gcol`
/// (`[(q K + k) * channels.len() + c - channels.start]`) into `grad`, accumulates the offset
/// and mask gradients into `out.dy`, `out.dx`, `out.mask` (`[k][tile]`) and writes `out.cols`
/// (laid out as `gcol`), as [`Outputs`] asks, reading corners of `input`. Slices not needed
/// may be empty.
///
/// # Safety
/// The CPU must support AVX-512F.
///
/// # Panics
/// If a table base (up to `max_base` / `max_scatter`) reaches past the planes, or a slice is
/// shorter than the pass needs.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn run(
    planes: Planes<'_>,
    shape: CellShape,
    table: &TapColumns<f32>,
    gcol: &[f32],
    channels: Range<usize>,
    want: Outputs,
    out: SampleOut<'_, f32>,
) {
    let Planes { input, grad } = planes;
    macro_rules! go {
        ($s:literal, $o:literal, $m:literal, $c:literal) => {
            // SAFETY: the caller's contract (AVX-512F).
            unsafe { pass::<$s, $o, $m, $c>(input, grad, shape, table, gcol, channels, out) }
        };
    }
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

/// Channels per vector.
const LANES: usize = 16;

/// [`run`] for one combination of outputs.
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pass<const SCATTER: bool, const OFFSET: bool, const MASK: bool, const COLS: bool>(
    input: &[f32],
    grad: &mut [f32],
    shape: CellShape,
    table: &TapColumns<f32>,
    gcol: &[f32],
    channels: Range<usize>,
    out: SampleOut<'_, f32>,
) {
    use crate::kernels::transpose::first_lanes;
    use std::arch::x86_64::*;

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
    let SampleOut { dy, dx, mask, cols } = out;
    assert!(table.len() == entries && table.scatter.len() == entries);
    assert!(table.m.len() == entries && table.inside.len() == entries);
    assert!(table.ly.len() == entries && table.lx.len() == entries);
    assert!(table.weights.iter().all(|w| w.len() == entries));
    assert!(channels.end <= cpc, "segment channels outside the cell");
    assert!(!need_g || gcol.len() >= count * entries);
    assert!(!COLS || cols.len() >= count * entries);
    assert!(!OFFSET || (dy.len() >= entries && dx.len() >= entries));
    assert!(!MASK || mask.len() >= entries);
    if count == 0 || entries == 0 {
        return;
    }
    // Every corner cell of every entry, `base + {0, 1, pitch, pitch + 1}`, ends inside.
    let cells_needed = |max: usize| (max + pitch + 2).saturating_mul(cpc);
    assert!(!need_in || cells_needed(table.max_base) <= input.len());
    assert!(!SCATTER || cells_needed(table.max_scatter) <= grad.len());
    if count <= 8 {
        let out = SampleOut { dy, dx, mask, cols };
        // SAFETY: AVX-512F (this function's contract); the bounds asserted above.
        unsafe {
            pairs::pass::<SCATTER, OFFSET, MASK, COLS>(
                input, grad, shape, table, gcol, channels, out,
            )
        };
        return;
    }
    let corner = [0, cpc, pitch * cpc, (pitch + 1) * cpc];
    let zero = _mm512_setzero_ps();
    let (input_at, grad_at) = (input.as_ptr(), grad.as_mut_ptr());

    for q in 0..tile {
        for k in 0..k_taps {
            let e = k * tile + q;
            // This sample's row of `gcol` and `cols`.
            let row = (q * k_taps + k) * count;
            let m = _mm512_set1_ps(table.m[e]);
            let w: [__m512; 4] = std::array::from_fn(|j| _mm512_set1_ps(table.weights[j][e]));
            let (ly, lx) = (_mm512_set1_ps(table.ly[e]), _mm512_set1_ps(table.lx[e]));
            let inside: __mmask16 = if table.inside[e] != 0 { 0xFFFF } else { 0 };
            let gather = table.gather[e] as usize * cpc + channels.start;
            let scatter = table.scatter[e] as usize * cpc + channels.start;
            debug_assert!(table.gather[e] as usize <= table.max_base);
            debug_assert!(table.scatter[e] as usize <= table.max_scatter);
            let (mut sy, mut sx, mut sm) = (zero, zero, zero);
            for o in (0..count).step_by(LANES) {
                let cm = first_lanes(LANES.min(count - o));
                let g = if need_g {
                    // SAFETY: row + count <= count * entries <= gcol.len() (asserted).
                    unsafe { _mm512_maskz_loadu_ps(cm, gcol.as_ptr().add(row + o)) }
                } else {
                    zero
                };
                let gm = _mm512_mul_ps(g, m);
                if need_in {
                    // SAFETY: the entry's gather base is at most max_base, so its corner
                    // cells end inside `input` (asserted above); lanes past the segment's
                    // channels are masked off (channels.end <= cpc).
                    let v: [__m512; 4] = std::array::from_fn(|j| unsafe {
                        _mm512_maskz_loadu_ps(cm, input_at.add(gather + corner[j] + o))
                    });
                    let bil = bilinear(&w, &v);
                    let bil = _mm512_maskz_mov_ps(inside, bil);
                    if COLS {
                        // SAFETY: row + count <= cols.len() (asserted).
                        unsafe {
                            let at = cols.as_mut_ptr().add(row + o);
                            _mm512_mask_storeu_ps(at, cm, _mm512_mul_ps(m, bil));
                        }
                    }
                    if OFFSET {
                        let (wy, wx) = corner_derivatives(&v, ly, lx);
                        sy = _mm512_mask_add_ps(sy, cm, sy, _mm512_mul_ps(gm, wy));
                        sx = _mm512_mask_add_ps(sx, cm, sx, _mm512_mul_ps(gm, wx));
                    }
                    if MASK {
                        sm = _mm512_mask_add_ps(sm, cm, sm, _mm512_mul_ps(g, bil));
                    }
                }
                if SCATTER {
                    // Neighbouring samples update the same cells soon after each other, so the
                    // next load must be forwarded from this store: full-width (or, for a block
                    // of exactly 8 channels, half-width) stores rather than masked ones.
                    // Measured (W1 grad_input, 1 thread): 1.82 -> 0.67 ms against masked stores.
                    let lanes = count - o;
                    for (j, &d) in corner.iter().enumerate() {
                        // SAFETY: as for the gather, with max_scatter and `grad`; this task
                        // owns the planes. The unmasked forms touch exactly the block's
                        // `min(lanes, 16)` channels.
                        unsafe {
                            let cell = grad_at.add(scatter + d + o);
                            let add = _mm512_mul_ps(gm, w[j]);
                            if lanes >= LANES {
                                let new = _mm512_add_ps(_mm512_loadu_ps(cell), add);
                                _mm512_storeu_ps(cell, new);
                            } else if lanes == 8 {
                                let add = _mm512_castps512_ps256(add);
                                _mm256_storeu_ps(cell, _mm256_add_ps(_mm256_loadu_ps(cell), add));
                            } else {
                                let new = _mm512_add_ps(_mm512_maskz_loadu_ps(cm, cell), add);
                                _mm512_mask_storeu_ps(cell, cm, new);
                            }
                        }
                    }
                }
            }
            if OFFSET {
                dy[e] += _mm512_reduce_add_ps(sy);
                dx[e] += _mm512_reduce_add_ps(sx);
            }
            if MASK {
                mask[e] += _mm512_reduce_add_ps(sm);
            }
        }
    }
}

/// `((w0 v0 + w1 v1) + w2 v2) + w3 v3`: the bilinear value of corners `v` (order `(y0,x0),
/// (y0,x1), (y1,x0), (y1,x1)`), in the scalar definition's order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn bilinear(
    w: &[std::arch::x86_64::__m512; 4],
    v: &[std::arch::x86_64::__m512; 4],
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_add_ps(
        _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(w[0], v[0]), _mm512_mul_ps(w[1], v[1])),
            _mm512_mul_ps(w[2], v[2]),
        ),
        _mm512_mul_ps(w[3], v[3]),
    )
}

/// The bilinear value's derivatives along y and x at fractions `(ly, lx)`:
/// `wy = lx (v3 - v1) + (1 - lx)(v2 - v0)`, `wx = ly (v3 - v2) + (1 - ly)(v1 - v0)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn corner_derivatives(
    v: &[std::arch::x86_64::__m512; 4],
    ly: std::arch::x86_64::__m512,
    lx: std::arch::x86_64::__m512,
) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    let one = _mm512_set1_ps(1.0);
    let wy = _mm512_add_ps(
        _mm512_mul_ps(lx, _mm512_sub_ps(v[3], v[1])),
        _mm512_mul_ps(_mm512_sub_ps(one, lx), _mm512_sub_ps(v[2], v[0])),
    );
    let wx = _mm512_add_ps(
        _mm512_mul_ps(ly, _mm512_sub_ps(v[3], v[2])),
        _mm512_mul_ps(_mm512_sub_ps(one, ly), _mm512_sub_ps(v[1], v[0])),
    );
    (wy, wx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::col2im::{scatter, TileShape};
    use crate::kernels::coord::{sample_gradients, SampleWant};
    use crate::kernels::lanes::{isa, Isa};
    use crate::kernels::taps::PlaneLayout;

    /// Outputs of one pass: grad planes (channel-major), dy, dx, mask, cols (channel-major).
    type Results = [Vec<f32>; 5];

    /// The fused pixel-major pass against the channel-major col2im + coord kernels on the same
    /// table (interior, border, outside, far-away, NaN and infinite samples), for segments
    /// starting at channel 3 of 37-channel cells with 24 channels (a full vector and a
    /// half-width one) and 34 (two full vectors and a masked tail), a tile that is not a
    /// multiple of 16, and every combination of outputs: `cols` bitwise, the reordered sums
    /// within a relative 1e-5 (NaN where the old kernels give NaN).
    #[test]
    fn fused_pass_matches_the_channel_major_kernels() {
        if isa() != Isa::Avx512 {
            eprintln!("no AVX-512 on this CPU: the pixel-major pass is never used");
            return;
        }
        // Segments of at most 8 channels (two samples a vector, `pairs`): 8, 5 and 1.
        for seg in [3..27, 3..37, 3..11, 5..10, 36..37] {
            fused_pass_case(seg);
        }
    }

    fn fused_pass_case(seg: std::ops::Range<usize>) {
        let layout = PlaneLayout::zero_bordered(5, 7);
        let (k_taps, tile, cells, images) = (3usize, 37usize, 37usize, 2usize);
        let count = seg.len();
        let stride = images * layout.len();
        let mut next = crate::kernels::test_stream(777);
        // Channel-major planes (border cells zero) and their pixel-major copy.
        let mut planes = vec![0.0f32; cells * stride];
        for c in 0..cells {
            for j in 0..images {
                for r in 0..5 {
                    for s in 0..7 {
                        planes[c * stride + j * layout.len() + layout.index(r, s)] = next() - 0.5;
                    }
                }
            }
        }
        let pm_of = |cm: &[f32]| {
            let mut pm = vec![0.0f32; cells * stride];
            for c in 0..cells {
                for i in 0..stride {
                    pm[i * cells + c] = cm[c * stride + i];
                }
            }
            pm
        };
        let taps =
            crate::kernels::taps::tests::hostile_table(layout, k_taps, tile, images, &mut next);
        let mut table = TapColumns::default();
        table.fill(&taps);
        // gcol channel-major `[(c K + k)][tile]` and pixel-major `[(q K + k) count + c]`.
        let gcol: Vec<f32> = (0..count * k_taps * tile).map(|_| next() - 0.5).collect();
        let mut gcol_pm = vec![0.0f32; gcol.len()];
        for c in 0..count {
            for k in 0..k_taps {
                for q in 0..tile {
                    gcol_pm[(q * k_taps + k) * count + c] = gcol[(c * k_taps + k) * tile + q];
                }
            }
        }
        let start: Vec<f32> = (0..cells * stride).map(|i| (i % 3) as f32 * 0.25).collect();
        for bits in 1..16u8 {
            let want = Outputs {
                scatter: bits & 1 != 0,
                offset: bits & 2 != 0,
                mask: bits & 4 != 0,
                cols: bits & 8 != 0,
            };
            let fresh = || -> Results {
                [
                    start.clone(),
                    vec![0.25f32; k_taps * tile],
                    vec![-0.5f32; k_taps * tile],
                    vec![0.125f32; k_taps * tile],
                    vec![f32::NAN; count * k_taps * tile],
                ]
            };
            let mut old = fresh();
            let [grad, dy, dx, dm, cols] = &mut old;
            let shape = TileShape {
                channel_stride: stride,
                pitch: layout.pitch(),
                tile,
                taps: k_taps,
                dense: false,
            };
            if want.scatter {
                scatter(grad, shape, &taps, &gcol, seg.clone());
            }
            let sample_want = SampleWant {
                offset: want.offset,
                mask: want.mask,
                cols: want.cols,
            };
            let out = SampleOut {
                dy,
                dx,
                mask: dm,
                cols,
            };
            sample_gradients(&planes, shape, &taps, &gcol, seg.clone(), sample_want, out);

            let mut new = fresh();
            let mut grad_pm = pm_of(&start);
            let [_, dy, dx, dm, cols_pm] = &mut new;
            let shape = CellShape {
                channels: cells,
                pitch: layout.pitch(),
                tile,
                taps: k_taps,
            };
            let out = SampleOut {
                dy,
                dx,
                mask: dm,
                cols: cols_pm,
            };
            let input = pm_of(&planes);
            // SAFETY: AVX-512F was detected above.
            unsafe {
                let planes = Planes {
                    input: &input,
                    grad: &mut grad_pm,
                };
                run(planes, shape, &table, &gcol_pm, seg.clone(), want, out)
            };
            for c in 0..cells {
                for i in 0..stride {
                    new[0][c * stride + i] = grad_pm[i * cells + c];
                }
            }
            let cols_cm = &mut new[4].clone();
            for c in 0..count {
                for k in 0..k_taps {
                    for q in 0..tile {
                        cols_cm[(c * k_taps + k) * tile + q] = new[4][(q * k_taps + k) * count + c];
                    }
                }
            }
            new[4] = cols_cm.clone();
            for (which, (a, b)) in old.iter().zip(&new).enumerate() {
                for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                    let same = if which == 4 {
                        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
                    } else if x.is_nan() || y.is_nan() || x.is_infinite() || y.is_infinite() {
                        x.is_nan() == y.is_nan() && (x.is_nan() || x == y)
                    } else {
                        (x - y).abs() <= 1e-5 * (1.0 + x.abs())
                    };
                    assert!(
                        same,
                        "outputs {bits:04b}, result {which}, element {i}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
