//! How close is close: the per-element error bound of the design (§5) and a comparison report,
//! shared by the `deformconv compare` tool and [`testing`](crate#features) helpers.
//!
//! # The bound
//!
//! Every result element is a sum of products, `sum_t term_t`. Computed in a floating-point type
//! with unit round-off `eps` (`2^-24` for `f32`, `2^-53` for `f64`), any summation order stays
//! within
//!
//! ```text
//! |fast - exact| <= c * L * eps * sum_t |term_t|
//! ```
//!
//! where `L` is the number of products accumulated into the element and `c` a small constant
//! for the few roundings inside each product (bilinear weights, mask, the four corners);
//! [`DEFAULT_BOUND_FACTOR`] by default. [`error_scales`] computes `L * sum_t |term_t|` for every
//! element of every result, from the operands:
//!
//! | result        | terms                                              | `L`                                   |
//! |---------------|----------------------------------------------------|---------------------------------------|
//! | `out`         | `weight * m * B(input)`, `bias`                    | `C_in/groups * kh * kw` (+1 with bias)|
//! | `grad_input`  | `weight * grad_out * m * (corner weight)`          | `C_out/groups *` samples touching the pixel |
//! | `grad_offset` | `weight * grad_out * m * lx * v` (each corner)     | `C_in/G_off * C_out/groups`           |
//! | `grad_mask`   | `weight * grad_out * B(input)`                     | `C_in/G_off * C_out/groups`           |
//! | `grad_weight` | `grad_out * m * B(input)`                          | `N * H_out * W_out`                   |
//! | `grad_bias`   | `grad_out`                                         | `N * H_out * W_out`                   |
//!
//! `sum |terms|` comes from the [`reference`](crate::reference) oracle run on absolute values
//! (`|input|`, `|mask|`, `|weight|`, `|bias|`, `|grad_out|`, the offsets unchanged): bilinear
//! weights are non-negative, so `B(|input|) >= |B(input)|` term by term and the oracle's sum is
//! exactly `sum |terms|`. `grad_offset` is the one exception, because its coordinate derivative
//! takes *differences* of pixels: its scale is summed here directly, with
//! `|Wy| <= lx (|v11| + |v01|) + (1 - lx)(|v10| + |v00|)` (likewise `Wx`).
//!
//! The bound assumes the fractional part of each sample position is exact (ours is: the offset
//! is split into integer and fraction before the base position is added). A kernel that forms
//! `py = y * stride - pad + i * dil + dy` in `f32` perturbs the bilinear weights by about
//! `|py| * eps`; raise `c` for large images if you compare such a kernel.

use std::fmt;

mod report;
mod scales;

pub use report::{compare_tensor, Criterion, Report, TensorReport, Tolerance, Worst};
pub use scales::{error_scales, Operands, Scales};

/// The constant `c` of the bound when none is given.
///
/// It covers the roundings inside one term (two to three for the bilinear weight, one each for
/// the pixel, mask and weight products, up to three for the four-corner sum) relative to the
/// `L` accumulations that dominate every realistic problem.
pub const DEFAULT_BOUND_FACTOR: f64 = 4.0;

/// One result tensor, named as in the golden format (`../shared/golden/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Output {
    /// The forward result, `[N, C_out, H_out, W_out]`.
    Out,
    /// Gradient with respect to the input, `[N, C_in, H, W]`.
    GradInput,
    /// Gradient with respect to the offsets, shaped like the offsets.
    GradOffset,
    /// Gradient with respect to the mask, shaped like the mask.
    GradMask,
    /// Gradient with respect to the weight, shaped like the weight.
    GradWeight,
    /// Gradient with respect to the bias, `[C_out]`.
    GradBias,
}

impl Output {
    /// Every result, in the order the tools report them.
    pub const ALL: [Output; 6] = [
        Output::Out,
        Output::GradInput,
        Output::GradOffset,
        Output::GradMask,
        Output::GradWeight,
        Output::GradBias,
    ];

    /// The array name in npz files: `out`, `grad_input`, `grad_offset`, `grad_mask`,
    /// `grad_weight`, `grad_bias`.
    pub const fn name(self) -> &'static str {
        match self {
            Output::Out => "out",
            Output::GradInput => "grad_input",
            Output::GradOffset => "grad_offset",
            Output::GradMask => "grad_mask",
            Output::GradWeight => "grad_weight",
            Output::GradBias => "grad_bias",
        }
    }

    /// The result called `name`, if any.
    pub fn from_name(name: &str) -> Option<Output> {
        Output::ALL.into_iter().find(|o| o.name() == name)
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
