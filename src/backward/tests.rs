//! Unit tests of the backward's plumbing: which kernels a subset runs, the plan's limits and
//! the workspace bound.

use super::operands::{Needs, Stats};
use super::problem::{Operand, Problem, Tensors};
use super::*;
use crate::kernels::columns::MAX_CELLS;
use ndarray::Array;

type Arrays = (
    Array4<f64>,
    Array4<f64>,
    Option<Array4<f64>>,
    Array4<f64>,
    Array4<f64>,
);

fn problem(n: usize, mask: bool) -> Arrays {
    let val = |i: usize| ((i * 2654435761usize) % 1000) as f64 / 500.0 - 1.0;
    let input = Array::from_shape_fn((n, 4, 5, 6), |(a, b, c, d)| {
        val(a * 1000 + b * 100 + c * 10 + d)
    });
    let offset = Array::from_shape_fn((n, 2 * 2 * 9, 5, 6), |(a, b, c, d)| {
        1.3 * val(7 + a * 999 + b * 37 + c * 11 + d)
    });
    let m = mask.then(|| {
        Array::from_shape_fn((n, 2 * 9, 5, 6), |(a, b, c, d)| {
            val(3 + a * 91 + b * 17 + c * 5 + d)
        })
    });
    let weight = Array::from_shape_fn((6, 4, 3, 3), |(a, b, c, d)| {
        val(11 + a * 77 + b * 9 + c * 3 + d)
    });
    let grad_out = Array::from_shape_fn((n, 6, 5, 6), |(a, b, c, d)| {
        val(5 + a * 313 + b * 31 + c * 7 + d)
    });
    (input, offset, m, weight, grad_out)
}

fn stats_for(want: Want) -> (Stats, Grads<f64>) {
    let (input, offset, mask, weight, grad_out) = problem(3, true);
    let params = ConvParams::default().padding(1, 1).offset_groups(2);
    let tensors = Tensors {
        grad_out: grad_out.view(),
        input: Operand::View(input.view()),
        offset: Some(offset.view()),
        mask: mask.as_ref().map(|m| m.view()),
        weight: Operand::View(weight.view()),
    };
    let p = Problem::new(tensors, &params).unwrap();
    let grads = p.solve(want).unwrap();
    let mut g2 = p.solve(want).unwrap();
    let out = GradsMut {
        input: g2.input.as_mut().map(|a| a.view_mut()),
        offset: g2.offset.as_mut().map(|a| a.view_mut()),
        mask: g2.mask.as_mut().map(|a| a.view_mut()),
        weight: g2.weight.as_mut().map(|a| a.view_mut()),
        bias: g2.bias.as_mut().map(|a| a.view_mut()),
    };
    (p.solve_checked(out).unwrap(), grads)
}

#[test]
fn a_subset_runs_only_its_kernels_and_allocates_only_its_outputs() {
    let (s, g) = stats_for(Want::NONE.input());
    assert!(g.offset.is_none() && g.mask.is_none() && g.weight.is_none() && g.bias.is_none());
    assert!(s.gcol_gemms > 0 && s.scatters > 0);
    assert_eq!(
        (
            s.sample_passes,
            s.weight_gemms,
            s.input_copies,
            s.col_elems > 0
        ),
        (0, 0, 0, true)
    );
    assert_eq!(s.weight_part_elems, 0);

    let (s, g) = stats_for(Want::NONE.weight());
    assert!(g.input.is_none() && g.offset.is_none() && g.weight.is_some());
    assert_eq!((s.gcol_gemms, s.scatters, s.grad_plane_elems), (0, 0, 0));
    assert!(s.weight_gemms > 0 && s.sample_passes > 0);

    let (s, _) = stats_for(Want::NONE.offset().mask());
    assert!(s.gcol_gemms > 0 && s.sample_passes > 0);
    assert_eq!(
        (
            s.scatters,
            s.weight_gemms,
            s.grad_plane_elems,
            s.weight_part_elems
        ),
        (0, 0, 0, 0)
    );

    let (s, g) = stats_for(Want::NONE.bias());
    assert_eq!(s, Stats::default());
    assert!(g.bias.is_some() && g.input.is_none());

    let (s, _) = stats_for(Want::NONE);
    assert_eq!(s, Stats::default());

    // Everything at once shares the column gradient: one GEMM per (tile, segment), as for
    // grad_input alone.
    let (all, _) = stats_for(Want::ALL);
    let (only_input, _) = stats_for(Want::NONE.input());
    assert_eq!(all.gcol_gemms, only_input.gcol_gemms);
    assert_eq!(all.sample_passes, all.scatters);
}

/// Small output images of large planes: a pixel-major image group stays within the cells
/// the column table's `i32` bases reach; the channel-major plan is not capped.
#[test]
fn pixel_major_groups_stay_within_the_cell_limit() {
    let params = ConvParams::default().stride(4096, 4096);
    let g = Geometry::new([64, 1, 16384, 16384], [1, 1, 1, 1], &params).unwrap();
    let layout = crate::kernels::taps::PlaneLayout::zero_bordered(g.h, g.w);
    let plan = plan::Plan::new(&g, layout, true);
    assert!(plan.max_images() > 1);
    assert!(plan.max_images() * layout.len() <= MAX_CELLS);
    let channel_major = plan::Plan::new(&g, layout, false);
    assert!(channel_major.max_images() * layout.len() > MAX_CELLS);
}

/// Workspace in elements of `T` (plus the sampling tables, counted via `tap_bytes /
/// elem_bytes`) of the backward computing `want`, with `threads` tasks at once; see the
/// module docs of [`crate::plan::backward`].
fn workspace_elements(
    plan: &plan::Plan,
    g: &Geometry,
    want: Needs,
    threads: usize,
    tap_elems: usize,
) -> usize {
    let running = threads.min(plan.tasks(g));
    let cpo = g.c_per_offset_group();
    let k = g.taps();
    let p = plan.max_tile;
    let cs = plan::segments(g, 0)
        .iter()
        .map(|s| s.c_hi - s.c_lo)
        .max()
        .unwrap_or(0);
    // The replicated layout (DCN v1) is the larger one.
    let pl = crate::kernels::taps::PlaneLayout::replicated(g.h, g.w).len();
    let planes = plan.max_images * cpo * pl;
    let mut per_task = k * p * tap_elems + g.c_out_per_group() * p + 3 * k * p;
    if want.input_planes() {
        per_task += planes;
    }
    if want.input {
        per_task += planes;
    }
    if want.gcol() {
        per_task += cs * k * p;
    }
    if want.weight {
        per_task += cs * k * p;
    }
    let weight = g.c_out * g.c_in_per_group() * k;
    // The pixel-major path keeps a partial per slot and the weight packed tap-major.
    let partials = match (want.weight, plan.pixel_major) {
        (false, _) => 0,
        (true, false) => (plan.slots - 1) * weight,
        (true, true) => plan.slots * weight,
    };
    let tap_major = if plan.pixel_major && want.gcol() {
        weight + weight / 10
    } else {
        0
    };
    running * per_task + partials + tap_major
}

#[test]
fn w4_full_backward_workspace_is_below_64_mib() {
    let params = ConvParams::default().padding(1, 1);
    let g = Geometry::new([2, 256, 64, 64], [256, 256, 3, 3], &params).unwrap();
    let layout = crate::kernels::taps::PlaneLayout::zero_bordered(64, 64);
    let plan = plan::Plan::new(&g, layout, true);
    let all = Needs {
        input: true,
        offset: true,
        mask: true,
        weight: true,
    };
    let tap_elems = std::mem::size_of::<crate::kernels::taps::Tap<f32>>().div_ceil(4);
    let bytes = 4 * workspace_elements(&plan, &g, all, 2, tap_elems);
    eprintln!(
        "W4 full backward workspace (f32, 2 threads): {:.1} MiB",
        bytes as f64 / 1048576.0
    );
    assert!(bytes < 64 << 20, "{} MiB", bytes >> 20);
    // Past MIN_TASKS images the workspace no longer depends on the batch size.
    let at = |n: usize| {
        let g = Geometry::new([n, 256, 64, 64], [256, 256, 3, 3], &params).unwrap();
        4 * workspace_elements(&plan::Plan::new(&g, layout, true), &g, all, 2, tap_elems)
    };
    assert_eq!(at(16), at(128));
    assert!(at(16) < 64 << 20, "{} MiB", at(16) >> 20);
}
