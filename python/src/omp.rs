//! Running the crate's rayon work on the process's OpenMP threads (PyTorch's, from the libgomp
//! it loads), instead of on threads of our own.
//!
//! Why: after every parallel PyTorch operator, libgomp's idle workers keep spinning for several
//! milliseconds (`GOMP_SPINCOUNT`) waiting for the next one. A rayon pool of our own then shares
//! the cores with those spinning threads: on 2 cores, W1's forward took 4.0 ms right after a
//! `max_pool2d` against 1.8 ms on its own (and 2.1 ms with `OMP_WAIT_POLICY=PASSIVE`). Running
//! our workers *on* the OpenMP team reuses the threads that would spin, so nothing competes.
//!
//! How: a rayon pool is built per call whose worker threads are not spawned but handed (as
//! `ThreadBuilder`s) to the team of one `GOMP_parallel` region, thread `i` running worker `i`.
//! The computation is spawned into that pool before the region starts, and drops the pool when
//! it is done, which ends every worker loop and so the region. Everything is found with
//! `dlsym` at run time: without a libgomp in the process, nothing changes.
//!
//! **Not in a fork child.** libgomp's team does not survive `fork()` (libgomp has no fork
//! handler): its threads stay in the parent, but the child's libgomp still counts them as the
//! idle team of the forking thread, and the child's next region of two threads or more waits
//! forever for them. Measured with torch 2.15's libgomp: once the parent has run a region of
//! two threads, a `GOMP_parallel` of two threads in the child hangs (one of one thread runs; a
//! child of a parent that never started a team starts its own), and so do PyTorch's own
//! operators (`(x * 2).sum()` on 4M elements) and our op hosted there. A child cannot tell
//! whether its parent had started a team (PyTorch starts one at its first parallel operator),
//! so [`run`] hosts only in the process that loaded this module ([`set_home`]); in any other
//! the calls run on deformconv's rayon pool, rebuilt per process (the same bits). `DataLoader`
//! workers run PyTorch on one thread anyway (then deformconv's pool of one thread).

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadBuilder, ThreadPool, ThreadPoolBuilder};

type GompParallel =
    unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
type OmpQuery = unsafe extern "C" fn() -> c_int;

/// The libgomp entry points we use.
struct Omp {
    parallel: GompParallel,
    thread_num: OmpQuery,
    max_threads: OmpQuery,
    in_parallel: OmpQuery,
}

static OMP: OnceLock<Omp> = OnceLock::new();

/// The process that loaded this module: the only one whose libgomp [`run`] uses.
static HOME: OnceLock<u32> = OnceLock::new();

/// Records the current process as the one [`run`] may host in (at the module's import).
pub fn set_home() {
    HOME.get_or_init(std::process::id);
}

fn symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the name up in
    // the objects already loaded; it returns null when there is none.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn resolve() -> Option<Omp> {
    let parallel = symbol(c"GOMP_parallel")?;
    let thread_num = symbol(c"omp_get_thread_num")?;
    let max_threads = symbol(c"omp_get_max_threads")?;
    let in_parallel = symbol(c"omp_in_parallel")?;
    // SAFETY: these are libgomp's exported functions with exactly these C signatures
    // (`void GOMP_parallel(void (*)(void *), void *, unsigned, unsigned)` and
    // `int omp_*(void)`), found in the same library.
    unsafe {
        Some(Omp {
            parallel: std::mem::transmute::<*mut c_void, GompParallel>(parallel),
            thread_num: std::mem::transmute::<*mut c_void, OmpQuery>(thread_num),
            max_threads: std::mem::transmute::<*mut c_void, OmpQuery>(max_threads),
            in_parallel: std::mem::transmute::<*mut c_void, OmpQuery>(in_parallel),
        })
    }
}

/// Whether a libgomp is loaded (looked up until one is), so that [`run`] can host.
pub fn available() -> bool {
    if OMP.get().is_none() {
        if let Some(omp) = resolve() {
            let _ = OMP.set(omp);
        }
    }
    OMP.get().is_some()
}

/// The OpenMP team size [`run`] uses (`omp_get_max_threads`, which `torch.set_num_threads`
/// sets), if a libgomp is loaded.
pub fn threads() -> Option<usize> {
    if !available() {
        return None;
    }
    let omp = OMP.get()?;
    // SAFETY: a libgomp query without arguments (see `resolve`).
    let n = unsafe { (omp.max_threads)() };
    Some(n.max(1) as usize)
}

/// What the team's threads share during one region.
struct Team {
    builders: Mutex<Vec<Option<ThreadBuilder>>>,
    thread_num: OmpQuery,
}

unsafe extern "C" fn region(data: *mut c_void) {
    // SAFETY: `data` is the `&Team` that `run` passes to `GOMP_parallel`, alive until that call
    // returns, which is after every thread of the team has left this function.
    let team = unsafe { &*(data as *const Team) };
    // SAFETY: a libgomp query without arguments, called inside the region.
    let tid = unsafe { (team.thread_num)() } as usize;
    let builder = team
        .builders
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(tid)
        .and_then(Option::take);
    if let Some(b) = builder {
        b.run();
    }
}

/// Runs `f` in a rayon pool whose workers are the threads of an OpenMP team, when a libgomp is
/// loaded, there are at least two threads, we are not already inside an OpenMP region and not
/// in a fork child (see the module's doc); `Err(f)` (and `f` untouched) otherwise.
pub fn run<R: Send, F: FnOnce() -> R + Send>(f: F) -> Result<R, F> {
    if HOME.get() != Some(&std::process::id()) {
        return Err(f);
    }
    let (Some(omp), Some(n)) = (OMP.get(), threads()) else {
        return Err(f);
    };
    // SAFETY: a libgomp query without arguments.
    if n < 2 || unsafe { (omp.in_parallel)() } != 0 {
        return Err(f);
    }
    let builders = Mutex::new(Vec::with_capacity(n));
    let built = ThreadPoolBuilder::new()
        .num_threads(n)
        .spawn_handler(|b| {
            builders
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Some(b));
            Ok(())
        })
        .build();
    let Ok(pool) = built else {
        return Err(f);
    };
    let pool: Arc<Mutex<Option<ThreadPool>>> = Arc::new(Mutex::new(Some(pool)));
    let result: Mutex<Option<std::thread::Result<R>>> = Mutex::new(None);
    let job: Box<dyn FnOnce() + Send + '_> = Box::new({
        let pool = Arc::clone(&pool);
        let result = &result;
        move || {
            let r = catch_unwind(AssertUnwindSafe(f));
            *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            // Ends the pool: every worker loop returns once it is out of work, and with the
            // last of them the OpenMP region.
            drop(pool.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
    });
    // SAFETY: only the lifetime changes. The job borrows `result` and whatever `f` borrows,
    // all of which outlive this function's body; the job runs before `GOMP_parallel` below
    // returns, because that call returns only when every team thread has left
    // `ThreadBuilder::run`, which happens only once the pool is terminated, which only the
    // job's last statement does (the pool's one handle is inside the job). Thread 0, the
    // caller, always runs worker 0, so the job is always picked up.
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    if let Some(p) = pool.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        p.spawn(job);
    }
    let team = Team {
        builders: Mutex::new(builders.into_inner().unwrap_or_else(|e| e.into_inner())),
        thread_num: omp.thread_num,
    };
    // SAFETY: `region` has the signature libgomp expects and reads `team` only while this call
    // lasts; `n` threads at most are asked for, each taking its own builder.
    unsafe { (omp.parallel)(region, &team as *const Team as *mut c_void, n as c_uint, 0) };
    match result.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(Ok(r)) => Ok(r),
        Some(Err(panic)) => resume_unwind(panic),
        None => unreachable!("the OpenMP region ended before its job ran"),
    }
}
