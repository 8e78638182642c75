//! A task's sampling table for one tile, `[k][tile column]`: for a deformable problem the
//! columns the fused pass reads ([`TapColumns`]), a vector of pixels at a time, or entry by
//! entry through the row form ([`Tap`]) for positions past the vector build's limits; for a
//! dense one, each sample's cell.

use super::operands::Scope;
use super::plan::{ImageGroup, Piece};
use crate::convention::Convention;
use crate::float::Float;
use crate::kernels::backend::with_features;
use crate::kernels::columns::TapColumns;
use crate::kernels::dense_backward;
use crate::kernels::locate::{fill_columns, ColumnRun, Fields, LIMIT, MAX_PLANE};
use crate::kernels::taps::{DcnV1Rule, MmcvRule, Rule, Tap, TorchvisionRule};

impl<T: Float> Scope<'_, '_, T> {
    /// Whether the tile tables are built straight into columns ([`Scope::build_columns`]):
    /// with offsets, every base coordinate below [`LIMIT`] and the task's plane cells below
    /// [`MAX_PLANE`]. Measured on W1 (1 thread): the row table build and its column copy were
    /// a third of the backward.
    pub(super) fn direct_columns(&self) -> bool {
        let g = self.g;
        // Saturating: absurd strides or dilations must not overflow (they fail the check).
        let reach = |out: usize, stride: usize, k: usize, dil: usize, pad: usize| {
            out.saturating_mul(stride)
                .saturating_add(k.saturating_mul(dil))
                .saturating_add(pad)
        };
        let reach_y = reach(g.h_out, g.stride_h, g.kh, g.dil_h, g.pad_top);
        let reach_x = reach(g.w_out, g.stride_w, g.kw, g.dil_w, g.pad_left);
        self.ops.offset.is_some()
            && reach_y < LIMIT
            && reach_x < LIMIT
            && g.h.max(g.w) < LIMIT
            && (self.max_images + 1).saturating_mul(self.layout.len()) < MAX_PLANE
    }

    /// The tile's table `[k][tile column]` built straight into `columns` (see
    /// [`fill_columns`]); `bases` is scratch for the pixels' base coordinates.
    #[inline(never)]
    pub(super) fn build_columns(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        columns: &mut TapColumns<T>,
        bases: &mut (Vec<T>, Vec<T>),
    ) {
        let g = self.g;
        let k_taps = g.taps();
        let hw = g.out_pixels();
        let (base_y, base_x) = bases;
        base_y.clear();
        base_x.clear();
        for pc in tile {
            // Row-major pixels, walked without a division per pixel.
            let (mut y, mut x) = (pc.pixels.start / g.w_out, pc.pixels.start % g.w_out);
            for _ in pc.pixels.clone() {
                // Integers below 2^22 (`direct_columns`), exact in T.
                base_y.push(T::from_usize(y * g.stride_h) - T::from_usize(g.pad_top));
                base_x.push(T::from_usize(x * g.stride_w) - T::from_usize(g.pad_left));
                x += 1;
                if x == g.w_out {
                    (y, x) = (y + 1, 0);
                }
            }
        }
        debug_assert_eq!(base_y.len(), width);
        let Some(off) = self.ops.offset else {
            debug_assert!(false, "direct columns need offsets");
            return;
        };
        columns.resize(k_taps * width);
        let oc = 2 * g.offset_groups * k_taps;
        let mc = g.offset_groups * k_taps;
        for k in 0..k_taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let ch = self.og * k_taps + k;
            for pc in tile {
                let (n, px) = (pc.image, pc.pixels.clone());
                let cols_of = pc.col0..pc.col0 + px.len();
                let dy0 = (n * oc + 2 * ch) * hw;
                let run = ColumnRun {
                    at: k * width + pc.col0,
                    base_y: &base_y[cols_of.clone()],
                    base_x: &base_x[cols_of],
                    tap_y: T::from_usize(i * g.dil_h),
                    tap_x: T::from_usize(j * g.dil_w),
                    dy: &off[dy0 + px.start..dy0 + px.end],
                    dx: &off[dy0 + hw + px.start..dy0 + hw + px.end],
                    m: self
                        .ops
                        .mask
                        .map(|m| &m[(n * mc + ch) * hw + px.start..][..px.len()]),
                    plane0: (n - group.images.start) * self.layout.len(),
                };
                fill_columns(columns, self.ops.convention, self.layout, &run, Fields::All);
            }
        }
        columns.finish();
    }

    /// The deformable tile's table `[k][tile column]` under the problem's convention, entry by
    /// entry through the row form ([`Tap::with_rule`]): the conventions and positions
    /// [`Scope::build_columns`] does not take.
    #[inline(never)]
    pub(super) fn build_taps(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        columns: &mut TapColumns<T>,
    ) {
        // One monomorphised build per convention, compiled with the backend's features
        // (`floor` one instruction instead of a library call; W1: the table build was a
        // quarter of the backward).
        match self.ops.convention {
            Convention::Torchvision => with_features(
                #[inline(always)]
                || self.build_taps_for::<TorchvisionRule>(group, tile, width, columns),
            ),
            Convention::Mmcv => with_features(
                #[inline(always)]
                || self.build_taps_for::<MmcvRule>(group, tile, width, columns),
            ),
            Convention::DcnV1 => with_features(
                #[inline(always)]
                || self.build_taps_for::<DcnV1Rule>(group, tile, width, columns),
            ),
        }
    }

    /// The dense tile's table `[k][tile column]`: each sample's cell ([`dense_backward::cell`])
    /// by integer arithmetic alone. Measured on W1 dense (1 thread): the general table build
    /// was a quarter of forward + backward.
    pub(super) fn build_cells(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        cells: &mut Vec<usize>,
    ) {
        let g = self.g;
        let plane_len = self.layout.len();
        cells.clear();
        for k in 0..g.taps() {
            let (i, j) = (k / g.kw, k % g.kw);
            let (ty, tx) = (
                (i * g.dil_h) as isize - g.pad_top as isize,
                (j * g.dil_w) as isize - g.pad_left as isize,
            );
            for pc in tile {
                let plane0 = (pc.image - group.images.start) * plane_len;
                let (mut y, mut x) = (pc.pixels.start / g.w_out, pc.pixels.start % g.w_out);
                // `extend` from a range: no capacity check per entry.
                cells.extend(pc.pixels.clone().map(|_| {
                    let by = (y * g.stride_h) as isize + ty;
                    let bx = (x * g.stride_w) as isize + tx;
                    x += 1;
                    if x == g.w_out {
                        (y, x) = (y + 1, 0);
                    }
                    dense_backward::cell(self.layout, plane0, by, bx)
                }));
            }
        }
        debug_assert_eq!(cells.len(), g.taps() * width);
    }

    #[inline(always)]
    fn build_taps_for<R: Rule>(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        columns: &mut TapColumns<T>,
    ) {
        let g = self.g;
        let k_taps = g.taps();
        let hw = g.out_pixels();
        let plane_len = self.layout.len();
        columns.resize(k_taps * width);
        let mut e = 0;
        for k in 0..k_taps {
            let (i, j) = (k / g.kw, k % g.kw);
            let ch = self.og * k_taps + k;
            for pc in tile {
                let plane0 = (pc.image - group.images.start) * plane_len;
                let n = pc.image;
                let oc = 2 * g.offset_groups * k_taps;
                let mc = g.offset_groups * k_taps;
                for p in pc.pixels.clone() {
                    let (y, x) = (p / g.w_out, p % g.w_out);
                    let by = (y * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                    let bx = (x * g.stride_w + j * g.dil_w) as isize - g.pad_left as isize;
                    let (dy, dx) = match self.ops.offset {
                        Some(off) => (
                            off[(n * oc + 2 * ch) * hw + p],
                            off[(n * oc + 2 * ch + 1) * hw + p],
                        ),
                        None => (T::ZERO, T::ZERO),
                    };
                    // `match`, not `map_or`: a closure left out of line loses the features.
                    let m = match self.ops.mask {
                        Some(m) => m[(n * mc + ch) * hw + p],
                        None => T::ONE,
                    };
                    let tap = Tap::with_rule::<R>(self.layout, plane0, (by, dy), (bx, dx), m);
                    columns.set(e, &tap);
                    e += 1;
                }
            }
        }
        debug_assert_eq!(e, k_taps * width);
        columns.finish();
    }
}
