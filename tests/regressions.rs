//! Regression tests for bugs found by the hostile-input tests, each with the inputs that
//! showed it.

use deformconv::{conv2d, deform_conv2d, deform_conv2d_grad_offset, reference, ConvParams};
use ndarray::{s, Array1, Array4};

/// A bias view with stride -1 (`bias.slice(s![..;-1])`) was copied with `to_owned`, which
/// keeps the negative stride, and the forward returned an internal layout error.
#[test]
fn reversed_bias_view_equals_its_contiguous_copy() {
    let input = Array4::from_shape_fn((1, 2, 4, 4), |(_, c, y, x)| (c * 16 + y * 4 + x) as f32);
    let weight = Array4::from_elem((3, 2, 3, 3), 0.25f32);
    let offset = Array4::<f32>::zeros((1, 18, 2, 2));
    let stored = Array1::from_vec(vec![1.0f32, 2.0, 3.0]);
    let reversed = stored.slice(s![..;-1]); // [3, 2, 1], stride -1
    let contiguous = Array1::from_vec(vec![3.0f32, 2.0, 1.0]);
    let p = ConvParams::default();
    let want = conv2d(input.view(), weight.view(), Some(contiguous.view()), &p).unwrap();
    assert_eq!(
        conv2d(input.view(), weight.view(), Some(reversed), &p).unwrap(),
        want
    );
    let (iv, ov, wv) = (input.view(), offset.view(), weight.view());
    let want = deform_conv2d(iv, ov, None, wv, Some(contiguous.view()), &p).unwrap();
    assert_eq!(
        deform_conv2d(iv, ov, None, wv, Some(reversed), &p).unwrap(),
        want
    );
}

/// The reference's dense conv formed `(y*stride + i*dil) as f64 - pad as f64`, which rounds
/// once the sum passes 2^53; positions are now exact integers.
#[test]
fn dense_conv_with_stride_and_padding_2_pow_62() {
    // Image rows r = 0..4, columns s = 0..2: value 10 r + s. Kernel 3x1: taps 1, 100, 10000.
    let input = Array4::from_shape_fn((1, 1, 4, 2), |(_, _, r, s)| (10 * r + s) as f64);
    let weight = Array4::from_shape_vec((1, 1, 3, 1), vec![1.0, 100.0, 10000.0]).unwrap();
    let p = ConvParams::default().padding(1 << 62, 0).stride(1 << 62, 1);
    // H_out = 3; base rows -2^62, 0, 2^62. Row 1 reads rows 0, 1, 2:
    // s + 100 (10 + s) + 10000 (20 + s) = 201000 + 10101 s.
    let mut want = Array4::<f64>::zeros((1, 1, 3, 2));
    want[[0, 0, 1, 0]] = 201000.0;
    want[[0, 0, 1, 1]] = 211101.0;
    let offset = Array4::<f64>::zeros((1, 6, 3, 2));
    let (iv, wv) = (input.view(), weight.view());
    assert_eq!(conv2d(iv, wv, None, &p).unwrap(), want);
    assert_eq!(
        deform_conv2d(iv, offset.view(), None, wv, None, &p).unwrap(),
        want
    );
    assert_eq!(reference::conv2d(iv, wv, None, &p).unwrap(), want);
    assert_eq!(
        reference::deform_conv2d(iv, offset.view(), None, wv, None, &p).unwrap(),
        want
    );
}

/// The reference formed `base + dy` in f64: `2 + (1 - 2^-53)` rounds to 3, which moved the
/// sample's corners (offset gradient -9 instead of 5). Positions are now `whole + fraction`,
/// exactly, as in the fast path.
#[test]
fn offset_one_ulp_below_an_integer_keeps_its_corners() {
    let input = Array4::from_shape_vec((1, 1, 4, 1), vec![0.0, 1.0, 4.0, 9.0]).unwrap();
    let weight = Array4::from_elem((1, 1, 1, 1), 1.0);
    let mut offset = Array4::<f64>::zeros((1, 2, 4, 1));
    // Just below row 3: corners 2 and 3, so Wy = v(3) - v(2) = 9 - 4 = 5.
    offset[[0, 0, 2, 0]] = 1.0 - f64::EPSILON / 2.0;
    let grad_out = Array4::from_elem((1, 1, 4, 1), 1.0);
    let p = ConvParams::default();
    let (gv, iv, ov, wv) = (grad_out.view(), input.view(), offset.view(), weight.view());
    let r = reference::grad_offset(gv, iv, ov, None, wv, &p).unwrap();
    let f = deform_conv2d_grad_offset(gv, iv, ov, None, wv, &p).unwrap();
    assert_eq!(r[[0, 0, 2, 0]], 5.0);
    assert_eq!(f[[0, 0, 2, 0]], 5.0);
}

/// An empty batch with an absurd (but `isize`-addressable) weight gradient passed validation
/// and then aborted the process in the allocator; it is now an `Err(TooLarge)`.
#[test]
fn absurd_weight_gradient_of_an_empty_batch_is_an_error_not_an_abort() {
    // The allocation is refused only where the kernel does not overcommit without limit.
    let heuristic = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .map(|s| s.trim() != "1")
        .unwrap_or(false);
    if !heuristic {
        eprintln!("overcommit_memory = 1: an 8 TiB allocation would be granted; not attempted");
        return;
    }
    let c_out = 1usize << 40;
    let input = Array4::<f64>::zeros((0, 1, 5, 5));
    let offset = Array4::<f64>::zeros((0, 18, 3, 3));
    let grad_out = Array4::<f64>::zeros((0, c_out, 3, 3));
    let shape = [c_out, 1, 3, 3];
    let p = ConvParams::default();
    let (gv, iv, ov) = (grad_out.view(), input.view(), offset.view());
    let fast = deformconv::deform_conv2d_grad_weight(gv, iv, ov, None, shape, &p);
    assert!(
        matches!(fast, Err(deformconv::Error::TooLarge { .. })),
        "{fast:?}"
    );
    let exact = reference::grad_weight(gv, iv, ov, None, shape, &p);
    assert!(
        matches!(exact, Err(deformconv::Error::TooLarge { .. })),
        "{exact:?}"
    );
}

/// Found by the `values` fuzz target: the reference formed `(weight * m) * B`, which
/// overflows to inf (and `inf * 0 = NaN`) for a huge weight and mask on a sample outside the
/// image, where the column value `m * B` (what the fast path and torchvision multiply by the
/// weight) is exactly 0.
#[test]
fn huge_weight_times_huge_mask_on_an_outside_sample_is_zero() {
    let input = Array4::from_elem((1, 1, 1, 1), 3.8125f64);
    let weight = Array4::from_elem((1, 1, 1, 1), -1e300f64);
    let offset = Array4::from_elem((1, 2, 1, 1), 3.8125f64); // far below the 1x1 image
    let mask = Array4::from_elem((1, 1, 1, 1), -1e38f64);
    let p = ConvParams::default();
    let (iv, ov, mv, wv) = (input.view(), offset.view(), mask.view(), weight.view());
    let exact = reference::deform_conv2d(iv, ov, Some(mv), wv, None, &p).unwrap();
    let fast = deform_conv2d(iv, ov, Some(mv), wv, None, &p).unwrap();
    assert_eq!(exact[[0, 0, 0, 0]], 0.0);
    assert_eq!(fast[[0, 0, 0, 0]], 0.0);
}

/// Found by the `values` fuzz target: for an offset a few ulps below an integer the
/// fraction rounds to 1 and the reference's `1 - frac` gave 0, while the true weight of the
/// upper corner (and the fast path's exact complement `(floor + 1) - d`) is those few ulps.
#[test]
fn weight_of_the_upper_corner_keeps_its_ulps() {
    use deformconv::Padding;
    let d = -4.408185691408912e-18f64; // fraction 1 - 4.4e-18 rounds to 1.0
    let input = Array4::from_elem((1, 1, 1, 1), -1.0f64);
    let weight = Array4::from_elem((1, 1, 1, 1), -4.0f64);
    // One padding row below the 1x1 image: output row 1 samples at base row 1.
    let p = ConvParams::default().padding_sides(Padding {
        top: 0,
        bottom: 1,
        left: 0,
        right: 0,
    });
    let mut offset = Array4::<f64>::zeros((1, 2, 2, 1));
    offset[[0, 0, 1, 0]] = d;
    let (iv, ov, wv) = (input.view(), offset.view(), weight.view());
    let exact = reference::deform_conv2d(iv, ov, None, wv, None, &p).unwrap();
    let fast = deform_conv2d(iv, ov, None, wv, None, &p).unwrap();
    // py = 1 + d: corners row 0 (weight 1 - frac = |d|) and row 1 (outside, reads 0), so
    // out = -4 * |d| * -1 = 4 |d|, not 0.
    let want = 4.0 * -d;
    assert_eq!(exact[[0, 0, 1, 0]], want);
    assert_eq!(fast[[0, 0, 1, 0]], want);
}
