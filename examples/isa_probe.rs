//! Timing probe across element types and backends (min of `ITERS` runs, default 10):
//! `cargo run --release --example isa_probe -- W2 W4` prints, per workload, the deformable
//! forward, the dense forward and the full deformable backward in `f32` and `f64`, in ms and
//! GFLOP/s. Run it under `DEFORMCONV_ISA=avx512|avx2|portable|scalar` to compare backends.
//! `DTYPE=f32|f64` runs one element type only; `PARTS=fwd,dense,bwd,dbwd` (any subset; `dbwd` is the dense backward) times only
//! those parts (the others print as 0); `WANT=input,offset,mask,weight,bias` (any subset)
//! times the backward of those gradients only; `CONVENTION=mmcv|dcn_v1` samples by that
//! convention instead of torchvision's.

use deformconv::{
    conv2d, conv2d_backward, deform_conv2d, deform_conv2d_backward, Convention, Float, Want,
};
use ndarray::{Array1, Array4};
use std::time::Instant;

fn cast<T: Float>(a: &Array4<f32>) -> Array4<T> {
    a.mapv(|v| T::from_f64(v as f64))
}

fn best(iters: usize, mut f: impl FnMut()) -> f64 {
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
        .min(if iters == 0 { 0.0 } else { f64::MAX })
}

fn run<T: Float>(wl: &deformconv::workloads::Workload, iters: usize) {
    let ops = wl.operands();
    let (input, offset, weight, go) = (
        cast::<T>(&ops.input),
        cast::<T>(&ops.offset),
        cast::<T>(&ops.weight),
        cast::<T>(&ops.grad_out),
    );
    let mask = ops.mask.as_ref().map(cast::<T>);
    let bias: Option<Array1<T>> = ops.bias.as_ref().map(|b| b.mapv(|v| T::from_f64(v as f64)));
    let p = match std::env::var("CONVENTION").as_deref() {
        Ok("mmcv") => wl.params().convention(Convention::Mmcv),
        Ok("dcn_v1") => wl.params().convention(Convention::DcnV1),
        _ => wl.params(),
    };
    let gflop = wl.flops() / 1e9;
    let parts = std::env::var("PARTS").unwrap_or_default();
    let wants = |part: &str| parts.is_empty() || parts.split(',').any(|p| p == part);
    let iters_of = |part: &str| if wants(part) { iters } else { 0 };
    let fwd = best(iters_of("fwd"), || {
        let r = deform_conv2d(
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            bias.as_ref().map(|b| b.view()),
            &p,
        )
        .unwrap();
        std::hint::black_box(r);
    });
    let dense = best(iters_of("dense"), || {
        let r = conv2d(
            input.view(),
            weight.view(),
            bias.as_ref().map(|b| b.view()),
            &p,
        )
        .unwrap();
        std::hint::black_box(r);
    });
    // WANT=input,offset,mask,weight,bias (any subset) times only those gradients.
    let want = match std::env::var("WANT") {
        Ok(w) => {
            let has = |g: &str| w.split(',').any(|x| x == g);
            Want {
                input: has("input"),
                offset: has("offset"),
                mask: has("mask"),
                weight: has("weight"),
                bias: has("bias"),
            }
        }
        Err(_) => Want::ALL,
    };
    let bwd = best(iters_of("bwd"), || {
        let r = deform_conv2d_backward(
            go.view(),
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            &p,
            want,
        )
        .unwrap();
        std::hint::black_box(r);
    });
    let dense_bwd = best(iters_of("dbwd"), || {
        let r = conv2d_backward(go.view(), input.view(), weight.view(), &p, want).unwrap();
        std::hint::black_box(r);
    });
    println!(
        "{} {}: forward {:.3} ms ({:.1} GFLOP/s), dense forward {:.3} ms ({:.1}), full backward {:.3} ms ({:.1} at 2x the forward's flops), dense backward {:.3} ms",
        wl.name,
        T::NAME,
        fwd * 1e3,
        gflop / fwd,
        dense * 1e3,
        gflop / dense,
        bwd * 1e3,
        2.0 * gflop / bwd,
        dense_bwd * 1e3
    );
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for wl in deformconv::workloads::all() {
        if !names.is_empty() && !names.iter().any(|n| n == wl.name) {
            continue;
        }
        let dtype = std::env::var("DTYPE").unwrap_or_default();
        if dtype != "f64" {
            run::<f32>(&wl, iters);
        }
        if dtype != "f32" {
            run::<f64>(&wl, iters);
        }
    }
}
