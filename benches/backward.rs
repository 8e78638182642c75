//! Backward benchmarks on every workload (`deformconv::workloads::all`; float32): each
//! gradient alone, the full backward (every gradient the workload has), our forward alone,
//! deformable forward + full backward, and our dense conv forward + backward on the same
//! shapes, so that every ratio comes from one run. Throughput counts the forward FLOPs
//! (`2 N C_out C_in k k H_out W_out`); for forward + backward multiply the reported rate by 3.
//!
//! `cargo bench --bench backward -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deformconv::workloads::{self, Workload};
use deformconv::{
    conv2d_backward_into, conv2d_into, deform_conv2d_backward_into, deform_conv2d_into, GradsMut,
};
use ndarray::{Array1, Array4};
use std::hint::black_box;

/// Preallocated gradient buffers of a workload.
struct Buffers {
    input: Array4<f32>,
    offset: Array4<f32>,
    mask: Array4<f32>,
    weight: Array4<f32>,
    bias: Array1<f32>,
    out: Array4<f32>,
}

impl Buffers {
    fn new(wl: &Workload) -> Self {
        let g = wl.geometry();
        Buffers {
            input: Array4::zeros(g.input_shape()),
            offset: Array4::zeros(g.offset_shape()),
            mask: Array4::zeros(g.mask_shape()),
            weight: Array4::zeros(g.weight_shape()),
            bias: Array1::zeros(g.c_out),
            out: Array4::zeros(g.out_shape()),
        }
    }

    /// The outputs selected by the flags `(input, offset, mask, weight, bias)`.
    fn select(&mut self, (i, o, m, w, b): (bool, bool, bool, bool, bool)) -> GradsMut<'_, f32> {
        GradsMut {
            input: i.then(|| self.input.view_mut()),
            offset: o.then(|| self.offset.view_mut()),
            mask: m.then(|| self.mask.view_mut()),
            weight: w.then(|| self.weight.view_mut()),
            bias: b.then(|| self.bias.view_mut()),
        }
    }
}

fn backward(c: &mut Criterion) {
    for wl in workloads::all() {
        let ops = wl.operands();
        let params = wl.params();
        let grad_out = &ops.grad_out;
        let mut buf = Buffers::new(&wl);
        let mask = ops.mask.as_ref().map(|m| m.view());
        let full = (true, true, wl.mask, true, wl.bias);
        let mut group = c.benchmark_group(format!("bwd/{}", wl.name));
        group.throughput(Throughput::Elements(wl.flops() as u64));
        group.sample_size(10);
        let deform = !wl.name.starts_with("W3") || wl.name == "W3-3x3";

        let bwd = |buf: &mut Buffers, sel| {
            deform_conv2d_backward_into(
                grad_out.view(),
                ops.input.view(),
                ops.offset.view(),
                mask,
                ops.weight.view(),
                &params,
                buf.select(sel),
            )
            .unwrap();
        };
        let fwd = |out: &mut Array4<f32>| {
            deform_conv2d_into(
                ops.input.view(),
                ops.offset.view(),
                mask,
                ops.weight.view(),
                ops.bias.as_ref().map(|b| b.view()),
                &params,
                out.view_mut(),
            )
            .unwrap();
        };
        if deform {
            let singles = [
                ("grad_input", (true, false, false, false, false)),
                ("grad_offset", (false, true, false, false, false)),
                ("grad_mask", (false, false, true, false, false)),
                ("grad_weight", (false, false, false, true, false)),
            ];
            for (name, sel) in singles {
                if name == "grad_mask" && !wl.mask {
                    continue;
                }
                group.bench_function(name, |b| b.iter(|| bwd(black_box(&mut buf), sel)));
            }
            group.bench_function("backward_full", |b| {
                b.iter(|| bwd(black_box(&mut buf), full))
            });
            group.bench_function("forward", |b| b.iter(|| fwd(black_box(&mut buf.out))));
            group.bench_function("fwd+bwd", |b| {
                b.iter(|| {
                    fwd(&mut buf.out);
                    bwd(black_box(&mut buf), full);
                })
            });
        }
        let dense_sel = (true, false, false, true, wl.bias);
        group.bench_function("dense_fwd+bwd", |b| {
            b.iter(|| {
                conv2d_into(
                    ops.input.view(),
                    ops.weight.view(),
                    ops.bias.as_ref().map(|b| b.view()),
                    &params,
                    buf.out.view_mut(),
                )
                .unwrap();
                conv2d_backward_into(
                    grad_out.view(),
                    ops.input.view(),
                    ops.weight.view(),
                    &params,
                    buf.select(dense_sel),
                )
                .unwrap();
                black_box(&buf.input);
            })
        });
        group.finish();
    }
}

criterion_group!(benches, backward);
criterion_main!(benches);
