//! A complete problem ([`Problem`]) and its exact results.

use ndarray::{Array1, Array4, ArrayD, ArrayView4};

use super::Output;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::params::ConvParams;
use crate::reference;

/// A complete problem: every operand of the forward and of every gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem<T> {
    /// `[N, C_in, H, W]`.
    pub input: Array4<T>,
    /// `[N, 2 * G_off * kh * kw, H_out, W_out]`.
    pub offset: Array4<T>,
    /// `[N, G_off * kh * kw, H_out, W_out]`, or `None` (DCN v1).
    pub mask: Option<Array4<T>>,
    /// `[C_out, C_in / groups, kh, kw]`.
    pub weight: Array4<T>,
    /// `[C_out]`, or `None`.
    pub bias: Option<Array1<T>>,
    /// `[N, C_out, H_out, W_out]`: the gradient flowing into the output.
    pub grad_out: Array4<T>,
    /// The convolution parameters.
    pub params: ConvParams,
}

impl<T: Float> Problem<T> {
    /// Validates every operand and returns the problem's geometry.
    pub fn geometry(&self) -> Result<Geometry> {
        let g = Geometry::new(dims(&self.input), dims(&self.weight), &self.params)?;
        g.check_offset(self.offset.shape())?;
        if let Some(m) = &self.mask {
            g.check_mask(m.shape())?;
        }
        if let Some(b) = &self.bias {
            g.check_bias(b.len())?;
        }
        g.check_out("grad_out", self.grad_out.shape())?;
        Ok(g)
    }

    /// The results this problem defines: `out`, `grad_input`, `grad_offset`, `grad_mask`
    /// (with a mask), `grad_weight`, `grad_bias` (with a bias).
    pub fn outputs(&self) -> Vec<Output> {
        Output::ALL
            .into_iter()
            .filter(|o| match o {
                Output::GradMask => self.mask.is_some(),
                Output::GradBias => self.bias.is_some(),
                _ => true,
            })
            .collect()
    }

    fn mask_view(&self) -> Option<ArrayView4<'_, T>> {
        self.mask.as_ref().map(|m| m.view())
    }

    /// The exact (f64 [`reference`](mod@crate::reference)) value of `output`.
    ///
    /// Errors if the problem is invalid or does not define `output` (`grad_mask` without a
    /// mask, `grad_bias` without a bias).
    pub fn exact(&self, output: Output) -> Result<ArrayD<f64>> {
        let p = &self.params;
        let (x, off, w, go) = (
            self.input.view(),
            self.offset.view(),
            self.weight.view(),
            self.grad_out.view(),
        );
        let m = self.mask_view();
        let result = match output {
            Output::Out => {
                let b = self.bias.as_ref().map(|b| b.view());
                reference::deform_conv2d(x, off, m, w, b, p)?.into_dyn()
            }
            Output::GradInput => {
                reference::grad_input(go, off, m, w, dims(&self.input), p)?.into_dyn()
            }
            Output::GradOffset => reference::grad_offset(go, x, off, m, w, p)?.into_dyn(),
            Output::GradMask => {
                if self.mask.is_none() {
                    return Err(not_defined(output, "a mask"));
                }
                reference::grad_mask(go, x, off, w, p)?.into_dyn()
            }
            Output::GradWeight => {
                reference::grad_weight(go, x, off, m, dims(&self.weight), p)?.into_dyn()
            }
            Output::GradBias => {
                if self.bias.is_none() {
                    return Err(not_defined(output, "a bias"));
                }
                self.geometry()?;
                reference::grad_bias(go)?.into_dyn()
            }
        };
        Ok(result)
    }
}

fn not_defined(output: Output, needs: &str) -> Error {
    Error::Param {
        name: output.name(),
        rule: format!("is only defined for a problem with {needs}"),
    }
}

fn dims<T>(a: &Array4<T>) -> [usize; 4] {
    let s = a.shape();
    [s[0], s[1], s[2], s[3]]
}
