//! Arbitrary small shapes and parameters, consistent or not, through every public entry point:
//! each may return `Err`, none may panic, abort or read out of bounds.
#![no_main]

mod bytes;

use bytes::Bytes;
use deformconv::{reference, ConvParams, Padding, Want};
use libfuzzer_sys::fuzz_target;
use ndarray::{Array1, Array4};

/// A parameter value: usually small, sometimes absurd.
fn param(b: &mut Bytes) -> usize {
    match b.byte() % 8 {
        0 => 0,
        1 => usize::MAX,
        2 => 1 << 40,
        _ => 1 + b.upto(3),
    }
}

fn array(b: &mut Bytes, shape: [usize; 4]) -> Array4<f64> {
    let mut a = Array4::zeros(shape);
    for v in a.iter_mut() {
        *v = b.float();
    }
    a
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let input_shape = [b.upto(2), b.upto(5), b.upto(6), b.upto(6)];
    let weight_shape = [b.upto(5), b.upto(5), b.upto(4), b.upto(4)];
    let out_hw = [b.upto(6), b.upto(6)];
    let og_ch = b.upto(40);
    let mask_ch = b.upto(20);
    let params = ConvParams::default()
        .stride(param(&mut b), param(&mut b))
        .padding_sides(Padding {
            top: b.upto(3),
            bottom: b.upto(3),
            left: b.upto(3),
            right: b.upto(3),
        })
        .dilation(param(&mut b), param(&mut b))
        .groups(param(&mut b))
        .offset_groups(param(&mut b));
    let (n, c_out) = (input_shape[0], weight_shape[0]);

    let input = array(&mut b, input_shape);
    let weight = array(&mut b, weight_shape);
    let offset = array(&mut b, [n, og_ch, out_hw[0], out_hw[1]]);
    let mask = b
        .flag()
        .then(|| array(&mut b, [n, mask_ch, out_hw[0], out_hw[1]]));
    let bias = b.flag().then(|| Array1::from_elem(b.upto(6), 0.5));
    let grad_n = b.upto(2);
    let grad_out = array(&mut b, [grad_n, c_out, out_hw[0], out_hw[1]]);
    let huge_shape = [b.upto(3), usize::MAX / (1 + b.upto(7)), 3, 3];

    let (iv, wv, ov, gv) = (input.view(), weight.view(), offset.view(), grad_out.view());
    let mv = mask.as_ref().map(|m| m.view());
    let bv = bias.as_ref().map(|b| b.view());

    let _ = deformconv::deform_conv2d(iv, ov, mv, wv, bv, &params);
    let _ = deformconv::conv2d(iv, wv, bv, &params);
    let _ = deformconv::deform_conv2d_backward(gv, iv, ov, mv, wv, &params, Want::ALL);
    let _ = deformconv::conv2d_backward(gv, iv, wv, &params, Want::ALL);
    let _ = deformconv::deform_conv2d_grad_input(gv, ov, mv, wv, input_shape, &params);
    let _ = deformconv::deform_conv2d_grad_input(gv, ov, mv, wv, huge_shape, &params);
    let _ = deformconv::deform_conv2d_grad_offset(gv, iv, ov, mv, wv, &params);
    let _ = deformconv::deform_conv2d_grad_mask(gv, iv, ov, wv, &params);
    let _ = deformconv::deform_conv2d_grad_weight(gv, iv, ov, mv, weight_shape, &params);
    let _ = deformconv::deform_conv2d_grad_weight(gv, iv, ov, mv, huge_shape, &params);
    let _ = deformconv::deform_conv2d_grad_bias(gv);
    let _ = deformconv::conv2d_grad_input(gv, wv, input_shape, &params);
    let _ = deformconv::conv2d_grad_weight(gv, iv, weight_shape, &params);

    // The f32 path too, on the same shapes.
    let (i32_, w32, o32, g32) = (
        input.mapv(|v| v as f32),
        weight.mapv(|v| v as f32),
        offset.mapv(|v| v as f32),
        grad_out.mapv(|v| v as f32),
    );
    let m32 = mask.as_ref().map(|m| m.mapv(|v| v as f32));
    let _ = deformconv::deform_conv2d(
        i32_.view(),
        o32.view(),
        m32.as_ref().map(|m| m.view()),
        w32.view(),
        None,
        &params,
    );
    let _ = deformconv::deform_conv2d_backward(
        g32.view(),
        i32_.view(),
        o32.view(),
        m32.as_ref().map(|m| m.view()),
        w32.view(),
        &params,
        Want::ALL,
    );

    // The oracle is public: it must be as robust (only on small problems: it is slow).
    if input.len() * weight.len() < 4096 {
        let _ = reference::deform_conv2d(iv, ov, mv, wv, bv, &params);
        let _ = reference::grad_input(gv, ov, mv, wv, huge_shape, &params);
        let _ = reference::grad_offset(gv, iv, ov, mv, wv, &params);
        let _ = reference::grad_mask(gv, iv, ov, wv, &params);
        let _ = reference::grad_weight(gv, iv, ov, mv, weight_shape, &params);
    }
});
