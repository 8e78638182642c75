//! Forward benchmarks on every workload (`deformconv::workloads::all`: the users' reports and the
//! batch-1 layers of deployed models): our deformable forward, our dense conv on
//! the same shapes, our GEMM alone on exactly the forward's tiles (`gemm`: the forward with
//! the gathers skipped) and matrixmultiply's sgemm on the same matrix shape (`gemm_mm`: one
//! `C_out x (C_in * k * k) x (H_out * W_out)` product per image, images in parallel), so the
//! ratios come from one run. Throughput is reported in FLOP/s
//! (`2 * N * C_out * C_in * k * k * H_out * W_out`).
//!
//! `cargo bench --bench forward -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deformconv::workloads;
use deformconv::{conv2d_gemm_only_into, conv2d_into, deform_conv2d_into};
use ndarray::Array4;
use rayon::prelude::*;
use std::hint::black_box;

/// matrixmultiply's GEMM: `out[n] = weight · cols[n]`, images in parallel.
fn gemm_alone(m: usize, k: usize, p: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    c.par_chunks_mut(m * p).for_each(|cn| {
        // SAFETY: a is m x k, b is k x p, cn is m x p, all row-major and disjoint.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                p,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                p as isize,
                1,
                0.0,
                cn.as_mut_ptr(),
                p as isize,
                1,
            )
        }
    });
}

fn forward(c: &mut Criterion) {
    for wl in workloads::all() {
        let g = wl.geometry();
        let ops = wl.operands();
        let params = wl.params();
        let mut out = Array4::<f32>::zeros(g.out_shape());
        let mut group = c.benchmark_group(wl.name);
        group.throughput(Throughput::Elements(wl.flops() as u64));
        group.sample_size(20);
        let dense_only = wl.name.starts_with("W3");
        if !dense_only || wl.name == "W3-3x3" {
            group.bench_function("deform", |bch| {
                bch.iter(|| {
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
        }
        group.bench_function("dense", |bch| {
            bch.iter(|| {
                conv2d_into(
                    ops.input.view(),
                    ops.weight.view(),
                    ops.bias.as_ref().map(|b| b.view()),
                    &params,
                    out.view_mut(),
                )
                .unwrap();
                black_box(&out);
            })
        });
        group.bench_function("gemm", |bch| {
            bch.iter(|| {
                conv2d_gemm_only_into(
                    ops.input.view(),
                    ops.weight.view(),
                    ops.bias.as_ref().map(|b| b.view()),
                    &params,
                    out.view_mut(),
                )
                .unwrap();
                black_box(&out);
            })
        });
        let (m, k, p) = (g.c_out, g.c_in * g.taps(), g.out_pixels());
        let a = ops.weight.as_slice().unwrap().to_vec();
        let b = vec![0.5f32; k * p];
        let mut cbuf = vec![0.0f32; g.n * m * p];
        group.bench_function("gemm_mm", |bch| {
            bch.iter(|| {
                gemm_alone(m, k, p, &a, &b, &mut cbuf);
                black_box(&cbuf);
            })
        });
        group.finish();
    }
}

criterion_group!(benches, forward);
criterion_main!(benches);
