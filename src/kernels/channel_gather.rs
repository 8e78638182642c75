//! The deformable gather vectorised across channels for segments of at most 8 channels, tuned
//! for `f32` on AVX-512F: two output pixels share a vector (lanes 0-7 and 8-15), so no lane
//! idles where the generic form ([`super::channel_lanes`], which every other case runs) would
//! leave half of the sixteen empty. W1 (8 channels, 1 thread): deformable forward 1.28 ->
//! 1.02 ms, 2 threads 0.69 -> 0.49 ms (min of 500 runs).
//!
//! Wider segments once had a tuned sixteen-channel form here too; the generic form measured
//! within 0.5-2.3% of it (AMD Zen 4, W2 and W4 forward, 1 and 2 threads, 4 alternating
//! rounds), so it went.
//!
//! Arithmetic: `m * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)` with separate multiplies and adds,
//! the same operations in the same order as [`super::channel_lanes`], so the column tile is
//! bit for bit the one the generic gather makes; the corners are the table's cell and its
//! neighbours on the padded image, as there.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::{columns::TapRow, pixel_major::PixelImage, TileRows};

/// The column-tile rows of one tap over a range of channels of one offset group: channel `c`
/// goes to row `(c - first) * taps + k`.
#[derive(Debug, Clone)]
pub(crate) struct ChannelRows {
    /// The channels to fill (channels of the image).
    pub channels: Range<usize>,
    /// The channel of the tile's first rows (the conv group's first channel).
    pub first: usize,
    /// Kernel taps per channel, `K`.
    pub taps: usize,
    /// The tap, `k < K`.
    pub k: usize,
}

impl ChannelRows {
    /// The row of channel `c`.
    #[inline(always)]
    pub(crate) fn row(&self, c: usize) -> usize {
        (c - self.first) * self.taps + self.k
    }

    /// Where tap `k` of these channels (one segment: an offset group's channels inside the
    /// conv group) starts in a pixel row of a pixel-major tile
    /// ([`super::TileLayout::PixelMajor`]): `(s - first) * taps + k * (e - s)` for channels
    /// `s .. e`.
    #[inline(always)]
    pub(crate) fn pixel_slot(&self) -> usize {
        (self.channels.start - self.first) * self.taps + self.k * self.channels.len()
    }
}

/// The rows `rows` of the column tile, for `q < len`:
/// `out.cols[((c - first) * taps + k) * out.ld + q] = m * B(channel c, sample (k, q))`, for
/// at most 8 channels.
///
/// `image` is the sample's image pixel-major (at most `i32::MAX` values), `tap` the sampling
/// table row of tap `k` (cells whose four corners lie in the image); `Avx512` proves the CPU's
/// features.
#[cfg(target_arch = "x86_64")]
pub(crate) fn interpolate_tap(
    _: super::backend::Avx512,
    image: PixelImage<'_, f32>,
    rows: ChannelRows,
    tap: &TapRow<'_, f32>,
    len: usize,
    out: TileRows<'_, f32>,
) {
    let (channels, c_lo) = (&rows.channels, rows.first);
    assert!(
        channels.len() <= 8,
        "more than 8 channels for the paired gather"
    );
    assert!(
        image.values.len() <= i32::MAX as usize
            && channels.end <= image.channels
            && channels.start >= c_lo,
        "channel gather outside its image"
    );
    assert!(
        channels.is_empty()
            || out.cols.len() >= rows.row(channels.end - 1) * out.ld + len && len <= out.ld,
        "channel gather outside its column tile"
    );
    assert!(tap.cell.len() >= len && tap.weight.iter().all(|w| w.len() >= len));
    assert!(tap.mask.is_none_or(|m| m.len() >= len));
    debug_assert!(tap.cell[..len]
        .iter()
        .all(|&v| v >= 0 && v as usize + image.pitch + 1 < image.cells()));
    // SAFETY: the `Avx512` value proves AVX-512F; the bounds asserted above are the kernel's
    // contract.
    unsafe {
        if rows.channels.len() == 8 {
            x86::interpolate_tap_pairs::<true>(image, rows, tap, len, out)
        } else {
            x86::interpolate_tap_pairs::<false>(image, rows, tap, len, out)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ChannelRows, PixelImage, TapRow, TileRows};
    use crate::kernels::transpose::first_lanes;
    use std::arch::x86_64::*;

    /// Where element `(p, c)` of a 16-pixel x 8-channel block lies, `(vector, lane)`, before
    /// (`stage` 0: two pixels a vector) and after each round of [`transpose_pairs`] (`stage`
    /// 3: one channel a vector). Each round swaps one vector bit with one lane bit.
    const fn place(stage: usize, p: usize, c: usize) -> (usize, usize) {
        let (p0, p1, p2, p3) = (p & 1, (p >> 1) & 1, (p >> 2) & 1, (p >> 3) & 1);
        let (c0, c1, c2) = (c & 1, (c >> 1) & 1, (c >> 2) & 1);
        match stage {
            0 => (p >> 1, p0 << 3 | c),
            1 => (p3 << 2 | p2 << 1 | c0, p0 << 3 | c2 << 2 | c1 << 1 | p1),
            2 => (p3 << 2 | c1 << 1 | c0, p0 << 3 | c2 << 2 | p2 << 1 | p1),
            _ => (c, p),
        }
    }

    /// The `_mm512_permutex2var_ps` indices of round `stage` (1 to 3): output vector `v`
    /// takes lane `l` from the previous round's vector `v & !bit` (index `< 16`) or
    /// `v | bit` (`16 +`), `bit = 1 << (stage - 1)`.
    const fn round(stage: usize) -> [[i32; 16]; 8] {
        let mut idx = [[0i32; 16]; 8];
        let mut p = 0;
        while p < 16 {
            let mut c = 0;
            while c < 8 {
                let (v, l) = place(stage, p, c);
                let (pv, pl) = place(stage - 1, p, c);
                let from_high = (pv >> (stage - 1)) & 1;
                idx[v][l] = (pl + 16 * from_high) as i32;
                c += 1;
            }
            p += 1;
        }
        idx
    }

    const ROUNDS: [[[i32; 16]; 8]; 3] = [round(1), round(2), round(3)];

    /// Turns 8 vectors of two pixels x 8 channels (`z[j]`: pixel `2j` in lanes 0-7, `2j + 1`
    /// in 8-15) into 8 vectors of 16 pixels, one channel each: 24 two-source permutes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn transpose_pairs(z: &mut [__m512; 8]) {
        for (r, round) in ROUNDS.iter().enumerate() {
            let bit = 1 << r;
            let prev = *z;
            for (v, idx) in round.iter().enumerate() {
                // SAFETY: the array holds 16 i32 (one 512-bit load).
                let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
                z[v] = _mm512_permutex2var_ps(prev[v & !bit], idx, prev[v | bit]);
            }
        }
    }

    /// [`super::interpolate_tap`] on AVX-512F: two pixels share a vector (lanes 0-7 and
    /// 8-15), and the block transpose is 24 permutes instead of 64.
    ///
    /// `FULL` (`channels.len() == 8`, W1) fills each half exactly: a pair's corner is two
    /// 256-bit loads instead of two dependent masked ones. With the pair's weights permuted
    /// out of the tile's weight vector instead of two broadcasts and a blend, and unmasked
    /// stores for whole 16-pixel blocks, against the masked version for every width (AMD
    /// Zen 4, W1 forward, minimum of 300-400 runs, alternating binaries): 1 thread
    /// 0.75-0.77 -> 0.70-0.72 ms, 2 threads 0.37-0.45 -> 0.35-0.37 ms (6 rounds each).
    ///
    /// # Safety
    /// AVX-512F; the bounds that [`super::interpolate_tap`] asserts; `channels.len() <= 8`,
    /// `== 8` exactly when `FULL`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn interpolate_tap_pairs<const FULL: bool>(
        image: PixelImage<'_, f32>,
        rows: ChannelRows,
        tap: &TapRow<'_, f32>,
        len: usize,
        out: TileRows<'_, f32>,
    ) {
        let PixelImage {
            values: image,
            channels: c_in,
            pitch,
        } = image;
        let ChannelRows {
            channels,
            first: c_lo,
            taps,
            k,
        } = rows;
        let TileRows { cols, ld } = out;
        let cw = channels.len();
        debug_assert!(cw <= 8 && FULL == (cw == 8));
        if cw == 0 {
            return;
        }
        let base = image.as_ptr();
        let out = cols.as_mut_ptr();
        let low = first_lanes(cw);
        let high = low << 8;
        let stride = _mm512_set1_epi32(c_in as i32);
        // Element offsets of the four corners from the first: 0, 1, pitch, pitch + 1 cells
        // (below `image.len() <= i32::MAX`, asserted by the caller).
        let step = [0, c_in, pitch * c_in, (pitch + 1) * c_in].map(|d| _mm512_set1_epi32(d as i32));
        for q0 in (0..len).step_by(16) {
            let pw = 16.min(len - q0);
            let live = first_lanes(pw);
            // Element offsets of the corners' cells (cell 0 for the lanes past `pw`, whose
            // results are never stored) and the weights.
            let mut at = [[0i32; 16]; 4];
            let mut wt = [_mm512_setzero_ps(); 4];
            // SAFETY: the live lanes q0 .. q0 + pw are inside the table row (len entries).
            let first = unsafe {
                _mm512_mullo_epi32(
                    _mm512_maskz_loadu_epi32(live, tap.cell.as_ptr().add(q0)),
                    stride,
                )
            };
            for t in 0..4 {
                // SAFETY: as above; `at[t]` holds 16 lanes.
                unsafe {
                    let a = _mm512_add_epi32(first, step[t]);
                    _mm512_storeu_si512(at[t].as_mut_ptr().cast(), a);
                    wt[t] = _mm512_maskz_loadu_ps(live, tap.weight[t].as_ptr().add(q0));
                }
            }
            // SAFETY: as above.
            let m = tap
                .mask
                .map(|mask| unsafe { _mm512_maskz_loadu_ps(live, mask.as_ptr().add(q0)) });
            let mut z = [_mm512_setzero_ps(); 8];
            for (j, zj) in z.iter_mut().enumerate() {
                let (a, b) = (2 * j, 2 * j + 1);
                // Lanes 0-7 from lane a of a vector, 8-15 from lane b.
                let pair = _mm512_add_epi32(
                    _mm512_set1_epi32(a as i32),
                    _mm512_set_epi64(
                        1 << 32 | 1,
                        1 << 32 | 1,
                        1 << 32 | 1,
                        1 << 32 | 1,
                        0,
                        0,
                        0,
                        0,
                    ),
                );
                let mut sum = _mm512_setzero_ps();
                for t in 0..4 {
                    let (pa, pb) = (
                        at[t][a] as usize + channels.start,
                        at[t][b] as usize + channels.start,
                    );
                    debug_assert!(pa + cw <= image.len() && pb + cw <= image.len());
                    // Cells at[t][_] lie in the image (the table's contract), so channels
                    // `channels` of each lie in the image; the second load's pointer is
                    // formed by wrapping_sub and only its live lanes 8 .. 8 + cw (at pb) are read.
                    // SAFETY: as just said: every live lane lies inside `image`.
                    let v = unsafe {
                        if FULL {
                            let lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(
                                base.add(pa),
                            )));
                            let hi = _mm256_castps_pd(_mm256_loadu_ps(base.add(pb)));
                            _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, hi))
                        } else {
                            let v = _mm512_maskz_loadu_ps(low, base.add(pa));
                            _mm512_mask_loadu_ps(v, high, base.add(pb).wrapping_sub(8))
                        }
                    };
                    let w = _mm512_permutexvar_ps(pair, wt[t]);
                    let prod = _mm512_mul_ps(w, v);
                    sum = if t == 0 {
                        prod
                    } else {
                        _mm512_add_ps(sum, prod)
                    };
                }
                if let Some(m) = m {
                    sum = _mm512_mul_ps(_mm512_permutexvar_ps(pair, m), sum);
                }
                *zj = sum;
            }
            transpose_pairs(&mut z);
            for (ci, v) in z.iter().enumerate().take(cw) {
                let row = (channels.start + ci - c_lo) * taps + k;
                // SAFETY: row <= (channels.end - 1 - c_lo) * taps + k and q0 + pw <= len <= ld,
                // so the live lanes lie in `cols` (caller's contract).
                unsafe {
                    if pw == 16 {
                        _mm512_storeu_ps(out.add(row * ld + q0), *v)
                    } else {
                        _mm512_mask_storeu_ps(out.add(row * ld + q0), live, *v)
                    }
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::convention::Convention;
    use crate::geometry::Geometry;
    use crate::kernels::backend::tests::token;
    use crate::kernels::backend::{Backend, Isa, Portable, Scalar};
    use crate::kernels::gather::{by_definition, columns_with, gather_columns, SampleTable};
    use crate::kernels::pixel_major::PixelMajor;
    use crate::kernels::taps::PlaneLayout;
    use crate::kernels::ImageOrder;
    use crate::kernels::Source;
    use crate::kernels::{TileLayout, TileRows, TileSpan};
    use crate::params::ConvParams;
    use crate::Float;

    /// A channel gather under test: fills the tile of `span` from the pixel-major images.
    type Fill<'f, T> = &'f dyn Fn(
        &Source<'_, T>,
        &[T],
        TileSpan,
        (TileLayout, TileRows<'_, T>),
        &mut SampleTable<T>,
        &PixelMajor<T>,
    );

    /// `fill`'s column tile equals the definition's bit for bit, in both layouts, for channel
    /// counts around the vector widths, ragged pixel ranges, masks, NaN / infinite / huge
    /// offsets and infinite pixels, in every convention; padding between rows is untouched.
    fn equals_definition<T: Float>(fill: Fill<'_, T>, name: &str) {
        let mut state = 11u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            T::from_f64(f64::from(state >> 8) / 16_777_216.0)
        };
        let half = T::from_f64(0.5);
        for &(c_in, groups, og, h, w, k) in &[
            (8, 1, 1, 9, 7, 3),
            // At most 8 channels per offset group (two pixels a vector): all, some of a
            // wider pixel, one.
            (6, 1, 1, 7, 6, 3),
            (12, 1, 3, 5, 8, 3),
            (16, 2, 4, 6, 5, 3),
            (1, 1, 1, 5, 4, 2),
            (40, 2, 4, 6, 11, 3),
            (17, 1, 1, 5, 5, 2),
            (33, 1, 3, 4, 9, 1),
            // More than 256 channels in one offset group: the kernels' split into parts.
            (300, 1, 1, 4, 5, 2),
        ] {
            for convention in [Convention::Torchvision, Convention::DcnV1] {
                let params = ConvParams::default()
                    .padding(1, 1)
                    .groups(groups)
                    .offset_groups(og)
                    .convention(convention);
                let n = 2;
                let geo =
                    Geometry::new([n, c_in, h, w], [2 * groups, c_in / groups, k, k], &params)
                        .unwrap();
                let mut input: Vec<T> = (0..n * c_in * h * w).map(|_| next() - half).collect();
                input[3] = T::from_f64(f64::INFINITY);
                let mut offset: Vec<T> = (0..n * 2 * og * k * k * geo.out_pixels())
                    .map(|_| (next() - half) * T::from_f64(6.0))
                    .collect();
                offset[1] = T::from_f64(f64::NAN);
                offset[5] = T::from_f64(1e30);
                offset[8] = T::from_f64(-2.0);
                offset[9] = T::from_f64(1.0);
                let mask: Vec<T> = (0..n * og * k * k * geo.out_pixels())
                    .map(|_| next())
                    .collect();
                let mut images = PixelMajor::default();
                let layout = PlaneLayout::for_convention(convention, h, w);
                images
                    .fill(&input, ImageOrder::Nchw, 0, n, c_in, layout)
                    .unwrap();
                for with_mask in [false, true] {
                    let src = Source {
                        geo: &geo,
                        convention,
                        input: &input,
                        input_order: ImageOrder::Nchw,
                        offset: Some(&offset),
                        mask: with_mask.then_some(&mask[..]),
                    };
                    let rows = geo.c_in_per_group() * geo.taps();
                    for (image, start, len) in [
                        (0, 0, geo.out_pixels()),
                        (1, 3, 21.min(geo.out_pixels() - 3)),
                    ] {
                        for (group, layout) in (0..groups).flat_map(|g| {
                            [TileLayout::ChannelMajor, TileLayout::PixelMajor].map(|l| (g, l))
                        }) {
                            // Five elements of padding after each row.
                            let (ld, size) = match layout {
                                TileLayout::ChannelMajor => (len + 5, rows * (len + 5)),
                                TileLayout::PixelMajor => (rows + 5, len * (rows + 5)),
                            };
                            let mut table = SampleTable::default();
                            let nan = T::from_f64(f64::NAN);
                            let mut want = vec![nan; size];
                            let span = TileSpan {
                                image,
                                group,
                                start,
                                len,
                            };
                            let out = TileRows {
                                cols: &mut want,
                                ld,
                            };
                            columns_with(
                                &src,
                                &offset,
                                span,
                                (layout, out),
                                &mut table,
                                &images,
                                by_definition(&src, image),
                            );
                            let mut got = vec![nan; size];
                            let out = TileRows { cols: &mut got, ld };
                            fill(&src, &offset, span, (layout, out), &mut table, &images);
                            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    g.to_f64().to_bits(),
                                    w.to_f64().to_bits(),
                                    "{name} c_in {c_in} og {og} {convention:?} mask {with_mask} \
                                     {layout:?} element {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The gather the forward runs (the paired AVX-512 `f32` kernel for at most 8 channels on
    /// AVX-512, the generic one elsewhere), in `f32` and `f64`.
    #[test]
    fn equals_the_definition_bit_for_bit() {
        fn dispatched<T: Float>() {
            equals_definition::<T>(
                &|src, offset, span, out, table, images| {
                    gather_columns(src, offset, span, out, table, images)
                },
                "dispatched",
            );
        }
        dispatched::<f32>();
        dispatched::<f64>();
    }

    /// The gather on backend `b` (on AVX-512, the paired kernel for at most 8 `f32`
    /// channels), in `f32` and `f64` (a missing backend is skipped, or fails when
    /// `DEFORMCONV_EXPECT_ISA` names it).
    fn gather_on<B: Backend>(b: Option<B>, isa: Isa) {
        let Some(b) = token(b, isa) else {
            return;
        };
        fn on<B: Backend, T: Float>(b: B, isa: Isa) {
            equals_definition::<T>(
                &|src, offset, span, out, table, images| {
                    columns_with(src, offset, span, out, table, images, |t| b.vectorize(t))
                },
                isa.name(),
            );
        }
        on::<B, f32>(b, isa);
        on::<B, f64>(b, isa);
    }

    #[test]
    fn equals_the_definition_on_scalar() {
        gather_on(Some(Scalar::new()), Isa::Scalar);
    }

    #[test]
    fn equals_the_definition_on_portable() {
        gather_on(Some(Portable::new()), Isa::Portable);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn equals_the_definition_on_avx2() {
        gather_on(crate::kernels::backend::Avx2::new(), Isa::Avx2);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn equals_the_definition_on_avx512() {
        gather_on(crate::kernels::backend::Avx512::new(), Isa::Avx512);
    }
}
