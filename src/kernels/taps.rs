//! The sampling table of one pixel tile for the backward kernels, built once per (offset group,
//! tap, pixel) with [`crate::sample`] and reused for every channel of the offset group, and the
//! bordered plane layout that lets the kernels read and write the four corners of any sample
//! without a branch.
//!
//! A *padded plane* holds an `H x W` plane with extra border cells: pixel `(r, s)`,
//! `-1 <= r <= H`, `-1 <= s <= W + 1`, lives at `(r + 1) * pitch + (s + 1)`. The *zero-bordered*
//! layout (torchvision, mmcv) has `pitch = W + 2` and zeros in row `-1`, row `H`, column `-1`
//! and column `W`; the *replicated* layout (DCN v1) has `pitch = W + 3`, column `W` a copy of
//! column `W - 1` and row `H` a copy of row `H - 1` (its `(H, W)` cell is `v(H-1, W-1)`), with
//! zeros in row `-1`, column `-1` and column `W + 1`. Either way a sample whose floor corner
//! `(y0, x0)` lies in `[-1, H-1] x [-1, W-1]` has its four corners at `base, base + 1,
//! base + pitch, base + pitch + 1`. In the zero-bordered layout the corners outside the image
//! land on zeros (torchvision's rule); in the replicated one, a DCN v1 sample on the last row
//! reads row `H - 1` twice and, with its fraction set to 0, gets DCN v1's collapsed corners
//! (the duplicate's weight is 0, and `v(H-1, .) - v(H, .)` is exactly 0 in `Wy`). A scatter
//! into a border cell is discarded (the border is never copied out), so the real pixel keeps
//! exactly its collapsed-corner weight. [`PlaneLayout::zero_base`] is a base whose four cells
//! are zero border in both layouts: reading there gives zeros, a scatter there is discarded.
//!
//! The rule of the table is a type parameter ([`Rule`]), so each convention has its own
//! monomorphised table build and the default one is the code it was before conventions.

use crate::convention::Convention;
use crate::float::Float;
use crate::sample::{corners, locate, locate_in, Sample};

/// Sizes of a padded plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlaneLayout {
    /// Image rows `H`.
    pub h: usize,
    /// Image columns `W`.
    pub w: usize,
    /// Row pitch: `W + 2` (zero-bordered) or `W + 3` (replicated).
    pitch: usize,
}

impl PlaneLayout {
    /// The zero-bordered layout of an `h x w` plane (torchvision, mmcv).
    #[inline]
    pub fn zero_bordered(h: usize, w: usize) -> Self {
        PlaneLayout { h, w, pitch: w + 2 }
    }
    /// The replicated layout of an `h x w` plane (DCN v1): see the module docs.
    #[inline]
    pub fn replicated(h: usize, w: usize) -> Self {
        PlaneLayout { h, w, pitch: w + 3 }
    }
    /// The layout the table of `conv` reads.
    #[inline]
    pub fn for_convention(conv: Convention, h: usize, w: usize) -> Self {
        match conv {
            Convention::Torchvision | Convention::Mmcv => Self::zero_bordered(h, w),
            Convention::DcnV1 => Self::replicated(h, w),
        }
    }
    /// Whether row `H` and column `W` replicate the last row and column.
    #[inline]
    pub fn is_replicated(&self) -> bool {
        self.pitch == self.w + 3
    }
    /// Row pitch, `W + 2` or `W + 3`.
    #[inline]
    pub fn pitch(&self) -> usize {
        self.pitch
    }
    /// Cells per padded plane, `(H + 2) * pitch`; `3 * pitch` for an empty plane (`H = 0`, only
    /// padding samples), so that the cells of [`PlaneLayout::zero_base`] exist.
    #[inline]
    pub fn len(&self) -> usize {
        (self.h.max(1) + 2) * self.pitch
    }
    /// Index of pixel `(r, s)`, `-1 <= r <= H`, `-1 <= s <= pitch - 2`.
    #[inline]
    pub fn index(&self, r: isize, s: isize) -> usize {
        debug_assert!(r >= -1 && r <= self.h as isize && s >= -1 && s <= self.pitch as isize - 2);
        (r + 1) as usize * self.pitch + (s + 1) as usize
    }
    /// The last cell of row `-1`, `(-1, pitch - 2)`: its corner cells `(-1, pitch - 2)`,
    /// `(0, -1)`, `(0, pitch - 2)`, `(1, -1)` (the last two by wrapping past the row end) are
    /// all zero border in both layouts (for `H = 0` too, see [`PlaneLayout::len`]).
    #[inline]
    pub fn zero_base(&self) -> usize {
        self.pitch - 1
    }
    /// The image pixel `(r, s)` whose value padded cell `cell` holds (`None`: a zero cell),
    /// from the layout's definition in the module docs.
    #[cfg(test)]
    pub fn pixel_of(&self, cell: usize) -> Option<(usize, usize)> {
        let (h, w) = (self.h as isize, self.w as isize);
        let (mut r, mut s) = (
            (cell / self.pitch) as isize - 1,
            (cell % self.pitch) as isize - 1,
        );
        if self.is_replicated() {
            if r == h && (0..=w).contains(&s) {
                r = h - 1;
            }
            if s == w && (0..h).contains(&r) {
                s = w - 1;
            }
        }
        ((0..h).contains(&r) && (0..w).contains(&s)).then_some((r as usize, s as usize))
    }
    /// Writes the replicated border of `cells` (one padded plane of `channels` values a cell,
    /// whose image cells are filled): column `W` from column `W - 1` on rows `0..H`, then row
    /// `H` from row `H - 1` (columns `0..=W`). Nothing for the zero-bordered layout or an empty
    /// plane.
    pub fn replicate_border<T: Copy>(&self, cells: &mut [T], channels: usize) {
        if !self.is_replicated() || self.h == 0 || self.w == 0 {
            return;
        }
        debug_assert_eq!(cells.len(), self.len() * channels);
        let (h, w) = (self.h as isize, self.w as isize);
        for r in 0..h {
            let from = self.index(r, w - 1) * channels;
            cells.copy_within(from..from + channels, self.index(r, w) * channels);
        }
        let (last, below) = (self.index(h - 1, 0), self.index(h, 0));
        let row = (self.w + 1) * channels;
        cells.copy_within(last * channels..last * channels + row, below * channels);
    }
}

/// The border rule of a sampling table, as a type so that each convention's table build is
/// its own monomorphised loop (a runtime closure stopped `floor` being inlined in the forward).
pub(crate) trait Rule {
    /// The convention this rule implements.
    const CONVENTION: Convention;
}

/// [`Convention::Torchvision`]'s table: window `-1 < p < size`, coordinate gradient with no
/// cut-off (outside samples with a corner in the image still read it), zero-bordered planes.
pub(crate) struct TorchvisionRule;
/// [`Convention::Mmcv`]'s table: torchvision's, except that a sample outside the window reads
/// the zero cells (so its coordinate gradient is 0).
pub(crate) struct MmcvRule;
/// [`Convention::DcnV1`]'s table: window `0 <= p < size`, the fraction of an axis on the last
/// row/column set to 0 (its complement to 1), replicated planes; outside samples read zeros.
pub(crate) struct DcnV1Rule;

impl Rule for TorchvisionRule {
    const CONVENTION: Convention = Convention::Torchvision;
}
impl Rule for MmcvRule {
    const CONVENTION: Convention = Convention::Mmcv;
}
impl Rule for DcnV1Rule {
    const CONVENTION: Convention = Convention::DcnV1;
}

/// One (tap, pixel) of a tile: where its corners are and how it weighs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tap<T> {
    /// Base (top-left corner) for reading the input: the real corners for samples inside the
    /// window, and under torchvision also for samples outside it with a corner in the image
    /// (whose coordinate gradient still reads them); else [`PlaneLayout::zero_base`]. Relative
    /// to the tile segment's first plane.
    pub gather: usize,
    /// Base for scattering into `grad_input`: equal to `gather` for samples inside the window,
    /// [`PlaneLayout::zero_base`] (discarded) for the others.
    pub scatter: usize,
    /// Bilinear weights of the corners `(y0,x0), (y0,x1), (y1,x0), (y1,x1)`; NaN for a NaN
    /// offset, 0 outside the window.
    pub weights: [T; 4],
    /// Row fraction `py - y0` (NaN for a NaN offset, 0 when the sample reads the zero cells,
    /// 0 on DCN v1's last row).
    pub ly: T,
    /// Column fraction `px - x0` (likewise).
    pub lx: T,
    /// The mask value (1 without a mask).
    pub m: T,
    /// Whether the sample counts for the bilinear value (inside the window, or NaN).
    pub inside: bool,
}

impl<T: Float> Tap<T> {
    /// The torchvision table entry ([`Tap::with_rule`] for [`TorchvisionRule`]).
    #[cfg(test)]
    #[inline(always)]
    pub fn new(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        Self::with_rule::<TorchvisionRule>(layout, plane0, (base_y, dy), (base_x, dx), m)
    }

    /// The table entry under rule `R` of the sample at `(base_y + dy, base_x + dx)` with mask
    /// `m`, its bases shifted by `plane0` (the first cell of the image's planes in the task's
    /// buffer). `layout` must be [`PlaneLayout::for_convention`] of `R`.
    #[inline(always)]
    pub fn with_rule<R: Rule>(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        debug_assert_eq!(
            layout,
            PlaneLayout::for_convention(R::CONVENTION, layout.h, layout.w)
        );
        if !Self::is_plain(dy, dx) {
            return Self::by_rule::<R>(layout, plane0, (base_y, dy), (base_x, dx), m);
        }
        match R::CONVENTION {
            Convention::DcnV1 => Self::plain_clamped(layout, plane0, (base_y, dy), (base_x, dx), m),
            Convention::Torchvision | Convention::Mmcv => {
                Self::plain::<R>(layout, plane0, (base_y, dy), (base_x, dx), m)
            }
        }
    }

    /// Whether the straight-line builds apply: both offsets below `2^22` in magnitude (so not
    /// NaN).
    #[inline(always)]
    fn is_plain(dy: T, dx: T) -> bool {
        let limit = T::from_usize(1 << 22);
        dy.abs() < limit && dx.abs() < limit
    }

    /// [`Tap::with_rule`] for torchvision and mmcv and offsets with [`Tap::is_plain`].
    #[inline(always)]
    fn plain<R: Rule>(
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
        let reads = match R::CONVENTION {
            // No cut-off: an outside sample with a corner in the image reads it.
            Convention::Torchvision => inside || addressable,
            // mmcv cuts the coordinate gradient off outside the window: the zero cells.
            _ => inside,
        };
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

    /// [`Tap::with_rule`] for DCN v1 and offsets with [`Tap::is_plain`]: the same corners and
    /// weights as [`crate::sample::locate_in`] for DCN v1, read through the replicated layout.
    #[inline(always)]
    fn plain_clamped(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        debug_assert!(Self::is_plain(dy, dx) && layout.is_replicated());
        let (fy, fx) = (dy.floor(), dx.floor());
        let y0 = base_y + fy.to_f64() as isize;
        let x0 = base_x + fx.to_f64() as isize;
        let (hi, wi) = (layout.h as isize, layout.w as isize);
        // p >= 0  <=>  floor(p) >= 0;  p < size  <=>  floor(p) < size.
        let inside = y0 >= 0 && y0 < hi && x0 >= 0 && x0 < wi;
        // On the last row (column) the fraction is 0 and its complement 1: the second corner,
        // row H (column W) of the replicated plane, is the last row (column) again.
        let (ly, hy) = if y0 == hi - 1 {
            (T::ZERO, T::ONE)
        } else {
            (dy - fy, (fy + T::ONE) - dy)
        };
        let (lx, hx) = if x0 == wi - 1 {
            (T::ZERO, T::ONE)
        } else {
            (dx - fx, (fx + T::ONE) - dx)
        };
        let zero = plane0 + layout.zero_base();
        let cell = plane0 + layout.index(y0.clamp(-1, hi), x0.clamp(-1, wi));
        // Outside the window: the zero cells (no value, no gradient, coordinate gradient 0).
        let base = if inside { cell } else { zero };
        let pick = |v: T| if inside { v } else { T::ZERO };
        Tap {
            gather: base,
            scatter: base,
            weights: [pick(hy * hx), pick(hy * lx), pick(ly * hx), pick(ly * lx)],
            ly: pick(ly),
            lx: pick(lx),
            m,
            inside,
        }
    }

    /// [`Tap::with_rule`] straight from [`crate::sample::locate_in`] and
    /// [`crate::sample::corners`] (used for NaN and huge offsets).
    #[inline(never)]
    fn by_rule<R: Rule>(
        layout: PlaneLayout,
        plane0: usize,
        (base_y, dy): (isize, T),
        (base_x, dx): (isize, T),
        m: T,
    ) -> Self {
        let (h, w) = (layout.h, layout.w);
        let zero = plane0 + layout.zero_base();
        let nothing = Tap {
            gather: zero,
            scatter: zero,
            weights: [T::ZERO; 4],
            ly: T::ZERO,
            lx: T::ZERO,
            m,
            inside: false,
        };
        let sample = match R::CONVENTION {
            Convention::Torchvision => locate(base_y, dy, base_x, dx, h, w),
            conv => locate_in(conv, base_y, dy, base_x, dx, h, w),
        };
        match sample {
            Sample::Nan => {
                let nan = T::from_f64(f64::NAN);
                Tap {
                    weights: [nan; 4],
                    ly: nan,
                    lx: nan,
                    inside: true,
                    ..nothing
                }
            }
            Sample::Inside(c) => {
                // DCN v1's collapsed corners are the replicated border cells, with weight 0.
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
            Sample::Outside if R::CONVENTION == Convention::Torchvision => {
                let c = corners(base_y, dy, base_x, dx, h, w);
                if c.valid.iter().any(|&v| v) {
                    // A corner in the image puts y0 in [-1, H-1] and x0 in [-1, W-1].
                    Tap {
                        gather: plane0 + layout.index(c.y0, c.x0),
                        ly: c.ly,
                        lx: c.lx,
                        ..nothing
                    }
                } else {
                    nothing
                }
            }
            // mmcv and DCN v1 cut the coordinate gradient off outside the window.
            Sample::Outside => nothing,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
