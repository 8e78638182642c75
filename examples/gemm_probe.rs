//! GEMM throughput of the backward's matrix shapes (single thread), for development.
use std::time::Instant;

fn main() {
    // (name, m, k, n, transposed-B?)
    let shapes = [
        ("W2 gcol t196", 1152, 512, 196, false),
        ("W2 gcol t392", 1152, 512, 392, false),
        ("W2 wgt t196", 512, 196, 1152, true),
        ("W2 wgt t392", 512, 392, 1152, true),
        ("W4 gcol t256", 2304, 256, 256, false),
        ("W4 gcol t512", 2304, 256, 512, false),
        ("W4 wgt t256", 256, 256, 2304, true),
        ("W4 wgt t512", 256, 512, 2304, true),
        ("W4 wgt t1024", 256, 1024, 2304, true),
    ];
    for (name, m, k, n, bt) in shapes {
        let a = vec![0.5f32; m * k];
        let b = vec![0.25f32; k * n];
        let mut c = vec![0.0f32; m * n];
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            // A: for gcol it is weightᵀ (rsa 1, csa m-ish); emulate with column-major A.
            let (rsa, csa) = if bt { (k as isize, 1) } else { (1, m as isize) };
            let (rsb, csb) = if bt { (1, k as isize) } else { (n as isize, 1) };
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    rsa,
                    csa,
                    b.as_ptr(),
                    rsb,
                    csb,
                    if bt { 1.0 } else { 0.0 },
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name}: {:.1} GFLOP/s",
            2.0 * (m * k * n) as f64 / best / 1e9
        );
    }
}
