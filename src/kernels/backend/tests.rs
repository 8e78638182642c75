//! The kernel suite, instantiated once per backend (`backend::tests::<backend>::<test>`).
//!
//! A backend this CPU lacks is skipped with a note, unless the environment variable
//! `DEFORMCONV_EXPECT_ISA` (a comma-separated list of `avx512`, `avx2`, `portable`, `scalar`)
//! names it: then its tests fail, so CI cannot pass without running what it expects.

use super::*;
use crate::kernels::test_stream;
use crate::Float;

/// The backends `DEFORMCONV_EXPECT_ISA` names (an unknown name fails).
fn expected() -> Vec<Isa> {
    std::env::var("DEFORMCONV_EXPECT_ISA")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Isa::from_name(s).unwrap_or_else(|| panic!("DEFORMCONV_EXPECT_ISA: unknown {s:?}"))
        })
        .collect()
}

/// `made`, or a failure if the CPU lacks the backend and CI expects it, or `None` (skip).
pub(crate) fn token<B: Backend>(made: Option<B>, isa: Isa) -> Option<B> {
    if made.is_none() {
        assert!(
            !expected().contains(&isa),
            "DEFORMCONV_EXPECT_ISA names {} but this CPU does not have it",
            isa.name()
        );
        eprintln!("skipped: this CPU has no {}", isa.name());
    }
    made
}

/// Instantiates each generic test `fn name<B: Backend>(b: B)` once per backend.
macro_rules! per_backend {
    ($($test:ident),* $(,)?) => {
        mod scalar {
            $(#[test] fn $test() { super::$test(super::Scalar::new()) })*
        }
        mod portable {
            $(#[test] fn $test() { super::$test(super::Portable::new()) })*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            $(#[test] fn $test() {
                if let Some(b) = super::token(super::Avx2::new(), super::Isa::Avx2) {
                    super::$test(b)
                }
            })*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx512 {
            $(#[test] fn $test() {
                if let Some(b) = super::token(super::Avx512::new(), super::Isa::Avx512) {
                    super::$test(b)
                }
            })*
        }
    };
}

per_backend!(
    lanes_f32,
    lanes_f64,
    rounding_f32,
    rounding_f64,
    transpose_f32,
    transpose_f64,
    transpose_block_f32,
    transpose_block_f64,
    dispatch_reaches_backend
);

/// Every backend named in `DEFORMCONV_EXPECT_ISA` exists on this CPU (also off x86_64, where
/// the per-backend modules of the x86 backends are not compiled).
#[test]
fn expected_backends_exist() {
    for isa in expected() {
        let exists = match isa {
            Isa::Scalar | Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        };
        assert!(
            exists,
            "DEFORMCONV_EXPECT_ISA names {}, which this CPU lacks",
            isa.name()
        );
    }
}

/// The cap names parse, and the cap lowers but never raises.
#[test]
fn caps() {
    for isa in [Isa::Scalar, Isa::Portable, Isa::Avx2, Isa::Avx512] {
        assert_eq!(Isa::from_name(isa.name()), Some(isa));
    }
    assert_eq!(Isa::from_name("sse"), None);
    assert!(isa() <= detected());
}

/// The same bits, any NaN counting as any other.
fn same<T: Float>(a: T, b: T) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_f64().to_bits() == b.to_f64().to_bits()
}

/// Each primitive against its definition, for every partial length.
fn check_lanes<B: Backend, T: Float>(b: B) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let name = B::ISA.name();
    let mut next = test_stream(17);
    let x: Vec<T> = (0..n)
        .map(|_| T::from_f64(f64::from(next()) - 0.5))
        .collect();
    let y: Vec<T> = (0..n)
        .map(|_| T::from_f64(f64::from(next()) * 3.0))
        .collect();
    let (vx, vy) = (T::V::<B>::load(b, &x), T::V::<B>::load(b, &y));
    let mut out = vec![T::ZERO; n];
    for (op, f) in [
        (
            T::V::<B>::add as fn(_, _) -> _,
            (|a, b| a + b) as fn(T, T) -> T,
        ),
        (T::V::<B>::sub, |a, b| a - b),
        (T::V::<B>::mul, |a, b| a * b),
    ] {
        op(vx, vy).store(&mut out);
        for i in 0..n {
            assert!(same(out[i], f(x[i], y[i])), "{name} arithmetic lane {i}");
        }
    }
    T::V::<B>::splat(b, x[0]).store(&mut out);
    assert!(out.iter().all(|&v| same(v, x[0])), "{name} splat");
    for k in 0..n {
        let sentinel = T::from_f64(99.0);
        let mut part = vec![sentinel; n + 1];
        T::V::<B>::load_partial(b, &x[..k]).store(&mut out);
        for i in 0..n {
            assert!(
                same(out[i], if i < k { x[i] } else { T::ZERO }),
                "{name} load_partial {k}"
            );
        }
        vx.store_partial(&mut part[..k]);
        for (i, &v) in part.iter().enumerate() {
            assert!(
                same(v, if i < k { x[i] } else { sentinel }),
                "{name} store_partial {k}"
            );
        }
    }
}

/// `floor`, `abs`, `lt_select` and `store_i32` against the scalar operations, on negative and
/// positive fractions, integers, signed zeros, infinities and NaN (every value in every lane).
fn check_rounding<B: Backend, T: Float>(b: B) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let name = B::ISA.name();
    let values = [
        -2.5,
        -1.0,
        -0.75,
        -1e-30,
        -0.0,
        0.0,
        1e-30,
        0.5,
        1.0,
        3.999,
        4_194_303.5,
        -7.0,
        // Ties and the edges of the portable floor's rounding trick (2^23 for f32, 2^52 f64).
        2.5,
        -0.5,
        8_388_607.5,
        -8_388_607.5,
        8_388_609.0,
        4_503_599_627_370_495.5,
        -4_503_599_627_370_495.5,
        1e20,
        -1e20,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ]
    .map(T::from_f64);
    let mut out = vec![T::ZERO; n];
    for shift in 0..values.len() {
        let x: Vec<T> = (0..n).map(|i| values[(i + shift) % values.len()]).collect();
        let y: Vec<T> = (0..n)
            .map(|i| values[(i * 7 + shift) % values.len()])
            .collect();
        let (vx, vy) = (T::V::<B>::load(b, &x), T::V::<B>::load(b, &y));
        vx.floor().store(&mut out);
        for i in 0..n {
            let f = T::from_f64(x[i].to_f64().floor());
            assert!(same(out[i], f), "{name} floor {:?}", x[i]);
        }
        vx.abs().store(&mut out);
        for i in 0..n {
            assert!(same(out[i], T::from_f64(x[i].to_f64().abs())), "{name} abs");
        }
        let (one, two) = (T::V::<B>::splat(b, T::ONE), T::V::<B>::splat(b, -T::ONE));
        vx.lt_select(vy, one, two).store(&mut out);
        for i in 0..n {
            let want = if x[i] < y[i] { T::ONE } else { -T::ONE };
            assert!(same(out[i], want), "{name} lt_select {:?} {:?}", x[i], y[i]);
        }
        let ints: Vec<T> = (0..n)
            .map(|i| T::from_f64(i as f64 * 37.0 - 100.0))
            .collect();
        for k in 0..=n {
            let mut dst = vec![i32::MIN; n + 1];
            T::V::<B>::load(b, &ints).store_i32(&mut dst[..k]);
            for (i, &d) in dst.iter().enumerate() {
                let want = if i < k { i as i32 * 37 - 100 } else { i32::MIN };
                assert_eq!(d, want, "{name} store_i32 {k} lane {i}");
            }
        }
    }
}

fn rounding_f32<B: Backend>(b: B) {
    check_rounding::<B, f32>(b);
}

fn rounding_f64<B: Backend>(b: B) {
    check_rounding::<B, f64>(b);
}

fn lanes_f32<B: Backend>(b: B) {
    check_lanes::<B, f32>(b);
}

fn lanes_f64<B: Backend>(b: B) {
    check_lanes::<B, f64>(b);
}

/// [`Lanes::transpose`] moves lane `j` of row `i` to lane `i` of row `j`, bit for bit (NaN
/// payloads, signed zeros and infinities included), and a second transpose restores the block.
fn check_transpose<B: Backend, T: Float>(b: B) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let name = B::ISA.name();
    let mut next = test_stream(23);
    let mut values: Vec<T> = (0..n * n)
        .map(|_| T::from_f64(f64::from(next()) - 0.5))
        .collect();
    let specials = [f64::NAN, -0.0, f64::INFINITY, f64::NEG_INFINITY];
    for (v, s) in values.iter_mut().step_by(3).zip(specials) {
        *v = T::from_f64(s);
    }
    let bits = |v: T| v.to_f64().to_bits();
    let mut rows: Vec<T::V<B>> = values
        .chunks_exact(n)
        .map(|r| T::V::<B>::load(b, r))
        .collect();
    T::V::<B>::transpose(b, &mut rows);
    let mut got = vec![T::ZERO; n * n];
    for (j, r) in rows.iter().enumerate() {
        r.store(&mut got[j * n..][..n]);
    }
    for i in 0..n {
        for j in 0..n {
            assert_eq!(
                bits(got[j * n + i]),
                bits(values[i * n + j]),
                "{name} ({i}, {j})"
            );
        }
    }
    T::V::<B>::transpose(b, &mut rows);
    for (i, r) in rows.iter().enumerate() {
        r.store(&mut got[i * n..][..n]);
    }
    assert!(
        got.iter().zip(&values).all(|(&g, &v)| bits(g) == bits(v)),
        "{name} twice"
    );
}

fn transpose_f32<B: Backend>(b: B) {
    check_transpose::<B, f32>(b);
}

/// [`Lanes::transpose_block`] writes `dst[k * ld + i] = src[i * stride + k]` for the given
/// rows and zeros for the others, and leaves the gaps between `dst`'s rows alone.
fn check_transpose_block<B: Backend, T: Float>(b: B) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let (stride, ld) = (n + 3, n + 2);
    let src: Vec<T> = (0..n * stride)
        .map(|i| T::from_f64(i as f64 + 0.25))
        .collect();
    for rows in 1..=n {
        let mut dst = vec![-T::ONE; n * ld];
        T::V::<B>::transpose_block(b, &src, stride, rows, &mut dst, ld);
        for k in 0..n {
            for i in 0..ld {
                let want = match i {
                    i if i < rows => src[i * stride + k],
                    i if i < n => T::ZERO,
                    _ => -T::ONE,
                };
                assert_eq!(
                    dst[k * ld + i],
                    want,
                    "{} rows {rows} ({k}, {i})",
                    B::ISA.name()
                );
            }
        }
    }
}

fn transpose_block_f32<B: Backend>(b: B) {
    check_transpose_block::<B, f32>(b);
}

fn transpose_block_f64<B: Backend>(b: B) {
    check_transpose_block::<B, f64>(b);
}

fn transpose_f64<B: Backend>(b: B) {
    check_transpose::<B, f64>(b);
}

/// `vectorize` runs the operation with the backend it was called on.
fn dispatch_reaches_backend<B: Backend>(b: B) {
    struct Which;
    impl WithBackend for Which {
        type Output = Isa;
        fn run<B: Backend>(self, _: B) -> Isa {
            B::ISA
        }
    }
    assert_eq!(b.vectorize(Which), B::ISA);
    assert_eq!(dispatch(Which), isa());
}
