//! The sampling table of a tile in column (structure-of-arrays) form, `[k][pixel]` per
//! field, for both passes: what the forward's gather ([`super::gather`]) and the backward's
//! pixel-major pass ([`super::channel_backward`]) load a vector of entries at a time. Built for
//! both by [`super::tile_table::build_table`]: entry by entry from the row form
//! ([`super::taps::Tap`]) or a vector of pixels at a time by [`super::locate::fill_columns`].

use crate::float::Float;
use crate::kernels::taps::Tap;

/// Most cells the planes of one backward task may span (`2^30 - 1`), so that every base of the
/// table, plus a row pitch and one, fits `i32`. The backward refuses larger planes and its plan
/// keeps the images of one task below it.
pub(crate) const MAX_CELLS: usize = (i32::MAX as usize) / 2;

/// The sampling table `[k][pixel]` as separate columns, for vector loads.
#[derive(Debug, Default)]
pub(crate) struct TapColumns<T> {
    /// Gather base of each tap, as `i32`.
    pub gather: Vec<i32>,
    /// Scatter base of each tap, as `i32`.
    pub scatter: Vec<i32>,
    /// Bilinear weights, per corner.
    pub weights: [Vec<T>; 4],
    /// Row fractions.
    pub ly: Vec<T>,
    /// Column fractions.
    pub lx: Vec<T>,
    /// Mask values.
    pub m: Vec<T>,
    /// `-1` where the sample counts for the bilinear value, else 0.
    pub inside: Vec<i32>,
    /// Largest gather base (set by [`TapColumns::finish`]).
    pub max_base: usize,
    /// Largest scatter base (set by [`TapColumns::finish`]).
    pub max_scatter: usize,
}

impl<T: Float> TapColumns<T> {
    /// Refills the columns from `taps`.
    #[cfg(test)]
    pub(crate) fn fill(&mut self, taps: &[Tap<T>]) {
        self.resize(taps.len());
        for (e, t) in taps.iter().enumerate() {
            self.set(e, t);
        }
        self.finish();
    }

    /// Sizes every column to `entries` (the contents are to be overwritten).
    pub(crate) fn resize(&mut self, entries: usize) {
        self.gather.resize(entries, 0);
        self.scatter.resize(entries, 0);
        for col in &mut self.weights {
            col.resize(entries, T::ZERO);
        }
        self.ly.resize(entries, T::ZERO);
        self.lx.resize(entries, T::ZERO);
        self.m.resize(entries, T::ZERO);
        self.inside.resize(entries, 0);
    }

    /// Writes entry `e` from `t`.
    ///
    /// # Panics
    /// If a base exceeds [`MAX_CELLS`] (the backward's validation and plan rule it out).
    #[inline(always)]
    pub(crate) fn set(&mut self, e: usize, t: &Tap<T>) {
        assert!(
            t.gather.max(t.scatter) <= MAX_CELLS,
            "sampling table base beyond i32"
        );
        self.gather[e] = t.gather as i32;
        self.scatter[e] = t.scatter as i32;
        for (col, &w) in self.weights.iter_mut().zip(&t.weights) {
            col[e] = w;
        }
        self.ly[e] = t.ly;
        self.lx[e] = t.lx;
        self.m[e] = t.m;
        self.inside[e] = -(t.inside as i32);
    }

    /// Sets [`TapColumns::max_base`] and [`TapColumns::max_scatter`] once every entry is
    /// written.
    ///
    /// # Panics
    /// If a base is negative (the kernels' bounds proofs rest on `0 <= base <= max`).
    pub(crate) fn finish(&mut self) {
        let range = |v: &[i32]| {
            let (lo, hi) = v
                .iter()
                .fold((0i32, 0i32), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            assert!(lo >= 0, "negative base in the sampling table");
            hi as usize
        };
        self.max_base = range(&self.gather);
        self.max_scatter = range(&self.scatter);
    }

    /// Entries in the table.
    pub(crate) fn len(&self) -> usize {
        self.gather.len()
    }
}

impl<T: 'static> TapColumns<T> {
    /// The table as an `f32` table, when `T` is `f32` (for the AVX-512 paired kernels; the
    /// type test is decided at compile time).
    pub(crate) fn as_f32(&self) -> Option<&TapColumns<f32>> {
        (self as &dyn std::any::Any).downcast_ref()
    }

    /// Tap `k`'s row of a table built for `len` pixels: what the gathers read.
    pub(crate) fn row(&self, k: usize, len: usize, has_mask: bool) -> TapRow<'_, T> {
        let row = k * len..(k + 1) * len;
        TapRow {
            cell: &self.scatter[row.clone()],
            weight: [
                &self.weights[0][row.clone()],
                &self.weights[1][row.clone()],
                &self.weights[2][row.clone()],
                &self.weights[3][row.clone()],
            ],
            mask: has_mask.then(|| &self.m[row]),
        }
    }
}

/// One tap's row of a built table ([`TapColumns::row`]): what the gathers read.
#[derive(Clone, Copy)]
pub(crate) struct TapRow<'a, T> {
    /// First corner cells (see `gather::SampleTable`).
    pub cell: &'a [i32],
    /// Corner weights, per corner.
    pub weight: [&'a [T]; 4],
    /// The modulation mask, if any.
    pub mask: Option<&'a [T]>,
}
