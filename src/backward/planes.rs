//! A task's copies between the caller's tensors and its own buffers: input planes in
//! (padded, channel- or pixel-major), `grad_input` planes and the tile's offset and mask
//! gradients out.

use std::ops::Range;

use ndarray::{ArrayView3, ArrayViewMut3, Axis};

use super::operands::ImageOut;
use super::operands::Scope;
use super::plan::{ImageGroup, Piece};
use crate::float::Float;
use crate::kernels::taps::PlaneLayout;

/// A tile's offset and mask gradients, `[k][tile column]` each.
pub(super) struct SampleGrads<'b, T> {
    pub(super) dy: &'b [T],
    pub(super) dx: &'b [T],
    pub(super) mask: &'b [T],
}

impl<T: Float> Scope<'_, '_, T> {
    /// Copies the offset group's input planes of the group's images into the padded buffer
    /// (zero borders stay zero; a replicated layout's border is rewritten from the new rows);
    /// returns the planes copied.
    #[inline(never)]
    pub(super) fn load_input(&self, group: &ImageGroup, planes: &mut [T]) -> usize {
        let Some(input) = &self.ops.input else {
            return 0;
        };
        let mut copies = 0;
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        for (j, n) in group.images.clone().enumerate() {
            for c in 0..cpo {
                let plane = &mut planes[(c * self.max_images + j) * l.len()..][..l.len()];
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
                l.replicate_border(plane, 1);
                copies += 1;
            }
        }
        copies
    }

    /// [`Scope::load_input`] into pixel-major planes: image `j`'s cell `i`, local channel `c`
    /// at `planes[(j * cells + i) * C_in/G_off + c]`.
    #[inline(never)]
    pub(super) fn load_input_pixel_major(&self, group: &ImageGroup, planes: &mut [T]) -> usize {
        use crate::kernels::pixel_major::to_pixel_major;
        let Some(input) = &self.ops.input else {
            return 0;
        };
        let mut copies = 0;
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        let channels = self.og * cpo..(self.og + 1) * cpo;
        for (j, n) in group.images.clone().enumerate() {
            let cells = &mut planes[j * l.len() * cpo..][..l.len() * cpo];
            let image = input.index_axis(ndarray::Axis(0), n);
            let image = image.slice(ndarray::s![channels.clone(), .., ..]);
            let hw = l.h * l.w;
            // Standard-layout f32 images row by row in 16 x 16 register transposes.
            let src = image.as_slice().and_then(T::as_f32);
            let copied = match (src, T::as_f32_mut(cells)) {
                (Some(src), Some(dst)) if hw > 0 => {
                    for r in 0..l.h {
                        let row = &mut dst[l.index(r as isize, 0) * cpo..][..l.w * cpo];
                        to_pixel_major(&src[r * l.w..], cpo, hw, l.w, row);
                    }
                    true
                }
                _ => false,
            };
            if !copied && !copy_channels_last(&image, l, cpo, cells) {
                for ((c, r, x), &v) in image.indexed_iter() {
                    cells[l.index(r as isize, x as isize) * cpo + c] = v;
                }
            }
            l.replicate_border(cells, cpo);
            copies += cpo;
        }
        copies
    }

    /// Copies the interiors of the grad_input planes into the owned views.
    #[inline(never)]
    pub(super) fn store_input_grad(&self, planes: &[T], views: &mut [(usize, ImageOut<'_, T>)]) {
        let cpo = self.g.c_per_offset_group();
        let l = self.layout;
        for (j, (_, out)) in views.iter_mut().enumerate() {
            let Some(view) = out.input.as_mut() else {
                continue;
            };
            for c in 0..cpo {
                let plane = &planes[(c * self.max_images + j) * l.len()..][..l.len()];
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

    /// [`Scope::store_input_grad`] from pixel-major planes.
    #[inline(never)]
    pub(super) fn store_input_grad_pixel_major(
        &self,
        planes: &[T],
        views: &mut [(usize, ImageOut<'_, T>)],
    ) {
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

    /// Writes the tile's offset and mask gradients into the owned views.
    #[inline(never)]
    pub(super) fn write_sample_grads(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        views: &mut [(usize, ImageOut<'_, T>)],
        grads: SampleGrads<'_, T>,
    ) {
        let SampleGrads { dy, dx, mask: dm } = grads;
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
}

/// [`Scope::load_input_pixel_major`]'s copy of a channels_last image (`[C/G_off, H, W]` whose
/// channels are adjacent in memory): each pixel's channels are a slice already, and a whole
/// row is one when the image has one offset group. `false` (nothing written) for other
/// layouts (the caller then copies element by element). W4's full backward (Intel Xeon, AVX-512, 2 threads) took 179 ms with a
/// channels_last input through the element-wise copy against 148 ms from NCHW.
fn copy_channels_last<T: Float>(
    image: &ArrayView3<'_, T>,
    l: PlaneLayout,
    cpo: usize,
    cells: &mut [T],
) -> bool {
    let hwc = image.view().permuted_axes([1, 2, 0]);
    if cpo > 1 && hwc.stride_of(Axis(2)) != 1 {
        return false;
    }
    for (r, row) in hwc.outer_iter().enumerate() {
        let dst = &mut cells[l.index(r as isize, 0) * cpo..][..l.w * cpo];
        if let Some(src) = row.to_slice() {
            dst.copy_from_slice(src);
            continue;
        }
        for (pixel, src) in dst.chunks_exact_mut(cpo.max(1)).zip(row.outer_iter()) {
            // Stride 1 (checked above); otherwise the caller's copy overwrites every cell.
            let Some(src) = src.to_slice() else {
                return false;
            };
            pixel.copy_from_slice(src);
        }
    }
    true
}
