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

/// A float32 kernel written as torchvision's CPU `deform_conv2d` is (`deform_conv2d_kernel.cpp`):
/// positions `(float)(y * stride - pad + i * dil) + offset`, the forward's
/// `bilinear_interpolate` (`lh = h - h_low`, `hh = 1 - lh`, corner weights `hh * hw` ...) and
/// the backward's col2im (`columns = weight^T grad_out`, then
/// `grad_input[yp, xp] += mask * (1 - |y - yp|) * (1 - |x - xp|) * col` for the corners with
/// `|y - yp| < 1`), everything in f32. Returns `out` and `grad_input`.
fn torchvision_f32(case: &Case) -> Results {
    let p = &case.params;
    let [n, c_in, h, w] = [0, 1, 2, 3].map(|d| case.input.shape()[d]);
    let [c_out, c_per_g, kh, kw] = [0, 1, 2, 3].map(|d| case.weight.shape()[d]);
    let [_, _, h_out, w_out] = [0, 1, 2, 3].map(|d| case.grad_out.shape()[d]);
    let c_out_per_g = c_out / p.groups;
    let c_per_og = c_in / p.offset_groups;
    let f = |v: f64| v as f32;
    // The position of tap (i, j) at output (y, x) for channel c, and its mask.
    let sample = |b: usize, c: usize, i: usize, j: usize, y: usize, x: usize| {
        let ch = (c / c_per_og) * kh * kw + i * kw + j;
        let by = (y * p.stride.0 + i * p.dilation.0) as i64 - p.padding.top as i64;
        let bx = (x * p.stride.1 + j * p.dilation.1) as i64 - p.padding.left as i64;
        let py = by as f32 + f(case.offset[[b, 2 * ch, y, x]]);
        let px = bx as f32 + f(case.offset[[b, 2 * ch + 1, y, x]]);
        let m = case.mask.as_ref().map_or(1.0, |m| f(m[[b, ch, y, x]]));
        (py, px, m)
    };
    let (hi, wi) = (h as i64, w as i64);
    let mut out = Array4::<f32>::zeros((n, c_out, h_out, w_out));
    let mut grad_input = Array4::<f32>::zeros((n, c_in, h, w));
    for b in 0..n {
        for c in 0..c_in {
            let (g, ci) = (c / c_per_g, c % c_per_g);
            for i in 0..kh {
                for j in 0..kw {
                    for y in 0..h_out {
                        for x in 0..w_out {
                            let (py, px, m) = sample(b, c, i, j, y, x);
                            // Forward: bilinear_interpolate, then the column into every output.
                            let mut val = 0.0f32;
                            if !(py <= -1.0 || h as f32 <= py || px <= -1.0 || w as f32 <= px) {
                                let (yl, xl) = (py.floor() as i64, px.floor() as i64);
                                let (lh, lw) = (py - yl as f32, px - xl as f32);
                                let (hh, hw) = (1.0 - lh, 1.0 - lw);
                                let v = |r: i64, s: i64| {
                                    if r >= 0 && r < hi && s >= 0 && s < wi {
                                        f(case.input[[b, c, r as usize, s as usize]])
                                    } else {
                                        0.0
                                    }
                                };
                                val = hh * hw * v(yl, xl)
                                    + hh * lw * v(yl, xl + 1)
                                    + lh * hw * v(yl + 1, xl)
                                    + lh * lw * v(yl + 1, xl + 1);
                            }
                            let column = m * val;
                            // Backward: col = sum over the group's outputs of weight * grad_out.
                            let mut col = 0.0f32;
                            for co in g * c_out_per_g..(g + 1) * c_out_per_g {
                                let wt = f(case.weight[[co, ci, i, j]]);
                                out[[b, co, y, x]] += wt * column;
                                col += wt * f(case.grad_out[[b, co, y, x]]);
                            }
                            for dy in -1..=1 {
                                for dx in -1..=1 {
                                    let (yp, xp) = (py as i64 + dy, px as i64 + dx);
                                    let (ay, ax) = ((py - yp as f32).abs(), (px - xp as f32).abs());
                                    if yp >= 0
                                        && yp < hi
                                        && xp >= 0
                                        && xp < wi
                                        && ay < 1.0
                                        && ax < 1.0
                                    {
                                        let weight = (1.0 - ay) * (1.0 - ax);
                                        grad_input[[b, c, yp as usize, xp as usize]] +=
                                            m * weight * col;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(bias) = &case.bias {
        for ((_, co, _, _), v) in out.indexed_iter_mut() {
            *v += f(bias[co]);
        }
    }
    let d = |a: Array4<f32>| a.mapv(f64::from).into_dyn();
    BTreeMap::from([(Output::Out, d(out)), (Output::GradInput, d(grad_input))])
}

/// Issue 17's false alarm on torchvision's own f32 `grad_input` (calibration case 14, seed 1):
/// a position `0 + 3.47e-5`, formed exactly in f32, gives the corner at 1 the weight
/// `1 - |y - 1|`, which f32 rounds relative to 1, not to the weight (a relative error of
/// `1e-3`); the element it feeds is tiny against its terms. The bound's `P` must count the
/// rounding of the fractions (`eps` per coordinate), not only that of the position. Both
/// torchvision's results (stored) and the f32 kernel above pass; a wrong element still fails.
#[test]
#[allow(clippy::excessive_precision)] // torchvision's f32 values, printed to 8 digits
fn torchvision_f32_grad_input_with_tiny_corner_weights_passes() {
    let a = |shape: [usize; 4], v: &[f32]| {
        Array4::from_shape_vec(shape, v.iter().map(|&x| f64::from(x)).collect()).unwrap()
    };
    #[rustfmt::skip]
    let input = a([3, 4, 2, 2], &[
        0.726_895_33, 0.376_213_16, -0.187_808_69, 0.122_598_61, -0.333_872_17, -1.320_395_2,
        -1.441_376_7, -0.711_225_2, -0.916_575_67, -0.696_768_1, 0.301_413_6, 1.491_668_1,
        0.782_547_8, 2.422_183_5, -0.650_751_6, -0.986_066_34, -0.497_273_42, -0.461_535_57,
        0.848_201_04, -0.076_354_355, -1.194_144_8, -0.238_480_14, -0.851_838_9, 0.576_314_27,
        -0.750_374_73, -0.149_817_26, -0.822_318_9, -0.767_884_7, -1.187_831_5, -0.533_785_8,
        -1.214_979_8, 0.235_452_4, 0.807_620_47, -0.416_526_59, -0.058_588_088, -0.607_083_44,
        0.602_078_97, 1.042_395_4, -0.075_502_19, 2.023_071_8, 0.560_082_55, 2.138_153,
        0.014_113_32, 0.593_775_7, -0.113_033_5, -0.706_188_98, -0.388_734_16, -0.714_535_6,
    ]);
    #[rustfmt::skip]
    let offset = a([3, 4, 1, 1], &[
        -3.164_830_6e-5, 3.470_270_2e-5, -9.667_064e-5, -1.589_628_2e-4, -1.192_265_7e-5,
        -4.904_814_3e-5, -3.645_273_3e-5, 1.235_756_5e-4, 8.120_326e-5, -9.741_15e-5,
        2.153_279_5e-5, -5.817_278_7e-5,
    ]);
    #[rustfmt::skip]
    let weight = a([4, 2, 2, 1], &[
        0.012_828_6, -0.238_759_12, 0.127_317_77, -0.331_188, -0.276_994_65, -0.357_219_85,
        0.597_25, -0.610_087_2, -0.982_372_6, 0.282_736, -0.185_891_36, -0.256_312_52,
        -0.343_298_76, -0.256_379_07, 0.394_427_5, -0.460_217_12,
    ]);
    #[rustfmt::skip]
    let mask = a([3, 2, 1, 1], &[
        0.275_382_8, 0.527_895_57, 0.775_120_5, 0.913_111_5, 0.426_208_76, 0.129_641_59,
    ]);
    let bias = Array1::from(vec![
        0.313_070_36,
        -0.284_404_84,
        0.108_965_79,
        -0.995_798_77,
    ]);
    #[rustfmt::skip]
    let grad_out = a([3, 4, 1, 1], &[
        1.381_312_3, -0.622_282_86, -0.881_675_7, 1.959_599_4, 0.312_093_32, 0.726_912_8,
        -0.358_150_96, 0.961_737_7, -1.004_172_9, -0.012_630_465, -1.826_610_2, 0.937_446_24,
    ]);
    // torchvision 0.29's f32 CPU grad_input on these operands.
    #[rustfmt::skip]
    let torchvision_grad_input = a([3, 4, 2, 2], &[
        0.052_338_377, 1.815_866_5e-6, -0.056_739_077, 0.0, -0.053_918_377, -1.870_350_5e-6,
        -0.041_074_13, 0.0, 0.053_218_8, 1.847_549_7e-6, -0.396_708_04, 0.0, 0.257_931_38,
        8.949_121_4e-6, -0.356_690_53, 0.0, -0.152_969_69, -1.375_367_7e-9, -0.305_097_3,
        -3.770_261_2e-5, 0.367_276_34, -2.250_590_2e-9, -0.499_247_55, -6.169_487e-5,
        0.016_787_613, -1.431_540_9e-9, -0.317_558_17, -3.924_247_4e-5, 0.345_603_53,
        -1.443_797_1e-9, -0.320_276_98, -3.957_845_2e-5, -0.003_998_641_9, 0.0, 0.031_664_35,
        0.0, -0.057_695_21, 0.0, 0.044_105_68, 0.0, 0.627_517_6, 0.0, -0.098_052_7, 0.0,
        0.302_258_28, 0.0, 0.004_789_041_4, 0.0,
    ]);
    let case = Case {
        input,
        offset,
        mask: Some(mask),
        weight,
        bias: Some(bias.mapv(f64::from)),
        grad_out,
        params: ConvParams::default().stride(2, 2).padding(0, 0).groups(2),
    };
    let options = Options::precision(Precision::F32);
    let theirs = BTreeMap::from([(Output::GradInput, torchvision_grad_input.into_dyn())]);
    let report = case.judge(&theirs, &options);
    assert!(report.passed(), "torchvision's grad_input:\n{report}");
    let ours = torchvision_f32(&case);
    let report = case.judge(&ours, &options);
    assert!(
        report.passed(),
        "the torchvision-style f32 kernel:\n{report}"
    );
    // Still tight: the tiny element [0, 3, 0, 1] (weight 3.5e-5, whose f32 rounding alone can
    // move it by 2^-24 / 3.5e-5 = 1.7e-3 of itself) moved by 3% of itself is caught.
    let mut wrong = theirs.clone();
    let e = &mut wrong.get_mut(&Output::GradInput).unwrap()[[0, 3, 0, 1]];
    *e *= 1.03;
    let report = case.judge(&wrong, &options);
    assert!(!report.bound_passed(), "{report}");
}

/// The same kernel on layers whose offsets just left zero: a 1x1 kernel with stride 2 and no
/// padding, so that odd rows and columns are read only through tiny corner weights (`1 - l`
/// near 0, formed from exactly representable positions) and their `grad_input` is tiny against
/// its terms; also a 3x3 layer with padding. No false alarm on `out` or `grad_input`.
#[test]
fn torchvision_style_f32_kernel_passes_near_integer_positions() {
    for (seed, s) in [(1, 1e-5), (2, 1e-4), (3, 1e-3), (4, 3e-2)] {
        let mut r = Rng(200 + seed);
        let (n, c, h, c_out) = (2, 4, 8, 3);
        let sparse = Case {
            input: arr([n, c, h, h], || r.f32n(1.0)),
            offset: arr([n, 2, h / 2, h / 2], || r.f32n(s)),
            mask: Some(arr([n, 1, h / 2, h / 2], || (r.unit() * 1.5) as f32 as f64)),
            weight: arr([c_out, c, 1, 1], || r.f32n(0.3)),
            bias: None,
            grad_out: arr([n, c_out, h / 2, h / 2], || r.f32n(1.0)),
            params: ConvParams::default().stride(2, 2),
        };
        let padded = Case::random(2, 4, 6, 6, 3, s, 100 + seed);
        for case in [sparse, padded] {
            let report = case.judge(&torchvision_f32(&case), &Options::precision(Precision::F32));
            assert!(report.passed(), "seed {seed}, s = {s:e}:\n{report}");
        }
    }
}
