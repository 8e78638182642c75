//! The one support module of the integration tests: one random generator ([`Rng`]), one
//! problem generator ([`Case`], [`cases`], [`Problem`]), the golden cases, and the crate's
//! published error bound ([`Bound`]).
#![allow(dead_code)]

mod bound;
mod golden;
mod problems;
mod rng;

// Each test uses a part.
#[allow(unused_imports)]
pub use {bound::*, golden::*, problems::*, rng::*};
