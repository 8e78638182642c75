//! This CPU's arithmetic peak, measured: the kernels' own fused multiply-add on every thread of
//! the pool the crate computes on, so that a layer's GFLOP/s can be read as a share of what the
//! hardware does with the same instructions, threads and clock (`deformconv bench --peak`).
//!
//! Each thread runs 12 independent chains `v = v * m + a` of the backend's widest vector (the
//! kernels' own multiply-add), enough to cover the latency of two FMA pipes (4 cycles each on
//! current x86 cores). One FMA counts two FLOPs per lane, as the layers' FLOP counts do. Where
//! the backend has no fused multiply-add (scalar, `wide` without FMA) the loop runs its
//! multiply and add, and the peak is that backend's.

use std::time::{Duration, Instant};

use crate::kernels::backend::{dispatch, Backend, Element, Lanes, WithBackend};
use crate::Float;

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;

/// A measured peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// The kernel backend that ran the loop (`avx512`, `avx2`, `portable`, `scalar`).
    pub backend: &'static str,
    /// Threads that ran it at once.
    pub threads: usize,
    /// Billions of floating-point operations per second, all threads together.
    pub gflops: f64,
}

/// The multiply-add peak for element type `T` (`f32` or `f64`) on the crate's pool (or the
/// caller's, inside `ThreadPool::install`): the best of `rounds` runs of about `round` each.
pub fn fma_peak<T: Float>(rounds: usize, round: Duration) -> Peak {
    crate::pool::on_pool(|| {
        let threads = rayon::current_num_threads();
        // Calibrate the iterations to `round` on one thread, then time every thread at once.
        let mut iters = 1 << 12;
        loop {
            let t = Instant::now();
            std::hint::black_box(dispatch(FmaLoop::<T> {
                iters,
                seed: T::ONE,
            }));
            if t.elapsed() >= round / 4 || iters >= 1 << 40 {
                iters = (iters as f64 * round.as_secs_f64() / t.elapsed().as_secs_f64().max(1e-9))
                    .max(1.0) as usize;
                break;
            }
            iters *= 4;
        }
        let mut best = Duration::MAX;
        for _ in 0..rounds.max(1) {
            let t = Instant::now();
            let sums = rayon::broadcast(|_| {
                dispatch(FmaLoop::<T> {
                    iters,
                    seed: T::ONE,
                })
            });
            best = best.min(t.elapsed());
            std::hint::black_box(sums);
        }
        let lanes = dispatch(LaneCount::<T>(std::marker::PhantomData));
        let flops = 2.0 * (threads * iters * CHAINS * lanes) as f64;
        Peak {
            backend: crate::kernels::backend::isa().name(),
            threads,
            gflops: flops / best.as_secs_f64() / 1e9,
        }
    })
}

/// `iters` rounds of [`CHAINS`] independent multiply-adds; returns a sum of the chains so
/// that the compiler keeps them.
struct FmaLoop<T> {
    iters: usize,
    seed: T,
}

impl<T: Element + Float> WithBackend for FmaLoop<T> {
    type Output = T;

    #[inline(always)]
    fn run<B: Backend>(self, b: B) -> T {
        // v -> v (1 - 2^-20) + 2^-20 stays near 1: no overflow, no subnormals.
        let m = T::V::<B>::splat(b, T::from_f64(1.0 - 1.0 / 1048576.0));
        let a = T::V::<B>::splat(b, T::from_f64(1.0 / 1048576.0));
        let mut acc = [T::V::<B>::splat(b, self.seed); CHAINS];
        for _ in 0..self.iters {
            for v in acc.iter_mut() {
                *v = v.mul_add(m, a);
            }
        }
        let mut lane = [T::ZERO; 64];
        let mut total = T::ZERO;
        for v in acc {
            v.store(&mut lane);
            total += lane[0];
        }
        total
    }
}

/// The backend's lanes for `T`.
struct LaneCount<T>(std::marker::PhantomData<T>);

impl<T: Element> WithBackend for LaneCount<T> {
    type Output = usize;

    #[inline(always)]
    fn run<B: Backend>(self, _: B) -> usize {
        <T::V<B> as Lanes<T, B>>::N
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak is a positive rate on every thread of the pool, for both types, and the loop
    /// computes what it says (the chains converge to 1).
    #[test]
    fn peak_is_measured_on_every_thread() {
        for p in [
            fma_peak::<f32>(2, Duration::from_millis(2)),
            fma_peak::<f64>(2, Duration::from_millis(2)),
        ] {
            assert!(p.gflops.is_finite() && p.gflops > 0.0, "{p:?}");
            assert_eq!(p.threads, crate::current_num_threads());
        }
        let sum = dispatch(FmaLoop::<f64> {
            iters: 1 << 16,
            seed: 0.0,
        });
        let want = CHAINS as f64 * (1.0 - (1.0 - 1.0 / 1048576.0f64).powi(1 << 16));
        assert!((sum - want).abs() < 1e-9, "{sum} vs {want}");
    }
}
