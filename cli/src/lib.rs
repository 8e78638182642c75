//! The `deformconv` command line as a library: the binary (`src/main.rs`) parses the
//! arguments and calls [`execute`]; the fuzz target `files` calls the readers ([`npz`],
//! [`case`]) on arbitrary bytes.
//!
//! Exit codes: 0 success (for `compare`: every element within tolerance), 1 `compare` found
//! elements over tolerance or missing, 2 bad arguments or bad files (one line on stderr).
//! File formats are described in `docs/oracle-guide.md`.

pub mod args;
pub mod bench;
pub mod case;
pub mod compare;
pub mod failure;
pub mod npy;
pub mod npz;
pub mod output;
pub mod run;

use std::process::ExitCode;

use args::{Cli, Command};

/// Runs a parsed command line; failures become one line on stderr and exit code 2.
pub fn execute(cli: Cli) -> ExitCode {
    let result = match cli.command {
        None => bench::bench(&cli.bench).map(|()| ExitCode::SUCCESS),
        Some(Command::Bench(a)) => bench::bench(&a).map(|()| ExitCode::SUCCESS),
        Some(Command::Run(a)) => run::run(&a).map(|()| ExitCode::SUCCESS),
        Some(Command::Compare(a)) => compare::compare(&a).map(|passed| {
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            // One line whatever a message quotes from a file.
            let line: Vec<&str> = failure.message.lines().collect();
            eprintln!("deformconv: {}", line.join(" "));
            ExitCode::from(failure.code)
        }
    }
}
