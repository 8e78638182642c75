//! A deployed DCN layer run the way a program runs it: outputs allocated once and reused
//! through the `_into` forms, forward and every gradient, timed, with the share of this CPU's
//! multiply-add peak.
//!
//! ```text
//! cargo run --release --example real_layer                 # CenterNet-64
//! cargo run --release --example real_layer -- EDVR-PCD 20  # any deformconv::workloads name, runs
//! ```

use std::time::{Duration, Instant};

use deformconv::workloads::{self, Workload};
use deformconv::{deform_conv2d_backward_into, deform_conv2d_into, GradsMut};
use ndarray::{Array1, Array4};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "CenterNet-64".into());
    let runs: usize = args.next().map_or(Ok(10), |s| s.parse())?;
    let layer = Workload::named(&name).ok_or_else(|| {
        let names: Vec<&str> = workloads::all().map(|w| w.name).collect();
        format!("no workload {name:?}; one of {}", names.join(", "))
    })?;
    println!("{}: {}", layer.name, layer.description);

    // The operands (a real program has them from its model and its data).
    let ops = layer.operands();
    let params = layer.params();
    let g = layer.geometry();
    let mask = ops.mask.as_ref().map(|m| m.view());
    let bias = ops.bias.as_ref().map(|b| b.view());

    // Every output once; each call below overwrites them.
    let mut out = Array4::<f32>::zeros(g.out_shape());
    let mut grad_input = Array4::<f32>::zeros(g.input_shape());
    let mut grad_offset = Array4::<f32>::zeros(g.offset_shape());
    let mut grad_mask = Array4::<f32>::zeros(g.mask_shape());
    let mut grad_weight = Array4::<f32>::zeros(g.weight_shape());
    let mut grad_bias = Array1::<f32>::zeros(g.c_out);

    let mut forward = Vec::with_capacity(runs);
    let mut backward = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let x = ops.input.view();
        deform_conv2d_into(
            x,
            ops.offset.view(),
            mask,
            ops.weight.view(),
            bias,
            &params,
            out.view_mut(),
        )?;
        forward.push(t.elapsed());

        let t = Instant::now();
        let grads = GradsMut {
            input: Some(grad_input.view_mut()),
            offset: Some(grad_offset.view_mut()),
            mask: layer.mask.then(|| grad_mask.view_mut()),
            weight: Some(grad_weight.view_mut()),
            bias: layer.bias.then(|| grad_bias.view_mut()),
        };
        deform_conv2d_backward_into(
            ops.grad_out.view(),
            x,
            ops.offset.view(),
            mask,
            ops.weight.view(),
            &params,
            grads,
        )?;
        backward.push(t.elapsed());
    }

    let peak = deformconv::peak::fma_peak::<f32>(5, Duration::from_millis(20));
    let gflop = layer.flops() / 1e9;
    let report = |what: &str, times: &mut Vec<Duration>, gflop: f64| {
        times.sort();
        let median = times[times.len() / 2].as_secs_f64();
        let rate = gflop / median;
        println!(
            "{what:>30}: median {:8.3} ms, min {:8.3} ms, {rate:6.1} GFLOP/s = {:4.1}% of the f32 peak",
            median * 1e3,
            times[0].as_secs_f64() * 1e3,
            100.0 * rate / peak.gflops
        );
    };
    println!(
        "{runs} runs, {} thread(s); f32 multiply-add peak {:.1} GFLOP/s ({} backend)",
        peak.threads, peak.gflops, peak.backend
    );
    report("forward", &mut forward, gflop);
    // The backward's two products (input and weight gradients) count twice the forward.
    report("backward, every gradient", &mut backward, 2.0 * gflop);
    println!(
        "sum(out) = {:.6e}, sum(grad_input) = {:.6e}",
        out.sum(),
        grad_input.sum()
    );
    Ok(())
}
