//! The backward driver: the partition into tasks ([`crate::plan::backward`]), the weight prepared once
//! ([`super::weights`]), the tasks run in parallel ([`super::task`]) and their `grad_weight`
//! partials combined.

use rayon::prelude::*;

use super::operands::{ImageOut, Needs, Operands, Stats, WeightOut};
use super::plan::Plan;
use super::task::Task;
use super::weights::{combine_partials, pack_weight_t, permute_weight, Weights};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::kernels::taps::PlaneLayout;
use crate::scratch;

/// Runs the backward for `needs`. `outs[n * G_off + og]` are the output views of (n, og);
/// `weight_out`, if `needs.weight`, receives `grad_weight` as `[C_out, C_in/groups * K]`
/// row-major.
pub(crate) fn run<T: Float>(
    g: &Geometry,
    ops: &Operands<'_, T>,
    needs: Needs,
    outs: Vec<ImageOut<'_, T>>,
    weight_out: Option<&mut [T]>,
) -> Stats {
    if !needs.any() || g.n == 0 {
        if let Some(w) = weight_out {
            w.fill(T::ZERO);
        }
        return Stats::default();
    }
    let layout = PlaneLayout::for_convention(ops.convention, g.h, g.w);
    let plan = Plan::new(g, layout, pixel_major_candidate(g, ops));
    let pixel_major = plan.pixel_major;
    let n_tasks = plan.tasks(g);
    let mut per_task: Vec<Vec<(usize, ImageOut<'_, T>)>> =
        (0..n_tasks).map(|_| Vec::new()).collect();
    for (i, out) in outs.into_iter().enumerate() {
        let (n, og) = (i / g.offset_groups, i % g.offset_groups);
        per_task[plan.slot_of_image(n) * g.offset_groups + og].push((n, out));
    }
    let weight_len = g.c_out * g.c_in_per_group() * g.taps();
    let mut weight_out = weight_out.filter(|_| needs.weight);
    // The pixel-major path's weight partials are tap-major, so every slot keeps its own.
    let shared = weight_out.as_deref_mut().filter(|_| !pixel_major).map(|w| {
        debug_assert_eq!(w.len(), weight_len);
        WeightOut {
            ptr: w.as_mut_ptr(),
            len: w.len(),
        }
    });
    let weights = if !needs.gcol() {
        Weights::None
    } else if pixel_major {
        permute_weight(g, ops)
    } else {
        pack_weight_t(g, ops)
    };
    let results: Vec<(Vec<T>, Stats)> = per_task
        .into_par_iter()
        .enumerate()
        .map(|(t, views)| {
            let (slot, og) = (t / g.offset_groups, t % g.offset_groups);
            let out = if slot == 0 { shared } else { None };
            let task = Task::new(g, &plan, ops, needs, og, &weights);
            task.run(slot, views, out)
        })
        .collect();
    let stats = results
        .iter()
        .fold(Stats::default(), |acc, (_, s)| acc.add(*s));
    if let Some(w) = weight_out {
        combine_partials(g, &plan, &results, w, pixel_major);
    }
    for (part, _) in results {
        scratch::give(part);
    }
    stats
}

/// Whether the backward runs pixel-major ([`crate::kernels::channel_backward`]): deformable,
/// `f32`, on a vector backend; `f64` on a vector backend when an offset group has at most 64
/// channels.
///
/// `f32`, measured on W4 (AVX-512, 1 thread): backward 175 -> 100 ms against the channel-major
/// col2im + coord kernels (same run: forward 53 ms). On an AMD Zen 4 (2 threads, min of 3 x 5
/// runs, channel-major -> pixel-major): AVX2 W1 2.56 -> 1.91, W2 50.0 -> 45.1, W4 156 -> 126
/// ms; portable W1 3.43 -> 3.13, W4 158 -> 137 ms.
///
/// `f64` lost on wide groups (AVX-512 W2, 128 channels per offset group, 90 -> 97; AVX2 W4
/// 256 -> 268, portable W4 241 -> 342 ms) but wins on narrow ones: W1 with 8, 16, 32 and 64
/// input channels (batch 64 x 8 / channels, 1 thread, min of 60, 3 rounds, Zen 4), AVX-512
/// 4.93 -> 3.09, 4.26 -> 2.60, 4.00 -> 2.41, 4.00 -> 2.17 ms; AVX2 5.22 -> 3.95, 4.49 -> 3.32,
/// 4.23 -> 3.16, 4.23 -> 2.88. Portable lost on W1 (6.9 -> 7.1) while its `floor` was a libm
/// call per lane on x86; with the vector `floor` it wins: W1 `f64` full backward 3.61 -> 3.07
/// ms (2 threads, min of 6 alternating rounds, Zen 4).
pub(super) fn pixel_major_candidate<T: Float>(g: &Geometry, ops: &Operands<'_, T>) -> bool {
    use crate::kernels::backend::{isa, Isa};
    let deformable = ops.offset.is_some() || ops.mask.is_some();
    deformable
        && match isa() {
            Isa::Scalar => false,
            Isa::Avx512 | Isa::Avx2 | Isa::Portable if !T::IS_F32 => g.c_per_offset_group() <= 64,
            _ => T::IS_F32,
        }
}
