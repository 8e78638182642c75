//! Operands in the row-major (C-contiguous) order the kernels index as slices, copied only when
//! a view is not in it already.
//!
//! A channels_last view (NCHW shape, NHWC strides: PyTorch's `channels_last` tensors, which a
//! model converted with `model.to(memory_format=torch.channels_last)` feeds every layer) is
//! transposed image by image in registers, in parallel ([`nchw_from_nhwc`]). ndarray's
//! element-wise copy walks such a view in NCHW order, one cache line per element: W4's backward
//! took 166 ms with a channels_last `grad_out` against 148 ms with an NCHW one (Intel Xeon,
//! AVX-512, 2 threads), and W4's forward 64 ms with a channels_last input against 46 ms.

use std::borrow::Cow;

use ndarray::{Array4, ArrayView4, CowArray, Ix4};

use crate::kernels::pixel_major::nchw_from_nhwc;
use crate::Float;

/// Whether `view` is channels_last: `[N, C, H, W]` with the memory order of `[N, H, W, C]`.
pub(crate) fn is_nhwc<T>(view: &ArrayView4<'_, T>) -> bool {
    view.view().permuted_axes([0, 2, 3, 1]).is_standard_layout()
}

/// `view` in row-major order, borrowed when it already is.
pub(crate) fn standard<T: Float>(view: ArrayView4<'_, T>) -> CowArray<'_, T, Ix4> {
    if view.is_standard_layout() {
        CowArray::from(view)
    } else {
        CowArray::from(copy(view))
    }
}

/// The elements of `view` in row-major order, borrowed when it already is.
pub(crate) fn row_major<'a, T: Float>(view: &ArrayView4<'a, T>) -> Cow<'a, [T]> {
    match view.to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => {
            let (data, offset) = copy(view.view()).into_raw_vec_and_offset();
            debug_assert_eq!(offset.unwrap_or(0), 0);
            Cow::Owned(data)
        }
    }
}

/// A row-major copy of `view`.
fn copy<T: Float>(view: ArrayView4<'_, T>) -> Array4<T> {
    let [n, c, h, w] = [0, 1, 2, 3].map(|a| view.shape()[a]);
    let nhwc = view.view().permuted_axes([0, 2, 3, 1]);
    match nhwc.to_slice() {
        Some(src) if !view.is_empty() => {
            let mut data = vec![T::ZERO; view.len()];
            crate::pool::on_pool(|| nchw_from_nhwc(src, c, h * w, &mut data));
            Array4::from_shape_vec((n, c, h, w), data).expect("n * c * h * w elements")
        }
        _ => view.as_standard_layout().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ShapeBuilder;

    /// Channels_last views of several shapes (channel counts around the transpose's blocks)
    /// copy to exactly the NCHW array; other layouts too.
    #[test]
    fn channels_last_views_copy_exactly() {
        for (n, c, h, w) in [
            (1, 1, 1, 1),
            (2, 3, 5, 4),
            (1, 17, 3, 7),
            (3, 40, 6, 6),
            (1, 70, 2, 9),
        ] {
            let nchw = Array4::from_shape_fn((n, c, h, w), |(a, b, y, x)| {
                (((a * 31 + b) * 17 + y) * 13 + x) as f32 * 0.5
            });
            let nhwc = nchw
                .view()
                .permuted_axes([0, 2, 3, 1])
                .as_standard_layout()
                .into_owned();
            let view = nhwc.view().permuted_axes([0, 3, 1, 2]);
            assert!(is_nhwc(&view) && (c == 1 || h * w == 1 || !view.is_standard_layout()));
            assert_eq!(standard(view), nchw);
            assert_eq!(&*row_major(&view), nchw.as_slice().unwrap());
            let f64s = nchw.mapv(f64::from);
            let fortran = {
                let mut f = Array4::<f64>::zeros((n, c, h, w).f());
                f.assign(&f64s);
                f
            };
            assert_eq!(standard(fortran.view()), f64s);
        }
    }
}
