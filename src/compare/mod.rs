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
//! `eps * |py|`, and then the fractions `ly = py - floor(py)` and `1 - ly` (torchvision's
//! col2im: `1 - |py - corner|`), which round relative to 1, not to the weight: a weight near 0
//! (a position just below or above an integer) carries an absolute error of about `eps`. A
//! bilinear weight thus moves by up to `eps * (ey + ex)` with `ey = |py| + 1` (`|py|` only
//! where the precision cannot form `py` exactly, the 1 only where it cannot form the fractions
//! exactly, see [`error_scales_for`]), which is not
//! small relative to `sum |terms|` when a sample gives a tiny weight to a large pixel (a
//! sample just inside the border, or a `grad_input` element fed by tiny corner weights only).
//! `P` is the sum over the terms of
//! `|weight| |grad_out| |m| (ey + ex) * (sum of the four corners' |v|)` (without
//! `grad_out` for `out`; for `grad_input` the corner sum is replaced by 1), computed by the
//! oracle on the same absolute operands with each sample moved to the centre of its cell,
//! where every corner weighs 1/4.
//!
//! Not covered by `P`: a position rounded across an integer changes `grad_offset`'s one-sided
//! derivative (and, under mmcv and DCN v1, values at their window edges) by a jump, not by
//! `eps`. [`Oracle`] handles those samples: it accepts the result at either side (see its
//! docs), and reports how many elements needed it ([`TensorReport::accepted_by_rounding`]).
//!
//! # Precision profiles
//!
//! `eps` is the unit round-off of the [`Precision`] the kernel computes in: `2^-53` (f64),
//! `2^-24` (f32), `2^-11` (TF32 products with f32 accumulation, and f16), `2^-8` (bf16); see
//! [`Precision`] for the model of storage and accumulation.
//!
//! # The statistical check
//!
//! The bound is a worst case: it grows like `L` while the error of a correct kernel grows like
//! `sqrt(L)` (rounding errors of random sign), so on a large layer it cannot tell a correct f32
//! kernel from one that secretly multiplies in TF32 or accumulates in f16. Beside it, each
//! tensor gets the figure
//!
//! ```text
//! statistic = sqrt( mean over elements of (|actual - expected| / (eps * rms_scale))^2 )
//! rms_scale = sqrt(L * sum_t term_t^2 + P2)
//! ```
//!
//! with `L` as above, `sum term_t^2` computed like `sum |term_t|` on squared operands (an upper
//! bound of it: `B(v)^2 <= B(v^2)`), and `P2` the squared counterpart of `P`. A random-walk
//! accumulation of `L` terms with per-step errors of size `eps * |partial sum|` has error about
//! `eps * sqrt(L * sum terms^2)`; one rounding of each product to a lower precision `u'`
//! (TF32) adds about `u' * sqrt(sum terms^2)`, i.e. `u' / (eps * sqrt(L))` on this scale. The
//! check fails a tensor of at least [`STATISTICAL_MIN_ELEMENTS`] elements whose statistic
//! exceeds [`DEFAULT_STATISTICAL_LIMIT`] (calibrated in `docs/oracle-guide.md`), and a failed
//! check fails the overall verdict [`Report::passed`]; [`Report::bound_passed`] and
//! [`Report::statistical_passed`] give the two verdicts apart.

use std::fmt;

mod oracle;
mod precision;
mod report;
mod scales;

pub use oracle::{
    exact_result, exact_results, rounded_positions, Options, Oracle, RoundedPositions,
};
pub use precision::Precision;
pub use report::{
    compare_tensor, compare_tensor_within, Criterion, Expected, Report, TensorReport, Tolerance,
    Worst,
};
pub use scales::{error_scales, error_scales_for, Operands, Scales};

/// The statistical check's limit when none is given: the largest RMS of
/// `error / (eps * rms_scale)` a tensor may show (see the module docs; calibration in
/// `docs/oracle-guide.md`).
pub const DEFAULT_STATISTICAL_LIMIT: f64 = 1.0;

/// Tensors with fewer elements are not judged by the statistical check (an RMS over a handful
/// of elements says little).
pub const STATISTICAL_MIN_ELEMENTS: usize = 64;

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
