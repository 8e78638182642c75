//! The deformable gather into a pixel-major column tile ([`super::TileLayout::PixelMajor`]),
//! written once over the backend's vectors: each sample is interpolated a vector of channels
//! at a time from the pixel-major image ([`super::pixel_major`]), one plain vector load per
//! corner, and stored as it is, since the tile's pixel rows hold a tap's channels side by side.
//!
//! The channel-major tile ([`super::channel_lanes`]) needs the same vectors transposed into
//! one row per channel: for the narrow offset groups of video restoration (8 channels) that
//! transpose and the half-empty vectors it leaves cost as much as the GEMM. Here the GEMM
//! transposes instead, while packing its `B` panels (a 16 x 16 register transpose per block),
//! once per element rather than once per sample vector; see [`super::TileLayout`] for where
//! each layout runs and what it measured.
//!
//! Arithmetic, per lane: `v = m * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)` with separate
//! multiplies and adds, the operations of the channel-major gathers in the same order, so
//! both tiles hold the same values.

use super::backend::{Backend, Element, Lanes};
use super::channel_gather::ChannelRows;
use super::channel_lanes::Sample;
use super::columns::TapRow;
use super::pixel_major::PixelImage;
use super::TileRows;

/// Pixel rows `q < len` of the tile, tap `rows.k`, channels `rows.channels` (one segment
/// `s .. e`): `out.cols[q * out.ld + rows.pixel_slot() + (c - s)] = m * B(channel c, sample
/// (k, q))`.
///
/// `image` is the sample's image pixel-major, `tap` the sampling table row of tap `k` (cells
/// whose four corners lie in the image, checked in debug builds). Mark the caller
/// `#[inline(always)]` under the backend's `vectorize`.
///
/// # Panics
/// If the channels lie outside the image or the conv group, their slots outside the tile, or a
/// table row is shorter than `len`.
#[inline(always)]
pub(crate) fn interpolate_tap<B: Backend, T: Element>(
    b: B,
    image: PixelImage<'_, T>,
    rows: ChannelRows,
    tap: &TapRow<'_, T>,
    len: usize,
    out: TileRows<'_, T>,
) {
    // Whole vectors in the inner loop where the channels allow (no masks, no lane counts).
    if rows
        .channels
        .len()
        .is_multiple_of(<T::V<B> as Lanes<T, B>>::N)
    {
        interpolate::<B, T, true>(b, image, rows, tap, len, out);
    } else {
        interpolate::<B, T, false>(b, image, rows, tap, len, out);
    }
}

/// [`interpolate_tap`]; `FULL`: the channels are whole vectors.
#[inline(always)]
fn interpolate<B: Backend, T: Element, const FULL: bool>(
    b: B,
    image: PixelImage<'_, T>,
    rows: ChannelRows,
    tap: &TapRow<'_, T>,
    len: usize,
    out: TileRows<'_, T>,
) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let cells = image.cells();
    let PixelImage {
        values,
        channels: c_in,
        pitch,
    } = image;
    let slot = rows.pixel_slot();
    let channels = rows.channels;
    let TileRows { cols, ld } = out;
    assert!(
        channels.end <= c_in && channels.start >= rows.first,
        "pixel gather outside its image or conv group"
    );
    assert!(
        channels.is_empty()
            || len == 0
            || (slot + channels.len() <= ld && (len - 1) * ld + ld <= cols.len()),
        "pixel gather outside its column tile"
    );
    assert!(tap.cell.len() >= len && tap.weight.iter().all(|w| w.len() >= len));
    assert!(tap.mask.is_none_or(|m| m.len() >= len));
    // Every entry's last corner, `cell + pitch + 1`, is a cell of the image.
    debug_assert!(tap.cell[..len]
        .iter()
        .all(|&v| v >= 0 && v as usize + pitch + 1 < cells));
    for q in 0..len {
        // SAFETY: q < len, and every table row holds at least len entries (asserted).
        let sample = unsafe { Sample::<B, T>::at(b, tap, q, c_in, pitch) };
        let row = q * ld + slot;
        let mut c0 = channels.start;
        while c0 < channels.end {
            let cw = if FULL { n } else { n.min(channels.end - c0) };
            debug_assert!(sample.at[3] + c0 + cw <= values.len());
            // SAFETY: the corners are cells of the image (the table's contract, checked in
            // debug builds) and channels c0 .. c0 + cw lie below channels.end <= c_in, so the
            // values lie in the image.
            let acc = unsafe { sample.channels::<FULL>(b, values, c0, cw) };
            let at = row + (c0 - channels.start);
            debug_assert!(at + cw <= cols.len());
            // SAFETY: q < len and slot + (c0 - channels.start) + cw <= slot + channels.len() <=
            // ld, so the values lie in pixel row q of the tile (asserted above).
            let dst = unsafe { cols.get_unchecked_mut(at..at + cw) };
            if FULL || cw == n {
                acc.store(dst);
            } else {
                acc.store_partial(dst);
            }
            c0 += cw;
        }
    }
}
