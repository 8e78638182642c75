//! The deformable bilinear gather: sampling positions and weights computed once per
//! `(tap, pixel)` and reused for every channel of the offset group.

use super::Source;
use crate::float::Float;
use crate::sample::{locate, Sample};

/// Corner index meaning "outside the plane: reads 0, touches nothing".
pub(crate) const NO_CORNER: i32 = -1;

/// The samples of one `(image, offset group, pixel range)`, for every tap, in structure-of-arrays
/// form: entry `r = k * len + q` is tap `k` at pixel `start + q`.
///
/// For corner `t` (order `(y0,x0), (y0,x1), (y1,x0), (y1,x1)`), `index[t * K * len + r]` is the
/// corner's offset `row * W + col` in the channel plane or [`NO_CORNER`], and
/// `weight[t * K * len + r]` its bilinear weight. A NaN sample has NaN weights and no corners
/// (value NaN); an outside sample has zero weights and no corners (value 0). `mask[r]` is the
/// modulation (filled only when the convolution has a mask).
///
/// Size: `K * len * (4 * (4 + size_of::<T>()) + size_of::<T>())` bytes, at most 37 bytes per
/// column-tile column and tap for `f32` — small next to the column tile itself.
#[derive(Debug, Default)]
pub(crate) struct SampleTable<T> {
    index: Vec<i32>,
    weight: Vec<T>,
    mask: Vec<T>,
}

impl<T: Float> SampleTable<T> {
    /// An empty table; buffers grow on first use and are reused afterwards.
    pub(crate) fn new() -> Self {
        SampleTable {
            index: Vec::new(),
            weight: Vec::new(),
            mask: Vec::new(),
        }
    }

    /// Computes the samples of offset group `og` for `(image, start .. start + len)`.
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
        let taps = g.taps();
        let entries = taps * len;
        let pixels = g.out_pixels();
        self.index.resize(4 * entries, NO_CORNER);
        self.weight.resize(4 * entries, T::ZERO);
        if src.mask.is_some() {
            self.mask.resize(entries, T::ONE);
        }
        let offset_channels = 2 * g.offset_groups * taps;
        let mask_channels = g.offset_groups * taps;
        for k in 0..taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let ch = og * taps + k;
            let dys = &offset[((image * offset_channels + 2 * ch) * pixels + start)..][..len];
            let dxs = &offset[((image * offset_channels + 2 * ch + 1) * pixels + start)..][..len];
            if let Some(mask) = src.mask {
                let ms = &mask[((image * mask_channels + ch) * pixels + start)..][..len];
                self.mask[k * len..(k + 1) * len].copy_from_slice(ms);
            }
            let (mut y, mut x) = (start / g.w_out, start % g.w_out);
            for q in 0..len {
                let base_y = (y * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                let base_x = (x * g.stride_w + j * g.dil_w) as isize - g.pad_left as isize;
                let r = k * len + q;
                let (index, weight) = match locate(base_y, dys[q], base_x, dxs[q], g.h, g.w) {
                    Sample::Inside(c) => (
                        [0, 1, 2, 3].map(|t| {
                            if c.valid[t] {
                                // Fits: the caller checked H * W <= i32::MAX.
                                c.index[t] as i32
                            } else {
                                NO_CORNER
                            }
                        }),
                        c.weights(),
                    ),
                    Sample::Outside => ([NO_CORNER; 4], [T::ZERO; 4]),
                    Sample::Nan => ([NO_CORNER; 4], [T::from_f64(f64::NAN); 4]),
                };
                for t in 0..4 {
                    self.index[t * entries + r] = index[t];
                    self.weight[t * entries + r] = weight[t];
                }
                x += 1;
                if x == g.w_out {
                    x = 0;
                    y += 1;
                }
            }
        }
    }

    /// `row[q] = m * sum_t weight_t * v_t` for tap `k` over `plane`, corners with no index
    /// reading 0 (so an infinite pixel outside the image cannot leak in).
    fn interpolate_row(&self, plane: &[T], k: usize, len: usize, has_mask: bool, row: &mut [T]) {
        let entries = self.index.len() / 4;
        let at = |t: usize| {
            (
                &self.index[t * entries + k * len..][..len],
                &self.weight[t * entries + k * len..][..len],
            )
        };
        let (i0, w0) = at(0);
        let (i1, w1) = at(1);
        let (i2, w2) = at(2);
        let (i3, w3) = at(3);
        let read = |i: i32| {
            if i >= 0 {
                plane[i as usize]
            } else {
                T::ZERO
            }
        };
        for q in 0..len {
            row[q] = w0[q] * read(i0[q])
                + w1[q] * read(i1[q])
                + w2[q] * read(i2[q])
                + w3[q] * read(i3[q]);
        }
        if has_mask {
            for (v, &m) in row.iter_mut().zip(&self.mask[k * len..(k + 1) * len]) {
                *v = m * *v;
            }
        }
    }
}

/// Fills the deformable column tile of `(image, group, start .. start + len)`:
/// `cols[(c' * K + k) * len + q] = m * B(input[n, c], py, px)` (see `kernels` for the layout),
/// building one [`SampleTable`] per offset group that meets the conv group.
///
/// The caller guarantees `H * W <= i32::MAX` and `cols.len() >= C_in/groups * K * len`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_columns<T: Float>(
    src: &Source<'_, T>,
    offset: &[T],
    image: usize,
    group: usize,
    start: usize,
    len: usize,
    cols: &mut [T],
    table: &mut SampleTable<T>,
) {
    let g = src.geo;
    let taps = g.taps();
    let cg = g.c_in_per_group();
    let per_og = g.c_per_offset_group();
    let plane_len = g.h * g.w;
    debug_assert!(plane_len <= i32::MAX as usize);
    debug_assert!(cols.len() >= cg * taps * len);
    let (c_lo, c_hi) = (group * cg, (group + 1) * cg);
    let mut c = c_lo;
    while c < c_hi {
        let og = c / per_og;
        let chunk_end = c_hi.min((og + 1) * per_og);
        table.build(src, offset, image, og, start, len);
        for ch in c..chunk_end {
            let plane = &src.input[(image * g.c_in + ch) * plane_len..][..plane_len];
            for k in 0..taps {
                let row = &mut cols[((ch - c_lo) * taps + k) * len..][..len];
                table.interpolate_row(plane, k, len, src.mask.is_some(), row);
            }
        }
        c = chunk_end;
    }
}
