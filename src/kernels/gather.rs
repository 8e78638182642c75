//! The deformable bilinear gather: sampling positions and weights computed once per
//! `(tap, pixel)` and reused for every channel of the offset group.

use super::backend::{self, Backend, WithBackend};
use super::channel_gather::ChannelRows;
use super::channel_lanes;
use super::columns::TapColumns;
use super::locate::{self, ColumnRun, Fields};
use super::pixel_major::{PixelImage, PixelMajor};
use super::taps::{DcnV1Rule, MmcvRule, PlaneLayout, Rule, Tap, TorchvisionRule};
use super::{Source, TileRows, TileSpan};
use crate::convention::Convention;
use crate::float::Float;
use std::ops::Range;

/// The samples of one `(image, offset group, pixel range)`, for every tap: entry `r = k * len
/// + q` of the table ([`TapColumns`]) is tap `k` at pixel `start + q`, with the columns the
/// gather reads ([`Fields::Forward`]).
///
/// `scatter[r]` is the sample's first corner on the padded cells of its convention's
/// [`PlaneLayout`] (the image's [`PixelMajor`] copy), whose four corners `(y0,x0), (y0,x1),
/// (y1,x0), (y1,x1)` are `cell, cell + 1, cell + pitch, cell + pitch + 1`, and `weights[t][r]`
/// corner `t`'s bilinear weight: the backward's table entries by the same rules. A sample
/// outside the window has zero weights and reads the zero cells (value 0); a NaN sample has
/// NaN weights and reads them (value NaN). `m[r]` is the modulation (filled only when the
/// convolution has a mask).
///
/// One cell a sample on padded images, in place of four corner indices (`-1` for none) into
/// the plain image with a zero pixel after it: fewer table writes and reads, and DCN v1 built
/// by the vector rule too. W1 forward, 2 threads, AMD Zen 2 (`cpu family 23`), min of 3-4
/// alternating rounds: AVX2 `f32` 0.63-0.71 -> 0.55-0.61 ms, `f64` 1.17-1.26 -> 1.02-1.13,
/// portable 1.05 -> 0.97, scalar 2.33 -> 2.06, DCN v1 0.92-0.95 -> 0.59-0.62; W2 and W4
/// level.
///
/// An empty table (`default`) grows its buffers on first use and reuses them afterwards.
#[derive(Debug, Default)]
pub(crate) struct SampleTable<T> {
    columns: TapColumns<T>,
    /// `y * stride_h - pad_top` and `x * stride_w - pad_left` of each pixel (vector builds).
    base_y: Vec<T>,
    base_x: Vec<T>,
}

impl<T: Float> SampleTable<T> {
    /// Computes the samples of offset group `og` for `(image, start .. start + len)` under
    /// `src.convention`.
    fn build(
        &mut self,
        src: &Source<'_, T>,
        offset: &[T],
        image: usize,
        og: usize,
        start: usize,
        len: usize,
    ) {
        self.columns.resize(src.geo.taps() * len);
        let rows = (offset, image, og, start, len);
        if self.build_vector(src, rows) {
            return;
        }
        // One monomorphic loop per rule, compiled with the backend's features.
        match src.convention {
            Convention::Torchvision => backend::with_features(
                #[inline(always)]
                || self.build_rows::<TorchvisionRule>(src, rows),
            ),
            Convention::Mmcv => backend::with_features(
                #[inline(always)]
                || self.build_rows::<MmcvRule>(src, rows),
            ),
            Convention::DcnV1 => backend::with_features(
                #[inline(always)]
                || self.build_rows::<DcnV1Rule>(src, rows),
            ),
        }
    }

    /// The table build a vector of pixels at a time ([`locate::fill_columns`]), when every
    /// undeformed position is below [`locate::LIMIT`] and the padded plane below
    /// [`locate::MAX_PLANE`] cells; returns whether it ran.
    fn build_vector(
        &mut self,
        src: &Source<'_, T>,
        (offset, image, og, start, len): Rows<'_, T>,
    ) -> bool {
        let g = src.geo;
        let layout = PlaneLayout::for_convention(src.convention, g.h, g.w);
        let reach = |out: usize, stride: usize, k: usize, dil: usize, pad: usize| {
            out.checked_mul(stride)
                .and_then(|v| v.checked_add(k.checked_mul(dil)?))
                .is_some_and(|v| v < locate::LIMIT && pad < locate::LIMIT)
        };
        if !reach(g.h_out, g.stride_h, g.kh, g.dil_h, g.pad_top)
            || !reach(g.w_out, g.stride_w, g.kw, g.dil_w, g.pad_left)
            || g.h.max(g.w) >= locate::LIMIT
            || layout.len() >= locate::MAX_PLANE
        {
            return false;
        }
        let taps = g.taps();
        let pixels = g.out_pixels();
        self.base_y.resize(len, T::ZERO);
        self.base_x.resize(len, T::ZERO);
        let (mut y, mut x) = (start / g.w_out, start % g.w_out);
        for q in 0..len {
            // Exact integers below 2^22 by the check above.
            self.base_y[q] = T::from_usize(y * g.stride_h) - T::from_usize(g.pad_top);
            self.base_x[q] = T::from_usize(x * g.stride_w) - T::from_usize(g.pad_left);
            x += 1;
            if x == g.w_out {
                (x, y) = (0, y + 1);
            }
        }
        let offset_channels = 2 * g.offset_groups * taps;
        for k in 0..taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let ch = og * taps + k;
            let dy0 = (image * offset_channels + 2 * ch) * pixels + start;
            let mask = src
                .mask
                .map(|m| &m[(image * g.offset_groups * taps + ch) * pixels + start..][..len]);
            let run = ColumnRun {
                at: k * len,
                base_y: &self.base_y[..len],
                base_x: &self.base_x[..len],
                tap_y: T::from_usize(i * g.dil_h),
                tap_x: T::from_usize(j * g.dil_w),
                dy: &offset[dy0..][..len],
                dx: &offset[dy0 + pixels..][..len],
                m: mask,
                plane0: 0,
            };
            locate::fill_columns(
                &mut self.columns,
                src.convention,
                layout,
                &run,
                Fields::Forward,
            );
        }
        true
    }

    /// The table build under rule `R`, entry by entry ([`Tap::with_rule`]).
    #[inline(always)]
    fn build_rows<R: Rule>(
        &mut self,
        src: &Source<'_, T>,
        (offset, image, og, start, len): Rows<'_, T>,
    ) {
        let g = src.geo;
        let layout = PlaneLayout::for_convention(R::CONVENTION, g.h, g.w);
        let taps = g.taps();
        let pixels = g.out_pixels();
        let offset_channels = 2 * g.offset_groups * taps;
        for k in 0..taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let ch = og * taps + k;
            let dy0 = (image * offset_channels + 2 * ch) * pixels + start;
            let m0 = (image * g.offset_groups * taps + ch) * pixels + start;
            let (mut y, mut x) = (start / g.w_out, start % g.w_out);
            let off_y = (i * g.dil_h) as isize - g.pad_top as isize;
            let off_x = (j * g.dil_w) as isize - g.pad_left as isize;
            for q in 0..len {
                let base_y = (y * g.stride_h) as isize + off_y;
                let base_x = (x * g.stride_w) as isize + off_x;
                // `match`, not `map_or`: a closure left out of line loses the features.
                let m = match src.mask {
                    Some(mask) => mask[m0 + q],
                    None => T::ONE,
                };
                let (dy, dx) = (offset[dy0 + q], offset[dy0 + pixels + q]);
                let tap = Tap::with_rule::<R>(layout, 0, (base_y, dy), (base_x, dx), m);
                self.columns.set(k * len + q, &tap);
                x += 1;
                if x == g.w_out {
                    x = 0;
                    y += 1;
                }
            }
        }
    }
}

/// The offsets and `(image, offset group, start, len)` of a table build.
type Rows<'a, T> = (&'a [T], usize, usize, usize, usize);

/// One tap's row of a built [`SampleTable`]: what the gathers read.
#[derive(Clone, Copy)]
pub(crate) struct TapRow<'a, T> {
    /// First corner cells (see [`SampleTable`]).
    pub cell: &'a [i32],
    /// Corner weights, per corner.
    pub weight: [&'a [T]; 4],
    /// The modulation mask, if any.
    pub mask: Option<&'a [T]>,
}

impl<'a, T: Float> TapRow<'a, T> {
    /// The entries of tap `k` of a table built for `len` pixels.
    fn of(table: &'a TapColumns<T>, k: usize, len: usize, has_mask: bool) -> Self {
        let row = k * len..(k + 1) * len;
        TapRow {
            cell: &table.scatter[row.clone()],
            weight: [0, 1, 2, 3].map(|t| &table.weights[t][row.clone()]),
            mask: has_mask.then(|| &table.m[row]),
        }
    }
}

/// Fills the deformable column tile of `span` (`(image, group, start .. start + len)`):
/// `cols[(c' * K + k) * len + q] = m * B(input[n, c], py, px)` (see `kernels` for the layout),
/// building one [`SampleTable`] per offset group that meets the conv group and interpolating
/// its samples a vector of channels at a time from `images` (the batch's images pixel-major,
/// holding `image`): `N` (the backend's lanes) by the generic kernel
/// ([`super::channel_lanes`]), or, for `f32` segments of at most 8 channels on AVX-512, two
/// pixels of 8 a vector ([`super::channel_gather`]). Both give the same bits.
///
/// Row `r` of the tile goes to `out.cols[r * out.ld ..][..len]`. The caller guarantees that
/// the padded plane's cells fit the table ([`fits_cells`]), `ld >= len` and `cols.len() >=
/// (C_in/groups * K - 1) * ld + len`.
pub(crate) fn gather_columns<T: Float>(
    src: &Source<'_, T>,
    offset: &[T],
    span: TileSpan,
    out: TileRows<'_, T>,
    table: &mut SampleTable<T>,
    images: &PixelMajor<T>,
) {
    gather_with(src, offset, span, out, table, images, |t| {
        backend::dispatch(t)
    });
}

/// [`gather_columns`] with every offset group's channels filled by `kernel` (for the tests:
/// the gather on a chosen backend, `|t| b.vectorize(t)`, or [`by_definition`]).
#[cfg(test)]
pub(crate) fn columns_with<T: Float>(
    src: &Source<'_, T>,
    offset: &[T],
    span: TileSpan,
    out: TileRows<'_, T>,
    table: &mut SampleTable<T>,
    images: &PixelMajor<T>,
    kernel: impl FnMut(ChannelTaps<'_, T>),
) {
    gather_with(src, offset, span, out, table, images, kernel);
}

/// The channels of [`ChannelTaps`] by plain scalar loops over its table and the NCHW input of
/// `src` (not the pixel-major copies), image `image`, from the definition
/// `m * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)`: what the kernels' tests compare with.
#[cfg(test)]
pub(crate) fn by_definition<'s, T: Float>(
    src: &'s Source<'_, T>,
    image: usize,
) -> impl FnMut(ChannelTaps<'_, T>) + 's {
    let (g, input) = (src.geo, src.input);
    let layout = PlaneLayout::for_convention(src.convention, g.h, g.w);
    let pitch = layout.pitch();
    let value = move |cell: usize, c: usize| match layout.pixel_of(cell) {
        Some((r, s)) => input[((image * g.c_in + c) * g.h + r) * g.w + s],
        None => T::ZERO,
    };
    move |t| {
        for k in 0..t.taps {
            let tap = TapRow::of(t.table, k, t.len, t.has_mask);
            for c in t.channels.clone() {
                let row = &mut t.cols[((c - t.first) * t.taps + k) * t.ld..][..t.len];
                for (q, v) in row.iter_mut().enumerate() {
                    let corner = [0, 1, pitch, pitch + 1].map(|d| tap.cell[q] as usize + d);
                    let term = |i: usize| tap.weight[i][q] * value(corner[i], c);
                    let sum = ((term(0) + term(1)) + term(2)) + term(3);
                    *v = tap.mask.map_or(sum, |m| m[q] * sum);
                }
            }
        }
    }
}

/// Whether the padded cells of an input plane (of the larger, replicated layout: `(max(H, 1)
/// + 2) x (W + 3)`) fit the table's `i32` cells with a row pitch to spare
/// ([`super::columns::MAX_CELLS`], as the backward's planes).
pub(crate) fn fits_cells(g: &crate::geometry::Geometry) -> bool {
    g.h.max(1)
        .saturating_add(2)
        .checked_mul(g.w.saturating_add(3))
        .is_some_and(|cells| cells <= super::columns::MAX_CELLS)
}

/// [`gather_columns`]' loop: one table per offset group, whose channels `kernel` fills.
fn gather_with<T: Float>(
    src: &Source<'_, T>,
    offset: &[T],
    span: TileSpan,
    out: TileRows<'_, T>,
    table: &mut SampleTable<T>,
    images: &PixelMajor<T>,
    mut kernel: impl FnMut(ChannelTaps<'_, T>),
) {
    let TileSpan {
        image,
        group,
        start,
        len,
    } = span;
    let TileRows { cols, ld } = out;
    let g = src.geo;
    let taps = g.taps();
    let cg = g.c_in_per_group();
    let per_og = g.c_per_offset_group();
    debug_assert!(fits_cells(g));
    debug_assert!(ld >= len && (cg * taps == 0 || cols.len() >= (cg * taps - 1) * ld + len));
    let (c_lo, c_hi) = (group * cg, (group + 1) * cg);
    let mut c = c_lo;
    while c < c_hi {
        let og = c / per_og;
        let chunk_end = c_hi.min((og + 1) * per_og);
        table.build(src, offset, image, og, start, len);
        kernel(ChannelTaps {
            table: &table.columns,
            image: images.image(image),
            channels: c..chunk_end,
            first: c_lo,
            taps,
            len,
            has_mask: src.mask.is_some(),
            cols: &mut *cols,
            ld,
        });
        c = chunk_end;
    }
}

/// Every tap's rows of consecutive channels of one offset group, on the backend of the call:
/// in `f32` on AVX-512 with at most 8 channels by the paired kernel
/// ([`super::channel_gather::interpolate_tap`]), else by the generic one
/// ([`channel_lanes::interpolate_tap`]).
pub(crate) struct ChannelTaps<'a, T> {
    table: &'a TapColumns<T>,
    image: PixelImage<'a, T>,
    channels: Range<usize>,
    first: usize,
    taps: usize,
    len: usize,
    has_mask: bool,
    cols: &'a mut [T],
    ld: usize,
}

impl<T: Float> WithBackend for ChannelTaps<'_, T> {
    type Output = ();

    #[inline(always)]
    fn run<B: Backend>(self, b: B) {
        #[cfg(target_arch = "x86_64")]
        // The paired kernel's element offsets are `i32`.
        if B::ISA == backend::Isa::Avx512
            && self.channels.len() <= 8
            && self.image.values.len() <= i32::MAX as usize
        {
            let (image, table) = (self.image.as_f32(), T::columns_as_f32(self.table));
            if let (Some(image), Some(table), Some(cols)) = (image, table, T::as_f32_mut(self.cols))
            {
                // SAFETY: a backend value of ISA Avx512 exists only where AVX-512F was detected.
                let avx512 = unsafe { backend::Avx512::new_unchecked() };
                for k in 0..self.taps {
                    let tap = TapRow::of(table, k, self.len, self.has_mask);
                    let rows = ChannelRows {
                        channels: self.channels.clone(),
                        first: self.first,
                        taps: self.taps,
                        k,
                    };
                    let out = TileRows {
                        cols: &mut *cols,
                        ld: self.ld,
                    };
                    super::channel_gather::interpolate_tap(
                        avx512, image, rows, &tap, self.len, out,
                    );
                }
                return;
            }
        }
        for k in 0..self.taps {
            let tap = TapRow::of(self.table, k, self.len, self.has_mask);
            let rows = ChannelRows {
                channels: self.channels.clone(),
                first: self.first,
                taps: self.taps,
                k,
            };
            let out = TileRows {
                cols: &mut *self.cols,
                ld: self.ld,
            };
            channel_lanes::interpolate_tap(b, self.image, rows, &tap, self.len, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Geometry;
    use crate::params::ConvParams;

    /// The vector table build (on the backend of `isa`, each CI cap) gives the scalar build's
    /// bits ([`Tap::with_rule`]) under every convention, in `f32` and `f64`, on offsets that
    /// hit every branch of the rules: exact integers, tiny fractions, the `-1` and `H - 1`
    /// borders, NaN, infinities, huge values (the scalar fallback), one-row planes and ragged
    /// pixel ranges.
    #[test]
    fn vector_build_equals_scalar_build() {
        vector_build_case::<f32>();
        vector_build_case::<f64>();
    }

    fn vector_build_case<T: Float>() {
        let specials = [
            0.0f32,
            -1.0,
            1.0,
            -0.5,
            2.0,
            -3.0,
            5.999_999_5,
            -1.000_000_1,
            f32::NAN,
            f32::INFINITY,
            -1e30,
            4_194_304.0,
            -4_194_303.5,
            1e-30,
            -1e-30,
            -0.0,
        ]
        .map(|v| T::from_f64(f64::from(v)));
        let mut state = 5u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state >> 8
        };
        for &(h, w, k, stride, pad, dil) in &[
            (7, 6, 3, 1, 1, 1),
            (9, 13, 2, 2, 0, 3),
            (5, 5, 3, 1, 4, 2),
            (1, 4, 2, 1, 1, 1),
        ] {
            let params = ConvParams::default()
                .padding(pad, pad)
                .stride(stride, stride)
                .dilation(dil, dil)
                .offset_groups(2);
            let geo = Geometry::new([1, 4, h, w], [3, 4, k, k], &params).unwrap();
            let offset: Vec<T> = (0..2 * 2 * k * k * geo.out_pixels())
                .map(|_| {
                    let r = next();
                    if r % 3 == 0 {
                        specials[(r as usize / 3) % specials.len()]
                    } else {
                        T::from_f64(f64::from(r % 4096) / 256.0 - 8.0)
                    }
                })
                .collect();
            // Exactly-integer samples on the first output row: with padding, tap row 0 sits
            // exactly on -1 there (outside by torchvision's rule).
            let mut offset = offset;
            for ch in 0..2 * k * k {
                for x in 0..geo.w_out {
                    offset[(2 * ch) * geo.out_pixels() + x] = T::ZERO;
                }
            }
            let mask: Vec<T> = (0..2 * k * k * geo.out_pixels())
                .map(T::from_usize)
                .collect();
            let conventions = [Convention::Torchvision, Convention::Mmcv, Convention::DcnV1];
            let ranges = [(0, geo.out_pixels()), (1, geo.out_pixels() - 1), (3, 5)];
            for (convention, (start, len)) in
                conventions.into_iter().flat_map(|c| ranges.map(|r| (c, r)))
            {
                let src = Source {
                    geo: &geo,
                    convention,
                    input: &[],
                    offset: Some(&offset),
                    mask: Some(&mask),
                };
                for og in 0..2 {
                    let rows = (&offset[..], 0, og, start, len);
                    let mut vector = SampleTable::<T>::default();
                    vector.columns.resize(geo.taps() * len);
                    assert!(vector.build_vector(&src, rows));
                    let mut scalar = SampleTable::<T>::default();
                    scalar.columns.resize(geo.taps() * len);
                    match convention {
                        Convention::Torchvision => scalar.build_rows::<TorchvisionRule>(&src, rows),
                        Convention::Mmcv => scalar.build_rows::<MmcvRule>(&src, rows),
                        Convention::DcnV1 => scalar.build_rows::<DcnV1Rule>(&src, rows),
                    }
                    let (v, s) = (&vector.columns, &scalar.columns);
                    let at = format!("{convention:?} {h}x{w} k{k} og{og} {start}+{len}");
                    assert_eq!(v.scatter, s.scatter, "cells {at}");
                    let bits = |c: &[T]| c.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<_>>();
                    for t in 0..4 {
                        assert_eq!(bits(&v.weights[t]), bits(&s.weights[t]), "weights {t} {at}");
                    }
                    assert_eq!(bits(&v.m), bits(&s.m), "mask {at}");
                }
            }
        }
    }
}
