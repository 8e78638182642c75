//! The non-array arguments as Python passes them, converted with messages that name them: the
//! convolution parameters (`stride=2**70` says `stride: 1180591620717411303424 is too large`,
//! not which tuple field failed), the gradients a backward `needs`, counts; and the crate's
//! errors as Python's.
//!
//! The Python package (`deformconv/_args.py`) checks and normalises the user's arguments first,
//! with the same wording; these checks are what a direct call of `deformconv._native` (or a
//! value the Python layer passes through) meets.

use deformconv::{ConvParams, Convention, Padding, Want};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString, PyTuple};

/// The crate's error as a Python `ValueError` with the crate's own message.
pub(crate) fn value_error(e: deformconv::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `v` as Python's messages show a value they refuse: its type's name and its repr (`str 'a'`).
fn described(v: &Bound<'_, PyAny>) -> String {
    let type_name = v.get_type().name().map(|n| n.to_string());
    let repr = v.repr().map(|r| r.to_string());
    format!(
        "{} {}",
        type_name.as_deref().unwrap_or("?"),
        repr.as_deref().unwrap_or("?")
    )
}

/// `v` as a count or extent called `name` in messages: an int (a Python int or anything with
/// `__index__`, such as a numpy integer; not a bool), at least 0.
pub(crate) fn size(name: &str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    if !v.is_instance_of::<PyBool>() {
        if let Ok(n) = v.extract::<usize>() {
            return Ok(n);
        }
    }
    Err(size_error(name, v))
}

/// Why `v` is not a count: not an int, negative, or more than a `usize` holds.
fn size_error(name: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let index = if v.is_instance_of::<PyBool>() {
        None
    } else {
        v.call_method0("__index__").ok()
    };
    let Some(n) = index else {
        return PyTypeError::new_err(format!("{name}: expected an int, got {}", described(v)));
    };
    if n.lt(0).unwrap_or(false) {
        PyValueError::new_err(format!("{name}: {n} must be non-negative"))
    } else {
        PyOverflowError::new_err(format!("{name}: {n} is too large (at most {})", usize::MAX))
    }
}

/// What the parameters tuple holds, for messages.
const PARAMS: &str = "(stride_h, stride_w, top, bottom, left, right, dilation_h, dilation_w, \
                      groups, offset_groups, convention)";

/// The name each of the first ten values of the parameters tuple has in the Python API.
const PARAM_NAMES: [&str; 10] = [
    "stride",
    "stride",
    "padding",
    "padding",
    "padding",
    "padding",
    "dilation",
    "dilation",
    "groups",
    "offset_groups",
];

/// The convolution parameters from the tuple the Python package passes: [`PARAMS`], each value
/// named as the user spelled it in any error (the crate checks the values against each other
/// and against the shapes).
pub(crate) fn conv_params(params: &Bound<'_, PyAny>) -> PyResult<ConvParams> {
    let t = params.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!(
            "params: expected a tuple {PARAMS}, got {}",
            described(params)
        ))
    })?;
    if t.len() != PARAM_NAMES.len() + 1 {
        return Err(PyValueError::new_err(format!(
            "params: expected 11 values {PARAMS}, got {}",
            t.len()
        )));
    }
    let mut v = [0; PARAM_NAMES.len()];
    for (i, name) in PARAM_NAMES.iter().enumerate() {
        v[i] = size(name, &t.get_item(i)?)?;
    }
    let [stride_h, stride_w, top, bottom, left, right, dil_h, dil_w, groups, offset_groups] = v;
    Ok(ConvParams::default()
        .stride(stride_h, stride_w)
        .padding_sides(Padding {
            top,
            bottom,
            left,
            right,
        })
        .dilation(dil_h, dil_w)
        .groups(groups)
        .offset_groups(offset_groups)
        .convention(convention(&t.get_item(PARAM_NAMES.len())?)?))
}

fn convention(v: &Bound<'_, PyAny>) -> PyResult<Convention> {
    let name = v.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!("convention: expected a str, got {}", described(v)))
    })?;
    match &*name.to_cow()? {
        "torchvision" => Ok(Convention::Torchvision),
        "mmcv" => Ok(Convention::Mmcv),
        "dcn_v1" => Ok(Convention::DcnV1),
        other => Err(PyValueError::new_err(format!(
            "convention: unknown {other:?}; expected \"torchvision\", \"mmcv\" or \"dcn_v1\""
        ))),
    }
}

/// `(input, offset, mask, weight, bias)` flags.
pub(crate) type Needs = (bool, bool, bool, bool, bool);

/// The gradient flags of a backward call.
pub(crate) fn needs(v: &Bound<'_, PyAny>) -> PyResult<Needs> {
    v.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "needs: expected a tuple of 5 bools (input, offset, mask, weight, bias), got {}",
            described(v)
        ))
    })
}

/// The gradients `needs` asks for; for a dense problem (no offset) never the offset's or the
/// mask's.
pub(crate) fn want(n: Needs, dense: bool) -> Want {
    Want {
        input: n.0,
        offset: n.1 && !dense,
        mask: n.2 && !dense,
        weight: n.3,
        bias: n.4,
    }
}
