//! Hostile inputs through the FAST path (issue 6): threads, sizes and non-finite values.
//! (Odd memory layouts: `tests/hostile_layouts.rs`; the table of what users get:
//! `docs/hostile-inputs.md`.)
//!
//! - Threads: from inside a user's rayon pool, from inside a task of that pool, from 8 OS
//!   threads at once, and on a 1-thread pool, every function gives bitwise the same results.
//! - Sizes: an empty batch gives empty results everywhere; 1x1 images and kernels work; a
//!   kernel larger than the padded image, a dilation that makes it so, and shapes whose
//!   products overflow are errors (before any allocation); huge strides and paddings work.
//! - Non-finite values: NaN, ±inf, ±1e38 and subnormals in every operand never panic; each
//!   output is NaN where the reference is, the same infinity where the reference has one, and
//!   within rounding of the reference where it is finite.

mod support;

use deformconv::{
    conv2d, conv2d_backward, conv2d_backward_into, conv2d_grad_input, conv2d_grad_input_into,
    conv2d_grad_weight, conv2d_grad_weight_into, conv2d_into, deform_conv2d,
    deform_conv2d_backward, deform_conv2d_backward_into, deform_conv2d_grad_bias,
    deform_conv2d_grad_bias_into, deform_conv2d_grad_input, deform_conv2d_grad_input_into,
    deform_conv2d_grad_mask, deform_conv2d_grad_mask_into, deform_conv2d_grad_offset,
    deform_conv2d_grad_offset_into, deform_conv2d_grad_weight, deform_conv2d_grad_weight_into,
    deform_conv2d_into, reference, ConvParams, Error, Float, Geometry, Grads, GradsMut, Want,
};
use ndarray::{Array1, Array4, ArrayView1, ArrayView4};
use proptest::prelude::*;
use rayon::prelude::*;
use support::{cases, Case, Rng};

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// Operands of one problem in `T`, all present (mask and bias included).
struct Ops<T> {
    input: Array4<T>,
    offset: Array4<T>,
    mask: Array4<T>,
    weight: Array4<T>,
    bias: Array1<T>,
    grad_out: Array4<T>,
}

impl<T: Float> Ops<T> {
    fn random(input: [usize; 4], weight: [usize; 4], p: &ConvParams, seed: u64) -> Self {
        let g = Geometry::new(input, weight, p).unwrap();
        let mut r = Rng::new(seed);
        let mut a = |s: [usize; 4], scale: f64| {
            Array4::from_shape_simple_fn(s, || T::from_f64(scale * r.value()))
        };
        let (input, offset, mask) = (
            a(g.input_shape(), 1.0),
            a(g.offset_shape(), 2.5),
            a(g.mask_shape(), 1.0),
        );
        let (weight, grad_out) = (a(g.weight_shape(), 1.0), a(g.out_shape(), 1.0));
        let bias = Array1::from_shape_fn(g.c_out, |o| T::from_f64(o as f64 * 0.25 - 0.5));
        Ops {
            input,
            offset,
            mask,
            weight,
            bias,
            grad_out,
        }
    }
    fn from_case(case: &Case) -> Self {
        let t = case.tensors();
        let g = case.geometry();
        let mut r = Rng::new(case.seed ^ 0x77);
        let cv = |a: &Array4<f64>| a.mapv(T::from_f64);
        Ops {
            input: cv(&t.input),
            offset: cv(&t.offset),
            mask: t
                .mask
                .as_ref()
                .map(cv)
                .unwrap_or_else(|| Array4::from_shape_fn(g.mask_shape(), |_| T::ONE)),
            weight: cv(&t.weight),
            bias: Array1::from_shape_fn(g.c_out, |_| T::from_f64(r.value())),
            grad_out: Array4::from_shape_fn(g.out_shape(), |_| T::from_f64(r.value())),
        }
    }
}

/// Everything the fast path computes for one problem: forward (deformable and dense) and every
/// gradient (combined and separate).
#[derive(Debug, Clone, PartialEq)]
struct Everything<T> {
    forward: Array4<T>,
    dense: Array4<T>,
    grads: Grads<T>,
    separate: [Array4<T>; 4],
    bias: Array1<T>,
    dense_grads: Grads<T>,
}

fn everything<T: Float>(o: &Ops<T>, p: &ConvParams) -> Everything<T> {
    let (i, off, w, g) = (
        o.input.view(),
        o.offset.view(),
        o.weight.view(),
        o.grad_out.view(),
    );
    let m = Some(o.mask.view());
    let b = Some(o.bias.view());
    let (is, ws) = (shape4(i.shape()), shape4(w.shape()));
    Everything {
        forward: deform_conv2d(i, off, m, w, b, p).unwrap(),
        dense: conv2d(i, w, b, p).unwrap(),
        grads: deform_conv2d_backward(g, i, off, m, w, p, Want::ALL).unwrap(),
        separate: [
            deform_conv2d_grad_input(g, off, m, w, is, p).unwrap(),
            deform_conv2d_grad_offset(g, i, off, m, w, p).unwrap(),
            deform_conv2d_grad_mask(g, i, off, w, p).unwrap(),
            deform_conv2d_grad_weight(g, i, off, m, ws, p).unwrap(),
        ],
        bias: deform_conv2d_grad_bias(g).unwrap(),
        dense_grads: conv2d_backward(g, i, w, p, Want::ALL).unwrap(),
    }
}

/// Bitwise equality (NaN payloads included), via the bits of every element.
fn bits<T: Float>(e: &Everything<T>) -> Vec<u64> {
    let mut out = Vec::new();
    let mut push = |a: &Array4<T>| out.extend(a.iter().map(|v| v.to_f64().to_bits()));
    push(&e.forward);
    push(&e.dense);
    for g in [&e.grads, &e.dense_grads] {
        for a in [&g.input, &g.offset, &g.mask, &g.weight]
            .into_iter()
            .flatten()
        {
            push(a);
        }
    }
    for a in &e.separate {
        push(a);
    }
    let mut out2 = out;
    for g in [&e.grads, &e.dense_grads] {
        out2.extend(g.bias.iter().flatten().map(|v| v.to_f64().to_bits()));
    }
    out2.extend(e.bias.iter().map(|v| v.to_f64().to_bits()));
    out2
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// A problem with several tiles per image (forward and backward) and every feature on.
fn thread_problem<T: Float>() -> (Ops<T>, ConvParams) {
    let p = ConvParams::default()
        .padding(1, 1)
        .groups(2)
        .offset_groups(2);
    (Ops::random([3, 8, 40, 36], [6, 4, 3, 3], &p, 5), p)
}

fn threads_agree<T: Float>() {
    let (o, p) = thread_problem::<T>();
    let base = bits(&everything(&o, &p));
    let check = |name: &str, e: &Everything<T>| assert!(bits(e) == base, "{name}");
    check("1-thread pool", &pool(1).install(|| everything(&o, &p)));
    check("3-thread pool", &pool(3).install(|| everything(&o, &p)));
    // From inside tasks of the user's pool (nested parallelism).
    let nested: Vec<_> =
        pool(2).install(|| (0..4).into_par_iter().map(|_| everything(&o, &p)).collect());
    for e in &nested {
        check("inside a pool task", e);
    }
    // Many OS threads at once: 8 sharing the global pool, then 8 each with its own pool.
    std::thread::scope(|s| {
        let shared: Vec<_> = (0..8).map(|_| s.spawn(|| everything(&o, &p))).collect();
        for h in shared {
            check("8 OS threads, global pool", &h.join().unwrap());
        }
    });
    let (o, p) = (&o, &p);
    std::thread::scope(|s| {
        let own: Vec<_> = (0..8)
            .map(|k| s.spawn(move || pool(1 + k % 3).install(|| everything(o, p))))
            .collect();
        for h in own {
            check("8 OS threads, own pools", &h.join().unwrap());
        }
    });
}

#[test]
fn same_bits_from_any_pool_any_thread_f32() {
    threads_agree::<f32>();
}

#[test]
fn same_bits_from_any_pool_any_thread_f64() {
    threads_agree::<f64>();
}

// ---------------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------------

/// `N = 0`: every fast function returns empty results of the right shapes (sums over no image:
/// zero `grad_weight` and `grad_bias`), and every `_into` accepts empty outputs.
#[test]
fn empty_batch_gives_empty_results_everywhere() {
    let p = ConvParams::default().padding(1, 1).offset_groups(2);
    let g = Geometry::new([0, 4, 6, 5], [3, 4, 3, 3], &p).unwrap();
    let z = |s: [usize; 4]| Array4::<f32>::zeros(s);
    let (input, offset, mask) = (z(g.input_shape()), z(g.offset_shape()), z(g.mask_shape()));
    let weight = Array4::<f32>::ones(g.weight_shape());
    let grad_out = z(g.out_shape());
    let (i, off, m, w, go) = (
        input.view(),
        offset.view(),
        Some(mask.view()),
        weight.view(),
        grad_out.view(),
    );
    let bias = Array1::<f32>::ones(3);
    let b = Some(bias.view());
    let (is, ws) = (g.input_shape(), g.weight_shape());
    let shape = |a: &Array4<f32>| shape4(a.shape());
    assert_eq!(
        shape(&deform_conv2d(i, off, m, w, b, &p).unwrap()),
        g.out_shape()
    );
    assert_eq!(shape(&conv2d(i, w, b, &p).unwrap()), g.out_shape());
    let all = deform_conv2d_backward(go, i, off, m, w, &p, Want::ALL).unwrap();
    assert_eq!(shape(all.input.as_ref().unwrap()), is);
    assert_eq!(shape(all.offset.as_ref().unwrap()), g.offset_shape());
    assert_eq!(shape(all.mask.as_ref().unwrap()), g.mask_shape());
    assert_eq!(all.weight.as_ref().unwrap(), &Array4::<f32>::zeros(ws));
    assert_eq!(all.bias.as_ref().unwrap(), &Array1::<f32>::zeros(3));
    assert_eq!(
        shape(&deform_conv2d_grad_input(go, off, m, w, is, &p).unwrap()),
        is
    );
    assert_eq!(
        shape(&deform_conv2d_grad_offset(go, i, off, m, w, &p).unwrap()),
        g.offset_shape()
    );
    assert_eq!(
        shape(&deform_conv2d_grad_mask(go, i, off, w, &p).unwrap()),
        g.mask_shape()
    );
    assert_eq!(
        deform_conv2d_grad_weight(go, i, off, m, ws, &p).unwrap(),
        Array4::<f32>::zeros(ws)
    );
    assert_eq!(
        deform_conv2d_grad_bias(go).unwrap(),
        Array1::<f32>::zeros(3)
    );
    let dense = conv2d_backward(go, i, w, &p, Want::ALL).unwrap();
    assert_eq!(shape(dense.input.as_ref().unwrap()), is);
    assert_eq!(dense.weight.as_ref().unwrap(), &Array4::<f32>::zeros(ws));
    assert!(dense.offset.is_none() && dense.mask.is_none());
    assert_eq!(shape(&conv2d_grad_input(go, w, is, &p).unwrap()), is);
    assert_eq!(
        conv2d_grad_weight(go, i, ws, &p).unwrap(),
        Array4::<f32>::zeros(ws)
    );

    // `_into`: empty outputs are fine; grad_weight / grad_bias outputs are overwritten with 0.
    let mut out = z(g.out_shape());
    deform_conv2d_into(i, off, m, w, b, &p, out.view_mut()).unwrap();
    conv2d_into(i, w, b, &p, out.view_mut()).unwrap();
    let (mut gi, mut goff, mut gm) = (z(is), z(g.offset_shape()), z(g.mask_shape()));
    let mut gw = Array4::<f32>::from_elem(ws, f32::NAN);
    let mut gb = Array1::<f32>::from_elem(3, f32::NAN);
    let outs = GradsMut {
        input: Some(gi.view_mut()),
        offset: Some(goff.view_mut()),
        mask: Some(gm.view_mut()),
        weight: Some(gw.view_mut()),
        bias: Some(gb.view_mut()),
    };
    deform_conv2d_backward_into(go, i, off, m, w, &p, outs).unwrap();
    assert!(gw.iter().chain(gb.iter()).all(|&v| v == 0.0));
    deform_conv2d_grad_input_into(go, off, m, w, &p, gi.view_mut()).unwrap();
    deform_conv2d_grad_offset_into(go, i, off, m, w, &p, goff.view_mut()).unwrap();
    deform_conv2d_grad_mask_into(go, i, off, w, &p, gm.view_mut()).unwrap();
    gw.fill(f32::NAN);
    deform_conv2d_grad_weight_into(go, i, off, m, &p, gw.view_mut()).unwrap();
    assert!(gw.iter().all(|&v| v == 0.0));
    gb.fill(f32::NAN);
    deform_conv2d_grad_bias_into(go, gb.view_mut()).unwrap();
    assert!(gb.iter().all(|&v| v == 0.0));
    let outs = GradsMut {
        input: Some(gi.view_mut()),
        weight: Some(gw.view_mut()),
        ..GradsMut::default()
    };
    conv2d_backward_into(go, i, w, &p, outs).unwrap();
    conv2d_grad_input_into(go, w, &p, gi.view_mut()).unwrap();
    gw.fill(f32::NAN);
    conv2d_grad_weight_into(go, i, &p, gw.view_mut()).unwrap();
    assert!(gw.iter().all(|&v| v == 0.0));
}

/// `|a - b| <= tol * max(1, max |b|)` element by element (f64 fast path against the oracle).
fn close(name: &str, got: &Array4<f64>, want: &Array4<f64>) {
    assert_eq!(got.shape(), want.shape(), "{name}");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for ((idx, g), w) in got.indexed_iter().zip(want.iter()) {
        assert!(
            (g - w).abs() <= 1e-12 * scale,
            "{name}{idx:?}: fast {g}, reference {w}"
        );
    }
}

/// The f64 fast path equals the reference: forward, dense forward and every gradient.
fn fast_equals_reference(input: [usize; 4], weight: [usize; 4], p: &ConvParams, seed: u64) {
    let o = Ops::<f64>::random(input, weight, p, seed);
    let e = everything(&o, p);
    let (i, off, w, g) = (
        o.input.view(),
        o.offset.view(),
        o.weight.view(),
        o.grad_out.view(),
    );
    let m = Some(o.mask.view());
    let b = Some(o.bias.view());
    let (is, ws) = (shape4(i.shape()), shape4(w.shape()));
    let tag = format!("{input:?} {weight:?} {p:?}");
    close(
        &format!("{tag} forward"),
        &e.forward,
        &reference::deform_conv2d(i, off, m, w, b, p).unwrap(),
    );
    close(
        &format!("{tag} dense"),
        &e.dense,
        &reference::conv2d(i, w, b, p).unwrap(),
    );
    let want = [
        reference::grad_input(g, off, m, w, is, p).unwrap(),
        reference::grad_offset(g, i, off, m, w, p).unwrap(),
        reference::grad_mask(g, i, off, w, p).unwrap(),
        reference::grad_weight(g, i, off, m, ws, p).unwrap(),
    ];
    let combined = [
        &e.grads.input,
        &e.grads.offset,
        &e.grads.mask,
        &e.grads.weight,
    ];
    for (k, name) in ["grad_input", "grad_offset", "grad_mask", "grad_weight"]
        .into_iter()
        .enumerate()
    {
        close(&format!("{tag} {name}"), &e.separate[k], &want[k]);
        assert_eq!(
            combined[k].as_ref().unwrap(),
            &e.separate[k],
            "{tag} {name}"
        );
    }
    let zero = Array4::<f64>::zeros(shape4(o.offset.shape()));
    close(
        &format!("{tag} dense grad_input"),
        e.dense_grads.input.as_ref().unwrap(),
        &reference::grad_input(g, zero.view(), None, w, is, p).unwrap(),
    );
    close(
        &format!("{tag} dense grad_weight"),
        e.dense_grads.weight.as_ref().unwrap(),
        &reference::grad_weight(g, i, zero.view(), None, ws, p).unwrap(),
    );
}

#[test]
fn one_by_one_images_and_kernels() {
    let d = ConvParams::default();
    fast_equals_reference([2, 3, 1, 1], [4, 3, 1, 1], &d, 1); // 1x1 image, 1x1 kernel
    fast_equals_reference([1, 2, 1, 1], [3, 2, 3, 3], &d.padding(1, 1), 2); // 3x3 on 1x1, pad 1
    fast_equals_reference([1, 2, 6, 5], [3, 2, 1, 1], &d, 3); // 1x1 kernel
    fast_equals_reference([2, 1, 1, 7], [1, 1, 1, 3], &d.stride(1, 2), 4); // one-row image
    fast_equals_reference([1, 1, 1, 1], [1, 1, 1, 1], &d.offset_groups(1), 5);
}

/// Huge strides, paddings and dilations that still give a valid (small) problem.
#[test]
fn huge_strides_paddings_and_dilations_that_fit() {
    let d = ConvParams::default();
    // Stride 2^40 on a 5x5 image: a 1x1 output.
    let p = d.stride(1 << 40, 1 << 40);
    assert_eq!(
        Geometry::new([1, 2, 5, 5], [2, 2, 3, 3], &p)
            .unwrap()
            .out_shape(),
        [1, 2, 1, 1]
    );
    fast_equals_reference([1, 2, 5, 5], [2, 2, 3, 3], &p, 6);
    // Padding 2^40 each side with stride 2^40: 3x3 output, only the middle row/column sees
    // the image (base positions -2^40, 0, 2^40).
    let p = d.stride(1 << 40, 1 << 40).padding(1 << 40, 1 << 40);
    assert_eq!(
        Geometry::new([1, 2, 5, 5], [2, 2, 3, 3], &p)
            .unwrap()
            .out_shape(),
        [1, 2, 3, 3]
    );
    fast_equals_reference([1, 2, 5, 5], [2, 2, 3, 3], &p, 7);
    // Dilation 2^40 with a 1x1 kernel is harmless.
    fast_equals_reference([1, 2, 4, 4], [3, 2, 1, 1], &d.dilation(1 << 40, 1 << 40), 8);
    // Dilation 2^40 on the row axis with padding that makes room: kh = 2, pad 2^39 each side.
    let p = d
        .dilation(1 << 40, 1)
        .padding(1 << 39, 0)
        .stride(1 << 38, 1);
    let g = Geometry::new([1, 1, 3, 3], [1, 1, 2, 1], &p).unwrap();
    assert_eq!(g.out_shape(), [1, 1, 1, 3]);
    fast_equals_reference([1, 1, 3, 3], [1, 1, 2, 1], &p, 9);
}

/// Padding and stride 2^62 (every extent still fits `usize`): sample rows
/// `y * stride - pad + i * dil` are -2^62, 0, 2^62 (+ i), far beyond f64's exact integers; the
/// fast path computes them in integers. Hand-worked: image `in[r, s] = 10 r + s` (4x2), kernel
/// 3x1 with taps `1, 100, 10000`, `grad_out[y, s] = 1 + y + 10 s`.
#[test]
fn padding_and_stride_2_pow_62_hand_worked() {
    let input = Array4::from_shape_fn((1, 1, 4, 2), |(_, _, r, s)| (10 * r + s) as f64);
    let weight = Array4::from_shape_vec((1, 1, 3, 1), vec![1.0, 100.0, 10000.0]).unwrap();
    let p = ConvParams::default().padding(1 << 62, 0).stride(1 << 62, 1);
    // H_out = (4 + 2^63 - 3) / 2^62 + 1 = 3. Only output row 1 sees the image (rows 0, 1, 2):
    // out[1, s] = 1 * s + 100 * (10 + s) + 10000 * (20 + s) = 201000 + 10101 s.
    let mut want = Array4::<f64>::zeros((1, 1, 3, 2));
    want[[0, 0, 1, 0]] = 201000.0;
    want[[0, 0, 1, 1]] = 211101.0;
    assert_eq!(conv2d(input.view(), weight.view(), None, &p).unwrap(), want);
    let zero = Array4::<f64>::zeros((1, 6, 3, 2));
    let (i, o, w) = (input.view(), zero.view(), weight.view());
    assert_eq!(deform_conv2d(i, o, None, w, None, &p).unwrap(), want);
    // grad_input[r, s] = w[r] * G[1, s] for r < 3 (only row 1 reaches the image), 0 for r = 3;
    // grad_weight[i] = sum_s G[1, s] * in[i, s] = 2 * (10 i) + 12 * (10 i + 1).
    let g = Array4::from_shape_fn((1, 1, 3, 2), |(_, _, y, s)| (1 + y + 10 * s) as f64);
    let gi_want = Array4::from_shape_fn((1, 1, 4, 2), |(_, _, r, s)| {
        if r < 3 {
            weight[[0, 0, r, 0]] * (2 + 10 * s) as f64
        } else {
            0.0
        }
    });
    let gw_want = Array4::from_shape_fn((1, 1, 3, 1), |(_, _, i, _)| {
        (2 * 10 * i + 12 * (10 * i + 1)) as f64
    });
    let dense = conv2d_backward(g.view(), i, w, &p, Want::ALL).unwrap();
    assert_eq!(dense.input.unwrap(), gi_want);
    assert_eq!(dense.weight.unwrap(), gw_want);
    let deform = deform_conv2d_backward(g.view(), i, o, None, w, &p, Want::ALL).unwrap();
    assert_eq!(deform.input.unwrap(), gi_want);
    assert_eq!(deform.weight.unwrap(), gw_want);
}

/// Every fast function on an invalid problem: all of them must give `Err` matching `want`.
fn every_function_rejects<T: Float>(
    input: [usize; 4],
    weight: [usize; 4],
    g_out: [usize; 4],
    p: &ConvParams,
    want: impl Fn(&Error) -> bool,
) {
    let z = |s: [usize; 4]| Array4::<T>::from_elem(s, T::ZERO);
    let (i, w, go) = (z(input), z(weight), z(g_out));
    // Offsets/mask sized from grad_out; they are never reached.
    let off = z([g_out[0], 18, g_out[2], g_out[3]]);
    let msk = z([g_out[0], 9, g_out[2], g_out[3]]);
    let (iv, wv, gv, ov) = (i.view(), w.view(), go.view(), off.view());
    let m = Some(msk.view());
    let results: Vec<(&str, Option<Error>)> = vec![
        ("deform_conv2d", deform_conv2d(iv, ov, m, wv, None, p).err()),
        ("conv2d", conv2d(iv, wv, None, p).err()),
        (
            "backward",
            deform_conv2d_backward(gv, iv, ov, m, wv, p, Want::ALL).err(),
        ),
        (
            "grad_input",
            deform_conv2d_grad_input(gv, ov, m, wv, input, p).err(),
        ),
        (
            "grad_offset",
            deform_conv2d_grad_offset(gv, iv, ov, m, wv, p).err(),
        ),
        (
            "grad_mask",
            deform_conv2d_grad_mask(gv, iv, ov, wv, p).err(),
        ),
        (
            "grad_weight",
            deform_conv2d_grad_weight(gv, iv, ov, m, weight, p).err(),
        ),
        (
            "conv2d_backward",
            conv2d_backward(gv, iv, wv, p, Want::ALL).err(),
        ),
        (
            "conv2d_grad_input",
            conv2d_grad_input(gv, wv, input, p).err(),
        ),
        (
            "conv2d_grad_weight",
            conv2d_grad_weight(gv, iv, weight, p).err(),
        ),
    ];
    for (name, err) in results {
        match err {
            Some(e) => assert!(want(&e), "{name}: unexpected error {e}"),
            None => panic!("{name}: accepted an invalid problem"),
        }
    }
}

#[test]
fn kernel_larger_than_the_padded_image_is_an_error() {
    let padding = |e: &Error| {
        matches!(
            e,
            Error::Param {
                name: "padding",
                ..
            }
        )
    };
    // 3x3 kernel on a 2x2 image: the dilated kernel spans 3 rows, the image has 2.
    every_function_rejects::<f32>(
        [1, 1, 2, 2],
        [1, 1, 3, 3],
        [1, 1, 1, 1],
        &ConvParams::default(),
        padding,
    );
    let err = conv2d(
        Array4::<f32>::zeros((1, 1, 2, 2)).view(),
        Array4::<f32>::zeros((1, 1, 3, 3)).view(),
        None,
        &ConvParams::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "padding: the dilated kernel spans 3 rows (dilation 1 * (kernel 3 - 1) + 1) but the \
         padded input has only 2 (2 + 0 + 0); output rows would be < 1"
    );
    // Dilation 2^40 with a 3x3 kernel on a 5x5 image.
    every_function_rejects::<f64>(
        [1, 1, 5, 5],
        [1, 1, 3, 3],
        [1, 1, 1, 1],
        &ConvParams::default().dilation(1 << 40, 1 << 40),
        padding,
    );
}

#[test]
fn overflowing_sizes_are_too_large() {
    let too_large = |e: &Error| matches!(e, Error::TooLarge { .. });
    let d = ConvParams::default();
    // Dilation * (k - 1) overflows.
    every_function_rejects::<f32>(
        [1, 1, 5, 5],
        [1, 1, 3, 3],
        [1, 1, 1, 1],
        &d.dilation(usize::MAX, 1),
        too_large,
    );
    // Padded extent overflows.
    every_function_rejects::<f32>(
        [1, 1, 5, 5],
        [1, 1, 3, 3],
        [1, 1, 1, 1],
        &d.padding(usize::MAX / 2 + 1, 0),
        too_large,
    );
    // The shape arguments of grad_input and grad_weight: products beyond usize or isize bytes,
    // with grad_out and the other operands small (the shape is checked before anything).
    let go = Array4::<f32>::zeros((1, 2, 3, 3));
    let w = Array4::<f32>::zeros((2, 2, 1, 1));
    let off = Array4::<f32>::zeros((1, 2, 3, 3));
    let input = Array4::<f32>::zeros((1, 2, 3, 3));
    for shape in [
        [1 << 62, 2, 3, 3],
        [1, 2, 1 << 32, 1 << 32],
        [usize::MAX, 2, 3, 3],
        [1 << 60, 2, 1, 1],
    ] {
        let e = deform_conv2d_grad_input(go.view(), off.view(), None, w.view(), shape, &d);
        assert!(matches!(e, Err(Error::TooLarge { .. })), "{shape:?}: {e:?}");
        let e = conv2d_grad_input(go.view(), w.view(), shape, &d);
        assert!(matches!(e, Err(Error::TooLarge { .. })), "{shape:?}: {e:?}");
    }
    for shape in [
        [usize::MAX, 2, 1, 1],
        [1 << 62, 2, 1, 1],
        [1 << 61, 2, 1, 1],
    ] {
        let e = deform_conv2d_grad_weight(go.view(), input.view(), off.view(), None, shape, &d);
        assert!(matches!(e, Err(Error::TooLarge { .. })), "{shape:?}: {e:?}");
        let e = conv2d_grad_weight(go.view(), input.view(), shape, &d);
        assert!(matches!(e, Err(Error::TooLarge { .. })), "{shape:?}: {e:?}");
    }
    // An empty batch whose other extents are absurd: TooLarge, not an empty result.
    let huge_empty = ArrayView4::<f32>::from_shape([0, 1 << 20, 1 << 20, 1 << 20], &[]).unwrap();
    let w1 = Array4::<f32>::zeros((1, 1 << 20, 1, 1));
    assert!(matches!(
        conv2d(huge_empty, w1.view(), None, &d),
        Err(Error::TooLarge { .. })
    ));
    let err = conv2d_grad_input(go.view(), w.view(), [1 << 62, 2, 3, 3], &d).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "too large: input of shape {:?} (8-byte elements)",
            [1usize << 62, 2, 3, 3]
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Non-finite values
// ---------------------------------------------------------------------------------------------

/// Per-element `sum |terms|` of the forward and of each gradient (the reference on absolute
/// values; for `grad_offset` the four corner magnitudes, which bound `|Wy|` and `|Wx|`).
fn magnitudes(o: &Ops<f64>, p: &ConvParams) -> [Array4<f64>; 5] {
    let a = |x: &Array4<f64>| x.mapv(f64::abs);
    let (input, mask, weight, go) = (a(&o.input), a(&o.mask), a(&o.weight), a(&o.grad_out));
    let bias = o.bias.mapv(f64::abs);
    let (is, ws) = (shape4(input.shape()), shape4(weight.shape()));
    let off = o.offset.view();
    let m = Some(mask.view());
    let fwd = reference::deform_conv2d(input.view(), off, m, weight.view(), Some(bias.view()), p)
        .unwrap();
    let gi = reference::grad_input(go.view(), off, m, weight.view(), is, p).unwrap();
    let gm = reference::grad_mask(go.view(), input.view(), off, weight.view(), p).unwrap();
    let gw = reference::grad_weight(go.view(), input.view(), off, m, ws, p).unwrap();
    let g = Geometry::new(is, ws, p).unwrap();
    let mut goff = Array4::<f64>::zeros(g.offset_shape());
    let taps = g.taps();
    for ((n, ch2, y, x), slot) in goff.indexed_iter_mut() {
        let (og, k) = ((ch2 / 2) / taps, (ch2 / 2) % taps);
        let (i, j) = (k / g.kw, k % g.kw);
        let py = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64
            + o.offset[[n, 2 * (og * taps + k), y, x]];
        let px = (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64
            + o.offset[[n, 2 * (og * taps + k) + 1, y, x]];
        let (y0, x0) = (py.floor(), px.floor());
        let cpg = g.c_per_offset_group();
        let mut acc = 0.0;
        for c in og * cpg..(og + 1) * cpg {
            let (grp, ci) = (c / g.c_in_per_group(), c % g.c_in_per_group());
            let gabs: f64 = (grp * g.c_out_per_group()..(grp + 1) * g.c_out_per_group())
                .map(|oo| weight[[oo, ci, i, j]] * go[[n, oo, y, x]])
                .sum();
            let mut vs = 0.0;
            for (r, s) in [
                (y0, x0),
                (y0, x0 + 1.0),
                (y0 + 1.0, x0),
                (y0 + 1.0, x0 + 1.0),
            ] {
                if r >= 0.0 && r < g.h as f64 && s >= 0.0 && s < g.w as f64 {
                    vs += input[[n, c, r as usize, s as usize]];
                }
            }
            acc += gabs * mask[[n, og * taps + k, y, x]] * vs;
        }
        *slot = acc;
    }
    [fwd, gi, goff, gm, gw]
}

/// `fast` follows `exact`: NaN where it is NaN, the same infinity where it is infinite, and
/// within `rel * scale + abs` where it is finite (if the scale is finite).
///
/// With `infinities` (some operand holds ±inf), a reference NaN may also be a fast ±inf: a sum
/// that cancels exactly (0 in the reference's order) times an infinity is NaN there, while a
/// fused multiply-add keeps the rounding residual of the cancelled product, and residual times
/// infinity is ±inf (found by CI's proptest run, `hostile_inputs.proptest-regressions`).
fn follows<T: Float>(
    name: &str,
    fast: &Array4<T>,
    exact: &Array4<f64>,
    scale: &Array4<f64>,
    (rel, abs): (f64, f64),
    infinities: bool,
) {
    assert_eq!(fast.shape(), exact.shape(), "{name}");
    for (((idx, f), &e), &s) in fast.indexed_iter().zip(exact.iter()).zip(scale.iter()) {
        let f = f.to_f64();
        if e.is_nan() {
            assert!(
                f.is_nan() || (infinities && f.is_infinite()),
                "{name}{idx:?}: reference NaN, fast {f:e}"
            );
        } else if e.is_infinite() {
            // An infinity times a factor that cancelled to within rounding takes the sign of
            // the rounding (or is 0 * inf = NaN): see docs/hostile-inputs.md.
            assert!(
                f == e || (infinities && !f.is_finite()),
                "{name}{idx:?}: reference {e}, fast {f:e}"
            );
        } else if s.is_finite() {
            assert!(
                (f - e).abs() <= rel * s + abs,
                "{name}{idx:?}: reference {e:e}, fast {f:e}, scale {s:e}"
            );
        }
    }
}

/// Whether any operand holds ±inf.
fn has_infinity(o: &Ops<f64>) -> bool {
    [&o.input, &o.offset, &o.mask, &o.weight, &o.grad_out]
        .iter()
        .any(|a| a.iter().any(|v| v.is_infinite()))
        || o.bias.iter().any(|v| v.is_infinite())
}

/// Replaces about a fifth of the elements of each operand by one of `specials`. Offsets get
/// only the non-finite and huge ones (not subnormals): the oracle rounds `base + dy` in f64
/// while the fast path keeps the fraction exact, so a tiny offset is a different sample
/// position for the two (reported; see `docs/hostile-inputs.md`).
fn sprinkle(o: &mut Ops<f64>, specials: &[f64], seed: u64) {
    let mut r = Rng::new(seed);
    let mut pick = |v: &mut f64, offsets: bool| {
        if r.unit() < 0.2 {
            let s = specials[(r.unit() * specials.len() as f64) as usize % specials.len()];
            if !offsets || s == 0.0 || !s.is_finite() || s.abs() >= 1.0 {
                *v = s;
            }
        }
    };
    for a in [&mut o.input, &mut o.mask, &mut o.weight, &mut o.grad_out] {
        a.iter_mut().for_each(|v| pick(v, false));
    }
    o.offset.iter_mut().for_each(|v| pick(v, true));
    o.bias.iter_mut().for_each(|v| pick(v, false));
}

fn to_f32(o: &Ops<f64>) -> Ops<f32> {
    let c = |a: &Array4<f64>| a.mapv(|v| v as f32);
    Ops {
        input: c(&o.input),
        offset: c(&o.offset),
        mask: c(&o.mask),
        weight: c(&o.weight),
        bias: o.bias.mapv(|v| v as f32),
        grad_out: c(&o.grad_out),
    }
}

/// The reference (f64) on the operands of `o`, with the mask.
fn exact<T: Float>(o: &Ops<T>, p: &ConvParams) -> [Array4<f64>; 5] {
    let (i, off, w, g) = (
        o.input.view(),
        o.offset.view(),
        o.weight.view(),
        o.grad_out.view(),
    );
    let m = Some(o.mask.view());
    let b: Option<ArrayView1<'_, T>> = Some(o.bias.view());
    let (is, ws) = (shape4(i.shape()), shape4(w.shape()));
    [
        reference::deform_conv2d(i, off, m, w, b, p).unwrap(),
        reference::grad_input(g, off, m, w, is, p).unwrap(),
        reference::grad_offset(g, i, off, m, w, p).unwrap(),
        reference::grad_mask(g, i, off, w, p).unwrap(),
        reference::grad_weight(g, i, off, m, ws, p).unwrap(),
    ]
}

const NAMES: [&str; 5] = [
    "out",
    "grad_input",
    "grad_offset",
    "grad_mask",
    "grad_weight",
];

/// f64, "huge" regime: NaN, ±inf and ±1e38 (finite in f64 even when multiplied).
const HUGE_F64: [f64; 6] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e38,
    -1e38,
    -0.0,
];
/// f64, "tiny" regime: NaN and subnormals. Kept apart from 1e38 and ±inf: a subnormal product
/// may underflow to 0 in one association and not in another (`(w * m) * inf` is NaN when
/// `w * m` underflows, `w * (m * inf)` is inf), so which of NaN and inf comes out is an
/// accident of evaluation order there.
const TINY_F64: [f64; 5] = [f64::NAN, 5e-324, -1e-310, f64::MIN_POSITIVE, -0.0];

/// f32-representable, "huge" regime: NaN, ±inf, ±1e38 (overflows in f32 products).
const HUGE_F32: [f64; 6] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e38f32 as f64,
    -1e38f32 as f64,
    -0.0,
];
/// f32-representable, "tiny" regime: NaN and f32 subnormals (which carry few significant
/// bits: kept apart from 1e38, whose products with them would amplify that).
const TINY_F32: [f64; 4] = [f64::NAN, 1e-40f32 as f64, -1.0e-45f32 as f64, -0.0];

fn check_non_finite_f64(case: &Case, seed: u64, specials: &[f64]) {
    let p = &case.params;
    let mut o = Ops::<f64>::from_case(case);
    sprinkle(&mut o, specials, seed);
    let e = everything(&o, p);
    let want = exact(&o, p);
    let scale = magnitudes(&o, p);
    let got = [
        &e.forward,
        &e.separate[0],
        &e.separate[1],
        &e.separate[2],
        &e.separate[3],
    ];
    for k in 0..5 {
        follows(
            NAMES[k],
            got[k],
            &want[k],
            &scale[k],
            (1e-12, 1e-300),
            has_infinity(&o),
        );
    }
    let gb = reference::grad_bias(o.grad_out.view()).unwrap();
    for (f, r) in e.bias.iter().zip(gb.iter()) {
        assert!(f.is_nan() == r.is_nan() && (r.is_nan() || r.is_infinite() == f.is_infinite()));
    }
    // The combined backward gives the same bits as the separate functions (any NaN for NaN:
    // the sign of a NaN depends on which operand carried it).
    let combined = [
        &e.grads.input,
        &e.grads.offset,
        &e.grads.mask,
        &e.grads.weight,
    ];
    for k in 0..4 {
        let c = combined[k].as_ref().unwrap();
        assert!(
            c.iter()
                .zip(e.separate[k].iter())
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "{}: combined vs separate",
            NAMES[k + 1]
        );
    }
}

/// f32: no panic; NaN where the f64 reference on the same (f32) numbers is NaN; the values
/// within f32 rounding where both are finite and the reference is small enough for f32.
fn check_non_finite_f32(case: &Case, seed: u64, specials: &[f64]) {
    let p = &case.params;
    let mut o64 = Ops::<f64>::from_case(case);
    sprinkle(&mut o64, specials, seed);
    let o = to_f32(&o64);
    let e = everything(&o, p);
    let want = exact(&o, p);
    let mut scale = magnitudes(&o64, p);
    // Where a term could overflow f32, only the NaN pattern is checked.
    for s in scale.iter_mut() {
        s.mapv_inplace(|v| if v < 1e30 { v } else { f64::INFINITY });
    }
    let infinities = has_infinity(&o64);
    let got = [
        &e.forward,
        &e.separate[0],
        &e.separate[1],
        &e.separate[2],
        &e.separate[3],
    ];
    for k in 0..5 {
        for ((idx, f), &r) in got[k].indexed_iter().zip(want[k].iter()) {
            assert!(
                !r.is_nan() || f.is_nan() || (infinities && f.is_infinite()),
                "{}{idx:?}: reference NaN, fast {f} (see `follows` for infinities)",
                NAMES[k]
            );
        }
        // Values are compared where both are finite and the reference is below 1e30: an f32
        // product of two 1e38 overflows to inf (and `0 * inf` to NaN) where f64 does not.
        let both = Array4::from_shape_fn(got[k].raw_dim(), |ix| {
            let (f, r) = (got[k][ix], want[k][ix]);
            f.is_finite() && r.abs() < 1e30
        });
        let pick = |a: &Array4<f64>| {
            Array4::from_shape_fn(a.raw_dim(), |ix| if both[ix] { a[ix] } else { f64::NAN })
        };
        let fast = got[k].mapv(f64::from);
        follows(
            NAMES[k],
            &pick(&fast),
            &pick(&want[k]),
            &scale[k],
            (1e-4, 1e-30),
            infinities,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn huge_and_non_finite_values_follow_the_reference_f64(case in cases(), seed in any::<u64>()) {
        check_non_finite_f64(&case, seed, &HUGE_F64);
    }

    #[test]
    fn tiny_and_non_finite_values_follow_the_reference_f64(case in cases(), seed in any::<u64>()) {
        check_non_finite_f64(&case, seed, &TINY_F64);
    }

    #[test]
    fn huge_and_non_finite_values_follow_the_reference_f32(case in cases(), seed in any::<u64>()) {
        check_non_finite_f32(&case, seed, &HUGE_F32);
    }

    #[test]
    fn tiny_and_non_finite_values_follow_the_reference_f32(case in cases(), seed in any::<u64>()) {
        check_non_finite_f32(&case, seed, &TINY_F32);
    }
}

/// Offsets right at the window edges and integers, exactly and just off them: the fast path
/// (f64) equals the reference exactly there too.
#[test]
fn offsets_on_and_next_to_the_window_edges() {
    let p = ConvParams::default().padding(1, 1);
    let mut o = Ops::<f64>::random([1, 2, 4, 5], [2, 2, 3, 3], &p, 11);
    // 2^-20 off: exact in `base + dy` for both (one ulp off is a known disagreement between
    // the oracle's rounded sum and the fast path's exact fraction, reported separately).
    let t = 1.0 / (1u64 << 20) as f64;
    let edges = [
        -1.0,
        -1.0 - t,
        -1.0 + t,
        3.0,
        4.0,
        4.0 - t,
        4.0 + t,
        5.0,
        -2.0,
        0.0,
        1.0 - t,
        -t,
    ];
    let mut r = Rng::new(3);
    o.offset
        .iter_mut()
        .for_each(|v| *v = edges[(r.unit() * edges.len() as f64) as usize % edges.len()]);
    let e = everything(&o, &p);
    let want = exact(&o, &p);
    let scale = magnitudes(&o, &p);
    let got = [
        &e.forward,
        &e.separate[0],
        &e.separate[1],
        &e.separate[2],
        &e.separate[3],
    ];
    for k in 0..5 {
        follows(NAMES[k], got[k], &want[k], &scale[k], (1e-12, 0.0), false);
    }
}

/// The deformable backward addresses a task's padded input planes with `i32` bases: a plane of
/// more than `2^30 - 1` cells with its border, `(H + 2) * (W + 3)`, is refused up front (the
/// forward refuses planes past `2^31 - 1` pixels the same way). 32768 x 32768 is just past it.
#[test]
fn deformable_backward_refuses_planes_past_its_cell_limit() {
    use ndarray::ShapeBuilder;
    let side = 1usize << 15;
    let zero = [0.0f32];
    // Zero strides: every element is the one zero, nothing of that size is allocated.
    let view = |s: (usize, usize, usize, usize)| {
        ArrayView4::from_shape(s.strides((0, 0, 0, 0)), &zero).unwrap()
    };
    let d = ConvParams::default().padding(1, 1);
    let (input, weight) = (view((1, 1, side, side)), view((1, 1, 3, 3)));
    let (offset, mask) = (view((1, 18, side, side)), view((1, 9, side, side)));
    let grad_out = view((1, 1, side, side));
    let refused = |e: Result<(), Error>| match e {
        Err(Error::TooLarge { what }) => assert!(what.contains("deformable backward"), "{what}"),
        other => panic!("{other:?}"),
    };
    refused(
        deform_conv2d_backward(grad_out, input, offset, Some(mask), weight, &d, Want::ALL)
            .map(|_| ()),
    );
    let shape = [1, 1, side, side];
    refused(deform_conv2d_grad_input(grad_out, offset, None, weight, shape, &d).map(|_| ()));
    refused(deform_conv2d_grad_offset(grad_out, input, offset, None, weight, &d).map(|_| ()));
    refused(deform_conv2d_grad_mask(grad_out, input, offset, weight, &d).map(|_| ()));
    refused(deform_conv2d_grad_weight(grad_out, input, offset, None, [1, 1, 3, 3], &d).map(|_| ()));
}
