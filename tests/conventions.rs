//! The sampling conventions of the reference oracle ([`Convention`]): a hand-worked case per
//! convention, where they must agree, where they must differ, an identity pinning DCN v1's
//! edge clamping, finite differences of each convention's forward, and the golden cases.

mod support;

use deformconv::{reference, ConvParams, Convention, Padding};
use ndarray::{s, Array4};
use support::{dot, Case, Offsets, Problem, Rng};

/// Forward and every gradient of one problem under one convention (mask and bias given).
#[derive(Debug, PartialEq)]
struct Outputs {
    out: Array4<f64>,
    grad_input: Array4<f64>,
    grad_offset: Array4<f64>,
    grad_mask: Array4<f64>,
    grad_weight: Array4<f64>,
}

fn run(p: &Problem, conv: Convention) -> Outputs {
    run_with(p, p.spec.params.convention(conv))
}

fn run_with(p: &Problem, params: ConvParams) -> Outputs {
    let (input, offset, mask) = (p.input.view(), p.offset.view(), p.mask.view());
    let (weight, grad_out) = (p.weight.view(), p.grad_out.view());
    let out = reference::deform_conv2d(
        input,
        offset,
        Some(mask),
        weight,
        Some(p.bias.view()),
        &params,
    )
    .unwrap();
    let input_shape = [
        p.input.shape()[0],
        p.input.shape()[1],
        p.input.shape()[2],
        p.input.shape()[3],
    ];
    let weight_shape = p.spec.weight_shape();
    Outputs {
        out,
        grad_input: reference::grad_input(
            grad_out,
            offset,
            Some(mask),
            weight,
            input_shape,
            &params,
        )
        .unwrap(),
        grad_offset: reference::grad_offset(grad_out, input, offset, Some(mask), weight, &params)
            .unwrap(),
        grad_mask: reference::grad_mask(grad_out, input, offset, weight, &params).unwrap(),
        grad_weight: reference::grad_weight(
            grad_out,
            input,
            offset,
            Some(mask),
            weight_shape,
            &params,
        )
        .unwrap(),
    }
}

/// Offsets that put every sample where `pick(rng, size)` says along each axis (`size` = H for
/// rows, W for columns), whatever the tap's undeformed position.
fn offsets_placing(
    spec: &Case,
    rng: &mut Rng,
    mut pick: impl FnMut(&mut Rng, usize) -> f64,
) -> Array4<f64> {
    let (ho, wo) = spec.out_hw();
    let mut offset = Array4::zeros(spec.offset_shape());
    for n in 0..spec.n {
        for ch in 0..spec.offset_groups() * spec.taps() {
            let k = ch % spec.taps();
            let (i, j) = (k / spec.kw, k % spec.kw);
            for y in 0..ho {
                for x in 0..wo {
                    let (r, c) = spec.base(i, j, y, x);
                    offset[[n, 2 * ch, y, x]] = pick(rng, spec.h) - r;
                    offset[[n, 2 * ch + 1, y, x]] = pick(rng, spec.w) - c;
                }
            }
        }
    }
    offset
}

/// Positions on and around both borders of an axis of `size` pixels, integers, and anything.
fn border_position(rng: &mut Rng, size: usize) -> f64 {
    let s = size as f64;
    let special = [
        -1.0 - 1e-3,
        -1.0,
        -1.0 + 1e-3,
        -0.5,
        0.0,
        1e-3,
        s - 1.0,
        s - 1.0 + 1e-3,
        s - 1e-3,
        s,
        s + 0.5,
    ];
    match rng.int(0, 3) {
        0 | 1 => special[rng.size(0, special.len() - 1)],
        2 => rng.int(-1, size as i64) as f64,
        _ => rng.uniform(-1.5, s + 0.5),
    }
}

/// A random spec with at least `min` rows and columns.
fn spec_at_least(rng: &mut Rng, min: usize) -> Case {
    loop {
        let spec = Case::random(rng);
        if spec.h >= min && spec.w >= min {
            return spec;
        }
    }
}

fn random_index(rng: &mut Rng, shape: &[usize]) -> [usize; 4] {
    [0, 1, 2, 3].map(|a| rng.size(0, shape[a] - 1))
}

fn assert_close(what: &str, got: &Array4<f64>, want: &Array4<f64>, tol: f64) {
    support::assert_rel_close("conventions", what, &got.view(), &want.view(), tol);
}

// ---------------------------------------------------------------------------------------------
// A hand-worked case per convention.
//
// input 1 x 1 x 2 x 3, v[r][s] = 3r + s + 1:      weight [[[[1]]]], no bias, mask all ones,
//     1 2 3                                       stride 1, no padding, grad_out all ones.
//     4 5 6
// A 1x1 kernel, so output pixel (y, x) is one sample, at (y + dy, x + dx) (H = 2, W = 3):
//   A (0,0): offset (-1, 0.5)   -> p = (-1, 0.5)     exactly on the -1 row
//   B (0,1): offset (-0.5, 0)   -> p = (-0.5, 1)     in the (-1, 0) band, integer column
//   C (0,2): offset (0, 0)      -> p = (0, 2)        integer, first row, last column W-1
//   D (1,0): offset (0.5, 1.25) -> p = (1.5, 1.25)   beyond the last row H-1
//   E (1,1): offset (0, -0.5)   -> p = (1, 0.5)      exactly on the last row H-1
//   F (1,2): offset (1, -1)     -> p = (2, 1)        exactly on H: outside for everyone
// With weight 1 and grad_out 1: out = B(p), grad_offset = (Wy, Wx)(p), grad_mask = out,
// grad_input = the sum of the corner weights each pixel received, grad_weight = sum(out).
// ---------------------------------------------------------------------------------------------

struct Hand {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Array4<f64>,
    weight: Array4<f64>,
    grad_out: Array4<f64>,
}

fn hand() -> Hand {
    let dy = [-1.0, -0.5, 0.0, 0.5, 0.0, 1.0];
    let dx = [0.5, 0.0, 0.0, 1.25, -0.5, -1.0];
    let offset = Array4::from_shape_vec((1, 2, 2, 3), [dy, dx].concat()).unwrap();
    Hand {
        input: Array4::from_shape_fn((1, 1, 2, 3), |(_, _, r, s)| (3 * r + s + 1) as f64),
        offset,
        mask: Array4::ones((1, 1, 2, 3)),
        weight: Array4::ones((1, 1, 1, 1)),
        grad_out: Array4::ones((1, 1, 2, 3)),
    }
}

fn hand_forward(h: &Hand, offset: &Array4<f64>, conv: Convention) -> Array4<f64> {
    let params = ConvParams::default().convention(conv);
    reference::deform_conv2d(
        h.input.view(),
        offset.view(),
        Some(h.mask.view()),
        h.weight.view(),
        None,
        &params,
    )
    .unwrap()
}

/// `[out, grad_input, grad_offset, grad_mask]` and `grad_weight` of the hand case.
fn hand_outputs(conv: Convention) -> ([Vec<f64>; 4], f64) {
    let h = hand();
    let params = ConvParams::default().convention(conv);
    let (input, offset, mask, weight) = (
        h.input.view(),
        h.offset.view(),
        h.mask.view(),
        h.weight.view(),
    );
    let g = h.grad_out.view();
    let out = hand_forward(&h, &h.offset, conv);
    let gi = reference::grad_input(g, offset, Some(mask), weight, [1, 1, 2, 3], &params).unwrap();
    let go = reference::grad_offset(g, input, offset, Some(mask), weight, &params).unwrap();
    let gm = reference::grad_mask(g, input, offset, weight, &params).unwrap();
    let gw = reference::grad_weight(g, input, offset, Some(mask), [1, 1, 1, 1], &params).unwrap();
    let flat = |a: Array4<f64>| a.iter().copied().collect::<Vec<_>>();
    ([flat(out), flat(gi), flat(go), flat(gm)], gw[[0, 0, 0, 0]])
}

/// torchvision (window `-1 < p < size`, corners outside read 0, no cut-off for Wy, Wx):
///
/// ```text
/// A (-1, 0.5): py <= -1, B = 0. y0 = -1, x0 = 0, ly = 0, lx = 0.5; v(-1, .) = 0, v00 = 0,
///              v01 = 0, v10 = v(0,0) = 1, v11 = v(0,1) = 2:
///              Wy = 0.5 (2 - 0) + 0.5 (1 - 0) = 1.5,  Wx = 0 + 1 (0 - 0) = 0
/// B (-0.5, 1): y0 = -1, ly = 0.5, x0 = 1, lx = 0: B = 0.5 v(-1,1) + 0.5 v(0,1) = 0.5 * 2 = 1
///              pixel (0,1) gets 0.5.  v00 = v01 = 0, v10 = v(0,1) = 2, v11 = v(0,2) = 3:
///              Wy = 0 + 1 (2 - 0) = 2,  Wx = 0.5 (3 - 2) + 0.5 (0 - 0) = 0.5
/// C (0, 2):    B = v(0,2) = 3, pixel (0,2) gets 1. v00 = 3, v01 = v(0,3) = 0, v10 = v(1,2) = 6,
///              v11 = 0: Wy = 6 - 3 = 3,  Wx = 0 - 3 = -3   (forward differences)
/// D (1.5, 1.25): y0 = 1, ly = 0.5, x0 = 1, lx = 0.25; row 2 reads 0:
///              B = 0.5*0.75*5 + 0.5*0.25*6 = 1.875 + 0.75 = 2.625; (1,1) gets 0.375, (1,2) 0.125
///              Wy = 0.25 (0 - 6) + 0.75 (0 - 5) = -5.25,  Wx = 0.5 (0 - 0) + 0.5 (6 - 5) = 0.5
/// E (1, 0.5):  B = 0.5*4 + 0.5*5 = 4.5; (1,0) and (1,1) get 0.5 each.
///              Wy = 0.5 (0 - 5) + 0.5 (0 - 4) = -4.5,  Wx = 5 - 4 = 1
/// F (2, 1):    outside; rows 2 and 3 read 0, so Wy = Wx = 0.
/// grad_input: (0,1) 0.5; (0,2) 1; (1,0) 0.5; (1,1) 0.375 + 0.5 = 0.875; (1,2) 0.125
/// grad_weight = 0 + 1 + 3 + 2.625 + 4.5 + 0 = 11.125
/// ```
#[test]
fn torchvision_by_hand() {
    let ([out, gi, go, gm], gw) = hand_outputs(Convention::Torchvision);
    assert_eq!(out, [0.0, 1.0, 3.0, 2.625, 4.5, 0.0]);
    assert_eq!(gi, [0.0, 0.5, 1.0, 0.5, 0.875, 0.125]);
    // dy plane then dx plane.
    let want_go = [
        1.5, 2.0, 3.0, -5.25, -4.5, 0.0, 0.0, 0.5, -3.0, 0.5, 1.0, 0.0,
    ];
    assert_eq!(go, want_go);
    assert_eq!(gm, out);
    assert_eq!(gw, 11.125);
}

/// mmcv: torchvision's forward and input gradient; Wy, Wx reset to 0 outside `-1 < p < size`.
///
/// ```text
/// Only A changes: py = -1 is outside, so its (Wy, Wx) = (0, 0) instead of (1.5, 0).
/// F is outside too, but torchvision's value there is already 0.
/// ```
#[test]
fn mmcv_by_hand() {
    let ([out, gi, go, gm], gw) = hand_outputs(Convention::Mmcv);
    assert_eq!(out, [0.0, 1.0, 3.0, 2.625, 4.5, 0.0]);
    assert_eq!(gi, [0.0, 0.5, 1.0, 0.5, 0.875, 0.125]);
    let want_go = [
        0.0, 2.0, 3.0, -5.25, -4.5, 0.0, 0.0, 0.5, -3.0, 0.5, 1.0, 0.0,
    ];
    assert_eq!(go, want_go);
    assert_eq!(gm, out);
    assert_eq!(gw, 11.125);
}

/// DCN v1 (window `0 <= p < size`; when `floor(p) = size - 1`, both corners on the last
/// row/column and the fraction 0; Wy, Wx 0 outside the window):
///
/// ```text
/// A (-1, 0.5), B (-0.5, 1): py < 0, outside: B = 0, Wy = Wx = 0
/// C (0, 2):    y0 = 0, y1 = 1, ly = 0; x0 = 2 = W-1: x0 = x1 = 2, lx = 0.
///              B = v(0,2) = 3, pixel (0,2) gets 1.
///              Wy = 0 (v(1,2) - v(0,2)) + 1 (v(1,2) - v(0,2)) = 6 - 3 = 3
///              Wx = 0 (v(1,2) - v(1,2)) + 1 (v(0,2) - v(0,2)) = 0
/// D (1.5, 1.25): y0 = 1 = H-1: y0 = y1 = 1, ly = 0; x0 = 1, x1 = 2, lx = 0.25
///              B = 0.75*5 + 0.25*6 = 3.75 + 1.5 = 5.25; (1,1) gets 0.75, (1,2) 0.25
///              Wy = 0 (rows equal),  Wx = 1 (6 - 5) = 1
/// E (1, 0.5):  y0 = y1 = 1; x0 = 0, x1 = 1, lx = 0.5: B = 0.5*4 + 0.5*5 = 4.5;
///              (1,0), (1,1) get 0.5.  Wy = 0,  Wx = 5 - 4 = 1
/// F (2, 1):    outside: 0
/// grad_input: (0,2) 1; (1,0) 0.5; (1,1) 0.75 + 0.5 = 1.25; (1,2) 0.25
/// grad_weight = 0 + 0 + 3 + 5.25 + 4.5 + 0 = 12.75
/// ```
#[test]
fn dcn_v1_by_hand() {
    let ([out, gi, go, gm], gw) = hand_outputs(Convention::DcnV1);
    assert_eq!(out, [0.0, 0.0, 3.0, 5.25, 4.5, 0.0]);
    assert_eq!(gi, [0.0, 0.0, 1.0, 0.5, 1.25, 0.25]);
    let want_go = [0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    assert_eq!(go, want_go);
    assert_eq!(gm, out);
    assert_eq!(gw, 12.75);
}

/// Which side each convention differentiates from at the integer samples of the hand case,
/// with `L = sum(out)` and a step `h = 2^-10` (exact in binary):
///
/// ```text
/// A dy (py = -1), torchvision/mmcv forward:
///     +h: p = (-1+h, 0.5) inside, B = h (0.5*1 + 0.5*2) = 1.5 h   -> right-hand 1.5 (torchvision)
///     -h: p = (-1-h, 0.5) outside, B = 0                           -> left-hand 0    (mmcv)
/// C dx (px = 2 = W-1):
///     torchvision +h: B = (1-h) 3 + h 0 = 3 - 3h                   -> right-hand -3
///     DCN v1      +h: x collapses, B = 3                           -> right-hand 0
///     DCN v1      -h: x0 = 1, lx = 1-h, B = h 2 + (1-h) 3 = 3 - h  -> left-hand 1 (not returned)
/// C dy (py = 0), DCN v1:
///     +h: y0 = 0, ly = h, B = (1-h) 3 + h 6 = 3 + 3h               -> right-hand 3
///     -h: py < 0, outside, B = 0                                   -> a jump of 3
/// E dy (py = 1 = H-1), DCN v1:
///     +h: y collapses, B = 4.5                                     -> right-hand 0
///     -h: y0 = 0, ly = 1-h, B = h 1.5 + (1-h) 4.5 = 4.5 - 3h       -> left-hand 3 (not returned)
/// ```
#[test]
fn integer_samples_take_the_documented_side() {
    let h = hand();
    let step = 1.0 / 1024.0;
    let loss = |conv: Convention, channel: usize, pixel: (usize, usize), delta: f64| {
        let mut offset = h.offset.clone();
        offset[[0, channel, pixel.0, pixel.1]] += delta;
        hand_forward(&h, &offset, conv).sum()
    };
    let right = |conv, channel, pixel| {
        (loss(conv, channel, pixel, step) - loss(conv, channel, pixel, 0.0)) / step
    };
    let left = |conv, channel, pixel| {
        (loss(conv, channel, pixel, 0.0) - loss(conv, channel, pixel, -step)) / step
    };
    let (a, c, e) = ((0, 0), (0, 2), (1, 1));
    let (tv, mm, v1) = (Convention::Torchvision, Convention::Mmcv, Convention::DcnV1);
    assert_eq!(right(tv, 0, a), 1.5);
    assert_eq!(left(mm, 0, a), 0.0);
    assert_eq!(right(tv, 1, c), -3.0);
    assert_eq!(right(v1, 1, c), 0.0);
    assert_eq!(left(v1, 1, c), 1.0);
    assert_eq!(right(v1, 0, c), 3.0);
    assert_eq!(loss(v1, 0, c, -step), 12.75 - 3.0);
    assert_eq!(right(v1, 0, e), 0.0);
    assert_eq!(left(v1, 0, e), 3.0);
    // ... and the gradients are those sides (channel 0 = dy, 1 = dx; flat index 3y + x).
    let go = |conv| hand_outputs(conv).0[2].clone();
    assert_eq!(go(tv)[0], 1.5);
    assert_eq!(go(mm)[0], 0.0);
    assert_eq!(go(tv)[6 + 2], -3.0);
    assert_eq!(go(v1)[6 + 2], 0.0);
    assert_eq!(go(v1)[2], 3.0);
    assert_eq!(go(v1)[4], 0.0);
}

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

const SEEDS: u64 = 40;

/// Samples in `[0, H-1) x [0, W-1)` (integers included): no window edge, no corner outside,
/// no collapsed corner, so every convention is the same computation, bit for bit.
#[test]
fn conventions_agree_inside_the_image() {
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = spec_at_least(&mut rng, 2);
        let mut p = Problem::random(spec, Offsets::Any, &mut rng);
        p.offset = offsets_placing(&spec, &mut rng, |rng, size| {
            if rng.int(0, 1) == 0 {
                rng.int(0, size as i64 - 2) as f64
            } else {
                rng.uniform(0.0, size as f64 - 1.0 - 1e-3)
            }
        });
        let tv = run(&p, Convention::Torchvision);
        assert_eq!(run(&p, Convention::Mmcv), tv, "seed {seed}: mmcv");
        assert_eq!(run(&p, Convention::DcnV1), tv, "seed {seed}: DCN v1");
    }
}

/// Zero offsets sample integer positions only, where every convention reads the pixel itself
/// or (in the padding) 0: the forward and the input, mask and weight gradients are all the
/// dense convolution's.
#[test]
fn conventions_agree_on_zero_offsets() {
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = Case::random(&mut rng);
        let mut p = Problem::random(spec, Offsets::Any, &mut rng);
        p.offset.fill(0.0);
        let dense = reference::conv2d(
            p.input.view(),
            p.weight.view(),
            Some(p.bias.view()),
            &spec.params,
        )
        .unwrap();
        let no_mask = reference::deform_conv2d(
            p.input.view(),
            p.offset.view(),
            None,
            p.weight.view(),
            Some(p.bias.view()),
            &spec.params.convention(Convention::DcnV1),
        )
        .unwrap();
        assert_close(
            &format!("seed {seed}: DCN v1 dense"),
            &no_mask,
            &dense,
            1e-12,
        );
        let tv = run(&p, Convention::Torchvision);
        for conv in [Convention::Mmcv, Convention::DcnV1] {
            let o = run(&p, conv);
            assert_eq!(o.out, tv.out, "seed {seed} {conv:?}");
            assert_eq!(o.grad_input, tv.grad_input, "seed {seed} {conv:?}");
            assert_eq!(o.grad_mask, tv.grad_mask, "seed {seed} {conv:?}");
            assert_eq!(o.grad_weight, tv.grad_weight, "seed {seed} {conv:?}");
        }
    }
}

/// mmcv's forward and input, mask and weight gradients are torchvision's exactly; its offset
/// gradient is torchvision's with every sample outside `-1 < p < size` zeroed. Samples sit on
/// and around the borders; the test also checks that the zeroing changed something (samples
/// on `-1` exactly).
#[test]
fn mmcv_is_torchvision_with_the_offset_gradient_cut_off() {
    let mut changed = 0;
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = Case::random(&mut rng);
        let mut p = Problem::random(spec, Offsets::Any, &mut rng);
        p.offset = offsets_placing(&spec, &mut rng, border_position);
        let tv = run(&p, Convention::Torchvision);
        let mm = run(&p, Convention::Mmcv);
        assert_eq!(mm.out, tv.out, "seed {seed}");
        assert_eq!(mm.grad_input, tv.grad_input, "seed {seed}");
        assert_eq!(mm.grad_mask, tv.grad_mask, "seed {seed}");
        assert_eq!(mm.grad_weight, tv.grad_weight, "seed {seed}");
        let mut want = tv.grad_offset.clone();
        let (ho, wo) = spec.out_hw();
        let (h, w) = (spec.h as f64, spec.w as f64);
        for n in 0..spec.n {
            for ch in 0..spec.offset_groups() * spec.taps() {
                let k = ch % spec.taps();
                for y in 0..ho {
                    for x in 0..wo {
                        let (r, c) = spec.base(k / spec.kw, k % spec.kw, y, x);
                        let py = r + p.offset[[n, 2 * ch, y, x]];
                        let px = c + p.offset[[n, 2 * ch + 1, y, x]];
                        if !(py > -1.0 && py < h && px > -1.0 && px < w) {
                            for axis in 0..2 {
                                let v = &mut want[[n, 2 * ch + axis, y, x]];
                                changed += usize::from(*v != 0.0);
                                *v = 0.0;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(mm.grad_offset, want, "seed {seed}");
    }
    assert!(changed > 20, "only {changed} offset gradients differed");
}

/// Pads `a` (`[N, C, H, W]`) to `[N, C, H+1, W+1]`, filling the new row and column by `fill`:
/// `Some(v)` with the constant `v`, `None` by replicating the last row and column.
fn extend(a: &Array4<f64>, fill: Option<f64>) -> Array4<f64> {
    let [n, c, h, w] = [a.shape()[0], a.shape()[1], a.shape()[2], a.shape()[3]];
    Array4::from_shape_fn((n, c, h + 1, w + 1), |(n, c, r, s)| match fill {
        Some(v) if r == h || s == w => v,
        _ => a[[n, c, r.min(h - 1), s.min(w - 1)]],
    })
}

/// DCN v1 on an image equals torchvision on that image with its last row and column
/// replicated once more, for samples inside DCN v1's window `[0, H) x [0, W)`: in the last band
/// torchvision's second corner then reads the replicated row, which is what DCN v1's collapsed
/// corner does. With a 1x1 kernel, stride 1 and no padding each output pixel is one sample, so
/// the `H x W` block of the extended problem (extra offsets 0, extra `grad_out` 0) is the
/// original one. The input gradient folds the extra row and column back onto the last ones.
#[test]
fn dcn_v1_is_torchvision_on_the_edge_replicated_image() {
    let mut collapsed = 0;
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = Case::from_knobs(
            rng.size(1, 2),
            1,
            rng.size(1, 3),
            rng.size(1, 2),
            rng.size(0, 3),
            (1, 1),
            (1, 1),
            (1, 1),
            Padding::default(),
            (rng.size(0, 3), rng.size(0, 3)),
        );
        let mut p = Problem::random(spec, Offsets::Any, &mut rng);
        p.offset = offsets_placing(&spec, &mut rng, |rng, size| {
            let s = size as f64;
            let special = [0.0, 1e-3, s - 1.0, s - 1.0 + 1e-3, s - 0.5, s - 1e-3];
            match rng.int(0, 2) {
                0 => special[rng.size(0, special.len() - 1)],
                1 => rng.int(0, size as i64 - 1) as f64,
                _ => rng.uniform(0.0, s),
            }
        });
        collapsed += p
            .sample_positions()
            .iter()
            .filter(|&&(py, px)| py >= spec.h as f64 - 1.0 || px >= spec.w as f64 - 1.0)
            .count();
        let v1 = run(&p, Convention::DcnV1);

        let mut ext_spec = spec;
        ext_spec.h += 1;
        ext_spec.w += 1;
        let ext = Problem {
            spec: ext_spec,
            input: extend(&p.input, None),
            offset: extend(&p.offset, Some(0.0)),
            mask: extend(&p.mask, Some(1.0)),
            weight: p.weight.clone(),
            bias: p.bias.clone(),
            grad_out: extend(&p.grad_out, Some(0.0)),
        };
        let tv = run(&ext, Convention::Torchvision);
        let (h, w) = (spec.h, spec.w);
        let block = |a: &Array4<f64>| a.slice(s![.., .., ..h, ..w]).to_owned();
        let at = |what: &str| format!("seed {seed}: {what}");
        assert_close(&at("out"), &v1.out, &block(&tv.out), 1e-12);
        assert_close(
            &at("grad_offset"),
            &v1.grad_offset,
            &block(&tv.grad_offset),
            1e-12,
        );
        assert_close(
            &at("grad_mask"),
            &v1.grad_mask,
            &block(&tv.grad_mask),
            1e-12,
        );
        assert_close(&at("grad_weight"), &v1.grad_weight, &tv.grad_weight, 1e-12);
        let mut folded = block(&tv.grad_input);
        for r in 0..=h {
            for c in 0..=w {
                if r == h || c == w {
                    let v = tv.grad_input.slice(s![.., .., r, c]).to_owned();
                    let mut dst = folded.slice_mut(s![.., .., r.min(h - 1), c.min(w - 1)]);
                    dst += &v;
                }
            }
        }
        assert_close(&at("grad_input"), &v1.grad_input, &folded, 1e-12);
    }
    assert!(
        collapsed > 100,
        "only {collapsed} samples in the last bands"
    );
}

/// Each convention's offset and input gradients are the derivatives of its own forward:
/// central differences (step 1e-6) at samples at least 0.1 from any integer row or column, so
/// the step crosses no cell boundary, window edge (-1, 0, H) or collapse edge (H-1). Checked
/// on `L = <grad_out, out>`.
#[test]
fn every_convention_differentiates_its_own_forward() {
    const STEP: f64 = 1e-6;
    let mut largest = 0.0f64;
    for seed in 0..12 {
        let mut rng = Rng::new(1000 + seed);
        let spec = Case::random(&mut rng);
        let p = Problem::random(spec, Offsets::AwayFromIntegers, &mut rng);
        for conv in Convention::ALL {
            let params = spec.params.convention(conv);
            let o = run(&p, conv);
            let loss = |offset: &Array4<f64>, input: &Array4<f64>| {
                let out = reference::deform_conv2d(
                    input.view(),
                    offset.view(),
                    Some(p.mask.view()),
                    p.weight.view(),
                    Some(p.bias.view()),
                    &params,
                )
                .unwrap();
                dot(&p.grad_out, &out)
            };
            let tol = 1e-6;
            // 24 random elements of each gradient (all of them would take minutes).
            for _ in 0..24 {
                let idx = random_index(&mut rng, o.grad_offset.shape());
                let want = o.grad_offset[idx];
                let (mut up, mut down) = (p.offset.clone(), p.offset.clone());
                up[idx] += STEP;
                down[idx] -= STEP;
                let fd = (loss(&up, &p.input) - loss(&down, &p.input)) / (up[idx] - down[idx]);
                assert!(
                    (fd - want).abs() <= tol,
                    "seed {seed} {conv:?} grad_offset {idx:?}: {want} vs {fd}"
                );
                largest = largest.max(want.abs());

                let idx = random_index(&mut rng, o.grad_input.shape());
                let want = o.grad_input[idx];
                let (mut up, mut down) = (p.input.clone(), p.input.clone());
                up[idx] += STEP;
                down[idx] -= STEP;
                let fd = (loss(&p.offset, &up) - loss(&p.offset, &down)) / (up[idx] - down[idx]);
                assert!(
                    (fd - want).abs() <= tol,
                    "seed {seed} {conv:?} grad_input {idx:?}: {want} vs {fd}"
                );
            }
        }
    }
    assert!(largest > 0.1, "vacuous: gradients all near zero");
}

// ---------------------------------------------------------------------------------------------
// Golden cases (torchvision float64).
// ---------------------------------------------------------------------------------------------

/// Naming the torchvision convention explicitly changes nothing: every golden case still
/// matches, forward and every gradient; mmcv matches every golden forward, input, mask and
/// weight gradient (it differs from torchvision only in the offset gradient).
#[test]
fn golden_cases_under_explicit_conventions() {
    const TOL: f64 = 1e-10;
    let cases = support::golden_cases();
    assert!(cases.len() >= 50, "found {} golden cases", cases.len());
    for case in &cases {
        let input = case.get4("input");
        let offset = case.get4("offset");
        let mask = case.opt4("mask");
        let weight = case.get4("weight");
        let grad_out = case.get4("grad_out");
        let bias = case
            .arrays
            .get("bias")
            .map(|b| b.view().into_dimensionality::<ndarray::Ix1>().unwrap());
        let input_shape = [
            input.shape()[0],
            input.shape()[1],
            input.shape()[2],
            input.shape()[3],
        ];
        let weight_shape = [
            weight.shape()[0],
            weight.shape()[1],
            weight.shape()[2],
            weight.shape()[3],
        ];
        for conv in [Convention::Torchvision, Convention::Mmcv] {
            let p = case.params.convention(conv);
            let name = format!("{} ({conv:?})", case.name);
            let check = |tensor: &str, got: Array4<f64>| {
                support::assert_rel_close(&name, tensor, &got.view(), &case.get4(tensor), TOL)
            };
            check(
                "out",
                reference::deform_conv2d(input, offset, mask, weight, bias, &p).unwrap(),
            );
            check(
                "grad_input",
                reference::grad_input(grad_out, offset, mask, weight, input_shape, &p).unwrap(),
            );
            check(
                "grad_weight",
                reference::grad_weight(grad_out, input, offset, mask, weight_shape, &p).unwrap(),
            );
            if case.opt4("grad_mask").is_some() {
                check(
                    "grad_mask",
                    reference::grad_mask(grad_out, input, offset, weight, &p).unwrap(),
                );
            }
            if conv == Convention::Torchvision {
                check(
                    "grad_offset",
                    reference::grad_offset(grad_out, input, offset, mask, weight, &p).unwrap(),
                );
            }
        }
    }
}
