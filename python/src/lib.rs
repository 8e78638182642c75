//! `deformconv._native`: the Python extension of the `deformconv` crate.
//!
//! Thin wrappers only: the Python package (`python/deformconv/`) normalises arguments (int or
//! pair parameters, inferred groups, dtype and rank checks with readable messages) and calls
//! these functions with numpy arrays that are already `float32` or `float64` and of the right
//! rank. Each function borrows the arrays (any strides: the crate copies only what its layout
//! needs), releases the GIL, runs in the module's rayon pool (see `set_num_threads`) and
//! turns every `deformconv::Error` into a `ValueError` carrying the crate's message.

mod omp;

use std::sync::{Arc, OnceLock, RwLock};

use deformconv::compare::{
    compare_tensor, error_scales_for, exact_result, Operands, Options, Oracle, Output, Precision,
    Report, Tolerance,
};
use deformconv::layout::{Flip, WeightLayout};
use deformconv::offset_layout::{OffsetLayout, PackedLayout};
use deformconv::testing::{Problem, ProblemShape};
use deformconv::{reference, ConvParams, Convention, Float, Padding, Want};
use ndarray::{Array4, ArrayD, ArrayView1, ArrayView4};
use numpy::{
    Element, IntoPyArray, PyArrayDescrMethods, PyReadonlyArray1, PyReadonlyArray4,
    PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An element type the crate computes in, that numpy can hold.
trait Elem: Float + Element {}
impl Elem for f32 {}
impl Elem for f64 {}

/// The crate's error as a Python `ValueError` with the crate's own message.
fn value_error(e: deformconv::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The rayon pool set by [`set_num_threads`]; `None`: rayon's global pool
/// (`RAYON_NUM_THREADS`, else one thread per core).
static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

fn pool() -> Option<Arc<rayon::ThreadPool>> {
    POOL.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A pool of one thread, for OpenMP hosting with a team of one (`torch.set_num_threads(1)`).
fn single_thread() -> Option<&'static rayon::ThreadPool> {
    static ONE: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    ONE.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "deformconv-single".into())
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs `f` without the GIL: with `openmp`, on the OpenMP threads (on one thread when the team
/// has one; see [`omp`]), else in the module's pool.
fn compute<R: Send>(py: Python<'_>, openmp: bool, f: impl FnOnce() -> R + Send) -> R {
    let pool = pool();
    py.detach(move || {
        let f = if openmp {
            match omp::run(f) {
                Ok(r) => return r,
                Err(f) => f,
            }
        } else {
            f
        };
        let one = if openmp && omp::threads() == Some(1) {
            single_thread()
        } else {
            None
        };
        match one.or(pool.as_deref()) {
            Some(p) => p.install(f),
            None => f(),
        }
    })
}

/// `(stride_h, stride_w, top, bottom, left, right, dil_h, dil_w, groups, offset_groups,
/// convention)`, as the Python package passes them.
#[derive(FromPyObject)]
struct Params(
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    String,
);

impl Params {
    fn get(&self) -> PyResult<ConvParams> {
        let convention = match self.10.as_str() {
            "torchvision" => Convention::Torchvision,
            "mmcv" => Convention::Mmcv,
            "dcn_v1" => Convention::DcnV1,
            other => {
                return Err(PyValueError::new_err(format!(
                "convention: unknown {other:?}; expected \"torchvision\", \"mmcv\" or \"dcn_v1\""
            )))
            }
        };
        Ok(ConvParams::default()
            .stride(self.0, self.1)
            .padding_sides(Padding {
                top: self.2,
                bottom: self.3,
                left: self.4,
                right: self.5,
            })
            .dilation(self.6, self.7)
            .groups(self.8)
            .offset_groups(self.9)
            .convention(convention))
    }
}

/// Whether `a` is a float32 array (the Python layer has already checked that every operand of
/// a call is a float32 or float64 array of the same dtype as the first).
fn is_f32(a: &Bound<'_, PyAny>) -> PyResult<bool> {
    let arr = a
        .cast::<numpy::PyUntypedArray>()
        .map_err(|_| PyTypeError::new_err("expected a numpy array"))?;
    let py = a.py();
    if arr.dtype().is_equiv_to(&numpy::dtype::<f32>(py)) {
        Ok(true)
    } else if arr.dtype().is_equiv_to(&numpy::dtype::<f64>(py)) {
        Ok(false)
    } else {
        Err(PyTypeError::new_err(format!(
            "expected a float32 or float64 array, got {}",
            arr.dtype()
        )))
    }
}

type Arr4<'py, T> = PyReadonlyArray4<'py, T>;

fn arr4<'py, T: Elem>(a: &Bound<'py, PyAny>) -> PyResult<Arr4<'py, T>> {
    a.extract()
}

fn opt4<'py, T: Elem>(a: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Arr4<'py, T>>> {
    a.map(arr4).transpose()
}

fn out<T: Elem, D: ndarray::Dimension>(py: Python<'_>, a: ndarray::Array<T, D>) -> Py<PyAny> {
    a.into_pyarray(py).into_any().unbind()
}

fn opt_out<T: Elem, D: ndarray::Dimension>(
    py: Python<'_>,
    a: Option<ndarray::Array<T, D>>,
) -> Option<Py<PyAny>> {
    a.map(|a| out(py, a))
}

/// Dispatches a generic helper on the dtype of the first operand.
macro_rules! by_dtype {
    ($first:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        if is_f32($first)? { $f::<f32>($($arg),*) } else { $f::<f64>($($arg),*) }
    };
}

// ---------------------------------------------------------------------------------------------
// Operands
// ---------------------------------------------------------------------------------------------

/// A call's tensors as Python passed them; `offset = None` is a dense convolution.
#[derive(Clone, Copy)]
struct Args<'a, 'py> {
    grad_out: Option<&'a Bound<'py, PyAny>>,
    input: &'a Bound<'py, PyAny>,
    offset: Option<&'a Bound<'py, PyAny>>,
    mask: Option<&'a Bound<'py, PyAny>>,
    weight: &'a Bound<'py, PyAny>,
    bias: Option<&'a Bound<'py, PyAny>>,
}

/// [`Args`] borrowed as numpy arrays of `T` (no copy).
struct Borrowed<'py, T: Elem> {
    grad_out: Option<Arr4<'py, T>>,
    input: Arr4<'py, T>,
    offset: Option<Arr4<'py, T>>,
    mask: Option<Arr4<'py, T>>,
    weight: Arr4<'py, T>,
    bias: Option<PyReadonlyArray1<'py, T>>,
}

/// The borrowed tensors as `ndarray` views, for the crate.
struct Views<'a, T> {
    grad_out: Option<ArrayView4<'a, T>>,
    input: ArrayView4<'a, T>,
    offset: Option<ArrayView4<'a, T>>,
    mask: Option<ArrayView4<'a, T>>,
    weight: ArrayView4<'a, T>,
    bias: Option<ArrayView1<'a, T>>,
}

impl<'py, T: Elem> Borrowed<'py, T> {
    fn new(a: &Args<'_, 'py>) -> PyResult<Self> {
        Ok(Borrowed {
            grad_out: opt4(a.grad_out)?,
            input: arr4(a.input)?,
            offset: opt4(a.offset)?,
            mask: opt4(a.mask)?,
            weight: arr4(a.weight)?,
            bias: a.bias.map(|b| b.extract()).transpose()?,
        })
    }

    fn views(&self) -> Views<'_, T> {
        Views {
            grad_out: self.grad_out.as_ref().map(|a| a.as_array()),
            input: self.input.as_array(),
            offset: self.offset.as_ref().map(|a| a.as_array()),
            mask: self.mask.as_ref().map(|a| a.as_array()),
            weight: self.weight.as_array(),
            bias: self.bias.as_ref().map(|a| a.as_array()),
        }
    }
}

impl<T: Float> Views<'_, T> {
    /// `grad_out`, which every backward call passes.
    fn grad_out(&self) -> deformconv::Result<ArrayView4<'_, T>> {
        self.grad_out.ok_or_else(|| deformconv::Error::Param {
            name: "grad_out",
            rule: "missing".into(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Fast path
// ---------------------------------------------------------------------------------------------

fn fast_forward<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    openmp: bool,
) -> PyResult<Py<PyAny>> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let r = compute(py, openmp, || match v.offset {
        Some(off) => deformconv::deform_conv2d(v.input, off, v.mask, v.weight, v.bias, p),
        None => deformconv::conv2d(v.input, v.weight, v.bias, p),
    })
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// Deformable convolution, forward (`deformconv::deform_conv2d`).
#[pyfunction]
#[pyo3(signature = (input, offset, mask, weight, bias, params, openmp = false))]
#[allow(clippy::too_many_arguments)]
fn deform_conv2d(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    offset: &Bound<'_, PyAny>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: Params,
    openmp: bool,
) -> PyResult<Py<PyAny>> {
    let p = params.get()?;
    let a = Args {
        grad_out: None,
        input,
        offset: Some(offset),
        mask,
        weight,
        bias,
    };
    by_dtype!(input, fast_forward(py, &a, &p, openmp))
}

/// Dense convolution, forward (`deformconv::conv2d`).
#[pyfunction]
#[pyo3(signature = (input, weight, bias, params))]
fn conv2d(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: Params,
) -> PyResult<Py<PyAny>> {
    let p = params.get()?;
    let a = Args {
        grad_out: None,
        input,
        offset: None,
        mask: None,
        weight,
        bias,
    };
    by_dtype!(input, fast_forward(py, &a, &p, false))
}

/// `(input, offset, mask, weight, bias)` flags.
type Needs = (bool, bool, bool, bool, bool);

/// The gradients `needs` asks for; for a dense problem (no offset) never the offset's or the
/// mask's.
fn want(n: Needs, dense: bool) -> Want {
    Want {
        input: n.0,
        offset: n.1 && !dense,
        mask: n.2 && !dense,
        weight: n.3,
        bias: n.4,
    }
}

type GradTuple = (
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
);

fn grad_tuple<T: Elem, D: ndarray::Dimension>(
    py: Python<'_>,
    [a, b, c, d, e]: [Option<ndarray::Array<T, D>>; 5],
) -> GradTuple {
    (
        opt_out(py, a),
        opt_out(py, b),
        opt_out(py, c),
        opt_out(py, d),
        opt_out(py, e),
    )
}

fn fast_backward<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    needs: Needs,
    openmp: bool,
) -> PyResult<GradTuple> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let want = want(needs, v.offset.is_none());
    let r = compute(py, openmp, || {
        let g = v.grad_out()?;
        match v.offset {
            Some(off) => {
                deformconv::deform_conv2d_backward(g, v.input, off, v.mask, v.weight, p, want)
            }
            None => deformconv::conv2d_backward(g, v.input, v.weight, p, want),
        }
    })
    .map_err(value_error)?;
    let r = [
        r.input.map(|a| a.into_dyn()),
        r.offset.map(|a| a.into_dyn()),
        r.mask.map(|a| a.into_dyn()),
        r.weight.map(|a| a.into_dyn()),
        r.bias.map(|a| a.into_dyn()),
    ];
    Ok(grad_tuple(py, r))
}

/// The gradients selected by `needs` (`(input, offset, mask, weight, bias)`), the others
/// `None`; dense when `offset` is `None` (then no offset or mask gradient).
#[pyfunction]
#[pyo3(signature = (grad_out, input, offset, mask, weight, params, needs, openmp = false))]
#[allow(clippy::too_many_arguments)]
fn backward(
    py: Python<'_>,
    grad_out: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    params: Params,
    needs: Needs,
    openmp: bool,
) -> PyResult<GradTuple> {
    let p = params.get()?;
    let a = Args {
        grad_out: Some(grad_out),
        input,
        offset,
        mask,
        weight,
        bias: None,
    };
    by_dtype!(input, fast_backward(py, &a, &p, needs, openmp))
}

// ---------------------------------------------------------------------------------------------
// Reference (f64 oracle)
// ---------------------------------------------------------------------------------------------

fn dims(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// A dense problem as the oracle computes it: zero offsets, one offset group.
fn dense_offset<T: Float>(
    x: ArrayView4<'_, T>,
    w: ArrayView4<'_, T>,
    p: &ConvParams,
) -> deformconv::Result<(Array4<T>, ConvParams)> {
    let p = p.offset_groups(1);
    let geo = deformconv::Geometry::new(dims(x.shape()), dims(w.shape()), &p)?;
    Ok((Array4::from_elem(geo.offset_shape(), T::ZERO), p))
}

fn ref_fwd<T: Elem>(py: Python<'_>, a: &Args<'_, '_>, p: &ConvParams) -> PyResult<Py<PyAny>> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let r = compute(py, false, || match v.offset {
        Some(off) => reference::deform_conv2d(v.input, off, v.mask, v.weight, v.bias, p),
        None => reference::conv2d(v.input, v.weight, v.bias, p),
    })
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// The oracle's forward, in f64: deformable, or dense when `offset` is `None`.
#[pyfunction]
#[pyo3(signature = (input, offset, mask, weight, bias, params))]
fn ref_forward(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: Params,
) -> PyResult<Py<PyAny>> {
    let p = params.get()?;
    let a = Args {
        grad_out: None,
        input,
        offset,
        mask,
        weight,
        bias,
    };
    by_dtype!(input, ref_fwd(py, &a, &p))
}

/// Every reference gradient `want` selects; the dense gradients are the deformable ones at
/// zero offsets (one offset group).
fn ref_grads<T: Float>(
    v: &Views<'_, T>,
    p: &ConvParams,
    want: Want,
) -> deformconv::Result<[Option<ArrayD<f64>>; 5]> {
    let g = v.grad_out()?;
    let (x, m, w) = (v.input, v.mask, v.weight);
    let (xs, ws) = (dims(x.shape()), dims(w.shape()));
    let dense;
    let (off, p) = match v.offset {
        Some(off) => (off, p),
        None => {
            dense = dense_offset(x, w, p)?;
            (dense.0.view(), &dense.1)
        }
    };
    let gi = want
        .input
        .then(|| reference::grad_input(g, off, m, w, xs, p))
        .transpose()?;
    let go = want
        .offset
        .then(|| reference::grad_offset(g, x, off, m, w, p))
        .transpose()?;
    let gm = want
        .mask
        .then(|| reference::grad_mask(g, x, off, w, p))
        .transpose()?;
    let gw = want
        .weight
        .then(|| reference::grad_weight(g, x, off, m, ws, p))
        .transpose()?;
    let gb = if want.bias {
        // Validates the problem as the other gradients do before summing.
        reference::grad_weight(g, x, off, m, ws, p)?;
        Some(reference::grad_bias(g)?.into_dyn())
    } else {
        None
    };
    Ok([
        gi.map(|a| a.into_dyn()),
        go.map(|a| a.into_dyn()),
        gm.map(|a| a.into_dyn()),
        gw.map(|a| a.into_dyn()),
        gb,
    ])
}

fn ref_bwd<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    needs: Needs,
) -> PyResult<GradTuple> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let want = want(needs, v.offset.is_none());
    let r = compute(py, false, || ref_grads(&v, p, want)).map_err(value_error)?;
    Ok(grad_tuple(py, r))
}

/// The oracle's gradients (f64) selected by `needs`; dense when `offset` is `None`.
#[pyfunction]
#[pyo3(signature = (grad_out, input, offset, mask, weight, params, needs))]
#[allow(clippy::too_many_arguments)]
fn ref_backward(
    py: Python<'_>,
    grad_out: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    params: Params,
    needs: Needs,
) -> PyResult<GradTuple> {
    let p = params.get()?;
    let a = Args {
        grad_out: Some(grad_out),
        input,
        offset,
        mask,
        weight,
        bias: None,
    };
    by_dtype!(input, ref_bwd(py, &a, &p, needs))
}

// ---------------------------------------------------------------------------------------------
// Comparison with the oracle (DESIGN §5)
// ---------------------------------------------------------------------------------------------

fn output_named(name: &str) -> PyResult<Output> {
    Output::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown result {name:?}; expected one of out, grad_input, grad_offset, grad_mask, grad_weight, grad_bias"
        ))
    })
}

fn precision_named(name: &str) -> PyResult<Precision> {
    Precision::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "precision: unknown profile {name:?}; expected one of f64, f32, tf32, bf16, f16"
        ))
    })
}

/// Compares `actual` results (`(name, array as f64, precision name)`) with the oracle's exact
/// ones (or with `expected` ones where given) through [`Oracle`], as `deformconv compare`
/// does: the DESIGN §5 bound of each result's declared precision, either side accepted where
/// that precision rounds a sample position across an integer or window edge (unless
/// `strict_positions`), and the statistical check (unless `statistical` is false). One oracle
/// per distinct precision. `allclose = (rtol, atol)` switches the pass rule to numpy's (no
/// positions within rounding, no statistical check), keeping the reported bound ratio. The
/// operands are f64 (exact copies of f32 data); `offset = None` is a dense problem. Returns
/// the per-tensor figures, the samples with an ambiguous position and the report's text.
#[pyfunction]
#[pyo3(signature = (actual, expected, input, offset, mask, weight, bias, grad_out, params, bound_factor, allclose, strict_positions, statistical))]
#[allow(clippy::too_many_arguments)]
fn compare<'py>(
    py: Python<'py>,
    actual: Vec<(String, PyReadonlyArrayDyn<'py, f64>, String)>,
    expected: Vec<(String, PyReadonlyArrayDyn<'py, f64>)>,
    input: PyReadonlyArray4<'py, f64>,
    offset: Option<PyReadonlyArray4<'py, f64>>,
    mask: Option<PyReadonlyArray4<'py, f64>>,
    weight: PyReadonlyArray4<'py, f64>,
    bias: Option<PyReadonlyArray1<'py, f64>>,
    grad_out: Option<PyReadonlyArray4<'py, f64>>,
    params: Params,
    bound_factor: f64,
    allclose: Option<(f64, f64)>,
    strict_positions: bool,
    statistical: bool,
) -> PyResult<(Vec<Bound<'py, PyDict>>, usize, String)> {
    let mut p = params.get()?;
    let outputs: Vec<Output> = actual
        .iter()
        .map(|(n, _, _)| output_named(n))
        .collect::<PyResult<_>>()?;
    let precisions: Vec<Precision> = actual
        .iter()
        .map(|(_, _, pr)| precision_named(pr))
        .collect::<PyResult<_>>()?;
    let given: Vec<Output> = expected
        .iter()
        .map(|(n, _)| output_named(n))
        .collect::<PyResult<_>>()?;
    let (x, w) = (input.as_array(), weight.as_array());
    let m = mask.as_ref().map(|m| m.as_array());
    let b = bias.as_ref().map(|b| b.as_array());
    let go = grad_out.as_ref().map(|g| g.as_array());
    let dense_offset = match &offset {
        Some(_) => None,
        None => {
            let (zeros, dense_p) = dense_offset(x, w, &p).map_err(value_error)?;
            p = dense_p;
            Some(zeros)
        }
    };
    let off = match (&offset, &dense_offset) {
        (Some(o), _) => o.as_array(),
        (None, Some(z)) => z.view(),
        (None, None) => unreachable!("a dense problem has zero offsets"),
    };
    let actual_views: Vec<_> = actual.iter().map(|(_, a, _)| a.as_array()).collect();
    let expected_views: Vec<_> = expected.iter().map(|(_, a)| a.as_array()).collect();
    let report = compute(py, false, || -> deformconv::Result<Report> {
        let needs_grads = outputs.iter().any(|o| *o != Output::Out);
        if needs_grads && go.is_none() {
            return Err(deformconv::Error::Param {
                name: "grad_out",
                rule: "is required to compare gradients".into(),
            });
        }
        let ops = Operands {
            input: x,
            offset: off,
            mask: m,
            weight: w,
            bias: b,
            grad_out: if needs_grads { go } else { None },
            params: p,
        };
        let undefined = |output: Output| deformconv::Error::Param {
            name: output.name(),
            rule: match output {
                Output::GradMask => "is only defined for a problem with a mask".into(),
                Output::GradBias => "is only defined for a problem with a bias".into(),
                _ => "cannot be compared for this problem".into(),
            },
        };
        for &output in &outputs {
            if (output == Output::GradMask && m.is_none())
                || (output == Output::GradBias && b.is_none())
            {
                return Err(undefined(output));
            }
        }
        let mut options = Options::default().strict_positions(strict_positions);
        options.bound_factor = bound_factor;
        if !statistical {
            options.statistical_limit = None;
        }
        let mut oracles: Vec<(Precision, Oracle)> = Vec::new();
        let mut report = Report::default();
        for ((&output, got), &precision) in outputs.iter().zip(&actual_views).zip(&precisions) {
            let exact = match given.iter().position(|&o| o == output) {
                Some(i) => expected_views[i].to_owned(),
                None => exact_result(&ops, output)?.ok_or_else(|| undefined(output))?,
            };
            let t = match allclose {
                Some((rtol, atol)) => {
                    let scales = error_scales_for(&ops, precision)?;
                    let scale = scales.get(output).ok_or_else(|| undefined(output))?;
                    let tol = Tolerance::precision(precision)
                        .bound_factor(bound_factor)
                        .allclose(rtol, atol);
                    compare_tensor(output, exact.view(), got.view(), Some(scale), &tol)?
                }
                None => {
                    let i = match oracles.iter().position(|(pr, _)| *pr == precision) {
                        Some(i) => i,
                        None => {
                            options.precision = precision;
                            oracles.push((precision, Oracle::new(&ops, &options)?));
                            oracles.len() - 1
                        }
                    };
                    let oracle = &oracles[i].1;
                    report.ambiguous_samples =
                        report.ambiguous_samples.max(oracle.ambiguous_samples());
                    oracle.compare(output, exact.view(), got.view())?
                }
            };
            report.tensors.push(t);
        }
        Ok(report)
    })
    .map_err(value_error)?;
    let mut rows = Vec::new();
    for t in &report.tensors {
        let d = PyDict::new(py);
        d.set_item("name", t.output.name())?;
        d.set_item("shape", t.shape.clone())?;
        d.set_item("max_abs_err", t.max_abs_err)?;
        d.set_item("max_rel_err", t.max_rel_err)?;
        d.set_item("over_tolerance", t.over_tolerance)?;
        d.set_item("elements", t.elements())?;
        d.set_item("max_bound_ratio", t.max_bound_ratio)?;
        d.set_item("accepted_by_rounding", t.accepted_by_rounding)?;
        d.set_item("statistic", t.statistic)?;
        d.set_item("bound_passed", t.bound_passed())?;
        d.set_item("statistical_passed", t.statistical_passed())?;
        d.set_item("passed", t.passed())?;
        d.set_item("criterion", t.tolerance.to_string())?;
        if let Some(wst) = &t.worst {
            d.set_item("worst_index", wst.index.clone())?;
            d.set_item("worst_expected", wst.expected)?;
            d.set_item("worst_actual", wst.actual)?;
            d.set_item("worst_allowed", wst.allowed)?;
        }
        rows.push(d);
    }
    Ok((rows, report.ambiguous_samples, report.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Testing: the crate's problem generator
// ---------------------------------------------------------------------------------------------

fn problem_dict<'py, T: Elem>(
    py: Python<'py>,
    shape: &ProblemShape,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let pr = Problem::<T>::random(shape, seed).map_err(value_error)?;
    let d = PyDict::new(py);
    d.set_item("input", out(py, pr.input))?;
    d.set_item("offset", out(py, pr.offset))?;
    d.set_item("mask", opt_out(py, pr.mask))?;
    d.set_item("weight", out(py, pr.weight))?;
    d.set_item("bias", opt_out(py, pr.bias))?;
    d.set_item("grad_out", out(py, pr.grad_out))?;
    Ok(d)
}

/// The operands of `deformconv::testing::Problem::random` for the given shape and seed (the
/// crate's value distributions: offsets on and around the borders, integers, half-integers,
/// far outside; masks with zeros, negatives and values over 1).
#[pyfunction]
#[pyo3(signature = (input, weight, params, mask, bias, seed, float32))]
#[allow(clippy::too_many_arguments)]
fn random_problem<'py>(
    py: Python<'py>,
    input: [usize; 4],
    weight: [usize; 4],
    params: Params,
    mask: bool,
    bias: bool,
    seed: u64,
    float32: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let shape = ProblemShape {
        input,
        weight,
        params: params.get()?,
        mask,
        bias,
    };
    if float32 {
        problem_dict::<f32>(py, &shape, seed)
    } else {
        problem_dict::<f64>(py, &shape, seed)
    }
}

// ---------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------

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
    let a = arr4::<T>(a)?;
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
fn convert_layout(
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
    let a = arr4::<T>(a)?;
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
fn convert_offset(
    py: Python<'_>,
    offset: &Bound<'_, PyAny>,
    source: &str,
    target: &str,
    offset_groups: usize,
) -> PyResult<Py<PyAny>> {
    by_dtype!(
        offset,
        convert_off(py, offset, source, target, offset_groups)
    )
}

fn unpack<T: Elem>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    layout: &str,
    groups: usize,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let a = arr4::<T>(a)?;
    let (o, m) =
        deformconv::offset_layout::unpack_offset_mask(a.as_array(), packed_layout(layout)?, groups)
            .map_err(value_error)?;
    Ok((out(py, o), out(py, m)))
}

/// `deformconv::offset_layout::unpack_offset_mask`: `(offset, mask)`.
#[pyfunction]
#[pyo3(signature = (packed, layout, offset_groups))]
fn unpack_offset_mask(
    py: Python<'_>,
    packed: &Bound<'_, PyAny>,
    layout: &str,
    offset_groups: usize,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    by_dtype!(packed, unpack(py, packed, layout, offset_groups))
}

fn pack<T: Elem>(
    py: Python<'_>,
    o: &Bound<'_, PyAny>,
    m: &Bound<'_, PyAny>,
    layout: &str,
    groups: usize,
) -> PyResult<Py<PyAny>> {
    let (o, m) = (arr4::<T>(o)?, arr4::<T>(m)?);
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
fn pack_offset_mask(
    py: Python<'_>,
    offset: &Bound<'_, PyAny>,
    mask: &Bound<'_, PyAny>,
    layout: &str,
    offset_groups: usize,
) -> PyResult<Py<PyAny>> {
    by_dtype!(offset, pack(py, offset, mask, layout, offset_groups))
}

// ---------------------------------------------------------------------------------------------
// Threads and scratch
// ---------------------------------------------------------------------------------------------

/// Computes on a pool of `n` threads from now on; `0` returns to rayon's global pool
/// (`RAYON_NUM_THREADS`, else one thread per core).
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    let new = if n == 0 {
        None
    } else {
        let p = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("deformconv-{i}"))
            .build()
            .map_err(|e| PyValueError::new_err(format!("cannot start {n} threads: {e}")))?;
        Some(Arc::new(p))
    };
    *POOL.write().unwrap_or_else(|e| e.into_inner()) = new;
    Ok(())
}

/// The number of threads computations run on.
#[pyfunction]
fn get_num_threads() -> usize {
    match pool() {
        Some(p) => p.current_num_threads(),
        None => rayon::current_num_threads(),
    }
}

/// The number of threads a call with `openmp=True` runs on: the OpenMP team of the libgomp
/// PyTorch loads (`omp_get_max_threads()`, which `torch.set_num_threads` sets); `None` when no
/// libgomp is loaded (the call then runs on deformconv's pool).
#[pyfunction]
fn openmp_threads() -> Option<usize> {
    omp::threads()
}

/// Frees the scratch the kernels keep between calls (up to 32 MiB per thread): on deformconv's
/// pool, and on the OpenMP team the torch ops run on when a libgomp is loaded.
#[pyfunction]
fn release_cached_scratch(py: Python<'_>) {
    compute(py, false, deformconv::release_cached_scratch);
    if omp::available() {
        compute(py, true, deformconv::release_cached_scratch);
    }
}

/// The native extension of the `deformconv` Python package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(deform_conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(ref_forward, m)?)?;
    m.add_function(wrap_pyfunction!(ref_backward, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(random_problem, m)?)?;
    m.add_function(wrap_pyfunction!(convert_layout, m)?)?;
    m.add_function(wrap_pyfunction!(convert_offset, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_offset_mask, m)?)?;
    m.add_function(wrap_pyfunction!(pack_offset_mask, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(release_cached_scratch, m)?)?;
    m.add_function(wrap_pyfunction!(openmp_threads, m)?)?;
    m.add(
        "DEFAULT_BOUND_FACTOR",
        deformconv::compare::DEFAULT_BOUND_FACTOR,
    )?;
    m.add("EPS_F32", f64::from(f32::EPSILON) / 2.0)?;
    m.add("EPS_F64", f64::EPSILON / 2.0)?;
    Ok(())
}
