//! The statistical check: calibrated on correct f32 kernels (our fast path over 500+ random
//! problems and a range of layer sizes: no false alarm), and catching f32 kernels that secretly
//! multiply in TF32 or accumulate in f16 on a 2x256x16x16 layer, where the worst-case bound
//! alone lets them through. Run with `--nocapture` to see the calibration figures quoted in
//! docs/oracle-guide.md.
#![cfg(feature = "testing")]

use std::collections::BTreeMap;

use deformconv::compare::{
    exact_results, Operands, Options, Oracle, Output, Precision, Report, DEFAULT_STATISTICAL_LIMIT,
};
use deformconv::testing::{problems, Problem};
use deformconv::{ConvParams, Want};
use ndarray::{Array1, Array4, ArrayD};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn randn(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// A DCN v2 layer `N x C x H x H -> C_out`, `k x k`, padding `k / 2`, offsets `randn`.
fn layer(n: usize, c: usize, h: usize, c_out: usize, k: usize, seed: u64) -> Problem<f32> {
    let mut r = Rng(seed);
    let t = k * k;
    let mut a = |shape: [usize; 4], s: f32| Array4::from_shape_simple_fn(shape, || s * r.randn());
    let input = a([n, c, h, h], 1.0);
    let offset = a([n, 2 * t, h, h], 1.0);
    let mask = a([n, t, h, h], 0.5).mapv(|v| v + 0.5);
    let weight = a([c_out, c, k, k], 1.0 / (c as f32 * t as f32).sqrt());
    let grad_out = a([n, c_out, h, h], 1.0);
    Problem {
        input,
        offset,
        mask: Some(mask),
        weight,
        bias: Some(Array1::from_shape_fn(c_out, |o| o as f32 * 0.1 - 0.3)),
        grad_out,
        params: ConvParams::default().padding(k / 2, k / 2),
    }
}

fn to64(a: &Array4<f32>) -> Array4<f64> {
    a.mapv(f64::from)
}

/// Every result of our fast f32 path.
fn fast(p: &Problem<f32>) -> BTreeMap<Output, ArrayD<f64>> {
    let mv = p.mask.as_ref().map(|m| m.view());
    let out = deformconv::deform_conv2d(
        p.input.view(),
        p.offset.view(),
        mv,
        p.weight.view(),
        p.bias.as_ref().map(|b| b.view()),
        &p.params,
    )
    .unwrap();
    let mut want = Want::ALL;
    want.mask = p.mask.is_some();
    want.bias = p.bias.is_some();
    let g = deformconv::deform_conv2d_backward(
        p.grad_out.view(),
        p.input.view(),
        p.offset.view(),
        mv,
        p.weight.view(),
        &p.params,
        want,
    )
    .unwrap();
    let mut r = BTreeMap::new();
    r.insert(Output::Out, to64(&out).into_dyn());
    r.insert(Output::GradInput, to64(&g.input.unwrap()).into_dyn());
    r.insert(Output::GradOffset, to64(&g.offset.unwrap()).into_dyn());
    if let Some(m) = g.mask {
        r.insert(Output::GradMask, to64(&m).into_dyn());
    }
    r.insert(Output::GradWeight, to64(&g.weight.unwrap()).into_dyn());
    if let Some(b) = g.bias {
        r.insert(Output::GradBias, b.mapv(f64::from).into_dyn());
    }
    r
}

/// Judges `actual` (some of `p`'s results) at f32 with the default options.
fn judge(p: &Problem<f32>, actual: &BTreeMap<Output, ArrayD<f64>>, backward: bool) -> Report {
    let (x, off, w, go) = (
        to64(&p.input),
        to64(&p.offset),
        to64(&p.weight),
        to64(&p.grad_out),
    );
    let m = p.mask.as_ref().map(to64);
    let b = p.bias.as_ref().map(|b| b.mapv(f64::from));
    let ops = Operands {
        input: x.view(),
        offset: off.view(),
        mask: m.as_ref().map(|m| m.view()),
        weight: w.view(),
        bias: b.as_ref().map(|b| b.view()),
        grad_out: backward.then(|| go.view()),
        params: p.params,
    };
    let oracle = Oracle::new(&ops, &Options::precision(Precision::F32)).unwrap();
    let exact = exact_results(&ops).unwrap();
    let triples: Vec<_> = actual
        .iter()
        .map(|(o, a)| (*o, exact[o].view(), a.view()))
        .collect();
    oracle.report(&triples).unwrap()
}

/// The largest statistic per tensor over `reports`, and over the tensors the check judges.
fn record(worst: &mut BTreeMap<Output, f64>, report: &Report) {
    for t in &report.tensors {
        if let Some(s) = t.statistic {
            let w = worst.entry(t.output).or_insert(0.0);
            *w = w.max(s);
        }
    }
}

#[test]
fn no_false_alarm_on_correct_f32_results() {
    let mut runner = TestRunner::deterministic();
    let mut worst = BTreeMap::new();
    let mut cases = 0;
    for _ in 0..520 {
        let p = problems::<f32>().new_tree(&mut runner).unwrap().current();
        let report = judge(&p, &fast(&p), true);
        assert!(report.passed(), "{report}");
        record(&mut worst, &report);
        cases += 1;
    }
    eprintln!("generated problems ({cases}): largest statistic per tensor {worst:?}");
    // Layers across sizes: channels 1..256, kernels 1, 3, 5, images up to 24x24.
    let mut worst_layers = BTreeMap::new();
    let sizes = [
        (1, 1, 6, 1, 1),
        (2, 3, 9, 4, 3),
        (2, 8, 12, 16, 3),
        (1, 16, 16, 8, 5),
        (2, 32, 12, 32, 3),
        (2, 64, 16, 16, 3),
        (1, 128, 8, 64, 3),
        (2, 256, 16, 16, 3),
        (1, 4, 24, 4, 5),
    ];
    for (i, &(n, c, h, c_out, k)) in sizes.iter().enumerate() {
        for seed in 0..2 {
            let p = layer(n, c, h, c_out, k, 100 * i as u64 + seed);
            let report = judge(&p, &fast(&p), true);
            assert!(
                report.passed(),
                "{n}x{c}x{h}x{h} -> {c_out}, {k}x{k}:\n{report}"
            );
            record(&mut worst_layers, &report);
            cases += 1;
        }
    }
    eprintln!("layers: largest statistic per tensor {worst_layers:?}");
    assert!(cases >= 500);
}

/// `out` of a plain f32 loop kernel (torchvision's formulas: positions in f32, bilinear in
/// f32), with every product's factors passed through `factor` and every partial sum through
/// `acc`.
fn loop_forward(
    p: &Problem<f32>,
    factor: impl Fn(f32) -> f32,
    acc: impl Fn(f32) -> f32,
) -> ArrayD<f64> {
    let [n, c, h, w] = [0, 1, 2, 3].map(|i| p.input.shape()[i]);
    let (c_out, kh, kw) = (
        p.weight.shape()[0],
        p.weight.shape()[2],
        p.weight.shape()[3],
    );
    let (ph, pw) = (p.params.padding.top as f32, p.params.padding.left as f32);
    let sample = |b: usize, ch: usize, py: f32, px: f32| -> f32 {
        if py <= -1.0 || py >= h as f32 || px <= -1.0 || px >= w as f32 {
            return 0.0;
        }
        let (y0, x0) = (py.floor(), px.floor());
        let (ly, lx) = (py - y0, px - x0);
        let v = |r: f32, s: f32| {
            if r >= 0.0 && r < h as f32 && s >= 0.0 && s < w as f32 {
                p.input[[b, ch, r as usize, s as usize]]
            } else {
                0.0
            }
        };
        (1.0 - ly) * (1.0 - lx) * v(y0, x0)
            + (1.0 - ly) * lx * v(y0, x0 + 1.0)
            + ly * (1.0 - lx) * v(y0 + 1.0, x0)
            + ly * lx * v(y0 + 1.0, x0 + 1.0)
    };
    // Columns m * B once: [n][c][k][y][x].
    let mut cols = vec![0.0f32; n * c * kh * kw * h * w];
    for b in 0..n {
        for ch in 0..c {
            for i in 0..kh {
                for j in 0..kw {
                    let k = i * kw + j;
                    for y in 0..h {
                        for x in 0..w {
                            let py = (y + i) as f32 - ph + p.offset[[b, 2 * k, y, x]];
                            let px = (x + j) as f32 - pw + p.offset[[b, 2 * k + 1, y, x]];
                            let m = p.mask.as_ref().map_or(1.0, |m| m[[b, k, y, x]]);
                            cols[(((b * c + ch) * kh * kw + k) * h + y) * w + x] =
                                m * sample(b, ch, py, px);
                        }
                    }
                }
            }
        }
    }
    let out = Array4::from_shape_fn((n, c_out, h, w), |(b, o, y, x)| {
        let mut s = p.bias.as_ref().map_or(0.0, |bias| bias[o]);
        for ch in 0..c {
            for i in 0..kh {
                for j in 0..kw {
                    let col = cols[(((b * c + ch) * kh * kw + i * kw + j) * h + y) * w + x];
                    s = acc(s + factor(p.weight[[o, ch, i, j]]) * factor(col));
                }
            }
        }
        f64::from(s)
    });
    out.into_dyn()
}

#[test]
fn tf32_products_and_f16_accumulation_are_caught_on_a_large_layer() {
    let p = layer(2, 256, 16, 32, 3, 7);
    let judge_out = |out: ArrayD<f64>| {
        let mut r = BTreeMap::new();
        r.insert(Output::Out, out);
        judge(&p, &r, false)
    };
    let same = |v: f32| v;
    let tf32 = |v: f32| Precision::Tf32.round(f64::from(v)) as f32;
    let f16 = |v: f32| Precision::F16.round(f64::from(v)) as f32;

    let correct = judge_out(loop_forward(&p, same, same));
    let with_tf32 = judge_out(loop_forward(&p, tf32, same));
    let with_f16_acc = judge_out(loop_forward(&p, same, f16));
    let stat = |r: &Report| r.get(Output::Out).unwrap().statistic.unwrap();
    let ratio = |r: &Report| r.get(Output::Out).unwrap().max_bound_ratio.unwrap();
    eprintln!(
        "2x256x16x16 -> 32, 3x3 (L = 2307), out: statistic / err-bound ratio: correct f32 {:.3} / {:.3e}, TF32 products {:.3} / {:.3e}, f16 accumulation {:.3} / {:.3e} (limit {DEFAULT_STATISTICAL_LIMIT})",
        stat(&correct),
        ratio(&correct),
        stat(&with_tf32),
        ratio(&with_tf32),
        stat(&with_f16_acc),
        ratio(&with_f16_acc)
    );
    assert!(correct.passed(), "{correct}");
    assert!(!with_tf32.statistical_passed(), "{with_tf32}");
    assert!(!with_tf32.passed());
    assert!(!with_f16_acc.statistical_passed(), "{with_f16_acc}");
    assert!(!with_f16_acc.passed());
}
