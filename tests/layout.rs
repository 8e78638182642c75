//! Layout conversions: weights of other frameworks (Lasagne, Theano, TensorFlow, TensorFlow
//! Lite), NHWC tensors, and offset/mask channel layouts (mmcv, MindSpore/Ascend, ...).
//!
//! Each conversion is tested as a round trip, element by element against the framework's
//! index formula written out here, and by a convolution: what the other framework computes
//! with its layout (hand-written loops from its documented formula) equals our reference on
//! the converted tensors.

mod support;

use deformconv::layout::{
    from_oihw, load_weight, nchw_to_nhwc, nhwc_to_nchw, oihw_shape, to_oihw, Flip, WeightLayout,
};
use deformconv::offset_layout::{
    convert_offset, pack_offset_mask, unpack_offset_mask, OffsetLayout, PackedLayout,
};
use deformconv::{reference, ConvParams, Error, Padding, Result};
use ndarray::{s, Array1, Array4, ArrayView1, ArrayView4, ShapeBuilder};
use proptest::prelude::*;

const LAYOUTS: [WeightLayout; 4] = [
    WeightLayout::Oihw,
    WeightLayout::Iohw,
    WeightLayout::Hwio,
    WeightLayout::Ohwi,
];
const FLIPS: [Flip; 2] = [Flip::None, Flip::Spatial];
const OFFSET_LAYOUTS: [OffsetLayout; 4] = [
    OffsetLayout::InterleavedYx,
    OffsetLayout::InterleavedXy,
    OffsetLayout::PlanarYx,
    OffsetLayout::BlocksXy,
];
const PACKED: [PackedLayout; 2] = [PackedLayout::MmcvChunks, PackedLayout::XyMaskBlocks];

/// Deterministic pseudo-random small integers in `[-4, 4]` (exact in f64, so sums taken in
/// any order agree bitwise).
fn ints(shape: [usize; 4], seed: u64) -> Array4<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Array4::from_shape_simple_fn(shape, || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 32) % 9) as f64 - 4.0
    })
}

/// Deterministic pseudo-random offsets: multiples of 1/8 in `[-2, 2]`, many of them fractional.
fn offsets(shape: [usize; 4], seed: u64) -> Array4<f64> {
    let mut state = seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    Array4::from_shape_simple_fn(shape, || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 32) % 33) as f64 / 8.0 - 2.0
    })
}

fn dims(a: &Array4<f64>) -> [usize; 4] {
    let s = a.shape();
    [s[0], s[1], s[2], s[3]]
}

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

/// Index into a weight stored in `layout` of our element `[o, c, i, j]`, written out per
/// framework (not derived from the crate's tables).
fn stored_index(layout: WeightLayout, [o, c, i, j]: [usize; 4]) -> [usize; 4] {
    match layout {
        WeightLayout::Oihw => [o, c, i, j], // PyTorch / ONNX: W[o, c, i, j]
        WeightLayout::Iohw => [c, o, i, j], // Lasagne DilatedConv2DLayer: W[c, o, i, j]
        WeightLayout::Hwio => [i, j, c, o], // TensorFlow: filter[di, dj, q, k]
        WeightLayout::Ohwi => [o, i, j, c], // TFLite: filter[out, fy, fx, in]
    }
}

fn stored_shape(layout: WeightLayout, oihw: [usize; 4]) -> [usize; 4] {
    stored_index(layout, oihw)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn weight_round_trips_both_ways(
        o in 1usize..5, c in 1usize..5, kh in 1usize..4, kw in 1usize..4,
        l in 0usize..4, f in 0usize..2, seed in any::<u64>(),
    ) {
        let (layout, flip) = (LAYOUTS[l], FLIPS[f]);
        let ours = ints([o, c, kh, kw], seed);
        let theirs = from_oihw(ours.view(), layout, flip);
        prop_assert_eq!(theirs.shape(), &stored_shape(layout, [o, c, kh, kw])[..]);
        prop_assert!(theirs.is_standard_layout());
        let back = to_oihw(theirs.view(), layout, flip);
        prop_assert!(back.is_standard_layout());
        prop_assert_eq!(&back, &ours);
        // And starting from their side, through a non-contiguous (transposed) view.
        let stored = ints(stored_shape(layout, [o, c, kh, kw]), seed ^ 1);
        let mut fortran = Array4::zeros(stored.raw_dim().f());
        fortran.assign(&stored);
        let ours2 = to_oihw(fortran.view(), layout, flip);
        prop_assert_eq!(from_oihw(ours2.view(), layout, flip), stored);
    }

    #[test]
    fn weight_elements_follow_each_framework_index_formula(
        o in 1usize..5, c in 1usize..5, kh in 1usize..4, kw in 1usize..4,
        l in 0usize..4, f in 0usize..2, seed in any::<u64>(),
    ) {
        let (layout, flip) = (LAYOUTS[l], FLIPS[f]);
        let stored = ints(stored_shape(layout, [o, c, kh, kw]), seed);
        let ours = to_oihw(stored.view(), layout, flip);
        prop_assert_eq!(oihw_shape(dims(&stored), layout), [o, c, kh, kw]);
        for ((oo, cc, i, j), &v) in ours.indexed_iter() {
            // Theano / Lasagne flipped kernels: ours[o, c, i, j] = stored[o, c, kh-1-i, kw-1-j].
            let (si, sj) = match flip {
                Flip::None => (i, j),
                Flip::Spatial => (kh - 1 - i, kw - 1 - j),
            };
            prop_assert_eq!(v, stored[stored_index(layout, [oo, cc, si, sj])]);
        }
    }
}

#[test]
fn load_weight_reads_a_flat_buffer_in_any_layout_and_rejects_a_wrong_length() {
    for layout in LAYOUTS {
        for flip in FLIPS {
            let shape = stored_shape(layout, [4, 3, 3, 2]);
            let stored = ints(shape, 7);
            let flat = stored.as_slice().unwrap();
            let loaded = load_weight(flat, shape, layout, flip).unwrap();
            assert_eq!(loaded, to_oihw(stored.view(), layout, flip));
            let err = load_weight(&flat[1..], shape, layout, flip).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Shape {
                        tensor: "weight",
                        axis: "elements",
                        got: 71,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
    let huge = [usize::MAX, 2, 1, 1];
    let err = load_weight::<f32>(&[], huge, WeightLayout::Oihw, Flip::None).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

/// Theano `conv2d(input, W, border_mode=pad, subsample=s, filter_flip=True, filter_dilation=d)`
/// and Lasagne `Conv2DLayer` (default `flip_filters=True`): a true convolution,
/// `out[n, o, y, x] = sum_{c, i, j} W[o, c, i, j] * in[n, c, y*s + (kh-1-i)*d - pad, x*s + (kw-1-j)*d - pad]`.
fn theano_true_convolution(
    input: &Array4<f64>,
    w: &Array4<f64>,
    stride: (usize, usize),
    pad: (usize, usize),
    dil: (usize, usize),
    groups: usize,
) -> Array4<f64> {
    let [n, c_in, h, wd] = dims(input);
    let [c_out, cg, kh, kw] = dims(w);
    let h_out = (h + 2 * pad.0 - dil.0 * (kh - 1) - 1) / stride.0 + 1;
    let w_out = (wd + 2 * pad.1 - dil.1 * (kw - 1) - 1) / stride.1 + 1;
    assert_eq!(c_in, cg * groups);
    let mut out = Array4::<f64>::zeros((n, c_out, h_out, w_out));
    for ((b, o, y, x), slot) in out.indexed_iter_mut() {
        let g = o / (c_out / groups);
        for ci in 0..cg {
            for i in 0..kh {
                for j in 0..kw {
                    let r = (y * stride.0 + (kh - 1 - i) * dil.0) as isize - pad.0 as isize;
                    let q = (x * stride.1 + (kw - 1 - j) * dil.1) as isize - pad.1 as isize;
                    if r >= 0 && q >= 0 && (r as usize) < h && (q as usize) < wd {
                        *slot += w[[o, ci, i, j]] * input[[b, g * cg + ci, r as usize, q as usize]];
                    }
                }
            }
        }
    }
    out
}

#[test]
fn theano_flipped_true_convolution_equals_reference_with_converted_weights() {
    let input = ints([2, 4, 9, 8], 1);
    let theano_w = ints([6, 2, 3, 2], 2);
    let (stride, pad, dil, groups) = ((2, 1), (1, 2), (1, 2), 2);
    let want = theano_true_convolution(&input, &theano_w, stride, pad, dil, groups);
    let ours = to_oihw(theano_w.view(), WeightLayout::Oihw, Flip::Spatial);
    let params = ConvParams::default()
        .stride(stride.0, stride.1)
        .padding(pad.0, pad.1)
        .dilation(dil.0, dil.1)
        .groups(groups);
    let got = reference::conv2d(input.view(), ours.view(), None, &params).unwrap();
    assert_eq!(got, want);
    // Without the flip the same numbers compute something else (the kernel is not symmetric).
    let unflipped = reference::conv2d(input.view(), theano_w.view(), None, &params).unwrap();
    assert_ne!(unflipped, want);
}

/// TensorFlow `tf.nn.conv2d(input, filters, strides, padding=[[0,0],[pt,pb],[pl,pr],[0,0]],
/// dilations)` in NHWC with HWIO filters (Keras `Conv2D(groups=g)` for `g > 1`):
/// `out[b, y, x, k] = sum_{di, dj, q} in[b, y*s + di*d - pt, x*s + dj*d - pl, g(k)*Cg + q] * filter[di, dj, q, k]`.
fn tensorflow_conv2d_nhwc(
    input: &Array4<f64>,
    filters: &Array4<f64>,
    stride: (usize, usize),
    pad: Padding,
    dil: (usize, usize),
) -> Array4<f64> {
    let [n, h, wd, c_in] = dims(input);
    let [kh, kw, cg, c_out] = dims(filters);
    let groups = c_in / cg;
    let h_out = (h + pad.top + pad.bottom - dil.0 * (kh - 1) - 1) / stride.0 + 1;
    let w_out = (wd + pad.left + pad.right - dil.1 * (kw - 1) - 1) / stride.1 + 1;
    let mut out = Array4::<f64>::zeros((n, h_out, w_out, c_out));
    for ((b, y, x, k), slot) in out.indexed_iter_mut() {
        let g = k / (c_out / groups);
        for di in 0..kh {
            for dj in 0..kw {
                let r = (y * stride.0 + di * dil.0) as isize - pad.top as isize;
                let q = (x * stride.1 + dj * dil.1) as isize - pad.left as isize;
                if r < 0 || q < 0 || r as usize >= h || q as usize >= wd {
                    continue;
                }
                for ci in 0..cg {
                    *slot +=
                        input[[b, r as usize, q as usize, g * cg + ci]] * filters[[di, dj, ci, k]];
                }
            }
        }
    }
    out
}

#[test]
fn tensorflow_nhwc_hwio_conv_equals_reference_on_converted_tensors() {
    let input = ints([2, 7, 9, 6], 3); // NHWC
    let filters = ints([3, 2, 3, 4], 4); // HWIO, groups = 6 / 3 = 2
    let pad = Padding {
        top: 1,
        bottom: 0,
        left: 2,
        right: 1,
    };
    let (stride, dil) = ((1, 2), (2, 1));
    let want = tensorflow_conv2d_nhwc(&input, &filters, stride, pad, dil);
    let params = ConvParams::default()
        .stride(stride.0, stride.1)
        .padding_sides(pad)
        .dilation(dil.0, dil.1)
        .groups(2);
    let weight = to_oihw(filters.view(), WeightLayout::Hwio, Flip::None);
    let out = reference::conv2d(
        nhwc_to_nchw(input.view()).view(),
        weight.view(),
        None,
        &params,
    )
    .unwrap();
    assert_eq!(nchw_to_nhwc(out.view()), want);
}

/// TensorFlow Lite `CONV_2D` (reference kernel): NHWC input, OHWI filter,
/// `out[b, y, x, oc] = sum_{fy, fx, ic} in[b, y*s + fy*d - pad, x*s + fx*d - pad, g*Cg + ic] * filter[oc, fy, fx, ic]`.
#[test]
fn tflite_ohwi_conv_equals_reference_on_converted_tensors() {
    let input = ints([1, 6, 7, 4], 5); // NHWC
    let filter = ints([6, 2, 3, 2], 6); // OHWI, groups = 4 / 2 = 2
    let [n, h, wd, _] = dims(&input);
    let [c_out, kh, kw, cg] = dims(&filter);
    let (s, d, pad, groups) = (2usize, 1usize, 1usize, 2usize);
    let (h_out, w_out) = (
        (h + 2 * pad - d * (kh - 1) - 1) / s + 1,
        (wd + 2 * pad - d * (kw - 1) - 1) / s + 1,
    );
    let mut want = Array4::<f64>::zeros((n, h_out, w_out, c_out));
    for ((b, y, x, oc), slot) in want.indexed_iter_mut() {
        let g = oc / (c_out / groups);
        for fy in 0..kh {
            for fx in 0..kw {
                let r = (y * s + fy * d) as isize - pad as isize;
                let q = (x * s + fx * d) as isize - pad as isize;
                if r >= 0 && q >= 0 && (r as usize) < h && (q as usize) < wd {
                    for ic in 0..cg {
                        *slot += input[[b, r as usize, q as usize, g * cg + ic]]
                            * filter[[oc, fy, fx, ic]];
                    }
                }
            }
        }
    }
    let params = ConvParams::default()
        .stride(s, s)
        .padding(pad, pad)
        .dilation(d, d)
        .groups(groups);
    let weight = to_oihw(filter.view(), WeightLayout::Ohwi, Flip::None);
    let out = reference::conv2d(
        nhwc_to_nchw(input.view()).view(),
        weight.view(),
        None,
        &params,
    )
    .unwrap();
    assert_eq!(nchw_to_nhwc(out.view()), want);
}

// ---------------------------------------------------------------------------------------------
// The migration test of issue 7: Lasagne's DilatedConv2DLayer, computed the way Lasagne does,
// equals our direct dilated conv2d after `to_oihw(.., Iohw, None)`.
// ---------------------------------------------------------------------------------------------

/// A dense weight gradient: `(grad_out, input, weight_shape, params) -> grad_weight`, the
/// signature of the fast `deformconv::conv2d_grad_weight`.
type DenseGradWeight =
    fn(ArrayView4<'_, f64>, ArrayView4<'_, f64>, [usize; 4], &ConvParams) -> Result<Array4<f64>>;
/// A dense convolution: the signature of `reference::conv2d` and the fast `deformconv::conv2d`.
type DenseConv = fn(
    ArrayView4<'_, f64>,
    ArrayView4<'_, f64>,
    Option<ArrayView1<'_, f64>>,
    &ConvParams,
) -> Result<Array4<f64>>;

/// The two functions the migration test runs through: the fast path, which is what users
/// migrate to. [`REFERENCE_GRAD_WEIGHT`] / [`REFERENCE_CONV`] run the same test on the oracle.
const MIGRATION_GRAD_WEIGHT: DenseGradWeight = deformconv::conv2d_grad_weight::<f64>;
const MIGRATION_CONV: DenseConv = deformconv::conv2d::<f64>;
/// The oracle's versions of the two functions, for the reference-path variant of the test.
const REFERENCE_GRAD_WEIGHT: DenseGradWeight = reference_dense_grad_weight;
const REFERENCE_CONV: DenseConv = reference::conv2d::<f64>;

/// `reference::grad_weight` with zero offsets and no mask: the weight gradient of a dense conv.
fn reference_dense_grad_weight(
    grad_out: ArrayView4<'_, f64>,
    input: ArrayView4<'_, f64>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let [_, _, kh, kw] = weight_shape;
    let go = grad_out.shape();
    let zero = Array4::zeros((go[0], 2 * params.offset_groups * kh * kw, go[2], go[3]));
    reference::grad_weight(grad_out, input, zero.view(), None, weight_shape, params)
}

/// Lasagne `DilatedConv2DLayer.convolve` (pad 0, `flip_filters=False`, no groups), step by step:
///
/// ```text
/// op = AbstractConv2d_gradWeights(imshp=(C_in, N, H, W), kshp=(C_out, N, H_out, W_out),
///                                 subsample=dilation, border_mode='valid', filter_flip=False)
/// conved = op(input.transpose(1, 0, 2, 3), W, output_size=(H_out, W_out))
/// return conved.transpose(1, 0, 2, 3)
/// ```
///
/// Theano's gradWeights of a correlation with stride `d` is
/// `gW[f, c, p, q] = sum_{b, a, e} topgrad[b, f, a, e] * img[b, c, a*d + p, e*d + q]`; here the
/// "batch" `b` is the input channel, the "channels" `c` are the images, the "output gradient"
/// is `W[c_in, c_out, kh, kw]` and the "kernel" it returns is the layer's output, of spatial
/// size `H_out = H - (kh - 1) d_h` (`conv_output_length(H, (kh - 1) d + 1, 1, 0)`).
fn lasagne_dilated_conv2d_layer(
    input: &Array4<f64>,
    w_lasagne: &Array4<f64>,
    dilation: (usize, usize),
    grad_weight: DenseGradWeight,
) -> Array4<f64> {
    let [n, _, h, wd] = dims(input);
    let [_, c_out, kh, kw] = dims(w_lasagne);
    let (h_out, w_out) = (h - (kh - 1) * dilation.0, wd - (kw - 1) * dilation.1);
    let img = input.view().permuted_axes([1, 0, 2, 3]); // (C_in, N, H, W)
    let kshp = [c_out, n, h_out, w_out];
    let params = ConvParams::default().stride(dilation.0, dilation.1);
    let conved = grad_weight(w_lasagne.view(), img, kshp, &params).unwrap();
    conved
        .permuted_axes([1, 0, 2, 3])
        .as_standard_layout()
        .into_owned()
}

#[test]
fn lasagne_dilated_layer_as_weight_gradient_equals_direct_dilated_conv_after_iohw_conversion() {
    lasagne_migration(MIGRATION_GRAD_WEIGHT, MIGRATION_CONV);
}

#[test]
fn lasagne_migration_holds_on_the_reference_path_too() {
    lasagne_migration(REFERENCE_GRAD_WEIGHT, REFERENCE_CONV);
}

/// Lasagne's way (through `grad_weight`) and the direct dilated conv (through `conv`) agree
/// exactly after the `Iohw` conversion.
fn lasagne_migration(grad_weight: DenseGradWeight, conv: DenseConv) {
    // Non-square kernel and unequal dilations so that a swapped axis cannot go unnoticed.
    let (n, c_in, c_out, h, w, kh, kw) = (2, 3, 4, 11, 13, 3, 2);
    let dilation = (2, 3);
    let input = ints([n, c_in, h, w], 11);
    let w_lasagne = ints([c_in, c_out, kh, kw], 12); // get_W_shape: (C_in, C_out, kh, kw)
    let lasagne = lasagne_dilated_conv2d_layer(&input, &w_lasagne, dilation, grad_weight);
    assert_eq!(
        lasagne.shape(),
        &[n, c_out, h - (kh - 1) * 2, w - (kw - 1) * 3]
    );

    // The migration: load the Lasagne weights with their layout, run a direct dilated conv.
    let weight = load_weight(
        w_lasagne.as_slice().unwrap(),
        [c_in, c_out, kh, kw],
        WeightLayout::Iohw,
        Flip::None,
    )
    .unwrap();
    let params = ConvParams::default().dilation(dilation.0, dilation.1);
    let direct = conv(input.view(), weight.view(), None, &params).unwrap();
    assert_eq!(direct, lasagne);

    // The hand-swapped weights André used are the same array.
    let swapped = w_lasagne.view().permuted_axes([1, 0, 2, 3]).to_owned();
    assert_eq!(weight, swapped);
    // Loading them as if they were already OIHW fails loudly instead of computing garbage.
    let wrong = ConvParams::default().dilation(dilation.0, dilation.1);
    assert!(conv(input.view(), w_lasagne.view(), None, &wrong).is_err());
}

// ---------------------------------------------------------------------------------------------
// NHWC tensors
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn nhwc_round_trips_and_moves_every_element(
        n in 0usize..3, c in 1usize..5, h in 1usize..5, w in 1usize..5, seed in any::<u64>(),
    ) {
        let nchw = ints([n, c, h, w], seed);
        let nhwc = nchw_to_nhwc(nchw.view());
        prop_assert!(nhwc.is_standard_layout());
        prop_assert_eq!(nhwc.shape(), &[n, h, w, c][..]);
        for ((b, y, x, ch), &v) in nhwc.indexed_iter() {
            prop_assert_eq!(v, nchw[[b, ch, y, x]]);
        }
        let back = nhwc_to_nchw(nhwc.view());
        prop_assert!(back.is_standard_layout());
        prop_assert_eq!(back, nchw);
    }
}

/// A TensorFlow user's tensors, built directly in NHWC, give through the conversions exactly
/// what the reference gives on the same numbers built in NCHW: forward and every gradient.
#[test]
fn reference_on_converted_nhwc_tensors_equals_reference_on_nchw() {
    let (n, c_in, c_out, h, w) = (2, 4, 6, 6, 7);
    let params = ConvParams::default()
        .stride(2, 1)
        .padding(1, 1)
        .dilation(1, 2)
        .groups(2)
        .offset_groups(2);
    let (h_out, w_out) = ((h + 2 - 3) / 2 + 1, (w + 2 - 2 * 2 - 1) + 1);
    let k = 3 * 3;
    // One value per logical element, stored once in each layout.
    let value = |t: u64, a: usize, b: usize, c: usize, d: usize| {
        let v = (t * 7919 + (a * 131 + b * 31 + c * 17 + d * 5) as u64) % 23;
        v as f64 / 4.0 - 2.6
    };
    let nchw =
        |t, shape: [usize; 4]| Array4::from_shape_fn(shape, |(a, b, c, d)| value(t, a, b, c, d));
    let nhwc = |t, [a0, b0, c0, d0]: [usize; 4]| {
        Array4::from_shape_fn((a0, c0, d0, b0), |(a, c, d, b)| value(t, a, b, c, d))
    };
    let shapes = [
        [n, c_in, h, w],
        [n, 2 * 2 * k, h_out, w_out],
        [n, 2 * k, h_out, w_out],
        [n, c_out, h_out, w_out],
    ];
    let [input, offset, mask, grad_out] = [0, 1, 2, 3].map(|t| nchw(t, shapes[t as usize]));
    let [input_t, offset_t, mask_t, grad_out_t] =
        [0, 1, 2, 3].map(|t| nhwc_to_nchw(nhwc(t, shapes[t as usize]).view()));
    let weight = ints([c_out, c_in / 2, 3, 3], 21);
    let bias = Array1::from_shape_fn(c_out, |o| o as f64 - 2.5);

    let fwd = |i: &Array4<f64>, o: &Array4<f64>, m: &Array4<f64>| {
        reference::deform_conv2d(
            i.view(),
            o.view(),
            Some(m.view()),
            weight.view(),
            Some(bias.view()),
            &params,
        )
        .unwrap()
    };
    let out = fwd(&input, &offset, &mask);
    assert_eq!(fwd(&input_t, &offset_t, &mask_t), out);
    // The NHWC output a TensorFlow user gets back.
    let out_nhwc = nchw_to_nhwc(out.view());
    assert_eq!(out_nhwc[[1, 2, 3, 5]], out[[1, 5, 2, 3]]);

    let shape = [n, c_in, h, w];
    let ws = dims(&weight);
    let g = |go: &Array4<f64>, i: &Array4<f64>, o: &Array4<f64>, m: &Array4<f64>| {
        (
            reference::grad_input(
                go.view(),
                o.view(),
                Some(m.view()),
                weight.view(),
                shape,
                &params,
            )
            .unwrap(),
            reference::grad_offset(
                go.view(),
                i.view(),
                o.view(),
                Some(m.view()),
                weight.view(),
                &params,
            )
            .unwrap(),
            reference::grad_mask(go.view(), i.view(), o.view(), weight.view(), &params).unwrap(),
            reference::grad_weight(go.view(), i.view(), o.view(), Some(m.view()), ws, &params)
                .unwrap(),
            reference::grad_bias(go.view()).unwrap(),
        )
    };
    assert_eq!(
        g(&grad_out_t, &input_t, &offset_t, &mask_t),
        g(&grad_out, &input, &offset, &mask)
    );
}

// ---------------------------------------------------------------------------------------------
// Offset and mask layouts
// ---------------------------------------------------------------------------------------------

/// Where each implementation keeps the (dy, dx) of group `g`, tap `k`, written from its source
/// independently of the crate: returns the two channels.
fn framework_channels(
    layout: OffsetLayout,
    groups: usize,
    taps: usize,
    g: usize,
    k: usize,
) -> (usize, usize) {
    match layout {
        // torchvision / mmcv / ONNX: block of 2K channels per group, (h, w) per tap.
        OffsetLayout::InterleavedYx => (g * 2 * taps + 2 * k, g * 2 * taps + 2 * k + 1),
        OffsetLayout::InterleavedXy => (g * 2 * taps + 2 * k + 1, g * 2 * taps + 2 * k),
        OffsetLayout::PlanarYx => (g * 2 * taps + k, g * 2 * taps + taps + k),
        // MindSpore DeformableOffsets: x at g*K + k, y one block of G*K later.
        OffsetLayout::BlocksXy => (groups * taps + g * taps + k, g * taps + k),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn offset_layouts_round_trip_between_every_pair(
        n in 0usize..3, groups in 1usize..4, taps in 1usize..5, h in 1usize..4, w in 1usize..4,
        a in 0usize..4, b in 0usize..4, seed in any::<u64>(),
    ) {
        let (from, to) = (OFFSET_LAYOUTS[a], OFFSET_LAYOUTS[b]);
        let x = offsets([n, 2 * groups * taps, h, w], seed);
        let y = convert_offset(x.view(), from, to, groups).unwrap();
        prop_assert!(y.is_standard_layout());
        prop_assert_eq!(convert_offset(y.view(), to, from, groups).unwrap(), x.clone());
        prop_assert_eq!(convert_offset(x.view(), from, from, groups).unwrap(), x);
    }

    #[test]
    fn offset_channels_follow_each_framework_indexing(
        groups in 1usize..4, taps in 1usize..5, l in 0usize..4, seed in any::<u64>(),
    ) {
        let layout = OFFSET_LAYOUTS[l];
        let theirs = offsets([2, 2 * groups * taps, 2, 3], seed);
        let ours = convert_offset(theirs.view(), layout, OffsetLayout::InterleavedYx, groups).unwrap();
        for g in 0..groups {
            for k in 0..taps {
                let (cy, cx) = framework_channels(layout, groups, taps, g, k);
                let ch = 2 * (g * taps + k);
                prop_assert_eq!(ours.slice(s![.., ch, .., ..]), theirs.slice(s![.., cy, .., ..]));
                prop_assert_eq!(ours.slice(s![.., ch + 1, .., ..]), theirs.slice(s![.., cx, .., ..]));
            }
        }
    }

    #[test]
    fn packed_offset_and_mask_round_trip(
        n in 0usize..3, groups in 1usize..4, taps in 1usize..5, h in 1usize..4, w in 1usize..4,
        p in 0usize..2, seed in any::<u64>(),
    ) {
        let layout = PACKED[p];
        let packed = offsets([n, 3 * groups * taps, h, w], seed);
        let (offset, mask) = unpack_offset_mask(packed.view(), layout, groups).unwrap();
        prop_assert_eq!(offset.shape(), &[n, 2 * groups * taps, h, w][..]);
        prop_assert_eq!(mask.shape(), &[n, groups * taps, h, w][..]);
        prop_assert_eq!(pack_offset_mask(offset.view(), mask.view(), layout, groups).unwrap(), packed);
    }
}

/// mmcv `ModulatedDeformConv2dPack.forward`: `o1, o2, mask = torch.chunk(out, 3, dim=1)`,
/// `offset = torch.cat((o1, o2), dim=1)`: the first two thirds as they are, the last third.
#[test]
fn mmcv_chunks_split_in_thirds_without_reordering() {
    let (groups, taps) = (2, 9);
    let out = offsets([2, 3 * groups * taps, 3, 4], 5);
    let third = groups * taps;
    let (offset, mask) = unpack_offset_mask(out.view(), PackedLayout::MmcvChunks, groups).unwrap();
    assert_eq!(offset, out.slice(s![.., ..2 * third, .., ..]));
    assert_eq!(mask, out.slice(s![.., 2 * third.., .., ..]));
}

/// The MindSpore example worked by hand: one group, a 1x2 kernel, one output pixel.
/// Packed channels `[x0, x1, y0, y1, m0, m1] = [0.5, 0, 0, 1, 1, 0.5]`: tap 0 moves half a
/// column right, tap 1 one row down, tap 1 is weighed by 0.5.
#[test]
fn mindspore_packed_hand_worked_case() {
    // Input 2x3: [[1, 2, 3], [4, 5, 6]], weight [[1, 10]], no padding, output 2x2 (we read (0,0)).
    let input = Array4::from_shape_vec((1, 1, 2, 3), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let weight = Array4::from_shape_vec((1, 1, 1, 2), vec![1.0, 10.0]).unwrap();
    let mut packed = Array4::zeros((1, 6, 2, 2));
    for (c, v) in [0.5, 0.0, 0.0, 1.0, 1.0, 0.5].into_iter().enumerate() {
        packed[[0, c, 0, 0]] = v;
    }
    let (offset, mask) = unpack_offset_mask(packed.view(), PackedLayout::XyMaskBlocks, 1).unwrap();
    let out = reference::deform_conv2d(
        input.view(),
        offset.view(),
        Some(mask.view()),
        weight.view(),
        None,
        &ConvParams::default(),
    )
    .unwrap();
    // Tap 0 samples (0, 0 + 0.5) = (1 + 2) / 2 = 1.5, weight 1, mask 1        -> 1.5
    // Tap 1 samples (0 + 1, 1)   = 5,             weight 10, mask 0.5         -> 25
    assert_eq!(out[[0, 0, 0, 0]], 1.5 + 25.0);
}

/// Bilinear sampling with torchvision's window, written here independently of the crate.
fn bilinear(input: &Array4<f64>, n: usize, c: usize, py: f64, px: f64) -> f64 {
    let (h, w) = (input.shape()[2] as f64, input.shape()[3] as f64);
    if py <= -1.0 || py >= h || px <= -1.0 || px >= w {
        return 0.0;
    }
    let (y0, x0) = (py.floor(), px.floor());
    let (ly, lx) = (py - y0, px - x0);
    let v = |r: f64, s: f64| {
        if r >= 0.0 && r < h && s >= 0.0 && s < w {
            input[[n, c, r as usize, s as usize]]
        } else {
            0.0
        }
    };
    (1.0 - ly) * (1.0 - lx) * v(y0, x0)
        + (1.0 - ly) * lx * v(y0, x0 + 1.0)
        + ly * (1.0 - lx) * v(y0 + 1.0, x0)
        + ly * lx * v(y0 + 1.0, x0 + 1.0)
}

/// A deformable forward that reads offsets and mask straight from another framework's
/// tensors through `read(n, g, k, y, x) -> (dy, dx, m)`: what that framework computes.
fn deform_forward_reading(
    input: &Array4<f64>,
    weight: &Array4<f64>,
    (stride, pad, groups, offset_groups): (usize, usize, usize, usize),
    out_hw: (usize, usize),
    read: impl Fn(usize, usize, usize, usize, usize) -> (f64, f64, f64),
) -> Array4<f64> {
    let [n, c_in, _, _] = dims(input);
    let [c_out, cg, kh, kw] = dims(weight);
    let mut out = Array4::<f64>::zeros((n, c_out, out_hw.0, out_hw.1));
    for ((b, o, y, x), slot) in out.indexed_iter_mut() {
        let group = o / (c_out / groups);
        for ci in 0..cg {
            let c = group * cg + ci;
            let g = c / (c_in / offset_groups);
            for i in 0..kh {
                for j in 0..kw {
                    let (dy, dx, m) = read(b, g, i * kw + j, y, x);
                    let py = (y * stride + i) as f64 - pad as f64 + dy;
                    let px = (x * stride + j) as f64 - pad as f64 + dx;
                    *slot += weight[[o, ci, i, j]] * m * bilinear(input, b, c, py, px);
                }
            }
        }
    }
    out
}

/// For every offset layout and both packed layouts: the conv that framework computes from its
/// own tensor equals our reference on the adapted offsets and mask.
#[test]
fn conv_with_adapted_offsets_equals_reference_for_every_layout() {
    let (n, c_in, c_out, h, w) = (2, 4, 4, 6, 5);
    let (stride, pad, groups, og) = (1, 1, 2, 2);
    let (kh, kw) = (3, 2);
    let taps = kh * kw;
    let out_hw = (h + 2 * pad - kh + 1, w + 2 * pad - kw + 1);
    let input = ints([n, c_in, h, w], 31);
    let weight = ints([c_out, c_in / groups, kh, kw], 32);
    let params = ConvParams::default()
        .padding(pad, pad)
        .groups(groups)
        .offset_groups(og);
    let conf = (stride, pad, groups, og);
    let offset_shape = [n, 2 * og * taps, out_hw.0, out_hw.1];
    let mask = offsets([n, og * taps, out_hw.0, out_hw.1], 33);

    for (seed, layout) in OFFSET_LAYOUTS.into_iter().enumerate() {
        let theirs = offsets(offset_shape, 40 + seed as u64);
        let want = deform_forward_reading(&input, &weight, conf, out_hw, |b, g, k, y, x| {
            let (cy, cx) = framework_channels(layout, og, taps, g, k);
            (
                theirs[[b, cy, y, x]],
                theirs[[b, cx, y, x]],
                mask[[b, g * taps + k, y, x]],
            )
        });
        let ours = convert_offset(theirs.view(), layout, OffsetLayout::InterleavedYx, og).unwrap();
        let got = reference::deform_conv2d(
            input.view(),
            ours.view(),
            Some(mask.view()),
            weight.view(),
            None,
            &params,
        )
        .unwrap();
        support::assert_rel_close(
            &format!("{layout:?}"),
            "output",
            &got.view(),
            &want.view(),
            1e-12,
        );
    }

    for (seed, layout) in PACKED.into_iter().enumerate() {
        let packed = offsets([n, 3 * og * taps, out_hw.0, out_hw.1], 50 + seed as u64);
        let want = deform_forward_reading(&input, &weight, conf, out_hw, |b, g, k, y, x| {
            let p = g * taps + k;
            let gk = og * taps;
            match layout {
                // mmcv: cat(o1, o2) is our layout; the mask is the third chunk.
                PackedLayout::MmcvChunks => (
                    packed[[b, 2 * p, y, x]],
                    packed[[b, 2 * p + 1, y, x]],
                    packed[[b, 2 * gk + p, y, x]],
                ),
                // MindSpore: x at p, y at G K + p, mask at 2 G K + p.
                PackedLayout::XyMaskBlocks => (
                    packed[[b, gk + p, y, x]],
                    packed[[b, p, y, x]],
                    packed[[b, 2 * gk + p, y, x]],
                ),
            }
        });
        let (offset, m) = unpack_offset_mask(packed.view(), layout, og).unwrap();
        let got = reference::deform_conv2d(
            input.view(),
            offset.view(),
            Some(m.view()),
            weight.view(),
            None,
            &params,
        )
        .unwrap();
        support::assert_rel_close(
            &format!("{layout:?}"),
            "output",
            &got.view(),
            &want.view(),
            1e-12,
        );
    }
}

#[test]
fn offset_adapters_reject_bad_groups_and_channel_counts() {
    let x = Array4::<f64>::zeros((1, 12, 2, 2));
    let l = OffsetLayout::PlanarYx;
    let err = convert_offset(x.view(), l, OffsetLayout::InterleavedYx, 0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Param {
                name: "offset_groups",
                ..
            }
        ),
        "{err}"
    );
    let err = convert_offset(x.view(), l, OffsetLayout::InterleavedYx, 4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "offset has 12 channels; expected a multiple of 2 * offset_groups(4) = 8"
    );
    let err = unpack_offset_mask(x.slice(s![.., ..10, .., ..]), PackedLayout::XyMaskBlocks, 1)
        .unwrap_err();
    assert!(matches!(err, Error::Shape { got: 10, .. }), "{err}");

    let offset = Array4::<f64>::zeros((1, 8, 2, 3));
    for (mask_shape, axis) in [
        ((1, 3, 2, 3), "channels"),
        ((2, 4, 2, 3), "images"),
        ((1, 4, 3, 3), "rows"),
        ((1, 4, 2, 2), "columns"),
    ] {
        let mask = Array4::<f64>::zeros(mask_shape);
        let err =
            pack_offset_mask(offset.view(), mask.view(), PackedLayout::MmcvChunks, 1).unwrap_err();
        assert!(
            matches!(err, Error::Shape { tensor: "mask", axis: a, .. } if a == axis),
            "{err}"
        );
    }
}
