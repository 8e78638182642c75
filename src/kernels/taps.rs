//! The sampling table of one pixel tile for the backward kernels, built once per (offset group,
//! tap, pixel) with [`crate::sample`] and reused for every channel of the offset group, and the
//! zero-bordered plane layout that lets the kernels read and write the four corners of any
//! sample without a branch.
//!
//! A *padded plane* holds an `H x W` plane with one extra row and column of zeros on every side:
//! pixel `(r, s)`, `-1 <= r <= H`, `-1 <= s <= W`, lives at `(r + 1) * (W + 2) + (s + 1)`.
//! Every sample whose floor corner `(y0, x0)` lies in `[-1, H-1] x [-1, W-1]` (all samples inside
//! torchvision's window, and all outside ones with at least one corner in the image) has its four
//! corners at `base, base + 1, base + W + 2, base + W + 3`, with the corners outside the image
//! landing on the border. [`PlaneLayout::zero_base`] is a base whose four cells are all border:
//! reading there gives zeros, and a scatter there is discarded (the border is never copied out).

use crate::float::Float;
use crate::sample::{corners, locate, Sample};

/// Sizes of a padded plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlaneLayout {
    /// Image rows `H`.
    pub h: usize,
    /// Image columns `W`.
    pub w: usize,
}

impl PlaneLayout {
    /// Row pitch `W + 2`.
    #[inline]
    pub fn pitch(&self) -> usize {
        self.w + 2
    }
    /// Cells per padded plane, `(H + 2) * (W + 2)`.
    #[inline]
    pub fn len(&self) -> usize {
        (self.h + 2) * (self.w + 2)
    }
    /// Index of pixel `(r, s)`, `-1 <= r <= H`, `-1 <= s <= W`.
    #[inline]
    pub fn index(&self, r: isize, s: isize) -> usize {
        debug_assert!(r >= -1 && r <= self.h as isize && s >= -1 && s <= self.w as isize);
        (r + 1) as usize * self.pitch() + (s + 1) as usize
    }
    /// The cell `(-1, W)`: its corner cells `(-1, W)`, `(0, -1)`, `(0, W)`, `(1, -1)` (the last
    /// two by wrapping past the row end) are all border. Needs `H >= 1`.
    #[inline]
    pub fn zero_base(&self) -> usize {
        self.w + 1
    }
}

/// One (tap, pixel) of a tile: where its corners are and how it weighs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tap<T> {
    /// Base (top-left corner) for reading the input: the real corners whenever one of them is in
    /// the image (also for samples outside the window, whose coordinate gradient still reads
    /// them), else [`PlaneLayout::zero_base`]. Relative to the tile segment's first plane.
    pub gather: usize,
    /// Base for scattering into `grad_input`: equal to `gather` for samples inside the window,
    /// [`PlaneLayout::zero_base`] (discarded) for the others.
    pub scatter: usize,
    /// Bilinear weights of the corners `(y0,x0), (y0,x1), (y1,x0), (y1,x1)`; NaN for a NaN
    /// offset, 0 outside the window.
    pub weights: [T; 4],
    /// Row fraction `py - y0` (NaN for a NaN offset, 0 when no corner is in the image).
    pub ly: T,
    /// Column fraction `px - x0` (likewise).
    pub lx: T,
    /// The mask value (1 without a mask).
    pub m: T,
    /// Whether the sample counts for the bilinear value (inside the window, or NaN).
    pub inside: bool,
}

impl<T: Float> Tap<T> {
    /// The table entry of the sample at `(base_y + dy, base_x + dx)` with mask `m`, its bases
    /// shifted by `plane0` (the first cell of the image's planes in the task's buffer).
    #[inline(always)]
    pub fn new(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        if !Self::is_plain(dy, dx) {
            return Self::by_rule(layout, plane0, (base_y, dy), (base_x, dx), m);
        }
        Self::plain(layout, plane0, (base_y, dy), (base_x, dx), m)
    }

    /// Whether [`Tap::plain`] applies: both offsets below `2^22` in magnitude (so not NaN).
    #[inline(always)]
    fn is_plain(dy: T, dx: T) -> bool {
        let limit = T::from_usize(1 << 22);
        dy.abs() < limit && dx.abs() < limit
    }

    /// [`Tap::new`] for offsets with [`Tap::is_plain`].
    #[inline(always)]
    fn plain(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        debug_assert!(Self::is_plain(dy, dx));
        // |d| < 2^22 (so not NaN): `sample::split` does not clamp and `corners` reduces to
        // this; the same values as `by_rule`, with few branches (a unit test compares both).
        // Measured on W1 (1 thread): the table build was 27% of the backward.
        let (fy, fx) = (dy.floor(), dx.floor());
        let (ly, lx) = (dy - fy, dx - fx);
        let (hy, hx) = ((fy + T::ONE) - dy, (fx + T::ONE) - dx);
        let y0 = base_y + fy.to_f64() as isize;
        let x0 = base_x + fx.to_f64() as isize;
        let (hi, wi) = (layout.h as isize, layout.w as isize);
        let zero = plane0 + layout.zero_base();
        let inside = (y0 >= 0 || (y0 == -1 && ly > T::ZERO))
            && (x0 >= 0 || (x0 == -1 && lx > T::ZERO))
            && y0 < hi
            && x0 < wi;
        let addressable = y0 >= -1 && y0 < hi && x0 >= -1 && x0 < wi;
        // One struct built from selects (few branches).
        let cell = plane0 + layout.index(y0.clamp(-1, hi), x0.clamp(-1, wi));
        let reads = inside || addressable;
        let pick = |on: bool, v: T| if on { v } else { T::ZERO };
        Tap {
            gather: if reads { cell } else { zero },
            scatter: if inside { cell } else { zero },
            weights: [
                pick(inside, hy * hx),
                pick(inside, hy * lx),
                pick(inside, ly * hx),
                pick(inside, ly * lx),
            ],
            ly: pick(reads, ly),
            lx: pick(reads, lx),
            m,
            inside,
        }
    }

    /// [`Tap::new`] straight from [`crate::sample::locate`] and [`crate::sample::corners`]
    /// (used for NaN and huge offsets).
    #[inline(never)]
    fn by_rule(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        let (h, w) = (layout.h, layout.w);
        let zero = plane0 + layout.zero_base();
        match locate(base_y, dy, base_x, dx, h, w) {
            Sample::Nan => {
                let nan = T::from_f64(f64::NAN);
                Tap {
                    gather: zero,
                    scatter: zero,
                    weights: [nan; 4],
                    ly: nan,
                    lx: nan,
                    m,
                    inside: true,
                }
            }
            Sample::Inside(c) => {
                let base = plane0 + layout.index(c.y0, c.x0);
                Tap {
                    gather: base,
                    scatter: base,
                    weights: c.weights(),
                    ly: c.ly,
                    lx: c.lx,
                    m,
                    inside: true,
                }
            }
            Sample::Outside => {
                let c = corners(base_y, dy, base_x, dx, h, w);
                if c.valid.iter().any(|&v| v) {
                    // A corner in the image puts y0 in [-1, H-1] and x0 in [-1, W-1].
                    Tap {
                        gather: plane0 + layout.index(c.y0, c.x0),
                        scatter: zero,
                        weights: [T::ZERO; 4],
                        ly: c.ly,
                        lx: c.lx,
                        m,
                        inside: false,
                    }
                } else {
                    Tap {
                        gather: zero,
                        scatter: zero,
                        weights: [T::ZERO; 4],
                        ly: T::ZERO,
                        lx: T::ZERO,
                        m,
                        inside: false,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same<T: Float>(a: &Tap<T>, b: &Tap<T>) -> bool {
        let eq = |x: T, y: T| x.to_f64().to_bits() == y.to_f64().to_bits();
        a.gather == b.gather
            && a.scatter == b.scatter
            && a.inside == b.inside
            && eq(a.ly, b.ly)
            && eq(a.lx, b.lx)
            && eq(a.m, b.m)
            && (0..4).all(|c| eq(a.weights[c], b.weights[c]))
    }

    /// The straight-line table entry equals the one built from `sample::locate` / `corners`,
    /// on border, integer, near-integer, small negative and far positions, in f32 and f64.
    #[test]
    fn fast_entry_equals_the_rule() {
        let l = PlaneLayout { h: 4, w: 3 };
        let ds = [
            -3.5, -2.0, -1.5, -1.0, -0.999, -0.5, -1e-7, 0.0, 1e-7, 0.25, 0.999, 1.0, 2.0, 2.5,
            2.999, 3.0, 3.25, 4.0, 4.5, 7.0,
        ];
        for by in -2..6isize {
            for bx in -2..5isize {
                for &dy in &ds {
                    for &dx in &ds {
                        let a = Tap::new(l, 7, (by, dy), (bx, dx), 0.5f64);
                        let b = Tap::by_rule(l, 7, (by, dy), (bx, dx), 0.5f64);
                        assert!(same(&a, &b), "f64 ({by}+{dy}, {bx}+{dx})");
                        let (fy, fx) = (dy as f32, dx as f32);
                        let a = Tap::new(l, 7, (by, fy), (bx, fx), 0.5f32);
                        let b = Tap::by_rule(l, 7, (by, fy), (bx, fx), 0.5f32);
                        assert!(same(&a, &b), "f32 ({by}+{dy}, {bx}+{dx})");
                    }
                }
            }
        }
    }

    #[test]
    fn zero_base_cells_are_all_border() {
        for (h, w) in [(1, 1), (1, 3), (4, 2), (7, 7)] {
            let l = PlaneLayout { h, w };
            let b = l.zero_base();
            for cell in [b, b + 1, b + l.pitch(), b + l.pitch() + 1] {
                assert!(cell < l.len());
                let (r, s) = (cell / l.pitch(), cell % l.pitch());
                assert!(
                    r == 0 || r == h + 1 || s == 0 || s == w + 1,
                    "{h}x{w}: {cell}"
                );
            }
        }
    }

    #[test]
    fn outside_sample_with_a_corner_in_the_image_reads_it_but_sends_nothing() {
        let l = PlaneLayout { h: 3, w: 3 };
        // py = -1 exactly: outside the window, but corner (0, 1) is in the image.
        let t = Tap::new(l, 0, (0, -1.0f64), (1, 0.0), 1.0);
        assert!(!t.inside);
        assert_eq!(t.gather, l.index(-1, 1));
        assert_eq!(t.scatter, l.zero_base());
        let far = Tap::new(l, 0, (0, f64::INFINITY), (1, 0.0), 1.0);
        assert_eq!((far.gather, far.ly, far.lx), (l.zero_base(), 0.0, 0.0));
    }
}
