//! Quick timing probe of the forward on one workload (min of several runs), for development:
//! `cargo run --release --example fwd_probe -- W2 [dense|gemm]` (`ITERS=n` runs).

use deformconv::{conv2d_into, deform_conv2d_into};
use ndarray::Array4;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("W2", |s| s.as_str());
    let dense = args.iter().any(|a| a == "dense");
    let gemm = args.iter().any(|a| a == "gemm");
    let wl = deformconv::workloads::all()
        .find(|w| w.name == name)
        .expect("workload");
    let ops = wl.operands();
    let params = wl.params();
    let mut out = Array4::<f32>::zeros(wl.geometry().out_shape());
    let mut best = f64::MAX;
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    for _ in 0..iters {
        let t = Instant::now();
        if gemm {
            deformconv::conv2d_gemm_only_into(
                ops.input.view(),
                ops.weight.view(),
                ops.bias.as_ref().map(|b| b.view()),
                &params,
                out.view_mut(),
            )
            .unwrap();
        } else if dense {
            conv2d_into(
                ops.input.view(),
                ops.weight.view(),
                ops.bias.as_ref().map(|b| b.view()),
                &params,
                out.view_mut(),
            )
            .unwrap();
        } else {
            deform_conv2d_into(
                ops.input.view(),
                ops.offset.view(),
                ops.mask.as_ref().map(|m| m.view()),
                ops.weight.view(),
                ops.bias.as_ref().map(|b| b.view()),
                &params,
                out.view_mut(),
            )
            .unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{name} {} best {:.2} ms = {:.1} GFLOP/s",
        if gemm {
            "gemm"
        } else if dense {
            "dense"
        } else {
            "deform"
        },
        best * 1e3,
        wl.flops() / best / 1e9
    );
}
