//! A 3x3 problem small enough to work out by hand, through the forward and every gradient.
//! Every value below is a short dyadic fraction, so the oracle must reproduce the hand
//! arithmetic exactly.
//!
//! ```text
//! input (1 x 1 x 3 x 3), v[r][s] = 3r + s + 1     weight (1 x 1 x 1 x 3) = [2, -1, 3]
//!     1 2 3                                        bias = [0.5], mask = [1, 0.5, 2]
//!     4 5 6                                        stride (3, 3), no padding, dilation 1
//!     7 8 9                                        grad_out = [[[[2]]]]
//! H_out = (3 - 1) / 3 + 1 = 1,  W_out = (3 - 3) / 3 + 1 = 1: one output pixel, three taps.
//! tap j samples at (0, j) + (dy_j, dx_j):
//!   tap 0: offset (0.5, 0.25) -> p = (0.5, 0.25)   inside a cell
//!   tap 1: offset (1, 1)      -> p = (1, 2)        exactly on a pixel, on the last column
//!   tap 2: offset (-1, 0)     -> p = (-1, 2)       exactly on the -1 row
//! ```

use deformconv::{reference, ConvParams};
use ndarray::{arr1, Array4};

struct Hand {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Array4<f64>,
    weight: Array4<f64>,
    grad_out: Array4<f64>,
    params: ConvParams,
}

fn hand() -> Hand {
    let input = Array4::from_shape_fn((1, 1, 3, 3), |(_, _, r, s)| (3 * r + s + 1) as f64);
    let offset =
        Array4::from_shape_vec((1, 6, 1, 1), vec![0.5, 0.25, 1.0, 1.0, -1.0, 0.0]).unwrap();
    let mask = Array4::from_shape_vec((1, 3, 1, 1), vec![1.0, 0.5, 2.0]).unwrap();
    let weight = Array4::from_shape_vec((1, 1, 1, 3), vec![2.0, -1.0, 3.0]).unwrap();
    let grad_out = Array4::from_elem((1, 1, 1, 1), 2.0);
    let params = ConvParams::default().stride(3, 3);
    Hand {
        input,
        offset,
        mask,
        weight,
        grad_out,
        params,
    }
}

fn forward(h: &Hand, offset: &Array4<f64>) -> f64 {
    let bias = arr1(&[0.5]);
    let out = reference::deform_conv2d(
        h.input.view(),
        offset.view(),
        Some(h.mask.view()),
        h.weight.view(),
        Some(bias.view()),
        &h.params,
    )
    .unwrap();
    assert_eq!(out.shape(), &[1, 1, 1, 1]);
    out[[0, 0, 0, 0]]
}

/// ```text
/// B0 = B(0.5, 0.25): y0 = x0 = 0, ly = 0.5, lx = 0.25
///    = 0.5*0.75*v00 + 0.5*0.25*v01 + 0.5*0.75*v10 + 0.5*0.25*v11
///    = 0.375*1 + 0.125*2 + 0.375*4 + 0.125*5 = 0.375 + 0.25 + 1.5 + 0.625 = 2.75
///      (check: v is linear, 3*0.5 + 0.25 + 1 = 2.75)
/// B1 = B(1, 2) = v[1][2] = 6            (corner weights 1, 0, 0, 0)
/// B2 = B(-1, 2) = 0                     (py <= -1: outside by the window rule)
/// out = 0.5 + 2*1*2.75 + (-1)*0.5*6 + 3*2*0 = 0.5 + 5.5 - 3 + 0 = 3
/// ```
#[test]
fn forward_by_hand() {
    let h = hand();
    assert_eq!(forward(&h, &h.offset), 3.0);
}

/// ```text
/// gcol_k = weight_k * grad_out = [4, -2, 6]
/// tap 0: gcol*m = 4*1 = 4 to the corners (0,0) (0,1) (1,0) (1,1) with weights
///        0.375, 0.125, 0.375, 0.125  ->  1.5, 0.5, 1.5, 0.5
/// tap 1: gcol*m = -2*0.5 = -1, all to (1,2) (the other corners have weight 0)
/// tap 2: outside the window: nothing
/// ```
#[test]
fn grad_input_by_hand() {
    let h = hand();
    let got = reference::grad_input(
        h.grad_out.view(),
        h.offset.view(),
        Some(h.mask.view()),
        h.weight.view(),
        [1, 1, 3, 3],
        &h.params,
    )
    .unwrap();
    let want = Array4::from_shape_vec(
        (1, 1, 3, 3),
        vec![1.5, 0.5, 0.0, 1.5, 0.5, -1.0, 0.0, 0.0, 0.0],
    )
    .unwrap();
    assert_eq!(got, want);
}

/// ```text
/// Wy = lx (v11 - v01) + (1-lx)(v10 - v00),  Wx = ly (v11 - v10) + (1-ly)(v01 - v00)
/// tap 0 (y0=0, x0=0, ly=0.5, lx=0.25): Wy = 0.25*(5-2) + 0.75*(4-1) = 3
///                                      Wx = 0.5*(5-4) + 0.5*(2-1)   = 1
///        grad = gcol*m*W = 4*1*3 = 12, 4*1*1 = 4
/// tap 1 (y0=1, x0=2, ly=lx=0; column 3 is outside, reads 0):
///        Wy = v[2][2] - v[1][2] = 9 - 6 = 3
///        Wx = v[1][3] - v[1][2] = 0 - 6 = -6   (forward difference: one-sided)
///        grad = -2*0.5*3 = -3, -2*0.5*(-6) = 6
/// tap 2 (y0=-1, x0=2, ly=lx=0; row -1 reads 0, no window cut-off for the derivative):
///        Wy = v[0][2] - v[-1][2] = 3 - 0 = 3
///        Wx = v[-1][3] - v[-1][2] = 0
///        grad = 6*2*3 = 36, 0
/// ```
#[test]
fn grad_offset_by_hand() {
    let h = hand();
    let got = reference::grad_offset(
        h.grad_out.view(),
        h.input.view(),
        h.offset.view(),
        Some(h.mask.view()),
        h.weight.view(),
        &h.params,
    )
    .unwrap();
    let want = Array4::from_shape_vec((1, 6, 1, 1), vec![12.0, 4.0, -3.0, 6.0, 36.0, 0.0]).unwrap();
    assert_eq!(got, want);
}

/// At the integer positions the derivative is the *forward* difference (torchvision's rule).
/// With `L = grad_out * out = 2 out` and a step `h = 2^-10` (exact in binary):
///
/// ```text
/// tap 1, dx + h: p = (1, 2+h), B1 = (1-h)*6 + h*0 = 6 - 6h, out = 3 + 3h, L = 6 + 6h
///                (L(+h) - L(0)) / h = 6  = grad_offset dx of tap 1
/// tap 1, dx - h: p = (1, 2-h), B1 = h*5 + (1-h)*6 = 6 - h,  out = 3 + h/2, L = 6 + h
///                (L(0) - L(-h)) / h = -1 (the backward difference: not what is returned)
/// tap 2, dy + h: p = (-1+h, 2), inside the window, B2 = (1-h)*0 + h*3 = 3h,
///                out = 3 + 3*2*3h = 3 + 18h, L = 6 + 36h, forward difference 36
/// tap 2, dy - h: p = (-1-h, 2), outside, B2 = 0, backward difference 0
/// ```
#[test]
fn integer_positions_take_the_forward_difference() {
    let h = hand();
    let step = 1.0 / 1024.0;
    let loss = |channel: usize, delta: f64| {
        let mut offset = h.offset.clone();
        offset[[0, channel, 0, 0]] += delta;
        2.0 * forward(&h, &offset)
    };
    let l0 = loss(0, 0.0);
    assert_eq!(l0, 6.0);
    // Channel 3 is dx of tap 1, channel 4 dy of tap 2.
    assert_eq!((loss(3, step) - l0) / step, 6.0);
    assert_eq!((l0 - loss(3, -step)) / step, -1.0);
    assert_eq!((loss(4, step) - l0) / step, 36.0);
    assert_eq!((l0 - loss(4, -step)) / step, 0.0);
}

/// ```text
/// grad_mask_k = gcol_k * B_k = [4*2.75, -2*6, 6*0] = [11, -12, 0]
/// ```
#[test]
fn grad_mask_by_hand() {
    let h = hand();
    let got = reference::grad_mask(
        h.grad_out.view(),
        h.input.view(),
        h.offset.view(),
        h.weight.view(),
        &h.params,
    )
    .unwrap();
    let want = Array4::from_shape_vec((1, 3, 1, 1), vec![11.0, -12.0, 0.0]).unwrap();
    assert_eq!(got, want);
}

/// ```text
/// grad_weight_k = grad_out * m_k * B_k = [2*1*2.75, 2*0.5*6, 2*2*0] = [5.5, 6, 0]
/// grad_bias = sum grad_out = 2
/// ```
#[test]
fn grad_weight_and_bias_by_hand() {
    let h = hand();
    let got = reference::grad_weight(
        h.grad_out.view(),
        h.input.view(),
        h.offset.view(),
        Some(h.mask.view()),
        [1, 1, 1, 3],
        &h.params,
    )
    .unwrap();
    let want = Array4::from_shape_vec((1, 1, 1, 3), vec![5.5, 6.0, 0.0]).unwrap();
    assert_eq!(got, want);
    assert_eq!(
        reference::grad_bias(h.grad_out.view()).unwrap(),
        arr1(&[2.0])
    );
}
