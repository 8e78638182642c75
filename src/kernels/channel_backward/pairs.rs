//! The fused backward pass for at most 8 channels per segment: two consecutive samples (flat
//! `f = q K + k`, `f + 1`) share a vector, lanes 0-7 and 8-15, so no lane idles where the
//! sixteen-channel pass of the parent module would leave half of them empty (W1: 8 channels).
//! Measured on W1's full backward (1 thread, perf samples of the pass): 25% less time in the
//! pass; the backward's wall minimum over 300 runs, 2 threads: 2.16-2.29 -> 1.81-2.00 ms.
//!
//! Per sample the IEEE operations are the parent's in the same order: `cols` and the
//! grad_input planes are bitwise the same (each half's four corner updates run in the
//! parent's order, sample `f` before `f + 1`); the channel sums use the parent's reduction tree
//! on the live lanes (`(i, i + 4)`, `(i, i + 2)`, `(i, i + 1)`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::CellShape;
use super::SampleOut;
use crate::kernels::columns::TapColumns;

/// `[a | b]`: the low 8 lanes `a`, the high 8 `b`.
#[target_feature(enable = "avx512f")]
#[inline]
fn halves(a: f32, b: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b))
}

/// The sums of lanes 0-7 and of lanes 8-15 of `v`, by the tree `(i, i + 4)`, `(i, i + 2)`,
/// `(i, i + 1)` inside each half.
#[target_feature(enable = "avx512f")]
#[inline]
fn half_sums(v: __m512) -> (f32, f32) {
    let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
    let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let v = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
    (
        _mm512_cvtss_f32(v),
        _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(v)),
    )
}

/// The parent's `pass` for `channels.len() <= 8`, after its bounds checks: the same
/// arguments and outputs. `FULL` is `channels.len() == 8`.
///
/// # Safety
/// AVX-512F; `FULL` exactly when 8 channels; the bounds that the parent's `pass` asserts
/// before calling this.
///
/// Inlined into the generic pass's AVX-512 instance: out of line, the same code ran 20% longer
/// (AMD Zen 4, W1 full backward, 1 thread, perf samples of this function; the backward's wall
/// minimum over 100 runs, 2 threads: 1.22 against 1.13 ms).
///
/// Full segments (W1) fill each half exactly, so a pair's `gcol` and `cols` rows are one
/// unmasked 512-bit load or store and its corners two 256-bit loads. Together with stepping
/// (pixel, tap) by counters instead of two divisions per pair, against masked accesses for
/// every segment (AMD Zen 4, W1 full backward, minimum of 300 runs, alternating binaries):
/// 2 threads 0.96-0.97 -> 0.91-0.92 ms (4 rounds), 1 thread 1.80-1.85 -> 1.70-1.74 ms (3 rounds).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn pass<
    const SCATTER: bool,
    const OFFSET: bool,
    const MASK: bool,
    const COLS: bool,
    const FULL: bool,
>(
    input: &[f32],
    grad: &mut [f32],
    shape: CellShape,
    table: &TapColumns<f32>,
    gcol: &[f32],
    channels: Range<usize>,
    out: SampleOut<'_, f32>,
) {
    use crate::kernels::transpose::first_lanes;

    let CellShape {
        channels: cpc,
        pitch,
        tile,
        taps: k_taps,
    } = shape;
    let need_g = SCATTER || OFFSET || MASK;
    let need_in = OFFSET || MASK || COLS;
    let count = channels.len();
    debug_assert!((1..=8).contains(&count) && FULL == (count == 8));
    let samples = k_taps * tile;
    let SampleOut { dy, dx, mask, cols } = out;
    let corner = [0, cpc, pitch * cpc, (pitch + 1) * cpc];
    let zero = _mm512_setzero_ps();
    let low = first_lanes(count);
    let (input_at, grad_at) = (input.as_ptr(), grad.as_mut_ptr());
    // Loads `count` values at `a` into lanes 0.. and at `b` into lanes 8.. (`b` only with
    // `second`). The second load's address is formed by wrapping_sub: only its lanes 8..
    // 8 + count, at `b ..`, are read.
    let pair_load = |a: *const f32, b: *const f32, second: bool| {
        // SAFETY: the caller passes addresses with `count` readable values each.
        unsafe {
            if FULL {
                let v = _mm512_zextps256_ps512(_mm256_loadu_ps(a));
                if second {
                    let high = _mm256_castps_pd(_mm256_loadu_ps(b));
                    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(v), high))
                } else {
                    v
                }
            } else {
                let v = _mm512_maskz_loadu_ps(low, a);
                if second {
                    _mm512_mask_loadu_ps(v, low << 8, b.wrapping_sub(8))
                } else {
                    v
                }
            }
        }
    };

    // Entry `e` of a table column or of dy / dx / mask, unchecked: every `e` below is an entry
    // `k * tile + q < samples`, the length of each (asserted by the parent). Bounds-checked,
    // the twenty-odd reads and writes per pair made the pass slower: W1 full backward, medians
    // of 300, 4 alternating rounds (Zen 4): 1 thread 2.02-2.08 -> 1.93-1.98 ms, 2 threads
    // 1.12-1.13 -> 1.06-1.12.
    macro_rules! at {
        ($v:expr, $e:expr) => {{
            let (v, e) = (&$v, $e);
            debug_assert!(e < v.len());
            // SAFETY: e < samples <= v.len() (see above).
            unsafe { *v.get_unchecked(e) }
        }};
    }
    macro_rules! add_at {
        ($v:expr, $e:expr, $x:expr) => {{
            let e = $e;
            debug_assert!(e < $v.len());
            // SAFETY: as for `at`.
            unsafe { *$v.get_unchecked_mut(e) += $x };
        }};
    }

    // Sample `f = q K + k` is (pixel q, tap k); the successor of (q, k).
    let next = |(q, k): (usize, usize)| {
        if k + 1 < k_taps {
            (q, k + 1)
        } else {
            (q + 1, 0)
        }
    };
    let mut sample = (0, 0);
    for f in (0..samples).step_by(2) {
        let second = f + 1 < samples;
        let (q0, k0) = sample;
        let (q1, k1) = if second { next(sample) } else { sample };
        sample = next((q1, k1));
        debug_assert_eq!(
            (q0 * k_taps + k0, q1 * k_taps + k1),
            (f, f + second as usize)
        );
        // Table entries `k * tile + q` of the two samples.
        let (e0, e1) = (k0 * tile + q0, k1 * tile + q1);
        let live = if second { low | (low << 8) } else { low };
        let row = f * count;
        let m = halves(at!(table.m, e0), at!(table.m, e1));
        let w: [__m512; 4] =
            std::array::from_fn(|j| halves(at!(table.weights[j], e0), at!(table.weights[j], e1)));
        let inside = (if at!(table.inside, e0) != 0 { low } else { 0 })
            | (if second && at!(table.inside, e1) != 0 {
                low << 8
            } else {
                0
            });
        let g = if need_g {
            // SAFETY: rows f and f + 1 (when `second`) of gcol, `count` values each, lie in
            // gcol (the parent asserts gcol.len() >= count * samples).
            let at = gcol.as_ptr().wrapping_add(row);
            if FULL && second {
                // SAFETY: as above; the two rows are the 16 values from `row`.
                unsafe { _mm512_loadu_ps(at) }
            } else {
                pair_load(at, at.wrapping_add(count), second)
            }
        } else {
            zero
        };
        let gm = _mm512_mul_ps(g, m);
        if need_in {
            let (g0, g1) = (
                at!(table.gather, e0) as usize,
                at!(table.gather, e1) as usize,
            );
            debug_assert!(g0 <= table.max_base && g1 <= table.max_base);
            let a = g0 * cpc + channels.start;
            let b = g1 * cpc + channels.start;
            // Every corner of an entry whose base is at most max_base lies inside `input`
            // (asserted by the parent); channels.end <= cpc.
            let v: [__m512; 4] = std::array::from_fn(|j| {
                pair_load(
                    input_at.wrapping_add(a + corner[j]),
                    input_at.wrapping_add(b + corner[j]),
                    second,
                )
            });
            let bil = bilinear(&w, &v);
            let bil = _mm512_maskz_mov_ps(inside, bil);
            if COLS {
                let x = _mm512_mul_ps(m, bil);
                // SAFETY: rows f and f + 1 of cols lie in it (the parent asserts
                // cols.len() >= count * samples); the high half's address is formed by
                // wrapping_sub and only its lanes 8.. 8 + count are written.
                unsafe {
                    let at = cols.as_mut_ptr().add(row);
                    if FULL && second {
                        _mm512_storeu_ps(at, x);
                    } else {
                        _mm512_mask_storeu_ps(at, low, x);
                        if second {
                            _mm512_mask_storeu_ps(at.add(count).wrapping_sub(8), low << 8, x);
                        }
                    }
                }
            }
            let (ly, lx) = (
                halves(at!(table.ly, e0), at!(table.ly, e1)),
                halves(at!(table.lx, e0), at!(table.lx, e1)),
            );
            if OFFSET {
                let (wy, wx) = corner_derivatives(&v, ly, lx);
                let (y0, y1) =
                    half_sums(_mm512_mask_add_ps(zero, live, zero, _mm512_mul_ps(gm, wy)));
                let (x0, x1) =
                    half_sums(_mm512_mask_add_ps(zero, live, zero, _mm512_mul_ps(gm, wx)));
                add_at!(dy, e0, y0);
                add_at!(dx, e0, x0);
                if second {
                    add_at!(dy, e1, y1);
                    add_at!(dx, e1, x1);
                }
            }
            if MASK {
                let (m0, m1) =
                    half_sums(_mm512_mask_add_ps(zero, live, zero, _mm512_mul_ps(g, bil)));
                add_at!(mask, e0, m0);
                if second {
                    add_at!(mask, e1, m1);
                }
            }
        }
        if SCATTER {
            // Sample f's four corners, then f + 1's, as the parent orders them. Full 8-lane
            // updates are unmasked 256-bit read-modify-writes, so that the next update of a
            // cell is forwarded from the store (see the parent).
            let halves_to_do = if second { 2 } else { 1 };
            for h in 0..halves_to_do {
                let e = if h == 0 { e0 } else { e1 };
                let cell = at!(table.scatter, e) as usize;
                debug_assert!(cell <= table.max_scatter);
                let base = cell * cpc + channels.start;
                for (j, &d) in corner.iter().enumerate() {
                    let add = _mm512_mul_ps(gm, w[j]);
                    // Sample f + 1's half moved down to lanes 0-7.
                    let add = if h == 0 {
                        add
                    } else {
                        _mm512_shuffle_f32x4::<0b11_10_11_10>(add, add)
                    };
                    // SAFETY: the entry's scatter base is at most max_scatter, so its corner
                    // cells' `count` channels lie in `grad` (asserted by the parent); this task
                    // owns the planes.
                    unsafe {
                        let cell = grad_at.add(base + d);
                        if FULL {
                            let add = _mm512_castps512_ps256(add);
                            _mm256_storeu_ps(cell, _mm256_add_ps(_mm256_loadu_ps(cell), add));
                        } else {
                            let new = _mm512_add_ps(_mm512_maskz_loadu_ps(low, cell), add);
                            _mm512_mask_storeu_ps(cell, low, new);
                        }
                    }
                }
            }
        }
    }
}

/// `((w0 v0 + w1 v1) + w2 v2) + w3 v3`: the parent's `bilinear` on AVX-512 vectors.
#[target_feature(enable = "avx512f")]
#[inline]
fn bilinear(w: &[__m512; 4], v: &[__m512; 4]) -> __m512 {
    _mm512_add_ps(
        _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(w[0], v[0]), _mm512_mul_ps(w[1], v[1])),
            _mm512_mul_ps(w[2], v[2]),
        ),
        _mm512_mul_ps(w[3], v[3]),
    )
}

/// The parent's `corner_derivatives` on AVX-512 vectors.
#[target_feature(enable = "avx512f")]
#[inline]
fn corner_derivatives(v: &[__m512; 4], ly: __m512, lx: __m512) -> (__m512, __m512) {
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
