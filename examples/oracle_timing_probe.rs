//! Times the oracle on a workload: the exact results (every gradient) and the bound's scales
//! (worst-case and statistical) at f32, as `deformconv run --exact` plus `compare` need them.
//!
//! ```sh
//! RAYON_NUM_THREADS=2 cargo run --release --example oracle_timing_probe -- W4
//! ```

use std::time::Instant;

use deformconv::compare::{error_scales_for, exact_results, Operands, Precision};
use deformconv::workloads::Workload;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "W4".into());
    let w = Workload::named(&name).unwrap_or_else(|| panic!("no workload {name}"));
    let ops = w.operands();
    let f = |a: &ndarray::Array4<f32>| a.mapv(f64::from);
    let (x, off, wt, go) = (
        f(&ops.input),
        f(&ops.offset),
        f(&ops.weight),
        f(&ops.grad_out),
    );
    let m = ops.mask.as_ref().map(f);
    let b = ops.bias.as_ref().map(|b| b.mapv(f64::from));
    let operands = Operands {
        input: x.view(),
        offset: off.view(),
        mask: m.as_ref().map(|m| m.view()),
        weight: wt.view(),
        bias: b.as_ref().map(|b| b.view()),
        grad_out: Some(go.view()),
        params: w.params(),
    };
    println!(
        "{} ({}), {} threads",
        w.name,
        w.description,
        rayon::current_num_threads()
    );
    let t = Instant::now();
    let exact = exact_results(&operands).unwrap();
    let t_exact = t.elapsed().as_secs_f64();
    println!("exact results ({} tensors): {t_exact:.1} s", exact.len());
    let t = Instant::now();
    let scales = error_scales_for(&operands, Precision::F32).unwrap();
    let t_scales = t.elapsed().as_secs_f64();
    println!(
        "scales (bound and statistical, {} tensors): {t_scales:.1} s",
        scales.outputs().count()
    );
    println!("total: {:.1} s", t_exact + t_scales);
}
