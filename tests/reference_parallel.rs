//! The reference oracle runs in parallel, each element's sum in the order of the serial loops
//! it started as: bitwise the same results as those loops (kept in `reference_parallel/serial.rs`)
//! and bitwise the same for 1, 2 and 8 threads.
#![cfg(feature = "testing")]

#[path = "reference_parallel/serial.rs"]
mod serial;

use deformconv::testing::{problems, Problem};
use deformconv::{reference, Convention};
use ndarray::{Array4, ArrayD, Dimension};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

/// Every result of `p` by the parallel oracle: out, grad_input, grad_offset, grad_mask,
/// grad_weight (grad_mask always, also without a mask).
fn parallel(p: &Problem<f64>) -> Vec<ArrayD<f64>> {
    let (x, off, w, go) = (
        p.input.view(),
        p.offset.view(),
        p.weight.view(),
        p.grad_out.view(),
    );
    let m = p.mask.as_ref().map(|m| m.view());
    let b = p.bias.as_ref().map(|b| b.view());
    let (is, ws, pp) = (dim4(x.shape()), dim4(w.shape()), &p.params);
    vec![
        reference::deform_conv2d(x, off, m, w, b, pp)
            .unwrap()
            .into_dyn(),
        reference::grad_input(go, off, m, w, is, pp)
            .unwrap()
            .into_dyn(),
        reference::grad_offset(go, x, off, m, w, pp)
            .unwrap()
            .into_dyn(),
        reference::grad_mask(go, x, off, w, pp).unwrap().into_dyn(),
        reference::grad_weight(go, x, off, m, ws, pp)
            .unwrap()
            .into_dyn(),
        reference::conv2d(x, w, b, pp).unwrap().into_dyn(),
    ]
}

fn serial(p: &Problem<f64>) -> Vec<ArrayD<f64>> {
    let (x, off, w, go) = (
        p.input.view(),
        p.offset.view(),
        p.weight.view(),
        p.grad_out.view(),
    );
    let m = p.mask.as_ref().map(|m| m.view());
    let b = p.bias.as_ref().map(|b| b.view());
    let (is, ws, pp) = (dim4(x.shape()), dim4(w.shape()), &p.params);
    vec![
        serial::deform_conv2d(x, off, m, w, b, pp)
            .unwrap()
            .into_dyn(),
        serial::grad_input(go, off, m, w, is, pp)
            .unwrap()
            .into_dyn(),
        serial::grad_offset(go, x, off, m, w, pp)
            .unwrap()
            .into_dyn(),
        serial::grad_mask(go, x, off, w, pp).unwrap().into_dyn(),
        serial::grad_weight(go, x, off, m, ws, pp)
            .unwrap()
            .into_dyn(),
        serial::conv2d(x, w, b, pp).unwrap().into_dyn(),
    ]
}

fn dim4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// Bitwise equality (every NaN equal to every NaN), with the first difference in the message.
fn same_bits(a: &[ArrayD<f64>], b: &[ArrayD<f64>]) -> std::result::Result<(), String> {
    const NAMES: [&str; 6] = [
        "out",
        "grad_input",
        "grad_offset",
        "grad_mask",
        "grad_weight",
        "conv2d",
    ];
    for ((x, y), name) in a.iter().zip(b).zip(NAMES) {
        if x.shape() != y.shape() {
            return Err(format!("{name}: shapes {:?} vs {:?}", x.shape(), y.shape()));
        }
        for ((i, u), v) in x.indexed_iter().zip(y.iter()) {
            if u.to_bits() != v.to_bits() && !(u.is_nan() && v.is_nan()) {
                return Err(format!("{name}{:?}: {u:e} vs {v:e}", i.slice()));
            }
        }
    }
    Ok(())
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn parallel_reference_is_bitwise_the_serial_one(p in problems::<f64>(), conv in 0usize..3) {
        let mut p = p;
        p.params = p.params.convention(Convention::ALL[conv]);
        let fast = parallel(&p);
        let slow = serial(&p);
        prop_assert!(same_bits(&fast, &slow).is_ok(), "{:?}", same_bits(&fast, &slow));
    }
}

/// A larger problem (several pixel tasks per image, several weight blocks), with NaN and
/// infinite offsets mixed in, under 1, 2 and 8 threads and against the serial loops.
#[test]
fn the_same_bits_for_1_2_and_8_threads() {
    let mut runner = TestRunner::deterministic();
    let mut checked = 0;
    for round in 0..6 {
        let mut p = problems::<f64>().new_tree(&mut runner).unwrap().current();
        if round == 0 {
            // Enough output pixels for many tasks, enough channels for several weight blocks.
            let (n, c, h, w) = (2, 12, 13, 11);
            p.input = Array4::from_shape_fn((n, c, h, w), |(a, b, y, x)| {
                ((a * 7 + b * 13 + y * 5 + x * 3) % 17) as f64 / 4.0 - 2.0
            });
            p.weight = Array4::from_shape_fn((6, c / 2, 3, 3), |(a, b, y, x)| {
                ((a * 5 + b * 3 + y + x * 7) % 11) as f64 / 8.0 - 0.6
            });
            p.params = deformconv::ConvParams::default()
                .padding(1, 1)
                .groups(2)
                .offset_groups(3);
            p.offset = Array4::from_shape_fn((n, 54, h, w), |(a, b, y, x)| {
                match (a * 31 + b * 17 + y * 7 + x) % 23 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => -1.0 - y as f64,
                    v => (v as f64 - 11.0) * 0.37,
                }
            });
            p.mask = Some(Array4::from_shape_fn((n, 27, h, w), |(a, b, y, x)| {
                ((a + b * 3 + y * 5 + x) % 7) as f64 / 3.0 - 0.5
            }));
            p.bias = None;
            p.grad_out = Array4::from_shape_fn((n, 6, h, w), |(a, b, y, x)| {
                ((a * 3 + b * 11 + y * 13 + x * 5) % 19) as f64 / 9.0 - 1.0
            });
        }
        let one = in_pool(1, || parallel(&p));
        let two = in_pool(2, || parallel(&p));
        let eight = in_pool(8, || parallel(&p));
        same_bits(&one, &two).unwrap();
        same_bits(&one, &eight).unwrap();
        same_bits(&one, &serial(&p)).unwrap();
        checked += one.iter().map(|a| a.len()).sum::<usize>();
    }
    assert!(checked > 10_000, "only {checked} elements compared");
}
