//! Other frameworks' layouts to and from ours: weights and activations
//! (`deformconv::layout`), offsets and packed offsets + masks (`deformconv::offset_layout`),
//! for `deformconv.layout`.

use deformconv::layout::{Flip, WeightLayout};
use deformconv::offset_layout::{OffsetLayout, PackedLayout};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::args::{size, value_error};
use crate::operands::{arr4, by_dtype, out, Elem};

fn weight_layout(name: &str) -> PyResult<WeightLayout> {
    Ok(match name {
        "oihw" => WeightLayout::Oihw,
        "iohw" => WeightLayout::Iohw,
        "hwio" => WeightLayout::Hwio,
        "ohwi" => WeightLayout::Ohwi,
        other => {
            return Err(PyValueError::new_err(format!(
                "layout: unknown {other:?}; expected \"oihw\", \"iohw\", \"hwio\" or \"ohwi\""
            )))
        }
    })
}

fn offset_layout(name: &str) -> PyResult<OffsetLayout> {
    Ok(match name {
        "interleaved_yx" => OffsetLayout::InterleavedYx,
        "interleaved_xy" => OffsetLayout::InterleavedXy,
        "planar_yx" => OffsetLayout::PlanarYx,
        "blocks_xy" => OffsetLayout::BlocksXy,
        other => {
            return Err(PyValueError::new_err(format!(
                "offset layout: unknown {other:?}; expected \"interleaved_yx\", \"interleaved_xy\", \"planar_yx\" or \"blocks_xy\""
            )))
        }
    })
}

fn packed_layout(name: &str) -> PyResult<PackedLayout> {
    Ok(match name {
        "mmcv_chunks" => PackedLayout::MmcvChunks,
        "xy_mask_blocks" => PackedLayout::XyMaskBlocks,
        other => {
            return Err(PyValueError::new_err(format!(
                "packed layout: unknown {other:?}; expected \"mmcv_chunks\" or \"xy_mask_blocks\""
            )))
        }
    })
}

/// The operation of one layout conversion (`direction`: `to_oihw`, `from_oihw`,
/// `nhwc_to_nchw`, `nchw_to_nhwc`).
fn convert_weight<T: Elem>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    direction: &str,
    layout: &str,
    flip: bool,
) -> PyResult<Py<PyAny>> {
    let a = arr4::<T>("array", a)?;
    let v = a.as_array();
    let flip = if flip { Flip::Spatial } else { Flip::None };
    let r = match direction {
        "to_oihw" => deformconv::layout::to_oihw(v, weight_layout(layout)?, flip),
        "from_oihw" => deformconv::layout::from_oihw(v, weight_layout(layout)?, flip),
        "nhwc_to_nchw" => deformconv::layout::nhwc_to_nchw(v),
        "nchw_to_nhwc" => deformconv::layout::nchw_to_nhwc(v),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown conversion {other:?}"
            )))
        }
    };
    Ok(out(py, r))
}

/// Weight and activation layout conversions (`deformconv::layout`).
#[pyfunction]
#[pyo3(signature = (array, direction, layout, flip))]
pub(crate) fn convert_layout(
    py: Python<'_>,
    array: &Bound<'_, PyAny>,
    direction: &str,
    layout: &str,
    flip: bool,
) -> PyResult<Py<PyAny>> {
    by_dtype!(array, convert_weight(py, array, direction, layout, flip))
}

fn convert_off<T: Elem>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    from: &str,
    to: &str,
    groups: usize,
) -> PyResult<Py<PyAny>> {
    let a = arr4::<T>("offset", a)?;
    let r = deformconv::offset_layout::convert_offset(
        a.as_array(),
        offset_layout(from)?,
        offset_layout(to)?,
        groups,
    )
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// `deformconv::offset_layout::convert_offset`.
#[pyfunction]
#[pyo3(signature = (offset, source, target, offset_groups))]
pub(crate) fn convert_offset(
    py: Python<'_>,
    offset: &Bound<'_, PyAny>,
    source: &str,
    target: &str,
    offset_groups: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let groups = size("offset_groups", offset_groups)?;
    by_dtype!(offset, convert_off(py, offset, source, target, groups))
}

fn unpack<T: Elem>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    layout: &str,
    groups: usize,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let a = arr4::<T>("packed", a)?;
    let (o, m) =
        deformconv::offset_layout::unpack_offset_mask(a.as_array(), packed_layout(layout)?, groups)
            .map_err(value_error)?;
    Ok((out(py, o), out(py, m)))
}

/// `deformconv::offset_layout::unpack_offset_mask`: `(offset, mask)`.
#[pyfunction]
#[pyo3(signature = (packed, layout, offset_groups))]
pub(crate) fn unpack_offset_mask(
    py: Python<'_>,
    packed: &Bound<'_, PyAny>,
    layout: &str,
    offset_groups: &Bound<'_, PyAny>,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let groups = size("offset_groups", offset_groups)?;
    by_dtype!(packed, unpack(py, packed, layout, groups))
}

fn pack<T: Elem>(
    py: Python<'_>,
    o: &Bound<'_, PyAny>,
    m: &Bound<'_, PyAny>,
    layout: &str,
    groups: usize,
) -> PyResult<Py<PyAny>> {
    let (o, m) = (arr4::<T>("offset", o)?, arr4::<T>("mask", m)?);
    let r = deformconv::offset_layout::pack_offset_mask(
        o.as_array(),
        m.as_array(),
        packed_layout(layout)?,
        groups,
    )
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// `deformconv::offset_layout::pack_offset_mask`.
#[pyfunction]
#[pyo3(signature = (offset, mask, layout, offset_groups))]
pub(crate) fn pack_offset_mask(
    py: Python<'_>,
    offset: &Bound<'_, PyAny>,
    mask: &Bound<'_, PyAny>,
    layout: &str,
    offset_groups: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let groups = size("offset_groups", offset_groups)?;
    by_dtype!(offset, pack(py, offset, mask, layout, groups))
}
