//! Inner kernels of the fast path.
pub(crate) mod col2im;
pub(crate) mod coord;
pub(crate) mod taps;
