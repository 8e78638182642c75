//! A task's sampling table for one tile, `[k][tile column]`: for a deformable problem the
//! columns the fused pass reads ([`TapColumns`], built as the forward's by [`build_table`]);
//! for a dense one, each sample's cell.

use super::operands::Scope;
use super::plan::{ImageGroup, Piece};
use crate::float::Float;
use crate::kernels::columns::TapColumns;
use crate::kernels::dense_backward;
use crate::kernels::locate::Fields;
use crate::kernels::tile_table::{build_table, Bases, TableSource};

impl<T: Float> Scope<'_, '_, T> {
    /// The deformable tile's table `[k][tile column]`, every column, with its bases' maxima;
    /// `bases` is scratch.
    pub(super) fn build_taps(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        columns: &mut TapColumns<T>,
        bases: &mut Bases<T>,
    ) {
        let Some(offset) = self.ops.offset else {
            debug_assert!(false, "a deformable table needs offsets");
            return;
        };
        let src = TableSource {
            geo: self.g,
            convention: self.ops.convention,
            layout: self.layout,
            offset,
            mask: self.ops.mask,
            og: self.og,
        };
        build_table(columns, &src, group.images.start, tile, Fields::All, bases);
        columns.finish();
    }

    /// The dense tile's table `[k][tile column]`: each sample's cell ([`dense_backward::cell`])
    /// by integer arithmetic alone. Measured on W1 dense (1 thread): the general table build
    /// was a quarter of forward + backward.
    pub(super) fn build_cells(
        &self,
        group: &ImageGroup,
        tile: &[Piece],
        width: usize,
        cells: &mut Vec<usize>,
    ) {
        let g = self.g;
        let plane_len = self.layout.len();
        cells.clear();
        for k in 0..g.taps() {
            let (i, j) = (k / g.kw, k % g.kw);
            let (ty, tx) = (
                (i * g.dil_h) as isize - g.pad_top as isize,
                (j * g.dil_w) as isize - g.pad_left as isize,
            );
            for pc in tile {
                let plane0 = (pc.image - group.images.start) * plane_len;
                let (mut y, mut x) = (pc.pixels.start / g.w_out, pc.pixels.start % g.w_out);
                // `extend` from a range: no capacity check per entry.
                cells.extend(pc.pixels.clone().map(|_| {
                    let by = (y * g.stride_h) as isize + ty;
                    let bx = (x * g.stride_w) as isize + tx;
                    x += 1;
                    if x == g.w_out {
                        (y, x) = (y + 1, 0);
                    }
                    dense_backward::cell(self.layout, plane0, by, bx)
                }));
            }
        }
        debug_assert_eq!(cells.len(), g.taps() * width);
    }
}
