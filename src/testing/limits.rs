//! Bounds on the generated problems: [`Limits`], [`Presence`] of the optional operands and
//! [`Placement`] of the samples.

use proptest::prelude::*;

/// Whether an optional operand (mask, bias) is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Never present.
    Never,
    /// Always present.
    Always,
    /// Either, shrinking towards absent.
    Either,
}

impl Presence {
    pub(super) fn strategy(self) -> BoxedStrategy<bool> {
        match self {
            Presence::Never => Just(false).boxed(),
            Presence::Always => Just(true).boxed(),
            Presence::Either => any::<bool>().boxed(),
        }
    }
}

/// Bounds on the generated problems. Every range starts at its smallest valid value, which is
/// where shrinking goes.
///
/// Build them with struct update syntax from another crate
/// (`Limits { mask: Presence::Never, ..Limits::default() }`) or with the builder methods
/// (`Limits::default().mask(Presence::Never).symmetric_padding()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Smallest batch (0 is valid and gives empty results).
    pub min_batch: usize,
    /// Largest batch.
    pub max_batch: usize,
    /// Largest number of convolution groups.
    pub max_groups: usize,
    /// Largest number of offset groups.
    pub max_offset_groups: usize,
    /// `C_in = lcm(groups, offset_groups) * m` with `m` up to this.
    pub max_input_multiple: usize,
    /// `C_out = groups * m` with `m` up to this.
    pub max_output_per_group: usize,
    /// Largest kernel extent (rows and columns independently).
    pub max_kernel: usize,
    /// Largest stride on each axis.
    pub max_stride: usize,
    /// Largest dilation on each axis.
    pub max_dilation: usize,
    /// Largest padding on each side.
    pub max_padding: usize,
    /// Image rows (columns) beyond the fewest that give one output row (column).
    pub max_extra_size: usize,
    /// Whether a mask (DCN v2) is generated.
    pub mask: Presence,
    /// Whether a bias is generated.
    pub bias: Presence,
    /// Only symmetric padding (`top == bottom`, `left == right`), for kernels that cannot
    /// express asymmetric padding.
    pub symmetric_padding_only: bool,
    /// Where the samples land.
    pub placement: Placement,
}

/// Where the generated samples land (the offsets' distribution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// A mix of every kind below (free values, integers, half-integers, borders, far outside).
    #[default]
    Mixed,
    /// Strictly inside the image, away from every border and integer (`0 < p < H - 1`,
    /// fractional part in `[0.05, 0.95]`), where every convention agrees.
    Interior,
    /// Exactly on `-1`, `0`, `H - 1` or `H` (or `1/1024` inside or beyond them).
    Borders,
    /// Exact integers (offsets in `-2..=2`).
    Integers,
    /// Far outside the image (at least 3 pixels beyond an edge).
    FarOutside,
}

impl Limits {
    /// The same limits with `mask` presence.
    pub fn mask(self, mask: Presence) -> Self {
        Limits { mask, ..self }
    }

    /// The same limits with `bias` presence.
    pub fn bias(self, bias: Presence) -> Self {
        Limits { bias, ..self }
    }

    /// The same limits with symmetric padding only.
    pub fn symmetric_padding(self) -> Self {
        Limits {
            symmetric_padding_only: true,
            ..self
        }
    }

    /// The same limits with samples placed by `placement`.
    pub fn placement(self, placement: Placement) -> Self {
        Limits { placement, ..self }
    }

    /// The same limits with batches `min..=max`.
    pub fn batch(self, min: usize, max: usize) -> Self {
        Limits {
            min_batch: min,
            max_batch: max,
            ..self
        }
    }

    /// The same limits with at most `groups` groups and `offset_groups` offset groups.
    pub fn groups(self, groups: usize, offset_groups: usize) -> Self {
        Limits {
            max_groups: groups,
            max_offset_groups: offset_groups,
            ..self
        }
    }
}

impl Default for Limits {
    /// Batch 1–2, up to 3 groups and 3 offset groups, kernels up to 3x3, stride, dilation and
    /// padding up to 2, images up to 6 pixels beyond the minimum, mask and bias either way.
    fn default() -> Self {
        Limits {
            min_batch: 1,
            max_batch: 2,
            max_groups: 3,
            max_offset_groups: 3,
            max_input_multiple: 2,
            max_output_per_group: 2,
            max_kernel: 3,
            max_stride: 2,
            max_dilation: 2,
            max_padding: 2,
            max_extra_size: 6,
            mask: Presence::Either,
            bias: Presence::Either,
            symmetric_padding_only: false,
            placement: Placement::Mixed,
        }
    }
}
