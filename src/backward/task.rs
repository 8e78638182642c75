//! One backward task: a (slot, offset group) pair walking its slot's image groups tile by
//! tile with its own scratch. Its stages live beside it: the sampling tables
//! ([`super::tables`]), the GEMMs ([`super::gemms`]) and the copies in and out of its planes
//! ([`super::planes`]).
//!
//! **Two layouts.** A deformable problem runs *pixel-major* (see `driver::runs_pixel_major`):
//! input and grad_input planes are `[cell][channel]`, `gcol` and `cols` are
//! `[pixel][k][channel]`, the GEMMs are turned around to produce and consume that orientation
//! (`weight` permuted tap-major and packed once per call), and one fused pass of
//! [`crate::kernels::channel_backward`] does col2im and the offset, mask and column outputs a
//! vector of channels at a time. The dense convolution runs *channel-major*: planes
//! `[channel][cell]`, `gcol`, `cols` as below, and [`crate::kernels::dense_backward`]'s
//! per-channel copies over a table of one cell per sample.
//!
//! **Per tile** (for each segment = offset group ∩ conv group, channels ascending; shown
//! channel-major):
//! ```text
//! table[k, p]          = sampling of (offset group, tap, pixel)        (once per tile)
//! gt[o, p]             = grad_out[n, group(o), p]                      (packed copy)
//! gcol[c', k, p]       = sum_o weight[o, c', k] * gt[o, p]             (GEMM, if input/offset/mask)
//! grad_input planes   += scatter(gcol * m, corner weights)            (col2im)
//! grad_offset, grad_mask, cols = m * B                                 (fused with col2im)
//! wpart[o, c', k]     += sum_p gt[o, p] * cols[c', k, p]               (GEMM, if weight)
//! ```
//!
//! (`grad_weight` GEMMs overwrite on a task's first tile, `beta = 0`, and accumulate after.)

use std::ops::Range;

use super::gemms::Gemms;
use super::operands::{ImageOut, Needs, Operands, Scope, Stats, WeightOut};
use super::plan::{segments, Plan, Segment};
use super::planes::SampleGrads;
use super::weights::Weights;
use crate::float::Float;
use crate::geometry::Geometry;
use crate::kernels::channel_backward::SampleOut;
use crate::kernels::columns::TapColumns;
use crate::kernels::dense_backward::{self, DenseTile};
use crate::kernels::taps::PlaneLayout;
use crate::kernels::tile_table::Bases;
use crate::scratch;

/// The scratch and fixed facts of one (slot, offset group) task.
pub(super) struct Task<'p, 'a, T: Float> {
    s: Scope<'p, 'a, T>,
    plan: &'p Plan,
    needs: Needs,
    segs: Vec<Segment>,
    gemms: Gemms<'p, 'a, T>,
    stats: Stats,
}

impl<'p, 'a, T: Float> Task<'p, 'a, T> {
    pub(super) fn new(
        g: &'p Geometry,
        plan: &'p Plan,
        ops: &'p Operands<'a, T>,
        needs: Needs,
        og: usize,
        weights: &'p Weights<T>,
    ) -> Self {
        let s = Scope {
            g,
            ops,
            og,
            layout: PlaneLayout::for_convention(ops.convention, g.h, g.w),
            max_images: plan.max_images,
            pixel_major: plan.pixel_major,
        };
        Task {
            s,
            plan,
            needs,
            segs: segments(g, og),
            gemms: Gemms::new(s, weights),
            stats: Stats::default(),
        }
    }

    /// Processes the groups `slot, slot + R, ...`; `views` are the outputs of their images in
    /// order. Returns the weight partial (empty unless wanted).
    pub(super) fn run(
        mut self,
        slot: usize,
        mut views: Vec<(usize, ImageOut<'_, T>)>,
        weight_out: Option<WeightOut<T>>,
    ) -> (Vec<T>, Stats) {
        let g = self.s.g;
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
        let planes_len = self.plan.max_images * cpo * self.s.layout.len();
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
        // Deformable: pixel-major planes and one fused pass per segment. Dense: channel-major
        // planes and a table of one cell per sample.
        let pixel_major = self.s.pixel_major;
        let mut cells: Vec<usize> = Vec::new();
        let mut columns = TapColumns::<T>::default();
        let mut bases = Bases::default();
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
                    self.stats.input_copies += self.s.load_input_pixel_major(group, &mut in_planes);
                } else {
                    self.stats.input_copies += self.s.load_input(group, &mut in_planes);
                }
            }
            if needs.input {
                gr_planes.fill(T::ZERO);
            }
            for tile in &group.tiles {
                let width: usize = tile.iter().map(|pc| pc.pixels.len()).sum();
                if pixel_major {
                    self.s.build_taps(group, tile, &mut columns, &mut bases);
                } else {
                    self.s.build_cells(group, tile, width, &mut cells);
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
                        self.gemms
                            .pack_grad_out(seg.conv_group, tile, width, &mut gt);
                        packed_group = seg.conv_group;
                    }
                    let local = seg.c_lo - self.s.og * cpo..seg.c_hi - self.s.og * cpo;
                    if needs.gcol() {
                        self.gemms
                            .column_gradient(si, seg, width, &gt, &mut gcol[..rows * width]);
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
                    } else {
                        // Dense: no offset or mask gradient.
                        let dense_tile = DenseTile {
                            channel_stride: self.plan.max_images * self.s.layout.len(),
                            tile: width,
                            taps: k_taps,
                            cells: &cells,
                        };
                        if needs.input {
                            let gcol = &gcol[..rows * width];
                            dense_backward::scatter(
                                &mut gr_planes,
                                dense_tile,
                                gcol,
                                local.clone(),
                            );
                            self.stats.scatters += 1;
                        }
                        if needs.weight {
                            let cols = &mut cols[..rows * width];
                            dense_backward::gather(&in_planes, dense_tile, cols, local);
                            self.stats.sample_passes += 1;
                        }
                    }
                    if needs.weight {
                        let cols = &cols[..rows * width];
                        let beta = if first_weight_tile { T::ZERO } else { T::ONE };
                        match weight_out {
                            Some(w) => self
                                .gemms
                                .weight_gradient_into(seg, width, &gt, cols, w, beta),
                            None => {
                                let part = &mut wpart[seg.part_offset..][..cog * rows];
                                self.gemms
                                    .weight_gradient(rows, width, &gt, cols, part, beta);
                            }
                        }
                    }
                }
                first_weight_tile = false;
                if needs.offset || needs.mask {
                    let grads = SampleGrads {
                        dy: &acc_dy,
                        dx: &acc_dx,
                        mask: &acc_m,
                    };
                    self.s
                        .write_sample_grads(group, tile, width, group_views, grads);
                }
            }
            if needs.input {
                if pixel_major {
                    self.s.store_input_grad_pixel_major(&gr_planes, group_views);
                } else {
                    self.s.store_input_grad(&gr_planes, group_views);
                }
            }
        }
        for buf in [in_planes, gr_planes, gcol, cols, gt] {
            scratch::give(buf);
        }
        (wpart, self.stats.add(self.gemms.stats))
    }

    /// The fused pixel-major pass of one segment (see `driver::runs_pixel_major`).
    fn fused_pass(
        &mut self,
        (input, grad): (&[T], &mut [T]),
        width: usize,
        columns: &TapColumns<T>,
        gcol: &[T],
        channels: Range<usize>,
        out: SampleOut<'_, T>,
    ) {
        use crate::kernels::channel_backward::{run, CellShape, Outputs, Planes};
        let needs = self.needs;
        if needs.input {
            self.stats.scatters += 1;
        }
        if needs.input_planes() {
            self.stats.sample_passes += 1;
        }
        let shape = CellShape {
            channels: self.s.g.c_per_offset_group(),
            pitch: self.s.layout.pitch(),
            tile: width,
            taps: self.s.g.taps(),
        };
        let want = Outputs {
            scatter: needs.input,
            offset: needs.offset,
            mask: needs.mask,
            cols: needs.weight,
        };
        run(
            Planes { input, grad },
            shape,
            columns,
            gcol,
            channels,
            want,
            out,
        );
    }
}
