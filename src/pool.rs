//! Where the crate's parallel work runs: one handoff to a rayon pool per call, on a pool that
//! survives `fork`.
//!
//! **One handoff.** A call has several parallel stages (packing the weight, copying images, the
//! tiles or tasks, `grad_bias`). Started from a thread outside the pool, each stage is a separate
//! handoff: the caller queues the job, wakes the workers and sleeps until they finish. Entering
//! the pool once and running every stage from inside it costs one handoff per call instead.
//! Measured with `isa_probe W1 W2 W4` (`f32`, AMD Zen 4, 6 alternating rounds, each the best of
//! 300 for W1): W1 full backward 1.86-2.01 -> 1.77-1.82 ms on 1 thread, 1.01-1.05 -> 0.94-0.98
//! on 2, W1 forward (2 threads) 0.41-0.46 -> 0.39-0.41; W2 and W4 level. The outputs are
//! allocated and zeroed inside the pool too, in parallel ([`crate::geometry::try_zeros`]): W1
//! forward on 1 thread 0.79-0.85 -> 0.74-0.77 ms (6 alternating rounds; the same with a serial
//! fill, so the gain is the allocating thread), on 2 threads 0.39-0.53 -> 0.39; W1 backward
//! level (2 threads, 10 rounds: median 0.975 -> 0.96 ms).
//!
//! **Which pool.** Called from a thread of a rayon pool (inside `ThreadPool::install`), the work
//! runs on that pool. Called from anywhere else, it runs on the crate's own pool, one per
//! process: `RAYON_NUM_THREADS` threads, else one per core. Not rayon's global pool, because a
//! pool's threads do not survive `fork`: a child of a process that had used it would queue its
//! work for threads that exist only in the parent and wait forever (multiprocessing's default
//! start method on Linux, gunicorn and celery workers, PyTorch's `DataLoader` workers). The
//! crate's pool remembers the process that built it; a child builds its own on its first call
//! and leaks the parent's (its threads are not there to be joined).

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

use rayon::ThreadPool;

/// Runs `f` on a thread of the current rayon pool (directly when already on one), else on the
/// crate's pool of this process ([`own_pool`]).
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    match own_pool() {
        Some(pool) => pool.install(f),
        // No thread could be started (the process is out of threads or memory): the calling
        // thread does the work alone, on a pool of one it runs itself.
        None => f(),
    }
}

/// The number of threads a call made from this thread computes on: the current rayon pool's
/// when called inside one (`ThreadPool::install`), else the crate's own pool's
/// (`RAYON_NUM_THREADS`, else one per core), which this builds if the process has none yet.
pub fn current_num_threads() -> usize {
    on_pool(rayon::current_num_threads)
}

/// The process that built [`POOL`]'s pool (0: none yet).
static OWNER: AtomicU32 = AtomicU32::new(0);
/// The crate's pool, built by the process [`OWNER`] names; leaked, so a reference lives forever.
static POOL: AtomicPtr<ThreadPool> = AtomicPtr::new(std::ptr::null_mut());
/// Serialises building a pool (only the first call of each process takes it).
static BUILDING: Mutex<()> = Mutex::new(());

/// The crate's rayon pool for this process, built on the process's first call; `None` when no
/// thread can be started.
fn own_pool() -> Option<&'static ThreadPool> {
    let pid = std::process::id();
    if let Some(pool) = pool_of(pid) {
        return Some(pool);
    }
    // A fork copies this mutex in the state the forking thread saw. Only a thread of the parent
    // that was building a pool at that instant holds it, and that thread is not in the child:
    // then the lock would never be released, so the child does not wait on it for long.
    let _guard = match BUILDING.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => wait_for_builder(),
    };
    if let Some(pool) = pool_of(pid) {
        return Some(pool);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("deformconv-{i}"))
        .build()
        .ok()?;
    // The parent's pool, if any, is leaked: its threads exist only in the parent.
    POOL.store(Box::into_raw(Box::new(pool)), Ordering::Release);
    OWNER.store(pid, Ordering::Release);
    pool_of(pid)
}

/// [`POOL`]'s pool if process `pid` built it.
fn pool_of(pid: u32) -> Option<&'static ThreadPool> {
    if OWNER.load(Ordering::Acquire) != pid {
        return None;
    }
    let p = POOL.load(Ordering::Acquire);
    // SAFETY: `POOL` only ever holds null or a pointer from `Box::into_raw` that is never freed,
    // stored before `OWNER` names this process (release / acquire order), so a non-null pointer
    // read after `OWNER == pid` points to a live pool for the rest of the program.
    unsafe { p.as_ref() }
}

/// Waits up to a second for another thread building the pool; `None` after that (a lock
/// inherited across `fork` from a thread that is gone): the caller builds without it.
fn wait_for_builder() -> Option<std::sync::MutexGuard<'static, ()>> {
    for _ in 0..1000 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        match BUILDING.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
    None
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
