//! `deformconv._native`: the Python extension of the `deformconv` crate.
//!
//! Thin wrappers only: the Python package (`python/deformconv/`) normalises arguments (int or
//! pair parameters, inferred groups, dtype and rank checks with readable messages) and calls
//! these functions with numpy arrays that are already `float32` or `float64` and of the right
//! rank. Each function borrows the arrays (any strides: the crate copies only what its layout
//! needs), releases the GIL, runs in the module's rayon pool (see `set_num_threads`) and
//! turns every `deformconv::Error` into a `ValueError` carrying the crate's message.

mod args;
mod compare;
mod layouts;
mod omp;
mod operands;
mod ops;
mod reference;
mod testing;
mod threads;

use pyo3::prelude::*;

/// The native extension of the `deformconv` Python package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    omp::set_home();
    m.add_function(wrap_pyfunction!(ops::deform_conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(ops::conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(ops::backward, m)?)?;
    m.add_function(wrap_pyfunction!(reference::ref_forward, m)?)?;
    m.add_function(wrap_pyfunction!(reference::ref_backward, m)?)?;
    m.add_function(wrap_pyfunction!(compare::compare, m)?)?;
    m.add_function(wrap_pyfunction!(testing::random_problem, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::convert_layout, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::convert_offset, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::unpack_offset_mask, m)?)?;
    m.add_function(wrap_pyfunction!(layouts::pack_offset_mask, m)?)?;
    m.add_function(wrap_pyfunction!(threads::set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads::get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads::release_cached_scratch, m)?)?;
    m.add_function(wrap_pyfunction!(threads::openmp_threads, m)?)?;
    m.add(
        "DEFAULT_BOUND_FACTOR",
        deformconv::compare::DEFAULT_BOUND_FACTOR,
    )?;
    m.add("EPS_F32", f64::from(f32::EPSILON) / 2.0)?;
    m.add("EPS_F64", f64::EPSILON / 2.0)?;
    Ok(())
}
