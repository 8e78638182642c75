//! `deformconv`: the crate's command-line tool.
//!
//! ```text
//! deformconv [bench] [--quick] [--repeats N]          workloads W1–W4, forward and backward
//! deformconv run CASE.npz -o OUT.npz [--exact]        compute out (and gradients) of a case
//! deformconv compare EXPECTED.npz ACTUAL.npz [--rtol R] [--atol A] [--bound-factor C]
//! ```
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

use args::Command;

fn main() -> ExitCode {
    let result = args::parse(std::env::args_os().skip(1)).and_then(|command| match command {
        Command::Help => {
            print!("{}", args::USAGE);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(a) => run::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Compare(a) => compare::compare(&a).map(|passed| {
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Command::Bench(a) => bench::bench(&a).map(|()| ExitCode::SUCCESS),
    });
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("deformconv: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
