//! Consistent small problems filled with hostile values (NaN, ±inf, ±1e38, subnormals, values
//! just below/above integers and the image edges, raw bit patterns): the fast path must agree
//! with the reference wherever the reference is finite and its error bound is finite, and must
//! be NaN wherever the reference is NaN.
#![no_main]

mod bytes;

use bytes::Bytes;
use deformconv::compare::{error_scales, Operands, Output, Tolerance};
use deformconv::{reference, ConvParams, Padding, Want};
use libfuzzer_sys::fuzz_target;
use ndarray::{Array4, ArrayView4, Zip};

/// Fails if `fast` and `exact` disagree beyond `tol * bound` where both are meaningful.
/// `bound` is an elementwise upper bound of the sum of |terms| (finite where usable).
/// Elements whose bound reaches `limit` are not compared (the fast type may overflow there).
/// NaN-ness is compared wherever the bound is not infinite.
fn check(
    what: &str,
    fast: ArrayView4<f64>,
    exact: ArrayView4<f64>,
    bound: ArrayView4<f64>,
    tol: f64,
    limit: f64,
    slack: f64,
) {
    Zip::indexed(fast)
        .and(exact)
        .and(bound)
        .for_each(|idx, &f, &e, &s| {
            // An infinite bound means some product or partial sum overflowed: NaN or inf then
            // depends on the order of the sum, so only finite (or NaN) bounds pin the NaN
            // pattern. A NaN bound is a NaN term, which no order can hide.
            if e.is_nan() && !s.is_infinite() {
                assert!(f.is_nan(), "{what}{idx:?}: reference NaN, fast {f}");
            } else if e.is_finite() && s < limit {
                assert!(
                    (f - e).abs() <= tol * s + slack,
                    "{what}{idx:?}: fast {f:e} vs reference {e:e} (bound {s:e})"
                );
            }
        });
}

fn array(b: &mut Bytes, shape: [usize; 4], hostile: bool) -> Array4<f64> {
    let mut a = Array4::zeros(shape);
    for v in a.iter_mut() {
        *v = if hostile {
            b.float()
        } else {
            b.byte() as f64 / 32.0 - 4.0
        };
    }
    a
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let groups = 1 + b.upto(1);
    let og = 1 + b.upto(1);
    let c_in = groups * og * (1 + b.upto(1));
    let c_out = groups * (1 + b.upto(1));
    let (kh, kw) = (1 + b.upto(2), 1 + b.upto(2));
    let (h, w) = (1 + b.upto(4), 1 + b.upto(4));
    let params = ConvParams::default()
        .stride(1 + b.upto(1), 1 + b.upto(1))
        .padding_sides(Padding {
            top: b.upto(2),
            bottom: b.upto(2),
            left: b.upto(2),
            right: b.upto(2),
        })
        .dilation(1 + b.upto(1), 1 + b.upto(1))
        .groups(groups)
        .offset_groups(og);
    let n = 1 + b.upto(1);
    let Ok(g) = deformconv::Geometry::new([n, c_in, h, w], [c_out, c_in / groups, kh, kw], &params)
    else {
        return;
    };
    // Which tensors get hostile values; the others get tame ones.
    let hostile = b.byte();
    let input = array(&mut b, g.input_shape(), hostile & 1 != 0);
    let weight = array(&mut b, g.weight_shape(), hostile & 2 != 0);
    let offset = array(&mut b, g.offset_shape(), hostile & 4 != 0);
    let mask = (hostile & 8 != 0).then(|| array(&mut b, g.mask_shape(), hostile & 16 != 0));
    let grad_out = array(&mut b, g.out_shape(), hostile & 32 != 0);
    let mv = mask.as_ref().map(|m| m.view());

    if std::env::var_os("FUZZ_DEBUG").is_some() {
        eprintln!(
            "{params:?}\ninput {input:?}\nweight {weight:?}\noffset {offset:?}\nmask {mask:?}"
        );
    }
    // Upper bounds of sum |terms| from the reference on absolute values (bilinear weights and
    // column-gradient sums are sums of non-negative products of these).
    let abs = |a: &Array4<f64>| a.mapv(f64::abs);
    let (ai, aw, ag) = (abs(&input), abs(&weight), abs(&grad_out));
    let am = mask.as_ref().map(abs);
    let amv = am.as_ref().map(|m| m.view());
    let ov = offset.view();
    let tol = 1e-9;

    let exact =
        reference::deform_conv2d(input.view(), ov, mv, weight.view(), None, &params).unwrap();
    let bound = reference::deform_conv2d(ai.view(), ov, amv, aw.view(), None, &params).unwrap();
    let fast =
        deformconv::deform_conv2d(input.view(), ov, mv, weight.view(), None, &params).unwrap();
    check(
        "out",
        fast.view(),
        exact.view(),
        bound.view(),
        tol,
        f64::INFINITY,
        1e-300,
    );

    let f32_of = |a: &Array4<f64>| a.mapv(|v| v as f32);
    let (i32_, w32, o32) = (f32_of(&input), f32_of(&weight), f32_of(&offset));
    let m32 = mask.as_ref().map(f32_of);
    // Only where the f64 inputs are exactly representable in f32 is the f32 run the same problem.
    let same = |a: &Array4<f64>, b: &Array4<f32>| {
        a.iter().zip(b).all(|(&x, &y)| x == y as f64 || x.is_nan())
    };
    if same(&input, &i32_) && same(&weight, &w32) && same(&offset, &o32) {
        let fast32 = deformconv::deform_conv2d(
            i32_.view(),
            o32.view(),
            m32.as_ref().map(|m| m.view()),
            w32.view(),
            None,
            &params,
        )
        .unwrap();
        if m32.as_ref().is_none_or(|m| same(mask.as_ref().unwrap(), m)) {
            // The bound the crate publishes (deformconv::compare, DESIGN §5):
            // `c * eps_f32 * (L * sum|terms| + P)`, with the position-rounding term P.
            // error_scales gives an element an infinite offset reaches a NaN scale (`inf * 0`
            // in P), although the sample lies outside every window and has no terms; a finite
            // far-away offset of the same sign has the same (no) terms.
            let far = offset.mapv(|v| {
                if v.is_infinite() {
                    v.signum() * 1e30
                } else {
                    v
                }
            });
            let scales = error_scales(&Operands {
                input: input.view(),
                offset: far.view(),
                mask: mv,
                weight: weight.view(),
                bias: None,
                grad_out: None,
                params,
            })
            .unwrap();
            let scale: ArrayView4<f64> = scales
                .get(Output::Out)
                .unwrap()
                .into_dimensionality()
                .unwrap();
            // f32's range: a column value `m * B`, before the weight multiplies it, can
            // overflow where the final terms do not (a mask of 7e28 times an input of 6e16,
            // then a weight of 8e-39: inf in f32, 4e7 exactly). The bound covers rounding, not
            // overflow, so elements whose terms' |m * B| sum to f32's range are not compared.
            let ones = Array4::<f64>::ones(g.weight_shape());
            let columns =
                reference::deform_conv2d(ai.view(), ov, amv, ones.view(), None, &params).unwrap();
            let scale = Zip::from(scale).and(&columns).map_collect(|&s, &c| {
                if c < 1e38 {
                    s
                } else {
                    f64::INFINITY
                }
            });
            let f32_bound = Tolerance::bound::<f32>();
            let f32_tol = f32_bound.bound_factor * f32_bound.eps;
            let l = (c_in / groups * kh * kw) as f64;
            // Results in f32's subnormal range lose relative precision: allow a few of its
            // smallest steps (2^-149) per rounding. A subnormal intermediate (the bilinear
            // value, then `m * B`) is rounded to such a step before the mask and the weight
            // multiply it, so the step is scaled by their largest magnitudes (input 3 * 2^-149,
            // mask 0.28, weight -119: fast -119 * 2^-149, exact -52 * 2^-149).
            // (Finite values only: an element that meets an infinity has an infinite scale and
            // is not compared.)
            let largest = |a: &Array4<f32>| {
                a.iter()
                    .filter(|v| v.is_finite())
                    .fold(0.0f64, |m, &v| m.max((v as f64).abs()))
            };
            let amplified = (1.0 + largest(&w32)) * (1.0 + m32.as_ref().map_or(1.0, largest));
            let f32_slack = 4.0 * (l + 2.0) * f64::from(f32::from_bits(1)) * amplified;
            check(
                "out(f32)",
                fast32.mapv(|v| v as f64).view(),
                exact.view(),
                scale.view(),
                f32_tol,
                1e30,
                f32_slack,
            );
        }
    }

    let grads = deformconv::deform_conv2d_backward(
        grad_out.view(),
        input.view(),
        ov,
        mv,
        weight.view(),
        &params,
        Want::ALL,
    )
    .unwrap();
    let gv = grad_out.view();
    let gi = reference::grad_input(gv, ov, mv, weight.view(), g.input_shape(), &params).unwrap();
    let gi_bound =
        reference::grad_input(ag.view(), ov, amv, aw.view(), g.input_shape(), &params).unwrap();
    check(
        "grad_input",
        grads.input.as_ref().unwrap().view(),
        gi.view(),
        gi_bound.view(),
        tol,
        f64::INFINITY,
        1e-300,
    );

    let gw = reference::grad_weight(gv, input.view(), ov, mv, g.weight_shape(), &params).unwrap();
    let gw_bound =
        reference::grad_weight(ag.view(), ai.view(), ov, amv, g.weight_shape(), &params).unwrap();
    check(
        "grad_weight",
        grads.weight.as_ref().unwrap().view(),
        gw.view(),
        gw_bound.view(),
        tol,
        f64::INFINITY,
        1e-300,
    );

    if let Some(gm_fast) = grads.mask.as_ref() {
        let gm = reference::grad_mask(gv, input.view(), ov, weight.view(), &params).unwrap();
        let gm_bound = reference::grad_mask(ag.view(), ai.view(), ov, aw.view(), &params).unwrap();
        check(
            "grad_mask",
            gm_fast.view(),
            gm.view(),
            gm_bound.view(),
            tol,
            f64::INFINITY,
            1e-300,
        );
    }

    // grad_offset: each element sums, over at most C_in channels, |gcol| |m| |Wy| with
    // |gcol| <= sum|weight| * max|grad_out| and |Wy| <= 2 max|input|.
    let go = reference::grad_offset(gv, input.view(), ov, mv, weight.view(), &params).unwrap();
    let max = |a: &Array4<f64>| a.iter().cloned().fold(0.0, f64::max);
    let max_m = am.as_ref().map_or(1.0, max);
    let scale = 2.0 * c_in as f64 * aw.sum() * max(&ag) * max_m * max(&ai);
    let bound = Array4::from_elem(go.raw_dim(), scale);
    let go_fast = grads.offset.as_ref().unwrap();
    check(
        "grad_offset",
        go_fast.view(),
        go.view(),
        bound.view(),
        tol,
        f64::INFINITY,
        1e-300,
    );
});
