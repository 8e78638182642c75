//! The backward gives the same bits for rayon pools of 1, 2, 3 and 8 threads, in f32 and f64,
//! on problems that exercise every part of the partition: images split into several pixel tiles,
//! many small images packed per tile, several slots, offset groups spanning conv groups.

mod support;

use deformconv::{conv2d_backward, deform_conv2d_backward, ConvParams, Float, Grads, Want};
use ndarray::Array4;
use support::{to_f32, Case, Rng};

fn problems() -> Vec<Case> {
    let base = Case {
        n: 3,
        c_in: 8,
        c_out: 6,
        h: 24,
        w: 24,
        kh: 3,
        kw: 3,
        params: ConvParams::default().padding(1, 1).offset_groups(2),
        mask: true,
        bias: false,
        seed: 1,
    };
    vec![
        // 576 pixels per image: two tiles per image, two slots.
        base,
        // 25 pixels per image: up to twenty images per tile, two groups.
        Case {
            n: 37,
            h: 5,
            w: 5,
            seed: 2,
            ..base
        },
        // Offset groups cutting across conv groups (segments), strided, no mask.
        Case {
            n: 5,
            c_in: 6,
            c_out: 4,
            h: 9,
            w: 11,
            params: ConvParams::default()
                .stride(2, 1)
                .padding(1, 2)
                .groups(2)
                .offset_groups(3),
            mask: false,
            seed: 3,
            ..base
        },
    ]
}

fn bits<T: Float>(a: &Option<Array4<T>>, b: &Option<Array4<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.shape() == b.shape()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
        }
        (None, None) => true,
        _ => false,
    }
}

fn same<T: Float>(a: &Grads<T>, b: &Grads<T>) -> bool {
    bits(&a.input, &b.input)
        && bits(&a.offset, &b.offset)
        && bits(&a.mask, &b.mask)
        && bits(&a.weight, &b.weight)
        && match (&a.bias, &b.bias) {
            (Some(x), Some(y)) => x
                .iter()
                .zip(y)
                .all(|(p, q)| p.to_f64().to_bits() == q.to_f64().to_bits()),
            (None, None) => true,
            _ => false,
        }
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn bitwise_identical_for_1_2_3_and_8_threads() {
    for case in problems() {
        let t = case.tensors();
        let p = case.params;
        let mut r = Rng::new(case.seed + 100);
        let g_out = Array4::from_shape_fn(case.geometry().out_shape(), |_| r.value());
        let run64 = || {
            let mask = t.mask.as_ref().map(|m| m.view());
            let d = deform_conv2d_backward(
                g_out.view(),
                t.input.view(),
                t.offset.view(),
                mask,
                t.weight.view(),
                &p,
                Want::ALL,
            )
            .unwrap();
            let c = conv2d_backward(g_out.view(), t.input.view(), t.weight.view(), &p, Want::ALL)
                .unwrap();
            (d, c)
        };
        let (i32_, o32, m32, w32, g32) = (
            to_f32(&t.input),
            to_f32(&t.offset),
            t.mask.as_ref().map(to_f32),
            to_f32(&t.weight),
            to_f32(&g_out),
        );
        let run32 = || {
            deform_conv2d_backward(
                g32.view(),
                i32_.view(),
                o32.view(),
                m32.as_ref().map(|m| m.view()),
                w32.view(),
                &p,
                Want::ALL,
            )
            .unwrap()
        };
        let (want64, want_dense) = in_pool(1, run64);
        let want32 = in_pool(1, run32);
        for threads in [2, 3, 8] {
            let (got64, got_dense) = in_pool(threads, run64);
            assert!(
                same(&got64, &want64),
                "{case:?}: f64 deformable, {threads} threads"
            );
            assert!(
                same(&got_dense, &want_dense),
                "{case:?}: f64 dense, {threads} threads"
            );
            let got32 = in_pool(threads, run32);
            assert!(same(&got32, &want32), "{case:?}: f32, {threads} threads");
        }
    }
}
