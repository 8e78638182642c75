//! The sampling table of one tile, built once for both passes: the forward's gather reads it
//! for one image's pixel range, the backward's fused pass for the pieces of several images.
//! A vector of pixels at a time ([`fill_columns`]) where every position is within the vector
//! form's exact range, else entry by entry by the scalar rule ([`Tap::with_rule`]); the two
//! give the same bits (tested below).

use super::backend::with_features;
use super::columns::TapColumns;
use super::locate::{fill_columns, ColumnRun, Fields, LIMIT, MAX_PLANE};
use super::taps::{DcnV1Rule, MmcvRule, PlaneLayout, Rule, Tap, TorchvisionRule};
use crate::convention::Convention;
use crate::float::Float;
use crate::geometry::Geometry;
use crate::plan::Piece;

/// What a tile's table is computed from: one offset group's offsets and mask, sampled on the
/// convention's padded planes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableSource<'a, T> {
    /// The checked problem.
    pub geo: &'a Geometry,
    /// The sampling rule.
    pub convention: Convention,
    /// The convention's padded plane of one image ([`PlaneLayout::for_convention`]).
    pub layout: PlaneLayout,
    /// `[N, 2 G_off K, H_out, W_out]`.
    pub offset: &'a [T],
    /// `[N, G_off K, H_out, W_out]`, or `None` for a unit mask.
    pub mask: Option<&'a [T]>,
    /// The offset group.
    pub og: usize,
}

/// Scratch of the vector build: the base coordinates `y * stride_h - pad_top` and
/// `x * stride_w - pad_left` of each tile column. Empty by `default`; grows on first use.
#[derive(Debug, Default)]
pub(crate) struct Bases<T> {
    y: Vec<T>,
    x: Vec<T>,
}

/// Builds the table of `tile` into `cols`, entry `k * width + col` for tap `k` and tile
/// column `col` (`width` the tile's pixels), writing the columns of `fields` (the row form
/// writes all of them). Each piece's image has its planes at cell `(image - first_image) *
/// layout.len()` of the caller's buffer. Call [`TapColumns::finish`] afterwards where the
/// bases' maxima are read.
pub(crate) fn build_table<T: Float>(
    cols: &mut TapColumns<T>,
    src: &TableSource<'_, T>,
    first_image: usize,
    tile: &[Piece],
    fields: Fields,
    bases: &mut Bases<T>,
) {
    let width: usize = tile.iter().map(|pc| pc.pixels.len()).sum();
    cols.resize(src.geo.taps() * width);
    let images = tile.iter().map(|pc| pc.image - first_image + 1).max();
    let cells = images.unwrap_or(0).saturating_mul(src.layout.len());
    if vector_fits(src.geo, cells) {
        build_vector(cols, src, first_image, tile, width, fields, bases);
        return;
    }
    // One monomorphic loop per rule, compiled with the backend's features (`floor` one
    // instruction instead of a library call; W1: the table build was a quarter of the
    // backward).
    match src.convention {
        Convention::Torchvision => with_features(
            #[inline(always)]
            || build_rows::<T, TorchvisionRule>(cols, src, first_image, tile, width),
        ),
        Convention::Mmcv => with_features(
            #[inline(always)]
            || build_rows::<T, MmcvRule>(cols, src, first_image, tile, width),
        ),
        Convention::DcnV1 => with_features(
            #[inline(always)]
            || build_rows::<T, DcnV1Rule>(cols, src, first_image, tile, width),
        ),
    }
}

/// Whether the vector build takes the tables of `g` on planes of `cells` cells: every
/// undeformed position and plane side below [`LIMIT`], the cells below [`MAX_PLANE`].
/// Saturating: absurd strides or dilations must not overflow (they fail the check).
fn vector_fits(g: &Geometry, cells: usize) -> bool {
    let reach = |out: usize, stride: usize, k: usize, dil: usize, pad: usize| {
        out.saturating_mul(stride)
            .saturating_add(k.saturating_mul(dil))
            .saturating_add(pad)
            < LIMIT
    };
    reach(g.h_out, g.stride_h, g.kh, g.dil_h, g.pad_top)
        && reach(g.w_out, g.stride_w, g.kw, g.dil_w, g.pad_left)
        && g.h.max(g.w) < LIMIT
        && cells < MAX_PLANE
}

/// The table a vector of pixels at a time: one [`ColumnRun`] per (tap, piece).
fn build_vector<T: Float>(
    cols: &mut TapColumns<T>,
    src: &TableSource<'_, T>,
    first_image: usize,
    tile: &[Piece],
    width: usize,
    fields: Fields,
    bases: &mut Bases<T>,
) {
    let g = src.geo;
    let (taps, hw) = (g.taps(), g.out_pixels());
    bases.y.resize(width, T::ZERO);
    bases.x.resize(width, T::ZERO);
    for pc in tile {
        let columns = pc.col0..pc.col0 + pc.pixels.len();
        let (ys, xs) = (&mut bases.y[columns.clone()], &mut bases.x[columns]);
        // Row-major pixels, walked without a division per pixel.
        let (mut y, mut x) = (pc.pixels.start / g.w_out, pc.pixels.start % g.w_out);
        for (by, bx) in ys.iter_mut().zip(xs) {
            // Integers below 2^22 (`vector_fits`), exact in T.
            *by = T::from_usize(y * g.stride_h) - T::from_usize(g.pad_top);
            *bx = T::from_usize(x * g.stride_w) - T::from_usize(g.pad_left);
            x += 1;
            if x == g.w_out {
                (y, x) = (y + 1, 0);
            }
        }
    }
    for k in 0..taps {
        let (i, j) = (k / g.kw, k % g.kw);
        let ch = src.og * taps + k;
        for pc in tile {
            let (n, px) = (pc.image, pc.pixels.clone());
            let dy0 = (n * 2 * g.offset_groups * taps + 2 * ch) * hw;
            let m0 = (n * g.offset_groups * taps + ch) * hw;
            let columns = pc.col0..pc.col0 + px.len();
            let run = ColumnRun {
                at: k * width + pc.col0,
                base_y: &bases.y[columns.clone()],
                base_x: &bases.x[columns],
                tap_y: T::from_usize(i * g.dil_h),
                tap_x: T::from_usize(j * g.dil_w),
                dy: &src.offset[dy0 + px.start..dy0 + px.end],
                dx: &src.offset[dy0 + hw + px.start..dy0 + hw + px.end],
                m: src.mask.map(|m| &m[m0 + px.start..m0 + px.end]),
                plane0: (n - first_image) * src.layout.len(),
            };
            fill_columns(cols, src.convention, src.layout, &run, fields);
        }
    }
}

/// The table under rule `R`, entry by entry ([`Tap::with_rule`]).
#[inline(always)]
fn build_rows<T: Float, R: Rule>(
    cols: &mut TapColumns<T>,
    src: &TableSource<'_, T>,
    first_image: usize,
    tile: &[Piece],
    width: usize,
) {
    let g = src.geo;
    let (taps, hw) = (g.taps(), g.out_pixels());
    for k in 0..taps {
        let (i, j) = (k / g.kw, k % g.kw);
        let ch = src.og * taps + k;
        let tap_y = (i * g.dil_h) as isize - g.pad_top as isize;
        let tap_x = (j * g.dil_w) as isize - g.pad_left as isize;
        for pc in tile {
            let plane0 = (pc.image - first_image) * src.layout.len();
            let dy0 = (pc.image * 2 * g.offset_groups * taps + 2 * ch) * hw;
            let m0 = (pc.image * g.offset_groups * taps + ch) * hw;
            let (mut y, mut x) = (pc.pixels.start / g.w_out, pc.pixels.start % g.w_out);
            for (col, p) in (k * width + pc.col0..).zip(pc.pixels.clone()) {
                let by = (y * g.stride_h) as isize + tap_y;
                let bx = (x * g.stride_w) as isize + tap_x;
                // `match`, not `map_or`: a closure left out of line loses the features.
                let m = match src.mask {
                    Some(mask) => mask[m0 + p],
                    None => T::ONE,
                };
                let (dy, dx) = (src.offset[dy0 + p], src.offset[dy0 + hw + p]);
                let tap = Tap::with_rule::<R>(src.layout, plane0, (by, dy), (bx, dx), m);
                cols.set(col, &tap);
                x += 1;
                if x == g.w_out {
                    (y, x) = (y + 1, 0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ConvParams;

    /// The vector build (on the backend of the CI cap) gives the row build's bits under every
    /// convention, in `f32` and `f64`, for the forward's columns and for all of them, on
    /// tiles of one image's range and of pieces of several images, with offsets that hit
    /// every branch of the rules: exact integers, tiny fractions, the `-1` and `H - 1`
    /// borders, NaN, infinities, huge values (the scalar fallback), and one-row planes.
    #[test]
    fn vector_build_equals_row_build() {
        vector_build_case::<f32>();
        vector_build_case::<f64>();
    }

    fn vector_build_case<T: Float>() {
        let specials = [
            0.0f32,
            -1.0,
            1.0,
            -0.5,
            2.0,
            -3.0,
            5.999_999_5,
            -1.000_000_1,
            f32::NAN,
            f32::INFINITY,
            -1e30,
            4_194_304.0,
            -4_194_303.5,
            1e-30,
            -1e-30,
            -0.0,
        ]
        .map(|v| T::from_f64(f64::from(v)));
        let mut state = 5u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state >> 8
        };
        let images = 3;
        for &(h, w, k, stride, pad, dil) in &[
            (7, 6, 3, 1, 1, 1),
            (9, 13, 2, 2, 0, 3),
            (5, 5, 3, 1, 4, 2),
            (1, 4, 2, 1, 1, 1),
        ] {
            let params = ConvParams::default()
                .padding(pad, pad)
                .stride(stride, stride)
                .dilation(dil, dil)
                .offset_groups(2);
            let geo = Geometry::new([images, 4, h, w], [3, 4, k, k], &params).unwrap();
            let hw = geo.out_pixels();
            let mut offset: Vec<T> = (0..images * 2 * 2 * k * k * hw)
                .map(|_| {
                    let r = next();
                    if r % 3 == 0 {
                        specials[(r as usize / 3) % specials.len()]
                    } else {
                        T::from_f64(f64::from(r % 4096) / 256.0 - 8.0)
                    }
                })
                .collect();
            // Exactly-integer samples on the first output row: with padding, tap row 0 sits
            // exactly on -1 there (outside by torchvision's rule).
            for ch in 0..images * 2 * k * k {
                for x in 0..geo.w_out {
                    offset[(2 * ch) * hw + x] = T::ZERO;
                }
            }
            let mask: Vec<T> = (0..images * 2 * k * k * hw).map(T::from_usize).collect();
            let piece = |image: usize, pixels: std::ops::Range<usize>, col0: usize| Piece {
                image,
                pixels,
                col0,
            };
            let tiles = [
                vec![piece(1, 0..hw, 0)],
                vec![piece(0, 1..hw - 1, 0)],
                vec![piece(2, 3..5, 0)],
                vec![piece(1, hw - 2..hw, 0), piece(2, 0..hw, 2)],
            ];
            for convention in [Convention::Torchvision, Convention::Mmcv, Convention::DcnV1] {
                let layout = PlaneLayout::for_convention(convention, h, w);
                let cases = [(None, Fields::All), (Some(&mask[..]), Fields::Forward)];
                for (og, tile, (mask, fields)) in (0..2)
                    .flat_map(|og| tiles.iter().map(move |t| (og, t)))
                    .flat_map(|(og, t)| cases.map(|c| (og, t, c)))
                {
                    let src = TableSource {
                        geo: &geo,
                        convention,
                        layout,
                        offset: &offset,
                        mask,
                        og,
                    };
                    let first = tile[0].image;
                    let width: usize = tile.iter().map(|pc| pc.pixels.len()).sum();
                    let mut vector = TapColumns::<T>::default();
                    let mut bases = Bases::default();
                    build_table(&mut vector, &src, first, tile, fields, &mut bases);
                    let mut rows = TapColumns::<T>::default();
                    rows.resize(geo.taps() * width);
                    match convention {
                        Convention::Torchvision => {
                            build_rows::<T, TorchvisionRule>(&mut rows, &src, first, tile, width)
                        }
                        Convention::Mmcv => {
                            build_rows::<T, MmcvRule>(&mut rows, &src, first, tile, width)
                        }
                        Convention::DcnV1 => {
                            build_rows::<T, DcnV1Rule>(&mut rows, &src, first, tile, width)
                        }
                    }
                    let (v, r) = (&vector, &rows);
                    let at = format!("{convention:?} {h}x{w} k{k} og{og} {tile:?} {fields:?}");
                    assert_eq!(v.scatter, r.scatter, "cells {at}");
                    let bits = |c: &[T]| c.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<_>>();
                    for t in 0..4 {
                        assert_eq!(bits(&v.weights[t]), bits(&r.weights[t]), "weights {t} {at}");
                    }
                    if fields == Fields::All || mask.is_some() {
                        assert_eq!(bits(&v.m), bits(&r.m), "mask {at}");
                    }
                    if fields == Fields::All {
                        assert_eq!(v.gather, r.gather, "gather {at}");
                        assert_eq!(v.inside, r.inside, "inside {at}");
                        assert_eq!(bits(&v.ly), bits(&r.ly), "ly {at}");
                        assert_eq!(bits(&v.lx), bits(&r.lx), "lx {at}");
                    }
                }
            }
        }
    }

    /// A geometry past the vector form's limits takes the row build.
    #[test]
    fn far_positions_take_the_row_build() {
        let params = ConvParams::default().padding(LIMIT, 0);
        let geo = Geometry::new([1, 1, 2, 2], [1, 1, 1, 1], &params).unwrap();
        assert!(!vector_fits(&geo, 0));
        let near = Geometry::new([1, 1, 2, 2], [1, 1, 1, 1], &ConvParams::default()).unwrap();
        assert!(vector_fits(&near, MAX_PLANE - 1));
        assert!(!vector_fits(&near, MAX_PLANE));
    }
}
