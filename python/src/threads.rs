//! Where the computations run, and their threads: the pool `set_num_threads` chooses (else the
//! crate's own), PyTorch's OpenMP team (see [`omp`]), and the scratch the kernels keep.
//!
//! **Fork.** A rayon pool's threads do not survive `fork()`: a child queuing work for the pool
//! its parent used would wait forever for threads that exist only in the parent
//! (multiprocessing's default start method on Linux, PyTorch's `DataLoader` workers, gunicorn
//! and celery workers). So each pool here remembers the process that built it ([`ProcessPool`]),
//! and a fork child builds its own of the same size at its first call, leaking the parent's:
//! dropping it would signal threads that are not there, through locks the fork may have copied
//! held. The crate's own pool does the same (`deformconv`'s `pool.rs`), and libgomp's team
//! cannot be used in a child at all (see [`omp`]). The pools are looked up and replaced only
//! with the GIL held, which `os.fork()` holds too, so a fork from Python never copies their
//! locks held.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

use crate::args::size;
use crate::omp;

/// A rayon pool of `threads` threads, for the process that built it: in a fork child,
/// [`ProcessPool::get`] replaces it by a new one of the same size.
struct ProcessPool {
    threads: usize,
    /// The threads' name: `{name}-{index}`.
    name: &'static str,
    /// The process that built `pool`.
    pid: u32,
    /// Always `Some`, except while a pool built by another process is leaked (see `Drop`).
    pool: Option<Arc<ThreadPool>>,
}

impl ProcessPool {
    fn new(threads: usize, name: &'static str) -> Result<Self, ThreadPoolBuildError> {
        let pool = ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("{name}-{i}"))
            .build()?;
        Ok(ProcessPool {
            threads,
            name,
            pid: std::process::id(),
            pool: Some(Arc::new(pool)),
        })
    }

    /// The pool, for this process: in a fork child, a new one the first time (the parent's is
    /// leaked); `None` when its threads cannot be started (then the next call tries again).
    fn get(&mut self) -> Option<Arc<ThreadPool>> {
        if self.pid != std::process::id() {
            *self = ProcessPool::new(self.threads, self.name).ok()?;
        }
        self.pool.clone()
    }
}

impl Drop for ProcessPool {
    fn drop(&mut self) {
        // A pool built by the parent of a fork is leaked: its threads exist only there.
        if self.pid != std::process::id() {
            std::mem::forget(self.pool.take());
        }
    }
}

/// The pool set by [`set_num_threads`]; `None`: the crate's own pool (`RAYON_NUM_THREADS`,
/// else one thread per core).
static CHOSEN: Mutex<Option<ProcessPool>> = Mutex::new(None);

/// A pool of one thread, for OpenMP hosting with a team of one (`torch.set_num_threads(1)`).
static SINGLE: Mutex<Option<ProcessPool>> = Mutex::new(None);

fn lock(m: &'static Mutex<Option<ProcessPool>>) -> MutexGuard<'static, Option<ProcessPool>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn chosen_pool() -> Option<Arc<ThreadPool>> {
    lock(&CHOSEN).as_mut()?.get()
}

fn single_thread() -> Option<Arc<ThreadPool>> {
    let mut single = lock(&SINGLE);
    if single.is_none() {
        *single = ProcessPool::new(1, "deformconv-single").ok();
    }
    single.as_mut()?.get()
}

/// Runs `f` without the GIL: with `openmp`, on the OpenMP threads (on one thread when the team
/// has one; see [`omp`]), else in the module's pool.
pub(crate) fn compute<R: Send>(py: Python<'_>, openmp: bool, f: impl FnOnce() -> R + Send) -> R {
    // The pool for when the OpenMP team does not take the work, chosen with the GIL held.
    let pool = if openmp && omp::threads() == Some(1) {
        single_thread()
    } else {
        chosen_pool()
    };
    py.detach(move || {
        let f = if openmp {
            match omp::run(f) {
                Ok(r) => return r,
                Err(f) => f,
            }
        } else {
            f
        };
        match pool {
            Some(p) => p.install(f),
            None => f(),
        }
    })
}

/// Computes on a pool of `n` threads from now on; `0` returns to the crate's own pool
/// (`RAYON_NUM_THREADS`, else one thread per core).
#[pyfunction]
pub(crate) fn set_num_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    let n = size("n", n)?;
    if n > rayon::max_num_threads() {
        return Err(PyValueError::new_err(format!(
            "n: {n} threads is more than rayon's limit of {}",
            rayon::max_num_threads()
        )));
    }
    let new = if n == 0 {
        None
    } else {
        let p = ProcessPool::new(n, "deformconv")
            .map_err(|e| PyValueError::new_err(format!("cannot start {n} threads: {e}")))?;
        Some(p)
    };
    *lock(&CHOSEN) = new;
    Ok(())
}

/// The number of threads computations run on.
#[pyfunction]
pub(crate) fn get_num_threads() -> usize {
    match lock(&CHOSEN).as_ref() {
        Some(p) => p.threads,
        None => deformconv::current_num_threads(),
    }
}

/// The number of threads a call with `openmp=True` runs on: the OpenMP team of the libgomp
/// PyTorch loads (`omp_get_max_threads()`, which `torch.set_num_threads` sets); `None` when no
/// libgomp is loaded (the call then runs on deformconv's pool). In a fork child the call runs on
/// deformconv's pool too, on one thread when this says 1 (see [`omp`]).
#[pyfunction]
pub(crate) fn openmp_threads() -> Option<usize> {
    omp::threads()
}

/// Frees the scratch the kernels keep between calls (up to 32 MiB per thread): on deformconv's
/// pool, and on the OpenMP team the torch ops run on when a libgomp is loaded.
#[pyfunction]
pub(crate) fn release_cached_scratch(py: Python<'_>) {
    compute(py, false, deformconv::release_cached_scratch);
    if omp::available() {
        compute(py, true, deformconv::release_cached_scratch);
    }
}
