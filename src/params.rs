//! Convolution parameters: stride, padding, dilation, groups, offset groups and the sampling
//! convention.

use crate::convention::Convention;

/// Zero padding added around the image, in pixels, per side.
///
/// torchvision pads symmetrically (`top == bottom`, `left == right`); ONNX `DeformConv` allows
/// each side its own amount. Sample positions are measured from the top-left corner of the
/// padded image, so only `top` and `left` shift them; `bottom` and `right` only enlarge the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Padding {
    /// Rows of zeros above the image.
    pub top: usize,
    /// Rows of zeros below the image.
    pub bottom: usize,
    /// Columns of zeros left of the image.
    pub left: usize,
    /// Columns of zeros right of the image.
    pub right: usize,
}

impl Padding {
    /// `pad_h` rows above and below, `pad_w` columns left and right (torchvision's `padding`).
    pub const fn symmetric(pad_h: usize, pad_w: usize) -> Self {
        Padding {
            top: pad_h,
            bottom: pad_h,
            left: pad_w,
            right: pad_w,
        }
    }
}

/// Parameters of a (deformable) 2-D convolution, as in `torchvision.ops.deform_conv2d`.
///
/// The kernel size is not a parameter: it is the weight's last two extents. The defaults are
/// those of a plain 3x3-style convolution: stride 1, no padding, dilation 1, one group, one
/// offset group, torchvision's sampling convention.
///
/// ```
/// use deformconv::ConvParams;
/// let p = ConvParams::default().stride(2, 2).padding(1, 1).offset_groups(4);
/// assert_eq!(p.stride, (2, 2));
/// assert_eq!(p.padding.top, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvParams {
    /// Step between output pixels, `(stride_h, stride_w)`, each at least 1.
    pub stride: (usize, usize),
    /// Zero padding around the input.
    pub padding: Padding,
    /// Spacing between kernel taps, `(dil_h, dil_w)`, each at least 1.
    pub dilation: (usize, usize),
    /// Convolution groups: input channel `c` feeds only the `C_out / groups` outputs of group
    /// `c / (C_in / groups)`. Must divide `C_in` and `C_out`.
    pub groups: usize,
    /// Offset groups `G_off`: input channel `c` is sampled with the offsets (and mask) of
    /// group `c / (C_in / G_off)`. Must divide `C_in` (checked by every function, dense
    /// `conv2d` included, which does not otherwise use it).
    pub offset_groups: usize,
    /// Border rule of the bilinear sampling and its gradients (default
    /// [`Convention::Torchvision`]). Ignored by dense `conv2d`, which samples no fractions.
    pub convention: Convention,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            stride: (1, 1),
            padding: Padding::default(),
            dilation: (1, 1),
            groups: 1,
            offset_groups: 1,
            convention: Convention::Torchvision,
        }
    }
}

impl ConvParams {
    /// Sets the stride `(stride_h, stride_w)`.
    pub const fn stride(mut self, stride_h: usize, stride_w: usize) -> Self {
        self.stride = (stride_h, stride_w);
        self
    }
    /// Sets symmetric padding, as torchvision's `padding=(pad_h, pad_w)`.
    pub const fn padding(mut self, pad_h: usize, pad_w: usize) -> Self {
        self.padding = Padding::symmetric(pad_h, pad_w);
        self
    }
    /// Sets per-side padding (ONNX `pads = [top, left, bottom, right]` order is *not* used here:
    /// name the sides).
    pub const fn padding_sides(mut self, padding: Padding) -> Self {
        self.padding = padding;
        self
    }
    /// Sets the dilation `(dil_h, dil_w)`.
    pub const fn dilation(mut self, dil_h: usize, dil_w: usize) -> Self {
        self.dilation = (dil_h, dil_w);
        self
    }
    /// Sets the number of convolution groups.
    pub const fn groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }
    /// Sets the number of offset groups.
    pub const fn offset_groups(mut self, offset_groups: usize) -> Self {
        self.offset_groups = offset_groups;
        self
    }
    /// Sets the sampling convention (see [`Convention`] for each rule).
    pub const fn convention(mut self, convention: Convention) -> Self {
        self.convention = convention;
        self
    }
}
