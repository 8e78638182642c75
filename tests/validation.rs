//! One test per validation rule of DESIGN.md §1 (`Geometry::new` and the `check_*` methods),
//! through every public reference function: the exact `Err` value, its exact message, and
//! which entry points reject the problem (those that take the faulty operand) and which
//! accept it (those that do not).

use deformconv::{reference, ConvParams, Error, Padding};
use ndarray::{Array1, Array4};

/// Operands of one call to each entry point. `input_shape` / `weight_shape` are what
/// `grad_input` / `grad_weight` receive instead of the tensors.
struct Case {
    input: Array4<f64>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    weight: Array4<f64>,
    bias: Option<Array1<f64>>,
    grad_out: Array4<f64>,
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    params: ConvParams,
}

/// A valid grouped DCN v2 problem: input `[1, 4, 5, 5]`, weight `[6, 2, 3, 3]`, groups 2,
/// offset groups 2, so `H_out = W_out = 3`, offset `[1, 36, 3, 3]`, mask `[1, 18, 3, 3]`.
fn base() -> Case {
    Case {
        input: Array4::zeros((1, 4, 5, 5)),
        offset: Array4::zeros((1, 36, 3, 3)),
        mask: Some(Array4::zeros((1, 18, 3, 3))),
        weight: Array4::zeros((6, 2, 3, 3)),
        bias: Some(Array1::zeros(6)),
        grad_out: Array4::zeros((1, 6, 3, 3)),
        input_shape: [1, 4, 5, 5],
        weight_shape: [6, 2, 3, 3],
        params: ConvParams::default().groups(2).offset_groups(2),
    }
}

impl Case {
    fn input(mut self, shape: [usize; 4]) -> Self {
        self.input = Array4::zeros(shape);
        self.input_shape = shape;
        self
    }
    fn weight(mut self, shape: [usize; 4]) -> Self {
        self.weight = Array4::zeros(shape);
        self.weight_shape = shape;
        self
    }
    fn params(mut self, params: ConvParams) -> Self {
        self.params = params;
        self
    }
}

const ALL: [&str; 6] = [
    "deform_conv2d",
    "conv2d",
    "grad_input",
    "grad_offset",
    "grad_mask",
    "grad_weight",
];
const DEFORM: [&str; 5] = [
    "deform_conv2d",
    "grad_input",
    "grad_offset",
    "grad_mask",
    "grad_weight",
];

/// Every entry point's result, reduced to the shape it returned.
fn run(c: &Case) -> Vec<(&'static str, Result<Vec<usize>, Error>)> {
    let p = &c.params;
    let mask = c.mask.as_ref().map(|m| m.view());
    let bias = c.bias.as_ref().map(|b| b.view());
    let shape = |r: deformconv::Result<Array4<f64>>| r.map(|a| a.shape().to_vec());
    vec![
        (
            "deform_conv2d",
            shape(reference::deform_conv2d(
                c.input.view(),
                c.offset.view(),
                mask,
                c.weight.view(),
                bias,
                p,
            )),
        ),
        (
            "conv2d",
            shape(reference::conv2d(c.input.view(), c.weight.view(), bias, p)),
        ),
        (
            "grad_input",
            shape(reference::grad_input(
                c.grad_out.view(),
                c.offset.view(),
                mask,
                c.weight.view(),
                c.input_shape,
                p,
            )),
        ),
        (
            "grad_offset",
            shape(reference::grad_offset(
                c.grad_out.view(),
                c.input.view(),
                c.offset.view(),
                mask,
                c.weight.view(),
                p,
            )),
        ),
        (
            "grad_mask",
            shape(reference::grad_mask(
                c.grad_out.view(),
                c.input.view(),
                c.offset.view(),
                c.weight.view(),
                p,
            )),
        ),
        (
            "grad_weight",
            shape(reference::grad_weight(
                c.grad_out.view(),
                c.input.view(),
                c.offset.view(),
                mask,
                c.weight_shape,
                p,
            )),
        ),
    ]
}

/// Asserts that exactly the entry points in `rejecting` return `Err(expected)` whose message
/// is `message`, and that all the others succeed.
fn assert_rejected_by(c: &Case, rejecting: &[&str], expected: Error, message: &str) {
    assert_eq!(expected.to_string(), message, "Display of {expected:?}");
    for (name, result) in run(c) {
        if rejecting.contains(&name) {
            match result {
                Err(e) => {
                    assert_eq!(e, expected, "{name}");
                    assert_eq!(e.to_string(), message, "{name}");
                }
                Ok(shape) => panic!("{name} accepted the problem (output {shape:?})"),
            }
        } else if let Err(e) = result {
            panic!("{name} should accept the problem but said: {e}");
        }
    }
}

fn param(name: &'static str, rule: &str) -> Error {
    Error::Param {
        name,
        rule: rule.into(),
    }
}

fn shape(tensor: &'static str, axis: &'static str, expected: &str, got: usize) -> Error {
    Error::Shape {
        tensor,
        axis,
        expected: expected.into(),
        got,
    }
}

fn too_large(what: &str) -> Error {
    Error::TooLarge { what: what.into() }
}

#[test]
fn the_base_case_is_valid_everywhere() {
    for (name, result) in run(&base()) {
        if let Err(e) = result {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn stride_zero() {
    let p = base().params.stride(0, 1);
    let msg = "stride: (0, 1) must be at least 1 on both axes";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("stride", "(0, 1) must be at least 1 on both axes"),
        msg,
    );
    let p = base().params.stride(2, 0);
    let msg = "stride: (2, 0) must be at least 1 on both axes";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("stride", "(2, 0) must be at least 1 on both axes"),
        msg,
    );
}

#[test]
fn dilation_zero() {
    let p = base().params.dilation(1, 0);
    let msg = "dilation: (1, 0) must be at least 1 on both axes";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("dilation", "(1, 0) must be at least 1 on both axes"),
        msg,
    );
}

#[test]
fn groups_zero() {
    let p = base().params.groups(0);
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("groups", "0 must be at least 1"),
        "groups: 0 must be at least 1",
    );
}

/// `conv2d` ignores offset groups in the computation but still validates them.
#[test]
fn offset_groups_zero() {
    let p = base().params.offset_groups(0);
    let msg = "offset_groups: 0 must be at least 1";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("offset_groups", "0 must be at least 1"),
        msg,
    );
}

#[test]
fn groups_not_dividing_input_channels() {
    let c = base().params(base().params.groups(3)).weight([6, 1, 3, 3]);
    let msg = "groups: 3 must divide input channels (4)";
    assert_rejected_by(
        &c,
        &ALL,
        param("groups", "3 must divide input channels (4)"),
        msg,
    );
}

#[test]
fn groups_not_dividing_output_channels() {
    let c = base().weight([5, 2, 3, 3]);
    let msg = "groups: 2 must divide output channels (5, weight axis 0)";
    let rule = "2 must divide output channels (5, weight axis 0)";
    assert_rejected_by(&c, &ALL, param("groups", rule), msg);
}

#[test]
fn weight_axis_1_not_input_channels_per_group() {
    let c = base().weight([6, 4, 3, 3]);
    let msg = "weight has 4 input channels per group (axis 1); expected input channels(4) / groups(2) = 2";
    let err = shape(
        "weight",
        "input channels per group (axis 1)",
        "input channels(4) / groups(2) = 2",
        4,
    );
    assert_rejected_by(&c, &ALL, err, msg);
}

#[test]
fn offset_groups_not_dividing_input_channels() {
    let p = base().params.offset_groups(3);
    let msg = "offset_groups: 3 must divide input channels (4)";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        param("offset_groups", "3 must divide input channels (4)"),
        msg,
    );
}

#[test]
fn dilated_kernel_larger_than_padded_input_rows() {
    // span = 3 * (3 - 1) + 1 = 7 rows > 5 + 0 + 0.
    let c = base().params(base().params.dilation(3, 1));
    let rule = "the dilated kernel spans 7 rows (dilation 3 * (kernel 3 - 1) + 1) but the padded input has only 5 (5 + 0 + 0); output rows would be < 1";
    assert_rejected_by(
        &c,
        &ALL,
        param("padding", rule),
        &format!("padding: {rule}"),
    );
}

#[test]
fn kernel_larger_than_padded_input_columns() {
    // A 3 x 8 kernel on 5 columns padded 1 left, 1 right: 8 > 7. Asymmetric row padding is
    // irrelevant to the column rule.
    let padding = Padding {
        top: 2,
        bottom: 0,
        left: 1,
        right: 1,
    };
    let c = base()
        .weight([6, 2, 3, 8])
        .params(base().params.padding_sides(padding));
    let rule = "the dilated kernel spans 8 columns (dilation 1 * (kernel 8 - 1) + 1) but the padded input has only 7 (5 + 1 + 1); output columns would be < 1";
    assert_rejected_by(
        &c,
        &ALL,
        param("padding", rule),
        &format!("padding: {rule}"),
    );
}

/// The edge of the rule: a kernel exactly as large as the padded input gives one output.
#[test]
fn kernel_exactly_as_large_as_padded_input_is_valid() {
    let padding = Padding {
        top: 0,
        bottom: 2,
        left: 1,
        right: 0,
    };
    let mut c = base()
        .weight([6, 2, 7, 6])
        .params(base().params.padding_sides(padding));
    c.offset = Array4::zeros((1, 2 * 2 * 42, 1, 1));
    c.mask = Some(Array4::zeros((1, 2 * 42, 1, 1)));
    c.grad_out = Array4::zeros((1, 6, 1, 1));
    for (name, result) in run(&c) {
        let got = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = match name {
            "deform_conv2d" | "conv2d" => vec![1, 6, 1, 1],
            "grad_input" => vec![1, 4, 5, 5],
            "grad_offset" => vec![1, 168, 1, 1],
            "grad_mask" => vec![1, 84, 1, 1],
            _ => vec![6, 2, 7, 6],
        };
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn zero_kernel_extent() {
    let c = base().weight([6, 2, 0, 3]);
    let msg = "weight has 0 kernel rows (axis 2); expected at least 1";
    assert_rejected_by(
        &c,
        &ALL,
        shape("weight", "kernel rows (axis 2)", "at least 1", 0),
        msg,
    );
    let c = base().weight([6, 2, 3, 0]);
    let msg = "weight has 0 kernel columns (axis 3); expected at least 1";
    assert_rejected_by(
        &c,
        &ALL,
        shape("weight", "kernel columns (axis 3)", "at least 1", 0),
        msg,
    );
}

#[test]
fn zero_channels() {
    let c = base().input([1, 0, 5, 5]);
    let msg = "input has 0 channels; expected at least 1";
    assert_rejected_by(&c, &ALL, shape("input", "channels", "at least 1", 0), msg);
    let c = base().weight([0, 2, 3, 3]);
    let msg = "weight has 0 output channels (axis 0); expected at least 1";
    assert_rejected_by(
        &c,
        &ALL,
        shape("weight", "output channels (axis 0)", "at least 1", 0),
        msg,
    );
}

/// Zero rows or columns in the input: the kernel cannot fit (`H_out` would be < 1).
#[test]
fn zero_input_rows() {
    let c = base().input([1, 4, 0, 5]);
    let rule = "the dilated kernel spans 3 rows (dilation 1 * (kernel 3 - 1) + 1) but the padded input has only 0 (0 + 0 + 0); output rows would be < 1";
    assert_rejected_by(
        &c,
        &ALL,
        param("padding", rule),
        &format!("padding: {rule}"),
    );
}

#[test]
fn offset_wrong_batch() {
    let mut c = base();
    c.offset = Array4::zeros((2, 36, 3, 3));
    let msg = "offset has 2 images; expected input's batch size = 1";
    assert_rejected_by(
        &c,
        &DEFORM,
        shape("offset", "images", "input's batch size = 1", 2),
        msg,
    );
}

#[test]
fn offset_wrong_channels() {
    let mut c = base();
    c.offset = Array4::zeros((1, 18, 3, 3));
    let msg = "offset has 18 channels; expected 2 * offset_groups(2) * kh(3) * kw(3) = 36";
    let err = shape(
        "offset",
        "channels",
        "2 * offset_groups(2) * kh(3) * kw(3) = 36",
        18,
    );
    assert_rejected_by(&c, &DEFORM, err, msg);
}

#[test]
fn offset_wrong_rows_and_columns() {
    let mut c = base();
    c.offset = Array4::zeros((1, 36, 4, 3));
    let msg = "offset has 4 rows; expected output rows H_out = 3";
    assert_rejected_by(
        &c,
        &DEFORM,
        shape("offset", "rows", "output rows H_out = 3", 4),
        msg,
    );
    c.offset = Array4::zeros((1, 36, 3, 1));
    let msg = "offset has 1 columns; expected output columns W_out = 3";
    assert_rejected_by(
        &c,
        &DEFORM,
        shape("offset", "columns", "output columns W_out = 3", 1),
        msg,
    );
}

/// `grad_mask` takes no mask and `conv2d` none either: they accept the problem.
#[test]
fn mask_wrong_shape() {
    let with_mask = ["deform_conv2d", "grad_input", "grad_offset", "grad_weight"];
    let mut c = base();
    c.mask = Some(Array4::zeros((1, 36, 3, 3)));
    let msg = "mask has 36 channels; expected offset_groups(2) * kh(3) * kw(3) = 18";
    let err = shape(
        "mask",
        "channels",
        "offset_groups(2) * kh(3) * kw(3) = 18",
        36,
    );
    assert_rejected_by(&c, &with_mask, err, msg);
    c.mask = Some(Array4::zeros((3, 18, 3, 3)));
    let msg = "mask has 3 images; expected input's batch size = 1";
    assert_rejected_by(
        &c,
        &with_mask,
        shape("mask", "images", "input's batch size = 1", 3),
        msg,
    );
    c.mask = Some(Array4::zeros((1, 18, 2, 3)));
    let msg = "mask has 2 rows; expected output rows H_out = 3";
    assert_rejected_by(
        &c,
        &with_mask,
        shape("mask", "rows", "output rows H_out = 3", 2),
        msg,
    );
    c.mask = Some(Array4::zeros((1, 18, 3, 4)));
    let msg = "mask has 4 columns; expected output columns W_out = 3";
    assert_rejected_by(
        &c,
        &with_mask,
        shape("mask", "columns", "output columns W_out = 3", 4),
        msg,
    );
}

#[test]
fn bias_wrong_length() {
    let mut c = base();
    c.bias = Some(Array1::zeros(5));
    let msg = "bias has 5 elements; expected output channels (weight axis 0) = 6";
    let err = shape("bias", "elements", "output channels (weight axis 0) = 6", 5);
    assert_rejected_by(&c, &["deform_conv2d", "conv2d"], err, msg);
}

#[test]
fn grad_out_wrong_shape() {
    let grads = ["grad_input", "grad_offset", "grad_mask", "grad_weight"];
    let mut c = base();
    c.grad_out = Array4::zeros((2, 6, 3, 3));
    let msg = "grad_out has 2 images; expected input's batch size = 1";
    assert_rejected_by(
        &c,
        &grads,
        shape("grad_out", "images", "input's batch size = 1", 2),
        msg,
    );
    c.grad_out = Array4::zeros((1, 5, 3, 3));
    let msg = "grad_out has 5 channels; expected output channels (weight axis 0) = 6";
    let err = shape(
        "grad_out",
        "channels",
        "output channels (weight axis 0) = 6",
        5,
    );
    assert_rejected_by(&c, &grads, err, msg);
    c.grad_out = Array4::zeros((1, 6, 5, 3));
    let msg = "grad_out has 5 rows; expected output rows H_out = 3";
    assert_rejected_by(
        &c,
        &grads,
        shape("grad_out", "rows", "output rows H_out = 3", 5),
        msg,
    );
    c.grad_out = Array4::zeros((1, 6, 3, 2));
    let msg = "grad_out has 2 columns; expected output columns W_out = 3";
    assert_rejected_by(
        &c,
        &grads,
        shape("grad_out", "columns", "output columns W_out = 3", 2),
        msg,
    );
}

/// `grad_input` and `grad_weight` take a shape, not a tensor, so any size can be asked for.
#[test]
fn overflowing_shapes_are_too_large_not_a_panic() {
    let big = usize::MAX / 2;
    let c = base().params(ConvParams::default());
    let r = reference::grad_input(
        c.grad_out.view(),
        c.offset.view(),
        None,
        Array4::<f64>::zeros((6, 2, 3, 3)).view(),
        [big, 2, 3, 3],
        &c.params,
    );
    let what = format!("input of shape [{big}, 2, 3, 3] (8-byte elements)");
    assert_eq!(r.as_ref().unwrap_err(), &too_large(&what));
    assert_eq!(r.unwrap_err().to_string(), format!("too large: {what}"));

    let r = reference::grad_weight(
        c.grad_out.view(),
        c.input.view(),
        c.offset.view(),
        None,
        [usize::MAX / 4, 4, 3, 3],
        &c.params,
    );
    let what = format!(
        "weight of shape [{}, 4, 3, 3] (8-byte elements)",
        usize::MAX / 4
    );
    assert_eq!(r.unwrap_err(), too_large(&what));
}

/// Padding or dilation so large that the padded extent or the kernel span overflow.
#[test]
fn overflowing_padding_or_dilation_is_too_large() {
    let p = base().params.padding_sides(Padding {
        top: usize::MAX,
        bottom: 1,
        left: 0,
        right: 0,
    });
    let what = "padded input rows or dilated kernel extent";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        too_large(what),
        &format!("too large: {what}"),
    );
    let p = base().params.dilation(1, usize::MAX);
    let what = "padded input columns or dilated kernel extent";
    assert_rejected_by(
        &base().params(p),
        &ALL,
        too_large(what),
        &format!("too large: {what}"),
    );
}

/// Regression: with `N = 0` the element count is 0, but an array of shape
/// `[0, 1, 2^63 - 1, 2^63 - 1]` still cannot exist (`ndarray` panics building it). Such shapes
/// used to pass validation and panic inside `Array4::zeros`.
#[test]
fn empty_batch_with_unrepresentable_planes_is_too_large_not_a_panic() {
    let big = usize::MAX / 2;
    // grad_input of a huge (empty) input: a huge stride keeps the output 1 x 1.
    let w = Array4::<f64>::zeros((1, 1, 1, 1));
    let r = reference::grad_input(
        Array4::<f64>::zeros((0, 1, 1, 1)).view(),
        Array4::<f64>::zeros((0, 2, 1, 1)).view(),
        None,
        w.view(),
        [0, 1, big, big],
        &ConvParams::default().stride(big, big),
    );
    let what = format!("input of shape [0, 1, {big}, {big}] (8-byte elements)");
    assert_eq!(r.unwrap_err(), too_large(&what));

    // Every entry point, with a huge (empty) output from huge padding.
    let mut c = base().input([0, 1, 1, 1]).weight([1, 1, 1, 1]);
    c.params = ConvParams::default().padding(big, big);
    c.offset = Array4::zeros((0, 2, 1, 1));
    c.mask = None;
    c.bias = None;
    c.grad_out = Array4::zeros((0, 1, 1, 1));
    let m = usize::MAX;
    let what = format!("output of shape [0, 1, {m}, {m}] (8-byte elements)");
    assert_rejected_by(&c, &ALL, too_large(&what), &format!("too large: {what}"));
}

/// `N = 0` is valid: every function succeeds, per-image results are empty, and the weight and
/// bias gradients (sums over no images) are zero.
#[test]
fn empty_batch_is_valid_everywhere() {
    let mut c = base().input([0, 4, 5, 5]);
    c.offset = Array4::zeros((0, 36, 3, 3));
    c.mask = Some(Array4::zeros((0, 18, 3, 3)));
    c.grad_out = Array4::zeros((0, 6, 3, 3));
    for (name, result) in run(&c) {
        let got = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = match name {
            "deform_conv2d" | "conv2d" => vec![0, 6, 3, 3],
            "grad_input" => vec![0, 4, 5, 5],
            "grad_offset" => vec![0, 36, 3, 3],
            "grad_mask" => vec![0, 18, 3, 3],
            _ => vec![6, 2, 3, 3],
        };
        assert_eq!(got, want, "{name}");
    }
    let gw = reference::grad_weight(
        c.grad_out.view(),
        c.input.view(),
        c.offset.view(),
        None,
        c.weight_shape,
        &c.params,
    )
    .unwrap();
    assert!(gw.iter().all(|&v| v == 0.0), "grad_weight over no images");
    let gb = reference::grad_bias(c.grad_out.view()).unwrap();
    assert_eq!(gb, Array1::<f64>::zeros(6));
}
