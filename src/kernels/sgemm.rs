//! The `f32` GEMM of the fast path on AVX-512F: `C = bias + A · B` with `A` (the weight of one
//! conv group, `rows x depth`) packed once per call and `B` (a column tile, `depth x len`)
//! packed per tile.
//!
//! Why our own: matrixmultiply repacks `A` on every call, and the forward calls the GEMM once
//! per tile, so on the ResNet res5 layer (a 9.4 MB weight, 49 pixels per image) it spent most
//! of its time packing. Here the weight is packed once and shared by every tile and thread.
//!
//! Blocking: depth in blocks of [`KC`]; for each block the tile's `B` rows are packed into
//! panels of [`NR`] columns (`[panel][k][NR]`, zero padded), then every `MR x NR` block of `C`
//! is updated by the register kernel ([`MR`] rows x 3 vectors of 16 columns, 24 accumulators),
//! the `A` micro-panel (`KC x MR`, 8 KiB) staying in L1 while the `B` panels stream from L2.
//!
//! Arithmetic: every `C` element is one chain of fused multiply-adds, `c = bias` (or 0), then
//! `c = fma(a[o, r], b[r, q], c)` for `r = 0, 1, .., depth - 1` in order (a block boundary
//! stores and reloads `c` exactly). It does not depend on the tile, the panel or the lane an
//! element falls in, so the result is independent of how the work is split.

use std::arch::x86_64::*;

/// Rows of `C` per register block.
pub(crate) const MR: usize = 8;
/// Columns of `C` per register block: three AVX-512 vectors of `f32`.
pub(crate) const NR: usize = 48;
/// Depth per block: the `A` micro-panel `KC x MR` and one `B` panel `KC x NR` fit L1.
const KC: usize = 256;
/// `f32` lanes per vector.
const LANES: usize = 16;

/// One conv group's weight, `rows x depth` row-major, packed as `ceil(rows / MR)` panels of
/// `depth x MR` (`panel[r * MR + i] = a[(p * MR + i) * depth + r]`, rows past `rows` zero).
#[derive(Debug)]
pub(crate) struct PackedA {
    data: Vec<f32>,
    rows: usize,
    depth: usize,
}

impl PackedA {
    /// Packs `a` (`rows x depth`, row-major).
    pub(crate) fn pack(a: &[f32], rows: usize, depth: usize) -> Self {
        assert!(
            a.len() >= rows * depth,
            "packed weight shorter than rows x depth"
        );
        Self::pack_strided(a, rows, depth, depth, 1)
    }

    /// Packs the `rows x depth` matrix with element `(o, r)` at `a[o * rs + r * cs]` (so a
    /// transposed view packs without a copy).
    pub(crate) fn pack_strided(a: &[f32], rows: usize, depth: usize, rs: usize, cs: usize) -> Self {
        let mut packed = PackedA {
            data: crate::scratch::take_empty(rows.div_ceil(MR) * depth * MR),
            rows: 0,
            depth: 0,
        };
        packed.repack(a, rows, depth, rs, cs);
        packed
    }

    /// [`PackedA::pack_strided`] into this value's storage (reused across calls). Large
    /// matrices are packed in parallel, panel by panel (the result does not depend on it).
    pub(crate) fn repack(&mut self, a: &[f32], rows: usize, depth: usize, rs: usize, cs: usize) {
        use rayon::prelude::*;
        assert!(
            rows == 0 || depth == 0 || a.len() > (rows - 1) * rs + (depth - 1) * cs,
            "packed matrix outside its slice"
        );
        let panels = rows.div_ceil(MR);
        self.data.clear();
        self.data.resize(panels * depth * MR, 0.0);
        (self.rows, self.depth) = (rows, depth);
        let fill = |(p, panel): (usize, &mut [f32])| {
            let live = MR.min(rows - p * MR);
            let base = p * MR * rs;
            for (r, dst) in panel.chunks_exact_mut(MR).enumerate() {
                for (i, d) in dst.iter_mut().enumerate().take(live) {
                    *d = a[base + i * rs + r * cs];
                }
            }
        };
        let chunk = (depth * MR).max(1);
        if self.data.len() >= 1 << 18 {
            self.data.par_chunks_mut(chunk).enumerate().for_each(fill);
        } else {
            self.data.chunks_mut(chunk).enumerate().for_each(fill);
        }
    }
}

impl Drop for PackedA {
    /// The storage goes back to this thread's scratch cache (a packed weight is megabytes,
    /// allocated on every call).
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.data));
    }
}

/// The `B` operand: `depth x len` with element `(r, q)` at `data[r * rs + q * cs]` (a column
/// tile has `cs = 1`; the transposed tile of the weight gradient has `rs = 1`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatB<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

/// What the sums start from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init<'a> {
    /// `bias[o]` for row `o` (`C` is only written).
    Bias(&'a [f32]),
    /// Zero (`C` is only written).
    Zero,
    /// The values already in `C` (`C += A · B`).
    Accumulate,
}

/// Copies rows `r0 .. r0 + kc`, columns `0 .. len` of `b` into panels of [`NR`] columns,
/// `[panel][k][NR]`, zero past `len`. Every element of `out` (`ceil(len / NR) * kc * NR`
/// values) is written.
#[target_feature(enable = "avx512f")]
fn pack_b(b: MatB<'_>, r0: usize, kc: usize, len: usize, out: &mut [f32]) {
    let panels = len.div_ceil(NR);
    assert_eq!(out.len(), panels * kc * NR);
    for p in 0..panels {
        let (q0, width) = (p * NR, NR.min(len - p * NR));
        let panel = &mut out[p * kc * NR..][..kc * NR];
        if b.cs == 1 {
            // Three masked vector copies a row, the zero padding included: `copy_from_slice`
            // called memcpy for every 48-float row (W1 dense forward, 1 thread: 17% of the time
            // in memcpy; 0.63 -> 0.56 ms).
            for (k, dst) in panel.chunks_exact_mut(NR).enumerate() {
                let src = &b.data[(r0 + k) * b.rs + q0..][..width];
                for v in 0..NR / LANES {
                    let lanes = crate::kernels::transpose::first_lanes(
                        width.saturating_sub(v * LANES).min(LANES),
                    );
                    // SAFETY: the live lanes are columns v * 16 .. < width of `src` (the address
                    // is formed by wrapping_add: with no live lane it may lie past `src`, and
                    // is not read); the store covers dst[v * 16 ..][..16], inside the row.
                    unsafe {
                        let x = _mm512_maskz_loadu_ps(lanes, src.as_ptr().wrapping_add(v * LANES));
                        _mm512_storeu_ps(dst.as_mut_ptr().add(v * LANES), x);
                    }
                }
            }
            continue;
        }
        // Transposed B (the weight gradient's `colsᵀ`, `rs = 1`): 16 x 16 blocks by register
        // transposes (a last block of fewer columns padded with zero rows), the last rows
        // element by element. Measured on W4 (1 thread): the element-wise copy was 13% of the
        // backward; on W1 the padding columns alone were a sixth of the GEMM time.
        for dst in panel.chunks_exact_mut(NR) {
            dst[width..].fill(0.0);
        }
        let full_k = if b.rs == 1 { kc / LANES * LANES } else { 0 };
        for j0 in (0..width).step_by(LANES) {
            let nj = LANES.min(width - j0);
            // Columns j0 + nj .. j0 + 16 past `width` are zero padding, inside the panel: a
            // partial block is the last one, and width <= NR - 16 when it is partial.
            debug_assert!(nj == LANES || j0 + LANES <= NR);
            for k0 in (0..full_k).step_by(LANES) {
                let src = &b.data[(q0 + j0) * b.cs + r0 + k0..];
                transpose16(src, b.cs, nj, &mut panel[k0 * NR + j0..], NR);
            }
            for j in j0..j0 + nj {
                let col = &b.data[(q0 + j) * b.cs..];
                for k in full_k..kc {
                    panel[k * NR + j] = col[(r0 + k) * b.rs];
                }
            }
        }
    }
}

/// Writes the transpose of the 16 x 16 block whose row `i < rows` is
/// `src[i * stride ..][..16]` (rows past `rows` zero) to `dst`, row `k` at
/// `dst[k * ld ..][..16]` (exact copies: only permutes).
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(src: &[f32], stride: usize, rows: usize, dst: &mut [f32], ld: usize) {
    assert!(dst.len() >= (LANES - 1) * ld + LANES);
    assert!((1..=LANES).contains(&rows) && src.len() >= (rows - 1) * stride + LANES);
    let mut r: [__m512; LANES] = std::array::from_fn(|i| {
        if i < rows {
            // SAFETY: row i < rows ends at i * stride + 16 <= src.len() (asserted above).
            unsafe { _mm512_loadu_ps(src.as_ptr().add(i * stride)) }
        } else {
            _mm512_setzero_ps()
        }
    });
    // SAFETY: AVX-512F (this function is compiled for it and only called from AVX-512 code).
    unsafe { super::transpose::transpose16(&mut r) };
    for (k, v) in r.iter().enumerate() {
        // SAFETY: k * ld + 16 <= dst.len() (asserted above).
        unsafe { _mm512_storeu_ps(dst[k * ld..][..LANES].as_mut_ptr(), *v) };
    }
}

/// `c[o * ldc + q] = init[o, q] + sum_r a[o, r] * b[r, q]` for `o < rows`, `q < len`, with
/// `init` the bias, zero (then `c` is never read) or `c` itself. `bp` is the caller's
/// reusable buffer for the packed `B` block.
///
/// # Safety
/// The CPU must support AVX-512F. `b` holds `a`'s depth rows of `len` columns (checked in
/// debug builds); `c` addresses `rows` rows of `len` writable elements at stride `ldc`, owned
/// by the caller for the duration of the call and disjoint from `b` and the bias.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn multiply(
    a: &PackedA,
    b: MatB<'_>,
    len: usize,
    init: Init<'_>,
    c: *mut f32,
    ldc: usize,
    bp: &mut Vec<f32>,
) {
    debug_assert!(
        len == 0 || a.depth == 0 || b.data.len() > (a.depth - 1) * b.rs + (len - 1) * b.cs
    );
    // SAFETY: the caller's contract.
    unsafe { product(a, Operand::Unpacked(b, bp), len, init, c, ldc) }
}

/// Where [`product`] takes the packed depth blocks of `B` from.
enum Operand<'a> {
    /// Packed block by block into the buffer.
    Unpacked(MatB<'a>, &'a mut Vec<f32>),
    /// Packed already.
    Packed(&'a PackedB),
}

/// The body of [`multiply`] and [`multiply_packed`].
///
/// # Safety
/// As [`multiply`].
#[target_feature(enable = "avx512f")]
unsafe fn product(
    a: &PackedA,
    mut b: Operand<'_>,
    len: usize,
    init: Init<'_>,
    c: *mut f32,
    ldc: usize,
) {
    let (rows, depth) = (a.rows, a.depth);
    debug_assert!(!matches!(init, Init::Bias(bias) if bias.len() < rows));
    if rows == 0 || len == 0 {
        return;
    }
    if depth == 0 {
        // SAFETY: the caller's contract.
        return unsafe { fill_init(rows, len, init, c, ldc) };
    }
    let panels = len.div_ceil(NR);
    for r0 in (0..depth).step_by(KC) {
        let kc = KC.min(depth - r0);
        let size = panels * kc * NR;
        let block: &[f32] = match &mut b {
            Operand::Unpacked(m, bp) => {
                bp.resize(bp.len().max(size), 0.0);
                pack_b(*m, r0, kc, len, &mut bp[..size]);
                &bp[..size]
            }
            Operand::Packed(p) => &p.data[r0 * panels * NR..][..size],
        };
        // SAFETY: the caller's contract; `block` is the packed depth block r0 .. r0 + kc.
        unsafe { update(a, r0, kc, block, len, init, c, ldc) };
    }
}

/// `B` (`depth x len`) packed once for many products: its depth blocks of [`KC`] rows one
/// after the other, each laid out as the GEMM packs a block.
#[derive(Debug)]
pub(crate) struct PackedB {
    data: Vec<f32>,
    depth: usize,
    len: usize,
}

impl PackedB {
    /// Packs the `depth x len` matrix `b`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    ///
    /// # Panics
    /// If `b` does not hold `depth x len` elements.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn pack(b: MatB<'_>, depth: usize, len: usize) -> Self {
        assert!(
            depth == 0 || len == 0 || b.data.len() > (depth - 1) * b.rs + (len - 1) * b.cs,
            "packed B outside its slice"
        );
        let panels = len.div_ceil(NR);
        let mut data = crate::scratch::take::<f32>(panels * NR * depth);
        for r0 in (0..depth).step_by(KC) {
            let kc = KC.min(depth - r0);
            pack_b(
                b,
                r0,
                kc,
                len,
                &mut data[r0 * panels * NR..][..panels * kc * NR],
            );
        }
        PackedB { data, depth, len }
    }

    /// Columns of `B`.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PackedB {
    /// The storage goes back to this thread's scratch cache.
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.data));
    }
}

/// [`multiply`] with a [`PackedB`] (`len` = its columns, no packing per call).
///
/// # Safety
/// As [`multiply`]; `b` has `a`'s depth.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn multiply_packed(
    a: &PackedA,
    b: &PackedB,
    init: Init<'_>,
    c: *mut f32,
    ldc: usize,
) {
    assert_eq!(a.depth, b.depth, "A and B depths differ");
    // SAFETY: the caller's contract.
    unsafe { product(a, Operand::Packed(b), b.len, init, c, ldc) }
}

/// `c = init` for a product of depth 0.
///
/// # Safety
/// `c` addresses `rows` rows of `len` writable elements at stride `ldc`.
unsafe fn fill_init(rows: usize, len: usize, init: Init<'_>, c: *mut f32, ldc: usize) {
    for o in 0..rows {
        let v = match init {
            Init::Bias(bias) => bias[o],
            Init::Zero => 0.0,
            Init::Accumulate => continue,
        };
        for q in 0..len {
            // SAFETY: o < rows, q < len: inside the caller's region.
            unsafe { *c.add(o * ldc + q) = v };
        }
    }
}

/// `C (+)= A[.., r0 .. r0 + kc] · B[r0 .. r0 + kc, ..]` for one packed depth block `bp` of
/// `B` (`ceil(len / NR)` panels of `kc x NR`).
///
/// # Safety
/// AVX-512F; `c` as in [`multiply`].
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn update(
    a: &PackedA,
    r0: usize,
    kc: usize,
    bp: &[f32],
    len: usize,
    init: Init<'_>,
    c: *mut f32,
    ldc: usize,
) {
    let (rows, depth) = (a.rows, a.depth);
    debug_assert_eq!(bp.len(), len.div_ceil(NR) * kc * NR);
    for p in 0..rows.div_ceil(MR) {
        let live = MR.min(rows - p * MR);
        let ap = &a.data[(p * depth + r0) * MR..][..kc * MR];
        let start = match (r0, init) {
            (0, Init::Bias(bias)) => Start::Bias(&bias[p * MR..][..live]),
            (0, Init::Zero) => Start::Zero,
            _ => Start::Load,
        };
        for (jp, panel) in bp.chunks_exact(kc * NR).enumerate() {
            let q0 = jp * NR;
            let width = NR.min(len - q0);
            // SAFETY: block rows p*MR .. + live < rows and columns q0 .. + width <= len
            // lie in the caller's region; `ap` holds kc x MR and `panel` kc x NR values.
            unsafe {
                let cp = c.add(p * MR * ldc + q0);
                match width.div_ceil(LANES) {
                    3 => block::<3>(kc, ap, panel, cp, ldc, live, width, start),
                    2 => block::<2>(kc, ap, panel, cp, ldc, live, width, start),
                    _ => block::<1>(kc, ap, panel, cp, ldc, live, width, start),
                }
            }
        }
    }
}

/// What a register block's accumulators start from.
#[derive(Clone, Copy)]
enum Start<'a> {
    /// The bias of each live row (first depth block).
    Bias(&'a [f32]),
    /// Zero (first depth block, no bias).
    Zero,
    /// The partial sums already in `C` (later depth blocks).
    Load,
}

/// The register kernel: `C[i, q] (+)= sum_k a[k * MR + i] * b[k * NR + q]` for `i < live`,
/// `q < width`, with `NV` vectors of columns (`width <= NV * 16`, the last vector masked).
///
/// # Safety
/// AVX-512F; `a` holds `kc * MR` and `b` at least `kc * NR` values; `c` addresses `live` rows
/// of `width` writable elements at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const NV: usize>(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    live: usize,
    width: usize,
    start: Start<'_>,
) {
    debug_assert!(a.len() >= kc * MR && b.len() >= kc * NR);
    debug_assert!(live <= MR && width <= NV * LANES && width > (NV - 1) * LANES);
    let tail = width - (NV - 1) * LANES;
    let mask = |v: usize| -> __mmask16 {
        if v + 1 == NV {
            ((1u32 << tail) - 1) as __mmask16
        } else {
            0xffff
        }
    };
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    match start {
        Start::Bias(bias) => {
            for i in 0..live {
                acc[i] = [_mm512_set1_ps(bias[i]); NV];
            }
        }
        Start::Zero => {}
        Start::Load => {
            for (i, row) in acc.iter_mut().enumerate().take(live) {
                for (v, x) in row.iter_mut().enumerate() {
                    // SAFETY: row i < live, columns v*16 .. under the mask stay below width.
                    *x = unsafe { _mm512_maskz_loadu_ps(mask(v), c.add(i * ldc + v * LANES)) };
                }
            }
        }
    }
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: bp walks the kc x NR panel, NV * 16 <= NR values per step.
            *x = unsafe { _mm512_loadu_ps(bp.add(v * LANES)) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: ap walks the kc x MR micro-panel, MR values per step.
            let av = _mm512_set1_ps(unsafe { *ap.add(i) });
            for (x, &bx) in row.iter_mut().zip(&bv) {
                *x = _mm512_fmadd_ps(av, bx, *x);
            }
        }
        // SAFETY: one step of each panel; the last step ends one past the panels.
        unsafe {
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
    }
    for (i, row) in acc.iter().enumerate().take(live) {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: row i < live, columns under the mask stay below width (caller's region).
            unsafe { _mm512_mask_storeu_ps(c.add(i * ldc + v * LANES), mask(v), x) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented FMA chain, element by element.
    fn chain(
        a: &[f32],
        b: &[f32],
        bias: Option<&[f32]>,
        rows: usize,
        depth: usize,
        len: usize,
    ) -> Vec<f32> {
        let mut c = vec![0.0f32; rows * len];
        for o in 0..rows {
            for q in 0..len {
                let mut s = bias.map_or(0.0, |b| b[o]);
                for r in 0..depth {
                    s = a[o * depth + r].mul_add(b[r * len + q], s);
                }
                c[o * len + q] = s;
            }
        }
        c
    }

    #[test]
    fn equals_the_fma_chain_bit_for_bit_on_ragged_shapes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        for &(rows, depth, len) in &[
            (1, 1, 1),
            (8, 256, 48),
            (13, 300, 50),
            (3, 517, 17),
            (9, 2, 97),
            (16, 0, 5),
        ] {
            let a: Vec<f32> = (0..rows * depth)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let b: Vec<f32> = (0..depth * len)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 3.0)
                .collect();
            let bias: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25 - 1.0).collect();
            let packed = PackedA::pack(&a, rows, depth);
            for bias in [None, Some(&bias[..])] {
                let mut c = vec![f32::NAN; rows * len];
                let mut bp = Vec::new();
                let init = bias.map_or(Init::Zero, Init::Bias);
                let mb = MatB {
                    data: &b,
                    rs: len,
                    cs: 1,
                };
                // SAFETY: AVX-512F detected; c is rows x len, b depth x len.
                unsafe { multiply(&packed, mb, len, init, c.as_mut_ptr(), len, &mut bp) };
                let want = chain(&a, &b, bias, rows, depth, len);
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{rows}x{depth}x{len}"
                );
            }
        }
    }

    #[test]
    fn transposed_b_accumulates_as_one_chain() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        for (rows, depth, len) in [
            (11, 300, 70),
            (3, 16, 16),
            (9, 529, 145),
            (16, 432, 72),
            (5, 40, 7),
        ] {
            let a: Vec<f32> = (0..rows * depth)
                .map(|i| ((i * 29 % 97) as f32 - 48.0) / 9.0)
                .collect();
            let b: Vec<f32> = (0..depth * len)
                .map(|i| ((i * 31 % 83) as f32 - 41.0) / 5.0)
                .collect();
            // bt[q * depth + r] = b[r * len + q]: B given transposed (rs = 1, cs = depth).
            let mut bt = vec![0.0f32; depth * len];
            for r in 0..depth {
                for q in 0..len {
                    bt[q * depth + r] = b[r * len + q];
                }
            }
            let start: Vec<f32> = (0..rows * len).map(|i| i as f32 * 0.5 - 3.0).collect();
            let packed = PackedA::pack(&a, rows, depth);
            let mut c = start.clone();
            let mut bp = Vec::new();
            let mb = MatB {
                data: &bt,
                rs: 1,
                cs: depth,
            };
            // SAFETY: AVX-512F detected; c is rows x len, bt holds depth x len through (rs, cs).
            unsafe {
                multiply(
                    &packed,
                    mb,
                    len,
                    Init::Accumulate,
                    c.as_mut_ptr(),
                    len,
                    &mut bp,
                )
            };
            for o in 0..rows {
                for q in 0..len {
                    let mut s = start[o * len + q];
                    for r in 0..depth {
                        s = a[o * depth + r].mul_add(b[r * len + q], s);
                    }
                    assert_eq!(
                        c[o * len + q].to_bits(),
                        s.to_bits(),
                        "{rows}x{depth}x{len} ({o}, {q})"
                    );
                }
            }
        }
    }
}
