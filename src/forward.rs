//! The fast forward pass: deformable ([`deform_conv2d`]) and dense ([`conv2d`]) convolution,
//! each also writing into a caller-provided output (`_into`).
//!
//! Work is split into tiles of consecutive flat output pixels `(n, y, x)` of the batch (see
//! `plan`; small images are batched into one tile), run in parallel on the caller's rayon
//! pool. Each tile, for each conv group, fills its column tile (dense im2col, or the
//! deformable bilinear gather, one block per image it meets) and multiplies it by the group's
//! weight, packed once per call, with the bias fused into the GEMM. For `f32` on AVX-512 the
//! deformable gather runs 16 channels at a time from pixel-major copies of the images, made a
//! bounded chunk of images at a time before that chunk's tiles run. Every output element is
//! written by exactly one tile, by arithmetic that depends only on the problem: results are
//! bitwise identical for any thread count, and image `n` of a batch equals the same image
//! computed alone.
//!
//! **Workspace** per concurrently running tile: a column tile of
//! `C_in/groups * kh * kw * len` elements (each pixel's row padded to whole cache lines where
//! the tile is pixel-major, see `kernels::TileLayout`) with `len` chosen to keep it near 1 MiB (at least 48
//! pixels; 192 pixels, at most 8 MiB, where 48 already overflow 1 MiB or where the GEMM
//! repacks the weight per tile: see `plan::forward`), a sampling table of
//! `kh * kw * len * (5 * size_of::<T>() + 4)` bytes for the deformable gather, the GEMM's
//! packed block (`256 * len` elements at most) and, for tiles spanning images, an output block
//! of `C_out/groups * len` elements; once per call, the packed weight (its own size, `f32` on
//! AVX-512) and, for the deformable gather, pixel-major copies of the images being worked on
//! on zero-bordered cells, `(H + 2) * (W + 2) * C_in` elements each (`W + 3` under DCN v1),
//! at most 16 MiB of them at once (or one image, if larger). None of it grows with the batch
//! size. Views that are not in standard (C-contiguous) layout are first copied to it, and an
//! `_into` output that is not in standard layout is computed into a temporary of its size and
//! then assigned.
//!
//! **Non-finite values** follow the reference: NaN in an offset gives a NaN sample (so NaN
//! outputs for its channels' outputs); infinite offsets sample outside the image (0); NaN or
//! infinite pixels, weights, masks or biases propagate through the sums as IEEE arithmetic does.

use ndarray::{Array4, ArrayView1, ArrayView4, ArrayViewMut4, CowArray, Ix1};
use rayon::prelude::*;

use crate::convention::Convention;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::{checked_elements, try_zeros, Geometry};
use crate::kernels::gather::SampleTable;
use crate::kernels::gemm::{GemmScratch, MatB, MatC, TileGemm};
use crate::kernels::pixel_major::PixelMajor;
use crate::kernels::taps::PlaneLayout;
use crate::kernels::{fill_columns, ImageOrder, Source, TileLayout, TileRows, TileSpan};
use crate::params::ConvParams;
use crate::plan::forward as plan;
use crate::row_major::{is_nhwc, standard};

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// Checks the operands of a deformable convolution.
fn deform_geometry<T: Float>(
    input: &ArrayView4<'_, T>,
    offset: &ArrayView4<'_, T>,
    mask: Option<&ArrayView4<'_, T>>,
    weight: &ArrayView4<'_, T>,
    bias: Option<&ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Geometry> {
    let geo = Geometry::new(dims(input.shape()), dims(weight.shape()), params)?;
    geo.check_offset(offset.shape())?;
    if let Some(m) = mask {
        geo.check_mask(m.shape())?;
    }
    if let Some(b) = bias {
        geo.check_bias(b.len())?;
    }
    // The gather addresses the padded cells of a plane with 32-bit indices.
    if !crate::kernels::gather::fits_cells(&geo) {
        return Err(Error::TooLarge {
            what: format!(
                "input plane of {} x {} pixels for the deformable gather (its padded cells, \
                 (H + 2) x (W + 3), at most 2^30 - 1)",
                geo.h, geo.w
            ),
        });
    }
    Ok(geo)
}

/// Checks the operands of a dense convolution.
fn dense_geometry<T: Float>(
    input: &ArrayView4<'_, T>,
    weight: &ArrayView4<'_, T>,
    bias: Option<&ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Geometry> {
    let geo = Geometry::new(dims(input.shape()), dims(weight.shape()), params)?;
    if let Some(b) = bias {
        geo.check_bias(b.len())?;
    }
    Ok(geo)
}

/// [`standard`] for a vector.
fn standard1<'a, T: Float>(view: ArrayView1<'a, T>) -> CowArray<'a, T, Ix1> {
    if view.is_standard_layout() {
        CowArray::from(view)
    } else {
        // `to_owned` would keep a negative stride; this copy is always row-major.
        CowArray::from(view.as_standard_layout().into_owned())
    }
}

fn slice_of<'a, T, D: ndarray::Dimension>(a: &'a CowArray<'_, T, D>) -> Result<&'a [T]> {
    a.as_slice().ok_or_else(|| Error::Param {
        name: "layout",
        rule: "internal: a standard-layout copy was not contiguous".into(),
    })
}

/// The output base pointer, shared by the tiles; each tile writes only its own elements.
#[derive(Clone, Copy)]
struct SharedOut<T>(*mut T);

// SAFETY: the pointer is only used to write disjoint elements (one tile each, see `plan`), and
// `T: Send` values may be written from any thread.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above; no element is read or written by two tasks.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

/// The operands of one forward call, as the caller's views (any strides).
#[derive(Clone, Copy)]
struct Operands<'a, T> {
    /// `[N, C_in, H, W]`.
    input: ArrayView4<'a, T>,
    /// `[N, 2 * G_off * K, H_out, W_out]`, or `None` for a dense convolution.
    offset: Option<ArrayView4<'a, T>>,
    /// `[N, G_off * K, H_out, W_out]`, or `None` for a unit mask.
    mask: Option<ArrayView4<'a, T>>,
    /// `[C_out, C_in/groups, kh, kw]`.
    weight: ArrayView4<'a, T>,
    /// `[C_out]`, or `None`.
    bias: Option<ArrayView1<'a, T>>,
}

impl<'a, T> Operands<'a, T> {
    /// The operands of a dense convolution: no offset, no mask.
    fn dense(
        input: ArrayView4<'a, T>,
        weight: ArrayView4<'a, T>,
        bias: Option<ArrayView1<'a, T>>,
    ) -> Self {
        Operands {
            input,
            offset: None,
            mask: None,
            weight,
            bias,
        }
    }
}

/// The shared driver: validated operands in, every element of `out` overwritten, inside the
/// rayon pool ([`crate::pool`]).
fn run<T: Float>(
    geo: &Geometry,
    convention: Convention,
    ops: Operands<'_, T>,
    out: ArrayViewMut4<'_, T>,
    gemm_only: bool,
) -> Result<()> {
    crate::pool::on_pool(|| run_in_pool(geo, convention, ops, out, gemm_only))
}

/// [`run`] into a new output, allocated and zeroed inside the pool as well.
fn run_new<T: Float>(
    geo: &Geometry,
    convention: Convention,
    ops: Operands<'_, T>,
) -> Result<Array4<T>> {
    crate::pool::on_pool(|| {
        let mut out = try_zeros("output", geo.out_shape(), T::ZERO)?;
        run_in_pool(geo, convention, ops, out.view_mut(), false)?;
        Ok(out)
    })
}

fn run_in_pool<T: Float>(
    geo: &Geometry,
    convention: Convention,
    ops: Operands<'_, T>,
    mut out: ArrayViewMut4<'_, T>,
    gemm_only: bool,
) -> Result<()> {
    geo.check_out("out", out.shape())?;
    if geo.n == 0 {
        return Ok(());
    }
    if !out.is_standard_layout() {
        let mut tmp = try_zeros("output", geo.out_shape(), T::ZERO)?;
        run_in_pool(geo, convention, ops, tmp.view_mut(), gemm_only)?;
        out.assign(&tmp);
        return Ok(());
    }
    let Operands {
        input,
        offset,
        mask,
        weight,
        bias,
    } = ops;
    // A channels_last input goes to the deformable gather's pixel-major copy as it is (its
    // rows are the copy's rows): W4's forward (Intel Xeon, AVX-512, 2 threads) took 64 ms
    // from channels_last through a row-major copy against 46 ms from NCHW.
    let input_order = if offset.is_some() && !input.is_standard_layout() && is_nhwc(&input) {
        ImageOrder::Nhwc
    } else {
        ImageOrder::Nchw
    };
    let nhwc_input = input.permuted_axes([0, 2, 3, 1]);
    let input = match input_order {
        ImageOrder::Nhwc => CowArray::from(nhwc_input),
        ImageOrder::Nchw => standard(nhwc_input.permuted_axes([0, 3, 1, 2])),
    };
    let offset = offset.map(standard);
    let mask = mask.map(standard);
    let weight = standard(weight);
    let bias = bias.map(standard1);
    let src = Source {
        geo,
        convention,
        input: slice_of(&input)?,
        input_order,
        offset: offset.as_ref().map(slice_of).transpose()?,
        mask: mask.as_ref().map(slice_of).transpose()?,
    };
    let weight = slice_of(&weight)?;
    let bias = bias.as_ref().map(slice_of).transpose()?;

    let elem = std::mem::size_of::<T>();
    let repacks = crate::kernels::gemm::repacks_weight::<T>();
    let (tile_len, tiles) = plan::forward_tiles(geo, elem, repacks);
    let depth = geo.c_in_per_group() * geo.taps();
    let rows = geo.c_out_per_group();
    let tile_layout = plan::tile_layout(geo, src.offset.is_some());
    // Column elements per pixel: a pixel-major tile's rows start on cache lines.
    let per_pixel = match tile_layout {
        TileLayout::ChannelMajor => depth,
        TileLayout::PixelMajor => depth.next_multiple_of(crate::scratch::line_elements::<T>()),
    };
    let cols_len = checked_elements("column tile", &[per_pixel, tile_len], elem)?;
    let staging_len = checked_elements("output tile", &[rows, tile_len], elem)?;
    let pixels = geo.out_pixels();
    let out_slice = out.as_slice_mut().ok_or_else(|| Error::Param {
        name: "out",
        rule: "internal: a standard-layout output was not contiguous".into(),
    })?;
    debug_assert_eq!(out_slice.len(), geo.n * geo.c_out * pixels);
    let shared = SharedOut(out_slice.as_mut_ptr());
    let engine = match tile_layout {
        TileLayout::ChannelMajor => TileGemm::new(weight, geo.groups, rows, depth),
        TileLayout::PixelMajor => TileGemm::segment_major(
            weight,
            geo.groups,
            rows,
            (geo.c_in_per_group(), geo.taps()),
            geo.c_per_offset_group(),
        ),
    };

    // The deformable gather reads the images pixel-major, copied a bounded chunk of images at
    // a time; tiles are cut at chunk boundaries, which changes no bits (the gather is per
    // element and the GEMMs' sums do not depend on the tiling;
    // `chunked_pixel_major_copies_change_no_bits` checks it on each cap). The dense im2col
    // runs the whole batch as one chunk.
    let channel_gather_input = Some(src.input).filter(|_| src.offset.is_some());
    let layout = PlaneLayout::for_convention(src.convention, geo.h, geo.w);
    let chunk_images = if channel_gather_input.is_some() {
        PixelMajor::<T>::images_per_chunk(geo.c_in, layout.len())
    } else {
        geo.n
    };
    let mut pixel_major = PixelMajor::default();
    for first_image in (0..geo.n).step_by(chunk_images) {
        let images_end = geo.n.min(first_image + chunk_images);
        let images = if let Some(input) = channel_gather_input {
            pixel_major.fill(
                input,
                src.input_order,
                first_image,
                images_end - first_image,
                geo.c_in,
                layout,
            )?;
            Some(&pixel_major)
        } else {
            None
        };
        let chunk_tiles = plan::clip(&tiles, first_image * pixels, images_end * pixels);
        chunk_tiles.par_iter().for_each(|tile| {
            let mut kept = TileScratch::take(cols_len);
            let scratch = &mut kept;
            let len = tile.len;
            // The tile's row stride, and where the block of a segment starting at column
            // `col` begins.
            let (ld, block_start): (usize, fn(usize, usize) -> usize) = match tile_layout {
                TileLayout::ChannelMajor => (len, |col, _| col),
                TileLayout::PixelMajor => (per_pixel, |col, ld| col * ld),
            };
            // From a cache line: the gathers store whole vectors and the GEMM packs them. Against
            // the allocation's own start (16 bytes into a page): fwd_probe, Intel Xeon AVX-512,
            // 2 threads, medians of 3 alternating rounds, W2 19.2 -> 18.1 ms, W4 47.0 -> 44.7,
            // R50-DCN-c3 26.2 -> 24.4, CenterNet-64 3.94 -> 3.71, BasicVSRpp-align 91.7 -> 90.4.
            let cols = crate::scratch::line_aligned(&mut scratch.cols, per_pixel * len);
            let single = tile.segments(pixels).nth(1).is_none();
            for group in 0..geo.groups {
                for seg in tile.segments(pixels).filter(|_| !gemm_only) {
                    let span = TileSpan {
                        image: seg.image,
                        group,
                        start: seg.start,
                        len: seg.len,
                    };
                    let out = TileRows {
                        cols: &mut cols[block_start(seg.column, ld)..],
                        ld,
                    };
                    fill_columns(&src, span, (tile_layout, out), &mut scratch.table, images);
                }
                let b = bias.map(|b| &b[group * rows..][..rows]);
                let (rs, cs) = match tile_layout {
                    TileLayout::ChannelMajor => (ld, 1),
                    TileLayout::PixelMajor => (1, ld),
                };
                let tile_cols = MatB {
                    data: &*cols,
                    rs,
                    cs,
                };
                if single {
                    let (image, start) = (tile.first / pixels, tile.first % pixels);
                    let first = (image * geo.c_out + group * rows) * pixels + start;
                    // Tiles partition the flat pixels and each group owns its output channels.
                    // SAFETY: rows `group * rows ..` of image `image`, pixels `start .. + len`
                    // (inside the image) at stride `pixels` lie in `out_slice`, this tile's alone.
                    unsafe {
                        debug_assert!(first + (rows - 1) * pixels + len <= out_slice_len(geo));
                        let dst = MatC {
                            ptr: shared.get().add(first),
                            rs: pixels,
                        };
                        engine.multiply_tile(group, tile_cols, len, b, dst, &mut scratch.gemm);
                    }
                    continue;
                }
                // The tile spans images: compute into the staging block, then copy each
                // image's part to its place.
                if scratch.staging.len() < staging_len {
                    scratch.staging.resize(staging_len, T::ZERO);
                }
                let staged = &mut scratch.staging[..rows * len];
                let dst = MatC {
                    ptr: staged.as_mut_ptr(),
                    rs: len,
                };
                // SAFETY: `staged` is rows x len, owned by this task, disjoint from cols/bias.
                unsafe { engine.multiply_tile(group, tile_cols, len, b, dst, &mut scratch.gemm) };
                for seg in tile.segments(pixels) {
                    for o in 0..rows {
                        let first = (seg.image * geo.c_out + group * rows + o) * pixels + seg.start;
                        let src_row = &staged[o * len + seg.column..][..seg.len];
                        // SAFETY: channel `group * rows + o` of image `seg.image`, pixels
                        // `seg.start .. + seg.len` belong to this tile alone (see above).
                        unsafe {
                            debug_assert!(first + seg.len <= out_slice_len(geo));
                            std::ptr::copy_nonoverlapping(
                                src_row.as_ptr(),
                                shared.get().add(first),
                                seg.len,
                            );
                        }
                    }
                }
            }
            kept.keep();
        });
    }
    Ok(())
}

fn out_slice_len(geo: &Geometry) -> usize {
    geo.n * geo.c_out * geo.out_pixels()
}

/// The reusable buffers of one worker: the column tile, the sampling table, the GEMM's packed
/// column block, and (for tiles spanning images) the staging block of the output.
struct TileScratch<T> {
    cols: Vec<T>,
    table: SampleTable<T>,
    gemm: GemmScratch<T>,
    staging: Vec<T>,
}

impl<T: Float> TileScratch<T> {
    /// This thread's scratch from its previous tile (of this or an earlier call), grown to
    /// `cols_len` column elements, or a new one. Fresh buffers on every call cost page faults:
    /// on W1 (min of 500 runs) the GEMM alone took 0.45 ms instead of 0.40 (1 thread), 0.35 instead
    /// of 0.18 (2 threads).
    fn take(cols_len: usize) -> Self {
        let mut s = crate::scratch::take_kept::<Self>().unwrap_or_else(|| TileScratch {
            cols: Vec::new(),
            table: SampleTable::default(),
            gemm: GemmScratch::default(),
            staging: Vec::new(),
        });
        // Stale values beyond what a tile writes are never read (every row of the tile is
        // filled before the GEMM reads it), so only new elements are zeroed.
        if s.cols.len() < cols_len {
            s.cols.resize(cols_len, T::ZERO);
        }
        s
    }

    /// Keeps this scratch on the current thread for its next tile (see [`crate::scratch`]).
    fn keep(self) {
        let elems = self.cols.capacity() + self.staging.capacity();
        crate::scratch::keep(self, elems * std::mem::size_of::<T>());
    }
}

/// Deformable convolution, forward (DCN v1 without `mask`, DCN v2 with), torchvision's
/// semantics:
///
/// ```text
/// out[n, o, y, x] = bias[o] + sum_{c' < C_in/groups} sum_{i, j} weight[o, c', i, j] * m * B(input[n, c], py, px)
/// py = y * stride_h - pad_top  + i * dil_h + offset[n, 2 (g K + k),     y, x]
/// px = x * stride_w - pad_left + j * dil_w + offset[n, 2 (g K + k) + 1, y, x]
/// ```
///
/// with `c = group(o) * C_in/groups + c'`, `g` the offset group of `c`, `k = i * kw + j`,
/// `m = mask[n, g K + k, y, x]` (1 without mask) and `B` bilinear sampling by
/// `params.convention` (see [`crate::Convention`]; by default torchvision's, zeros outside,
/// as in [`crate::reference`]). Shapes: input `[N, C_in, H, W]`, offset
/// `[N, 2 G_off kh kw, H_out, W_out]`, mask `[N, G_off kh kw, H_out, W_out]`, weight
/// `[C_out, C_in/groups, kh, kw]`, bias `[C_out]`; the result is `[N, C_out, H_out, W_out]`.
/// Errors name the operand and axis at fault; nothing panics.
///
/// ```
/// use deformconv::{deform_conv2d, ConvParams};
/// use ndarray::Array4;
/// // A 1x1 kernel with offset (0.5, 0) averages each pixel with the one below it.
/// let input = Array4::from_shape_vec((1, 1, 2, 1), vec![1.0f32, 3.0]).unwrap();
/// let weight = Array4::from_elem((1, 1, 1, 1), 1.0);
/// let mut offset = Array4::zeros((1, 2, 2, 1));
/// offset[[0, 0, 0, 0]] = 0.5;
/// let out = deform_conv2d(input.view(), offset.view(), None, weight.view(), None,
///                         &ConvParams::default()).unwrap();
/// assert_eq!(out[[0, 0, 0, 0]], 2.0);
/// assert_eq!(out[[0, 0, 1, 0]], 3.0);
/// ```
pub fn deform_conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let geo = deform_geometry(
        &input,
        &offset,
        mask.as_ref(),
        &weight,
        bias.as_ref(),
        params,
    )?;
    checked_elements("output", &geo.out_shape(), std::mem::size_of::<T>())?;
    let ops = Operands {
        input,
        offset: Some(offset),
        mask,
        weight,
        bias,
    };
    run_new(&geo, params.convention, ops)
}

/// [`deform_conv2d`] writing into `out` (`[N, C_out, H_out, W_out]`, any strides), every
/// element of which is overwritten; its previous contents are never read.
pub fn deform_conv2d_into<T: Float>(
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let geo = deform_geometry(
        &input,
        &offset,
        mask.as_ref(),
        &weight,
        bias.as_ref(),
        params,
    )?;
    let ops = Operands {
        input,
        offset: Some(offset),
        mask,
        weight,
        bias,
    };
    run(&geo, params.convention, ops, out, false)
}

/// Dense (strided, dilated, grouped) 2-D cross-correlation, forward:
///
/// ```text
/// out[n, o, y, x] = bias[o] + sum_{c', i, j} weight[o, c', i, j] * input[n, c, y*sh - pad_top + i*dh, x*sw - pad_left + j*dw]
/// ```
///
/// with pixels outside the image reading 0 and `c = group(o) * C_in/groups + c'`; equal to
/// [`deform_conv2d`] with zero offsets and no mask, computed by a plain im2col (no bilinear
/// work). `params.offset_groups` is validated as by [`crate::reference::conv2d`] but unused,
/// and so is `params.convention`: a zero offset samples an integer position, which reads its
/// own pixel in every convention (DCN v1's collapsed last row/column included).
pub fn conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let geo = dense_geometry(&input, &weight, bias.as_ref(), params)?;
    checked_elements("output", &geo.out_shape(), std::mem::size_of::<T>())?;
    let ops = Operands::dense(input, weight, bias);
    run_new(&geo, params.convention, ops)
}

/// [`conv2d`] writing into `out` (`[N, C_out, H_out, W_out]`, any strides), every element of
/// which is overwritten; its previous contents are never read.
pub fn conv2d_into<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    dense_into(input, weight, bias, params, out, false)
}

/// Our GEMMs alone, on exactly the tiles of [`conv2d_into`] with the im2col skipped (the column
/// tiles hold zeros): the "GEMM alone" of the benchmarks, so that the cost of the gathers is
/// their difference from the forward. Not part of the API.
#[doc(hidden)]
pub fn conv2d_gemm_only_into<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    dense_into(input, weight, bias, params, out, true)
}

fn dense_into<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
    gemm_only: bool,
) -> Result<()> {
    let geo = dense_geometry(&input, &weight, bias.as_ref(), params)?;
    let ops = Operands::dense(input, weight, bias);
    run(&geo, params.convention, ops, out, gemm_only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::pixel_major::tests::BUDGET_OVERRIDE;
    use std::sync::atomic::Ordering;

    /// Pixel-major copies made one or two images at a time (tiles cut at the chunk bounds),
    /// also when one image exceeds the budget, give the bits of the whole batch at once.
    #[test]
    fn chunked_pixel_major_copies_change_no_bits() {
        let (n, c, h, w, og) = (5, 24, 9, 8, 2);
        let params = ConvParams::default().padding(1, 1).offset_groups(og);
        let wave = |i: usize, f: f32| (i as f32 * f).sin() * 1.5;
        let input = Array4::from_shape_fn((n, c, h, w), |(a, b, y, x)| {
            wave(a * 977 + b * 89 + y * 13 + x, 0.37)
        });
        let offset = Array4::from_shape_fn((n, 2 * og * 9, h, w), |(a, b, y, x)| {
            2.0 * wave(a * 631 + b * 41 + y * 7 + x, 0.91)
        });
        let mask = Array4::from_shape_fn((n, og * 9, h, w), |(a, b, y, x)| {
            wave(a + b * 3 + y * 5 + x * 7, 0.11)
        });
        let weight = Array4::from_shape_fn((7, c, 3, 3), |(a, b, y, x)| {
            wave(a * 31 + b * 5 + y * 3 + x, 0.53)
        });
        let run = || {
            deform_conv2d(
                input.view(),
                offset.view(),
                Some(mask.view()),
                weight.view(),
                None,
                &params,
            )
            .unwrap()
        };
        let whole = run();
        let image_bytes = (h * w + 1) * c * 4;
        // One image, two images, and a budget below one image (one at a time) at a time.
        for budget in [image_bytes, 2 * image_bytes, 1] {
            BUDGET_OVERRIDE.store(budget, Ordering::Relaxed);
            let chunked = run();
            BUDGET_OVERRIDE.store(0, Ordering::Relaxed);
            assert!(
                chunked
                    .iter()
                    .zip(whole.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "budget {budget}"
            );
        }
    }
}
