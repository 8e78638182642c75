//! The deformable bilinear gather: sampling positions and weights computed once per
//! `(tap, pixel)` and reused for every channel of the offset group.

use super::backend::{self, Backend, WithBackend};
use super::channel_gather::ChannelRows;
use super::channel_lanes;
use super::columns::TapColumns;
use super::locate::Fields;
use super::pixel_lanes;
use super::pixel_major::{PixelImage, PixelMajor};
use super::taps::PlaneLayout;
use super::tile_table::{build_table, Bases, TableSource};
use super::{Source, TileLayout, TileRows, TileSpan};
use crate::float::Float;
use crate::plan::Piece;
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
    bases: Bases<T>,
}

impl<T: Float> SampleTable<T> {
    /// Computes the samples of offset group `og` for `(image, start .. start + len)` under
    /// `src.convention` ([`build_table`]).
    fn build(
        &mut self,
        src: &Source<'_, T>,
        offset: &[T],
        image: usize,
        og: usize,
        start: usize,
        len: usize,
    ) {
        let g = src.geo;
        let table = TableSource {
            geo: g,
            convention: src.convention,
            layout: PlaneLayout::for_convention(src.convention, g.h, g.w),
            offset,
            mask: src.mask,
            og,
        };
        let tile = [Piece {
            image,
            pixels: start..start + len,
            col0: 0,
        }];
        let (columns, bases) = (&mut self.columns, &mut self.bases);
        build_table(columns, &table, image, &tile, Fields::Forward, bases);
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
/// In `layout` [`TileLayout::ChannelMajor`], row `r` of the tile goes to
/// `out.cols[r * out.ld ..][..len]`: the caller guarantees `ld >= len` and `cols.len() >=
/// (C_in/groups * K - 1) * ld + len`. In [`TileLayout::PixelMajor`] ([`pixel_lanes`]), pixel
/// `q` goes to `out.cols[q * out.ld ..][..C_in/groups * K]`: `ld >= C_in/groups * K` and
/// `cols.len() >= len * ld`. The caller guarantees that the padded plane's cells fit the
/// table ([`fits_cells`]).
pub(crate) fn gather_columns<T: Float>(
    src: &Source<'_, T>,
    offset: &[T],
    span: TileSpan,
    out: (TileLayout, TileRows<'_, T>),
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
    out: (TileLayout, TileRows<'_, T>),
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
    assert_eq!(src.input_order, super::ImageOrder::Nchw);
    let layout = PlaneLayout::for_convention(src.convention, g.h, g.w);
    let pitch = layout.pitch();
    let value = move |cell: usize, c: usize| match layout.pixel_of(cell) {
        Some((r, s)) => input[((image * g.c_in + c) * g.h + r) * g.w + s],
        None => T::ZERO,
    };
    move |t| {
        let seg = &t.channels;
        for k in 0..t.taps {
            let tap = t.table.row(k, t.len, t.has_mask);
            for c in t.channels.clone() {
                for q in 0..t.len {
                    let corner = [0, 1, pitch, pitch + 1].map(|d| tap.cell[q] as usize + d);
                    let term = |i: usize| tap.weight[i][q] * value(corner[i], c);
                    let sum = ((term(0) + term(1)) + term(2)) + term(3);
                    let at = match t.layout {
                        TileLayout::ChannelMajor => ((c - t.first) * t.taps + k) * t.ld + q,
                        TileLayout::PixelMajor => {
                            let slot = (seg.start - t.first) * t.taps + k * seg.len();
                            q * t.ld + slot + c - seg.start
                        }
                    };
                    t.cols[at] = tap.mask.map_or(sum, |m| m[q] * sum);
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
    (layout, out): (TileLayout, TileRows<'_, T>),
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
    debug_assert!(match layout {
        TileLayout::ChannelMajor => {
            ld >= len && (cg * taps == 0 || cols.len() >= (cg * taps - 1) * ld + len)
        }
        TileLayout::PixelMajor => ld >= cg * taps && cols.len() >= len * ld,
    });
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
            layout,
            cols: &mut *cols,
            ld,
        });
        c = chunk_end;
    }
}

/// Every tap's rows of consecutive channels of one offset group, on the backend of the call:
/// into a pixel-major tile by [`pixel_lanes::interpolate_tap`]; into a channel-major one in
/// `f32` on AVX-512 with at most 8 channels by the paired kernel
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
    layout: TileLayout,
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
            && self.layout == TileLayout::ChannelMajor
            && self.channels.len() <= 8
            && self.image.values.len() <= i32::MAX as usize
        {
            let (image, table) = (self.image.as_f32(), self.table.as_f32());
            if let (Some(image), Some(table), Some(cols)) = (image, table, T::as_f32_mut(self.cols))
            {
                // SAFETY: a backend value of ISA Avx512 exists only where AVX-512F was detected.
                let avx512 = unsafe { backend::Avx512::new_unchecked() };
                for k in 0..self.taps {
                    let tap = table.row(k, self.len, self.has_mask);
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
            let tap = self.table.row(k, self.len, self.has_mask);
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
            match self.layout {
                TileLayout::ChannelMajor => {
                    channel_lanes::interpolate_tap(b, self.image, rows, &tap, self.len, out)
                }
                TileLayout::PixelMajor => {
                    pixel_lanes::interpolate_tap(b, self.image, rows, &tap, self.len, out)
                }
            }
        }
    }
}
