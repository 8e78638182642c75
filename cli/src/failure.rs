//! Why the tool stops: a one-line message and an exit code.

/// A failure reported as one line on stderr.
#[derive(Debug)]
pub struct Failure {
    /// Process exit code (2 for bad arguments and bad files).
    pub code: u8,
    /// The line printed after `deformconv: `.
    pub message: String,
}

impl Failure {
    /// Bad arguments or a bad file: exit code 2.
    pub fn bad(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

/// `Result` of a command.
pub type Outcome<T> = Result<T, Failure>;
