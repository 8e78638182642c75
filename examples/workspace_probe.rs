//! Measures the peak extra heap (workspace) of the forward and the full backward: a counting
//! global allocator records the high-water mark of live bytes during one call, above what was
//! live before it (operands and preallocated outputs are not counted). Run for several batch
//! sizes to see that the workspace does not grow with the batch:
//!
//! `cargo run --release --example workspace_probe [W4] [batches...]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use deformconv::{deform_conv2d_backward_into, deform_conv2d_into, GradsMut};
use ndarray::{Array1, Array4};

/// The system allocator, counting live bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live bytes during `f` above the bytes live when it starts.
fn peak_during(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args
        .iter()
        .find(|a| a.starts_with('W'))
        .map_or("W4", |s| s.as_str());
    let batches: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let base = *deformconv::workloads::WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .expect("workload");
    let batches = if batches.is_empty() {
        vec![base.n, 2 * base.n, 4 * base.n]
    } else {
        batches
    };
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "{name}, f32, {} threads: peak extra heap per call",
        rayon::current_num_threads()
    );
    for n in batches {
        let wl = deformconv::workloads::Workload { n, ..base };
        let g = wl.geometry();
        let ops = wl.operands();
        let params = wl.params();
        let mask = ops.mask.as_ref().map(|m| m.view());
        let grad_out = Array4::from_elem(g.out_shape(), 0.25f32);
        let mut out = Array4::<f32>::zeros(g.out_shape());
        let mut gi = Array4::<f32>::zeros(g.input_shape());
        let mut go = Array4::<f32>::zeros(g.offset_shape());
        let mut gm = Array4::<f32>::zeros(g.mask_shape());
        let mut gw = Array4::<f32>::zeros(g.weight_shape());
        let mut gb = Array1::<f32>::zeros(g.c_out);
        let mut forward = || {
            deform_conv2d_into(
                ops.input.view(),
                ops.offset.view(),
                mask,
                ops.weight.view(),
                ops.bias.as_ref().map(|b| b.view()),
                &params,
                out.view_mut(),
            )
            .unwrap()
        };
        let mut backward = || {
            let grads = GradsMut {
                input: Some(gi.view_mut()),
                offset: Some(go.view_mut()),
                mask: wl.mask.then(|| gm.view_mut()),
                weight: Some(gw.view_mut()),
                bias: wl.bias.then(|| gb.view_mut()),
            };
            deform_conv2d_backward_into(
                grad_out.view(),
                ops.input.view(),
                ops.offset.view(),
                mask,
                ops.weight.view(),
                &params,
                grads,
            )
            .unwrap()
        };
        // A first call of each, so that caches kept between calls count as live afterwards.
        let first_fwd = peak_during(&mut forward);
        let first_bwd = peak_during(&mut backward);
        let fwd = peak_during(&mut forward);
        let bwd = peak_during(&mut backward);
        let operands = (ops.input.len()
            + ops.offset.len()
            + ops.mask.as_ref().map_or(0, |m| m.len())
            + ops.weight.len()
            + ops.bias.as_ref().map_or(0, |b| b.len())
            + grad_out.len()
            + out.len()
            + gi.len()
            + go.len()
            + gm.len()
            + gw.len()
            + gb.len())
            * 4;
        let held = LIVE.load(Ordering::Relaxed) - operands;
        deformconv::release_cached_scratch();
        let after = LIVE.load(Ordering::Relaxed) - operands;
        println!(
            "N = {n:3}: forward {:6.1} MiB (first call {:6.1}), full backward {:6.1} MiB (first call {:6.1}); held between calls {:6.1} MiB, {:6.1} MiB after release_cached_scratch",
            mib(fwd),
            mib(first_fwd),
            mib(bwd),
            mib(first_bwd),
            mib(held),
            mib(after),
        );
    }
}
