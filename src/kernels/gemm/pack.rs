//! The GEMM's packed operands: `A` in panels of `MR` rows, `B` in panels of `NR` columns.

use super::{block_shape, shape, MatB, KC};
use crate::kernels::backend::{dispatch, Backend, Element, Lanes, WithBackend};
use crate::{scratch, Float};

/// A `rows x depth` matrix packed as `ceil(rows / MR)` panels of `depth x MR`
/// (`panel[r * MR + i] = a[(p * MR + i), r]`, rows past `rows` zero), `MR` the backend's; or,
/// for matrixmultiply (`MR = 0`), copied row-major.
#[derive(Debug)]
pub(crate) struct PackedA<T: Float> {
    pub(super) data: Vec<T>,
    pub(super) rows: usize,
    pub(super) depth: usize,
    /// Rows per panel (the backend's `MR` when packed; 0: row-major for matrixmultiply).
    pub(super) mr: usize,
}

impl<T: Float> PackedA<T> {
    /// Packs `a` (`rows x depth`, row-major).
    pub(crate) fn pack(a: &[T], rows: usize, depth: usize) -> Self {
        assert!(
            a.len() >= rows * depth,
            "packed matrix shorter than rows x depth"
        );
        Self::pack_strided(a, rows, depth, depth, 1)
    }

    /// Packs the `rows x depth` matrix with element `(o, r)` at `a[o * rs + r * cs]` (so a
    /// transposed view packs without a copy).
    pub(crate) fn pack_strided(a: &[T], rows: usize, depth: usize, rs: usize, cs: usize) -> Self {
        let mut packed = Self::empty();
        packed.repack(a, rows, depth, rs, cs);
        packed
    }

    /// A `0 x 0` matrix, whose storage [`PackedA::repack`] grows.
    pub(crate) fn empty() -> Self {
        Self::empty_for(shape::<T>().0)
    }

    /// [`PackedA::empty`] with panels of `mr` rows.
    pub(super) fn empty_for(mr: usize) -> Self {
        PackedA {
            data: Vec::new(),
            rows: 0,
            depth: 0,
            mr,
        }
    }

    /// Rows of the matrix.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the matrix (the product's depth).
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// [`PackedA::pack_strided`] into this value's storage (reused across calls). Large
    /// matrices are packed in parallel, panel by panel (the result does not depend on it).
    pub(crate) fn repack(&mut self, a: &[T], rows: usize, depth: usize, rs: usize, cs: usize) {
        use rayon::prelude::*;
        assert!(
            rows == 0 || depth == 0 || a.len() > (rows - 1) * rs + (depth - 1) * cs,
            "packed matrix outside its slice"
        );
        // Row-major is one panel of `rows` rows, read transposed by matrixmultiply.
        let mr = if self.mr == 0 { rows.max(1) } else { self.mr };
        let size = rows.div_ceil(mr) * depth * mr;
        if self.data.capacity() < size {
            scratch::give(std::mem::take(&mut self.data));
            self.data = scratch::take_empty(size);
        }
        self.data.clear();
        self.data.resize(size, T::ZERO);
        (self.rows, self.depth) = (rows, depth);
        if self.mr == 0 {
            for (o, row) in self.data.chunks_exact_mut(depth.max(1)).enumerate() {
                for (r, d) in row.iter_mut().enumerate().take(depth) {
                    *d = a[o * rs + r * cs];
                }
            }
            return;
        }
        // Reads `a` in its own order: a transposed view (`rs == 1`) gives each depth step's
        // rows as one contiguous run; otherwise each row is walked once along its depth.
        // Measured (W1 full backward, Intel SPR, perf): the element-by-element loop this
        // replaces held 10% of the backward's samples, this one 6.5% (wall time within noise).
        let fill = |(p, panel): (usize, &mut [T])| {
            let live = mr.min(rows - p * mr);
            let base = p * mr * rs;
            if rs == 1 {
                let runs = panel.chunks_exact_mut(mr).enumerate();
                let run_at = |r: usize| base + r * cs;
                // A whole panel's run is a fixed-size copy: `copy_from_slice` of `live` values
                // called memcpy for every depth step (8 floats). Measured on W1's full
                // backward (AMD Zen 5, `bwd_probe W1 all`, min of 300, alternating binaries):
                // 1 thread 1.30-1.32 -> 1.24-1.26 ms, 2 threads 0.71-0.75 -> 0.68-0.70 ms.
                match (mr, live == mr) {
                    (8, true) => runs.for_each(|(r, d)| copy_run::<T, 8>(d, &a[run_at(r)..])),
                    (6, true) => runs.for_each(|(r, d)| copy_run::<T, 6>(d, &a[run_at(r)..])),
                    (4, true) => runs.for_each(|(r, d)| copy_run::<T, 4>(d, &a[run_at(r)..])),
                    _ => runs.for_each(|(r, d)| {
                        d[..live].copy_from_slice(&a[run_at(r)..][..live]);
                    }),
                }
            } else if live == mr && cs == 1 && matches!(mr, 4 | 6 | 8) {
                // The panel's rows read side by side, one run of `mr` written per depth step
                // (the weight gradient's `grad_out`). In W1's full backward (1 thread, perf)
                // the packing went from 5.2% to 1.8% of the samples with AVX-512's 8-row
                // panels (Intel SPR); with AVX2's 6-row ones (AMD Zen 3, `WANT` without the
                // mask) from 6.2% to 3.6%, wall time within the hosts' noise.
                let at = &a[base..];
                match mr {
                    8 => interleave_rows::<T, 8>(panel, at, rs, depth),
                    6 => interleave_rows::<T, 6>(panel, at, rs, depth),
                    _ => interleave_rows::<T, 4>(panel, at, rs, depth),
                }
            } else {
                for i in 0..live {
                    let row = a[base + i * rs..].iter().step_by(cs.max(1));
                    for (dst, &v) in panel.chunks_exact_mut(mr).zip(row) {
                        dst[i] = v;
                    }
                }
            }
        };
        let chunk = (depth * mr).max(1);
        if self.data.len() >= 1 << 18 {
            self.data.par_chunks_mut(chunk).enumerate().for_each(fill);
        } else {
            self.data.chunks_mut(chunk).enumerate().for_each(fill);
        }
    }
}

/// `panel[r * M + i] = a[i * rs + r]` for `i < M`, `r < depth`: `M` rows of `a` side by
/// side.
#[inline(always)]
fn interleave_rows<T: Copy, const M: usize>(panel: &mut [T], a: &[T], rs: usize, depth: usize) {
    let rows: [&[T]; M] = std::array::from_fn(|i| &a[i * rs..][..depth]);
    for (r, dst) in panel.chunks_exact_mut(M).enumerate() {
        let run: [T; M] = std::array::from_fn(|i| rows[i][r]);
        copy_run::<T, M>(dst, &run);
    }
}

/// `dst[..M] = src[..M]` as one fixed-size copy (register moves, no call).
#[inline(always)]
fn copy_run<T: Copy, const M: usize>(dst: &mut [T], src: &[T]) {
    let (dst, src): (&mut [T; M], &[T; M]) = (
        (&mut dst[..M]).try_into().expect("M values"),
        src[..M].try_into().expect("M values"),
    );
    *dst = *src;
}

impl<T: Float> Drop for PackedA<T> {
    /// The storage goes back to this thread's scratch cache (a packed weight is megabytes,
    /// allocated on every call).
    fn drop(&mut self) {
        scratch::give(std::mem::take(&mut self.data));
    }
}

/// `B` (`depth x len`) packed once for many products: its depth blocks of [`KC`] rows one
/// after the other, each laid out as the GEMM packs a block.
#[derive(Debug)]
pub(crate) struct PackedB<T: Float> {
    data: Vec<T>,
    /// Where the packed matrix starts in `data` (its first cache-line boundary).
    start: usize,
    pub(super) depth: usize,
    pub(super) len: usize,
    /// Columns per panel (the backend's `NR` when packed; 0: row-major for matrixmultiply).
    pub(super) nr: usize,
}

impl<T: Float> PackedB<T> {
    /// Packs the `depth x len` matrix `b`.
    ///
    /// # Panics
    /// If `b` does not hold `depth x len` elements.
    pub(crate) fn pack(b: MatB<'_, T>, depth: usize, len: usize) -> Self {
        assert!(
            depth == 0 || len == 0 || b.data.len() > (depth - 1) * b.rs + (len - 1) * b.cs,
            "packed B outside its slice"
        );
        struct Pack<'a, T: Float>(MatB<'a, T>, usize, usize);
        impl<T: Float> WithBackend for Pack<'_, T> {
            type Output = PackedB<T>;
            #[inline(always)]
            fn run<B: Backend>(self, be: B) -> PackedB<T> {
                PackedB::pack_on(be, self.0, self.1, self.2)
            }
        }
        dispatch(Pack(b, depth, len))
    }

    /// [`PackedB::pack`] for backend `be`.
    #[inline(always)]
    fn pack_on<B: Backend>(be: B, b: MatB<'_, T>, depth: usize, len: usize) -> Self {
        if B::OWN_GEMM {
            return Self::pack_panels(be, b, depth, len);
        }
        let mut data = scratch::take::<T>(depth * len);
        for (r, row) in data.chunks_exact_mut(len.max(1)).enumerate().take(depth) {
            for (q, d) in row.iter_mut().enumerate() {
                *d = b.data[r * b.rs + q * b.cs];
            }
        }
        PackedB {
            data,
            start: 0,
            depth,
            len,
            nr: 0,
        }
    }

    /// `B` in panels for our kernel on backend `be`.
    #[inline(always)]
    pub(super) fn pack_panels<B: Backend>(be: B, b: MatB<'_, T>, depth: usize, len: usize) -> Self {
        let nr = block_shape::<T, B>().1;
        let panels = len.div_ceil(nr);
        let size = panels * nr * depth;
        let mut data = scratch::take::<T>(size + scratch::line_elements::<T>());
        let start = scratch::line_start(&data);
        for r0 in (0..depth).step_by(KC) {
            let kc = KC.min(depth - r0);
            let block = &mut data[start + r0 * panels * nr..][..panels * kc * nr];
            pack_b(be, b, r0, kc, len, block);
        }
        PackedB {
            data,
            start,
            depth,
            len,
            nr,
        }
    }

    /// Columns of `B`.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The packed matrix (from a cache-line boundary where packed in panels).
    pub(super) fn packed(&self) -> &[T] {
        &self.data[self.start..]
    }
}

impl<T: Float> Drop for PackedB<T> {
    /// The storage goes back to this thread's scratch cache.
    fn drop(&mut self) {
        scratch::give(std::mem::take(&mut self.data));
    }
}

/// Copies rows `r0 .. r0 + kc`, columns `0 .. len` of `b` into panels of `NR` columns,
/// `[panel][k][NR]`, zero past `len`. Every element of `out` (`ceil(len / NR) * kc * NR`
/// values) is written.
#[inline(always)]
pub(super) fn pack_b<B: Backend, T: Element + Float>(
    be: B,
    b: MatB<'_, T>,
    r0: usize,
    kc: usize,
    len: usize,
    out: &mut [T],
) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let nr = block_shape::<T, B>().1;
    let panels = len.div_ceil(nr);
    assert_eq!(out.len(), panels * kc * nr);
    for p in 0..panels {
        let (q0, width) = (p * nr, nr.min(len - p * nr));
        let panel = &mut out[p * kc * nr..][..kc * nr];
        if b.cs == 1 {
            // Whole vectors a row, the zero padding included: `copy_from_slice` called memcpy
            // for every 48-float row (W1 dense forward, AVX-512, 1 thread: 17% of the time in
            // memcpy; 0.63 -> 0.56 ms).
            for (k, dst) in panel.chunks_exact_mut(nr).enumerate() {
                let src = &b.data[(r0 + k) * b.rs + q0..][..width];
                for v0 in (0..nr).step_by(n) {
                    let x = if v0 + n <= width {
                        T::V::<B>::load(be, &src[v0..])
                    } else {
                        T::V::<B>::load_partial(be, &src[v0.min(width)..])
                    };
                    x.store(&mut dst[v0..]);
                }
            }
            continue;
        }
        // Transposed B (the weight gradient's `colsᵀ`, `rs = 1`): N x N blocks by the
        // backend's transpose (a last block of fewer columns padded with zero rows), the last
        // rows element by element. Measured on W4 (AVX-512, 1 thread): the element-wise copy
        // was 13% of the backward; on W1 the padding columns alone were a sixth of the GEMM.
        for dst in panel.chunks_exact_mut(nr) {
            dst[width..].fill(T::ZERO);
        }
        let full_k = if b.rs == 1 { kc / n * n } else { 0 };
        for j0 in (0..width).step_by(n) {
            let nj = n.min(width - j0);
            // Columns j0 + nj .. j0 + N past `width` are zero padding inside the panel row:
            // j0 is a multiple of N below width <= NR, a multiple of N.
            for k0 in (0..full_k).step_by(n) {
                let src = &b.data[(q0 + j0) * b.cs + r0 + k0..];
                T::V::<B>::transpose_block(be, src, b.cs, nj, &mut panel[k0 * nr + j0..], nr);
            }
            for j in j0..j0 + nj {
                let col = &b.data[(q0 + j) * b.cs..];
                for k in full_k..kc {
                    panel[k * nr + j] = col[(r0 + k) * b.rs];
                }
            }
        }
    }
}
