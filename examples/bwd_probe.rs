//! Quick timing probe of the backward on the named workloads (min of several runs), for
//! development;
//! `ratio` times forward and full backward back to back (`ITERS` pairs) and prints the
//! median of the per-pair ratios.

use deformconv::{conv2d, conv2d_backward, deform_conv2d, deform_conv2d_backward, Want};
use ndarray::Array4;
use std::time::Instant;

fn main() {
    let is_workload = |a: &String| deformconv::workloads::all().any(|w| w.name == a.as_str());
    let which: Vec<String> = std::env::args().skip(1).filter(is_workload).collect();
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !is_workload(a))
        .collect();
    // ITERS: runs per measurement (min taken), e.g. large for profiling.
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for wl in deformconv::workloads::all() {
        if !which.is_empty() && !which.iter().any(|w| w == wl.name) {
            continue;
        }
        let ops = wl.operands();
        let g = wl.geometry();
        let go = Array4::from_shape_fn(g.out_shape(), |(a, b, c, d)| {
            ((a * 7 + b * 3 + c + d) % 11) as f32 * 0.1 - 0.5
        });
        let p = wl.params();
        for name in ["fwd", "dense_fwd+bwd"] {
            if !only.is_empty() && !only.iter().any(|w| w == name) {
                continue;
            }
            let mut best = f64::MAX;
            for _ in 0..iters {
                let t = Instant::now();
                if name == "fwd" {
                    let r = deform_conv2d(
                        ops.input.view(),
                        ops.offset.view(),
                        ops.mask.as_ref().map(|m| m.view()),
                        ops.weight.view(),
                        ops.bias.as_ref().map(|b| b.view()),
                        &p,
                    )
                    .unwrap();
                    std::hint::black_box(r);
                } else {
                    let r = conv2d(
                        ops.input.view(),
                        ops.weight.view(),
                        ops.bias.as_ref().map(|b| b.view()),
                        &p,
                    )
                    .unwrap();
                    let b = conv2d_backward(
                        go.view(),
                        ops.input.view(),
                        ops.weight.view(),
                        &p,
                        Want::ALL,
                    )
                    .unwrap();
                    std::hint::black_box((r, b));
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!("{} {name}: wall min {:.2} ms", wl.name, best * 1e3);
        }
        for (name, want) in [
            ("input", Want::NONE.input()),
            ("offset", Want::NONE.offset()),
            ("mask", Want::NONE.mask()),
            ("weight", Want::NONE.weight()),
            ("all", Want::ALL),
        ] {
            if !only.is_empty() && !only.iter().any(|w| w == name) {
                continue;
            }
            let mut best = f64::MAX;
            let mut times = Vec::new();
            let cpu0 = cpu_ms();
            let reps = iters;
            for _ in 0..reps {
                let t = Instant::now();
                let r = deform_conv2d_backward(
                    go.view(),
                    ops.input.view(),
                    ops.offset.view(),
                    ops.mask.as_ref().map(|m| m.view()),
                    ops.weight.view(),
                    &p,
                    want,
                )
                .unwrap();
                std::hint::black_box(r);
                best = best.min(t.elapsed().as_secs_f64());
                times.push(t.elapsed().as_secs_f64());
            }
            let cpu = (cpu_ms() - cpu0) / reps as f64;
            times.sort_by(f64::total_cmp);
            println!(
                "{} {name}: wall min {:.2} ms, median {:.2} ms, cpu {:.1} ms/run",
                wl.name,
                best * 1e3,
                times[times.len() / 2] * 1e3,
                cpu
            );
        }
        if only.iter().any(|w| w == "ratio") {
            // Forward and full backward back to back, `ITERS` pairs: on a machine whose speed
            // drifts, the per-pair ratio is steadier than a ratio of separate medians.
            let (mut fwd, mut bwd, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..iters {
                let t = Instant::now();
                let r = deform_conv2d(
                    ops.input.view(),
                    ops.offset.view(),
                    ops.mask.as_ref().map(|m| m.view()),
                    ops.weight.view(),
                    ops.bias.as_ref().map(|b| b.view()),
                    &p,
                )
                .unwrap();
                std::hint::black_box(r);
                let f = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let r = deform_conv2d_backward(
                    go.view(),
                    ops.input.view(),
                    ops.offset.view(),
                    ops.mask.as_ref().map(|m| m.view()),
                    ops.weight.view(),
                    &p,
                    Want::ALL,
                )
                .unwrap();
                std::hint::black_box(r);
                let b = t.elapsed().as_secs_f64();
                fwd.push(f);
                bwd.push(b);
                ratio.push(b / f);
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "{} ratio: {} pairs, median fwd {:.2} ms, median full bwd {:.2} ms, median bwd/fwd {:.2}",
                wl.name,
                iters,
                median(&mut fwd) * 1e3,
                median(&mut bwd) * 1e3,
                median(&mut ratio)
            );
        }
    }
}

/// utime + stime of the process in ms (10 ms ticks).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) * 10.0
}
