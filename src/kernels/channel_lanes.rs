//! The channel gather ([`super::channel_gather`]) written once over the backend's vectors
//! ([`super::backend`]), for `f32` and `f64`: for one tap and `N` output pixels (`N` lanes of
//! the backend's vector), each pixel's sample is interpolated for `N` channels at once from
//! the pixel-major image ([`super::pixel_major`]), one plain vector load per corner, and the
//! `N x N` block (pixels x channels) is transposed in registers ([`Lanes::transpose`]) into
//! `N` rows of the column tile.
//!
//! A per-pixel gather from the NCHW planes needs a gather per corner (hardware on AVX2 /
//! AVX-512, `N` scalar loads elsewhere); here a corner of `N` channels is one load, whatever the
//! backend. That per-pixel gather was the forward's until every backend measured level or
//! faster with this kernel; it is gone. Deformable forward in ms, per-pixel -> this kernel, min
//! of runs alternating the two binaries in one sitting, 2 threads (`isa_probe`, `PARTS=fwd`):
//!
//! ```text
//!                 W1 (8 ch)      W2 (128 ch / offset group)   W4 (256 ch)
//! Intel Xeon with AVX-512:
//! avx2 f32       1.01 -> 1.00   26.00 -> 22.83   58.52 -> 56.08
//! avx2 f64       1.39 -> 1.40   48.90 -> 47.59  130.95 -> 127.43
//! portable f32   2.24 -> 2.27   32.05 -> 24.79   68.92 -> 60.54
//! portable f64   2.65 -> 2.54   53.61 -> 49.19  139.11 -> 135.28
//! avx512 f64     1.25 -> 1.32   37.73 -> 36.77  100.08 -> 91.99
//! AMD Zen 5 (full-width AVX-512):
//! avx512 f64     0.95 -> 0.77   38.89 -> 38.99   71.11 -> 72.83
//! scalar f32     1.64 -> 1.61   27.01 -> 26.63   54.09 -> 53.28
//! scalar f64     1.77 -> 1.70   36.14 -> 37.60   88.66 -> 86.31
//! AMD Zen 3 (AVX2, no AVX-512; 4 and 3 alternating rounds):
//! scalar f32     2.71 -> 2.32   42.81 -> 41.53  105.42 -> 101.18
//! scalar f64     3.66 -> 3.11   64.93 -> 67.45  221.62 -> 198.63
//! ```
//!
//! Arithmetic, per lane: `v = m * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)` with separate
//! multiplies and adds (the definition, which the tests compute with plain loops), so the
//! column tile has the same bits on every backend. The corners are the table's cell and its
//! neighbours on the padded image ([`super::pixel_major`]): one index a sample.

use super::backend::{Backend, Element, Lanes};
use super::channel_gather::ChannelRows;
use super::columns::TapRow;
use super::pixel_major::PixelImage;
use super::TileRows;

/// Vectors held for one part of the channels: `blocks x N` vectors, one per channel block and
/// pixel, so a pixel's corner rows are read front to back over the part's channels before the
/// next pixel's (as the AVX-512 kernel does). 128 and 512 measured level
/// (`isa_probe W1 W2 W4`, 2 threads, AMD Zen 4, 5 alternating rounds each the best of 20, `f64` 6; medians of the rounds: `f32` W2/W4 forward 20.9/53.0 ms at 256,
/// 20.2/53.1 at 128, 22.1/52.6 at 512).
const STAGE: usize = 256;

/// One sample of a tap row, ready for its channels: the element offsets of its four corners in
/// the pixel-major image (`(y0,x0), (y0,x1), (y1,x0), (y1,x1)`), their weights and the mask,
/// splat across the backend's vectors. Shared by the channel-major and pixel-major gathers
/// ([`super::pixel_lanes`]).
pub(super) struct Sample<B: Backend, T: Element> {
    /// Element offset of channel 0 of each corner.
    pub(super) at: [usize; 4],
    w: [T::V<B>; 4],
    m: Option<T::V<B>>,
}

impl<B: Backend, T: Element> Sample<B, T> {
    /// Entry `q` of `tap`, on an image of `c_in` channels and `pitch` cells a row.
    ///
    /// # Safety
    /// `q` is below the length of every column of `tap`.
    #[inline(always)]
    pub(super) unsafe fn at(
        b: B,
        tap: &TapRow<'_, T>,
        q: usize,
        c_in: usize,
        pitch: usize,
    ) -> Self {
        debug_assert!(q < tap.cell.len() && tap.weight.iter().all(|w| q < w.len()));
        // SAFETY: q is inside the table row (the caller's contract).
        let first = unsafe { *tap.cell.get_unchecked(q) } as usize * c_in;
        let at = [
            first,
            first + c_in,
            first + pitch * c_in,
            first + (pitch + 1) * c_in,
        ];
        let mut w = [T::V::<B>::splat(b, T::default()); 4];
        for (t, wt) in w.iter_mut().enumerate() {
            // SAFETY: as above.
            *wt = T::V::<B>::splat(b, unsafe { *tap.weight[t].get_unchecked(q) });
        }
        // `match`, not `Option::map`: a closure left out of line loses the features.
        #[allow(clippy::manual_map)]
        let m = match tap.mask {
            // SAFETY: as above (the mask is a column of the row).
            Some(m) => Some(T::V::<B>::splat(b, unsafe { *m.get_unchecked(q) })),
            None => None,
        };
        Sample { at, w, m }
    }

    /// `m * (((w0 v0 + w1 v1) + w2 v2) + w3 v3)` for channels `c0 .. c0 + cw` (`cw <= N`;
    /// `FULL`: `cw == N`), lanes past `cw` zero.
    ///
    /// # Safety
    /// Every corner's channels `c0 .. c0 + cw` lie in `values` (`at[3] + c0 + cw <=
    /// values.len()`, the largest of the four).
    #[inline(always)]
    pub(super) unsafe fn channels<const FULL: bool>(
        &self,
        b: B,
        values: &[T],
        c0: usize,
        cw: usize,
    ) -> T::V<B> {
        let n = <T::V<B> as Lanes<T, B>>::N;
        debug_assert!(cw <= n && self.at[3] + c0 + cw <= values.len());
        // Macro, not closure: a closure left out of line loses the backend's features.
        macro_rules! corner {
            ($t:expr) => {{
                let from = self.at[$t] + c0;
                // SAFETY: inside `values` (the caller's contract; at[3] is the largest).
                let corner = unsafe { values.get_unchecked(from..from + cw) };
                if FULL || cw == n {
                    T::V::<B>::load(b, corner)
                } else {
                    T::V::<B>::load_partial(b, corner)
                }
            }};
        }
        let mut acc = self.w[0].mul(corner!(0));
        acc = acc.add(self.w[1].mul(corner!(1)));
        acc = acc.add(self.w[2].mul(corner!(2)));
        acc = acc.add(self.w[3].mul(corner!(3)));
        match self.m {
            Some(m) => m.mul(acc),
            None => acc,
        }
    }
}

/// The rows `rows` of the column tile, for `q < len`:
/// `out.cols[((c - first) * taps + k) * out.ld + q] = m * B(channel c, sample (k, q))`,
/// `N = T::V::<B>::N` pixels a block.
///
/// `image` is the sample's image pixel-major, `tap` the sampling table row of tap `k` (cells
/// whose four corners lie in the image, checked in debug builds). Mark the caller
/// `#[inline(always)]` under the backend's `vectorize`.
///
/// # Panics
/// If the channels lie outside the image or the rows outside the column tile, or a table row
/// is shorter than `len`.
#[inline(always)]
pub(crate) fn interpolate_tap<B: Backend, T: Element>(
    b: B,
    image: PixelImage<'_, T>,
    rows: ChannelRows,
    tap: &TapRow<'_, T>,
    len: usize,
    out: TileRows<'_, T>,
) {
    // Whole vectors of channels (W1's 8 channels on AVX2, in `f32` or `f64`): no partial
    // loads or lane counts in the inner loop, and the table read without bounds checks. W1
    // forward on AVX2, AMD Zen 3 (`cpu family 25`, no AVX-512), `fwd_probe` / `isa_probe`,
    // minimum of runs alternating the two binaries: `f32` 1 thread 1.52 -> 1.35 ms, 2 threads
    // 1.28 -> 1.09; `f64` 2 threads 2.21 -> 1.50.
    if rows
        .channels
        .len()
        .is_multiple_of(<T::V<B> as Lanes<T, B>>::N)
    {
        interpolate_blocks::<B, T, true>(b, image, rows, tap, len, out);
    } else {
        interpolate_blocks::<B, T, false>(b, image, rows, tap, len, out);
    }
}

/// [`interpolate_tap`]; `FULL`: every channel block is a whole vector.
#[inline(always)]
fn interpolate_blocks<B: Backend, T: Element, const FULL: bool>(
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
    let channels = rows.channels.clone();
    assert!(
        channels.end <= c_in && channels.start >= rows.first,
        "channel gather outside its image"
    );
    let TileRows { cols, ld } = out;
    assert!(
        channels.is_empty() || cols.len() >= rows.row(channels.end - 1) * ld + len && len <= ld,
        "channel gather outside its column tile"
    );
    assert!(tap.cell.len() >= len && tap.weight.iter().all(|w| w.len() >= len));
    assert!(tap.mask.is_none_or(|m| m.len() >= len));
    assert!(n <= 16);
    // Every entry's last corner, `cell + pitch + 1`, is a cell of the image.
    debug_assert!(tap.cell[..len]
        .iter()
        .all(|&v| v >= 0 && v as usize + pitch + 1 < cells));
    let zero = T::V::<B>::splat(b, T::default());
    let part_channels = STAGE / n * n;
    // stage[block * N + p]: channel block `block` of pixel `p`. Entries past the current
    // pixels hold earlier values; their lanes are never stored. Only the entries a part can
    // use are initialised: zeroing all of `STAGE` on every call was 3.6% of the AVX2 W1
    // forward (8 channels use 8 of the 256 entries). W1 forward, 1 thread, minimum of 200
    // runs over 6 alternating rounds (AMD Zen 4, noisy host): AVX2 f32 1.23 -> 1.18 ms,
    // AVX-512 f64 1.78 -> 1.66, portable f32 3.30 -> 3.19.
    let used = channels.len().min(part_channels).div_ceil(n) * n;
    let mut stage_memory = [std::mem::MaybeUninit::<T::V<B>>::uninit(); STAGE];
    for entry in &mut stage_memory[..used] {
        entry.write(zero);
    }
    debug_assert!(used <= STAGE);
    // SAFETY: the first `used <= STAGE` entries were initialised just above.
    let stage: &mut [T::V<B>] =
        unsafe { std::slice::from_raw_parts_mut(stage_memory.as_mut_ptr().cast(), used) };
    let mut block = [zero; 16];
    let mut part = channels.start;
    while part < channels.end {
        let part_end = channels.end.min(part + part_channels);
        let blocks = (part_end - part).div_ceil(n);
        // One whole block (W1's 8 channels on AVX2): the pixels go straight to `block`, not
        // through `stage`. W1 `f32` forward, AVX2, AMD Zen 3, minimum of 8 alternating rounds:
        // 1.17 -> 1.12 ms on 1 thread, 0.59 -> 0.58 on 2.
        let direct = FULL && blocks == 1;
        for q0 in (0..len).step_by(n) {
            let pw = n.min(len - q0);
            for (p, slot) in block.iter_mut().enumerate().take(pw) {
                let q = q0 + p;
                // SAFETY: q < len, and every table row holds at least len entries (asserted).
                let sample = unsafe { Sample::<B, T>::at(b, tap, q, c_in, pitch) };
                for k in 0..blocks {
                    let c0 = part + k * n;
                    let cw = if FULL { n } else { n.min(part_end - c0) };
                    debug_assert!(sample.at[3] + c0 + cw <= values.len());
                    // SAFETY: the corners are cells of the image (the table's contract, checked
                    // in debug builds) and channels c0 .. c0 + cw lie below channels.end <=
                    // c_in, so the values lie in the image.
                    let acc = unsafe { sample.channels::<FULL>(b, values, c0, cw) };
                    if direct {
                        *slot = acc;
                    } else {
                        debug_assert!(k * n + p < stage.len());
                        // SAFETY: k < blocks and p < n, so k * n + p < blocks * n <= used.
                        unsafe { *stage.get_unchecked_mut(k * n + p) = acc };
                    }
                }
            }
            for k in 0..blocks {
                let c0 = part + k * n;
                let cw = n.min(part_end - c0);
                if !direct {
                    block[..n].copy_from_slice(&stage[k * n..][..n]);
                }
                T::V::<B>::transpose(b, &mut block[..n]);
                for (ci, v) in block[..cw].iter().enumerate() {
                    let at = rows.row(c0 + ci) * ld + q0;
                    debug_assert!(at + pw <= cols.len());
                    // SAFETY: row(c0 + ci) <= row(channels.end - 1) and q0 + pw <= len <= ld,
                    // so the values lie in `cols` (asserted).
                    let dst = unsafe { cols.get_unchecked_mut(at..at + pw) };
                    if pw == n {
                        v.store(dst);
                    } else {
                        v.store_partial(dst);
                    }
                }
            }
        }
        part = part_end;
    }
}
