//! The oracle's judgement (`compare::Oracle`): positions within rounding, precision profiles,
//! conventions, and the statistical check, against small test kernels written here.

use std::collections::BTreeMap;

use deformconv::compare::{exact_results, Operands, Options, Oracle, Output, Precision, Report};
use deformconv::{ConvParams, Convention, Want};
use ndarray::{Array1, Array4, ArrayD};

/// A problem in f64 (every value representable in f32 unless a test says otherwise).
#[derive(Clone)]
struct Case {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    weight: Array4<f64>,
    bias: Option<Array1<f64>>,
    grad_out: Array4<f64>,
    params: ConvParams,
}

type Results = BTreeMap<Output, ArrayD<f64>>;

/// Deterministic normal numbers (SplitMix64 + Box-Muller).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn randn(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn f32n(&mut self, scale: f64) -> f64 {
        (scale * self.randn()) as f32 as f64
    }
}

fn arr(shape: [usize; 4], mut f: impl FnMut() -> f64) -> Array4<f64> {
    Array4::from_shape_simple_fn(shape, &mut f)
}

impl Case {
    /// `N x C x H x W` input, `C_out` outputs, `k x k` kernel with padding `k / 2`, a mask and a
    /// bias, offsets `s * randn` (rounded to f32).
    #[allow(clippy::too_many_arguments)]
    fn random(n: usize, c: usize, h: usize, c_out: usize, k: usize, s: f64, seed: u64) -> Case {
        let mut r = Rng(seed);
        let params = ConvParams::default().padding(k / 2, k / 2);
        let taps = k * k;
        Case {
            input: arr([n, c, h, h], || r.f32n(1.0)),
            offset: arr([n, 2 * taps, h, h], || r.f32n(s)),
            mask: Some(arr([n, taps, h, h], || (r.unit() * 1.5) as f32 as f64)),
            weight: arr([c_out, c, k, k], || r.f32n(0.3)),
            bias: Some(Array1::from_shape_fn(c_out, |_| r.f32n(1.0))),
            grad_out: arr([n, c_out, h, h], || r.f32n(1.0)),
            params,
        }
    }

    fn ops(&self) -> Operands<'_> {
        Operands {
            input: self.input.view(),
            offset: self.offset.view(),
            mask: self.mask.as_ref().map(|m| m.view()),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            grad_out: Some(self.grad_out.view()),
            params: self.params,
        }
    }

    fn exact(&self) -> Results {
        exact_results(&self.ops()).unwrap()
    }

    /// Our fast f32 path, every result.
    fn fast_f32(&self) -> Results {
        let f = |a: &Array4<f64>| a.mapv(|v| v as f32);
        let (x, off, w, go) = (
            f(&self.input),
            f(&self.offset),
            f(&self.weight),
            f(&self.grad_out),
        );
        let m = self.mask.as_ref().map(f);
        let b = self.bias.as_ref().map(|b| b.mapv(|v| v as f32));
        let mv = m.as_ref().map(|m| m.view());
        let p = &self.params;
        let out = deformconv::deform_conv2d(
            x.view(),
            off.view(),
            mv,
            w.view(),
            b.as_ref().map(|b| b.view()),
            p,
        )
        .unwrap();
        let want = if m.is_some() {
            Want::ALL
        } else {
            Want::ALL.mask_off()
        };
        let gr = deformconv::deform_conv2d_backward(
            go.view(),
            x.view(),
            off.view(),
            mv,
            w.view(),
            p,
            want,
        )
        .unwrap();
        let d = |a: Array4<f32>| a.mapv(f64::from).into_dyn();
        let mut r = BTreeMap::new();
        r.insert(Output::Out, d(out));
        r.insert(Output::GradInput, d(gr.input.unwrap()));
        r.insert(Output::GradOffset, d(gr.offset.unwrap()));
        if let Some(gm) = gr.mask {
            r.insert(Output::GradMask, d(gm));
        }
        r.insert(Output::GradWeight, d(gr.weight.unwrap()));
        if self.bias.is_some() {
            r.insert(
                Output::GradBias,
                gr.bias.unwrap().mapv(f64::from).into_dyn(),
            );
        }
        r
    }

    /// The offsets with every sample position as f32 forms it, torchvision's way
    /// (`(float)(base) + offset`), written back as `position - base`.
    fn f32_positions(&self) -> Array4<f64> {
        let (k, kw) = (
            self.weight.shape()[2] * self.weight.shape()[3],
            self.weight.shape()[3],
        );
        let p = &self.params;
        Array4::from_shape_fn(self.offset.dim(), |(n, ch, y, x)| {
            let d = self.offset[[n, ch, y, x]];
            let t = (ch / 2) % k;
            let base = if ch % 2 == 0 {
                (y * p.stride.0 + (t / kw) * p.dilation.0) as f64 - p.padding.top as f64
            } else {
                (x * p.stride.1 + (t % kw) * p.dilation.1) as f64 - p.padding.left as f64
            };
            ((base as f32 + d as f32) as f64) - base
        })
    }

    fn with_offset(&self, offset: Array4<f64>) -> Case {
        Case {
            offset,
            ..self.clone()
        }
    }

    fn judge(&self, actual: &Results, options: &Options) -> Report {
        let oracle = Oracle::new(&self.ops(), options).unwrap();
        let exact = self.exact();
        let triples: Vec<_> = actual
            .iter()
            .map(|(o, a)| (*o, exact[o].view(), a.view()))
            .collect();
        oracle.report(&triples).unwrap()
    }
}

/// Every result rounded with `round`.
fn rounded(r: &Results, round: impl Fn(f64) -> f64) -> Results {
    r.iter().map(|(o, a)| (*o, a.mapv(&round))).collect()
}

trait MaskOff {
    fn mask_off(self) -> Self;
}

impl MaskOff for Want {
    fn mask_off(mut self) -> Self {
        self.mask = false;
        self
    }
}

/// The tiny-offset family of issue 17: a DCN v2 layer whose offsets just left zero. A kernel
/// forming positions in f32 (here: the reference on f32-formed positions, results rounded to
/// f32) passes for every scale and convention; under `strict_positions` it does not.
#[test]
fn tiny_offsets_pass_for_a_kernel_forming_positions_in_f32() {
    let scales = [0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2];
    for conv in Convention::ALL {
        let mut strict_failures = 0;
        for (si, &s) in scales.iter().enumerate() {
            let mut case = Case::random(2, 8, 12, 16, 3, s, 17 + si as u64);
            case.params = case.params.convention(conv);
            let kernel = rounded(&case.with_offset(case.f32_positions()).exact(), |v| {
                v as f32 as f64
            });
            let report = case.judge(&kernel, &Options::precision(Precision::F32));
            assert!(report.passed(), "{conv:?}, s = {s:e}:\n{report}");
            if (1e-9..=1e-4).contains(&s) {
                assert!(report.ambiguous_samples > 0, "{conv:?}, s = {s:e}");
            }
            let strict = case.judge(
                &kernel,
                &Options::precision(Precision::F32).strict_positions(true),
            );
            strict_failures += usize::from(!strict.bound_passed());
            // Our fast path passes too.
            let fast = case.judge(&case.fast_f32(), &Options::precision(Precision::F32));
            assert!(fast.passed(), "fast path, {conv:?}, s = {s:e}:\n{fast}");
        }
        assert!(
            strict_failures >= 3,
            "{conv:?}: the exact rule failed only {strict_failures} scales"
        );
    }
}

/// Samples `2e-3` past an integer (far from ambiguous in f32): a kernel whose `grad_offset`
/// takes the cell on the other side of the integer fails, and nothing is accepted by rounding.
#[test]
fn the_wrong_side_at_clearly_non_integer_positions_fails() {
    let mut case = Case::random(2, 4, 8, 6, 3, 0.0, 5);
    let mut r = Rng(9);
    case.offset.mapv_inplace(|_| {
        let whole = (r.unit() * 5.0).floor() - 2.0;
        let side = if r.unit() < 0.5 { -2e-3 } else { 2e-3 };
        (whole + side) as f32 as f64
    });
    let mut kernel = rounded(&case.exact(), |v| v as f32 as f64);
    // Mirror each offset across its nearest integer: the same distance on the other side.
    let mirrored = case.offset.mapv(|d| 2.0 * d.round() - d);
    let wrong = case.with_offset(mirrored).exact();
    kernel.insert(
        Output::GradOffset,
        wrong[&Output::GradOffset].mapv(|v| v as f32 as f64),
    );
    let report = case.judge(&kernel, &Options::default());
    let go = report.get(Output::GradOffset).unwrap();
    assert!(go.over_tolerance > 0, "{report}");
    assert_eq!(go.accepted_by_rounding, 0);
    assert_eq!(report.ambiguous_samples, 0);
    assert!(report.get(Output::Out).unwrap().passed());
}

/// Samples exactly on `-1` (and elsewhere on integers): mmcv's results pass under the mmcv
/// convention and fail under torchvision's on `grad_offset` (its zero at exactly `-1`), since
/// an exact `-1` is no rounding ambiguity. Likewise DCN v1's.
#[test]
fn conventions_are_judged_by_their_own_rule() {
    let mut case = Case::random(1, 3, 7, 4, 3, 0.0, 11);
    let mut r = Rng(3);
    // Every dy puts its sample on row -1 (base y - 1 + i), every dx on an integer column.
    case.offset = Array4::from_shape_fn(case.offset.dim(), |(_, ch, y, _)| {
        let i = ((ch / 2) % 9) / 3;
        if ch % 2 == 0 {
            -1.0 - (y as f64 - 1.0 + i as f64)
        } else {
            (r.unit() * 3.0).floor() - 1.0
        }
    });
    for conv in [Convention::Mmcv, Convention::DcnV1] {
        let mut theirs = case.clone();
        theirs.params = case.params.convention(conv);
        let kernel = rounded(&theirs.exact(), |v| v as f32 as f64);
        let own = theirs.judge(&kernel, &Options::default());
        assert!(own.passed(), "{conv:?} under its own rule:\n{own}");
        let torchvision = case.judge(&kernel, &Options::default());
        assert!(
            !torchvision.passed(),
            "{conv:?} under torchvision's rule:\n{torchvision}"
        );
        assert!(
            torchvision.get(Output::GradOffset).unwrap().over_tolerance > 0,
            "{torchvision}"
        );
    }
}

/// `x` rounded to `bits` significand bits (ties to even), for a format below bf16.
fn round_bits(x: f64, bits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = x.abs().log2().floor() as i32;
    let ulp = 2f64.powi(e - (bits - 1));
    (x / ulp).round_ties_even() * ulp
}

/// Each profile accepts results correctly rounded to its precision and rejects results
/// rounded to the next lower one. Small reductions (`1x1` kernel, one input channel) and
/// positions on pixels (no position rounding), so that one rounding of the result is visible.
#[test]
fn each_precision_accepts_its_rounding_and_rejects_the_next_lower() {
    let mut r = Rng(23);
    // Full f64 significands, so that every rounding of a result shows.
    let (n, c, h, c_out) = (2, 1, 10, 8);
    let mut case = Case::random(n, c, h, c_out, 1, 0.0, 1);
    case.input.mapv_inplace(|_| r.randn());
    case.weight.mapv_inplace(|_| r.randn());
    case.grad_out.mapv_inplace(|_| r.randn());
    case.mask = Some(case.mask.as_ref().unwrap().mapv(|_| r.randn()));
    case.bias = None;
    let mut rr = Rng(29);
    case.offset
        .mapv_inplace(|_| (rr.unit() * 3.0).floor() - 1.0);
    let exact = case.exact();
    type Rounding = Box<dyn Fn(f64) -> f64>;
    let lower: [(Precision, Rounding); 5] = [
        (Precision::F64, Box::new(|v| v as f32 as f64)),
        (Precision::F32, Box::new(|v| Precision::Tf32.round(v))),
        (Precision::Tf32, Box::new(|v| Precision::Bf16.round(v))),
        (Precision::F16, Box::new(|v| Precision::Bf16.round(v))),
        (Precision::Bf16, Box::new(|v| round_bits(v, 4))),
    ];
    for (p, next_lower) in lower {
        let options = Options::precision(p);
        let own = case.judge(&rounded(&exact, |v| p.round(v)), &options);
        assert!(own.passed(), "{p} rounding under {p}:\n{own}");
        let low = case.judge(&rounded(&exact, next_lower), &options);
        assert!(!low.passed(), "next lower rounding under {p}:\n{low}");
        let stat = |r: &Report| {
            r.tensors
                .iter()
                .filter_map(|t| t.statistic)
                .fold(0.0, f64::max)
        };
        eprintln!(
            "{p}: own rounding: largest rms statistic {:.3}; next lower: {:.3}, bound {}",
            stat(&own),
            stat(&low),
            if low.bound_passed() {
                "passed"
            } else {
                "failed"
            }
        );
    }
}
