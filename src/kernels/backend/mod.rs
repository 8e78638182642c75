//! The instruction set the kernels run on, chosen once per process and passed to each call as
//! a backend value.
//!
//! A kernel is written once, generic over a [`Backend`] and over the element type (through
//! [`Element`], which `f32` and `f64` implement): it works on the backend's vectors
//! ([`Lanes`]) and runs through [`dispatch`], which calls it inside a function compiled with
//! the backend's CPU features, so the generic code is inlined there and compiled for them.
//!
//! A backend value (a token) can only be made when its CPU features exist: [`Avx512::new`] and
//! [`Avx2::new`] check them; [`Portable`] (the `wide` crate: NEON on aarch64, SSE on plain
//! x86_64) and [`Scalar`] (one lane) run anywhere. The vector types of the x86 backends have
//! private fields and are built only from a token, so a vector value proves the features.
//!
//! The traits are `pub` only so that the sealed [`crate::Float`] can require [`Element`];
//! this module is private to the crate.
//!
//! Every backend does plain IEEE multiplies and adds, so a kernel that does the same operations
//! in the same order gives the same bits on every backend. The one exception is
//! [`Lanes::mul_add`], the GEMM's step, which is fused where the backend has FMA: a product
//! depends on the backend (never on the thread count or the tiling).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
mod scalar;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;
pub(crate) use portable::Portable;
pub(crate) use scalar::Scalar;

use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction sets, in increasing order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// One lane, plain code.
    Scalar,
    /// The `wide` crate's vectors, compiled for the target's baseline features.
    Portable,
    /// AVX2 with FMA (x86_64).
    Avx2,
    /// AVX-512F (x86_64).
    Avx512,
}

impl Isa {
    /// The name `DEFORMCONV_ISA` and `DEFORMCONV_EXPECT_ISA` use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    fn from_name(name: &str) -> Option<Isa> {
        [Isa::Scalar, Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .find(|isa| isa.name() == name)
    }
}

/// The instruction set the kernels use: the best the CPU has, capped by `DEFORMCONV_ISA`
/// (see [`capped`]), detected once and cached.
pub(crate) fn isa() -> Isa {
    static CACHE: AtomicU8 = AtomicU8::new(0);
    const ALL: [Isa; 4] = [Isa::Scalar, Isa::Portable, Isa::Avx2, Isa::Avx512];
    match CACHE.load(Ordering::Relaxed) {
        0 => {
            let found = capped(detected());
            CACHE.store(found as u8 + 1, Ordering::Relaxed);
            found
        }
        code => ALL[usize::from(code - 1)],
    }
}

/// The best instruction set this CPU has.
fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if Avx512::new().is_some() {
            return Isa::Avx512;
        }
        if Avx2::new().is_some() {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// `detected`, lowered to the cap named by the environment variable `DEFORMCONV_ISA`
/// (`avx512`, `avx2`, `portable` or `scalar`; anything else, or unset, leaves it as detected).
/// It lets one machine run the whole test suite on every code path (CI does), and users
/// compare paths.
fn capped(detected: Isa) -> Isa {
    match std::env::var("DEFORMCONV_ISA")
        .ok()
        .as_deref()
        .and_then(Isa::from_name)
    {
        Some(cap) => detected.min(cap),
        None => detected,
    }
}

/// A set of CPU features, as a value that exists only when the CPU has them.
pub trait Backend: Copy + Send + Sync + 'static {
    /// Which instruction set this is.
    const ISA: Isa;
    /// Whether the crate's GEMM kernel ([`crate::kernels::gemm`]) runs on this backend;
    /// otherwise matrixmultiply's does (where a benchmark says it wins).
    const OWN_GEMM: bool;
    /// The `f32` vector.
    type F32: Lanes<f32, Self>;
    /// The `f64` vector.
    type F64: Lanes<f64, Self>;

    /// `op.run(self)`, called from a function compiled with this backend's features (so that
    /// `op`'s `#[inline(always)]` code is compiled for them).
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output;
}

/// A vector of `N` values of `T` on backend `B`. Lane arithmetic is IEEE, one rounding per
/// operation (no fused multiply-add).
pub trait Lanes<T: Copy + Default, B: Backend>: Copy {
    /// The number of lanes.
    const N: usize;
    /// Every lane `v`.
    fn splat(b: B, v: T) -> Self;
    /// Lanes `src[..N]` (`src.len() >= N`, checked).
    fn load(b: B, src: &[T]) -> Self;
    /// Lanes `src[..src.len()]` and zeros after (`src.len() < N`, checked in debug builds).
    fn load_partial(b: B, src: &[T]) -> Self;
    /// Writes the lanes to `dst[..N]` (`dst.len() >= N`, checked).
    fn store(self, dst: &mut [T]);
    /// Writes the first `dst.len()` lanes to `dst` (`dst.len() < N`, checked in debug builds).
    fn store_partial(self, dst: &mut [T]);
    /// `self + o` per lane.
    fn add(self, o: Self) -> Self;
    /// `self - o` per lane.
    fn sub(self, o: Self) -> Self;
    /// `self * o` per lane.
    fn mul(self, o: Self) -> Self;
    /// `self * m + a` per lane: one rounding where the backend has FMA (AVX-512, AVX2, and
    /// `wide` where the target has it), two elsewhere; the same for every call on a backend.
    fn mul_add(self, m: Self, a: Self) -> Self;
    /// `floor` per lane (exact; NaN and infinities stay).
    fn floor(self) -> Self;
    /// `|self|` per lane.
    fn abs(self) -> Self;
    /// Per lane `if self < o { yes } else { no }`, an ordered compare (false for NaN).
    fn lt_select(self, o: Self, yes: Self, no: Self) -> Self;
    /// Writes the first `dst.len() <= N` lanes (`dst.len() <= N`, checked), each an integer of
    /// magnitude below `2^31`, as `i32` (another value gives some `i32`).
    fn store_i32(self, dst: &mut [i32]);

    /// Transposes the `N x N` block `rows` (row `i` = `rows[i]`, `rows.len() == N`, checked)
    /// in place: afterwards `rows[j]` lane `i` is what was `rows[i]` lane `j`. It only moves
    /// values, so it is exact. Through memory, element by element, unless a backend has
    /// register shuffles.
    #[inline(always)]
    fn transpose(b: B, rows: &mut [Self]) {
        let n = Self::N;
        assert!(rows.len() == n && n <= 16);
        let mut block = [T::default(); 256];
        for (i, r) in rows.iter().enumerate() {
            r.store(&mut block[i * n..][..n]);
        }
        for (j, r) in rows.iter_mut().enumerate() {
            let mut column = [T::default(); 16];
            for (i, v) in column[..n].iter_mut().enumerate() {
                *v = block[i * n + j];
            }
            *r = Self::load(b, &column[..n]);
        }
    }

    /// Rows of the GEMM's register block ([`crate::kernels::gemm`]).
    const GEMM_ROWS: usize;
    /// Vectors of columns of the GEMM's register block: `GEMM_ROWS * GEMM_VECTORS`
    /// accumulators, the `B` vectors and a broadcast fill the register file.
    const GEMM_VECTORS: usize;

    /// Writes the `N x N` transpose of the block whose row `i < rows` is
    /// `src[i * stride ..][..N]` (rows past `rows` read as zero) to `dst`, row `k` at
    /// `dst[k * ld ..][..N]`: exact copies, through [`Lanes::transpose`] (in registers where
    /// the backend has shuffles). Measured on an AMD Zen 4 (`gemm_shapes_timing`: the weight
    /// gradient's product `256 x 512 x 2304`, whose `B` is packed from its transpose, AVX2,
    /// 1 thread, 3 alternating rounds): 87.6-91.1 -> 90.3-97.3 GFLOP/s against copying element
    /// by element. AVX-512 keeps its own form (raw loads and stores): this one measured
    /// 84-96 against its 93-100 GFLOP/s there.
    ///
    /// # Panics
    /// If `rows` is not in `1..=N` or a row lies outside its slice.
    #[inline(always)]
    fn transpose_block(b: B, src: &[T], stride: usize, rows: usize, dst: &mut [T], ld: usize) {
        let n = Self::N;
        assert!((1..=n).contains(&rows) && n <= 16);
        let zero = Self::splat(b, T::default());
        let mut block = [zero; 16];
        for (i, v) in block[..rows].iter_mut().enumerate() {
            *v = Self::load(b, &src[i * stride..]);
        }
        Self::transpose(b, &mut block[..n]);
        for (k, v) in block[..n].iter().enumerate() {
            v.store(&mut dst[k * ld..]);
        }
    }
}

/// A matrix in memory for [`Element::gemm`]: element `(i, j)` at `ptr + i * rows + j * cols`
/// (strides in elements, as matrixmultiply takes them).
#[derive(Debug, Clone, Copy)]
pub struct Strided<P> {
    /// Element `(0, 0)`.
    pub ptr: P,
    /// Stride between rows.
    pub rows: isize,
    /// Stride between columns.
    pub cols: isize,
}

/// An element type with a vector on every backend: `f32` and `f64`.
///
/// The `as_f32` family hands generic code its `f32`-only kernels: each returns its argument
/// unchanged when `Self` is `f32` and `None` when it is `f64` (decided at compile time).
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// The vector of this type on backend `B`.
    type V<B: Backend>: Lanes<Self, B>;
    /// Whether this is `f32`.
    const IS_F32: bool;

    /// `s` as `f32` values, when `Self` is `f32`.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// `s` as `f32` values, when `Self` is `f32`.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;

    /// `C = alpha A·B + beta C` with `[m, k, n]` = `dims`, `A: m x k`, `B: k x n`, `C: m x n`,
    /// by matrixmultiply's kernel for this type. With `beta == 0`, `C` is overwritten and may
    /// hold anything (even NaN) beforehand.
    ///
    /// # Safety
    /// The pointers with their strides must address valid, initialised matrices of the given
    /// sizes; `C` must not overlap `A` or `B` and must be exclusively borrowed.
    unsafe fn gemm(
        dims: [usize; 3],
        alpha: Self,
        a: Strided<*const Self>,
        b: Strided<*const Self>,
        beta: Self,
        c: Strided<*mut Self>,
    );
}

/// [`Element::gemm`] for one type by matrixmultiply's function `$gemm`.
macro_rules! matrixmultiply_gemm {
    ($gemm:path) => {
        #[inline]
        unsafe fn gemm(
            [m, k, n]: [usize; 3],
            alpha: Self,
            a: Strided<*const Self>,
            b: Strided<*const Self>,
            beta: Self,
            c: Strided<*mut Self>,
        ) {
            // SAFETY: forwarded verbatim; the caller upholds matrixmultiply's contract (valid
            // strided matrices, C exclusive and disjoint from A and B).
            unsafe {
                $gemm(
                    m, k, n, alpha, a.ptr, a.rows, a.cols, b.ptr, b.rows, b.cols, beta, c.ptr,
                    c.rows, c.cols,
                )
            }
        }
    };
}

impl Element for f32 {
    type V<B: Backend> = B::F32;
    const IS_F32: bool = true;
    matrixmultiply_gemm!(matrixmultiply::sgemm);

    #[inline(always)]
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    #[inline(always)]
    fn as_f32_mut(s: &mut [f32]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Element for f64 {
    type V<B: Backend> = B::F64;
    const IS_F32: bool = false;
    matrixmultiply_gemm!(matrixmultiply::dgemm);

    #[inline(always)]
    fn as_f32(_: &[f64]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn as_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
        None
    }
}

/// A kernel call that is generic over the backend; run it with [`dispatch`].
///
/// The kernel gets the backend's features only by being inlined into [`Backend::vectorize`]'s
/// `#[target_feature]` function, so everything it calls with vectors must be inlined too:
/// `#[inline(always)]` functions, loops and macros, never a closure (`std::array::from_fn`,
/// `Option::map`, iterator adapters). Whether the compiler inlines a closure depends on what
/// else the calling program instantiates: with `std::array::from_fn` in the fused backward
/// pass, a program using only `f32` ran W1's AVX2 backward in 5.5 ms against 2.4 ms in one
/// that also used `f64` (1 thread, AMD Zen 4), the closure's loads being calls.
pub trait WithBackend {
    /// What the kernel returns.
    type Output;
    /// The kernel on backend `b`; mark it `#[inline(always)]` so that it is compiled with the
    /// backend's features.
    fn run<B: Backend>(self, b: B) -> Self::Output;
}

/// Runs `op` on the backend of [`isa`].
#[inline(always)]
pub(crate) fn dispatch<O: WithBackend>(op: O) -> O::Output {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` returns Avx512 only after `Avx512::new` found the features.
        Isa::Avx512 => unsafe { Avx512::new_unchecked() }.vectorize(op),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` returns Avx2 only after `Avx2::new` found the features.
        Isa::Avx2 => unsafe { Avx2::new_unchecked() }.vectorize(op),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx512 | Isa::Avx2 => unreachable!("x86 instruction sets are not detected here"),
        Isa::Portable => Portable::new().vectorize(op),
        Isa::Scalar => Scalar::new().vectorize(op),
    }
}

/// A closure as a [`WithBackend`] that ignores the backend.
struct Plain<F>(F);

impl<R, F: FnOnce() -> R> WithBackend for Plain<F> {
    type Output = R;
    #[inline(always)]
    fn run<B: Backend>(self, _: B) -> R {
        (self.0)()
    }
}

/// Runs `f` compiled with the features of the backend of [`isa`] (so that, say, `floor` and
/// float comparisons in scalar code become single instructions instead of library calls);
/// mark the closure `#[inline(always)]`.
#[inline(always)]
pub(crate) fn with_features<R>(f: impl FnOnce() -> R) -> R {
    dispatch(Plain(f))
}
