//! Every torchvision float64 golden case in `tests/data/golden/` against the reference oracle.

mod support;

use deformconv::reference;
use support::{assert_rel_close, golden_cases};

const TOL: f64 = 1e-10;

#[test]
fn reference_matches_every_golden_case() {
    let cases = golden_cases();
    assert!(
        cases.len() >= 50,
        "expected the full golden set, found {}",
        cases.len()
    );
    for case in &cases {
        let name = case.name.as_str();
        let p = &case.params;
        let input = case.get4("input");
        let offset = case.get4("offset");
        let mask = case.opt4("mask");
        let weight = case.get4("weight");
        let grad_out = case.get4("grad_out");
        assert_eq!(mask.is_some(), case.has_mask, "{name}: has_mask");
        let bias = case
            .arrays
            .get("bias")
            .map(|b| b.view().into_dimensionality::<ndarray::Ix1>().unwrap());
        assert_eq!(bias.is_some(), case.has_bias, "{name}: has_bias");

        let out = reference::deform_conv2d(input, offset, mask, weight, bias, p).unwrap();
        assert_rel_close(name, "out", &out.view(), &case.get4("out"), TOL);

        let shape = [
            input.shape()[0],
            input.shape()[1],
            input.shape()[2],
            input.shape()[3],
        ];
        let gi = reference::grad_input(grad_out, offset, mask, weight, shape, p).unwrap();
        assert_rel_close(
            name,
            "grad_input",
            &gi.view(),
            &case.get4("grad_input"),
            TOL,
        );

        let go = reference::grad_offset(grad_out, input, offset, mask, weight, p).unwrap();
        assert_rel_close(
            name,
            "grad_offset",
            &go.view(),
            &case.get4("grad_offset"),
            TOL,
        );

        if let Some(want) = case.opt4("grad_mask") {
            let gm = reference::grad_mask(grad_out, input, offset, weight, p).unwrap();
            assert_rel_close(name, "grad_mask", &gm.view(), &want, TOL);
        }

        let ws = [
            weight.shape()[0],
            weight.shape()[1],
            weight.shape()[2],
            weight.shape()[3],
        ];
        let gw = reference::grad_weight(grad_out, input, offset, mask, ws, p).unwrap();
        assert_rel_close(
            name,
            "grad_weight",
            &gw.view(),
            &case.get4("grad_weight"),
            TOL,
        );

        if let Some(want) = case.arrays.get("grad_bias") {
            let gb = reference::grad_bias(grad_out).unwrap();
            let want = want.view().into_dimensionality::<ndarray::Ix1>().unwrap();
            assert_rel_close(name, "grad_bias", &gb.view(), &want, TOL);
        }
    }
}
