//! Property-testing other kernels against the oracle (cargo feature `testing`).
//!
//! - [`problems`] / [`problems_with`]: proptest strategies generating **valid** deformable
//!   convolution problems ([`Problem`]): shapes, stride, symmetric and asymmetric padding,
//!   dilation, groups, offset groups, DCN v1 and v2, with and without bias. Offsets mix free
//!   values, exact integers, half-integers, samples placed exactly at `-1`, `0`, `H-1`, `H` (and
//!   just inside or beyond them) and far outside the image; masks include zeros, ones, negatives
//!   and values above 1. Shrinking acts on the shape only (the values come from a seed that does
//!   not shrink), so a failure shrinks to a small problem quickly. [`Limits`] narrows them
//!   (symmetric padding only, mask and bias presence, and [`Placement`]: where samples land).
//! - [`Problem::report`], [`assert_close`], and for a proptest body [`Problem::check`] /
//!   [`Problem::check_grads`] (owned arrays or a [`Grads`](crate::Grads), returning
//!   `TestCaseError`): compare a kernel's results with [`reference`](mod@crate::reference) as
//!   [`compare::Oracle`](crate::compare::Oracle) judges results computed in `T`: the
//!   per-element DESIGN §5 bound with positions within rounding, and the statistical check.
//!
//! # A downstream crate testing its own kernel
//!
//! ```
//! use deformconv::testing::{assert_close, problems, Output, Problem};
//! use proptest::prelude::*;
//!
//! /// The kernel under test (here this crate's fast path stands in for yours).
//! fn my_forward(p: &Problem<f32>) -> ndarray::Array4<f32> {
//!     let mask = p.mask.as_ref().map(|m| m.view());
//!     let bias = p.bias.as_ref().map(|b| b.view());
//!     let (x, off, w) = (p.input.view(), p.offset.view(), p.weight.view());
//!     deformconv::deform_conv2d(x, off, mask, w, bias, &p.params).unwrap()
//! }
//!
//! proptest! {
//!     #![proptest_config(ProptestConfig::with_cases(16))]
//!     // In your crate's `tests/`, put `#[test]` on the next line.
//!     fn forward_matches_the_oracle(p in problems::<f32>()) {
//!         assert_close(&p, Output::Out, my_forward(&p).view());
//!     }
//! }
//! # fn main() { forward_matches_the_oracle(); }
//! ```

// What is generated: the bounds (`limits`), the shapes (`shapes`), the values filling a shape
// (`random`); the complete problem and its exact results (`problem`); judging a kernel's
// results against them (`check`).
mod check;
mod limits;
mod problem;
mod random;
mod shapes;

pub use check::{assert_close, precision_of};
pub use limits::{Limits, Placement, Presence};
pub use problem::Problem;
pub use shapes::{problem_shapes, problems, problems_with, ProblemShape};

pub use crate::compare::{Options, Output, Precision, Report, TensorReport, Tolerance};
