//! Images copied to pixel-major order for the deformable gather ([`super::channel_lanes`],
//! [`super::channel_gather`]), in `f32` or `f64`.
//!
//! An NCHW image keeps each channel's plane contiguous, so the `N` channels of one bilinear
//! corner are `N` scattered loads (a hardware gather). Pixel-major, `[cell][C_in]`, puts the
//! channels of a pixel side by side: one corner of `N` channels is one vector load. The copy
//! costs one pass over the input per call; it is made for as many images at a time as fit
//! [`PIXEL_MAJOR_BUDGET_BYTES`] (at least one), so it does not grow with the batch.
//!
//! Each image is laid out on the padded cells of its convention's [`PlaneLayout`] (the
//! backward's planes, `[cell][channel]`), so the four corners of any sample are `cell`,
//! `cell + 1`, `cell + pitch` and `cell + pitch + 1`: the gather reads one cell index per
//! sample and has no branch per corner, and a sample outside the window reads the zero cells
//! ([`PlaneLayout::zero_base`]), so an infinite pixel inside the image never meets it.

use super::backend::{dispatch, Backend, Element, Lanes, WithBackend};
use super::taps::PlaneLayout;
use super::ImageOrder;
use crate::error::{Error, Result};
use crate::Float;
use rayon::prelude::*;

/// Most bytes of pixel-major copies held at once, unless one image is larger. 16 MiB so that
/// one 256-channel 64x64 `f64` image (W4, 8.4 MB) fits: at 8 MiB it missed by 2 KB and took
/// the per-pixel gather the forward had then, which the figures below compare with.
/// `isa_probe W1 W2 W4`, 2 threads, AMD Zen 4, 5 alternating rounds, each the best of 20
/// (`f64`: 6), median of the rounds, 8 -> 16 MiB: `f64` W4 forward 129.9 -> 106.5 ms, `f32`
/// and the other workloads level (`f32` W4 53.0 -> 52.7); at 4 MiB `f32` W4 missed the same
/// way (53.0 -> 64.7 ms).
pub(crate) const PIXEL_MAJOR_BUDGET_BYTES: usize = 16 << 20;

/// Cells per parallel work item of the copy (whole padded rows, at least one). 64 and 1024
/// measured level on W2 and W4 (same run as [`PIXEL_MAJOR_BUDGET_BYTES`]); 1024 leaves W1's
/// 196-pixel images one item each (W1 `f32` forward 0.48 -> 0.53 ms, median of the rounds).
const COPY_PIXELS: usize = 256;

/// Images `first .. first + count` of a batch in pixel-major order on padded cells: image
/// `n`'s cell `i`, channel `c` at `image(n)[i * channels + c]`.
#[derive(Debug)]
pub(crate) struct PixelMajor<T: Float> {
    data: Vec<T>,
    /// Leading elements skipped so that the first image starts on a 64-byte boundary.
    lead: usize,
    /// Elements from one image to the next: `cells * channels` rounded up to 64 bytes.
    stride: usize,
    first: usize,
    count: usize,
    channels: usize,
    layout: PlaneLayout,
}

impl<T: Float> Default for PixelMajor<T> {
    fn default() -> Self {
        PixelMajor {
            data: Vec::new(),
            lead: 0,
            stride: 0,
            first: 0,
            count: 0,
            channels: 0,
            layout: PlaneLayout::zero_bordered(0, 0),
        }
    }
}

impl<T: Float> PixelMajor<T> {
    /// Images of `channels x cells` per [`PIXEL_MAJOR_BUDGET_BYTES`], at least 1.
    pub(crate) fn images_per_chunk(channels: usize, cells: usize) -> usize {
        let bytes = cells
            .saturating_mul(channels)
            .saturating_mul(std::mem::size_of::<T>())
            .max(1);
        #[cfg(test)]
        let budget = match tests::BUDGET_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
            0 => PIXEL_MAJOR_BUDGET_BYTES,
            bytes => bytes,
        };
        #[cfg(not(test))]
        let budget = PIXEL_MAJOR_BUDGET_BYTES;
        (budget / bytes).max(1)
    }

    /// Copies images `first .. first + count` of `input` (`[N, channels, H, W]` in `order`) onto
    /// the cells of `layout` (borders zero, or replicated for that layout), in parallel on the
    /// current rayon pool. The copy is exact (no arithmetic), so the way it is split does not
    /// matter.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if the memory for the copies cannot be had (one image may be larger
    /// than [`PIXEL_MAJOR_BUDGET_BYTES`]).
    pub(crate) fn fill(
        &mut self,
        input: &[T],
        order: ImageOrder,
        first: usize,
        count: usize,
        channels: usize,
        layout: PlaneLayout,
    ) -> Result<()> {
        let (h, w, pitch) = (layout.h, layout.w, layout.pitch());
        let pixels = h * w;
        let per_image = layout.len() * channels;
        assert!(
            input.len() >= (first + count) * channels * pixels,
            "pixel-major copy past the input"
        );
        (self.first, self.count, self.channels, self.layout) = (first, count, channels, layout);
        // Every image starts on a 64-byte boundary, so a pixel of 8 `f32` (or 8 `f64`: 2
        // lines) never straddles a cache line (a straddling load reads two). W1 `f32` forward,
        // AVX2, 1 thread, AMD Zen 3, minimum of 8 alternating rounds: 1.37 -> 1.32 ms (within
        // this host's noise; kept because it cannot cost more than the padding).
        let line = 64 / std::mem::size_of::<T>();
        self.stride = per_image.div_ceil(line) * line;
        let need = count * self.stride + line;
        if self.data.capacity() < need {
            self.data = crate::scratch::try_take_empty(need).ok_or_else(|| Error::TooLarge {
                what: format!(
                    "pixel-major copy of {count} image(s) of {channels} x {h} x {w}: the \
                     allocation failed"
                ),
            })?;
        }
        self.data.clear();
        self.lead = self.data.as_ptr().align_offset(64).min(line);
        self.data.resize(self.lead, T::ZERO);
        if per_image == 0 {
            return Ok(());
        }
        // Each piece is zeroed right before the copy overwrites it, by the thread that copies it
        // and while it is in L1, instead of a serial fill of the whole buffer first (that fill
        // was 4.6% of W1's 1-thread forward).
        let chunk_rows = (COPY_PIXELS / pitch).max(1);
        self.data.spare_capacity_mut()[..count * self.stride]
            .par_chunks_mut(self.stride)
            .enumerate()
            .for_each(|(i, dst)| {
                let src = &input[(first + i) * channels * pixels..][..channels * pixels];
                dst.par_chunks_mut(chunk_rows * pitch * channels)
                    .enumerate()
                    .for_each(|(b, cells)| {
                        let cells = crate::geometry::filled(cells, T::ZERO);
                        // Padded row `r + 1` holds image row `r`, from cell 1 on.
                        let rows = (b * chunk_rows).max(1)..((b + 1) * chunk_rows).min(h + 1);
                        for padded in rows {
                            let at = ((padded - b * chunk_rows) * pitch + 1) * channels;
                            match order {
                                ImageOrder::Nchw => {
                                    let row = &src[(padded - 1) * w..];
                                    to_pixel_major(row, channels, pixels, w, &mut cells[at..]);
                                }
                                // A channels_last row already is the cells' order.
                                ImageOrder::Nhwc => {
                                    let row = &src[(padded - 1) * w * channels..][..w * channels];
                                    cells[at..][..w * channels].copy_from_slice(row);
                                }
                            }
                        }
                    });
                // SAFETY: every chunk of `dst` was initialised by `filled` just above.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<T>(), dst.len())
                };
                layout.replicate_border(&mut dst[..per_image], channels);
            });
        // SAFETY: the capacity is at least `lead + count * stride` (above: lead <= line) and
        // the `count * stride` slots after the `lead` initialised ones were initialised by
        // `filled`.
        unsafe { self.data.set_len(self.lead + count * self.stride) };
        Ok(())
    }

    /// Image `n` (of the batch) pixel-major.
    pub(crate) fn image(&self, n: usize) -> PixelImage<'_, T> {
        debug_assert!(n >= self.first && n < self.first + self.count);
        let per_image = self.layout.len() * self.channels;
        PixelImage {
            values: &self.data[self.lead + (n - self.first) * self.stride..][..per_image],
            channels: self.channels,
            pitch: self.layout.pitch(),
        }
    }
}

/// One image pixel-major on padded cells: channel `c` of cell `i` at `values[i * channels +
/// c]`; a sample whose table cell is `i` reads cells `i`, `i + 1`, `i + pitch`, `i + pitch +
/// 1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PixelImage<'a, T> {
    /// `cells * channels` values.
    pub values: &'a [T],
    /// Channels per cell (the image's `C_in`).
    pub channels: usize,
    /// Cells per padded row.
    pub pitch: usize,
}

impl<T> PixelImage<'_, T> {
    /// Cells of the image.
    pub(crate) fn cells(&self) -> usize {
        self.values.len() / self.channels.max(1)
    }
}

impl<'a, T: Element> PixelImage<'a, T> {
    /// The image as an `f32` image, when `T` is `f32` (for the AVX-512 paired gather).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn as_f32(self) -> Option<PixelImage<'a, f32>> {
        Some(PixelImage {
            values: T::as_f32(self.values)?,
            channels: self.channels,
            pitch: self.pitch,
        })
    }
}

impl<T: Float> Drop for PixelMajor<T> {
    /// The storage goes back to this thread's scratch cache.
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.data));
    }
}

/// `dst[q * channels + c] = src[c * stride + q]` for `q < count`, `c < channels`: `count`
/// pixels of channel-major planes (`stride` apart) to pixel-major rows.
///
/// # Panics
/// If `src` or `dst` is too short.
pub(crate) fn to_pixel_major<T: Element>(
    src: &[T],
    channels: usize,
    stride: usize,
    count: usize,
    dst: &mut [T],
) {
    if channels == 0 || count == 0 {
        return;
    }
    assert!(src.len() >= (channels - 1) * stride + count && dst.len() >= count * channels);
    dispatch(Transpose {
        src,
        s_row: stride,
        dst,
        d_row: channels,
        rows: channels,
        cols: count,
    })
}

/// `dst[c * stride + q] = src[q * channels + c]` for `q < count`, `c < channels`: the inverse
/// of [`to_pixel_major`].
///
/// # Panics
/// If `src` or `dst` is too short.
pub(crate) fn from_pixel_major<T: Element>(
    src: &[T],
    channels: usize,
    count: usize,
    dst: &mut [T],
    stride: usize,
) {
    if channels == 0 || count == 0 {
        return;
    }
    assert!(dst.len() >= (channels - 1) * stride + count && src.len() >= count * channels);
    dispatch(Transpose {
        src,
        s_row: channels,
        dst,
        d_row: stride,
        rows: count,
        cols: channels,
    })
}

/// NHWC images to NCHW: `dst[(n * channels + c) * pixels + q] = src[(n * pixels + q) *
/// channels + c]`, each image a register transpose, in parallel over pieces of about
/// `PIECE` elements: several small images (a weight's `3 x 3` "images", one per output
/// channel) or one image's blocks of channels (W4's `64 x 64 x 256`).
///
/// # Panics
/// If `src` or `dst` is not a whole number of `channels * pixels` images, or they differ.
pub(crate) fn nchw_from_nhwc<T: Element>(src: &[T], channels: usize, pixels: usize, dst: &mut [T]) {
    const PIECE: usize = 32 << 10;
    let image = channels * pixels;
    if image == 0 {
        return;
    }
    assert!(src.len() == dst.len() && src.len().is_multiple_of(image));
    let transpose = |src: &[T], dst: &mut [T]| {
        let cols = dst.len() / pixels;
        dispatch(Transpose {
            src,
            s_row: channels,
            dst,
            d_row: pixels,
            rows: pixels,
            cols,
        })
    };
    if image < PIECE {
        let images = PIECE / image;
        dst.par_chunks_mut(images * image)
            .zip(src.par_chunks(images * image))
            .for_each(|(dst, src)| {
                for (dst, src) in dst.chunks_mut(image).zip(src.chunks(image)) {
                    transpose(src, dst);
                }
            });
    } else {
        let block = (PIECE / pixels).max(1);
        dst.par_chunks_mut(image)
            .zip(src.par_chunks(image))
            .for_each(|(dst, src)| {
                dst.par_chunks_mut(block * pixels)
                    .enumerate()
                    .for_each(|(b, dst)| transpose(&src[b * block..], dst))
            });
    }
}

/// `dst[j * d_row + i] = src[i * s_row + j]` for `i < rows`, `j < cols`, in `N x N` blocks
/// transposed in registers ([`Lanes::transpose`]): exact copies. Measured on an AMD Zen 4 (W4
/// full backward, `f32`, AVX2, 1 thread): the planes' copies in and out took 6.6% of the
/// samples element by element.
struct Transpose<'a, T> {
    src: &'a [T],
    s_row: usize,
    dst: &'a mut [T],
    d_row: usize,
    rows: usize,
    cols: usize,
}

impl<T: Element> WithBackend for Transpose<'_, T> {
    type Output = ();

    #[inline(always)]
    fn run<B: Backend>(self, b: B) {
        let Transpose {
            src,
            s_row,
            dst,
            d_row,
            rows,
            cols,
        } = self;
        let n = <T::V<B> as Lanes<T, B>>::N;
        assert!(n <= 16);
        let zero = T::V::<B>::splat(b, T::default());
        let mut block = [zero; 16];
        for j0 in (0..cols).step_by(n) {
            let nj = n.min(cols - j0);
            for i0 in (0..rows).step_by(n) {
                let ni = n.min(rows - i0);
                for (i, v) in block[..n].iter_mut().enumerate() {
                    *v = if i < ni {
                        let row = &src[(i0 + i) * s_row + j0..][..nj];
                        if nj == n {
                            T::V::<B>::load(b, row)
                        } else {
                            T::V::<B>::load_partial(b, row)
                        }
                    } else {
                        zero
                    };
                }
                T::V::<B>::transpose(b, &mut block[..n]);
                for (j, v) in block[..nj].iter().enumerate() {
                    let row = &mut dst[(j0 + j) * d_row + i0..][..ni];
                    if ni == n {
                        v.store(row);
                    } else {
                        v.store_partial(row);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A smaller chunk budget for tests of the chunking (0: the real one). Chunking changes no
    /// result bits, so tests running meanwhile are unaffected.
    pub(crate) static BUDGET_OVERRIDE: AtomicUsize = AtomicUsize::new(0);

    /// Every cell of the copies holds its pixel's channels, or zeros, as the layout defines
    /// ([`PlaneLayout::pixel_of`]), on both layouts, with images of one and several chunks.
    #[test]
    fn copies_are_the_padded_transpose() {
        for (channels, h, w) in [
            (1, 1, 1),
            (3, 3, 5),
            (16, 4, 4),
            (8, 14, 14),
            (20, 19, 27),
            (2, 0, 3),
        ] {
            for layout in [
                PlaneLayout::zero_bordered(h, w),
                PlaneLayout::replicated(h, w),
            ] {
                let (n, pixels) = (3, h * w);
                let input: Vec<f32> = (0..n * channels * pixels).map(|i| i as f32 + 1.0).collect();
                // The same images channels_last: nhwc[(n * pixels + q) * channels + c].
                let mut nhwc = vec![0.0; input.len()];
                for (i, &v) in input.iter().enumerate() {
                    let (img, c, q) =
                        (i / (channels * pixels), (i / pixels) % channels, i % pixels);
                    nhwc[(img * pixels + q) * channels + c] = v;
                }
                for (order, input_in_order) in
                    [(ImageOrder::Nchw, &input), (ImageOrder::Nhwc, &nhwc)]
                {
                    let mut pm = PixelMajor::default();
                    pm.fill(input_in_order, order, 1, 2, channels, layout)
                        .unwrap();
                    for img in 1..3 {
                        let got = pm.image(img);
                        assert_eq!(got.values.len(), layout.len() * channels);
                        for cell in 0..layout.len() {
                            for c in 0..channels {
                                let want = layout.pixel_of(cell).map_or(0.0, |(r, s)| {
                                    input[(img * channels + c) * pixels + r * w + s]
                                });
                                let at = format!(
                                    "{order:?} {layout:?} {channels} cell {cell} channel {c}"
                                );
                                assert_eq!(got.values[cell * channels + c], want, "{at}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// `from_pixel_major` undoes `to_pixel_major`, on strided planes with ragged blocks, in
    /// `f32` and `f64` (different vector widths).
    #[test]
    fn from_pixel_major_inverts_to_pixel_major() {
        fn check<T: Float>() {
            for (channels, count, stride) in [(1, 1, 1), (5, 17, 20), (16, 16, 16), (33, 40, 41)] {
                let src: Vec<T> = (0..channels * stride)
                    .map(|i| T::from_f64(i as f64 + 0.5))
                    .collect();
                let mut pm = vec![T::from_f64(f64::NAN); count * channels];
                to_pixel_major(&src, channels, stride, count, &mut pm);
                for q in 0..count {
                    for c in 0..channels {
                        assert_eq!(pm[q * channels + c], src[c * stride + q]);
                    }
                }
                let mut back = vec![-T::ONE; channels * stride];
                from_pixel_major(&pm, channels, count, &mut back, stride);
                for c in 0..channels {
                    for q in 0..stride {
                        let want = if q < count {
                            src[c * stride + q]
                        } else {
                            -T::ONE
                        };
                        assert_eq!(back[c * stride + q], want, "{channels} {count} {c} {q}");
                    }
                }
            }
        }
        check::<f32>();
        check::<f64>();
    }
}
