//! `deformconv bench [--quick] [--repeats N]`: the workloads W1–W4 of the users' reports and the
//! batch-1 layers of deployed DCN models (`deformconv::workloads`), in float32, deformable
//! forward and backward (every gradient) against our dense convolution on the same shapes.
//! Medians over `N` timed runs after one warm-up; threads from the crate's pool
//! (`RAYON_NUM_THREADS`, else one per core).
//!
//! FLOPs: `2 * N * C_out * (C_in/groups) * kh * kw * H_out * W_out` for a forward; a backward is
//! counted as twice that (the `grad_input` and `grad_weight` products), the offset and mask
//! gradients on top of it are not counted.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use deformconv::workloads::{self, Workload};
use deformconv::Want;
use ndarray::Array4;

use crate::args::BenchArgs;
use crate::failure::{Failure, Outcome};
use crate::output::say;

/// The workloads, with `--quick` dividing every batch by 16 and halving the height and width
/// of the batch-1 layers (each at least 1).
fn workloads(quick: bool) -> Vec<Workload> {
    workloads::all()
        .map(|w| match (quick, w.n) {
            (false, _) => w,
            (true, 1) => Workload {
                h: (w.h / 2).max(1),
                w: (w.w / 2).max(1),
                ..w
            },
            (true, n) => w.with_batch((n / 16).max(1)),
        })
        .collect()
}

/// Progress on stderr: one line rewritten in place on a terminal, one line per step otherwise.
struct Progress {
    tty: bool,
    total: usize,
}

impl Progress {
    fn show(&self, step: usize, what: &str) {
        let line = format!("[{}/{}] {what}", step + 1, self.total);
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
    fn done(&self) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// The wall times of one measurement.
#[derive(Clone, Copy)]
struct Timing {
    median: Duration,
    min: Duration,
}

/// Median and minimum wall time of `repeats` runs of `f` after one warm-up run. Both are
/// reported: on a shared machine the median is what a user sees, the minimum what the code
/// does undisturbed, and their distance is the machine's noise.
fn timing(repeats: usize, mut f: impl FnMut() -> deformconv::Result<()>) -> Outcome<Timing> {
    let fail = |e: deformconv::Error| Failure::bad(format!("bench: {e}"));
    f().map_err(fail)?;
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t = Instant::now();
        f().map_err(fail)?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(Timing {
        median: times[times.len() / 2],
        min: times[0],
    })
}

/// Timings of one workload.
struct Row {
    name: &'static str,
    out_shape: [usize; 4],
    gflop: f64,
    fwd: Timing,
    dense_fwd: Timing,
    bwd: Timing,
    dense_bwd: Timing,
    checksum_out: f64,
    checksum_grads: f64,
}

fn sum(a: &Array4<f32>) -> f64 {
    a.iter().map(|&v| f64::from(v)).sum()
}

fn measure(w: &Workload, repeats: usize, progress: &Progress, step: usize) -> Outcome<Row> {
    let g = w.geometry();
    let ops = w.operands();
    let params = w.params();
    let (x, off, wt, go, p) = (
        ops.input.view(),
        ops.offset.view(),
        ops.weight.view(),
        ops.grad_out.view(),
        &params,
    );
    let mask = ops.mask.as_ref().map(|m| m.view());
    let bias = ops.bias.as_ref().map(|b| b.view());
    let mut out = Array4::<f32>::zeros(g.out_shape());
    let label = |what: &str| format!("{}: {what} ({repeats} runs)", w.name);

    progress.show(step, &label("deformable forward"));
    let fwd = timing(repeats, || {
        deformconv::deform_conv2d_into(x, off, mask, wt, bias, p, out.view_mut())
    })?;
    let checksum_out = sum(&out);

    progress.show(step, &label("dense forward"));
    let dense_fwd = timing(repeats, || {
        deformconv::conv2d_into(x, wt, bias, p, out.view_mut())
    })?;

    let want = Want {
        mask: w.mask,
        bias: w.bias,
        ..Want::ALL
    };
    progress.show(step, &label("deformable backward"));
    let mut checksum_grads = 0.0;
    let bwd = timing(repeats, || {
        let grads = deformconv::deform_conv2d_backward(go, x, off, mask, wt, p, want)?;
        checksum_grads = [grads.input, grads.offset, grads.mask, grads.weight]
            .iter()
            .flatten()
            .map(sum)
            .sum();
        Ok(())
    })?;

    progress.show(step, &label("dense backward"));
    let dense_want = Want {
        offset: false,
        mask: false,
        ..want
    };
    let dense_bwd = timing(repeats, || {
        deformconv::conv2d_backward(go, x, wt, p, dense_want).map(|_| ())
    })?;

    Ok(Row {
        name: w.name,
        out_shape: g.out_shape(),
        gflop: g.forward_flops() / 1e9,
        fwd,
        dense_fwd,
        bwd,
        dense_bwd,
        checksum_out,
        checksum_grads,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn rate(gflop: f64, d: Duration) -> String {
    format!("{:.1}", gflop / d.as_secs_f64())
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
}

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        say(format_args!("{}", text.join("  ")));
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// This CPU's multiply-add peak for `T` on the kernels' backend and threads.
fn peak<T: deformconv::Float>() -> deformconv::peak::Peak {
    deformconv::peak::fma_peak::<T>(7, Duration::from_millis(20))
}

/// `bench --peak`: the peaks alone.
fn print_peaks() {
    for (ty, p) in [("f32", peak::<f32>()), ("f64", peak::<f64>())] {
        say(format_args!(
            "{ty} multiply-add peak: {:.1} GFLOP/s ({} backend, {} thread(s), {:.1} per thread)",
            p.gflops,
            p.backend,
            p.threads,
            p.gflops / p.threads as f64
        ));
    }
}

/// Runs the command.
pub fn bench(args: &BenchArgs) -> Outcome<()> {
    if args.peak {
        print_peaks();
        return Ok(());
    }
    let list = workloads(args.quick);
    let progress = Progress {
        tty: std::io::stderr().is_terminal(),
        total: list.len(),
    };
    say(format_args!(
        "deformconv bench{}: float32, {} thread(s), median and minimum of {} run(s) after a warm-up; GFLOP/s, % peak and ratios at the medians",
        if args.quick { " --quick" } else { "" },
        deformconv::current_num_threads(),
        args.repeats
    ));
    let started = Instant::now();
    let peak = peak::<f32>();
    say(format_args!(
        "f32 multiply-add peak of this CPU: {:.1} GFLOP/s ({} backend, {} thread(s)); \"% peak\" below is the share of it",
        peak.gflops, peak.backend, peak.threads
    ));
    let share =
        |gflop: f64, d: Duration| format!("{:.0}%", 100.0 * gflop / d.as_secs_f64() / peak.gflops);
    let mut rows = Vec::new();
    for (step, w) in list.iter().enumerate() {
        rows.push(measure(w, args.repeats as usize, &progress, step)?);
    }
    progress.done();

    say("");
    say(format_args!(
        "forward (deform_conv2d vs conv2d on the same shapes)"
    ));
    print_table(
        &[
            "workload",
            "output",
            "GFLOP",
            "deform ms",
            "min",
            "GFLOP/s",
            "% peak",
            "dense ms",
            "min",
            "GFLOP/s",
            "% peak",
            "deform/dense",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.name.to_string(),
                    format!("{:?}", r.out_shape),
                    format!("{:.3}", r.gflop),
                    ms(r.fwd.median),
                    ms(r.fwd.min),
                    rate(r.gflop, r.fwd.median),
                    share(r.gflop, r.fwd.median),
                    ms(r.dense_fwd.median),
                    ms(r.dense_fwd.min),
                    rate(r.gflop, r.dense_fwd.median),
                    share(r.gflop, r.dense_fwd.median),
                    ratio(r.fwd.median, r.dense_fwd.median),
                ]
            })
            .collect::<Vec<_>>(),
    );
    say("");
    say(format_args!(
        "backward, every gradient (GFLOP/s counts 2x the forward FLOPs)"
    ));
    print_table(
        &[
            "workload",
            "deform ms",
            "min",
            "GFLOP/s",
            "% peak",
            "bwd/fwd",
            "dense ms",
            "min",
            "GFLOP/s",
            "% peak",
            "deform/dense",
            "sum(out)",
            "sum(grads)",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.name.to_string(),
                    ms(r.bwd.median),
                    ms(r.bwd.min),
                    rate(2.0 * r.gflop, r.bwd.median),
                    share(2.0 * r.gflop, r.bwd.median),
                    ratio(r.bwd.median, r.fwd.median),
                    ms(r.dense_bwd.median),
                    ms(r.dense_bwd.min),
                    rate(2.0 * r.gflop, r.dense_bwd.median),
                    share(2.0 * r.gflop, r.dense_bwd.median),
                    ratio(r.bwd.median, r.dense_bwd.median),
                    format!("{:.6e}", r.checksum_out),
                    format!("{:.6e}", r.checksum_grads),
                ]
            })
            .collect::<Vec<_>>(),
    );
    say("");
    say(format_args!(
        "total {:.1} s. bwd/fwd: the deformable backward's median over its forward's; sum(out): deformable forward output; sum(grads): grad_input + grad_offset + grad_mask + grad_weight",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
