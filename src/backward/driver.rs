//! The backward driver: a fixed decomposition of the problem into tasks that each own their
//! outputs, and the per-task loop over pixel tiles.
//!
//! **Partition** (depends only on the problem's shape, never on the thread count or on which
//! gradients are wanted):
//! - images are cut into *image groups*: an image with at least `P` output pixels is a group of
//!   its own, cut into near-equal pixel tiles of at most `P`; smaller images are packed, whole,
//!   a near-equal number per group, into one tile of at most `P` columns (so the GEMMs see wide
//!   enough matrices). `P` is [`TILE_PIXELS`], or on the pixel-major path the width whose
//!   column gradient is about [`PIXEL_MAJOR_TILE_BYTES`] (64 to 512 pixels);
//! - groups are dealt round-robin to `R` *slots*, `R = clamp(ceil(MIN_TASKS / G_off), 1, groups)`;
//! - a *task* is a (slot, offset group) pair and walks its slot's groups in order.
//!
//! **Ownership**: a task is the only writer of `grad_input[n, c]` and of `grad_offset` /
//! `grad_mask[n, channels of its offset group]` for the images of its slot, so it writes them
//! without atomics; it sums over the channels of its offset group itself, in a fixed order.
//! `grad_weight` columns of an offset group's channels are summed by the task over its slot's
//! groups in order: slot 0 straight into the output, the other slots into private partials,
//! which are added to the output in slot order at the end (pixel-major path: every slot into
//! a partial, gathered in slot order).
//!
//! **Two layouts.** Deformable `f32` on AVX-512 runs *pixel-major*: input and grad_input planes
//! are `[cell][channel]`, `gcol` and `cols` are `[pixel][k][channel]`, the GEMMs are turned
//! around to produce and consume that orientation (`weight` permuted tap-major and packed once
//! per call), and one fused pass of [`crate::kernels::channel_backward`] does col2im and coord
//! sixteen channels per vector. Everything else runs *channel-major*: planes `[channel][cell]`,
//! `gcol`, `cols` as below, col2im and coord per channel.
//!
//! **Per tile** (for each segment = offset group ∩ conv group, channels ascending; shown
//! channel-major):
//! ```text
//! taps[k, p]           = sampling of (offset group, tap, pixel)        (once per tile)
//! gt[o, p]             = grad_out[n, group(o), p]                      (packed copy)
//! gcol[c', k, p]       = sum_o weight[o, c', k] * gt[o, p]             (GEMM, if input/offset/mask)
//! grad_input planes   += scatter(gcol * m, corner weights)            (col2im)
//! grad_offset, grad_mask, cols = m * B                                 (coord)
//! wpart[o, c', k]     += sum_p gt[o, p] * cols[c', k, p]               (GEMM, if weight)
//! ```
//!
//! (`grad_weight` GEMMs overwrite on a task's first tile, `beta = 0`, and accumulate after.)
//! ```text
//! ```
//!
//! **Workspace** (elements of `T`, `t = min(threads, tasks)` tasks running at once, `P` the
//! tile width, `Cs` = channels of the largest segment, `I` = images per group (1 when
//! `H_out W_out >= P`, else at most `P / (H_out W_out)`), `Pl = (H+2)(W+2)`, `(H+2)(W+3)` for
//! DCN v1's replicated planes):
//! `t * [2 I (C_in/G_off) Pl + 2 Cs K P + (C_out/groups) P + 3 K P + ~12 K P (taps)] + (R - 1) |weight|`
//! (`+ |weight|` when the caller's `grad_weight` is not row-major; pixel-major: `R |weight|`
//! partials plus the packed tap-major weight, about `1.1 |weight|`); nothing grows with the
//! batch size `N` (`R <= MIN_TASKS`). W4 in f32 with 2 threads: about 29 MiB pixel-major. The planes, column
//! buffers and packed `grad_out` come from, and go back to, a per-thread cache kept between
//! calls (at most 32 MiB per thread, see [`crate::scratch`]).

use std::ops::Range;

use ndarray::{ArrayView4, ArrayViewMut3};
use rayon::prelude::*;

use crate::convention::Convention;
use crate::float::Float;
use crate::geometry::Geometry;
use crate::kernels::col2im::{scatter, TileShape};
use crate::kernels::columns::{TapColumns, MAX_CELLS};
use crate::kernels::coord::{sample_gradients, SampleOut, SampleWant};
use crate::kernels::taps::{DcnV1Rule, MmcvRule, PlaneLayout, Rule, Tap, TorchvisionRule};

use crate::scratch;

/// Most output pixels in one tile (GEMM width) of the channel-major path. 512 rather than 256:
/// matrixmultiply repacks `weightᵀ` for every tile, and on W4 packing was 12% of the backward
/// at 256 (1 thread; the machine was too contended to resolve 512 vs 1024).
pub(crate) const TILE_PIXELS: usize = 512;
/// Bytes of column gradient per tile the pixel-major path aims for (its tile is at most
/// [`TILE_PIXELS`] and at least [`MIN_TILE_PIXELS`] wide), so that the fused pass streams
/// `gcol` and `cols` while they are still in L2. Measured on W4 (`f32`, 1 thread, one run):
/// backward 123 ms at 512 pixels (4.5 MiB), 112 at 256, 100 at 128, 104 at 64; W2 (2 threads)
/// 23.7 ms at 5 images per tile, 21.8 at 2 and 1. Alternating 2-thread runs of 512 KiB (W4 64
/// pixels, W2 2 images) and 1 MiB did not separate them beyond the machine's noise.
const PIXEL_MAJOR_TILE_BYTES: usize = 512 << 10;
/// The narrowest pixel-major tile (the GEMMs lose efficiency below).
const MIN_TILE_PIXELS: usize = 64;
/// Columns of `B` per call of the pixel-major GEMMs: a `KC x 480` packed block (480 KiB)
/// stays in L2 while every row panel of `A` passes over it.
const GEMM_COLUMNS: usize = 480;
/// Tasks the partition aims for, independent of the thread count: enough to balance 2-4
/// threads, few enough that W2 (4 offset groups) needs no weight partials.
pub(crate) const MIN_TASKS: usize = 4;

/// One contiguous run of output pixels of one image inside a tile.
#[derive(Debug, Clone)]
struct Piece {
    /// Image index `n`.
    image: usize,
    /// Pixel range `p0..p1` (row-major `y * W_out + x`).
    pixels: Range<usize>,
    /// Column of `p0` in the tile.
    col0: usize,
}

/// A set of whole images processed by one task, as a list of tiles.
#[derive(Debug, Clone)]
struct ImageGroup {
    images: Range<usize>,
    tiles: Vec<Vec<Piece>>,
}

/// Channels `c_lo..c_hi` (global) of one offset group inside one conv group.
#[derive(Debug, Clone, Copy)]
struct Segment {
    conv_group: usize,
    c_lo: usize,
    c_hi: usize,
    /// Start of this segment's block in the task's weight partial.
    part_offset: usize,
}

/// The fixed decomposition of one problem.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Planned for the pixel-major path (narrower tiles, tap-major weight partials).
    pixel_major: bool,
    groups: Vec<ImageGroup>,
    slots: usize,
    max_tile: usize,
    max_images: usize,
}

impl Plan {
    /// The partition of the module docs for `g`, whose planes have `layout`. A pixel-major
    /// plan packs at most [`MAX_CELLS`] plane cells into one image group, so that the column
    /// table's `i32` bases reach every cell (validation refuses larger single planes).
    pub(crate) fn new(g: &Geometry, layout: PlaneLayout, pixel_major: bool) -> Plan {
        let hw = g.out_pixels();
        let tile_pixels = if pixel_major {
            // One pixel's column gradient: K taps of the widest segment (<= C_in/G_off), f32.
            let per_pixel = (g.taps() * g.c_per_offset_group() * 4).max(1);
            (PIXEL_MAJOR_TILE_BYTES / per_pixel)
                .next_multiple_of(16)
                .clamp(MIN_TILE_PIXELS, TILE_PIXELS)
        } else {
            TILE_PIXELS
        };
        let mut groups = Vec::new();
        if hw >= tile_pixels {
            let n_tiles = hw.div_ceil(tile_pixels);
            let width = hw.div_ceil(n_tiles);
            for n in 0..g.n {
                let tiles = (0..hw)
                    .step_by(width)
                    .map(|p0| {
                        vec![Piece {
                            image: n,
                            pixels: p0..(p0 + width).min(hw),
                            col0: 0,
                        }]
                    })
                    .collect();
                groups.push(ImageGroup {
                    images: n..n + 1,
                    tiles,
                });
            }
        } else if g.n > 0 {
            let mut per_group = (tile_pixels / hw).max(1);
            if pixel_major {
                per_group = per_group.min((MAX_CELLS / layout.len()).max(1));
            }
            let n_groups = g.n.div_ceil(per_group);
            let per_group = g.n.div_ceil(n_groups);
            for first in (0..g.n).step_by(per_group) {
                let images = first..(first + per_group).min(g.n);
                let tile = images
                    .clone()
                    .enumerate()
                    .map(|(i, n)| Piece {
                        image: n,
                        pixels: 0..hw,
                        col0: i * hw,
                    })
                    .collect();
                groups.push(ImageGroup {
                    images,
                    tiles: vec![tile],
                });
            }
        }
        let slots = MIN_TASKS
            .div_ceil(g.offset_groups)
            .clamp(1, groups.len().max(1));
        let max_tile = groups
            .iter()
            .flat_map(|gr| gr.tiles.iter())
            .map(|t| t.iter().map(|p| p.pixels.len()).sum::<usize>())
            .max()
            .unwrap_or(0);
        let max_images = groups.iter().map(|gr| gr.images.len()).max().unwrap_or(0);
        Plan {
            groups,
            slots,
            max_tile,
            max_images,
            pixel_major,
        }
    }

    /// Number of tasks, `slots * G_off` (0 for an empty batch).
    pub(crate) fn tasks(&self, g: &Geometry) -> usize {
        if self.groups.is_empty() {
            0
        } else {
            self.slots * g.offset_groups
        }
    }

    /// Most images in one image group.
    #[cfg(test)]
    pub(crate) fn max_images(&self) -> usize {
        self.max_images
    }

    /// Slot of image `n`.
    fn slot_of_image(&self, n: usize) -> usize {
        // Groups are in image order; find the group of n.
        let gi = self
            .groups
            .partition_point(|gr| gr.images.end <= n)
            .min(self.groups.len().saturating_sub(1));
        gi % self.slots
    }

    /// Workspace in elements of `T` (plus the sampling tables, counted via `tap_bytes /
    /// elem_bytes`) of the backward computing `want`, with `threads` tasks at once; see the
    /// module docs.
    #[cfg(test)]
    pub(crate) fn workspace_elements(
        &self,
        g: &Geometry,
        want: Needs,
        threads: usize,
        tap_elems: usize,
    ) -> usize {
        let running = threads.min(self.tasks(g));
        let cpo = g.c_per_offset_group();
        let k = g.taps();
        let p = self.max_tile;
        let cs = segments(g, 0)
            .iter()
            .map(|s| s.c_hi - s.c_lo)
            .max()
            .unwrap_or(0);
        // The replicated layout (DCN v1) is the larger one.
        let pl = PlaneLayout::replicated(g.h, g.w).len();
        let planes = self.max_images * cpo * pl;
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
        let partials = match (want.weight, self.pixel_major) {
            (false, _) => 0,
            (true, false) => (self.slots - 1) * weight,
            (true, true) => self.slots * weight,
        };
        let tap_major = if self.pixel_major && want.gcol() {
            weight + weight / 10
        } else {
            0
        };
        running * per_task + partials + tap_major
    }
}

/// `weightᵀ` of one segment, packed for the AVX-512 `f32` GEMM.
#[cfg(target_arch = "x86_64")]
type PackedWeightT = crate::kernels::sgemm::PackedA;
#[cfg(not(target_arch = "x86_64"))]
type PackedWeightT = ();

/// Per offset group, per segment: the segment's `weightᵀ` (`(c_hi - c_lo) K x C_out/groups`)
/// packed once per call for the column gradient, when the element type is `f32` and the CPU
/// has AVX-512F (otherwise `None`, and matrixmultiply packs per tile).
fn pack_weight_t<T: Float>(g: &Geometry, ops: &Operands<'_, T>) -> Option<Vec<Vec<PackedWeightT>>> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::lanes::{isa, Isa};
        let weight = ops.weight?;
        if std::any::TypeId::of::<T>() != std::any::TypeId::of::<f32>() || isa() != Isa::Avx512 {
            return None;
        }
        // SAFETY: T is f32 (checked above): the same memory read as f32.
        let w = unsafe { std::slice::from_raw_parts(weight.as_ptr() as *const f32, weight.len()) };
        let k_taps = g.taps();
        let cink = g.c_in_per_group() * k_taps;
        let cog = g.c_out_per_group();
        Some(
            (0..g.offset_groups)
                .map(|og| {
                    segments(g, og)
                        .iter()
                        .map(|seg| {
                            let rows = (seg.c_hi - seg.c_lo) * k_taps;
                            let a0 = seg.conv_group * cog * cink
                                + (seg.c_lo - seg.conv_group * g.c_in_per_group()) * k_taps;
                            PackedWeightT::pack_strided(&w[a0..], rows, cog, 1, cink)
                        })
                        .collect()
                })
                .collect(),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, ops);
        None
    }
}

/// The segments of offset group `og`, with their offsets in the task's weight partial.
fn segments(g: &Geometry, og: usize) -> Vec<Segment> {
    let cpo = g.c_per_offset_group();
    let cig = g.c_in_per_group();
    let (lo, hi) = (og * cpo, (og + 1) * cpo);
    let mut out = Vec::new();
    let mut c = lo;
    let mut part_offset = 0;
    while c < hi {
        let conv_group = c / cig;
        let c_hi = hi.min((conv_group + 1) * cig);
        out.push(Segment {
            conv_group,
            c_lo: c,
            c_hi,
            part_offset,
        });
        part_offset += g.c_out_per_group() * (c_hi - c) * g.taps();
        c = c_hi;
    }
    out
}

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
    fn any(&self) -> bool {
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
    fn add(mut self, o: Stats) -> Stats {
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
struct WeightOut<T> {
    ptr: *mut T,
    len: usize,
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

/// The weight as the column-gradient GEMM reads it, prepared once per call.
enum Weights {
    /// matrixmultiply reads the caller's weight directly.
    None,
    /// Per offset group, per segment, `weightᵀ` packed for the AVX-512 `f32` GEMM.
    Packed(Vec<Vec<PackedWeightT>>),
    /// Per offset group, per segment, the pixel-major path's `B`,
    /// `[o][k * C_seg + c] = weight[group o, c, k]`, packed in blocks of [`GEMM_COLUMNS`]
    /// columns.
    #[cfg(target_arch = "x86_64")]
    TapMajor(Vec<Vec<Vec<crate::kernels::sgemm::PackedB>>>),
}

/// Whether the backward runs pixel-major ([`crate::kernels::channel_backward`]):
/// deformable, `f32` on AVX-512. Measured on W4 (`f32`, 1 thread): backward 175 -> 100 ms against the
/// channel-major col2im + coord kernels (same run: forward 53 ms).
fn pixel_major_candidate<T: Float>(ops: &Operands<'_, T>) -> bool {
    cfg!(target_arch = "x86_64")
        && (ops.offset.is_some() || ops.mask.is_some())
        && crate::kernels::lanes::isa() == crate::kernels::lanes::Isa::Avx512
        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

/// [`Weights::TapMajor`] of the operands (`None` without a weight or when `T` is not `f32`).
/// Rows in parallel.
#[cfg(target_arch = "x86_64")]
fn permute_weight<T: Float>(g: &Geometry, ops: &Operands<'_, T>) -> Option<Weights> {
    use crate::kernels::pixel_major::to_pixel_major;
    use crate::kernels::sgemm::{MatB, PackedB};
    let weight = crate::kernels::same_type::<T, f32>(ops.weight?)?;
    let k_taps = g.taps();
    let cink = g.c_in_per_group() * k_taps;
    let cog = g.c_out_per_group();
    let permute = |seg: &Segment| {
        let cs = seg.c_hi - seg.c_lo;
        let mut out = scratch::take::<f32>(cog * cs * k_taps);
        let c0 = seg.c_lo - seg.conv_group * g.c_in_per_group();
        out.par_chunks_mut((cs * k_taps).max(1))
            .enumerate()
            .for_each(|(o, row)| {
                let src = &weight[(seg.conv_group * cog + o) * cink + c0 * k_taps..][..cs * k_taps];
                // row[k * cs + c] = src[c * K + k]: a cs x K transpose.
                to_pixel_major(src, cs, k_taps, k_taps, row);
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
                // SAFETY: AVX-512F was detected (`pixel_major_candidate`).
                unsafe { PackedB::pack(b, cog, GEMM_COLUMNS.min(rows - n0)) }
            })
            .collect();
        scratch::give(out);
        blocks
    };
    Some(Weights::TapMajor(
        (0..g.offset_groups)
            .map(|og| segments(g, og).iter().map(permute).collect())
            .collect(),
    ))
}

/// Adds the tasks' weight partials into `grad_weight` in slot order, rows of `out` in
/// parallel. Channel-major partials (`[o][c' K + k]`) of slots `1..R` are added to what slot 0
/// wrote directly; tap-major ones (`[o][k C_seg + c]`, the pixel-major path) are gathered from
/// every slot, slot 0's assigned.
fn combine_partials<T: Float>(
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

/// The scratch and fixed facts of one (slot, offset group) task.
struct Task<'p, 'a, T> {
    g: &'p Geometry,
    plan: &'p Plan,
    ops: &'p Operands<'a, T>,
    needs: Needs,
    og: usize,
    segs: Vec<Segment>,
    /// The weight prepared for the column-gradient GEMM.
    weights: &'p Weights,
    /// Planes, column gradient and columns pixel-major (see [`pixel_major_candidate`]).
    pixel_major: bool,
    /// The GEMM's packed `B` block (reused across tiles).
    packed_b: Vec<f32>,
    /// The tile's `grad_out` packed as `A` of the weight-gradient GEMM, when the AVX-512 `f32`
    /// kernel applies.
    #[cfg(target_arch = "x86_64")]
    packed_gt: Option<crate::kernels::sgemm::PackedA>,
    /// The tile's `grad_outᵀ`, packed as `A` of the pixel-major column-gradient GEMM.
    #[cfg(target_arch = "x86_64")]
    packed_gt_t: Option<crate::kernels::sgemm::PackedA>,
    layout: PlaneLayout,
    stats: Stats,
}

impl<'p, 'a, T: Float> Task<'p, 'a, T> {
    fn new(
        g: &'p Geometry,
        plan: &'p Plan,
        ops: &'p Operands<'a, T>,
        needs: Needs,
        og: usize,
        weights: &'p Weights,
        pixel_major: bool,
    ) -> Self {
        Task {
            g,
            plan,
            ops,
            needs,
            og,
            segs: segments(g, og),
            weights,
            pixel_major,
            packed_b: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            packed_gt: (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
                && crate::kernels::lanes::isa() == crate::kernels::lanes::Isa::Avx512)
                .then(|| crate::kernels::sgemm::PackedA::pack_strided(&[], 0, 0, 0, 0)),
            #[cfg(target_arch = "x86_64")]
            packed_gt_t: None,
            layout: PlaneLayout::for_convention(ops.convention, g.h, g.w),
            stats: Stats::default(),
        }
    }

    /// Processes the groups `slot, slot + R, ...`; `views` are the outputs of their images in
    /// order. Returns the weight partial (empty unless wanted).
    fn run(
        mut self,
        slot: usize,
        mut views: Vec<(usize, ImageOut<'_, T>)>,
        weight_out: Option<WeightOut<T>>,
    ) -> (Vec<T>, Stats) {
        let g = self.g;
        let needs = self.needs;
        let k_taps = g.taps();
        let cpo = g.c_per_offset_group();
        let cog = g.c_out_per_group();
        let p = self.plan.max_tile;
        let max_rows = self
            .segs
            .iter()
            .map(|s| (s.c_hi - s.c_lo) * k_taps)
            .max()
            .unwrap_or(0);
        let planes_len = self.plan.max_images * cpo * self.layout.len();
        // Zeroed buffers, the large ones from this thread's cache (see `scratch`).
        let alloc = |on: bool, len: usize| if on { scratch::take(len) } else { Vec::new() };
        let mut in_planes = alloc(needs.input_planes(), planes_len);
        let mut gr_planes = alloc(needs.input, planes_len);
        let mut gcol = alloc(needs.gcol(), max_rows * p);
        let mut cols = alloc(needs.weight, max_rows * p);
        let mut gt = alloc(true, cog * p);
        let mut acc_dy = alloc(needs.offset, k_taps * p);
        let mut acc_dx = alloc(needs.offset, k_taps * p);
        let mut acc_m = alloc(needs.mask, k_taps * p);
        let part_len = g.c_out_per_group() * cpo * k_taps;
        // Slot 0 writes grad_weight itself (unless pixel-major: `run` then passes no
        // `weight_out`); the other slots keep a private partial.
        let mut wpart = alloc(needs.weight && weight_out.is_none(), part_len);
        let mut first_weight_tile = true;
        let mut taps: Vec<Tap<T>> = Vec::with_capacity(k_taps * p);
        // Dense convolution: zero offsets and no mask, so every sample is one cell with weight 1.
        let dense = self.ops.offset.is_none() && self.ops.mask.is_none();
        // Pixel-major torchvision tables are built straight into columns by AVX-512 (the row
        // table is not built at all).
        let direct = self.direct_columns();
        // Planes pixel-major and one fused AVX-512 pass per segment instead of col2im + coord.
        let pixel_major = self.pixel_major;
        let mut columns = TapColumns::<T>::default();
        let mut pixel_bases = (Vec::new(), Vec::new());
        self.stats.grad_plane_elems += gr_planes.len();
        self.stats.col_elems += gcol.len() + cols.len();
        self.stats.weight_part_elems += wpart.len();

        let mut first_view = 0;
        for group in self.plan.groups.iter().skip(slot).step_by(self.plan.slots) {
            let group_views = &mut views[first_view..first_view + group.images.len()];
            first_view += group.images.len();
            debug_assert!(group_views
                .iter()
                .zip(group.images.clone())
                .all(|((n, _), m)| *n == m));
            if needs.input_planes() {
                if pixel_major {
                    self.load_input_pixel_major(group, &mut in_planes);
                } else {
                    self.load_input(group, &mut in_planes);
                }
            }
            if needs.input {
                gr_planes.fill(T::ZERO);
            }
            for tile in &group.tiles {
                let width: usize = tile.iter().map(|pc| pc.pixels.len()).sum();
                let shape = TileShape {
                    channel_stride: self.plan.max_images * self.layout.len(),
                    pitch: self.layout.pitch(),
                    tile: width,
                    taps: k_taps,
                    dense,
                };
                if direct {
                    self.build_columns(group, tile, width, &mut columns, &mut pixel_bases);
                } else {
                    self.build_taps(group, tile, width, &mut taps);
                    if pixel_major {
                        columns.fill(&taps);
                    }
                }
                if needs.offset {
                    acc_dy[..k_taps * width].fill(T::ZERO);
                    acc_dx[..k_taps * width].fill(T::ZERO);
                }
                if needs.mask {
                    acc_m[..k_taps * width].fill(T::ZERO);
                }
                let mut packed_group = usize::MAX;
                for (si, seg) in self.segs.clone().iter().enumerate() {
                    let rows = (seg.c_hi - seg.c_lo) * k_taps;
                    if packed_group != seg.conv_group {
                        self.pack_grad_out(seg.conv_group, tile, width, &mut gt);
                        packed_group = seg.conv_group;
                    }
                    let local = seg.c_lo - self.og * cpo..seg.c_hi - self.og * cpo;
                    if needs.gcol() {
                        self.column_gradient(si, seg, width, &gt, &mut gcol[..rows * width]);
                    }
                    if pixel_major {
                        let out = SampleOut {
                            dy: &mut acc_dy,
                            dx: &mut acc_dx,
                            mask: &mut acc_m,
                            cols: &mut cols,
                        };
                        let planes = (&in_planes[..], &mut gr_planes[..]);
                        self.fused_pass(planes, width, &columns, &gcol, local.clone(), out);
                    } else if needs.input {
                        scatter(&mut gr_planes, shape, &taps, &gcol, local.clone());
                        self.stats.scatters += 1;
                    }
                    if needs.input_planes() && !pixel_major {
                        let want = SampleWant {
                            offset: needs.offset,
                            mask: needs.mask,
                            cols: needs.weight,
                        };
                        let out = SampleOut {
                            dy: &mut acc_dy,
                            dx: &mut acc_dx,
                            mask: &mut acc_m,
                            cols: &mut cols,
                        };
                        sample_gradients(&in_planes, shape, &taps, &gcol, local, want, out);
                        self.stats.sample_passes += 1;
                    }
                    if needs.weight {
                        let cols = &cols[..rows * width];
                        let beta = if first_weight_tile { T::ZERO } else { T::ONE };
                        match weight_out {
                            Some(w) => self.weight_gradient_into(seg, width, &gt, cols, w, beta),
                            None => {
                                let part = &mut wpart[seg.part_offset..][..cog * rows];
                                self.weight_gradient(rows, width, &gt, cols, part, beta);
                            }
                        }
                    }
                }
                first_weight_tile = false;
                if needs.offset || needs.mask {
                    self.write_sample_grads(
                        group,
                        tile,
                        width,
                        group_views,
                        &acc_dy,
                        &acc_dx,
                        &acc_m,
                    );
                }
            }
            if needs.input {
                if pixel_major {
                    self.store_input_grad_pixel_major(&gr_planes, group_views);
                } else {
                    self.store_input_grad(&gr_planes, group_views);
                }
            }
        }
        for buf in [in_planes, gr_planes, gcol, cols, gt] {
            scratch::give(buf);
        }
        (wpart, self.stats)
    }

    /// Copies the offset group's input planes of the group's images into the padded buffer
    /// (zero borders stay zero; a replicated layout's border is rewritten from the new rows).
    #[inline(never)]
    fn load_input(&mut self, group: &ImageGroup, planes: &mut [T]) {
        let Some(input) = &self.ops.input else {
            return;
        };
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        for (j, n) in group.images.clone().enumerate() {
            for c in 0..cpo {
                let plane = &mut planes[(c * self.plan.max_images + j) * l.len()..][..l.len()];
                let src = input.index_axis(ndarray::Axis(0), n);
                let src = src.index_axis(ndarray::Axis(0), self.og * cpo + c);
                if let Some(src) = src.as_slice() {
                    // A standard-layout plane: one slice copy per row (W1: the element-wise
                    // copy through ndarray iterators was 3-4% of the backward).
                    for (r, row) in src.chunks_exact(l.w.max(1)).enumerate().take(l.h) {
                        plane[l.index(r as isize, 0)..][..l.w].copy_from_slice(row);
                    }
                } else {
                    for (r, row) in src.outer_iter().enumerate() {
                        let dst = &mut plane[l.index(r as isize, 0)..][..l.w];
                        for (d, &s) in dst.iter_mut().zip(row.iter()) {
                            *d = s;
                        }
                    }
                }
                l.replicate_border(plane);
                self.stats.input_copies += 1;
            }
        }
    }

    /// [`Task::load_input`] into pixel-major planes: image `j`'s cell `i`, local channel `c`
    /// at `planes[(j * cells + i) * C_in/G_off + c]`.
    #[inline(never)]
    fn load_input_pixel_major(&mut self, group: &ImageGroup, planes: &mut [T]) {
        use crate::kernels::pixel_major::to_pixel_major;
        let Some(input) = &self.ops.input else {
            return;
        };
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        let channels = self.og * cpo..(self.og + 1) * cpo;
        for (j, n) in group.images.clone().enumerate() {
            let cells = &mut planes[j * l.len() * cpo..][..l.len() * cpo];
            let image = input.index_axis(ndarray::Axis(0), n);
            let image = image.slice(ndarray::s![channels.clone(), .., ..]);
            let hw = l.h * l.w;
            // Standard-layout f32 images row by row in 16 x 16 register transposes.
            let src = image
                .as_slice()
                .and_then(crate::kernels::same_type::<T, f32>);
            let copied = match (src, crate::kernels::same_type_mut::<T, f32>(cells)) {
                (Some(src), Some(dst)) if hw > 0 => {
                    for r in 0..l.h {
                        let row = &mut dst[l.index(r as isize, 0) * cpo..][..l.w * cpo];
                        to_pixel_major(&src[r * l.w..], cpo, hw, l.w, row);
                    }
                    true
                }
                _ => false,
            };
            if !copied {
                for ((c, r, x), &v) in image.indexed_iter() {
                    cells[l.index(r as isize, x as isize) * cpo + c] = v;
                }
            }
            if l.is_replicated() && l.h > 0 && l.w > 0 {
                // The border of `PlaneLayout::replicate_border`, a cell (all channels) at a time.
                let (h, w) = (l.h as isize, l.w as isize);
                for r in 0..h {
                    let from = l.index(r, w - 1) * cpo;
                    cells.copy_within(from..from + cpo, l.index(r, w) * cpo);
                }
                let (last, below) = (l.index(h - 1, 0) * cpo, l.index(h, 0) * cpo);
                cells.copy_within(last..last + (l.w + 1) * cpo, below);
            }
            self.stats.input_copies += cpo;
        }
    }

    /// [`Task::store_input_grad`] from pixel-major planes.
    #[inline(never)]
    fn store_input_grad_pixel_major(&self, planes: &[T], views: &mut [(usize, ImageOut<'_, T>)]) {
        use crate::kernels::pixel_major::from_pixel_major;
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        for (j, (_, out)) in views.iter_mut().enumerate() {
            let Some(view) = out.input.as_mut() else {
                continue;
            };
            let cells = &planes[j * l.len() * cpo..][..l.len() * cpo];
            let hw = l.h * l.w;
            if let Some(dst) = view.as_slice_mut() {
                for r in 0..l.h {
                    let row = &cells[l.index(r as isize, 0) * cpo..][..l.w * cpo];
                    from_pixel_major(row, cpo, l.w, &mut dst[r * l.w..], hw);
                }
                continue;
            }
            for ((c, r, x), d) in view.indexed_iter_mut() {
                *d = cells[l.index(r as isize, x as isize) * cpo + c];
            }
        }
    }

    /// The fused pixel-major pass of one segment (`f32` only; see [`pixel_major_candidate`]).
    fn fused_pass(
        &mut self,
        (input, grad): (&[T], &mut [T]),
        width: usize,
        columns: &TapColumns<T>,
        gcol: &[T],
        channels: Range<usize>,
        out: SampleOut<'_, T>,
    ) {
        let needs = self.needs;
        if needs.input {
            self.stats.scatters += 1;
        }
        if needs.input_planes() {
            self.stats.sample_passes += 1;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::channel_backward::{run, CellShape, Outputs};
            use crate::kernels::{same_type, same_type_mut};
            let SampleOut { dy, dx, mask, cols } = out;
            let f32s = (
                same_type::<T, f32>(input),
                same_type_mut::<T, f32>(grad),
                same_type::<T, f32>(gcol),
                same_type_mut::<T, f32>(dy),
                same_type_mut::<T, f32>(dx),
                same_type_mut::<T, f32>(mask),
                same_type_mut::<T, f32>(cols),
            );
            let (Some(input), Some(grad), Some(gcol), Some(dy), Some(dx), Some(mask), Some(cols)) =
                f32s
            else {
                debug_assert!(false, "the pixel-major pass is f32 only");
                return;
            };
            // SAFETY: T is f32 (checked by `same_type`), so the table has the same layout.
            let table = unsafe { &*(columns as *const TapColumns<T> as *const TapColumns<f32>) };
            let shape = CellShape {
                channels: self.g.c_per_offset_group(),
                pitch: self.layout.pitch(),
                tile: width,
                taps: self.g.taps(),
            };
            let want = Outputs {
                scatter: needs.input,
                offset: needs.offset,
                mask: needs.mask,
                cols: needs.weight,
            };
            let out = SampleOut { dy, dx, mask, cols };
            // SAFETY: AVX-512F was detected (`pixel_major`); the kernel checks every bound.
            unsafe { run(input, grad, shape, table, gcol, channels, want, out) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (input, grad, width, columns, gcol, channels, out);
    }

    /// Whether the tile tables are built straight into columns ([`Task::build_columns`]):
    /// pixel-major, torchvision, with offsets, and every base coordinate and plane cell far
    /// inside `i32`. Measured on W1 (1 thread): the row table build and its column copy were
    /// a third of the backward.
    fn direct_columns(&self) -> bool {
        use crate::kernels::taps_avx512::LIMIT;
        let g = self.g;
        // Saturating: absurd strides or dilations must not overflow (they fail the check).
        let reach = |out: usize, stride: usize, k: usize, dil: usize, pad: usize| {
            out.saturating_mul(stride)
                .saturating_add(k.saturating_mul(dil))
                .saturating_add(pad)
        };
        let reach_y = reach(g.h_out, g.stride_h, g.kh, g.dil_h, g.pad_top);
        let reach_x = reach(g.w_out, g.stride_w, g.kw, g.dil_w, g.pad_left);
        self.pixel_major
            && self.ops.offset.is_some()
            && self.ops.convention == Convention::Torchvision
            && reach_y < LIMIT
            && reach_x < LIMIT
            && (self.plan.max_images + 1).saturating_mul(self.layout.len()) < LIMIT
    }

    /// The tile's table `[k][tile column]` built straight into `columns` (see
    /// [`crate::kernels::taps_avx512`]); `bases` is scratch for the pixels' base coordinates.
    #[inline(never)]
    fn build_columns(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        columns: &mut TapColumns<T>,
        bases: &mut (Vec<i32>, Vec<i32>),
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::taps_avx512::{fill_run, Run};
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
                    // In range: checked by `direct_columns`.
                    base_y.push((y * g.stride_h) as i32 - g.pad_top as i32);
                    base_x.push((x * g.stride_w) as i32 - g.pad_left as i32);
                    x += 1;
                    if x == g.w_out {
                        (y, x) = (y + 1, 0);
                    }
                }
            }
            debug_assert_eq!(base_y.len(), width);
            let f32s = |s: &[T]| {
                debug_assert!(std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>());
                // SAFETY: direct columns are used only when T is f32 (pixel-major only).
                unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) }
            };
            // SAFETY: as above, TapColumns<T> is TapColumns<f32>.
            let cols = unsafe { &mut *(columns as *mut TapColumns<T> as *mut TapColumns<f32>) };
            cols.resize(k_taps * width);
            let Some(off) = self.ops.offset.map(f32s) else {
                debug_assert!(false, "direct columns need offsets");
                return;
            };
            let mask = self.ops.mask.map(f32s);
            let oc = 2 * g.offset_groups * k_taps;
            let mc = g.offset_groups * k_taps;
            for k in 0..k_taps {
                let (i, j) = (k / g.kw, k % g.kw);
                let ch = self.og * k_taps + k;
                for pc in tile {
                    let (n, px) = (pc.image, pc.pixels.clone());
                    let cols_of = pc.col0..pc.col0 + px.len();
                    let dy0 = (n * oc + 2 * ch) * hw;
                    let run = Run {
                        at: k * width + pc.col0,
                        base_y: &base_y[cols_of.clone()],
                        base_x: &base_x[cols_of],
                        tap_y: (i * g.dil_h) as i32,
                        tap_x: (j * g.dil_w) as i32,
                        dy: &off[dy0 + px.start..dy0 + px.end],
                        dx: &off[dy0 + hw + px.start..dy0 + hw + px.end],
                        m: mask.map(|m| &m[(n * mc + ch) * hw + px.start..][..px.len()]),
                        plane0: (n - group.images.start) * self.layout.len(),
                    };
                    // SAFETY: AVX-512F was detected (pixel-major only).
                    unsafe { fill_run(cols, self.layout, &run) };
                }
            }
            cols.finish();
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (group, tile, width, columns, bases);
    }

    /// The sampling table `[k][tile column]` of the tile, under the problem's convention.
    #[inline(never)]
    fn build_taps(&self, group: &ImageGroup, tile: &[Piece], width: usize, taps: &mut Vec<Tap<T>>) {
        if self.ops.offset.is_none()
            && self.ops.mask.is_none()
            && self.ops.convention == Convention::Torchvision
        {
            return self.build_taps_dense(group, tile, width, taps);
        }
        // One monomorphised build per convention: torchvision's is the code it always was.
        match self.ops.convention {
            Convention::Torchvision => {
                self.build_taps_for::<TorchvisionRule>(group, tile, width, taps)
            }
            Convention::Mmcv => self.build_taps_for::<MmcvRule>(group, tile, width, taps),
            Convention::DcnV1 => self.build_taps_for::<DcnV1Rule>(group, tile, width, taps),
        }
    }

    /// The dense convolution's table (zero offsets, unit mask) by integer arithmetic alone.
    /// Measured on W1 dense (1 thread): the general build was a quarter of forward + backward.
    fn build_taps_dense(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        taps: &mut Vec<Tap<T>>,
    ) {
        let g = self.g;
        let plane_len = self.layout.len();
        taps.clear();
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
                taps.extend(pc.pixels.clone().map(|_| {
                    let by = (y * g.stride_h) as isize + ty;
                    let bx = (x * g.stride_w) as isize + tx;
                    x += 1;
                    if x == g.w_out {
                        (y, x) = (y + 1, 0);
                    }
                    Tap::dense(self.layout, plane0, by, bx)
                }));
            }
        }
        debug_assert_eq!(taps.len(), g.taps() * width);
    }

    #[inline(always)]
    fn build_taps_for<R: Rule>(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        taps: &mut Vec<Tap<T>>,
    ) {
        use crate::kernels::lanes::{isa, Isa};
        // Compiled for the best instruction set, `floor` becomes one instruction instead of a
        // library call (W1: the table build was a quarter of the backward).
        match isa() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 and FMA (or AVX-512, a superset here) were detected.
            Isa::Avx2 | Isa::Avx512 => unsafe {
                self.build_taps_avx2::<R>(group, tile, width, taps)
            },
            _ => self.build_taps_body::<R>(group, tile, width, taps),
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn build_taps_avx2<R: Rule>(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        taps: &mut Vec<Tap<T>>,
    ) {
        self.build_taps_body::<R>(group, tile, width, taps)
    }

    #[inline(always)]
    fn build_taps_body<R: Rule>(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        taps: &mut Vec<Tap<T>>,
    ) {
        let g = self.g;
        let k_taps = g.taps();
        let hw = g.out_pixels();
        let plane_len = self.layout.len();
        taps.clear();
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
                    let m = self.ops.mask.map_or(T::ONE, |m| m[(n * mc + ch) * hw + p]);
                    taps.push(Tap::with_rule::<R>(
                        self.layout,
                        plane0,
                        (by, dy),
                        (bx, dx),
                        m,
                    ));
                }
            }
        }
        debug_assert_eq!(taps.len(), k_taps * width);
    }

    /// `gt[o, col] = grad_out[n, conv_group * C_out/groups + o, p]` for the tile's pixels.
    #[inline(never)]
    fn pack_grad_out(&self, conv_group: usize, tile: &[Piece], width: usize, gt: &mut [T]) {
        let g = self.g;
        let hw = g.out_pixels();
        let cog = g.c_out_per_group();
        for o in 0..cog {
            let row = &mut gt[o * width..][..width];
            for pc in tile {
                let src = (pc.image * g.c_out + conv_group * cog + o) * hw;
                let dst = &mut row[pc.col0..][..pc.pixels.len()];
                dst.copy_from_slice(&self.ops.grad_out[src + pc.pixels.start..src + pc.pixels.end]);
            }
        }
    }

    /// `gcol[(c - c_lo) K + k, col] = sum_o weight[group o, c', k] * gt[o, col]`.
    fn column_gradient(
        &mut self,
        si: usize,
        seg: &Segment,
        width: usize,
        gt: &[T],
        gcol: &mut [T],
    ) {
        let g = self.g;
        let Some(weight) = self.ops.weight else {
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
            let blocks = &per_group[self.og][si];
            return self.column_gradient_tap_major(rows, width, gt, blocks, gcol);
        }
        #[cfg(target_arch = "x86_64")]
        if let Weights::Packed(per_group) = self.weights {
            let packed = &per_group[self.og];
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
    fn column_gradient_tap_major(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        blocks: &[crate::kernels::sgemm::PackedB],
        gcol: &mut [T],
    ) {
        use crate::kernels::sgemm::{multiply_packed, Init, PackedA};
        use crate::kernels::{same_type, same_type_mut};
        let cog = self.g.c_out_per_group();
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
    fn weight_gradient_tap_major(
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
        let cog = self.g.c_out_per_group();
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
    fn weight_gradient(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        part: &mut [T],
        beta: T,
    ) {
        let cog = self.g.c_out_per_group();
        debug_assert!(gt.len() >= cog * width && cols.len() >= rows * width);
        debug_assert!(part.len() >= cog * rows);
        #[cfg(target_arch = "x86_64")]
        if self.pixel_major {
            return self.weight_gradient_tap_major(rows, width, gt, cols, part, beta);
        }
        // SAFETY: part is cog x rows row-major, exclusive (checked above).
        if unsafe { self.weight_gemm_avx512(rows, width, gt, cols, part.as_mut_ptr(), rows, beta) }
        {
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
    #[allow(clippy::too_many_arguments)]
    unsafe fn weight_gemm_avx512(
        &mut self,
        rows: usize,
        width: usize,
        gt: &[T],
        cols: &[T],
        c: *mut T,
        ldc: usize,
        beta: T,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(packed) = self.packed_gt.as_mut() {
            use crate::kernels::sgemm::{multiply, Init, MatB};
            let cog = self.g.c_out_per_group();
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
    fn weight_gradient_into(
        &mut self,
        seg: &Segment,
        width: usize,
        gt: &[T],
        cols: &[T],
        out: WeightOut<T>,
        beta: T,
    ) {
        let g = self.g;
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
        if unsafe { self.weight_gemm_avx512(rows, width, gt, cols, out.ptr.add(c0), cink, beta) } {
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

    /// Writes the tile's offset and mask gradients into the owned views.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn write_sample_grads(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        views: &mut [(usize, ImageOut<'_, T>)],
        dy: &[T],
        dx: &[T],
        dm: &[T],
    ) {
        let g = self.g;
        // Copies `src` into channel `ch` of `view` at pixels `pixels` (row-major), as one slice
        // copy when the channel is contiguous.
        let put = |view: &mut ArrayViewMut3<'_, T>, ch: usize, pixels: &Range<usize>, src: &[T]| {
            let mut plane = view.index_axis_mut(ndarray::Axis(0), ch);
            if let Some(dst) = plane.as_slice_mut() {
                dst[pixels.clone()].copy_from_slice(src);
            } else {
                for (p, &v) in pixels.clone().zip(src) {
                    plane[[p / g.w_out, p % g.w_out]] = v;
                }
            }
        };
        for pc in tile {
            let out = &mut views[pc.image - group.images.start].1;
            let n = pc.pixels.len();
            for k in 0..g.taps() {
                let at = k * width + pc.col0;
                if let Some(o) = out.offset.as_mut() {
                    put(o, 2 * k, &pc.pixels, &dy[at..at + n]);
                    put(o, 2 * k + 1, &pc.pixels, &dx[at..at + n]);
                }
                if let Some(m) = out.mask.as_mut() {
                    put(m, k, &pc.pixels, &dm[at..at + n]);
                }
            }
        }
    }

    /// Copies the interiors of the grad_input planes into the owned views.
    #[inline(never)]
    fn store_input_grad(&self, planes: &[T], views: &mut [(usize, ImageOut<'_, T>)]) {
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        for (j, (_, out)) in views.iter_mut().enumerate() {
            let Some(view) = out.input.as_mut() else {
                continue;
            };
            for c in 0..cpo {
                let plane = &planes[(c * self.plan.max_images + j) * l.len()..][..l.len()];
                let mut dst = view.index_axis_mut(ndarray::Axis(0), c);
                if let Some(dst) = dst.as_slice_mut() {
                    for (r, row) in dst.chunks_exact_mut(l.w.max(1)).enumerate().take(l.h) {
                        row.copy_from_slice(&plane[l.index(r as isize, 0)..][..l.w]);
                    }
                    continue;
                }
                for (r, mut row) in dst.outer_iter_mut().enumerate() {
                    let src = &plane[l.index(r as isize, 0)..][..l.w];
                    for (d, &s) in row.iter_mut().zip(src) {
                        *d = s;
                    }
                }
            }
        }
    }
}
