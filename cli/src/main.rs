//! `deformconv`: the crate's command-line tool (`deformconv --help`; the code is in the
//! `deformconv_cli` library beside this file).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    deformconv_cli::execute(deformconv_cli::args::Cli::parse())
}
