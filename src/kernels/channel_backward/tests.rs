//! The fused pass against its definition, and its lane sums, on every backend.

use super::*;
use crate::kernels::taps::{PlaneLayout, Tap};

/// Outputs of one pass: grad planes (channel-major), dy, dx, mask, cols (channel-major).
type Results = [Vec<f32>; 5];

/// The fused pixel-major pass on every backend against its definition written as plain loops
/// over channel-major planes and the row table ([`by_definition`]), on a table of interior,
/// border, outside, far-away, NaN and infinite samples, for segments starting at channel 3 of
/// 37-channel cells with 24 channels (a full vector and a half-width one) and 34 (two full
/// vectors and a masked tail), a tile that is not a multiple of 16, infinite masks, and every
/// combination of outputs: `cols` bitwise, the reordered sums within a relative 1e-5 (NaN
/// where the definition gives NaN).
#[test]
fn fused_pass_matches_its_definition() {
    use crate::kernels::backend::tests::token;
    use crate::kernels::backend::{Isa, Portable, Scalar};
    fn on<B: Backend>(b: Option<B>, isa: Isa) {
        let Some(b) = token(b, isa) else {
            return;
        };
        // Segments of at most 8 channels (two samples a vector, `pairs`, on AVX-512): 8, 5
        // and 1.
        for seg in [3..27, 3..37, 3..11, 5..10, 36..37] {
            fused_pass_case(b, seg);
        }
    }
    on(Some(Scalar::new()), Isa::Scalar);
    on(Some(Portable::new()), Isa::Portable);
    #[cfg(target_arch = "x86_64")]
    {
        on(crate::kernels::backend::Avx2::new(), Isa::Avx2);
        on(crate::kernels::backend::Avx512::new(), Isa::Avx512);
    }
}

/// [`add_lane_sums`] adds to each `dst[p]` the sum of `sums[p]`'s lanes by the halving
/// tree, bit for bit (the lanes span 2^±40, so another order rounds differently), for every
/// count of pixels, on every backend, in `f32` and `f64`; `dst` past the pixels is untouched.
#[test]
fn lane_sums_follow_each_samples_halving_tree() {
    use crate::kernels::backend::tests::token;
    use crate::kernels::backend::{Isa, Portable, Scalar};
    fn case<B: Backend, T: Float>(b: B) {
        let n = <T::V<B> as Lanes<T, B>>::N;
        let mut next = crate::kernels::test_stream(99);
        let mut value = || {
            let scale = 2f64.powi((next() * 80.0) as i32 - 40);
            T::from_f64((next() as f64 - 0.5) * scale)
        };
        for pixels in 1..=n {
            let lanes: Vec<Vec<T>> = (0..n).map(|_| (0..n).map(|_| value()).collect()).collect();
            let start: Vec<T> = (0..n).map(|_| value()).collect();
            let mut sums: Vec<T::V<B>> = lanes.iter().map(|l| T::V::<B>::load(b, l)).collect();
            let mut dst = start.clone();
            add_lane_sums::<B, T>(b, &mut sums, &mut dst[..pixels]);
            for p in 0..n {
                let mut a = lanes[p].clone();
                let mut half = n / 2;
                while half > 0 {
                    for i in 0..half {
                        a[i] = a[i] + a[i + half];
                    }
                    half /= 2;
                }
                let want = if p < pixels {
                    start[p] + a[0]
                } else {
                    start[p]
                };
                assert!(
                    dst[p].to_f64().to_bits() == want.to_f64().to_bits(),
                    "{} pixels {pixels} lane {p}",
                    B::ISA.name()
                );
            }
        }
    }
    fn on<B: Backend>(b: Option<B>, isa: Isa) {
        if let Some(b) = token(b, isa) {
            case::<B, f32>(b);
            case::<B, f64>(b);
        }
    }
    on(Some(Scalar::new()), Isa::Scalar);
    on(Some(Portable::new()), Isa::Portable);
    #[cfg(target_arch = "x86_64")]
    {
        on(crate::kernels::backend::Avx2::new(), Isa::Avx2);
        on(crate::kernels::backend::Avx512::new(), Isa::Avx512);
    }
}

fn fused_pass_case<B: Backend>(b: B, seg: std::ops::Range<usize>) {
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
    let mut taps =
        crate::kernels::taps::tests::hostile_table(layout, k_taps, tile, images, &mut next);
    // Infinite masks: lanes past the segment must not turn their sums into NaN.
    taps[4].m = f32::INFINITY;
    taps[17].m = f32::NEG_INFINITY;
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
        let mut expected = fresh();
        let cm = ChannelMajor {
            planes: &planes,
            stride,
            pitch: layout.pitch(),
            taps: &taps,
            k_taps,
            gcol: &gcol,
        };
        by_definition(&cm, seg.clone(), want, &mut expected);

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
        let planes = Planes {
            input: &input,
            grad: &mut grad_pm,
        };
        b.vectorize(Pass {
            planes,
            shape,
            table: &table,
            gcol: &gcol_pm,
            channels: seg.clone(),
            want,
            out,
        });
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
        for (which, (a, b)) in expected.iter().zip(&new).enumerate() {
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

/// A tile on channel-major planes: channel `c`'s planes at `planes[c * stride ..]`, the row
/// table `taps[k * tile + q]` and `gcol[((c - seg.start) * K + k) * tile + q]`.
struct ChannelMajor<'a> {
    planes: &'a [f32],
    stride: usize,
    pitch: usize,
    taps: &'a [Tap<f32>],
    k_taps: usize,
    gcol: &'a [f32],
}

/// What the fused pass computes, channel by channel in ascending order: for the sample `e` of
/// tap `k` at pixel `q`, corner values `v` read at `e.gather`, `g = gcol[c, k, q]` and
/// `B = ((w0 v0 + w1 v1) + w2 v2) + w3 v3` inside the window (0 outside),
///
/// ```text
/// grad_c[e.scatter + corner] += (g m) w_corner      dy[k, q] += (g m) (lx (v11 - v01) + (1 - lx)(v10 - v00))
/// mask[k, q] += g B                                 dx[k, q] += (g m) (ly (v11 - v10) + (1 - ly)(v01 - v00))
/// cols[c, k, q] = m B
/// ```
fn by_definition(
    t: &ChannelMajor<'_>,
    seg: std::ops::Range<usize>,
    want: Outputs,
    out: &mut Results,
) {
    let [grad, dy, dx, dm, cols] = out;
    let tile = t.taps.len() / t.k_taps;
    let corners = [0, 1, t.pitch, t.pitch + 1];
    for (ci, c) in seg.enumerate() {
        let plane = &t.planes[c * t.stride..][..t.stride];
        for (at, e) in t.taps.iter().enumerate() {
            let (k, q) = (at / tile, at % tile);
            let row = (ci * t.k_taps + k) * tile + q;
            let g = t.gcol[row];
            let v = corners.map(|d| plane[e.gather + d]);
            let bil = if e.inside {
                e.weights[0] * v[0]
                    + e.weights[1] * v[1]
                    + e.weights[2] * v[2]
                    + e.weights[3] * v[3]
            } else {
                0.0
            };
            if want.scatter {
                for (d, w) in corners.iter().zip(e.weights) {
                    grad[c * t.stride + e.scatter + d] += (g * e.m) * w;
                }
            }
            if want.offset {
                let wy = e.lx * (v[3] - v[1]) + (1.0 - e.lx) * (v[2] - v[0]);
                let wx = e.ly * (v[3] - v[2]) + (1.0 - e.ly) * (v[1] - v[0]);
                dy[at] += (g * e.m) * wy;
                dx[at] += (g * e.m) * wx;
            }
            if want.mask {
                dm[at] += g * bil;
            }
            if want.cols {
                cols[row] = e.m * bil;
            }
        }
    }
}
