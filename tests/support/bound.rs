//! The one error bound of the tests: the per-element DESIGN §5 bound the crate publishes in
//! [`deformconv::compare`] (`c * eps * (L * sum |terms| + P)`, the rule of `deformconv compare`
//! and of `deformconv::testing`), applied to a result computed in any precision.
//!
//! Thin glue only: the scales come from [`error_scales`], the verdict from [`compare_tensor`]
//! under [`Tolerance::bound`].

use deformconv::compare::{compare_tensor, error_scales, Operands, Output, Scales, Tolerance};
use deformconv::{ConvParams, Float};
use ndarray::{Array4, ArrayView, Dimension};

use super::Tensors;

/// The published bound for one problem's results computed in `T`.
pub struct Bound {
    label: String,
    scales: Scales,
    tol: Tolerance,
}

impl Bound {
    /// The scales of every result of the problem `t` (f64 operands; for a result computed in
    /// f32 they must be the f32 values), with `grad_out` for the gradients. `label` names the
    /// problem in failure messages.
    ///
    /// Without a mask the scales are those of a mask of ones: the same terms for every result,
    /// and `grad_mask` (which the backward computes either way) gets a scale too.
    pub fn new<T: Float>(
        label: impl Into<String>,
        t: &Tensors,
        grad_out: Option<&Array4<f64>>,
        params: &ConvParams,
    ) -> Self {
        let ones = t.mask.is_none().then(|| {
            let o = t.offset.shape();
            Array4::<f64>::ones([o[0], o[1] / 2, o[2], o[3]])
        });
        // error_scales gives a NaN scale (`inf * 0` in its position term P) to every element
        // an infinite offset reaches, although such a sample lies outside every window and
        // has no terms. A finite far-away offset of the same sign has the same (no) terms.
        let offset = t.offset.mapv(|v| {
            if v.is_infinite() {
                v.signum() * 1e30
            } else {
                v
            }
        });
        let ops = Operands {
            input: t.input.view(),
            offset: offset.view(),
            mask: t.mask.as_ref().or(ones.as_ref()).map(|m| m.view()),
            weight: t.weight.view(),
            bias: t.bias.as_ref().map(|b| b.view()),
            grad_out: grad_out.map(|g| g.view()),
            params: *params,
        };
        Bound {
            label: label.into(),
            scales: error_scales(&ops).expect("error scales of a valid problem"),
            tol: Tolerance::bound::<T>(),
        }
    }

    /// Asserts every element of `actual` (computed in `T`) within the bound of the exact
    /// `expected`, with the full comparison report on failure; returns the largest ratio of
    /// error to bound.
    pub fn check<T: Float, D: Dimension>(
        &self,
        output: Output,
        actual: ArrayView<'_, T, D>,
        expected: ArrayView<'_, f64, D>,
    ) -> f64 {
        let actual = actual.mapv(|v| v.to_f64());
        let scale = self.scales.get(output);
        assert!(
            scale.is_some(),
            "{}: no error scale for {output}",
            self.label
        );
        let report = compare_tensor(
            output,
            expected.into_dyn(),
            actual.view().into_dyn(),
            scale,
            &self.tol,
        )
        .unwrap_or_else(|e| panic!("{}: cannot compare {output}: {e}", self.label));
        assert!(report.passed(), "{}:\n{report}", self.label);
        report.max_bound_ratio.unwrap_or(0.0)
    }
}
