//! The GEMM on every backend and both element types, bit for bit against its documented chain.

use super::kernel::{Operand, Out, Product};
use super::*;
use crate::kernels::backend::{Portable, Scalar, Strided};

/// Whether `mul_add` rounds once on this backend (found by a case where it matters:
/// `(1 + e)(1 - e) - 1` is `-e²` fused and `0` otherwise).
fn fused<T: Float, B: Backend>(be: B) -> bool {
    let e = T::from_f64(T::EPSILON * 2.0);
    let x = T::V::<B>::splat(be, T::ONE + e);
    let y = T::V::<B>::splat(be, T::ONE - e);
    let mut out = vec![T::ZERO; <T::V<B> as Lanes<T, B>>::N];
    x.mul_add(y, T::V::<B>::splat(be, -T::ONE)).store(&mut out);
    out[0] != T::ZERO
}

/// `c[o, q] = start[o, q]`, then `c = step(a[o, r], b[r, q], c)` for r in order.
fn chain<T: Float>(
    a: &[T],
    b: &[T],
    start: &[T],
    (rows, depth, len): (usize, usize, usize),
    step: impl Fn(T, T, T) -> T,
) -> Vec<T> {
    let mut c = start.to_vec();
    for o in 0..rows {
        for q in 0..len {
            for r in 0..depth {
                c[o * len + q] = step(a[o * depth + r], b[r * len + q], c[o * len + q]);
            }
        }
    }
    c
}

fn values<T: Float>(n: usize, seed: usize) -> Vec<T> {
    (0..n)
        .map(|i| T::from_f64(((i * seed) % 97) as f64 / 7.0 - 6.5))
        .collect()
}

/// `(rows, depth, len)`: one and several register blocks and depth blocks, ragged edges,
/// depth 0, and operands over one chunk (`CHUNK_BYTES`) in a full depth block on every
/// backend: 300 rows of `A` (128 to 256 rows a chunk) and 300 columns of `B` (120 to 256).
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (300, 300, 300),
    (8, 256, 48),
    (13, 300, 50),
    (3, 517, 17),
    (9, 2, 97),
    (16, 0, 5),
    (7, 33, 16),
];

/// A product's operands: `A`, `B`, a bias and what `C` holds before.
struct Operands<T> {
    a: Vec<T>,
    b: Vec<T>,
    bias: Vec<T>,
    before: Vec<T>,
}

impl<T: Float> Operands<T> {
    fn new(rows: usize, depth: usize, len: usize) -> Self {
        Operands {
            a: values(rows * depth, 37),
            b: values(depth * len, 53),
            bias: values(rows, 11),
            before: values(rows * len, 29),
        }
    }
}

/// Every combination of init, operand form (plain, transposed, packed) and ragged shape.
fn equals_chain<T: Float, B: Backend>(be: B, fma: fn(T, T, T) -> T) {
    let (mr, _) = block_shape::<T, B>();
    let step = |x: T, y: T, c: T| {
        if fused::<T, B>(be) {
            fma(x, y, c)
        } else {
            x * y + c
        }
    };
    for &(rows, depth, len) in SHAPES {
        let Operands { a, b, bias, before } = Operands::new(rows, depth, len);
        // bt[q * depth + r] = b[r * len + q]: B given transposed (rs = 1, cs = depth).
        let mut bt = vec![T::ZERO; depth * len];
        for r in 0..depth {
            for q in 0..len {
                bt[q * depth + r] = b[r * len + q];
            }
        }
        let mut packed = PackedA::empty_for(mr);
        packed.repack(&a, rows, depth, depth, 1);
        let plain = MatB {
            data: &b,
            rs: len,
            cs: 1,
        };
        let turned = MatB {
            data: &bt,
            rs: 1,
            cs: depth,
        };
        for (name, init, start) in [
            (
                "bias",
                Init::Bias(&bias[..]),
                (0..rows * len).map(|i| bias[i / len.max(1)]).collect(),
            ),
            ("zero", Init::Zero, vec![T::ZERO; rows * len]),
            ("accumulate", Init::Accumulate, before.clone()),
        ] {
            let want = chain(&a, &b, &start, (rows, depth, len), step);
            let pb = PackedB::pack_panels(be, plain, depth, len);
            for form in ["plain", "transposed", "packed"] {
                let mut c = match init {
                    Init::Accumulate => before.clone(),
                    _ => vec![T::from_f64(f64::NAN); rows * len],
                };
                let mut bp = Vec::new();
                let out = Out {
                    c: c.as_mut_ptr(),
                    ldc: len,
                    len,
                    init,
                };
                let b = match form {
                    "plain" => Operand::Unpacked(plain, &mut bp),
                    "transposed" => Operand::Unpacked(turned, &mut bp),
                    _ => Operand::Packed(&pb),
                };
                be.vectorize(Product { a: &packed, b, out });
                for (i, (x, y)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        x.to_f64().to_bits() == y.to_f64().to_bits(),
                        "{} {rows}x{depth}x{len} {name} {form} [{i}]: {x} != {y}",
                        T::NAME
                    );
                }
            }
        }
    }
}

macro_rules! per_backend {
    ($($name:ident: $make:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test]
            fn f32_equals_its_chain() {
                if let Some(be) = $make {
                    equals_chain::<f32, _>(be, f32::mul_add)
                }
            }
            #[test]
            fn f64_equals_its_chain() {
                if let Some(be) = $make {
                    equals_chain::<f64, _>(be, f64::mul_add)
                }
            }
        }
    )*};
}

per_backend! {
    scalar: Some(Scalar::new());
    portable: Some(Portable::new());
}
#[cfg(target_arch = "x86_64")]
per_backend! {
    avx2: crate::kernels::backend::tests::token(crate::kernels::backend::Avx2::new(), crate::kernels::backend::Isa::Avx2);
    avx512: crate::kernels::backend::tests::token(crate::kernels::backend::Avx512::new(), crate::kernels::backend::Isa::Avx512);
}

/// The engine the process runs (ours or matrixmultiply, as the backend chooses; CI runs this
/// under every `DEFORMCONV_ISA` cap), through the public entry points, against the product in
/// `f64` within `depth` roundings of the absolute sum.
fn process_engine_is_close<T: Float>() {
    for &(rows, depth, len) in SHAPES {
        let Operands { a, b, bias, before } = Operands::new(rows, depth, len);
        let packed = PackedA::pack(&a, rows, depth);
        let plain = MatB {
            data: &b,
            rs: len,
            cs: 1,
        };
        let pb = PackedB::pack(plain, depth, len);
        for init in [Init::Bias(&bias[..]), Init::Zero, Init::Accumulate] {
            for packed_b in [false, true] {
                let mut c = match init {
                    Init::Accumulate => before.clone(),
                    _ => vec![T::from_f64(f64::NAN); rows * len],
                };
                let mut bp = Vec::new();
                // SAFETY: c is rows x len, b depth x len.
                unsafe {
                    if packed_b {
                        multiply_packed(&packed, &pb, init, c.as_mut_ptr(), len)
                    } else {
                        multiply(&packed, plain, len, init, c.as_mut_ptr(), len, &mut bp)
                    }
                };
                for o in 0..rows {
                    for q in 0..len {
                        let start = match init {
                            Init::Bias(bias) => bias[o].to_f64(),
                            Init::Zero => 0.0,
                            Init::Accumulate => before[o * len + q].to_f64(),
                        };
                        let terms =
                            (0..depth).map(|r| a[o * depth + r].to_f64() * b[r * len + q].to_f64());
                        let exact = start + terms.clone().sum::<f64>();
                        let scale = start.abs() + terms.map(f64::abs).sum::<f64>();
                        let err = (c[o * len + q].to_f64() - exact).abs();
                        assert!(
                            err <= (depth + 1) as f64 * T::EPSILON * scale,
                            "{} {rows}x{depth}x{len} packed B {packed_b} ({o}, {q}): {} vs {exact}",
                            T::NAME,
                            c[o * len + q]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn process_engine_is_close_f32() {
    process_engine_is_close::<f32>();
}

#[test]
fn process_engine_is_close_f64() {
    process_engine_is_close::<f64>();
}

/// `PackedA` holds `panel[r * MR + i] = a[p * MR + i, r]` (zero past the last row) whether
/// `a` is read row-major or as a transposed view, for every panel height the backends use.
#[test]
fn packing_a_follows_its_layout_in_both_read_orders() {
    for mr in [1, 4, 6, 8, 14] {
        for (rows, depth) in [(1, 1), (5, 3), (8, 17), (19, 6), (33, 40)] {
            let a: Vec<f32> = (0..rows * depth).map(|i| i as f32 + 1.0).collect();
            // The transpose of `a`, so that the transposed view reads `a` again.
            let at: Vec<f32> = (0..rows * depth)
                .map(|j| a[(j % rows) * depth + j / rows])
                .collect();
            for (src, rs, cs) in [(&a, depth, 1), (&at, 1, rows)] {
                let mut packed = PackedA::empty_for(mr);
                packed.repack(src, rows, depth, rs, cs);
                assert_eq!(packed.data.len(), rows.div_ceil(mr) * mr * depth);
                for (j, &v) in packed.data.iter().enumerate() {
                    let (p, r, i) = (j / (mr * depth), j % (mr * depth) / mr, j % mr);
                    let o = p * mr + i;
                    let want = if o < rows { a[o * depth + r] } else { 0.0 };
                    assert_eq!(v, want, "mr {mr}, {rows}x{depth}, rs {rs}: element {j}");
                }
            }
        }
    }
}

/// Development timing (not a check): the W4 backward's products (channel-major, 512-pixel
/// tiles) on the process's engine and by one matrixmultiply call, one thread, min of 5:
/// `DEFORMCONV_ISA=avx2 cargo test --release --lib gemm_shapes_timing -- --ignored --nocapture`.
/// Build with `MMTEST_FEATURE=avx2,fma` to time matrixmultiply's AVX2 kernel (it picks
/// AVX-512 by itself on an AVX-512 machine).
#[test]
#[ignore]
fn gemm_shapes_timing() {
    fn time<T: Float>() {
        let best = |mut f: Box<dyn FnMut() + '_>| {
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        // (name, rows, depth, len, B transposed)
        for (name, rows, depth, len, bt) in [
            ("column gradient Wt.gt", 2304, 256, 512, false),
            ("weight gradient gt.colsT", 256, 512, 2304, true),
            ("forward W.cols", 256, 2304, 512, false),
            // W2's forward tile: the whole 9.4 MB weight streams past 48 columns. Zen 4, AVX2:
            // f32 85-98 GFLOP/s against 102-110 under AVX-512; running the A micro-panels in
            // the outer loop (B's 3 panels reused from cache) gave 79-83 (f64: 32-35 -> 37-38).
            ("W2 forward W.cols", 512, 4608, 48, false),
        ] {
            let a: Vec<T> = values(rows * depth, 37);
            let b: Vec<T> = values(depth * len, 53);
            let mut c = vec![T::ZERO; rows * len];
            let (rs, cs) = if bt { (1, depth) } else { (len, 1) };
            let mb = MatB { data: &b, rs, cs };
            let mut packed = PackedA::pack(&a, rows, depth);
            let mut bp = Vec::new();
            let gflop = 2.0 * (rows * depth * len) as f64 / 1e9;
            let ours = best(Box::new(|| {
                // The weight gradient packs its `A` (the tile's grad_out) per tile.
                if bt {
                    packed.repack(&a, rows, depth, depth, 1);
                }
                // SAFETY: c is rows x len, b depth x len through its strides.
                unsafe { multiply(&packed, mb, len, Init::Zero, c.as_mut_ptr(), len, &mut bp) };
            }));
            let mm = best(Box::new(|| {
                // SAFETY: a rows x depth, b depth x len (strides rs, cs), c rows x len.
                unsafe {
                    T::gemm(
                        [rows, depth, len],
                        T::ONE,
                        Strided {
                            ptr: a.as_ptr(),
                            rows: depth as isize,
                            cols: 1,
                        },
                        Strided {
                            ptr: b.as_ptr(),
                            rows: rs as isize,
                            cols: cs as isize,
                        },
                        T::ZERO,
                        Strided {
                            ptr: c.as_mut_ptr(),
                            rows: len as isize,
                            cols: 1,
                        },
                    )
                }
            }));
            println!(
                "{} {name} {rows}x{depth}x{len}: engine {:.2} ms ({:.1} GFLOP/s), matrixmultiply {:.2} ms ({:.1})",
                T::NAME,
                ours * 1e3,
                gflop / ours,
                mm * 1e3,
                gflop / mm
            );
        }
    }
    time::<f32>();
    time::<f64>();
}

/// Development timing (not a check): the register kernel on operands already packed and in
/// cache (L1 for the first shapes, L2 and beyond for the last), one thread, best of 5:
/// `cargo test --release --lib gemm_kernel_probe -- --ignored --nocapture`. Compare with
/// `deformconv bench --peak` on one thread.
#[test]
#[ignore]
fn gemm_kernel_probe() {
    for (rows, depth, len) in [
        (8, 256, 48),
        (64, 256, 192),
        (256, 256, 48),
        (128, 1152, 96),
        (256, 2304, 48),
    ] {
        let a: Vec<f32> = values(rows * depth, 37);
        let b: Vec<f32> = values(depth * len, 53);
        let mut c = vec![0f32; rows * len];
        let packed = PackedA::pack(&a, rows, depth);
        let mb = MatB {
            data: &b,
            rs: len,
            cs: 1,
        };
        let pb = PackedB::pack(mb, depth, len);
        let reps = (2_000_000_000 / (2 * rows * depth * len)).max(1);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: c is rows x len; pb has a's depth.
                unsafe { multiply_packed(&packed, &pb, Init::Zero, c.as_mut_ptr(), len) };
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flop = 2.0 * (rows * depth * len * reps) as f64;
        println!("f32 {rows}x{depth}x{len}: {:.1} GFLOP/s", flop / best / 1e9);
    }
}
