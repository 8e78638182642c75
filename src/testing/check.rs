//! Judging a kernel's results against the oracle: [`Problem::report`], [`Problem::check`],
//! [`assert_close`].

use std::fmt::Write as _;

use ndarray::{Array1, Array4, ArrayD, ArrayView, ArrayViewD, Dimension};
use proptest::test_runner::TestCaseError;

use super::{Options, Output, Precision, Problem, Report, Tolerance};
use crate::backward::Grads;
use crate::compare::{compare_tensor_within, error_scales, Expected, Operands, Oracle};
use crate::error::Result;
use crate::float::Float;
use crate::params::ConvParams;

impl<T: Float> Problem<T> {
    /// The operands in `f64`.
    fn operands64(&self) -> Operands64 {
        let to64 = |a: &Array4<T>| a.mapv(T::to_f64);
        Operands64 {
            input: to64(&self.input),
            offset: to64(&self.offset),
            mask: self.mask.as_ref().map(to64),
            weight: to64(&self.weight),
            bias: self.bias.as_ref().map(|b| b.mapv(T::to_f64)),
            grad_out: to64(&self.grad_out),
        }
    }

    /// Compares `actual` results with the exact ones as [`Oracle`] judges results computed in
    /// `T` ([`precision_of`]): the DESIGN §5 bound with positions within rounding, and the
    /// statistical check.
    pub fn report(&self, actual: &[(Output, ArrayViewD<'_, T>)]) -> Result<Report> {
        self.report_with_options(actual, &Options::precision(precision_of::<T>()))
    }

    /// Compares `actual` results with the exact ones as an [`Oracle`] with `options` judges.
    pub fn report_with_options(
        &self,
        actual: &[(Output, ArrayViewD<'_, T>)],
        options: &Options,
    ) -> Result<Report> {
        let o = self.operands64();
        let oracle = Oracle::new(&o.view(self.params), options)?;
        let mut report = Report {
            ambiguous_samples: oracle.ambiguous_samples(),
            ..Report::default()
        };
        for (output, got) in actual {
            let exact = self.exact(*output)?;
            let got = got.mapv(T::to_f64);
            report
                .tensors
                .push(oracle.compare(*output, exact.view(), got.view())?);
        }
        Ok(report)
    }

    /// Compares `actual` results with the exact ones under `tol`, at the exact positions.
    pub fn report_with(
        &self,
        actual: &[(Output, ArrayViewD<'_, T>)],
        tol: &Tolerance,
    ) -> Result<Report> {
        let o = self.operands64();
        let scales = error_scales(&o.view(self.params))?;
        let mut report = Report::default();
        for (output, got) in actual {
            let exact = self.exact(*output)?;
            let got = got.mapv(T::to_f64);
            let expected = Expected {
                values: exact.view(),
                scale: scales.get(*output),
                rms_scale: scales.rms(*output),
            };
            report.tensors.push(compare_tensor_within(
                *output,
                expected,
                None,
                got.view(),
                tol,
            )?);
        }
        Ok(report)
    }

    /// For a proptest body: `Ok(())` when every given result passes ([`Problem::report`]),
    /// else a [`TestCaseError::Fail`] carrying the report and the problem's shape (so
    /// `p.check(results)?` is all a property needs). Takes owned arrays of any dimension.
    ///
    /// ```
    /// use deformconv::testing::{problems, Output, Problem};
    /// use proptest::prelude::*;
    ///
    /// proptest! {
    ///     #![proptest_config(ProptestConfig::with_cases(4))]
    ///     fn forward_and_input_gradient(p in problems::<f32>()) {
    ///         let m = p.mask.as_ref().map(|m| m.view());
    ///         let b = p.bias.as_ref().map(|b| b.view());
    ///         let out = deformconv::deform_conv2d(p.input.view(), p.offset.view(), m,
    ///                                             p.weight.view(), b, &p.params).unwrap();
    ///         let gi = deformconv::deform_conv2d_grad_input(p.grad_out.view(), p.offset.view(),
    ///             m, p.weight.view(), [p.input.shape()[0], p.input.shape()[1],
    ///             p.input.shape()[2], p.input.shape()[3]], &p.params).unwrap();
    ///         p.check([(Output::Out, out), (Output::GradInput, gi)])?;
    ///     }
    /// }
    /// # fn main() { forward_and_input_gradient(); }
    /// ```
    pub fn check<D: Dimension>(
        &self,
        results: impl IntoIterator<Item = (Output, ndarray::Array<T, D>)>,
    ) -> std::result::Result<(), TestCaseError> {
        let owned: Vec<(Output, ArrayD<T>)> = results
            .into_iter()
            .map(|(o, a)| (o, a.into_dyn()))
            .collect();
        let views: Vec<(Output, ArrayViewD<'_, T>)> =
            owned.iter().map(|(o, a)| (*o, a.view())).collect();
        match self.report(&views) {
            Ok(report) if report.passed() => Ok(()),
            Ok(report) => Err(TestCaseError::fail(failure_message(
                self,
                &report.to_string(),
            ))),
            Err(e) => Err(TestCaseError::fail(failure_message(
                self,
                &format!("cannot compare: {e}"),
            ))),
        }
    }

    /// [`Problem::check`] of the gradients a backward returned (those present).
    pub fn check_grads(&self, grads: &Grads<T>) -> std::result::Result<(), TestCaseError> {
        let mut results: Vec<(Output, ArrayD<T>)> = Vec::new();
        let four = [
            (Output::GradInput, &grads.input),
            (Output::GradOffset, &grads.offset),
            (Output::GradMask, &grads.mask),
            (Output::GradWeight, &grads.weight),
        ];
        for (o, g) in four {
            if let Some(g) = g {
                results.push((o, g.clone().into_dyn()));
            }
        }
        if let Some(b) = &grads.bias {
            results.push((Output::GradBias, b.clone().into_dyn()));
        }
        self.check(results)
    }
}

/// The operands of a [`Problem`] in `f64`.
struct Operands64 {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    weight: Array4<f64>,
    bias: Option<Array1<f64>>,
    grad_out: Array4<f64>,
}

impl Operands64 {
    fn view(&self, params: ConvParams) -> Operands<'_> {
        Operands {
            input: self.input.view(),
            offset: self.offset.view(),
            mask: self.mask.as_ref().map(|m| m.view()),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            grad_out: Some(self.grad_out.view()),
            params,
        }
    }
}

/// The precision profile of results computed in `T`: [`Precision::F32`] or
/// [`Precision::F64`].
pub fn precision_of<T: Float>() -> Precision {
    Precision::from_name(T::NAME).unwrap_or(Precision::F64)
}

/// Panics (for use inside a test) unless `actual` is within the DESIGN §5 bound of the exact
/// `output` of `problem`; the message is the full comparison report and the problem's shape.
pub fn assert_close<T: Float, D: Dimension>(
    problem: &Problem<T>,
    output: Output,
    actual: ArrayView<'_, T, D>,
) {
    let result = problem.report(&[(output, actual.into_dyn())]);
    match result {
        Ok(report) if report.passed() => {}
        Ok(report) => panic!("{}", failure_message(problem, &report.to_string())),
        Err(e) => panic!(
            "{}",
            failure_message(problem, &format!("cannot compare: {e}"))
        ),
    }
}

fn failure_message<T: Float>(problem: &Problem<T>, body: &str) -> String {
    let mut msg = String::new();
    let _ = writeln!(
        msg,
        "result differs from the oracle for input {:?}, weight {:?}, offset {:?}, mask {}, bias {}, {:?}",
        problem.input.shape(),
        problem.weight.shape(),
        problem.offset.shape(),
        problem.mask.is_some(),
        problem.bias.is_some(),
        problem.params
    );
    msg.push_str(body);
    msg
}
