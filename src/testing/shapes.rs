//! Proptest strategies: valid [`ProblemShape`]s, and problems filled from them.

use proptest::prelude::*;

use super::{Limits, Problem};
use crate::float::Float;
use crate::params::{ConvParams, Padding};

/// The shape of a problem: tensor extents, parameters, which optional operands exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemShape {
    /// `[N, C_in, H, W]`.
    pub input: [usize; 4],
    /// `[C_out, C_in / groups, kh, kw]`.
    pub weight: [usize; 4],
    /// Stride, padding, dilation, groups, offset groups.
    pub params: ConvParams,
    /// Whether there is a mask (DCN v2).
    pub mask: bool,
    /// Whether there is a bias.
    pub bias: bool,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Rows (or columns) needed for one output: `max(1, dil * (k - 1) + 1 - pads)`.
fn min_extent(k: usize, dil: usize, pad_sum: usize) -> usize {
    dil.saturating_mul(k - 1)
        .saturating_add(1)
        .saturating_sub(pad_sum)
        .max(1)
}

/// Strategy for valid [`ProblemShape`]s within `limits`; shrinks every extent and parameter
/// towards its minimum, padding towards symmetric, mask and bias towards absent.
pub fn problem_shapes(limits: Limits) -> BoxedStrategy<ProblemShape> {
    let l = limits;
    let at_least_1 = |m: usize| 1..=m.max(1);
    let channels = (
        l.min_batch..=l.max_batch.max(l.min_batch),
        at_least_1(l.max_groups),
        at_least_1(l.max_offset_groups),
        at_least_1(l.max_input_multiple),
        at_least_1(l.max_output_per_group),
    );
    let kernel = (
        at_least_1(l.max_kernel),
        at_least_1(l.max_kernel),
        at_least_1(l.max_stride),
        at_least_1(l.max_stride),
        at_least_1(l.max_dilation),
        at_least_1(l.max_dilation),
    );
    let asymmetric = if l.symmetric_padding_only {
        Just(false).boxed()
    } else {
        any::<bool>().boxed()
    };
    let padding = (
        asymmetric,
        [
            0..=l.max_padding,
            0..=l.max_padding,
            0..=l.max_padding,
            0..=l.max_padding,
        ],
    );
    let rest = (
        0..=l.max_extra_size,
        0..=l.max_extra_size,
        l.mask.strategy(),
        l.bias.strategy(),
    );
    (channels, kernel, padding, rest)
        .prop_map(
            |(
                (n, groups, og, c_mult, o_mult),
                (kh, kw, sh, sw, dh, dw),
                (asymmetric, [top, bottom, left, right]),
                (extra_h, extra_w, mask, bias),
            )| {
                let padding = if asymmetric {
                    Padding {
                        top,
                        bottom,
                        left,
                        right,
                    }
                } else {
                    Padding::symmetric(top, left)
                };
                let c_in = (groups / gcd(groups, og))
                    .saturating_mul(og)
                    .saturating_mul(c_mult);
                let h = min_extent(kh, dh, padding.top.saturating_add(padding.bottom)) + extra_h;
                let w = min_extent(kw, dw, padding.left.saturating_add(padding.right)) + extra_w;
                let params = ConvParams::default()
                    .stride(sh, sw)
                    .padding_sides(padding)
                    .dilation(dh, dw)
                    .groups(groups)
                    .offset_groups(og);
                ProblemShape {
                    input: [n, c_in, h, w],
                    weight: [groups * o_mult, c_in / groups, kh, kw],
                    params,
                    mask,
                    bias,
                }
            },
        )
        .boxed()
}

/// Strategy for valid problems within the default [`Limits`].
pub fn problems<T: Float>() -> BoxedStrategy<Problem<T>> {
    problems_with(Limits::default())
}

/// Strategy for valid problems within `limits`: a [`ProblemShape`] (which shrinks) filled by
/// [`Problem::random`] from a seed (which does not).
pub fn problems_with<T: Float>(limits: Limits) -> BoxedStrategy<Problem<T>> {
    (problem_shapes(limits), any::<u64>().no_shrink())
        .prop_filter_map("problem shape must be valid", move |(shape, seed)| {
            Problem::random_placed(&shape, seed, limits.placement).ok()
        })
        .boxed()
}
