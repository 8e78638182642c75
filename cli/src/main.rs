//! `deformconv`: the crate's command-line tool (`deformconv --help`).
//!
//! Exit codes: 0 success (for `compare`: every element within tolerance), 1 `compare` found
//! elements over tolerance, 2 bad arguments or bad files (one line on stderr).
//! File formats are described in `docs/oracle-guide.md`.

mod args;
mod bench;
mod case;
mod compare;
mod failure;
mod npz;
mod run;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
            eprintln!("deformconv: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
