//! A small per-thread cache of large scratch buffers (the backward's tiles and planes, the
//! packed weights, the pixel-major image copies), kept between calls.
//!
//! A fresh multi-megabyte buffer is fresh pages: the kernel faults and zeroes every 4 KiB on
//! first touch, and the allocator hands such buffers back to the system when they are freed.
//! Measured on W4 (1 thread), page faults were about 8% of the backward; on W2 a backward
//! called back to back took 29 ms instead of 23 ms until the packed weights were cached too.
//! Taking the buffers back from the previous call avoids it. Each thread keeps at most
//! [`MAX_BYTES`] in at most [`MAX_BUFFERS`] buffers; anything more is freed as before.

use std::any::Any;
use std::cell::RefCell;

use crate::float::Float;

/// Bytes a thread keeps between calls.
const MAX_BYTES: usize = 32 << 20;
/// Buffers a thread keeps between calls.
const MAX_BUFFERS: usize = 8;

thread_local! {
    /// The cached buffers (each a `Vec<T>` of some element type) and their bytes.
    static POOL: RefCell<(Vec<Box<dyn Any>>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    /// Whole working sets kept between tiles and calls, at most one per type (see [`keep`]).
    static KEPT: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's kept value of type `S` (see [`keep`]), or `None`. A nested call on the same
/// thread finds nothing and builds its own.
pub(crate) fn take_kept<S: Any>() -> Option<S> {
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let at = kept.iter().position(|b| b.is::<S>())?;
        kept.swap_remove(at).downcast::<S>().ok().map(|b| *b)
    })
}

/// Keeps `value` on this thread for the next [`take_kept`] of its type, if it holds at most
/// `MAX_BYTES` (`bytes`, as the caller counts them); a value of that type already kept is
/// replaced. [`clear`] frees it.
pub(crate) fn keep<S: Any>(value: S, bytes: usize) {
    if bytes > MAX_BYTES {
        return;
    }
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        kept.retain(|b| !b.is::<S>());
        kept.push(Box::new(value));
    });
}

/// A zeroed `Vec<T>` of `len` elements, reusing a cached buffer of this thread when one is
/// large enough (the smallest such).
pub(crate) fn take<T: Float + 'static>(len: usize) -> Vec<T> {
    let mut v = take_empty(len);
    v.resize(len, T::ZERO);
    v
}

/// An empty `Vec<T>` with room for at least `capacity` elements, from this thread's cache when
/// one is large enough (the smallest such).
pub(crate) fn take_empty<T: Float + 'static>(capacity: usize) -> Vec<T> {
    try_take_empty(capacity).unwrap_or_else(|| Vec::with_capacity(capacity))
}

/// [`take_empty`], or `None` when the memory cannot be had (for buffers whose size the caller's
/// data sets, where an allocation failure must be an error, not an abort).
pub(crate) fn try_take_empty<T: Float + 'static>(capacity: usize) -> Option<Vec<T>> {
    if capacity == 0 {
        return Some(Vec::new());
    }
    let cached = POOL.with(|pool| {
        let (bufs, bytes) = &mut *pool.borrow_mut();
        let best = bufs
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.downcast_ref::<Vec<T>>().map(|v| (i, v.capacity())))
            .filter(|&(_, cap)| cap >= capacity)
            .min_by_key(|&(_, cap)| cap)?;
        let v = bufs.swap_remove(best.0).downcast::<Vec<T>>().ok()?;
        *bytes -= v.capacity() * std::mem::size_of::<T>();
        Some(*v)
    });
    match cached {
        Some(mut v) => {
            v.clear();
            Some(v)
        }
        None => {
            let mut v = Vec::new();
            v.try_reserve_exact(capacity).ok()?;
            Some(v)
        }
    }
}

/// Returns `v` to this thread's cache, or frees it if the cache is full.
pub(crate) fn give<T: Float + 'static>(v: Vec<T>) {
    let size = v.capacity() * std::mem::size_of::<T>();
    if size == 0 || size > MAX_BYTES {
        return;
    }
    POOL.with(|pool| {
        let (bufs, bytes) = &mut *pool.borrow_mut();
        // Make room by dropping the smallest buffers first (the large ones save the most).
        while !bufs.is_empty() && (*bytes + size > MAX_BYTES || bufs.len() >= MAX_BUFFERS) {
            let smallest = (0..bufs.len())
                .min_by_key(|&i| buffer_bytes(&*bufs[i]))
                .unwrap_or(0);
            let gone = bufs.swap_remove(smallest);
            *bytes -= buffer_bytes(&*gone);
        }
        *bytes += size;
        bufs.push(Box::new(v));
    });
}

/// Bytes of a cache line on the targets.
const LINE_BYTES: usize = 64;

/// Elements of `T` in a cache line.
pub(crate) const fn line_elements<T>() -> usize {
    LINE_BYTES / size_of::<T>()
}

/// The index of the first element of `buf` on a cache-line boundary (at most a line in; the
/// start itself if the pointer does not tell).
pub(crate) fn line_start<T>(buf: &[T]) -> usize {
    buf.as_ptr()
        .align_offset(LINE_BYTES)
        .min(line_elements::<T>())
}

/// `len` elements of `buf`, grown as needed, starting on a cache-line boundary.
///
/// Why: the kernels load and store whole vectors, and a large allocation starts 16 bytes past
/// a page, so every 64-byte vector straddled two lines. The GEMM's packed `B` aligned, its
/// register kernel on cache-resident operands went from 154 to 166-171 GFLOP/s (f32,
/// AVX-512, Intel Xeon, 1 thread, `gemm_kernel_probe`; the thread's FMA peak is 208).
pub(crate) fn line_aligned<T: Float>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    let want = len + line_elements::<T>();
    if buf.len() < want {
        buf.resize(want, T::ZERO);
    }
    let start = line_start(buf);
    &mut buf[start..][..len]
}

/// Frees this thread's cached buffers and kept values.
pub(crate) fn clear() {
    KEPT.with(|kept| kept.borrow_mut().clear());
    POOL.with(|pool| {
        let (bufs, bytes) = &mut *pool.borrow_mut();
        bufs.clear();
        *bytes = 0;
    });
}

/// Frees the cached buffers of every thread of the pool the crate computes on (the caller's, or
/// the crate's own: [`crate::pool`]) and of the caller.
pub(crate) fn clear_all() {
    crate::pool::on_pool(|| rayon::broadcast(|_| clear()));
    clear();
}

/// Capacity in bytes of a cached buffer.
fn buffer_bytes(b: &dyn Any) -> usize {
    if let Some(v) = b.downcast_ref::<Vec<f32>>() {
        v.capacity() * 4
    } else if let Some(v) = b.downcast_ref::<Vec<f64>>() {
        v.capacity() * 8
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_buffers_come_back_zeroed_and_the_cache_stays_bounded() {
        let mut v = take::<f32>(1000);
        v.iter_mut().for_each(|x| *x = 7.0);
        let ptr = v.as_ptr();
        give(v);
        let w = take::<f32>(500);
        assert_eq!(w.as_ptr(), ptr, "the cached buffer is reused");
        assert!(w.len() == 500 && w.iter().all(|&x| x == 0.0));
        give(w);
        // An f64 request does not take the f32 buffer.
        let d = take::<f64>(10);
        assert!(d.iter().all(|&x| x == 0.0));
        for _ in 0..2 * MAX_BUFFERS {
            give(vec![0.0f64; 1 << 16]);
        }
        POOL.with(|p| {
            let (bufs, bytes) = &*p.borrow();
            assert!(bufs.len() <= MAX_BUFFERS && *bytes <= MAX_BYTES);
            assert_eq!(
                *bytes,
                bufs.iter().map(|b| buffer_bytes(&**b)).sum::<usize>()
            );
        });
        clear_all();
        POOL.with(|p| {
            let (bufs, bytes) = &*p.borrow();
            assert!(bufs.is_empty() && *bytes == 0);
        });
    }
}
