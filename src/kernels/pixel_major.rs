//! Images copied to pixel-major order for the deformable gather ([`super::channel_lanes`],
//! [`super::channel_gather`]), in `f32` or `f64`.
//!
//! An NCHW image keeps each channel's plane contiguous, so the `N` channels of one bilinear
//! corner are `N` scattered loads (a hardware gather). Pixel-major, `[H*W + 1][C_in]`, puts the
//! channels of a pixel side by side: one corner of `N` channels is one vector load. The copy
//! costs one pass over the input per call; it is made for as many images at a time as fit
//! [`PIXEL_MAJOR_BUDGET_BYTES`] (at least one), so it does not grow with the batch.
//!
//! The extra last pixel is all zeros: a corner outside the image reads it, so the gather has
//! no branch per corner, and an infinite pixel inside the image never meets an outside corner.

use super::backend::{dispatch, Backend, Element, Lanes, WithBackend};
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

/// Pixels per parallel work item of the copy. 64 and 1024 measured level on W2 and W4
/// (same run as [`PIXEL_MAJOR_BUDGET_BYTES`]); 1024 leaves W1's 196-pixel images one item
/// each (W1 `f32` forward 0.48 -> 0.53 ms, median of the rounds).
const COPY_PIXELS: usize = 256;

/// Images `first .. first + count` of a batch in pixel-major order: image `n`'s pixel `p`,
/// channel `c` at `image(n)[p * channels + c]`, with pixel `H*W` (the zero pixel) all zeros.
#[derive(Debug)]
pub(crate) struct PixelMajor<T: Float> {
    data: Vec<T>,
    /// Leading elements skipped so that the first image starts on a 64-byte boundary.
    lead: usize,
    /// Elements from one image to the next: `(pixels + 1) * channels` rounded up to 64 bytes.
    stride: usize,
    first: usize,
    count: usize,
    channels: usize,
    pixels: usize,
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
            pixels: 0,
        }
    }
}

impl<T: Float> PixelMajor<T> {
    /// Images of `channels x pixels` (+1 zero pixel) per [`PIXEL_MAJOR_BUDGET_BYTES`], at
    /// least 1.
    pub(crate) fn images_per_chunk(channels: usize, pixels: usize) -> usize {
        let bytes = (pixels + 1)
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

    /// Copies images `first .. first + count` of `input` (`[N, channels, pixels]`, C-order),
    /// in parallel on the current rayon pool. The copy is exact (no arithmetic), so the way
    /// it is split does not matter.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if the memory for the copies cannot be had (one image may be larger
    /// than [`PIXEL_MAJOR_BUDGET_BYTES`]).
    pub(crate) fn fill(
        &mut self,
        input: &[T],
        first: usize,
        count: usize,
        channels: usize,
        pixels: usize,
    ) -> Result<()> {
        let per_image = (pixels + 1) * channels;
        assert!(
            input.len() >= (first + count) * channels * pixels,
            "pixel-major copy past the input"
        );
        (self.first, self.count, self.channels, self.pixels) = (first, count, channels, pixels);
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
                    "pixel-major copy of {count} image(s) of {channels} x {pixels}: the \
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
        let chunk = COPY_PIXELS * channels;
        self.data.spare_capacity_mut()[..count * self.stride]
            .par_chunks_mut(self.stride)
            .enumerate()
            .for_each(|(i, dst)| {
                let src = &input[(first + i) * channels * pixels..][..channels * pixels];
                dst.par_chunks_mut(chunk).enumerate().for_each(|(b, rows)| {
                    let rows = crate::geometry::filled(rows, T::ZERO);
                    if b * COPY_PIXELS < pixels {
                        let body = rows.len().min((pixels - b * COPY_PIXELS) * channels);
                        transpose_block(src, channels, pixels, b * COPY_PIXELS, &mut rows[..body]);
                    }
                });
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
        let per_image = (self.pixels + 1) * self.channels;
        PixelImage {
            values: &self.data[self.lead + (n - self.first) * self.stride..][..per_image],
            channels: self.channels,
            zero_pixel: self.pixels,
        }
    }
}

/// One image pixel-major: channel `c` of pixel `p` at `values[p * channels + c]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PixelImage<'a, T> {
    /// `(zero_pixel + 1) * channels` values.
    pub values: &'a [T],
    /// Channels per pixel (the image's `C_in`).
    pub channels: usize,
    /// The pixel after the image's `H * W`, all zeros (read for a missing corner).
    pub zero_pixel: usize,
}

impl<'a, T: Element> PixelImage<'a, T> {
    /// The image as an `f32` image, when `T` is `f32` (for the AVX-512 paired gather).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn as_f32(self) -> Option<PixelImage<'a, f32>> {
        Some(PixelImage {
            values: T::as_f32(self.values)?,
            channels: self.channels,
            zero_pixel: self.zero_pixel,
        })
    }
}

impl<T: Float> Drop for PixelMajor<T> {
    /// The storage goes back to this thread's scratch cache.
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.data));
    }
}

/// `rows[(p - p0) * channels + c] = src[c * pixels + p]` for the pixels `p0 ..` that `rows`
/// holds (`rows.len()` is a multiple of `channels`).
fn transpose_block<T: Element>(
    src: &[T],
    channels: usize,
    pixels: usize,
    p0: usize,
    rows: &mut [T],
) {
    let count = rows.len() / channels;
    debug_assert!(p0 + count <= pixels && src.len() >= channels * pixels);
    to_pixel_major(&src[p0..], channels, pixels, count, rows);
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

    #[test]
    fn copies_are_the_transpose_with_a_zero_pixel() {
        for (channels, pixels) in [(1, 1), (3, 17), (16, 16), (8, 196), (37, 300), (20, 513)] {
            let n = 3;
            let input: Vec<f32> = (0..n * channels * pixels).map(|i| i as f32).collect();
            let mut pm = PixelMajor::default();
            pm.fill(&input, 1, 2, channels, pixels).unwrap();
            for img in 1..3 {
                let got = pm.image(img).values;
                for p in 0..pixels {
                    for c in 0..channels {
                        let want = input[(img * channels + c) * pixels + p];
                        assert_eq!(got[p * channels + c], want, "{channels}x{pixels} {p} {c}");
                    }
                }
                assert!(got[pixels * channels..].iter().all(|&v| v == 0.0));
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
