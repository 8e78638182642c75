//! The fast backward against the reference oracle and the golden cases.

mod common;

use common::{assert_rel_close, golden_cases};
use deformconv::{reference, Want};
use ndarray::{Array4, Ix1};

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

#[test]
fn every_golden_case_through_the_fast_path_in_f64() {
    let cases = golden_cases();
    assert!(cases.len() >= 50);
    for case in &cases {
        let name = case.name.as_str();
        let p = &case.params;
        let input = case.get4("input");
        let offset = case.get4("offset");
        let mask = case.opt4("mask");
        let weight = case.get4("weight");
        let grad_out = case.get4("grad_out");
        let tol = 1e-10;
        let all =
            deformconv::deform_conv2d_backward(grad_out, input, offset, mask, weight, p, Want::ALL)
                .unwrap();
        let gi = all.input.unwrap();
        assert_rel_close(
            name,
            "grad_input",
            &gi.view(),
            &case.get4("grad_input"),
            tol,
        );
        let go = all.offset.unwrap();
        assert_rel_close(
            name,
            "grad_offset",
            &go.view(),
            &case.get4("grad_offset"),
            tol,
        );
        if let Some(want) = case.opt4("grad_mask") {
            assert_rel_close(name, "grad_mask", &all.mask.unwrap().view(), &want, tol);
        }
        let gw = all.weight.unwrap();
        assert_rel_close(
            name,
            "grad_weight",
            &gw.view(),
            &case.get4("grad_weight"),
            tol,
        );
        if let Some(want) = case.arrays.get("grad_bias") {
            let want = want.view().into_dimensionality::<Ix1>().unwrap();
            assert_rel_close(name, "grad_bias", &all.bias.unwrap().view(), &want, tol);
        }
        // The separate functions give the same bits.
        let sep_i = deformconv::deform_conv2d_grad_input(
            grad_out,
            offset,
            mask,
            weight,
            shape4(input.shape()),
            p,
        )
        .unwrap();
        assert_eq!(sep_i, gi, "{name}: grad_input separate");
        let sep_w = deformconv::deform_conv2d_grad_weight(
            grad_out,
            input,
            offset,
            mask,
            shape4(weight.shape()),
            p,
        )
        .unwrap();
        assert_eq!(sep_w, gw, "{name}: grad_weight separate");
        let _: Array4<f64> = sep_w;
        let _ = reference::grad_bias(grad_out).unwrap();
    }
}
