//! The element types the crate computes in: `f32` and `f64`, behind one sealed trait.

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

mod sealed {
    /// Also ties each type to its vectors on every kernel backend.
    pub trait Sealed: crate::kernels::backend::Element {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type: implemented for `f32` and `f64` only.
pub trait Float:
    sealed::Sealed
    + Copy
    + Send
    + Sync
    + Debug
    + Display
    + Default
    + PartialEq
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Sum
    + 'static
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Unit round-off of the type, `2^-23` for `f32` and `2^-52` for `f64`, as `f64`.
    const EPSILON: f64;
    /// Name of the type, for messages (`"f32"`, `"f64"`).
    const NAME: &'static str;

    /// Nearest value of this type (`as` cast).
    fn from_f64(v: f64) -> Self;
    /// Exact widening (or identity) to `f64`.
    fn to_f64(self) -> f64;
    /// Conversion from an index or count (exact for the small integers used as coordinates).
    fn from_usize(v: usize) -> Self;
    /// Largest integer not greater than `self`.
    fn floor(self) -> Self;
    /// Whether `self` is NaN.
    fn is_nan(self) -> bool;
    /// Absolute value.
    fn abs(self) -> Self;
}

macro_rules! impl_float {
    ($t:ty) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const EPSILON: f64 = <$t>::EPSILON as f64 / 2.0;
            const NAME: &'static str = stringify!($t);

            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_usize(v: usize) -> Self {
                v as $t
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
        }
    };
}

impl_float!(f32);
impl_float!(f64);
