//! Command-line parsing (hand-rolled: three subcommands and a handful of flags).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::failure::{Failure, Outcome};

/// Usage text for `--help`.
pub const USAGE: &str = "\
usage:
  deformconv [bench] [--quick] [--repeats N]
      time workloads W1-W4 (deformable forward and backward, and our dense conv on the same
      shapes); the default command. --quick: batch / 16, for a smoke test; --repeats N
      timed runs per measurement (default 3; the median is reported).
  deformconv run CASE.npz -o OUT.npz [--exact]
      read the inputs of CASE.npz and the parameters of CASE.json, write OUT.npz (the inputs
      and out, plus every gradient when CASE.npz has grad_out) and OUT.json. float32 cases run
      the fast path in f32 (--exact: the f64 reference); float64 cases run in f64.
  deformconv compare EXPECTED.npz ACTUAL.npz [--rtol R] [--atol A] [--bound-factor C]
      compare the results present in both files, per tensor; by default against the per-element
      error bound of DESIGN.md section 5 (needs the inputs and the JSON sidecar of EXPECTED or
      ACTUAL), with --rtol/--atol against |actual - expected| <= atol + rtol * |expected|.
exit codes: 0 ok (compare: within tolerance), 1 compare: over tolerance, 2 bad arguments or files
";

/// `deformconv run`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// The case, `CASE.npz` (parameters in `CASE.json`).
    pub case: PathBuf,
    /// Where to write the results.
    pub out: PathBuf,
    /// Compute with the f64 reference instead of the fast path.
    pub exact: bool,
}

/// `deformconv compare`.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareArgs {
    /// The exact results.
    pub expected: PathBuf,
    /// The results to judge.
    pub actual: PathBuf,
    /// `--rtol`.
    pub rtol: Option<f64>,
    /// `--atol`.
    pub atol: Option<f64>,
    /// `--bound-factor` (the bound's `c`).
    pub bound_factor: Option<f64>,
}

/// `deformconv bench`.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchArgs {
    /// Small shapes for a smoke test.
    pub quick: bool,
    /// Timed repetitions per measurement (the median is reported).
    pub repeats: usize,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `--help`.
    Help,
    /// `run`.
    Run(RunArgs),
    /// `compare`.
    Compare(CompareArgs),
    /// `bench`, also with no arguments.
    Bench(BenchArgs),
}

fn usage_error(msg: String) -> Failure {
    Failure::bad(format!("{msg} (see `deformconv --help`)"))
}

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Outcome<T> {
    let value = value.ok_or_else(|| usage_error(format!("{flag} needs a value")))?;
    value
        .parse()
        .map_err(|_| usage_error(format!("{flag} {value:?} is not a valid number")))
}

fn non_negative(flag: &str, value: Option<String>) -> Outcome<f64> {
    let v: f64 = number(flag, value)?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(usage_error(format!(
            "{flag} must be a finite number >= 0, got {v}"
        )))
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Outcome<Command> {
    let mut args = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| usage_error(format!("argument {a:?} is not valid UTF-8")))
        })
        .collect::<Outcome<Vec<String>>>()?
        .into_iter();
    let first = args.next();
    let mut rest: Vec<String> = Vec::new();
    let sub = match first.as_deref() {
        None => "bench",
        Some("-h" | "--help" | "help") => return Ok(Command::Help),
        Some(s @ ("run" | "compare" | "bench")) => s,
        Some(flag) if flag.starts_with("--") => {
            // `deformconv --quick` means `deformconv bench --quick`.
            rest.push(flag.to_string());
            "bench"
        }
        Some(other) => {
            return Err(usage_error(format!(
                "unknown command {other:?}; expected run, compare or bench"
            )))
        }
    };
    rest.extend(args);
    let mut it = rest.into_iter();
    let mut positional = Vec::new();
    let (mut out, mut exact, mut quick, mut repeats) = (None, false, false, None);
    let (mut rtol, mut atol, mut bound_factor) = (None, None, None);
    while let Some(a) = it.next() {
        match (sub, a.as_str()) {
            (_, "-h" | "--help") => return Ok(Command::Help),
            ("run", "-o" | "--output") => {
                let v = it
                    .next()
                    .ok_or_else(|| usage_error(format!("{a} needs a file name")))?;
                out = Some(PathBuf::from(v));
            }
            ("run", "--exact") => exact = true,
            ("compare", "--rtol") => rtol = Some(non_negative(&a, it.next())?),
            ("compare", "--atol") => atol = Some(non_negative(&a, it.next())?),
            ("compare", "--bound-factor") => bound_factor = Some(non_negative(&a, it.next())?),
            ("bench", "--quick") => quick = true,
            ("bench", "--repeats") => {
                let n: usize = number(&a, it.next())?;
                if n == 0 {
                    return Err(usage_error("--repeats must be at least 1".into()));
                }
                repeats = Some(n);
            }
            (_, flag) if flag.starts_with('-') && flag.len() > 1 => {
                return Err(usage_error(format!("unknown option {flag} for {sub}")))
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    match sub {
        "run" => {
            let [case] = <[PathBuf; 1]>::try_from(positional)
                .map_err(|_| usage_error("run takes exactly one CASE.npz".into()))?;
            let out = out.ok_or_else(|| usage_error("run needs -o OUT.npz".into()))?;
            Ok(Command::Run(RunArgs { case, out, exact }))
        }
        "compare" => {
            let [expected, actual] = <[PathBuf; 2]>::try_from(positional).map_err(|_| {
                usage_error("compare takes exactly two files: EXPECTED.npz ACTUAL.npz".into())
            })?;
            Ok(Command::Compare(CompareArgs {
                expected,
                actual,
                rtol,
                atol,
                bound_factor,
            }))
        }
        _ => {
            if let Some(p) = positional.first() {
                return Err(usage_error(format!(
                    "bench takes no file argument, got {}",
                    p.display()
                )));
            }
            Ok(Command::Bench(BenchArgs {
                quick,
                repeats: repeats.unwrap_or(3),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Outcome<Command> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn no_arguments_is_the_bench() {
        let c = parse_strs(&[]).unwrap();
        assert_eq!(
            c,
            Command::Bench(BenchArgs {
                quick: false,
                repeats: 3
            })
        );
        assert!(matches!(
            parse_strs(&["--quick"]).unwrap(),
            Command::Bench(BenchArgs { quick: true, .. })
        ));
    }

    #[test]
    fn run_and_compare_arguments() {
        let c = parse_strs(&["run", "a.npz", "-o", "b.npz", "--exact"]).unwrap();
        assert_eq!(
            c,
            Command::Run(RunArgs {
                case: "a.npz".into(),
                out: "b.npz".into(),
                exact: true
            })
        );
        let c = parse_strs(&["compare", "e.npz", "a.npz", "--rtol", "1e-3"]).unwrap();
        let Command::Compare(c) = c else {
            panic!("not compare")
        };
        assert_eq!((c.rtol, c.atol), (Some(1e-3), None));
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
        ] {
            let e = parse_strs(args).unwrap_err();
            assert_eq!(e.code, 2, "{args:?}");
            assert!(e.message.contains("--help"), "{}", e.message);
        }
    }
}
