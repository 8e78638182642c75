//! Layout benchmarks (issue 7), f32:
//! - the cost of the NHWC conversion: `nhwc::deform_conv2d` (NHWC tensors, HWIO weights:
//!   transposes in, NCHW fast path, transpose out) against `deform_conv2d_into` on the same
//!   numbers in NCHW, on W2 and W4;
//! - W3 (N=32, C_in=30, C_out=64, 64x64): dense 5x5 pad 2, dense 3x3 pad 1, dilated 3x3
//!   dilation 2 pad 2, forward (`conv2d_into`) and forward + backward (`conv2d_into` then
//!   `conv2d_backward_into` with every gradient), so that the dilated/dense ratios come from
//!   one run.
//!
//! `cargo bench --bench layout -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deformconv::layout::{from_oihw, nchw_to_nhwc, Flip, WeightLayout};
use deformconv::workloads::{Workload, WORKLOADS};
use deformconv::{conv2d_backward_into, conv2d_into, deform_conv2d_into, nhwc, GradsMut};
use ndarray::{Array1, Array4};
use std::hint::black_box;

fn workload(name: &str) -> Workload {
    *WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .expect("workload defined in benches/workloads")
}

/// NHWC forward (with conversions) against the NCHW forward, on the deformable workloads.
fn nhwc_overhead(c: &mut Criterion) {
    for name in ["W2", "W4"] {
        let wl = workload(name);
        let g = wl.geometry();
        let ops = wl.operands();
        let params = wl.params();
        let input = nchw_to_nhwc(ops.input.view());
        let offset = nchw_to_nhwc(ops.offset.view());
        let mask = ops.mask.as_ref().map(|m| nchw_to_nhwc(m.view()));
        let hwio = from_oihw(ops.weight.view(), WeightLayout::Hwio, Flip::None);
        let mut out = Array4::<f32>::zeros(g.out_shape());
        let mut group = c.benchmark_group(format!("{name}-layout"));
        group.throughput(Throughput::Elements(wl.flops() as u64));
        group.sample_size(10);
        group.bench_function("nchw", |b| {
            b.iter(|| {
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
                black_box(&out);
            })
        });
        group.bench_function("nhwc", |b| {
            b.iter(|| {
                let out = nhwc::deform_conv2d(
                    input.view(),
                    offset.view(),
                    mask.as_ref().map(|m| m.view()),
                    hwio.view(),
                    WeightLayout::Hwio,
                    ops.bias.as_ref().map(|b| b.view()),
                    &params,
                )
                .unwrap();
                black_box(out);
            })
        });
        group.finish();
    }
}

/// W3: dense 5x5, dense 3x3, dilated 3x3; forward and forward + full backward.
fn w3(c: &mut Criterion) {
    for name in ["W3-5x5", "W3-3x3", "W3-3x3d2"] {
        let wl = workload(name);
        let g = wl.geometry();
        let ops = wl.operands();
        let params = wl.params();
        let mut out = Array4::<f32>::zeros(g.out_shape());
        // grad_out: the output itself is as good as any (finite, the right shape).
        conv2d_into(
            ops.input.view(),
            ops.weight.view(),
            None,
            &params,
            out.view_mut(),
        )
        .unwrap();
        let grad_out = out.clone();
        let mut gi = Array4::<f32>::zeros(g.input_shape());
        let mut gw = Array4::<f32>::zeros(g.weight_shape());
        let mut gb = Array1::<f32>::zeros(g.c_out);
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(wl.flops() as u64));
        group.sample_size(10);
        group.bench_function("forward", |b| {
            b.iter(|| {
                conv2d_into(
                    ops.input.view(),
                    ops.weight.view(),
                    None,
                    &params,
                    out.view_mut(),
                )
                .unwrap();
                black_box(&out);
            })
        });
        group.bench_function("forward+backward", |b| {
            b.iter(|| {
                conv2d_into(
                    ops.input.view(),
                    ops.weight.view(),
                    None,
                    &params,
                    out.view_mut(),
                )
                .unwrap();
                conv2d_backward_into(
                    grad_out.view(),
                    ops.input.view(),
                    ops.weight.view(),
                    &params,
                    GradsMut {
                        input: Some(gi.view_mut()),
                        weight: Some(gw.view_mut()),
                        bias: Some(gb.view_mut()),
                        ..GradsMut::default()
                    },
                )
                .unwrap();
                black_box((&out, &gi, &gw, &gb));
            })
        });
        group.finish();
    }
}

criterion_group!(benches, nhwc_overhead, w3);
criterion_main!(benches);
