//! The backward driver: the operands and outputs of one call, the partition into tasks
//! ([`super::plan`]), the weight prepared once ([`super::weights`]), the tasks run in
//! parallel ([`super::task`]) and their `grad_weight` partials combined.

use ndarray::{ArrayView4, ArrayViewMut3};
use rayon::prelude::*;

use super::plan::Plan;
use super::task::Task;
#[cfg(target_arch = "x86_64")]
use super::weights::permute_weight;
use super::weights::{combine_partials, pack_weight_t, Weights};
use crate::convention::Convention;
use crate::float::Float;
use crate::geometry::Geometry;
use crate::kernels::taps::PlaneLayout;
use crate::scratch;

/// Which gradients to compute (the driver's copy of `Want`, without the bias).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    pub input: bool,
    pub offset: bool,
    pub mask: bool,
    pub weight: bool,
}

impl Needs {
    /// Whether the column gradient `weightᵀ · grad_out` is needed.
    pub(crate) fn gcol(&self) -> bool {
        self.input || self.offset || self.mask
    }
    /// Whether the input planes are read.
    pub(crate) fn input_planes(&self) -> bool {
        self.offset || self.mask || self.weight
    }
    pub(super) fn any(&self) -> bool {
        self.gcol() || self.weight
    }
}

/// How often each kernel ran and how much workspace was taken, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Column-gradient GEMMs.
    pub gcol_gemms: usize,
    /// col2im scatters.
    pub scatters: usize,
    /// Sample-gradient passes (offset / mask / columns).
    pub sample_passes: usize,
    /// grad_weight GEMMs.
    pub weight_gemms: usize,
    /// Input planes copied.
    pub input_copies: usize,
    /// Elements of grad_input scratch allocated.
    pub grad_plane_elems: usize,
    /// Elements of column / column-gradient scratch allocated.
    pub col_elems: usize,
    /// Elements of weight partials allocated.
    pub weight_part_elems: usize,
}

impl Stats {
    pub(super) fn add(mut self, o: Stats) -> Stats {
        self.gcol_gemms += o.gcol_gemms;
        self.scatters += o.scatters;
        self.sample_passes += o.sample_passes;
        self.weight_gemms += o.weight_gemms;
        self.input_copies += o.input_copies;
        self.grad_plane_elems += o.grad_plane_elems;
        self.col_elems += o.col_elems;
        self.weight_part_elems += o.weight_part_elems;
        self
    }
}

/// The operands, validated and in standard layout where the kernels index them as slices.
pub(crate) struct Operands<'a, T> {
    /// `grad_out`, `[N, C_out, H_out, W_out]` row-major.
    pub grad_out: &'a [T],
    /// The input (any layout); required when `input_planes()`.
    pub input: Option<ArrayView4<'a, T>>,
    /// Offsets, row-major; `None` for the dense convolution (zero offsets).
    pub offset: Option<&'a [T]>,
    /// Mask, row-major; `None` for a unit mask.
    pub mask: Option<&'a [T]>,
    /// Weight `[C_out, C_in/groups * K]` row-major; required when `gcol()`.
    pub weight: Option<&'a [T]>,
    /// The sampling convention of the table (torchvision for the dense convolution).
    pub convention: Convention,
}

/// Per-(image, offset group) output views: `[C_in/G_off, H, W]`, `[2K, H_out, W_out]`,
/// `[K, H_out, W_out]`.
pub(crate) struct ImageOut<'a, T> {
    pub input: Option<ArrayViewMut3<'a, T>>,
    pub offset: Option<ArrayViewMut3<'a, T>>,
    pub mask: Option<ArrayViewMut3<'a, T>>,
}

/// The final `grad_weight` buffer, `[C_out, C_in/groups * K]` row-major, shared by the slot-0
/// tasks, each of which writes only the columns of its own offset group's channels.
#[derive(Clone, Copy)]
pub(super) struct WeightOut<T> {
    pub(super) ptr: *mut T,
    pub(super) len: usize,
}

// SAFETY: the pointer is only dereferenced (through the GEMM) by the slot-0 tasks, on disjoint
// column blocks (the offset groups' channels are disjoint), while `run` holds the exclusive
// borrow of the buffer and waits for every task before touching it again.
unsafe impl<T: Send> Send for WeightOut<T> {}
// SAFETY: as above; no two tasks ever access the same element.
unsafe impl<T: Sync> Sync for WeightOut<T> {}

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
    let plan = Plan::new(g, layout, pixel_major_candidate(ops));
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
        #[cfg(target_arch = "x86_64")]
        let tap_major = permute_weight(g, ops);
        #[cfg(not(target_arch = "x86_64"))]
        let tap_major = None;
        tap_major.unwrap_or(Weights::None)
    } else {
        pack_weight_t(g, ops).map_or(Weights::None, Weights::Packed)
    };
    let results: Vec<(Vec<T>, Stats)> = per_task
        .into_par_iter()
        .enumerate()
        .map(|(t, views)| {
            let (slot, og) = (t / g.offset_groups, t % g.offset_groups);
            let out = if slot == 0 { shared } else { None };
            let task = Task::new(g, &plan, ops, needs, og, &weights, pixel_major);
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

/// Whether the backward runs pixel-major ([`crate::kernels::channel_backward`]):
/// deformable, `f32` on AVX-512. Measured on W4 (`f32`, 1 thread): backward 175 -> 100 ms against the
/// channel-major col2im + coord kernels (same run: forward 53 ms).
pub(super) fn pixel_major_candidate<T: Float>(ops: &Operands<'_, T>) -> bool {
    cfg!(target_arch = "x86_64")
        && (ops.offset.is_some() || ops.mask.is_some())
        && crate::kernels::lanes::isa() == crate::kernels::lanes::Isa::Avx512
        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}
