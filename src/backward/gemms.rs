//! A task's GEMMs for one tile: the packed `grad_out` tile, the column gradient
//! `weightᵀ · grad_out` and the weight gradient `grad_out · colsᵀ`, by our AVX-512 `f32`
//! kernels (pixel-major: turned around, tap-major) or by matrixmultiply.

use super::operands::{Scope, Stats, WeightOut};
use super::plan::{Piece, Segment};
use super::weights::Weights;
#[cfg(target_arch = "x86_64")]
use super::weights::GEMM_COLUMNS;
use crate::float::Float;

/// A GEMM's output block: rows `ld` elements apart from `ptr`.
pub(super) struct OutBlock<T> {
    ptr: *mut T,
    ld: usize,
}

impl<T> OutBlock<T> {
    fn new(ptr: *mut T, ld: usize) -> Self {
        OutBlock { ptr, ld }
    }
}

/// A task's GEMM stage: the prepared weight, the packed operands reused across tiles, and
/// the count of GEMMs run.
pub(super) struct Gemms<'p, 'a, T> {
    s: Scope<'p, 'a, T>,
    /// The weight prepared for the column-gradient GEMM.
    weights: &'p Weights,
    /// The GEMM's packed `B` block (reused across tiles).
    packed_b: Vec<f32>,
    /// The tile's `grad_out` packed as `A` of the weight-gradient GEMM, when the AVX-512 `f32`
    /// kernel applies.
    #[cfg(target_arch = "x86_64")]
    packed_gt: Option<crate::kernels::sgemm::PackedA>,
    /// The tile's `grad_outᵀ`, packed as `A` of the pixel-major column-gradient GEMM.
    #[cfg(target_arch = "x86_64")]
    packed_gt_t: Option<crate::kernels::sgemm::PackedA>,
    /// GEMMs run (`gcol_gemms`, `weight_gemms`).
    pub(super) stats: Stats,
}

impl<'p, 'a, T: Float> Gemms<'p, 'a, T> {
    /// The stage of the task `s`, with the weight prepared by `weights`.
    pub(super) fn new(s: Scope<'p, 'a, T>, weights: &'p Weights) -> Self {
        Gemms {
            s,
            weights,
            packed_b: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            packed_gt: (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
                && crate::kernels::lanes::isa() == crate::kernels::lanes::Isa::Avx512)
                .then(|| crate::kernels::sgemm::PackedA::pack_strided(&[], 0, 0, 0, 0)),
            #[cfg(target_arch = "x86_64")]
            packed_gt_t: None,
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

    /// `gcol[(c - c_lo) K + k, col] = sum_o weight[group o, c', k] * gt[o, col]`.
    pub(super) fn column_gradient(
        &mut self,
        si: usize,
        seg: &Segment,
        width: usize,
        gt: &[T],
        gcol: &mut [T],
    ) {
        let g = self.s.g;
        let Some(weight) = self.s.ops.weight else {
            debug_assert!(false, "the column gradient needs the weight");
            return;
        };
        let k_taps = g.taps();
        let cink = g.c_in_per_group() * k_taps;
        let cog = g.c_out_per_group();
        let rows = (seg.c_hi - seg.c_lo) * k_taps;
        let a0 =
            seg.conv_group * cog * cink + (seg.c_lo - seg.conv_group * g.c_in_per_group()) * k_taps;
        debug_assert!(a0 + (rows - 1) + (cog - 1) * cink < weight.len());
        debug_assert!(gt.len() >= cog * width && gcol.len() >= rows * width);
        self.stats.gcol_gemms += 1;
        #[cfg(target_arch = "x86_64")]
        if let Weights::TapMajor(per_group) = self.weights {
            let blocks = &per_group[self.s.og][si];
            return self.column_gradient_tap_major(rows, width, gt, blocks, gcol);
        }
        #[cfg(target_arch = "x86_64")]
        if let Weights::Packed(per_group) = self.weights {
            let packed = &per_group[self.s.og];
            let cast = |s: &[T]| {
                // SAFETY: `packed_wt` exists only when T is f32 (see `pack_weight_t`).
                unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) }
            };
            // SAFETY: AVX-512F was detected when the weight was packed; B = gt is cog x width
            // row-major and C = gcol (rows x width, exclusive to this task) as checked above.
            unsafe {
                crate::kernels::sgemm::multiply(
                    &packed[si],
                    crate::kernels::sgemm::MatB {
                        data: cast(gt),
                        rs: width,
                        cs: 1,
                    },
                    width,
                    crate::kernels::sgemm::Init::Zero,
                    gcol.as_mut_ptr() as *mut f32,
                    width,
                    &mut self.packed_b,
                )
            };
            return;
        }
        let _ = si;
        // A = weight[a0 + r + o * cink] (r < rows, o < cog): the segment's columns lie within
        // its conv group's C_in/groups * K. SAFETY: A stays inside `weight`; B = gt (cog x width)
        // and C = gcol (rows x width, exclusive) are row-major and sized as checked above.
        unsafe {
            T::gemm(
                rows,
                cog,
                width,
                T::ONE,
                weight.as_ptr().add(a0),
                1,
                cink as isize,
                gt.as_ptr(),
                width as isize,
                1,
                T::ZERO,
                gcol.as_mut_ptr(),
                width as isize,
                1,
            );
        }
    }

    /// The pixel-major column gradient `gcol[q, k C_seg + c] = sum_o gt[o, q] * b[o, k C_seg + c]`
    /// (`b` the segment's [`Weights::TapMajor`] blocks of [`GEMM_COLUMNS`] columns): `A = gtᵀ`
    /// packed per tile.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn column_gradient_tap_major(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        blocks: &[crate::kernels::sgemm::PackedB],
        gcol: &mut [T],
    ) {
        use crate::kernels::sgemm::{multiply_packed, Init, PackedA};
        use crate::kernels::{same_type, same_type_mut};
        let cog = self.s.g.c_out_per_group();
        let (Some(gt), Some(gcol)) = (same_type::<T, f32>(gt), same_type_mut::<T, f32>(gcol))
        else {
            debug_assert!(false, "tap-major weights exist only for f32");
            return;
        };
        assert!(gcol.len() >= width * rows && gt.len() >= cog * width);
        assert_eq!(blocks.iter().map(|b| b.len()).sum::<usize>(), rows);
        let packed = self
            .packed_gt_t
            .get_or_insert_with(|| PackedA::pack_strided(&[], 0, 0, 0, 0));
        // Element (q, o) of gtᵀ is gt[o * width + q].
        packed.repack(gt, width, cog, 1, width);
        let mut n0 = 0;
        for b in blocks {
            // B has depth cog (`permute_weight`); the blocks' columns sum to `rows` (asserted).
            // SAFETY: AVX-512F was detected (`pixel_major_candidate`); C = gcol columns n0 ..
            // n0 + b.len() of `width` rows at stride `rows`, inside gcol, this task's own.
            unsafe { multiply_packed(packed, b, Init::Zero, gcol.as_mut_ptr().add(n0), rows) };
            n0 += b.len();
        }
    }

    /// The pixel-major weight gradient
    /// `part[o, j] = beta * part[o, j] + sum_q gt[o, q] * cols[q, j]`, `j = k C_seg + c`.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn weight_gradient_tap_major(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        part: &mut [T],
        beta: T,
    ) {
        use crate::kernels::sgemm::{multiply, Init, MatB, PackedA};
        use crate::kernels::{same_type, same_type_mut};
        let cog = self.s.g.c_out_per_group();
        let f32s = (
            same_type::<T, f32>(gt),
            same_type::<T, f32>(cols),
            same_type_mut::<T, f32>(part),
        );
        let (Some(gt), Some(cols), Some(part)) = f32s else {
            debug_assert!(false, "the pixel-major path is f32 only");
            return;
        };
        assert!(gt.len() >= cog * width && cols.len() >= width * rows && part.len() >= cog * rows);
        let packed = self
            .packed_gt
            .get_or_insert_with(|| PackedA::pack_strided(&[], 0, 0, 0, 0));
        packed.repack(gt, cog, width, width, 1);
        let init = if beta == T::ZERO {
            Init::Zero
        } else {
            Init::Accumulate
        };
        for n0 in (0..rows).step_by(GEMM_COLUMNS) {
            let len = GEMM_COLUMNS.min(rows - n0);
            let b = MatB {
                data: &cols[n0..],
                rs: rows,
                cs: 1,
            };
            // SAFETY: AVX-512F was detected (`pixel_major_candidate`); B = cols[n0..] holds `width`
            // rows of `rows` (asserted); C = part columns n0 .. n0 + len of cog rows at stride
            // `rows`, inside part (asserted), this task's own.
            unsafe {
                multiply(
                    packed,
                    b,
                    len,
                    init,
                    part.as_mut_ptr().add(n0),
                    rows,
                    &mut self.packed_b,
                )
            };
        }
        self.stats.weight_gemms += 1;
    }

    /// `part[o, r] = beta * part[o, r] + sum_col gt[o, col] * cols[r, col]`.
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
        debug_assert!(gt.len() >= cog * width && cols.len() >= rows * width);
        debug_assert!(part.len() >= cog * rows);
        #[cfg(target_arch = "x86_64")]
        if self.s.pixel_major {
            return self.weight_gradient_tap_major(rows, width, gt, cols, part, beta);
        }
        // SAFETY: part is cog x rows row-major, exclusive (checked above).
        if unsafe {
            self.weight_gemm_avx512(
                rows,
                width,
                gt,
                cols,
                OutBlock::new(part.as_mut_ptr(), rows),
                beta,
            )
        } {
            return;
        }
        // SAFETY: A = gt (cog x width, row-major), B = colsᵀ (width x rows: element (q, r) at
        // r * width + q), C = part (cog x rows, row-major); lengths checked above, part is an
        // exclusive buffer distinct from both.
        unsafe {
            T::gemm(
                cog,
                width,
                rows,
                T::ONE,
                gt.as_ptr(),
                width as isize,
                1,
                cols.as_ptr(),
                1,
                width as isize,
                beta,
                part.as_mut_ptr(),
                rows as isize,
                1,
            );
        }
        self.stats.weight_gemms += 1;
    }

    /// `c[o * ldc + r] = beta * c[o * ldc + r] + sum_col gt[o, col] * cols[r, col]` by the
    /// AVX-512 `f32` kernel when it applies (returns whether it did; `beta` is 0 or 1).
    ///
    /// # Safety
    /// `c` addresses `C_out/groups` rows of `rows` writable elements at stride `ldc`, owned by
    /// this task and disjoint from `gt` and `cols`; `gt` holds `C_out/groups x width` and
    /// `cols` `rows x width` elements.
    pub(super) unsafe fn weight_gemm_avx512(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        c: OutBlock<T>,
        beta: T,
    ) -> bool {
        let OutBlock { ptr: c, ld: ldc } = c;
        #[cfg(target_arch = "x86_64")]
        if let Some(packed) = self.packed_gt.as_mut() {
            use crate::kernels::sgemm::{multiply, Init, MatB};
            let cog = self.s.g.c_out_per_group();
            let cast = |s: &[T]| {
                // SAFETY: `packed_gt` exists only when T is f32 (see `Task::new`).
                unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) }
            };
            packed.repack(cast(gt), cog, width, width, 1);
            let init = if beta == T::ZERO {
                Init::Zero
            } else {
                Init::Accumulate
            };
            let b = MatB {
                data: cast(cols),
                rs: 1,
                cs: width,
            };
            // SAFETY: AVX-512F was detected when `packed_gt` was made; B = colsᵀ is width x
            // rows; C per the caller's contract.
            unsafe {
                multiply(
                    packed,
                    b,
                    rows,
                    init,
                    c as *mut f32,
                    ldc,
                    &mut self.packed_b,
                )
            };
            self.stats.weight_gemms += 1;
            return true;
        }
        let _ = (rows, width, gt, cols, c, ldc, beta);
        false
    }

    /// [`Task::weight_gradient`] straight into the segment's block of the final `grad_weight`
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
        debug_assert!(gt.len() >= cog * width && cols.len() >= rows * width);
        debug_assert!(c0 + (cog - 1) * cink + rows <= out.len);
        // SAFETY: the block of `out` at c0 (cog rows of `rows` at stride cink) is this task's
        // alone and inside the buffer (see below).
        if unsafe {
            self.weight_gemm_avx512(
                rows,
                width,
                gt,
                cols,
                OutBlock::new(out.ptr.add(c0), cink),
                beta,
            )
        } {
            return;
        }
        // SAFETY: C = out[c0 + o * cink + r], o < cog, r < rows, lies inside the buffer (checked
        // above) and is the block of this task's offset group's channels, which no other task
        // touches (see `WeightOut`); A = gt and B = colsᵀ as in `weight_gradient`.
        unsafe {
            T::gemm(
                cog,
                width,
                rows,
                T::ONE,
                gt.as_ptr(),
                width as isize,
                1,
                cols.as_ptr(),
                1,
                width as isize,
                beta,
                out.ptr.add(c0),
                cink as isize,
                1,
            );
        }
        self.stats.weight_gemms += 1;
    }
}
