//! How the forward pass splits its work: tiles of `(image, output-pixel range)` whose sizes
//! depend only on the problem's geometry, never on the number of threads or on the batch size.
//!
//! Every output element `out[n, o, y, x]` belongs to exactly one tile (the one holding image
//! `n` and pixel `y * W_out + x`), and the arithmetic that produces it depends only on the
//! tile's own inputs. So the result is bitwise identical for any rayon pool, and image `n` of a
//! batch gets the same bits as the same image computed alone.

use crate::geometry::Geometry;

/// Bytes of column buffer one tile aims for: half of a 2 MiB L2, so that the column tile and
/// the weight panels streamed past it stay in cache.
const COLUMN_BUDGET_BYTES: usize = 1 << 20;

/// Tile lengths below a full image are multiples of this (one AVX-512 vector of `f32`).
const LANE_MULTIPLE: usize = 16;

/// One unit of forward work: pixels `start .. start + len` (row-major `y * W_out + x`) of image
/// `image`, for every output channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tile {
    /// The image `n`.
    pub image: usize,
    /// First output pixel of the tile.
    pub start: usize,
    /// Number of output pixels in the tile (at least 1).
    pub len: usize,
}

/// Output pixels per tile for a column buffer of `rows = C_in/groups * kh * kw` rows of
/// `elem_bytes`-sized elements: as many as fit [`COLUMN_BUDGET_BYTES`], at least
/// [`LANE_MULTIPLE`], at most the whole image, and a multiple of [`LANE_MULTIPLE`] when the
/// image is split.
pub(crate) fn tile_len(rows: usize, pixels: usize, elem_bytes: usize) -> usize {
    let fit = COLUMN_BUDGET_BYTES / (rows.max(1) * elem_bytes.max(1));
    if fit >= pixels {
        return pixels.max(1);
    }
    let len = (fit / LANE_MULTIPLE * LANE_MULTIPLE).max(LANE_MULTIPLE);
    len.min(pixels).max(1)
}

/// The tiles of a forward pass: for each image in order, consecutive pixel ranges of
/// [`tile_len`] pixels (the last one of an image possibly shorter).
pub(crate) fn forward_tiles(geo: &Geometry, elem_bytes: usize) -> (usize, Vec<Tile>) {
    let pixels = geo.out_pixels();
    let len = tile_len(geo.c_in_per_group() * geo.taps(), pixels, elem_bytes);
    let per_image = pixels.div_ceil(len);
    let mut tiles = Vec::with_capacity(geo.n * per_image);
    for image in 0..geo.n {
        let mut start = 0;
        while start < pixels {
            let this = len.min(pixels - start);
            tiles.push(Tile {
                image,
                start,
                len: this,
            });
            start += this;
        }
    }
    (len, tiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_pixel_once_and_ignore_the_batch() {
        for (rows, pixels) in [(4608, 49), (2304, 4096), (72, 144), (1, 1), (10_000_000, 7)] {
            let len = tile_len(rows, pixels, 4);
            assert!(len >= 1 && len <= pixels);
            assert!(len == pixels || len.is_multiple_of(LANE_MULTIPLE));
        }
        assert_eq!(tile_len(4608, 49, 4), 49);
        assert_eq!(tile_len(2304, 4096, 4), 112);
    }
}
