//! The one error type of the crate: every public function returns `Result<_, Error>`.

use std::fmt;

/// What went wrong, phrased so that the caller can fix it without reading our source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A tensor's extent along one axis is not what the other tensors and parameters imply.
    ///
    /// Displayed as `offset has 18 channels; expected 2 * offset_groups(2) * kh(3) * kw(3) = 36`.
    Shape {
        /// The tensor at fault (`"input"`, `"offset"`, `"mask"`, `"weight"`, `"bias"`, `"grad_out"`, ...).
        tensor: &'static str,
        /// The axis, in words (`"images"`, `"channels"`, `"rows"`, `"columns"`, `"elements"`).
        axis: &'static str,
        /// What was expected, with the arithmetic that gives it.
        expected: String,
        /// What was got.
        got: usize,
    },
    /// A convolution parameter breaks one of its rules.
    ///
    /// Displayed as `groups = 3 must divide input channels (8)`.
    Param {
        /// The parameter (`"stride"`, `"padding"`, `"dilation"`, `"groups"`, `"offset_groups"`, ...).
        name: &'static str,
        /// The rule that was broken, in words, including the offending value.
        rule: String,
    },
    /// A size, element count or workspace overflows `usize` or exceeds what can be allocated.
    TooLarge {
        /// Which quantity, with its factors.
        what: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape {
                tensor,
                axis,
                expected,
                got,
            } => write!(f, "{tensor} has {got} {axis}; expected {expected}"),
            Error::Param { name, rule } => write!(f, "{name}: {rule}"),
            Error::TooLarge { what } => write!(f, "too large: {what}"),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
