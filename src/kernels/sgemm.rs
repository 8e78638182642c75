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
        use rayon::prelude::*;
        assert!(
            a.len() >= rows * depth,
            "packed weight shorter than rows x depth"
        );
        let panels = rows.div_ceil(MR);
        let mut data = vec![0.0f32; panels * depth * MR];
        data.par_chunks_mut((depth * MR).max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for i in 0..MR.min(rows - p * MR) {
                    let row = &a[(p * MR + i) * depth..][..depth];
                    for (r, &v) in row.iter().enumerate() {
                        panel[r * MR + i] = v;
                    }
                }
            });
        PackedA { data, rows, depth }
    }
}

/// Copies rows `r0 .. r0 + kc`, columns `0 .. len` of `b` (row stride `ldb`) into panels of
/// [`NR`] columns, `[panel][k][NR]`, zero past `len`.
fn pack_b(b: &[f32], ldb: usize, r0: usize, kc: usize, len: usize, out: &mut Vec<f32>) {
    let panels = len.div_ceil(NR);
    out.clear();
    out.resize(panels * kc * NR, 0.0);
    for p in 0..panels {
        let (q0, width) = (p * NR, NR.min(len - p * NR));
        let panel = &mut out[p * kc * NR..][..kc * NR];
        for (k, dst) in panel.chunks_exact_mut(NR).enumerate() {
            dst[..width].copy_from_slice(&b[(r0 + k) * ldb + q0..][..width]);
        }
    }
}

/// `c[o * ldc + q] = bias[o] + sum_r a[o, r] * b[r * ldb + q]` for `o < a.rows()`, `q < len`
/// (without bias the sum alone; `c` is overwritten, never read before it is written). `bp` is
/// the caller's reusable buffer for the packed `B` block.
///
/// # Safety
/// The CPU must support AVX-512F. `b` holds `depth` rows of `len` elements at stride `ldb`;
/// `c` addresses `a.rows()` rows of `len` writable elements at stride `ldc`, owned by the
/// caller for the duration of the call and disjoint from `b` and `bias`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn multiply(
    a: &PackedA,
    b: &[f32],
    ldb: usize,
    len: usize,
    bias: Option<&[f32]>,
    c: *mut f32,
    ldc: usize,
    bp: &mut Vec<f32>,
) {
    let (rows, depth) = (a.rows, a.depth);
    debug_assert!(len == 0 || b.len() >= (depth.max(1) - 1) * ldb + len);
    debug_assert!(bias.is_none_or(|bias| bias.len() >= rows));
    if rows == 0 || len == 0 {
        return;
    }
    if depth == 0 {
        for o in 0..rows {
            let v = bias.map_or(0.0, |bias| bias[o]);
            for q in 0..len {
                // SAFETY: o < rows, q < len: inside the caller's region.
                unsafe { *c.add(o * ldc + q) = v };
            }
        }
        return;
    }
    let mut r0 = 0;
    while r0 < depth {
        let kc = KC.min(depth - r0);
        pack_b(b, ldb, r0, kc, len, bp);
        for p in 0..rows.div_ceil(MR) {
            let live = MR.min(rows - p * MR);
            let ap = &a.data[(p * depth + r0) * MR..][..kc * MR];
            for (jp, panel) in bp.chunks_exact(kc * NR).enumerate() {
                let q0 = jp * NR;
                let width = NR.min(len - q0);
                let start = match (r0, bias) {
                    (0, Some(bias)) => Start::Bias(&bias[p * MR..][..live]),
                    (0, None) => Start::Zero,
                    _ => Start::Load,
                };
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
        r0 += kc;
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
                // SAFETY: AVX-512F detected; c is rows x len, b depth x len.
                unsafe { multiply(&packed, &b, len, len, bias, c.as_mut_ptr(), len, &mut bp) };
                let want = chain(&a, &b, bias, rows, depth, len);
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{rows}x{depth}x{len}"
                );
            }
        }
    }
}
