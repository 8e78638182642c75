//! The one GEMM call site of the forward pass: `out_tile = weight_g · cols + bias`, by
//! [`super::multiply`] with the weight packed once per call and shared by every tile (1.5–2.5x
//! matrixmultiply's sgemm on the same tiles on this crate's workloads, AVX-512: matrixmultiply
//! repacks the weight per call). The bias is fused: the sum starts from it.

use super::{multiply, Init, MatB, MatC, PackedA};
use crate::float::Float;

/// The weight of a call, ready for the tiles: per conv group, its `rows x depth` block packed.
pub(crate) struct TileGemm<T: Float> {
    packed: Vec<PackedA<T>>,
}

/// Per-thread scratch of [`TileGemm::multiply_tile`].
#[derive(Debug)]
pub(crate) struct GemmScratch<T> {
    packed_b: Vec<T>,
}

impl<T> Default for GemmScratch<T> {
    fn default() -> Self {
        GemmScratch {
            packed_b: Vec::new(),
        }
    }
}

impl<T: Float> TileGemm<T> {
    /// Packs `weight` (`groups * rows * depth` elements, row-major blocks).
    pub(crate) fn new(weight: &[T], groups: usize, rows: usize, depth: usize) -> Self {
        assert!(weight.len() >= groups * rows * depth);
        let packed = (0..groups)
            .map(|g| PackedA::pack(&weight[g * rows * depth..][..rows * depth], rows, depth))
            .collect();
        TileGemm { packed }
    }

    /// [`TileGemm::new`] for pixel-major column tiles ([`crate::kernels::TileLayout`]): each
    /// group's depth reordered by segment (the channels `s .. e` of one offset group, of
    /// `per_offset_group`), then tap, then channel: column `(s - first) * taps + k * (e - s) +
    /// (c - s)` holds weight column `(c - first) * taps + k`.
    pub(crate) fn segment_major(
        weight: &[T],
        groups: usize,
        rows: usize,
        (channels, taps): (usize, usize),
        per_offset_group: usize,
    ) -> Self {
        let depth = channels * taps;
        assert!(weight.len() >= groups * rows * depth && per_offset_group > 0);
        let mut reordered = crate::scratch::take::<T>(rows * depth);
        let packed = (0..groups)
            .map(|g| {
                let first = g * channels;
                let block = &weight[g * rows * depth..][..rows * depth];
                // The segments `s .. e` of the group's channels.
                let mut segments = Vec::new();
                let mut s = first;
                while s < first + channels {
                    let e = (first + channels).min((s / per_offset_group + 1) * per_offset_group);
                    segments.push((s - first, e - first));
                    s = e;
                }
                let reorder = |(dst, src): (&mut [T], &[T])| {
                    for &(s, e) in &segments {
                        for c in s..e {
                            for (k, &w) in src[c * taps..][..taps].iter().enumerate() {
                                dst[s * taps + k * (e - s) + (c - s)] = w;
                            }
                        }
                    }
                };
                let width = depth.max(1);
                if rows * depth >= 1 << 18 {
                    use rayon::prelude::*;
                    let dst = reordered.par_chunks_exact_mut(width);
                    dst.zip(block.par_chunks_exact(width)).for_each(reorder);
                } else {
                    let dst = reordered.chunks_exact_mut(width);
                    dst.zip(block.chunks_exact(width)).for_each(reorder);
                }
                PackedA::pack(&reordered, rows, depth)
            })
            .collect();
        crate::scratch::give(reordered);
        TileGemm { packed }
    }

    /// `out[o, q] = bias[o] + sum_r weight_g[o, r] * cols[r, q]` for `o < rows`, `q < len`:
    /// the tile's output for conv group `group`. Without bias the output is overwritten without
    /// being read (stale or NaN contents never leak in).
    ///
    /// # Safety
    /// `cols` holds the `depth x len` matrix through its strides; `out` addresses `rows`
    /// rows of `len` writable elements, exclusively owned by the caller for the duration of the
    /// call and disjoint from the weight, `cols` and `bias`.
    pub(crate) unsafe fn multiply_tile(
        &self,
        group: usize,
        cols: MatB<'_, T>,
        len: usize,
        bias: Option<&[T]>,
        out: MatC<T>,
        scratch: &mut GemmScratch<T>,
    ) {
        let packed = &self.packed[group];
        debug_assert!(
            len == 0
                || packed.depth == 0
                || cols.data.len() > (packed.depth - 1) * cols.rs + (len - 1) * cols.cs
        );
        debug_assert!(bias.is_none_or(|b| b.len() >= packed.rows));
        let init = bias.map_or(Init::Zero, Init::Bias);
        // SAFETY: the caller's contract (cols is depth x len, out rows x len).
        unsafe {
            multiply(
                packed,
                cols,
                len,
                init,
                out.ptr,
                out.rs,
                &mut scratch.packed_b,
            )
        }
    }
}
