//! What the backward's stages share: which gradients are wanted, the operands as slices, the
//! per-(image, offset group) output views, the shared `grad_weight` buffer and the counters.

use ndarray::{ArrayView4, ArrayViewMut3};

use crate::convention::Convention;
use crate::geometry::Geometry;
use crate::kernels::taps::PlaneLayout;

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

/// The fixed facts of one task, which its stages (tables, planes, GEMMs) read.
pub(super) struct Scope<'p, 'a, T> {
    pub(super) g: &'p Geometry,
    pub(super) ops: &'p Operands<'a, T>,
    /// The task's offset group.
    pub(super) og: usize,
    /// The padded plane layout of the problem's convention.
    pub(super) layout: PlaneLayout,
    /// Most images of one image group (the task's planes hold that many per channel).
    pub(super) max_images: usize,
    /// Planes, column gradient and columns pixel-major (see `driver::runs_pixel_major`).
    pub(super) pixel_major: bool,
}

impl<T> Clone for Scope<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Scope<'_, '_, T> {}
