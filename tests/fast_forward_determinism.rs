//! Bitwise determinism of the fast forward path: the same bits for rayon pools of 1, 2, 3 and
//! 8 threads, and for an image computed alone or inside batches of 2, 7 and 64.

mod support;

use deformconv::{conv2d, deform_conv2d, ConvParams, Convention, Float};
use ndarray::{s, Array4};
use support::{same_bits, Case};

/// Large enough that each image splits into several tiles (576 column rows x 1024 pixels).
fn multi_tile_case(n: usize) -> Case {
    Case {
        n,
        c_in: 64,
        c_out: 32,
        h: 32,
        w: 32,
        kh: 3,
        kw: 3,
        params: ConvParams::default().padding(1, 1).offset_groups(2),
        mask: true,
        bias: true,
        seed: 99,
    }
}

fn run<T: Float>(case: &Case, convert: impl Fn(f64) -> T, dense: bool) -> Array4<T> {
    let t = case.tensors();
    let input = t.input.mapv(&convert);
    let offset = t.offset.mapv(&convert);
    let mask = t.mask.as_ref().map(|m| m.mapv(&convert));
    let weight = t.weight.mapv(&convert);
    let bias = t.bias.as_ref().map(|b| b.mapv(&convert));
    if dense {
        conv2d(
            input.view(),
            weight.view(),
            bias.as_ref().map(|b| b.view()),
            &case.params,
        )
        .unwrap()
    } else {
        deform_conv2d(
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            bias.as_ref().map(|b| b.view()),
            &case.params,
        )
        .unwrap()
    }
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

fn check_thread_counts<T: Float + Into<f64>>(convert: impl Fn(f64) -> T + Sync, dense: bool) {
    let case = multi_tile_case(3);
    let one = in_pool(1, || run(&case, &convert, dense));
    for threads in [2, 3, 8] {
        let many = in_pool(threads, || run(&case, &convert, dense));
        assert!(
            same_bits(&one, &many),
            "{} dense={dense}: {threads} threads differ from 1",
            T::NAME
        );
    }
}

#[test]
fn deform_f32_is_bitwise_identical_for_1_2_3_8_threads() {
    check_thread_counts(|v| v as f32, false);
}

#[test]
fn deform_f64_is_bitwise_identical_for_1_2_3_8_threads() {
    check_thread_counts(|v| v, false);
}

#[test]
fn conv2d_f32_is_bitwise_identical_for_1_2_3_8_threads() {
    check_thread_counts(|v| v as f32, true);
}

/// Image `n` of a batch of 7 equals the same image in batches of 1 and 2.
fn check_batch_independence(dense: bool) {
    let seven = multi_tile_case(7);
    let t = seven.tensors();
    let full = run(&seven, |v| v as f32, dense);
    for (first, count) in [(0usize, 1usize), (3, 1), (6, 1), (1, 2), (5, 2)] {
        let part = |a: &Array4<f64>| a.slice(s![first..first + count, .., .., ..]).to_owned();
        let mask = t.mask.as_ref().map(|m| part(m).mapv(|v| v as f32));
        let (input, offset, weight) = (
            part(&t.input).mapv(|v| v as f32),
            part(&t.offset).mapv(|v| v as f32),
            t.weight.mapv(|v| v as f32),
        );
        let bias = t.bias.as_ref().map(|b| b.mapv(|v| v as f32));
        let alone = if dense {
            conv2d(
                input.view(),
                weight.view(),
                bias.as_ref().map(|b| b.view()),
                &seven.params,
            )
        } else {
            deform_conv2d(
                input.view(),
                offset.view(),
                mask.as_ref().map(|m| m.view()),
                weight.view(),
                bias.as_ref().map(|b| b.view()),
                &seven.params,
            )
        }
        .unwrap();
        let inside = full.slice(s![first..first + count, .., .., ..]).to_owned();
        assert!(
            same_bits(&alone, &inside),
            "dense={dense}: images {first}..{} alone differ from inside the batch of 7",
            first + count
        );
    }
}

#[test]
fn deform_image_alone_equals_image_in_batches_of_2_and_7() {
    check_batch_independence(false);
}

#[test]
fn conv2d_image_alone_equals_image_in_batches_of_2_and_7() {
    check_batch_independence(true);
}

/// Small images (one tile each) so that a batch of 64 stays fast.
fn small_case(n: usize, convention: Convention) -> Case {
    Case {
        n,
        c_in: 4,
        c_out: 6,
        h: 6,
        w: 7,
        kh: 3,
        kw: 3,
        params: ConvParams::default()
            .padding(1, 1)
            .offset_groups(2)
            .convention(convention),
        mask: true,
        bias: true,
        seed: 64,
    }
}

/// Every image of a batch of 64 equals the same image computed alone (a batch of 1) and
/// inside batches of 2 and 7 cut from the same data, bit for bit, in every convention.
fn check_batch_of_64<T: Float + Into<f64>>(convert: impl Fn(f64) -> T + Copy) {
    for convention in Convention::ALL {
        let all = small_case(64, convention);
        let t = all.tensors();
        let full = run(&all, convert, false);
        let sub = |first: usize, count: usize| {
            let part = |a: &Array4<f64>| a.slice(s![first..first + count, .., .., ..]).to_owned();
            let mask = t.mask.as_ref().map(|m| part(m).mapv(convert));
            let got = deform_conv2d(
                part(&t.input).mapv(convert).view(),
                part(&t.offset).mapv(convert).view(),
                mask.as_ref().map(|m| m.view()),
                t.weight.mapv(convert).view(),
                t.bias
                    .as_ref()
                    .map(|b| b.mapv(convert))
                    .as_ref()
                    .map(|b| b.view()),
                &all.params,
            )
            .unwrap();
            let inside = full.slice(s![first..first + count, .., .., ..]).to_owned();
            assert!(
                same_bits(&got, &inside),
                "{} {convention:?}: images {first}..{} differ from inside the batch of 64",
                T::NAME,
                first + count
            );
        };
        for first in 0..64 {
            sub(first, 1);
        }
        for first in [0, 31, 62] {
            sub(first, 2);
        }
        for first in [0, 28, 57] {
            sub(first, 7);
        }
    }
}

#[test]
fn deform_f32_image_alone_equals_image_in_batches_of_2_7_and_64() {
    check_batch_of_64(|v| v as f32);
}

#[test]
fn deform_f64_image_alone_equals_image_in_batches_of_2_7_and_64() {
    check_batch_of_64(|v| v);
}
