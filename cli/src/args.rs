//! The command line, declared once with clap's derive: `--help` for the tool and for every
//! subcommand, `--version`, suggestions for mistyped names and the error format come from it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use deformconv::compare::{Output, Precision};

/// Deformable convolution on the CPU: time the workloads of the users' reports, compute a
/// case's results (fast or exact), and judge another implementation's results.
#[derive(Debug, Parser)]
#[command(
    name = "deformconv",
    version,
    after_help = "Exit codes: 0 ok (compare: within tolerance), 1 compare: over tolerance, \
                  2 bad arguments or bad files.\nFile formats: docs/oracle-guide.md."
)]
pub struct Cli {
    /// What to do; without a subcommand, `bench`.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The flags of `bench`, so that `deformconv --quick` means `deformconv bench --quick`.
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Time the workloads (W1-W4 and the deployed layers), deformable and dense (the default command).
    ///
    /// Deformable forward and backward (every gradient) against our dense convolution on the
    /// same shapes, float32, medians and minima after a warm-up; threads: RAYON_NUM_THREADS.
    Bench(BenchArgs),
    /// Compute a case's results, fast or exact.
    ///
    /// Reads the operands of CASE.npz and the parameters of CASE.json; computes `out`, and
    /// every gradient when the case has `grad_out`; writes OUT.npz (operands and results) and
    /// OUT.json. float32 cases run the fast path in f32 (--exact: the f64 reference); float64
    /// cases run in f64.
    Run(RunArgs),
    /// Judge results against exact ones, tensor by tensor.
    ///
    /// By default every element against the per-element error bound (needs the operands and
    /// the JSON sidecar of EXPECTED or ACTUAL); with --rtol/--atol against
    /// |actual - expected| <= atol + rtol * |expected|.
    Compare(CompareArgs),
}

/// `deformconv run`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct RunArgs {
    /// The case: CASE.npz, with its parameters in CASE.json beside it.
    pub case: PathBuf,
    /// Where to write the results (OUT.npz, and OUT.json beside it).
    #[arg(short, long = "output", value_name = "OUT.npz")]
    pub out: PathBuf,
    /// Compute with the f64 reference instead of the fast path.
    #[arg(long)]
    pub exact: bool,
}

/// `deformconv compare`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct CompareArgs {
    /// The exact results (e.g. from `run --exact`).
    pub expected: PathBuf,
    /// The results to judge.
    pub actual: PathBuf,
    /// Relative tolerance of an allclose rule (instead of the error bound).
    #[arg(long, value_parser = non_negative)]
    pub rtol: Option<f64>,
    /// Absolute tolerance of an allclose rule (instead of the error bound).
    #[arg(long, value_parser = non_negative)]
    pub atol: Option<f64>,
    /// The constant c of the error bound c * L * eps * sum|terms|.
    #[arg(long, value_parser = non_negative)]
    pub bound_factor: Option<f64>,
    /// The precision the kernel under test computes in (f64, f32, tf32, bf16, f16): sets the
    /// unit roundoff of the bound. Default: the sidecar's "precision", else ACTUAL's dtype.
    #[arg(long, value_parser = precision_name)]
    pub precision: Option<Precision>,
    /// The exact sample positions everywhere: no second side where the declared precision
    /// rounds a position across an integer or a window edge.
    #[arg(long)]
    pub strict_positions: bool,
    /// Judge by the per-element bound alone, without the statistical check of the error
    /// profile.
    #[arg(long)]
    pub no_statistical: bool,
    /// Also write the report as JSON to this file (every figure of the table and the verdicts).
    #[arg(long, value_name = "REPORT.json")]
    pub json: Option<PathBuf>,
    /// Compare only these results (comma-separated: out, grad_input, grad_offset, grad_mask,
    /// grad_weight, grad_bias); by default every result of EXPECTED must be in ACTUAL.
    #[arg(long, value_delimiter = ',', value_parser = output_name)]
    pub only: Option<Vec<Output>>,
}

/// `deformconv bench`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct BenchArgs {
    /// Divide every batch by 16 (at least 1): a smoke test of a few seconds.
    #[arg(long)]
    pub quick: bool,
    /// Timed runs per measurement; their median and minimum are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// Only measure this CPU's multiply-add peak (f32 and f64, the kernels' backend, every
    /// thread), against which the workload tables give their share.
    #[arg(long)]
    pub peak: bool,
}

fn precision_name(s: &str) -> Result<Precision, String> {
    Precision::from_name(s)
        .ok_or_else(|| format!("{s:?} is not a precision; expected f64, f32, tf32, bf16 or f16"))
}

fn output_name(s: &str) -> Result<Output, String> {
    Output::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Output::ALL.iter().map(|o| o.name()).collect();
        format!(
            "{s:?} is not a result; expected one of {}",
            names.join(", ")
        )
    })
}

fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a finite number >= 0, got {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("deformconv").chain(args.iter().copied()))
    }

    #[test]
    fn the_declaration_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_arguments_is_the_bench() {
        let c = parse(&[]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(
            c.bench,
            BenchArgs {
                quick: false,
                repeats: 5,
                peak: false
            }
        );
        assert!(parse(&["--quick"]).unwrap().bench.quick);
    }

    #[test]
    fn run_and_compare_arguments() {
        let c = parse(&["run", "a.npz", "-o", "b.npz", "--exact"]).unwrap();
        let Some(Command::Run(r)) = c.command else {
            panic!("not run")
        };
        assert_eq!(
            r,
            RunArgs {
                case: "a.npz".into(),
                out: "b.npz".into(),
                exact: true
            }
        );
        let c = parse(&["compare", "e.npz", "a.npz", "--rtol", "1e-3"]).unwrap();
        let Some(Command::Compare(c)) = c.command else {
            panic!("not compare")
        };
        assert_eq!((c.rtol, c.atol), (Some(1e-3), None));
        let c = parse(&["compare", "e", "a", "--only", "out,grad_input"]).unwrap();
        let Some(Command::Compare(c)) = c.command else {
            panic!("not compare")
        };
        assert_eq!(c.only, Some(vec![Output::Out, Output::GradInput]));
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for args in [
            &["run", "a.npz"][..],
            &["run", "-o"],
            &["compare", "a.npz"],
            &["compare", "a", "b", "--rtol", "x"],
            &["compare", "a", "b", "--atol", "-1"],
            &["frobnicate"],
            &["bench", "--repeats", "0"],
            &["run", "a.npz", "-o", "b.npz", "--fast"],
            &["compare", "a", "b", "--only", "out,grad_bais"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn a_typo_gets_a_suggestion() {
        let e = parse(&["comapre", "a", "b"]).unwrap_err().to_string();
        assert!(e.contains("compare"), "{e}");
    }
}
