//! Checking another deformable-convolution kernel against the oracle, as a downstream crate
//! (a GPU port, a fused kernel, another library's binding) does in its tests: random valid
//! problems from `deformconv::testing` (offsets on and around the image borders, integers,
//! far outside; masks with zeros and negatives; groups, offset groups, padding per side),
//! each result judged against the f64 reference under the crate's f32 bound.
//!
//! ```text
//! cargo run --release --features testing --example check_my_kernel [-- CASES]
//! ```
//!
//! The kernel under test here is a plain-loop f32 forward written from torchvision's
//! definition (`my_forward`); put yours in its place. In a test suite use
//! `deformconv::testing::assert_close` inside `proptest!` (see the `testing` module docs).

use deformconv::testing::{problems, Output, Problem};
use ndarray::Array4;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

/// A deformable forward in f32 plain loops, from the definition
/// `out[n, o, y, x] = bias[o] + sum_{c', i, j} weight[o, c', i, j] * m * B(input[n, c], py, px)`.
fn my_forward(p: &Problem<f32>) -> Array4<f32> {
    let [n, c_in, h, w] = [0, 1, 2, 3].map(|a| p.input.shape()[a]);
    let [c_out, cig, kh, kw] = [0, 1, 2, 3].map(|a| p.weight.shape()[a]);
    let [_, _, h_out, w_out] = [0, 1, 2, 3].map(|a| p.grad_out.shape()[a]);
    let q = &p.params;
    let (cog, taps) = (c_out / q.groups, kh * kw);
    let cpo = c_in / q.offset_groups;
    // Bilinear sampling, torchvision's rule: zero outside -1 < p < size, corners outside read 0.
    let sample = |img: usize, c: usize, py: f32, px: f32| -> f32 {
        if !(py > -1.0 && px > -1.0 && py < h as f32 && px < w as f32) {
            return if py.is_nan() || px.is_nan() {
                f32::NAN
            } else {
                0.0
            };
        }
        let (y0, x0) = (py.floor(), px.floor());
        let (ly, lx) = (py - y0, px - x0);
        let v = |r: f32, s: f32| {
            let inside = r >= 0.0 && s >= 0.0 && r < h as f32 && s < w as f32;
            if inside {
                p.input[[img, c, r as usize, s as usize]]
            } else {
                0.0
            }
        };
        (1.0 - ly) * (1.0 - lx) * v(y0, x0)
            + (1.0 - ly) * lx * v(y0, x0 + 1.0)
            + ly * (1.0 - lx) * v(y0 + 1.0, x0)
            + ly * lx * v(y0 + 1.0, x0 + 1.0)
    };
    Array4::from_shape_fn((n, c_out, h_out, w_out), |(img, o, y, x)| {
        let group = o / cog;
        let mut acc = p.bias.as_ref().map_or(0.0, |b| b[o]);
        for ci in 0..cig {
            let c = group * cig + ci;
            let og = c / cpo;
            for (i, j) in (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j))) {
                let ch = og * taps + i * kw + j;
                let base_y = (y * q.stride.0 + i * q.dilation.0) as f32 - q.padding.top as f32;
                let base_x = (x * q.stride.1 + j * q.dilation.1) as f32 - q.padding.left as f32;
                let py = base_y + p.offset[[img, 2 * ch, y, x]];
                let px = base_x + p.offset[[img, 2 * ch + 1, y, x]];
                let m = p.mask.as_ref().map_or(1.0, |m| m[[img, ch, y, x]]);
                acc += p.weight[[o, ci, i, j]] * m * sample(img, c, py, px);
            }
        }
        acc
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cases: usize = std::env::args().nth(1).map_or(Ok(64), |s| s.parse())?;
    let mut runner = TestRunner::deterministic();
    let strategy = problems::<f32>();
    let (mut passed, mut failed) = (0, 0);
    for case in 0..cases {
        let problem = strategy
            .new_tree(&mut runner)
            .map_err(|e| e.to_string())?
            .current();
        let actual = my_forward(&problem);
        let report = problem.report(&[(Output::Out, actual.view().into_dyn())])?;
        if report.passed() {
            passed += 1;
        } else {
            failed += 1;
            println!(
                "case {case}: input {:?}, weight {:?}, {:?}\n{report}",
                problem.input.shape(),
                problem.weight.shape(),
                problem.params
            );
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
