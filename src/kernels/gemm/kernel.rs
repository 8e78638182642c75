//! The GEMM's loops and its register kernel, generic over the backend.

use super::pack::{pack_b, PackedA, PackedB};
use super::{block_shape, Init, MatB, KC};
use crate::kernels::backend::{Backend, Element, Lanes, Strided, WithBackend};
use crate::scratch::line_aligned;
use crate::Float;

/// Where the product takes the packed depth blocks of `B` from.
pub(super) enum Operand<'a, T: Float> {
    /// Packed block by block into the buffer.
    Unpacked(MatB<'a, T>, &'a mut Vec<T>),
    /// Packed already.
    Packed(&'a PackedB<T>),
}

/// The product's output: `len` columns of `C` at row stride `ldc`, and what it starts from.
pub(super) struct Out<'a, T> {
    pub c: *mut T,
    pub ldc: usize,
    pub len: usize,
    pub init: Init<'a, T>,
}

/// One product, run on a backend. Built only by [`super::multiply`] and
/// [`super::multiply_packed`], whose safety contracts its fields satisfy: `out.c` addresses
/// `a.rows` rows of `out.len` writable elements at stride `out.ldc`, the caller's own.
pub(super) struct Product<'a, T: Float> {
    pub a: &'a PackedA<T>,
    pub b: Operand<'a, T>,
    pub out: Out<'a, T>,
}

impl<T: Float> WithBackend for Product<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run<B: Backend>(self, be: B) {
        let Product { a, mut b, out } = self;
        let (rows, depth, len) = (a.rows, a.depth, out.len);
        debug_assert!(!matches!(out.init, Init::Bias(bias) if bias.len() < rows));
        if rows == 0 || len == 0 {
            return;
        }
        if depth == 0 {
            // SAFETY: the fields' contract (see the type).
            return unsafe { fill_init(rows, &out) };
        }
        if a.mr == 0 {
            // SAFETY: the fields' contract (see the type).
            return unsafe { by_matrixmultiply(a, &b, &out) };
        }
        let (mr, nr) = block_shape::<T, B>();
        assert_eq!(a.mr, mr, "A was packed for another backend");
        let panels = len.div_ceil(nr);
        for r0 in (0..depth).step_by(KC) {
            let kc = KC.min(depth - r0);
            let size = panels * kc * nr;
            let block: &[T] = match &mut b {
                Operand::Unpacked(m, bp) => {
                    let block = line_aligned(bp, size);
                    pack_b(be, *m, r0, kc, len, block);
                    block
                }
                Operand::Packed(p) => {
                    assert_eq!(p.nr, nr, "B was packed for another backend");
                    &p.packed()[r0 * panels * nr..][..size]
                }
            };
            let depth_block = DepthBlock {
                a,
                r0,
                kc,
                b: block,
            };
            // SAFETY: the fields' contract; `block` is the packed depth block r0 .. r0 + kc.
            unsafe { update(be, depth_block, &out) };
        }
    }
}

/// The product by matrixmultiply, from row-major `A` (and `B`, when packed).
///
/// # Safety
/// As [`Product`].
unsafe fn by_matrixmultiply<T: Float>(a: &PackedA<T>, b: &Operand<'_, T>, out: &Out<'_, T>) {
    let (rows, depth, len) = (a.rows, a.depth, out.len);
    let (bp, rsb, csb) = match b {
        Operand::Unpacked(m, _) => (m.data.as_ptr(), m.rs, m.cs),
        Operand::Packed(p) => {
            assert_eq!(p.nr, 0, "B was packed for another backend");
            (p.packed().as_ptr(), p.len, 1)
        }
    };
    let beta = match out.init {
        Init::Bias(_) => {
            // SAFETY: the fields' contract.
            unsafe { fill_init(rows, out) };
            T::ONE
        }
        Init::Zero => T::ZERO,
        Init::Accumulate => T::ONE,
    };
    debug_assert!(a.data.len() >= rows * depth);
    // SAFETY: A is rows x depth row-major (`repack` with mr = 0), B depth x len through its
    // strides (checked by `multiply` / `PackedB::pack`), C the caller's own region.
    unsafe {
        T::gemm(
            [rows, depth, len],
            T::ONE,
            Strided {
                ptr: a.data.as_ptr(),
                rows: depth as isize,
                cols: 1,
            },
            Strided {
                ptr: bp,
                rows: rsb as isize,
                cols: csb as isize,
            },
            beta,
            Strided {
                ptr: out.c,
                rows: out.ldc as isize,
                cols: 1,
            },
        )
    }
}

/// `c = init` for a product of depth 0.
///
/// # Safety
/// `out.c` addresses `rows` rows of `out.len` writable elements at stride `out.ldc`.
unsafe fn fill_init<T: Float>(rows: usize, out: &Out<'_, T>) {
    for o in 0..rows {
        let v = match out.init {
            Init::Bias(bias) => bias[o],
            Init::Zero => T::ZERO,
            Init::Accumulate => continue,
        };
        for q in 0..out.len {
            // SAFETY: o < rows, q < len: inside the caller's region.
            unsafe { *out.c.add(o * out.ldc + q) = v };
        }
    }
}

/// What a register block's accumulators start from.
#[derive(Clone, Copy)]
enum Start<'a, T> {
    /// The bias of each live row (first depth block).
    Bias(&'a [T]),
    /// Zero (first depth block, no bias).
    Zero,
    /// The partial sums already in `C` (later depth blocks).
    Load,
}

/// Bytes of the operand that the inner two loops of [`update`] sweep repeatedly: below L2 on
/// every target.
///
/// Where `C` is only written (the forward, the column gradient), each `B` panel meets every
/// `A` micro-panel of a chunk of `A` rows before the next panel starts: a tall `A` (W4's
/// column gradient in the since-deleted channel-major `f64` path, 4.7 MB packed) then streams from L3
/// once per depth block instead of once per `B` panel. Where `C` accumulates (the weight
/// gradient's partials, read and written per tile), each `A` micro-panel meets every `B`
/// panel of a chunk of `B` columns, so `C` is walked row after row. Measured on an Intel Xeon
/// with AVX-512 (`cpu family 6`, 2 MB L2 per core), against one order (B panel outer, every
/// row of `A` inner) for all: `gemm_shapes_timing`, 1 thread, the column gradient AVX-512
/// `f64` 70 -> 84-85 GFLOP/s, AVX2 `f64` 33 -> 49; `isa_probe`, 2 threads, full backward,
/// min of 3-4 alternating rounds: `f32` AVX-512 W2 38.1 -> 35.6 ms, W4 87.7 -> 82.6, AVX2 W2
/// 59.1 -> 55.7, W4 133 -> 122; `f64` AVX-512 W2 83.3 -> 78.1, W4 217 -> 196, AVX2 W4 340 ->
/// 303; forwards level. The second order for every product lost the forward (W4 `f32`
/// 37.2 -> 43.7 ms).
const CHUNK_BYTES: usize = 256 << 10;

/// One depth block of a product: rows `r0 .. r0 + kc` of `B`, packed as `ceil(len / NR)`
/// panels of `kc x NR`, and the matching columns of the packed `A`.
#[derive(Clone, Copy)]
struct DepthBlock<'d, T: Float> {
    a: &'d PackedA<T>,
    r0: usize,
    kc: usize,
    b: &'d [T],
}

/// `C (+)= A[.., r0 .. r0 + kc] · B[r0 .. r0 + kc, ..]` for one depth block.
///
/// # Safety
/// `out` as in [`Product`].
#[inline(always)]
unsafe fn update<B: Backend, T: Element + Float>(be: B, d: DepthBlock<'_, T>, out: &Out<'_, T>) {
    let (mr, nr) = block_shape::<T, B>();
    let (rows, len, kc) = (d.a.rows, out.len, d.kc);
    debug_assert_eq!(d.b.len(), len.div_ceil(nr) * kc * nr);
    let micro_panels = rows.div_ceil(mr);
    let panels = len.div_ceil(nr);
    if matches!(out.init, Init::Accumulate) {
        let chunk = (CHUNK_BYTES / (kc * nr * size_of::<T>())).max(1);
        for first in (0..panels).step_by(chunk) {
            for p in 0..micro_panels {
                for jp in first..panels.min(first + chunk) {
                    // SAFETY: p < micro_panels, jp < panels; the caller's contract.
                    unsafe { register_block(be, d, out, (p, jp)) };
                }
            }
        }
    } else {
        let chunk = (CHUNK_BYTES / (kc * mr * size_of::<T>())).max(1);
        for first in (0..micro_panels).step_by(chunk) {
            for jp in 0..panels {
                for p in first..micro_panels.min(first + chunk) {
                    // SAFETY: p < micro_panels, jp < panels; the caller's contract.
                    unsafe { register_block(be, d, out, (p, jp)) };
                }
            }
        }
    }
}

/// The register block `(p, jp)`: micro-panel `p` of `A` and panel `jp` of `B`, in one depth
/// block.
///
/// # Safety
/// `p < ceil(rows / MR)`, `jp < ceil(len / NR)`; `out` as in [`Product`].
#[inline(always)]
unsafe fn register_block<B: Backend, T: Element + Float>(
    be: B,
    d: DepthBlock<'_, T>,
    out: &Out<'_, T>,
    (p, jp): (usize, usize),
) {
    let (mr, nr) = block_shape::<T, B>();
    let n = <T::V<B> as Lanes<T, B>>::N;
    let DepthBlock { a, r0, kc, b } = d;
    let (rows, depth, len) = (a.rows, a.depth, out.len);
    let panel = &b[jp * kc * nr..][..kc * nr];
    let q0 = jp * nr;
    let width = nr.min(len - q0);
    let live = mr.min(rows - p * mr);
    let ap = &a.data[(p * depth + r0) * mr..][..kc * mr];
    let start = match (r0, out.init) {
        (0, Init::Bias(bias)) => Start::Bias(&bias[p * mr..][..live]),
        (0, Init::Zero) => Start::Zero,
        _ => Start::Load,
    };
    let c = Tile {
        // SAFETY: row p * MR and column q0 < len lie in the caller's region.
        c: unsafe { out.c.add(p * mr * out.ldc + q0) },
        ldc: out.ldc,
        live,
        width,
    };
    // SAFETY: rows p*MR .. + live < rows and columns q0 .. + width <= len lie in the
    // caller's region; `ap` holds kc x MR and `panel` kc x NR values.
    unsafe {
        match (mr, width.div_ceil(n)) {
            (8, 3) => block::<B, T, 8, 3>(be, kc, ap, panel, c, start),
            (8, 2) => block::<B, T, 8, 2>(be, kc, ap, panel, c, start),
            (8, _) => block::<B, T, 8, 1>(be, kc, ap, panel, c, start),
            (6, 2) => block::<B, T, 6, 2>(be, kc, ap, panel, c, start),
            (6, _) => block::<B, T, 6, 1>(be, kc, ap, panel, c, start),
            (4, 4) => block::<B, T, 4, 4>(be, kc, ap, panel, c, start),
            (4, 3) => block::<B, T, 4, 3>(be, kc, ap, panel, c, start),
            (4, 2) => block::<B, T, 4, 2>(be, kc, ap, panel, c, start),
            (4, _) => block::<B, T, 4, 1>(be, kc, ap, panel, c, start),
            _ => unreachable!("no register kernel for {mr} rows"),
        }
    }
}

/// A register block's part of `C`: `live` rows of `width` elements at stride `ldc`.
#[derive(Clone, Copy)]
struct Tile<T> {
    c: *mut T,
    ldc: usize,
    live: usize,
    width: usize,
}

impl<T: Float> Tile<T> {
    /// Row `i`, vector `v` of `C` (`N` wide, fewer in the last vector of the row).
    ///
    /// # Safety
    /// `i < live`, `v * N < width`; the tile is the caller's writable region.
    #[inline(always)]
    unsafe fn part<'t>(self, i: usize, v: usize, n: usize) -> &'t mut [T] {
        debug_assert!(i < self.live && v * n < self.width);
        let len = n.min(self.width - v * n);
        // SAFETY: row i < live, columns v * N .. + len <= width: inside the region.
        unsafe { std::slice::from_raw_parts_mut(self.c.add(i * self.ldc + v * n), len) }
    }
}

/// The register kernel: `C[i, q] (+)= sum_k a[k * MR + i] * b[k * NR + q]` for `i < live`,
/// `q < width`, with `NV` vectors of columns (`width <= NV * N`, the last vector partial).
///
/// # Safety
/// `a` holds `kc * MR` and `b` `kc * NR` values; `c` addresses `live` rows of `width`
/// writable elements at stride `ldc`, the caller's own.
#[inline(always)]
unsafe fn block<B: Backend, T: Element + Float, const MR: usize, const NV: usize>(
    be: B,
    kc: usize,
    a: &[T],
    b: &[T],
    c: Tile<T>,
    start: Start<'_, T>,
) {
    let n = <T::V<B> as Lanes<T, B>>::N;
    let nr = block_shape::<T, B>().1;
    debug_assert!(a.len() >= kc * MR && b.len() >= kc * nr && NV * n <= nr);
    debug_assert!(c.live <= MR && c.width <= NV * n && c.width > (NV - 1) * n);
    // A macro, not a closure: out of line a closure loses the backend's features.
    macro_rules! load {
        ($i:expr, $v:expr) => {{
            let (i, v) = ($i, $v);
            // SAFETY: i < live, v < NV with (NV - 1) * N < width (the caller's tile).
            let part = unsafe { c.part(i, v, n) };
            if part.len() == n {
                T::V::<B>::load(be, part)
            } else {
                T::V::<B>::load_partial(be, part)
            }
        }};
    }
    let mut acc = [[T::V::<B>::splat(be, T::ZERO); NV]; MR];
    match start {
        Start::Bias(bias) => {
            for (row, &x) in acc.iter_mut().zip(bias) {
                *row = [T::V::<B>::splat(be, x); NV];
            }
        }
        Start::Zero => {}
        Start::Load => {
            for (i, row) in acc.iter_mut().enumerate().take(c.live) {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = load!(i, v);
                }
            }
        }
    }
    // One depth step: NV vector loads of `B`, MR broadcasts of `A`, MR x NV multiply-adds.
    // Unrolled by four by hand: the iterator loop ran at 166-171 GFLOP/s on cache-resident
    // operands, this at 173-179 (AVX-512 f32, Intel Xeon, 1 thread, `gemm_kernel_probe`).
    macro_rules! step {
        ($k:expr) => {{
            let k = $k;
            // SAFETY: k < kc, a holds kc * MR and b kc * NR values.
            let (ak, bk) = unsafe {
                (
                    a.get_unchecked(k * MR..(k + 1) * MR),
                    b.get_unchecked(k * nr..(k + 1) * nr),
                )
            };
            let mut bv = [T::V::<B>::splat(be, T::ZERO); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = T::V::<B>::load(be, &bk[v * n..]);
            }
            for (row, &ai) in acc.iter_mut().zip(ak) {
                let av = T::V::<B>::splat(be, ai);
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = av.mul_add(bx, *x);
                }
            }
        }};
    }
    let mut k = 0;
    while k + 4 <= kc {
        step!(k);
        step!(k + 1);
        step!(k + 2);
        step!(k + 3);
        k += 4;
    }
    while k < kc {
        step!(k);
        k += 1;
    }
    for (i, row) in acc.iter().enumerate().take(c.live) {
        for (v, x) in row.iter().enumerate() {
            // SAFETY: i < live, v < NV with (NV - 1) * N < width.
            let part = unsafe { c.part(i, v, n) };
            if part.len() == n {
                x.store(part)
            } else {
                x.store_partial(part)
            }
        }
    }
}
