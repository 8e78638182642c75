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
//! converted by [`layout`] and [`offset_layout`].
#![deny(missing_docs)]

mod convention;
mod error;
mod float;
mod forward;
mod geometry;
mod kernels;
pub mod layout;
pub mod offset_layout;
mod params;
mod plan;
pub mod reference;
#[allow(dead_code)] // parts are used only by the backward pass
mod sample;

pub use convention::Convention;
pub use error::{Error, Result};
pub use float::Float;
pub use forward::{conv2d, conv2d_into, deform_conv2d, deform_conv2d_into};
pub use geometry::{checked_elements, Geometry};
pub use params::{ConvParams, Padding};
