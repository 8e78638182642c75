//! The weight as the backward's GEMMs read it, prepared once per call (`weightᵀ` packed, or
//! permuted tap-major for the pixel-major path), and the final gathering of the tasks'
//! `grad_weight` partials.

use rayon::prelude::*;

use super::operands::{Operands, Stats};
use super::plan::{segments, Plan, Segment};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::kernels::gemm::{MatB, PackedA, PackedB};

/// Columns of `B` per call of the pixel-major GEMMs: a `KC x 480` packed block (480 KiB)
/// stays in L2 while every row panel of `A` passes over it. 240 and 960 measured level
/// (`isa_probe W1 W2 W4`, 2 threads, AMD Zen 4, 5 alternating rounds each the best of 20, `f64` 6; medians of the rounds: `f32` W2/W4 full backward 45.5/109.0 ms at 480,
/// 44.4/108.6 at 240, 43.6/112.5 at 960, inside the rounds' spread).
pub(super) const GEMM_COLUMNS: usize = 480;

/// The weight as the column-gradient GEMM reads it, prepared once per call.
pub(super) enum Weights<T: Float> {
    /// No column gradient is wanted.
    None,
    /// Per offset group, per segment, `weightᵀ` (`(c_hi - c_lo) K x C_out/groups`) packed as
    /// the GEMM's `A`.
    Packed(Vec<Vec<PackedA<T>>>),
    /// Per offset group, per segment, the pixel-major path's `B`,
    /// `[o][k * C_seg + c] = weight[group o, c, k]`, packed in blocks of [`GEMM_COLUMNS`]
    /// columns.
    TapMajor(Vec<Vec<Vec<PackedB<T>>>>),
}

/// [`Weights::Packed`] of the operands (`None` without a weight).
pub(super) fn pack_weight_t<T: Float>(g: &Geometry, ops: &Operands<'_, T>) -> Weights<T> {
    let Some(w) = ops.weight else {
        return Weights::None;
    };
    let k_taps = g.taps();
    let cink = g.c_in_per_group() * k_taps;
    let cog = g.c_out_per_group();
    Weights::Packed(
        (0..g.offset_groups)
            .map(|og| {
                segments(g, og)
                    .iter()
                    .map(|seg| {
                        let rows = (seg.c_hi - seg.c_lo) * k_taps;
                        let a0 = seg.conv_group * cog * cink
                            + (seg.c_lo - seg.conv_group * g.c_in_per_group()) * k_taps;
                        PackedA::pack_strided(&w[a0..], rows, cog, 1, cink)
                    })
                    .collect()
            })
            .collect(),
    )
}

/// [`Weights::TapMajor`] of the operands (`None` without a weight). Rows in parallel.
pub(super) fn permute_weight<T: Float>(g: &Geometry, ops: &Operands<'_, T>) -> Weights<T> {
    let Some(weight) = ops.weight else {
        return Weights::None;
    };
    let k_taps = g.taps();
    let cink = g.c_in_per_group() * k_taps;
    let cog = g.c_out_per_group();
    let permute = |seg: &Segment| {
        let cs = seg.c_hi - seg.c_lo;
        let mut out = crate::scratch::take::<T>(cog * cs * k_taps);
        let c0 = seg.c_lo - seg.conv_group * g.c_in_per_group();
        out.par_chunks_mut((cs * k_taps).max(1))
            .enumerate()
            .for_each(|(o, row)| {
                let src = &weight[(seg.conv_group * cog + o) * cink + c0 * k_taps..][..cs * k_taps];
                // row[k * cs + c] = src[c * K + k]: a cs x K transpose, in registers (the
                // element loop it replaced was 1.5% of W2's full backward, AVX-512 profile).
                crate::kernels::pixel_major::to_pixel_major(src, cs, k_taps, k_taps, row);
            });
        let rows = cs * k_taps;
        let blocks = (0..rows)
            .step_by(GEMM_COLUMNS)
            .map(|n0| {
                let b = MatB {
                    data: &out[n0..],
                    rs: rows,
                    cs: 1,
                };
                PackedB::pack(b, cog, GEMM_COLUMNS.min(rows - n0))
            })
            .collect();
        crate::scratch::give(out);
        blocks
    };
    Weights::TapMajor(
        (0..g.offset_groups)
            .map(|og| segments(g, og).iter().map(permute).collect())
            .collect(),
    )
}

/// Adds the tasks' weight partials into `grad_weight` in slot order, rows of `out` in
/// parallel. Channel-major partials (`[o][c' K + k]`) of slots `1..R` are added to what slot 0
/// wrote directly; tap-major ones (`[o][k C_seg + c]`, the pixel-major path) are gathered from
/// every slot, slot 0's assigned.
pub(super) fn combine_partials<T: Float>(
    g: &Geometry,
    plan: &Plan,
    results: &[(Vec<T>, Stats)],
    out: &mut [T],
    tap_major: bool,
) {
    let first = if tap_major { 0 } else { 1 };
    if first >= plan.slots {
        return;
    }
    let k_taps = g.taps();
    let cink = g.c_in_per_group() * k_taps;
    let cog = g.c_out_per_group();
    let segs: Vec<(usize, Segment)> = (0..g.offset_groups)
        .flat_map(|og| segments(g, og).into_iter().map(move |s| (og, s)))
        .collect();
    out.par_chunks_mut(cink).enumerate().for_each_init(
        Vec::new,
        |turned: &mut Vec<T>, (o_glob, row)| {
            let (conv_group, o) = (o_glob / cog, o_glob % cog);
            for (og, seg) in segs.iter().filter(|(_, s)| s.conv_group == conv_group) {
                let cs = seg.c_hi - seg.c_lo;
                let rows = cs * k_taps;
                let col0 = (seg.c_lo - conv_group * g.c_in_per_group()) * k_taps;
                let dst = &mut row[col0..][..rows];
                for slot in first..plan.slots {
                    let part = &results[slot * g.offset_groups + og].0;
                    let src = &part[seg.part_offset + o * rows..][..rows];
                    if tap_major {
                        // Tap-major k C_seg + c goes to c K + k (a K x C_seg transpose).
                        turned.resize(rows, T::ZERO);
                        crate::kernels::pixel_major::from_pixel_major(
                            src, cs, k_taps, turned, k_taps,
                        );
                        if slot == 0 {
                            dst.copy_from_slice(turned);
                        } else {
                            for (d, &v) in dst.iter_mut().zip(turned.iter()) {
                                *d += v;
                            }
                        }
                    } else {
                        for (d, &v) in dst.iter_mut().zip(src) {
                            *d += v;
                        }
                    }
                }
            }
        },
    );
}
