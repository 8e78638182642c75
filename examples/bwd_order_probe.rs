//! Does a forward before each backward change the backward's time? (development probe)
#[path = "../benches/workloads/mod.rs"]
mod workloads;
use deformconv::{deform_conv2d_backward_into, deform_conv2d_into, GradsMut};
use ndarray::{Array1, Array4};
use std::time::Instant;
fn main() {
    let name = std::env::args().nth(1).unwrap_or("W2".into());
    let wl = *workloads::WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .unwrap();
    let g = wl.geometry();
    let ops = wl.operands();
    let p = wl.params();
    let go = Array4::from_elem(g.out_shape(), 0.1f32);
    let mut out = Array4::<f32>::zeros(g.out_shape());
    let (mut gi, mut gof, mut gm, mut gw, mut gb) = (
        Array4::<f32>::zeros(g.input_shape()),
        Array4::<f32>::zeros(g.offset_shape()),
        Array4::<f32>::zeros(g.mask_shape()),
        Array4::<f32>::zeros(g.weight_shape()),
        Array1::<f32>::zeros(g.c_out),
    );
    for with_fwd in [false, true, false, true] {
        let mut t_b = vec![];
        for _ in 0..30 {
            if with_fwd {
                deform_conv2d_into(
                    ops.input.view(),
                    ops.offset.view(),
                    ops.mask.as_ref().map(|m| m.view()),
                    ops.weight.view(),
                    ops.bias.as_ref().map(|b| b.view()),
                    &p,
                    out.view_mut(),
                )
                .unwrap();
            }
            let t = Instant::now();
            deform_conv2d_backward_into(
                go.view(),
                ops.input.view(),
                ops.offset.view(),
                ops.mask.as_ref().map(|m| m.view()),
                ops.weight.view(),
                &p,
                GradsMut {
                    input: Some(gi.view_mut()),
                    offset: Some(gof.view_mut()),
                    mask: wl.mask.then(|| gm.view_mut()),
                    weight: Some(gw.view_mut()),
                    bias: wl.bias.then(|| gb.view_mut()),
                },
            )
            .unwrap();
            t_b.push(t.elapsed().as_secs_f64() * 1e3);
        }
        t_b.sort_by(f64::total_cmp);
        println!(
            "{name} with_fwd={with_fwd}: backward median {:.2} ms min {:.2}",
            t_b[15], t_b[0]
        );
    }
}
