//! How close is close: the per-element error bound of the design (§5) and a comparison report,
//! shared by the `deformconv compare` tool and [`testing`](crate#features) helpers.
//!
//! # The bound
//!
//! Every result element is a sum of products, `sum_t term_t`. Computed in a floating-point type
//! with unit round-off `eps` (`2^-24` for `f32`, `2^-53` for `f64`), any summation order stays
//! within (first order)
//!
//! ```text
//! |fast - exact| <= c * eps * (L * sum_t |term_t| + P)
//! ```
//!
//! where `L` counts the accumulations into the element plus 2 for the few roundings inside
//! each term (bilinear weights, the four-corner sum, mask and weight products), `c` is
//! [`DEFAULT_BOUND_FACTOR`] unless given, and `P` bounds what a rounding of the sample
//! position can change (below). This is DESIGN §5's `c * L * eps * sum |terms|` with those two
//! refinements. [`error_scales`] computes `L * sum |terms| + P` for every element of every
//! result, from the operands:
//!
//! | result        | terms                                         | `L`                                          |
//! |---------------|-----------------------------------------------|----------------------------------------------|
//! | `out`         | `weight * m * B(input)`, `bias`               | `C_in/groups * kh * kw` (+1 with bias) + 2   |
//! | `grad_input`  | `weight * grad_out * m * (corner weight)`     | `C_out/groups *` samples reading the pixel + 2 |
//! | `grad_offset` | `weight * grad_out * m * lx * v` (each corner)| `C_in/G_off * C_out/groups` + 2              |
//! | `grad_mask`   | `weight * grad_out * B(input)`                | `C_in/G_off * C_out/groups` + 2              |
//! | `grad_weight` | `grad_out * m * B(input)`                     | `N * H_out * W_out` + 2                      |
//! | `grad_bias`   | `grad_out`                                    | `N * H_out * W_out`                          |
//!
//! `sum |terms|` comes from the [`reference`](mod@crate::reference) oracle run on absolute values
//! (`|input|`, `|mask|`, `|weight|`, `|bias|`, `|grad_out|`, the offsets unchanged): bilinear
//! weights are non-negative, so `B(|input|) >= |B(input)|` term by term and the oracle's sum is
//! exactly `sum |terms|`. `grad_offset` is the one exception, because its coordinate derivative
//! takes *differences* of pixels: its scale is summed here directly, with
//! `|Wy| <= lx (|v11| + |v01|) + (1 - lx)(|v10| + |v00|)` (likewise `Wx`).
//!
//! `P`: most kernels (torchvision's CPU and CUDA ones among them) form the sample position
//! `py = y * stride - pad + i * dil + dy` in floating point, which moves it by up to
//! `eps * |py|`; a bilinear weight then moves by up to `eps * (|py| + |px|)`, which is not
//! small relative to `sum |terms|` when a sample gives a tiny weight to a large pixel (a
//! sample just inside the border, say). `P` is the sum over the terms of
//! `|weight| |grad_out| |m| (|py| + |px|) * (sum of the four corners' |v|)` (without
//! `grad_out` for `out`; for `grad_input` the corner sum is replaced by 1), computed by the
//! oracle on the same absolute operands with each sample moved to the centre of its cell,
//! where every corner weighs 1/4.
//!
//! Not covered: a position rounded across an integer changes `grad_offset`'s one-sided
//! derivative by a jump, not by `eps`; such elements can exceed the bound legitimately (the
//! report names them).

use std::fmt;

mod report;
mod scales;

pub use report::{compare_tensor, Criterion, Report, TensorReport, Tolerance, Worst};
pub use scales::{error_scales, Operands, Scales};

/// The constant `c` of the bound when none is given.
///
/// First-order error analysis gives `c = 1` for the worst case of each accumulation; 4 leaves
/// room for the products and the position rounding, which `L` and `P` count only once. On
/// every golden case and the generated problems, our f32 fast path stays below 0.5 of it.
pub const DEFAULT_BOUND_FACTOR: f64 = 4.0;

/// One result tensor, named as in the golden format (`tests/data/golden/README.md`).
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
