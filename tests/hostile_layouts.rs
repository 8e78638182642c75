//! Hostile memory layouts (issue 6): every operand of every fast function as a transposed
//! (permuted-axes), sliced (step 2), negatively strided or mixed view gives bitwise the result of
//! its contiguous copy, f32 and f64; and every `_into` output may be such a view, is fully
//! overwritten, and nothing outside it is touched.
//!
//! Views are carved out of storage prefilled with NaN, so reading a wrong element shows up.

mod support;

use deformconv::{
    conv2d, conv2d_backward, conv2d_backward_into, conv2d_grad_input, conv2d_grad_input_into,
    conv2d_grad_weight, conv2d_grad_weight_into, conv2d_into, deform_conv2d,
    deform_conv2d_backward, deform_conv2d_backward_into, deform_conv2d_grad_bias,
    deform_conv2d_grad_bias_into, deform_conv2d_grad_input, deform_conv2d_grad_input_into,
    deform_conv2d_grad_mask, deform_conv2d_grad_mask_into, deform_conv2d_grad_offset,
    deform_conv2d_grad_offset_into, deform_conv2d_grad_weight, deform_conv2d_grad_weight_into,
    deform_conv2d_into, ConvParams, Float, GradsMut, Padding, Want,
};
use ndarray::{Array1, Array4, ArrayView1, ArrayView4, ArrayViewMut1, ArrayViewMut4, Axis, Slice};
use proptest::prelude::*;
use support::{cases, Case, Rng};

/// Storage orders: which logical axis each storage axis holds (slowest first).
const PERMS: [[usize; 4]; 5] = [
    [0, 1, 2, 3],
    [3, 2, 1, 0],
    [1, 0, 3, 2],
    [0, 2, 3, 1],
    [2, 0, 3, 1],
];
const STEPS: [isize; 4] = [1, 2, -1, -2];

/// How a logical tensor sits in memory: storage axis order and a step per logical axis
/// (`2`: every other element of a twice larger buffer, negative: reversed).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Layout {
    perm: [usize; 4],
    step: [isize; 4],
}

impl Layout {
    const CONTIGUOUS: Layout = Layout {
        perm: [0, 1, 2, 3],
        step: [1; 4],
    };
    const TRANSPOSED: Layout = Layout {
        perm: [3, 2, 1, 0],
        step: [1; 4],
    };
    const SLICED: Layout = Layout {
        perm: [0, 1, 2, 3],
        step: [2; 4],
    };
    const NEGATIVE: Layout = Layout {
        perm: [0, 1, 2, 3],
        step: [-1; 4],
    };
    /// PyTorch's channels_last: stored `[N, H, W, C]` (the forward's deformable gather and the
    /// backward read it without a row-major copy).
    const CHANNELS_LAST: Layout = Layout {
        perm: [0, 2, 3, 1],
        step: [1; 4],
    };
    const MIXED: Layout = Layout {
        perm: [1, 0, 3, 2],
        step: [-2, 1, 2, -1],
    };
    /// The step of the 1-D outputs (`grad_bias`) that go with this layout.
    fn step1(&self) -> isize {
        self.step[3]
    }
    /// The step of a bias operand that goes with this layout (-1 included: a reversed bias
    /// view once failed, see tests/regressions.rs).
    fn bias_step(&self) -> isize {
        self.step[3]
    }
}

fn layouts() -> impl Strategy<Value = Layout> {
    (0..PERMS.len(), [0..4usize, 0..4usize, 0..4usize, 0..4usize]).prop_map(|(p, s)| Layout {
        perm: PERMS[p],
        step: s.map(|i| STEPS[i]),
    })
}

fn inverse(perm: [usize; 4]) -> [usize; 4] {
    let mut inv = [0; 4];
    for (p, &a) in perm.iter().enumerate() {
        inv[a] = p;
    }
    inv
}

/// A NaN-filled buffer holding a tensor of logical shape `shape` laid out as `layout`.
struct Stored<T> {
    store: Array4<T>,
    layout: Layout,
}

impl<T: Float> Stored<T> {
    fn empty(shape: &[usize], layout: Layout) -> Self {
        let big: Vec<usize> = (0..4)
            .map(|i| shape[i] * layout.step[i].unsigned_abs())
            .collect();
        let stored = layout.perm.map(|a| big[a]);
        Stored {
            store: Array4::from_elem(stored, T::from_f64(f64::NAN)),
            layout,
        }
    }
    fn new(a: &Array4<T>, layout: Layout) -> Self {
        let mut s = Stored::empty(a.shape(), layout);
        s.view_mut().assign(a);
        s
    }
    fn view(&self) -> ArrayView4<'_, T> {
        let mut v = self.store.view().permuted_axes(inverse(self.layout.perm));
        v.slice_each_axis_inplace(|ax| Slice::new(0, None, self.layout.step[ax.axis.index()]));
        v
    }
    fn view_mut(&mut self) -> ArrayViewMut4<'_, T> {
        let mut v = self
            .store
            .view_mut()
            .permuted_axes(inverse(self.layout.perm));
        v.slice_each_axis_inplace(|ax| Slice::new(0, None, self.layout.step[ax.axis.index()]));
        v
    }
    /// The view's contents, after checking that everything outside it is still NaN.
    fn written(&self) -> Array4<T> {
        let inside = self.view().to_owned();
        let untouched = self.store.iter().filter(|v| v.is_nan()).count();
        let nan_inside = inside.iter().filter(|v| v.is_nan()).count();
        assert_eq!(
            untouched - nan_inside,
            self.store.len() - inside.len(),
            "an element outside the output view was written ({:?})",
            self.layout
        );
        inside
    }
}

/// [`Stored`] for vectors.
struct Stored1<T> {
    store: Array1<T>,
    step: isize,
}

impl<T: Float> Stored1<T> {
    fn empty(len: usize, step: isize) -> Self {
        Stored1 {
            store: Array1::from_elem(len * step.unsigned_abs(), T::from_f64(f64::NAN)),
            step,
        }
    }
    fn new(a: &Array1<T>, step: isize) -> Self {
        let mut s = Stored1::empty(a.len(), step);
        s.view_mut().assign(a);
        s
    }
    fn view(&self) -> ArrayView1<'_, T> {
        let mut v = self.store.view();
        v.slice_axis_inplace(Axis(0), Slice::new(0, None, self.step));
        v
    }
    fn view_mut(&mut self) -> ArrayViewMut1<'_, T> {
        let mut v = self.store.view_mut();
        v.slice_axis_inplace(Axis(0), Slice::new(0, None, self.step));
        v
    }
    fn written(&self) -> Array1<T> {
        let inside = self.view().to_owned();
        let untouched = self.store.iter().filter(|v| v.is_nan()).count();
        assert_eq!(untouched, self.store.len() - inside.len());
        inside
    }
}

fn same<T: Float>(name: &str, got: &Array4<T>, want: &Array4<T>) {
    assert_eq!(got.shape(), want.shape(), "{name}");
    for ((idx, g), w) in got.indexed_iter().zip(want.iter()) {
        assert_eq!(
            g.to_f64().to_bits(),
            w.to_f64().to_bits(),
            "{name}{idx:?}: {g:?} vs contiguous {w:?}"
        );
    }
}

fn same1<T: Float>(name: &str, got: &Array1<T>, want: &Array1<T>) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
        assert_eq!(g.to_f64().to_bits(), w.to_f64().to_bits(), "{name}[{i}]");
    }
}

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// Layouts of the operands and of the `_into` outputs.
#[derive(Debug, Clone, Copy)]
struct Layouts {
    input: Layout,
    offset: Layout,
    mask: Layout,
    weight: Layout,
    grad_out: Layout,
    bias: Layout,
    out: Layout,
    grads: [Layout; 4],
}

impl Layouts {
    fn all(l: Layout) -> Self {
        Layouts {
            input: l,
            offset: l,
            mask: l,
            weight: l,
            grad_out: l,
            bias: l,
            out: l,
            grads: [l; 4],
        }
    }
}

fn layouts_each() -> impl Strategy<Value = Layouts> {
    (
        [
            layouts(),
            layouts(),
            layouts(),
            layouts(),
            layouts(),
            layouts(),
        ],
        layouts(),
        [layouts(), layouts(), layouts(), layouts()],
    )
        .prop_map(
            |([input, offset, mask, weight, grad_out, bias], out, grads)| Layouts {
                input,
                offset,
                mask,
                weight,
                grad_out,
                bias,
                out,
                grads,
            },
        )
}

/// Every fast function on views laid out as `l` against the same function on contiguous arrays.
fn check<T: Float>(case: &Case, l: &Layouts) {
    let t = case.tensors();
    let cv = |a: &Array4<f64>| a.mapv(T::from_f64);
    let (input, offset, weight) = (cv(&t.input), cv(&t.offset), cv(&t.weight));
    let g = case.geometry();
    let mut r = Rng::new(case.seed ^ 0xabcd);
    let grad_out = Array4::from_shape_fn(g.out_shape(), |_| T::from_f64(r.value()));
    // A mask always exists for the odd views; `case.mask` decides whether it is passed.
    let mask = t
        .mask
        .as_ref()
        .map(cv)
        .unwrap_or_else(|| Array4::from_shape_fn(g.mask_shape(), |_| T::from_f64(r.value())));
    let bias = t
        .bias
        .as_ref()
        .map(|b| b.mapv(T::from_f64))
        .unwrap_or_else(|| Array1::from_shape_fn(g.c_out, |_| T::from_f64(r.value())));
    let p = &case.params;
    let (use_mask, use_bias) = (case.mask, case.bias);

    let si = Stored::new(&input, l.input);
    let so = Stored::new(&offset, l.offset);
    let sm = Stored::new(&mask, l.mask);
    let sw = Stored::new(&weight, l.weight);
    let sg = Stored::new(&grad_out, l.grad_out);
    let sb = Stored1::new(&bias, l.bias.bias_step());
    let (i0, o0, w0, g0) = (input.view(), offset.view(), weight.view(), grad_out.view());
    let m0 = use_mask.then(|| mask.view());
    let b0 = use_bias.then(|| bias.view());
    let (i1, o1, w1, g1) = (si.view(), so.view(), sw.view(), sg.view());
    let m1 = use_mask.then(|| sm.view());
    let b1 = use_bias.then(|| sb.view());
    let (is, ws) = (shape4(i0.shape()), shape4(w0.shape()));

    // Owned results.
    let fwd = deform_conv2d(i0, o0, m0, w0, b0, p).unwrap();
    same(
        "deform_conv2d",
        &deform_conv2d(i1, o1, m1, w1, b1, p).unwrap(),
        &fwd,
    );
    let dense = conv2d(i0, w0, b0, p).unwrap();
    same("conv2d", &conv2d(i1, w1, b1, p).unwrap(), &dense);
    let all = deform_conv2d_backward(g0, i0, o0, m0, w0, p, Want::ALL).unwrap();
    let odd = deform_conv2d_backward(g1, i1, o1, m1, w1, p, Want::ALL).unwrap();
    assert_eq!(odd.clone().bias.map(|_| ()), Some(()));
    let [gi, go, gm, gw] =
        [&all.input, &all.offset, &all.mask, &all.weight].map(|a| a.clone().unwrap());
    let gb = all.bias.clone().unwrap();
    same("backward input", odd.input.as_ref().unwrap(), &gi);
    same("backward offset", odd.offset.as_ref().unwrap(), &go);
    same("backward mask", odd.mask.as_ref().unwrap(), &gm);
    same("backward weight", odd.weight.as_ref().unwrap(), &gw);
    same1("backward bias", odd.bias.as_ref().unwrap(), &gb);
    same(
        "grad_input",
        &deform_conv2d_grad_input(g1, o1, m1, w1, is, p).unwrap(),
        &gi,
    );
    same(
        "grad_offset",
        &deform_conv2d_grad_offset(g1, i1, o1, m1, w1, p).unwrap(),
        &go,
    );
    same(
        "grad_mask",
        &deform_conv2d_grad_mask(g1, i1, o1, w1, p).unwrap(),
        &gm,
    );
    same(
        "grad_weight",
        &deform_conv2d_grad_weight(g1, i1, o1, m1, ws, p).unwrap(),
        &gw,
    );
    same1("grad_bias", &deform_conv2d_grad_bias(g1).unwrap(), &gb);
    let dall = conv2d_backward(g0, i0, w0, p, Want::ALL).unwrap();
    let dodd = conv2d_backward(g1, i1, w1, p, Want::ALL).unwrap();
    let (dgi, dgw) = (dall.input.clone().unwrap(), dall.weight.clone().unwrap());
    same("conv2d_backward input", dodd.input.as_ref().unwrap(), &dgi);
    same(
        "conv2d_backward weight",
        dodd.weight.as_ref().unwrap(),
        &dgw,
    );
    same1(
        "conv2d_backward bias",
        dodd.bias.as_ref().unwrap(),
        dall.bias.as_ref().unwrap(),
    );
    same(
        "conv2d_grad_input",
        &conv2d_grad_input(g1, w1, is, p).unwrap(),
        &dgi,
    );
    same(
        "conv2d_grad_weight",
        &conv2d_grad_weight(g1, i1, ws, p).unwrap(),
        &dgw,
    );

    // `_into` with odd outputs (and odd operands).
    let mut out = Stored::empty(&g.out_shape(), l.out);
    deform_conv2d_into(i1, o1, m1, w1, b1, p, out.view_mut()).unwrap();
    same("deform_conv2d_into", &out.written(), &fwd);
    let mut out = Stored::empty(&g.out_shape(), l.out);
    conv2d_into(i1, w1, b1, p, out.view_mut()).unwrap();
    same("conv2d_into", &out.written(), &dense);

    let [li, lo, lm, lw] = l.grads;
    let mut oi = Stored::empty(&g.input_shape(), li);
    let mut oo = Stored::empty(&g.offset_shape(), lo);
    let mut om = Stored::empty(&g.mask_shape(), lm);
    let mut ow = Stored::empty(&g.weight_shape(), lw);
    let mut ob = Stored1::empty(g.c_out, lw.step1());
    let outs = GradsMut {
        input: Some(oi.view_mut()),
        offset: Some(oo.view_mut()),
        mask: Some(om.view_mut()),
        weight: Some(ow.view_mut()),
        bias: Some(ob.view_mut()),
    };
    deform_conv2d_backward_into(g1, i1, o1, m1, w1, p, outs).unwrap();
    same("backward_into input", &oi.written(), &gi);
    same("backward_into offset", &oo.written(), &go);
    same("backward_into mask", &om.written(), &gm);
    same("backward_into weight", &ow.written(), &gw);
    same1("backward_into bias", &ob.written(), &gb);

    let mut oi = Stored::empty(&g.input_shape(), li);
    deform_conv2d_grad_input_into(g1, o1, m1, w1, p, oi.view_mut()).unwrap();
    same("grad_input_into", &oi.written(), &gi);
    let mut oo = Stored::empty(&g.offset_shape(), lo);
    deform_conv2d_grad_offset_into(g1, i1, o1, m1, w1, p, oo.view_mut()).unwrap();
    same("grad_offset_into", &oo.written(), &go);
    let mut om = Stored::empty(&g.mask_shape(), lm);
    deform_conv2d_grad_mask_into(g1, i1, o1, w1, p, om.view_mut()).unwrap();
    same("grad_mask_into", &om.written(), &gm);
    let mut ow = Stored::empty(&g.weight_shape(), lw);
    deform_conv2d_grad_weight_into(g1, i1, o1, m1, p, ow.view_mut()).unwrap();
    same("grad_weight_into", &ow.written(), &gw);
    let mut ob = Stored1::empty(g.c_out, lw.step1());
    deform_conv2d_grad_bias_into(g1, ob.view_mut()).unwrap();
    same1("grad_bias_into", &ob.written(), &gb);

    let mut oi = Stored::empty(&g.input_shape(), li);
    let mut ow = Stored::empty(&g.weight_shape(), lw);
    let outs = GradsMut {
        input: Some(oi.view_mut()),
        weight: Some(ow.view_mut()),
        ..GradsMut::default()
    };
    conv2d_backward_into(g1, i1, w1, p, outs).unwrap();
    same("conv2d_backward_into input", &oi.written(), &dgi);
    same("conv2d_backward_into weight", &ow.written(), &dgw);
    let mut oi = Stored::empty(&g.input_shape(), li);
    conv2d_grad_input_into(g1, w1, p, oi.view_mut()).unwrap();
    same("conv2d_grad_input_into", &oi.written(), &dgi);
    let mut ow = Stored::empty(&g.weight_shape(), lw);
    conv2d_grad_weight_into(g1, i1, p, ow.view_mut()).unwrap();
    same("conv2d_grad_weight_into", &ow.written(), &dgw);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Each operand and output in its own random layout.
    #[test]
    fn odd_views_give_the_bits_of_contiguous_copies_f64(case in cases(), l in layouts_each()) {
        check::<f64>(&case, &l);
    }

    #[test]
    fn odd_views_give_the_bits_of_contiguous_copies_f32(case in cases(), l in layouts_each()) {
        check::<f32>(&case, &l);
    }
}

/// One problem with groups, offset groups, mask and bias, several tiles' worth of pixels.
fn fixed_case(seed: u64) -> Case {
    Case {
        n: 2,
        c_in: 4,
        c_out: 6,
        h: 9,
        w: 7,
        kh: 3,
        kw: 2,
        params: ConvParams::default()
            .stride(2, 1)
            .padding_sides(Padding {
                top: 1,
                bottom: 0,
                left: 2,
                right: 1,
            })
            .dilation(1, 2)
            .groups(2)
            .offset_groups(2),
        mask: true,
        bias: true,
        seed,
    }
}

/// Each named kind of view, for every operand and output at once.
#[test]
fn every_named_layout_for_every_operand() {
    for (i, l) in [
        Layout::CONTIGUOUS,
        Layout::TRANSPOSED,
        Layout::SLICED,
        Layout::NEGATIVE,
        Layout::CHANNELS_LAST,
        Layout::MIXED,
    ]
    .into_iter()
    .enumerate()
    {
        check::<f64>(&fixed_case(i as u64), &Layouts::all(l));
        check::<f32>(&fixed_case(10 + i as u64), &Layouts::all(l));
    }
}

/// The views really are what they claim: non-standard strides, negative strides.
#[test]
fn the_views_have_the_strides_they_claim() {
    let a = Array4::<f64>::from_shape_fn((2, 3, 4, 5), |(a, b, c, d)| {
        (a * 1000 + b * 100 + c * 10 + d) as f64
    });
    for l in [
        Layout::TRANSPOSED,
        Layout::SLICED,
        Layout::NEGATIVE,
        Layout::MIXED,
    ] {
        let s = Stored::new(&a, l);
        let v = s.view();
        assert_eq!(v, a.view());
        assert!(!v.is_standard_layout(), "{l:?}");
    }
    let neg = Stored::new(&a, Layout::NEGATIVE);
    assert!(neg.view().strides().iter().all(|&s| s < 0));
    let sliced = Stored::new(&a, Layout::SLICED);
    assert_eq!(
        sliced.view().strides(),
        &[2 * 6 * 8 * 10, 2 * 8 * 10, 2 * 10, 2]
    );
    let b = Array1::from_vec(vec![1.0f64, 2.0, 3.0]);
    assert_eq!(Stored1::new(&b, -2).view(), b.view());
    assert_eq!(Stored1::new(&b, -2).view().strides(), &[-2]);
}

#[test]
fn a_reversed_bias_is_read_in_its_own_order() {
    // Stride -1 on the bias once gave an internal layout error; it must act as its copy.
    let input = Array4::from_shape_fn((2, 3, 5, 5), |(n, c, y, x)| {
        (n + 2 * c + y * x) as f32 * 0.1
    });
    let weight = Array4::from_shape_fn((4, 3, 3, 3), |(o, c, i, j)| (o + c + i + j) as f32 * 0.01);
    let offset = Array4::from_elem((2, 18, 5, 5), 0.25f32);
    let bias = Array1::from_vec(vec![1.0f32, 2.0, 3.0, 4.0]);
    let reversed = bias.slice(ndarray::s![..;-1]);
    let copy = reversed.to_owned();
    let p = ConvParams::default().padding(1, 1);
    let (x, w, off) = (input.view(), weight.view(), offset.view());
    let got = deform_conv2d(x, off, None, w, Some(reversed), &p).unwrap();
    let want = deform_conv2d(x, off, None, w, Some(copy.view()), &p).unwrap();
    same("deform_conv2d out", &got, &want);
    let got = conv2d(x, w, Some(reversed), &p).unwrap();
    let want = conv2d(x, w, Some(copy.view()), &p).unwrap();
    same("conv2d out", &got, &want);
    assert_ne!(copy[0], bias[0], "the view is reversed");
}
