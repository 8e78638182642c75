//! How the forward pass splits its work: tiles of `(image, output-pixel range)` whose sizes
//! depend only on the problem's geometry, never on the number of threads or on the batch size.
//!
//! Every output element `out[n, o, y, x]` belongs to exactly one tile (the one holding image
//! `n` and pixel `y * W_out + x`), and the arithmetic that produces it depends only on the
//! tile's own inputs. So the result is bitwise identical for any rayon pool, and image `n` of a
//! batch gets the same bits as the same image computed alone.

use crate::geometry::Geometry;
use crate::kernels::TileLayout;

/// Bytes of column buffer one tile aims for: half of a 2 MiB L2, so that the column tile and
/// the weight panels streamed past it stay in cache. Measured against 4 MiB on AMD Zen 5
/// (1 MiB L2; `isa_probe W2 W4`, 2 threads, 3 alternating rounds): `f32` W4 forward 25.9-27.0
/// ms here against 29.5-30.7 there, W2 level or worse; only W2's `f64` dense forward gained
/// (30.0-34.4 -> 26.9-32.2 ms).
const COLUMN_BUDGET_BYTES: usize = 1 << 20;

/// Tile lengths are multiples of this (the GEMM's register-block width, three AVX-512
/// vectors of `f32`) unless the whole batch fits one tile. 16 and 96 measured level
/// (`isa_probe W1 W2 W4`, f32, 2 threads, AMD Zen 4, 6 alternating rounds, each the best of 20;
/// best round: W1/W2/W4 forward 0.42/19.00/51.28 ms at 48, 0.43/18.97/51.97 at 16,
/// 0.42/18.86/51.21 at 96).
const LANE_MULTIPLE: usize = 48;

/// Tile lengths where every tile costs a pass over the whole weight, so that fewer, longer
/// tiles pay: where even [`LANE_MULTIPLE`] pixels overflow [`COLUMN_BUDGET_BYTES`], or where
/// the GEMM packs its operands itself on every product (matrixmultiply, on the portable and
/// scalar backends).
///
/// Overflow (W2 and W2s in `f64`: 4608 rows of 8 bytes): the tile cannot stay in L2 whatever
/// its length, and every tile streams the whole weight (19 MB for W2 in `f64`) past it, so
/// fewer, longer tiles pay. `isa_probe`, `f64`, AVX-512, 2 threads, AMD Zen 4, 8 alternating
/// rounds, min: W2 forward 51.3 ms at 48, 47.5 at 96, 45.4 at 192; W2s 55.8 / 50.1 / 48.0.
/// Shapes whose 48-pixel tile fits are not changed: there longer tiles lost (W4 `f64` forward
/// 108 -> 117 -> 123 ms at 48 / 96 / 192, `f32` W2 19.5 -> 21.6 at 192). This rule against
/// 48 (W2 `f64` forward, min of 8 alternating rounds): AVX-512 50.4 -> 46.0 ms, AVX2 61.1 ->
/// 50.8, portable 55.8 -> 46.4 (5 rounds); `f32` level.
///
/// Repacking GEMM: matrixmultiply packed W2's 9.4 MB weight again for every 48-pixel tile,
/// 32% of the portable `f32` W2 forward (1 thread, AMD Zen 4 profile). Tiles of 192 against
/// 48 / 96 (`isa_probe`, 2 threads, same Zen 4, median of 5 alternating rounds, ms): portable
/// `f32` W2 forward 36.1 -> 30.3, W4 73.6 -> 69.7, W1 level (0.69 / 0.68); scalar `f32` W2
/// 34.5 -> 29.9, W4 82.3 -> 78.8, W1 level; portable `f64` W2 level (192 already), W4 123.9
/// -> 128.0 (its minima 122.3 / 124.4).
const LONG_MULTIPLE: usize = 4 * LANE_MULTIPLE;

/// The longest column tile [`LONG_MULTIPLE`] may make, per thread (W2 in `f64`: 7.1 MB);
/// wider layers keep [`LANE_MULTIPLE`], so the forward's workspace stays bounded.
const LONG_TILE_BYTES: usize = 8 << 20;

/// Enough tiles for two threads to balance (a thread's last tile is at most 1/8 of its work).
/// 8 measured level and 32 no better (same run as [`LANE_MULTIPLE`]: W1/W2 forward median
/// of the rounds 0.42/19.23 ms at 16 and at 8, 0.46/21.41 at 32).
const MIN_TILES: usize = 16;

/// One unit of forward work: the flat output pixels `first .. first + len` of the batch (flat
/// index `n * H_out * W_out + y * W_out + x`), for every output channel. A tile may span
/// several images: small images are batched so that the GEMM sees enough columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tile {
    /// First flat output pixel of the tile.
    pub first: usize,
    /// Number of flat output pixels in the tile (at least 1).
    pub len: usize,
}

/// The part of a tile inside one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The image `n`.
    pub image: usize,
    /// First output pixel inside the image.
    pub start: usize,
    /// Number of pixels.
    pub len: usize,
    /// Column of the tile where the segment begins.
    pub column: usize,
}

impl Tile {
    /// The tile's pieces, one per image it meets, in order (`pixels` = `H_out * W_out` > 0).
    pub(crate) fn segments(self, pixels: usize) -> impl Iterator<Item = Segment> {
        let end = self.first + self.len;
        let mut at = self.first;
        std::iter::from_fn(move || {
            (at < end).then(|| {
                let (image, start) = (at / pixels, at % pixels);
                let len = (pixels - start).min(end - at);
                let seg = Segment {
                    image,
                    start,
                    len,
                    column: at - self.first,
                };
                at += len;
                seg
            })
        })
    }
}

/// Flat pixels per tile for a column buffer of `rows = C_in/groups * kh * kw` rows of
/// `elem_bytes`-sized elements and `total` flat pixels: as many as fit
/// [`COLUMN_BUDGET_BYTES`] but few enough for [`MIN_TILES`] tiles, a multiple of
/// [`LANE_MULTIPLE`] (at least one; of [`LONG_MULTIPLE`] where one `LANE_MULTIPLE` already
/// overflows the budget or the GEMM `repacks` its weight per tile, up to [`LONG_TILE_BYTES`]),
/// at most `total`.
pub(crate) fn tile_len(rows: usize, total: usize, elem_bytes: usize, repacks: bool) -> usize {
    let fit = COLUMN_BUDGET_BYTES / (rows.max(1) * elem_bytes.max(1));
    let long_tile_bytes = rows.saturating_mul(elem_bytes * LONG_MULTIPLE);
    let multiple = if (repacks || fit < LANE_MULTIPLE) && long_tile_bytes <= LONG_TILE_BYTES {
        LONG_MULTIPLE
    } else {
        LANE_MULTIPLE
    };
    let balanced = total.div_ceil(MIN_TILES).next_multiple_of(multiple);
    let len = (fit / multiple * multiple).clamp(multiple, balanced.max(multiple));
    len.min(total).max(1)
}

/// Widest conv group output (`C_out / groups`) for which a deformable forward uses
/// pixel-major tiles (see [`tile_layout`]).
const PIXEL_MAJOR_MAX_ROWS: usize = 128;

/// Narrowest offset group (channels) for which a deformable forward uses pixel-major tiles.
const PIXEL_MAJOR_MIN_CHANNELS: usize = 16;

/// How the forward lays out its column tiles ([`TileLayout`]): pixel-major for deformable
/// convolutions whose offset groups hold at least [`PIXEL_MAJOR_MIN_CHANNELS`] channels and
/// whose conv groups at most [`PIXEL_MAJOR_MAX_ROWS`] outputs, channel-major otherwise.
///
/// Why: the pixel-major gather stores its vectors without the channel-major one's register
/// transposes, but the GEMM then packs its `B` transposed, a cost per column element that the
/// GEMM's `C_out / groups` rows amortise; with 8-channel offset groups the paired AVX-512
/// gather ([`crate::kernels::channel_gather`]) stays faster. Deformable forward, ms, medians
/// of 3 alternating rounds (Intel Xeon, AVX-512, 2 threads, `fwd_probe`), channel-major /
/// pixel-major: CenterNet-64 (64 outputs) 4.96 / 4.11, R50-DCN-c3 (128) 30.5 / 27.4,
/// W3-5x5 (64) 89.4 / 83.8, W3-3x3d2 43.2 / 39.6, W3-3x3 41.6 / 41.3; against it W4 (256)
/// 45.2 / 45.7, CenterNet-16 (256) 4.65 / 6.52, W2 (512) 19.1 / 25.5, R50-DCN-c5 (512)
/// 24.4 / 30.7, and with 8-channel groups BasicVSRpp-align 94.2 / 105.1, EDVR-PCD 45.3 /
/// 51.9, W1 0.41 / 0.54.
pub(crate) fn tile_layout(geo: &Geometry, deformable: bool) -> TileLayout {
    if deformable
        && geo.c_per_offset_group() >= PIXEL_MAJOR_MIN_CHANNELS
        && geo.c_out_per_group() <= PIXEL_MAJOR_MAX_ROWS
    {
        TileLayout::PixelMajor
    } else {
        TileLayout::ChannelMajor
    }
}

/// The tiles of a forward pass: consecutive flat pixel ranges of [`tile_len`] pixels over the
/// whole batch (the last one possibly shorter). They depend on the geometry and the GEMM
/// engine only (`repacks`: see [`LONG_MULTIPLE`]), never on the thread count; and since every
/// output element's arithmetic is independent of where tiles begin, an image gets the same
/// bits in any batch.
pub(crate) fn forward_tiles(
    geo: &Geometry,
    elem_bytes: usize,
    repacks: bool,
) -> (usize, Vec<Tile>) {
    let total = geo.n * geo.out_pixels();
    let len = tile_len(
        geo.c_in_per_group() * geo.taps(),
        total,
        elem_bytes,
        repacks,
    );
    let tiles = (0..total)
        .step_by(len.max(1))
        .map(|first| Tile {
            first,
            len: len.min(total - first),
        })
        .collect();
    (len, tiles)
}

/// The parts of `tiles` inside the flat pixel range `lo .. hi`, in order (tiles straddling a
/// bound are cut there).
pub(crate) fn clip(tiles: &[Tile], lo: usize, hi: usize) -> Vec<Tile> {
    tiles
        .iter()
        .filter_map(|t| {
            let (first, end) = (t.first.max(lo), (t.first + t.len).min(hi));
            (first < end).then_some(Tile {
                first,
                len: end - first,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_lengths_fit_the_budget_and_balance() {
        for (rows, total) in [
            (4608, 784),
            (2304, 8192),
            (72, 9216),
            (1, 1),
            (10_000_000, 7),
        ] {
            for repacks in [false, true] {
                let len = tile_len(rows, total, 4, repacks);
                assert!(len >= 1 && len <= total);
                assert!(len == total || len.is_multiple_of(LANE_MULTIPLE));
            }
        }
        assert_eq!(tile_len(4608, 16 * 49, 4, false), 48);
        assert_eq!(tile_len(2304, 2 * 4096, 4, false), 96);
        assert_eq!(tile_len(72, 64 * 144, 4, false), 576);
        // f64: W2's 48-pixel tile overflows the budget, so its tiles grow; W4's fits and stays;
        // a layer too wide for a long tile keeps the short one.
        assert_eq!(tile_len(4608, 16 * 49, 8, false), 192);
        assert_eq!(tile_len(2304, 2 * 4096, 8, false), 48);
        assert_eq!(tile_len(100_000, 4096, 8, false), 48);
        // A GEMM that repacks the weight per tile gets long tiles, within the same bound.
        assert_eq!(tile_len(4608, 16 * 49, 4, true), 192);
        assert_eq!(tile_len(2304, 2 * 4096, 4, true), 192);
        assert_eq!(tile_len(72, 64 * 144, 4, true), 576);
        assert_eq!(tile_len(100_000, 4096, 4, true), 48);
    }

    #[test]
    fn segments_cover_the_tile_in_order() {
        let tile = Tile { first: 40, len: 60 };
        let segs: Vec<_> = tile.segments(49).collect();
        assert_eq!(
            segs,
            [
                Segment {
                    image: 0,
                    start: 40,
                    len: 9,
                    column: 0
                },
                Segment {
                    image: 1,
                    start: 0,
                    len: 49,
                    column: 9
                },
                Segment {
                    image: 2,
                    start: 0,
                    len: 2,
                    column: 58
                },
            ]
        );
    }
}
