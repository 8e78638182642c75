//! Images copied to pixel-major order for the channel-vectorised deformable gather
//! ([`super::channel_gather`]).
//!
//! An NCHW image keeps each channel's plane contiguous, so the 16 channels of one bilinear
//! corner are 16 scattered loads (a hardware gather). Pixel-major, `[H*W + 1][C_in]`, puts the
//! channels of a pixel side by side: one corner of 16 channels is one vector load. The copy
//! costs one pass over the input per call; it is made for as many images at a time as fit
//! [`PIXEL_MAJOR_BUDGET_BYTES`], so it does not grow with the batch (and images larger than
//! that are not copied at all: the forward then uses the per-pixel gather).
//!
//! The extra last pixel is all zeros: a corner outside the image reads it, so the gather has
//! no branch per corner, and an infinite pixel inside the image never meets an outside corner.

use rayon::prelude::*;

/// Most bytes of pixel-major copies held at once.
pub(crate) const PIXEL_MAJOR_BUDGET_BYTES: usize = 8 << 20;

/// Pixels per parallel work item of the copy.
const COPY_PIXELS: usize = 256;

/// Images `first .. first + count` of a batch in pixel-major order: image `n`'s pixel `p`,
/// channel `c` at `image(n)[p * channels + c]`, with pixel `H*W` (the zero pixel) all zeros.
#[derive(Debug, Default)]
pub(crate) struct PixelMajor {
    data: Vec<f32>,
    first: usize,
    count: usize,
    channels: usize,
    pixels: usize,
}

impl PixelMajor {
    /// Images of `channels x pixels` (+1 zero pixel) per [`PIXEL_MAJOR_BUDGET_BYTES`]; 0 when
    /// one image does not fit.
    pub(crate) fn images_per_chunk(channels: usize, pixels: usize) -> usize {
        let bytes = (pixels + 1)
            .saturating_mul(channels)
            .saturating_mul(4)
            .max(1);
        #[cfg(test)]
        let budget = match tests::BUDGET_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
            0 => PIXEL_MAJOR_BUDGET_BYTES,
            bytes => bytes,
        };
        #[cfg(not(test))]
        let budget = PIXEL_MAJOR_BUDGET_BYTES;
        budget / bytes
    }

    /// Copies images `first .. first + count` of `input` (`[N, channels, pixels]`, C-order),
    /// in parallel on the current rayon pool. The copy is exact (no arithmetic), so the way
    /// it is split does not matter.
    pub(crate) fn fill(
        &mut self,
        input: &[f32],
        first: usize,
        count: usize,
        channels: usize,
        pixels: usize,
    ) {
        let per_image = (pixels + 1) * channels;
        assert!(
            input.len() >= (first + count) * channels * pixels,
            "pixel-major copy past the input"
        );
        (self.first, self.count, self.channels, self.pixels) = (first, count, channels, pixels);
        if self.data.capacity() < count * per_image {
            self.data = crate::scratch::take_empty(count * per_image);
        }
        self.data.resize(count * per_image, 0.0);
        if per_image == 0 {
            return;
        }
        let chunk = COPY_PIXELS * channels;
        self.data
            .par_chunks_mut(per_image)
            .enumerate()
            .for_each(|(i, dst)| {
                let src = &input[(first + i) * channels * pixels..][..channels * pixels];
                let (body, zero) = dst.split_at_mut(pixels * channels);
                zero.fill(0.0);
                body.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(b, rows)| {
                        transpose_block(src, channels, pixels, b * COPY_PIXELS, rows);
                    });
            });
    }

    /// Image `n` (of the batch) pixel-major: `(H*W + 1) * channels` values.
    pub(crate) fn image(&self, n: usize) -> &[f32] {
        debug_assert!(n >= self.first && n < self.first + self.count);
        let per_image = (self.pixels + 1) * self.channels;
        &self.data[(n - self.first) * per_image..][..per_image]
    }
}

impl Drop for PixelMajor {
    /// The storage goes back to this thread's scratch cache.
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.data));
    }
}

/// `rows[(p - p0) * channels + c] = src[c * pixels + p]` for the pixels `p0 ..` that `rows`
/// holds (`rows.len()` is a multiple of `channels`).
fn transpose_block(src: &[f32], channels: usize, pixels: usize, p0: usize, rows: &mut [f32]) {
    let count = rows.len() / channels;
    debug_assert!(p0 + count <= pixels && src.len() >= channels * pixels);
    #[cfg(target_arch = "x86_64")]
    if super::lanes::isa() == super::lanes::Isa::Avx512 {
        // SAFETY: AVX-512F was detected; the bounds are the ones asserted above.
        unsafe { x86::transpose_block(src, channels, pixels, p0, count, rows) };
        return;
    }
    for (i, row) in rows.chunks_exact_mut(channels).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = src[c * pixels + p0 + i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::transpose::{first_lanes, transpose16};
    use std::arch::x86_64::*;

    /// [`super::transpose_block`] in 16 x 16 blocks.
    ///
    /// # Safety
    /// AVX-512F; `src` holds `channels * pixels` values, `p0 + count <= pixels` and `rows`
    /// holds `count * channels` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose_block(
        src: &[f32],
        channels: usize,
        pixels: usize,
        p0: usize,
        count: usize,
        rows: &mut [f32],
    ) {
        debug_assert!(src.len() >= channels * pixels && p0 + count <= pixels);
        debug_assert!(rows.len() >= count * channels);
        let mut block = [_mm512_setzero_ps(); 16];
        for q in (0..count).step_by(16) {
            let pw = 16.min(count - q);
            for c0 in (0..channels).step_by(16) {
                let cw = 16.min(channels - c0);
                for (i, v) in block.iter_mut().enumerate() {
                    *v = if i < cw {
                        // SAFETY: channel c0 + i < channels, pixels p0 + q .. + pw <= pixels.
                        unsafe {
                            _mm512_maskz_loadu_ps(
                                first_lanes(pw),
                                src.as_ptr().add((c0 + i) * pixels + p0 + q),
                            )
                        }
                    } else {
                        _mm512_setzero_ps()
                    };
                }
                // SAFETY: AVX-512F (this function's contract).
                unsafe { transpose16(&mut block) };
                for (j, v) in block.iter().enumerate().take(pw) {
                    // SAFETY: row q + j < count, channels c0 .. + cw <= channels.
                    unsafe {
                        _mm512_mask_storeu_ps(
                            rows.as_mut_ptr().add((q + j) * channels + c0),
                            first_lanes(cw),
                            *v,
                        )
                    };
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
            pm.fill(&input, 1, 2, channels, pixels);
            for img in 1..3 {
                let got = pm.image(img);
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
}
