//! One handoff to the rayon pool per call.
//!
//! A call has several parallel stages (packing the weight, copying images, the tiles or tasks,
//! `grad_bias`). Started from a thread outside the pool, each stage is a separate handoff: the
//! caller queues the job, wakes the workers and sleeps until they finish. Entering the pool
//! once and running every stage from inside it costs one handoff per call instead. Measured
//! with `isa_probe W1 W2 W4` (`f32`, AMD Zen 4, 6 alternating rounds, each the best of 300 for
//! W1): W1 full backward 1.86-2.01 -> 1.77-1.82 ms on 1 thread, 1.01-1.05 -> 0.94-0.98 on 2,
//! W1 forward (2 threads) 0.41-0.46 -> 0.39-0.41; W2 and W4 level. The outputs are allocated
//! and zeroed inside the pool too, in parallel ([`crate::geometry::try_zeros`]): W1 forward on
//! 1 thread 0.79-0.85 -> 0.74-0.77 ms (6 alternating rounds; the same with a serial fill, so
//! the gain is the allocating thread), on 2 threads 0.39-0.53 -> 0.39; W1 backward level
//! (2 threads, 10 rounds: median 0.975 -> 0.96 ms).

/// Runs `f` on a thread of the current rayon pool (directly when already on one).
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn work_runs_on_a_pool_thread_from_outside_and_inside() {
        assert_eq!(rayon::current_thread_index(), None);
        assert!(super::on_pool(rayon::current_thread_index).is_some());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let inner = pool.install(|| {
            let outer = rayon::current_thread_index();
            (outer, super::on_pool(rayon::current_thread_index))
        });
        assert_eq!(
            inner.0, inner.1,
            "inside a pool the work stays on the calling worker"
        );
    }
}
