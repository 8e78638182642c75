//! Shape inference and every validation rule, in one place, with checked size arithmetic.
//!
//! Every public entry point (fast path, reference, CLI) builds a [`Geometry`] first; nothing
//! reads a tensor before its shape has been checked here.

use crate::error::{Error, Result};
use crate::params::ConvParams;

/// Largest number of bytes one tensor or workspace may take: `isize::MAX`, the most any Rust
/// allocation can hold.
const MAX_BYTES: usize = isize::MAX as usize;

/// The checked sizes of one convolution problem.
///
/// `H_out = (H + pad_top + pad_bottom - (dil_h * (kh - 1) + 1)) / stride_h + 1`, likewise `W_out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Images in the batch, `N` (may be 0).
    pub n: usize,
    /// Input channels, `C_in`.
    pub c_in: usize,
    /// Input rows, `H`.
    pub h: usize,
    /// Input columns, `W`.
    pub w: usize,
    /// Output channels, `C_out`.
    pub c_out: usize,
    /// Kernel rows.
    pub kh: usize,
    /// Kernel columns.
    pub kw: usize,
    /// Output rows.
    pub h_out: usize,
    /// Output columns.
    pub w_out: usize,
    /// Row stride.
    pub stride_h: usize,
    /// Column stride.
    pub stride_w: usize,
    /// Padding rows above the image (the shift of sample rows).
    pub pad_top: usize,
    /// Padding columns left of the image (the shift of sample columns).
    pub pad_left: usize,
    /// Row dilation.
    pub dil_h: usize,
    /// Column dilation.
    pub dil_w: usize,
    /// Convolution groups.
    pub groups: usize,
    /// Offset groups.
    pub offset_groups: usize,
}

fn shape_err(tensor: &'static str, axis: &'static str, expected: String, got: usize) -> Error {
    Error::Shape {
        tensor,
        axis,
        expected,
        got,
    }
}

fn param_err(name: &'static str, rule: String) -> Error {
    Error::Param { name, rule }
}

/// Product of `dims`, or `Err(TooLarge)` naming `what` if the product of its *non-zero*
/// extents overflows or, in `elem_bytes`-sized elements, would exceed `isize::MAX` bytes.
///
/// Zero extents are skipped in the bound because an empty array must still have a
/// representable shape: `ndarray` panics on `zeros([0, 1, 2^62, 2^62])`, so such a shape is
/// rejected here rather than allowed through as "0 elements".
pub fn checked_elements(what: &str, dims: &[usize], elem_bytes: usize) -> Result<usize> {
    let too_large = || Error::TooLarge {
        what: format!("{what} of shape {dims:?} ({elem_bytes}-byte elements)"),
    };
    let nonzero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    match nonzero.checked_mul(elem_bytes.max(1)) {
        Some(bytes) if bytes <= MAX_BYTES => Ok(if dims.contains(&0) { 0 } else { nonzero }),
        _ => Err(too_large()),
    }
}

impl Geometry {
    /// Infers and checks the problem from the input and weight shapes and the parameters.
    ///
    /// Rules: strides and dilations at least 1; `groups >= 1` divides `C_in` and `C_out`;
    /// `weight.shape[1] * groups == C_in`; `offset_groups >= 1` divides `C_in`; kernel and
    /// channel extents at least 1; `H_out, W_out >= 1`; every tensor's byte size fits `isize`.
    pub fn new(input: [usize; 4], weight: [usize; 4], params: &ConvParams) -> Result<Self> {
        let [n, c_in, h, w] = input;
        let [c_out, c_in_per_group, kh, kw] = weight;
        let (stride_h, stride_w) = params.stride;
        let (dil_h, dil_w) = params.dilation;
        let pad = params.padding;
        let groups = params.groups;
        let offset_groups = params.offset_groups;

        if stride_h == 0 || stride_w == 0 {
            return Err(param_err(
                "stride",
                format!("({stride_h}, {stride_w}) must be at least 1 on both axes"),
            ));
        }
        if dil_h == 0 || dil_w == 0 {
            return Err(param_err(
                "dilation",
                format!("({dil_h}, {dil_w}) must be at least 1 on both axes"),
            ));
        }
        if groups == 0 {
            return Err(param_err("groups", "0 must be at least 1".into()));
        }
        if offset_groups == 0 {
            return Err(param_err("offset_groups", "0 must be at least 1".into()));
        }
        if c_in == 0 {
            return Err(shape_err("input", "channels", "at least 1".into(), 0));
        }
        if c_out == 0 {
            return Err(shape_err(
                "weight",
                "output channels (axis 0)",
                "at least 1".into(),
                0,
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(shape_err(
                "weight",
                if kh == 0 {
                    "kernel rows (axis 2)"
                } else {
                    "kernel columns (axis 3)"
                },
                "at least 1".into(),
                0,
            ));
        }
        if c_in % groups != 0 {
            return Err(param_err(
                "groups",
                format!("{groups} must divide input channels ({c_in})"),
            ));
        }
        if c_out % groups != 0 {
            return Err(param_err(
                "groups",
                format!("{groups} must divide output channels ({c_out}, weight axis 0)"),
            ));
        }
        if c_in_per_group != c_in / groups {
            return Err(shape_err(
                "weight",
                "input channels per group (axis 1)",
                format!(
                    "input channels({c_in}) / groups({groups}) = {}",
                    c_in / groups
                ),
                c_in_per_group,
            ));
        }
        if c_in % offset_groups != 0 {
            return Err(param_err(
                "offset_groups",
                format!("{offset_groups} must divide input channels ({c_in})"),
            ));
        }

        let h_out = out_extent("rows", h, pad.top, pad.bottom, kh, dil_h, stride_h)?;
        let w_out = out_extent("columns", w, pad.left, pad.right, kw, dil_w, stride_w)?;

        let g = Geometry {
            n,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            h_out,
            w_out,
            stride_h,
            stride_w,
            pad_top: pad.top,
            pad_left: pad.left,
            dil_h,
            dil_w,
            groups,
            offset_groups,
        };
        // Every tensor of the problem must be addressable in f64 (the widest element type).
        checked_elements("input", &input, 8)?;
        checked_elements("weight", &weight, 8)?;
        checked_elements("output", &g.out_shape(), 8)?;
        checked_elements("offset", &g.offset_shape(), 8)?;
        Ok(g)
    }

    /// Kernel taps `K = kh * kw`.
    pub fn taps(&self) -> usize {
        self.kh * self.kw
    }
    /// Input channels per convolution group, `C_in / groups`.
    pub fn c_in_per_group(&self) -> usize {
        self.c_in / self.groups
    }
    /// Output channels per convolution group, `C_out / groups`.
    pub fn c_out_per_group(&self) -> usize {
        self.c_out / self.groups
    }
    /// Input channels per offset group, `C_in / G_off`.
    pub fn c_per_offset_group(&self) -> usize {
        self.c_in / self.offset_groups
    }
    /// Output pixels per image, `H_out * W_out`.
    pub fn out_pixels(&self) -> usize {
        self.h_out * self.w_out
    }
    /// `[N, C_in, H, W]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in, self.h, self.w]
    }
    /// `[C_out, C_in / groups, kh, kw]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.c_out, self.c_in_per_group(), self.kh, self.kw]
    }
    /// `[N, C_out, H_out, W_out]`, the shape of the output and of `grad_out`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.n, self.c_out, self.h_out, self.w_out]
    }
    /// `[N, 2 * G_off * kh * kw, H_out, W_out]`.
    pub fn offset_shape(&self) -> [usize; 4] {
        [
            self.n,
            2 * self.offset_groups * self.taps(),
            self.h_out,
            self.w_out,
        ]
    }
    /// `[N, G_off * kh * kw, H_out, W_out]`.
    pub fn mask_shape(&self) -> [usize; 4] {
        [
            self.n,
            self.offset_groups * self.taps(),
            self.h_out,
            self.w_out,
        ]
    }
    /// Multiply-adds of the forward pass times 2:
    /// `2 * N * C_out * (C_in / groups) * kh * kw * H_out * W_out`, as `f64`.
    pub fn forward_flops(&self) -> f64 {
        2.0 * self.n as f64
            * self.c_out as f64
            * self.c_in_per_group() as f64
            * self.taps() as f64
            * self.out_pixels() as f64
    }

    /// Checks the offset shape `[N, 2 * G_off * kh * kw, H_out, W_out]`.
    pub fn check_offset(&self, shape: &[usize]) -> Result<()> {
        let channels = format!(
            "2 * offset_groups({}) * kh({}) * kw({}) = {}",
            self.offset_groups,
            self.kh,
            self.kw,
            2 * self.offset_groups * self.taps()
        );
        self.check_per_pixel("offset", shape, &self.offset_shape(), channels)
    }

    /// Checks the mask shape `[N, G_off * kh * kw, H_out, W_out]`.
    pub fn check_mask(&self, shape: &[usize]) -> Result<()> {
        let channels = format!(
            "offset_groups({}) * kh({}) * kw({}) = {}",
            self.offset_groups,
            self.kh,
            self.kw,
            self.offset_groups * self.taps()
        );
        self.check_per_pixel("mask", shape, &self.mask_shape(), channels)
    }

    /// Checks a `grad_out` (or caller-provided output) shape `[N, C_out, H_out, W_out]`.
    pub fn check_out(&self, tensor: &'static str, shape: &[usize]) -> Result<()> {
        let channels = format!("output channels (weight axis 0) = {}", self.c_out);
        self.check_per_pixel(tensor, shape, &self.out_shape(), channels)
    }

    /// Checks a bias length `[C_out]`.
    pub fn check_bias(&self, len: usize) -> Result<()> {
        if len != self.c_out {
            return Err(shape_err(
                "bias",
                "elements",
                format!("output channels (weight axis 0) = {}", self.c_out),
                len,
            ));
        }
        Ok(())
    }

    /// Checks that a tensor named `tensor` has exactly `expected` shape (for caller-provided
    /// gradient outputs, whose shapes equal their operands').
    pub fn check_exact(
        &self,
        tensor: &'static str,
        shape: &[usize],
        expected: &[usize],
    ) -> Result<()> {
        const AXES: [&str; 4] = ["axis 0", "axis 1", "axis 2", "axis 3"];
        if shape.len() != expected.len() {
            return Err(shape_err(
                tensor,
                "dimensions",
                format!("{}", expected.len()),
                shape.len(),
            ));
        }
        for (axis, (&got, &want)) in shape.iter().zip(expected).enumerate() {
            if got != want {
                return Err(shape_err(
                    tensor,
                    AXES[axis.min(3)],
                    format!("{want} (shape {expected:?})"),
                    got,
                ));
            }
        }
        Ok(())
    }

    fn check_per_pixel(
        &self,
        tensor: &'static str,
        shape: &[usize],
        expected: &[usize; 4],
        channels: String,
    ) -> Result<()> {
        if shape.len() != 4 {
            return Err(shape_err(
                tensor,
                "dimensions",
                "4 (NCHW)".into(),
                shape.len(),
            ));
        }
        if shape[0] != expected[0] {
            return Err(shape_err(
                tensor,
                "images",
                format!("input's batch size = {}", self.n),
                shape[0],
            ));
        }
        if shape[1] != expected[1] {
            return Err(shape_err(tensor, "channels", channels, shape[1]));
        }
        if shape[2] != expected[2] {
            return Err(shape_err(
                tensor,
                "rows",
                format!("output rows H_out = {}", self.h_out),
                shape[2],
            ));
        }
        if shape[3] != expected[3] {
            return Err(shape_err(
                tensor,
                "columns",
                format!("output columns W_out = {}", self.w_out),
                shape[3],
            ));
        }
        Ok(())
    }
}

/// `(size + pad_begin + pad_end - (dil * (k - 1) + 1)) / stride + 1`, or an error when the
/// dilated kernel does not fit in the padded image (output extent would be below 1).
fn out_extent(
    axis: &'static str,
    size: usize,
    pad_begin: usize,
    pad_end: usize,
    k: usize,
    dil: usize,
    stride: usize,
) -> Result<usize> {
    let overflow = || Error::TooLarge {
        what: format!("padded input {axis} or dilated kernel extent"),
    };
    let padded = size
        .checked_add(pad_begin)
        .and_then(|s| s.checked_add(pad_end))
        .ok_or_else(overflow)?;
    let span = dil
        .checked_mul(k - 1)
        .and_then(|s| s.checked_add(1))
        .ok_or_else(overflow)?;
    if span > padded {
        return Err(param_err(
            "padding",
            format!(
                "the dilated kernel spans {span} {axis} (dilation {dil} * (kernel {k} - 1) + 1) but the padded input has only {padded} ({size} + {pad_begin} + {pad_end}); output {axis} would be < 1"
            ),
        ));
    }
    Ok((padded - span) / stride + 1)
}

/// `slots` each set to `value`, as initialised values (for buffers filled where they are
/// about to be used, instead of by a separate pass).
pub(crate) fn filled<T: Clone>(slots: &mut [std::mem::MaybeUninit<T>], value: T) -> &mut [T] {
    for s in slots.iter_mut() {
        s.write(value.clone());
    }
    // SAFETY: every slot was just initialised, and `MaybeUninit<T>` has `T`'s layout.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<T>(), slots.len()) }
}

/// A zero-filled tensor of `shape`, or `Err(TooLarge)` if the memory cannot be had: shapes
/// that pass validation can still be absurd (an empty batch with a `2^40`-channel weight
/// gradient), and an allocation failure must not abort the caller's process. The fill runs
/// in parallel on the current rayon pool (the callers are inside it, see [`crate::pool`]).
pub(crate) fn try_zeros<T: Clone + Send + Sync>(
    what: &str,
    shape: [usize; 4],
    zero: T,
) -> Result<ndarray::Array4<T>> {
    use rayon::prelude::*;
    /// Elements per parallel piece of the fill.
    const FILL_CHUNK: usize = 16 << 10;
    let len = checked_elements(what, &shape, std::mem::size_of::<T>())?;
    let mut data = Vec::new();
    data.try_reserve_exact(len).map_err(|_| Error::TooLarge {
        what: format!("{what} of shape {shape:?}: the allocation failed"),
    })?;
    data.spare_capacity_mut()[..len]
        .par_chunks_mut(FILL_CHUNK)
        .for_each(|chunk| {
            filled(chunk, zero.clone());
        });
    // SAFETY: the capacity is at least `len` (reserved above) and `filled` just initialised
    // each of the first `len` slots.
    unsafe { data.set_len(len) };
    ndarray::Array4::from_shape_vec(shape, data).map_err(|e| Error::TooLarge {
        what: format!("{what} of shape {shape:?}: {e}"),
    })
}
