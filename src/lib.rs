//! # deformconv
//!
//! Deformable convolution (DCN v1: learned offsets; DCN v2: offsets and a modulation mask) and
//! dense, strided, dilated and grouped 2-D convolution on the CPU, forward and every backward
//! gradient, with the exact semantics of `torchvision.ops.deform_conv2d`.
//!
//! The crate has two jobs:
//! - a **fast CPU backend** (f32 and f64), deterministic whatever the thread count;
//! - an **oracle**: [`reference`](mod@reference) computes the same quantities with plain f64 loops straight
//!   from the formulas, to test this crate's fast path and other projects' kernels against.
//!
//! Tensors are NCHW `ndarray` views; see [`ConvParams`] for the parameters and [`Geometry`]
//! for the shapes every function expects. Weights, tensors and offsets laid out the way other
//! frameworks lay them out (Lasagne, Theano, TensorFlow, TensorFlow Lite, mmcv, MindSpore) are
//! converted by [`layout`] and [`offset_layout`]; [`nhwc`] runs the forward and every gradient
//! on NHWC tensors directly.
//!
//! ## Judging other implementations
//!
//! [`compare`] holds the per-element error bound of the design (§5) and a comparison report,
//! used by the `deformconv compare` tool (`docs/oracle-guide.md`).
//!
//! ## Features
//!
//! - `testing`: the `testing` module, proptest strategies generating valid problems and
//!   `assert_close` against the oracle under that bound, for property-testing other kernels.
#![deny(missing_docs)]

mod backward;
pub mod compare;
mod convention;
mod error;
mod float;
mod forward;
mod geometry;
mod kernels;
pub mod layout;
pub mod nhwc;
pub mod offset_layout;
mod params;
pub mod peak;
mod plan;
mod pool;
pub mod reference;
mod row_major;
mod sample;
mod scratch;
#[cfg(feature = "testing")]
pub mod testing;
pub mod workloads;

pub use backward::{
    conv2d_backward, conv2d_backward_into, conv2d_grad_input, conv2d_grad_input_into,
    conv2d_grad_weight, conv2d_grad_weight_into, deform_conv2d_backward,
    deform_conv2d_backward_into, deform_conv2d_grad_bias, deform_conv2d_grad_bias_into,
    deform_conv2d_grad_input, deform_conv2d_grad_input_into, deform_conv2d_grad_mask,
    deform_conv2d_grad_mask_into, deform_conv2d_grad_offset, deform_conv2d_grad_offset_into,
    deform_conv2d_grad_weight, deform_conv2d_grad_weight_into, release_cached_scratch, Grads,
    GradsMut, Want,
};
pub use convention::Convention;
pub use error::{Error, Result};
pub use float::Float;
#[doc(hidden)]
pub use forward::conv2d_gemm_only_into;
pub use forward::{conv2d, conv2d_into, deform_conv2d, deform_conv2d_into};
pub use geometry::{checked_elements, Geometry};
pub use params::{ConvParams, Padding};
pub use pool::current_num_threads;

/// The `ndarray` this crate's API takes and returns, so that a downstream crate need not pin
/// the same version by hand.
pub use ndarray;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
