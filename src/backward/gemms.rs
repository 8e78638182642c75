//! A task's GEMMs for one tile: the packed `grad_out` tile, the column gradient
//! `weightᵀ · grad_out` and the weight gradient `grad_out · colsᵀ`, by the crate's GEMM
//! ([`crate::kernels::gemm`]; pixel-major: turned around, tap-major).

use super::operands::{Scope, Stats, WeightOut};
use super::plan::{Piece, Segment};
use super::weights::{Weights, GEMM_COLUMNS};
use crate::float::Float;
use crate::kernels::gemm::{multiply, multiply_packed, Init, MatB, MatC, PackedA, PackedB};

/// A task's GEMM stage: the prepared weight, the packed operands reused across tiles, and
/// the count of GEMMs run.
pub(super) struct Gemms<'p, 'a, T: Float> {
    s: Scope<'p, 'a, T>,
    /// The weight prepared for the column-gradient GEMM.
    weights: &'p Weights<T>,
    /// The GEMM's packed `B` block (reused across tiles).
    packed_b: Vec<T>,
    /// The tile's `grad_out`, packed as `A` of the weight-gradient GEMM.
    packed_gt: PackedA<T>,
    /// The tile's `grad_outᵀ`, packed as `A` of the pixel-major column-gradient GEMM.
    packed_gt_t: PackedA<T>,
    /// GEMMs run (`gcol_gemms`, `weight_gemms`).
    pub(super) stats: Stats,
}

impl<'p, 'a, T: Float> Gemms<'p, 'a, T> {
    /// The stage of the task `s`, with the weight prepared by `weights`.
    pub(super) fn new(s: Scope<'p, 'a, T>, weights: &'p Weights<T>) -> Self {
        Gemms {
            s,
            weights,
            packed_b: Vec::new(),
            packed_gt: PackedA::empty(),
            packed_gt_t: PackedA::empty(),
            stats: Stats::default(),
        }
    }

    /// `gt[o, col] = grad_out[n, conv_group * C_out/groups + o, p]` for the tile's pixels.
    #[inline(never)]
    pub(super) fn pack_grad_out(
        &self,
        conv_group: usize,
        tile: &[Piece],
        width: usize,
        gt: &mut [T],
    ) {
        let g = self.s.g;
        let hw = g.out_pixels();
        let cog = g.c_out_per_group();
        for o in 0..cog {
            let row = &mut gt[o * width..][..width];
            for pc in tile {
                let src = (pc.image * g.c_out + conv_group * cog + o) * hw;
                let dst = &mut row[pc.col0..][..pc.pixels.len()];
                dst.copy_from_slice(
                    &self.s.ops.grad_out[src + pc.pixels.start..src + pc.pixels.end],
                );
            }
        }
    }

    /// `gcol[(c - c_lo) K + k, col] = sum_o weight[group o, c', k] * gt[o, col]` (pixel-major:
    /// its transpose, tap-major).
    pub(super) fn column_gradient(
        &mut self,
        si: usize,
        seg: &Segment,
        width: usize,
        gt: &[T],
        gcol: &mut [T],
    ) {
        let rows = (seg.c_hi - seg.c_lo) * self.s.g.taps();
        let cog = self.s.g.c_out_per_group();
        assert!(gt.len() >= cog * width && gcol.len() >= rows * width);
        self.stats.gcol_gemms += 1;
        match self.weights {
            Weights::TapMajor(per_group) => {
                let blocks = &per_group[self.s.og][si];
                self.column_gradient_tap_major(rows, width, gt, blocks, gcol)
            }
            Weights::Packed(per_group) => {
                let packed = &per_group[self.s.og][si];
                debug_assert_eq!((packed.rows(), packed.depth()), (rows, cog));
                let b = MatB {
                    data: gt,
                    rs: width,
                    cs: 1,
                };
                // SAFETY: B = gt is cog x width row-major and C = gcol rows x width, this
                // task's own (asserted above).
                unsafe {
                    multiply(
                        packed,
                        b,
                        width,
                        Init::Zero,
                        gcol.as_mut_ptr(),
                        width,
                        &mut self.packed_b,
                    )
                };
            }
            Weights::None => debug_assert!(false, "the column gradient needs the weight"),
        }
    }

    /// The pixel-major column gradient `gcol[q, k C_seg + c] = sum_o gt[o, q] * b[o, k C_seg + c]`
    /// (`b` the segment's [`Weights::TapMajor`] blocks of [`GEMM_COLUMNS`] columns): `A = gtᵀ`
    /// packed per tile.
    fn column_gradient_tap_major(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        blocks: &[PackedB<T>],
        gcol: &mut [T],
    ) {
        let cog = self.s.g.c_out_per_group();
        assert!(gcol.len() >= width * rows && gt.len() >= cog * width);
        assert_eq!(blocks.iter().map(|b| b.len()).sum::<usize>(), rows);
        // Element (q, o) of gtᵀ is gt[o * width + q].
        self.packed_gt_t.repack(gt, width, cog, 1, width);
        let mut n0 = 0;
        for b in blocks {
            // B has depth cog (`permute_weight`); the blocks' columns sum to `rows` (asserted).
            // SAFETY: C = gcol columns n0 .. n0 + b.len() of `width` rows at stride `rows`,
            // inside gcol (asserted), this task's own.
            unsafe {
                multiply_packed(
                    &self.packed_gt_t,
                    b,
                    Init::Zero,
                    gcol.as_mut_ptr().add(n0),
                    rows,
                )
            };
            n0 += b.len();
        }
    }

    /// The pixel-major weight gradient
    /// `part[o, j] = beta * part[o, j] + sum_q gt[o, q] * cols[q, j]`, `j = k C_seg + c`.
    fn weight_gradient_tap_major(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        part: &mut [T],
        beta: T,
    ) {
        let cog = self.s.g.c_out_per_group();
        assert!(gt.len() >= cog * width && cols.len() >= width * rows && part.len() >= cog * rows);
        self.packed_gt.repack(gt, cog, width, width, 1);
        for n0 in (0..rows).step_by(GEMM_COLUMNS) {
            let len = GEMM_COLUMNS.min(rows - n0);
            let b = MatB {
                data: &cols[n0..],
                rs: rows,
                cs: 1,
            };
            // SAFETY: B = cols[n0..] holds `width` rows of `rows` (asserted); C = part columns
            // n0 .. n0 + len of cog rows at stride `rows`, inside part (asserted), this task's.
            unsafe {
                multiply(
                    &self.packed_gt,
                    b,
                    len,
                    Init::beta(beta),
                    part.as_mut_ptr().add(n0),
                    rows,
                    &mut self.packed_b,
                )
            };
        }
        self.stats.weight_gemms += 1;
    }

    /// `part[o, r] = beta * part[o, r] + sum_col gt[o, col] * cols[r, col]` (pixel-major:
    /// tap-major columns).
    pub(super) fn weight_gradient(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        part: &mut [T],
        beta: T,
    ) {
        let cog = self.s.g.c_out_per_group();
        assert!(gt.len() >= cog * width && cols.len() >= rows * width);
        assert!(part.len() >= cog * rows);
        if self.s.pixel_major {
            return self.weight_gradient_tap_major(rows, width, gt, cols, part, beta);
        }
        let c = MatC {
            ptr: part.as_mut_ptr(),
            rs: rows,
        };
        // SAFETY: part is cog x rows row-major, this task's own (asserted above).
        unsafe { self.weight_gemm(rows, width, gt, cols, c, beta) }
    }

    /// `c[o, r] = beta * c[o, r] + sum_col gt[o, col] * cols[r, col]` (`beta` is 0 or 1).
    ///
    /// # Safety
    /// `c` addresses `C_out/groups` rows of `rows` writable elements, owned by this task and
    /// disjoint from `gt` and `cols`; `gt` holds `C_out/groups x width` and `cols`
    /// `rows x width` elements.
    unsafe fn weight_gemm(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        c: MatC<T>,
        beta: T,
    ) {
        let cog = self.s.g.c_out_per_group();
        self.packed_gt.repack(gt, cog, width, width, 1);
        let b = MatB {
            data: cols,
            rs: 1,
            cs: width,
        };
        // SAFETY: B = colsᵀ is width x rows; C per the caller's contract.
        unsafe {
            multiply(
                &self.packed_gt,
                b,
                rows,
                Init::beta(beta),
                c.ptr,
                c.rs,
                &mut self.packed_b,
            )
        };
        self.stats.weight_gemms += 1;
    }

    /// [`Gemms::weight_gradient`] straight into the segment's block of the final `grad_weight`
    /// (rows of its conv group, columns of its channels, row stride `C_in/groups * K`).
    pub(super) fn weight_gradient_into(
        &mut self,
        seg: &Segment,
        width: usize,
        gt: &[T],
        cols: &[T],
        out: WeightOut<T>,
        beta: T,
    ) {
        let g = self.s.g;
        let k_taps = g.taps();
        let cink = g.c_in_per_group() * k_taps;
        let cog = g.c_out_per_group();
        let rows = (seg.c_hi - seg.c_lo) * k_taps;
        let c0 =
            seg.conv_group * cog * cink + (seg.c_lo - seg.conv_group * g.c_in_per_group()) * k_taps;
        assert!(gt.len() >= cog * width && cols.len() >= rows * width);
        assert!(c0 + (cog - 1) * cink + rows <= out.len);
        // SAFETY: the block of `out` at c0 (cog rows of `rows` at stride cink) lies inside the
        // buffer (asserted).
        let block = unsafe { out.ptr.add(c0) };
        let c = MatC {
            ptr: block,
            rs: cink,
        };
        // SAFETY: the block lies inside the buffer (above) and holds this task's offset
        // group's channels, which no other task touches (see `WeightOut`).
        unsafe { self.weight_gemm(rows, width, gt, cols, c, beta) }
    }
}
