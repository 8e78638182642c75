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
    let plan = Plan::new(g, layout, runs_pixel_major(ops));
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

/// Whether the backward runs pixel-major ([`crate::kernels::channel_backward`]): every
/// deformable problem, on every backend and in both element types; the dense convolution runs
/// channel-major ([`crate::kernels::dense_backward`]).
///
/// The deformable channel-major kernels (col2im + coord per channel) were deleted when the
/// pixel-major pass covered everything. Their last wins, measured on an AMD Zen 3 (`isa_probe`,
/// 2 threads, min of 2-3 alternating rounds, channel-major -> pixel-major, ms): scalar `f32`
/// W1 4.15 -> 4.71, W2 70.5 -> 75.3, W4 190 -> 197; scalar `f64` W1 5.48 -> 6.14, W4 346 ->
/// 378; `f64` wide offset groups (W2: 128 channels, W4: 256) AVX2 W2 114 -> 124, W4 305 -> 295;
/// portable W2 143 -> 145, W4 341 -> 359. The scalar backend is only the `DEFORMCONV_ISA`
/// cap's fallback, and one design for every backend and type replaced about 600 lines.
pub(super) fn runs_pixel_major<T: Float>(ops: &Operands<'_, T>) -> bool {
    ops.offset.is_some() || ops.mask.is_some()
}
