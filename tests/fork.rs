//! A process that forks after computing: the child's first call must not hang on the parent's
//! threads (which `fork` does not copy) and must give the parent's bits. One test in its own
//! binary, so no other test thread is running when it forks.
#![cfg(unix)]

use deformconv::{deform_conv2d, deform_conv2d_backward, reference, ConvParams, Want};
use ndarray::Array4;

/// A small DCN v2 problem with fractional offsets, big enough to be split over threads.
fn problem() -> [Array4<f32>; 5] {
    let wave = |n: usize, scale: f32| (n as f32 * 0.618).sin() * scale;
    let input = Array4::from_shape_fn((2, 8, 20, 20), |(n, c, y, x)| {
        wave(n * 7 + c * 5 + y * 20 + x, 1.0)
    });
    let offset = Array4::from_shape_fn((2, 18, 20, 20), |(n, c, y, x)| {
        wave(n + c * 3 + y * 11 + x * 13, 2.5)
    });
    let mask = Array4::from_shape_fn((2, 9, 20, 20), |(n, c, y, x)| {
        wave(n + c + y * 3 + x, 1.0).abs()
    });
    let weight = Array4::from_shape_fn((16, 8, 3, 3), |(o, c, i, j)| {
        wave(o * 9 + c * 3 + i * 5 + j, 0.2)
    });
    let grad_out = Array4::from_shape_fn((2, 16, 20, 20), |(n, o, y, x)| {
        wave(n + o * 2 + y + x * 3, 1.0)
    });
    [input, offset, mask, weight, grad_out]
}

/// Forward output, input gradient and reference output, as one vector of bits.
fn compute() -> Vec<u64> {
    let [input, offset, mask, weight, grad_out] = problem();
    let p = ConvParams::default().padding(1, 1);
    let out = deform_conv2d(
        input.view(),
        offset.view(),
        Some(mask.view()),
        weight.view(),
        None,
        &p,
    )
    .unwrap();
    let grads = deform_conv2d_backward(
        grad_out.view(),
        input.view(),
        offset.view(),
        Some(mask.view()),
        weight.view(),
        &p,
        Want::ALL,
    )
    .unwrap();
    let exact = reference::deform_conv2d(
        input.view(),
        offset.view(),
        Some(mask.view()),
        weight.view(),
        None,
        &p,
    )
    .unwrap();
    let (gi, go) = (grads.input.unwrap(), grads.offset.unwrap());
    let f32s = out.iter().chain(gi.iter()).chain(go.iter());
    f32s.map(|v| u64::from(v.to_bits()))
        .chain(exact.iter().map(|v| v.to_bits()))
        .collect()
}

#[test]
fn a_forked_child_computes_the_parents_bits() {
    let parent = compute();
    // SAFETY: this binary runs this one test, so the only other threads are the crate's pool
    // workers, which hold no lock the child needs (the pool is rebuilt, not used, there). The
    // child only computes, compares and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: `alarm` and `_exit` are async-signal-safe; the alarm kills a hung child.
        unsafe { libc::alarm(60) };
        let code = match std::panic::catch_unwind(compute) {
            Ok(child) if child == parent => 0,
            Ok(_) => 1,
            Err(_) => 2,
        };
        // SAFETY: ends the child without running the test harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above; `status` is a valid out-pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        !libc::WIFSIGNALED(status),
        "the child was killed by signal {} (60 s alarm: it hung)",
        libc::WTERMSIG(status)
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's results differ from the parent's (1) or it panicked (2)"
    );
    // And the parent still computes the same bits after the fork.
    assert_eq!(compute(), parent);
}
