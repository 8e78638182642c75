//! The `deformconv` binary: `run` then `compare` on every golden case, perturbed results caught
//! at the right index, every kind of bad file rejected with exit code 2 and one clear line.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::{ArrayD, Dimension, IxDyn};
use ndarray_npy::{NpzReader, NpzWriter};

const BIN: &str = env!("CARGO_BIN_EXE_deformconv");

/// The golden cases of the repository (`tests/data/golden/` of the library crate).
fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/golden")
}

/// A fresh directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn deformconv(args: &[&Path]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts exit code `code`; returns stdout.
fn expect_code(out: &Output, code: i32, what: &str) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Asserts a bad-file failure: exit 2, one line on stderr containing `needle`, no panic.
fn expect_bad(out: &Output, needle: &str, what: &str) {
    expect_code(out, 2, what);
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{what}: not one line: {err}");
    assert!(err.starts_with("deformconv: "), "{what}: {err}");
    assert!(err.contains(needle), "{what}: {err:?} lacks {needle:?}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

fn read_all(path: &Path) -> Vec<(String, ArrayD<f64>)> {
    let mut npz = NpzReader::new(File::open(path).unwrap()).unwrap();
    let names = npz.names().unwrap();
    names
        .into_iter()
        .map(|n| {
            let a: ArrayD<f64> = npz.by_name(&n).unwrap();
            (n, a)
        })
        .collect()
}

/// Writes the f64 arrays of `arrays` to `path`, converting those named in `as_f32` to f32.
fn write_npz(path: &Path, arrays: &[(String, ArrayD<f64>)], as_f32: &[&str]) {
    let mut npz = NpzWriter::new(File::create(path).unwrap());
    for (name, a) in arrays {
        if as_f32.contains(&name.as_str()) || as_f32 == ["*"] {
            npz.add_array(name.as_str(), &a.mapv(|v| v as f32)).unwrap();
        } else {
            npz.add_array(name.as_str(), a).unwrap();
        }
    }
    npz.finish().unwrap();
}

/// Copies golden case `name` into `dir` (npz and json), applying `edit` to its arrays.
fn golden_copy(
    dir: &Path,
    name: &str,
    as_f32: &[&str],
    edit: impl FnOnce(&mut Vec<(String, ArrayD<f64>)>),
) -> PathBuf {
    let g = golden_dir();
    let mut arrays = read_all(&g.join(format!("{name}.npz")));
    edit(&mut arrays);
    let path = dir.join(format!("{name}.npz"));
    write_npz(&path, &arrays, as_f32);
    fs::copy(
        g.join(format!("{name}.json")),
        dir.join(format!("{name}.json")),
    )
    .unwrap();
    path
}

const RESULTS: [&str; 6] = [
    "out",
    "grad_input",
    "grad_offset",
    "grad_mask",
    "grad_weight",
    "grad_bias",
];

#[test]
fn every_golden_case_runs_and_compares_within_the_bound() {
    let dir = scratch("golden");
    let golden = golden_dir();
    let mut names: Vec<String> = fs::read_dir(&golden)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "npz").then(|| p.file_stem().unwrap().to_string_lossy().into())
        })
        .collect();
    names.sort();
    assert!(names.len() >= 50, "golden set incomplete: {}", names.len());
    for name in &names {
        let case = golden.join(format!("{name}.npz"));
        let out = dir.join(format!("{name}.npz"));
        expect_code(
            &deformconv(&[Path::new("run"), &case, "-o".as_ref(), &out]),
            0,
            name,
        );
        assert!(
            dir.join(format!("{name}.json")).is_file(),
            "{name}: no sidecar"
        );
        let report = expect_code(&deformconv(&[Path::new("compare"), &case, &out]), 0, name);
        assert!(report.contains("PASS"), "{name}: {report}");
        assert!(report.contains("DESIGN §5 bound"), "{name}: {report}");
        // Every result of the golden file was compared.
        let golden_names: Vec<String> = read_all(&case).into_iter().map(|(n, _)| n).collect();
        for r in RESULTS
            .iter()
            .filter(|r| golden_names.iter().any(|n| n == *r))
        {
            assert!(
                report.lines().any(|l| l.starts_with(&format!("{r} "))),
                "{name}: {r} not compared:\n{report}"
            );
        }
    }
}

#[test]
fn float32_cases_run_the_fast_path_and_exact_gives_float64() {
    let dir = scratch("f32");
    let inputs = ["input", "offset", "mask", "weight", "bias", "grad_out"];
    let case = golden_copy(&dir, "batch2", &["*"], |a| {
        a.retain(|(n, _)| inputs.contains(&n.as_str()))
    });
    let fast = dir.join("fast.npz");
    let exact = dir.join("exact.npz");
    let stdout = expect_code(
        &deformconv(&[Path::new("run"), &case, "-o".as_ref(), &fast]),
        0,
        "run f32",
    );
    assert!(stdout.contains("fast path, float32"), "{stdout}");
    let stdout = expect_code(
        &deformconv(&[
            Path::new("run"),
            &case,
            "-o".as_ref(),
            &exact,
            "--exact".as_ref(),
        ]),
        0,
        "run --exact",
    );
    assert!(stdout.contains("f64 reference, float64"), "{stdout}");
    // The output dtypes: f32 results from the fast path, f64 from the reference.
    let mut npz = NpzReader::new(File::open(&fast).unwrap()).unwrap();
    assert!(npz.by_name::<ndarray::OwnedRepr<f32>, IxDyn>("out").is_ok());
    let mut npz = NpzReader::new(File::open(&exact).unwrap()).unwrap();
    assert!(npz.by_name::<ndarray::OwnedRepr<f64>, IxDyn>("out").is_ok());
    let report = expect_code(
        &deformconv(&[Path::new("compare"), &exact, &fast]),
        0,
        "cmp",
    );
    assert!(report.contains("2^-24"), "{report}");
    for r in RESULTS {
        assert!(report.contains(r), "{r} missing:\n{report}");
    }
}

/// Finds the report row of `tensor`.
fn row<'a>(report: &'a str, tensor: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(&format!("{tensor} ")))
        .unwrap_or_else(|| panic!("no row for {tensor}:\n{report}"))
}

#[test]
fn a_perturbed_result_is_caught_at_its_index() {
    let dir = scratch("perturbed");
    let case = golden_dir().join("groups2_og4.npz");
    let ours = dir.join("ours.npz");
    expect_code(
        &deformconv(&[Path::new("run"), &case, "-o".as_ref(), &ours]),
        0,
        "run",
    );
    let mut arrays = read_all(&ours);
    let idx = [0, 3, 2, 1];
    let (_, gi) = arrays.iter_mut().find(|(n, _)| n == "grad_input").unwrap();
    gi[IxDyn(&idx)] += 1e-6 * (1.0 + gi[IxDyn(&idx)].abs());
    let bad = dir.join("bad.npz");
    write_npz(&bad, &arrays, &[]);
    let out = deformconv(&[Path::new("compare"), &case, &bad]);
    let report = expect_code(&out, 1, "perturbed");
    let r = row(&report, "grad_input");
    assert!(r.contains("[0, 3, 2, 1]"), "{r}");
    assert!(r.contains(" 1/"), "one element over tolerance: {r}");
    assert!(row(&report, "out").contains(" 0/"), "{report}");
    assert!(
        report.contains("FAIL") && report.contains("grad_input"),
        "{report}"
    );

    // A loose enough absolute tolerance accepts it; a strict relative one does not.
    let loose = deformconv(&[
        Path::new("compare"),
        &case,
        &bad,
        "--atol".as_ref(),
        "1e-3".as_ref(),
    ]);
    let report = expect_code(&loose, 0, "--atol 1e-3");
    assert!(
        report.contains("1e-3 * |expected|") || report.contains("<= 1e-3"),
        "{report}"
    );
    let strict = deformconv(&[
        Path::new("compare"),
        &case,
        &bad,
        "--rtol".as_ref(),
        "1e-9".as_ref(),
    ]);
    let report = expect_code(&strict, 1, "--rtol 1e-9");
    assert!(
        row(&report, "grad_input").contains("[0, 3, 2, 1]"),
        "{report}"
    );
}

#[test]
fn compare_without_operands_falls_back_to_a_relative_tolerance() {
    let dir = scratch("no_operands");
    let only_results = |a: &mut Vec<(String, ArrayD<f64>)>| {
        a.retain(|(n, _)| RESULTS.contains(&n.as_str()));
    };
    let expected = golden_copy(&dir, "k3x5", &[], only_results);
    let actual = dir.join("actual.npz");
    fs::copy(&expected, &actual).unwrap();
    let report = expect_code(
        &deformconv(&[Path::new("compare"), &expected, &actual]),
        0,
        "",
    );
    assert!(report.contains("no error bound"), "{report}");
    assert!(row(&report, "out").contains("n/a"), "{report}");
}

#[test]
fn bad_files_exit_2_with_one_clear_line() {
    let dir = scratch("bad");
    let golden = golden_dir();
    let good = golden.join("batch2.npz");
    let run =
        |case: &Path| deformconv(&[Path::new("run"), case, "-o".as_ref(), &dir.join("o.npz")]);

    // Missing and unreadable files.
    expect_bad(&run(&dir.join("absent.npz")), "cannot open", "missing npz");
    let truncated = dir.join("truncated.npz");
    let bytes = fs::read(&good).unwrap();
    fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    fs::copy(golden.join("batch2.json"), dir.join("truncated.json")).unwrap();
    expect_bad(&run(&truncated), "not a valid npz", "truncated npz");
    let text_file = dir.join("text.npz");
    fs::write(&text_file, "input,offset\n1,2\n").unwrap();
    expect_bad(&run(&text_file), "not a valid npz", "not a zip");
    // numpy.savez_compressed stores deflated members: patch the deflate method id (8) into the
    // local and central headers of an uncompressed archive; the reader refuses the method
    // before inflating anything.
    let mut deflated = bytes.clone();
    for (sig, method_at) in [(&b"PK\x03\x04"[..], 8), (&b"PK\x01\x02"[..], 10)] {
        let mut i = 0;
        while let Some(p) = deflated[i..].windows(4).position(|w| w == sig) {
            deflated[i + p + method_at] = 8;
            i += p + 4;
        }
    }
    let compressed = dir.join("compressed.npz");
    fs::write(&compressed, &deflated).unwrap();
    fs::copy(golden.join("batch2.json"), dir.join("compressed.json")).unwrap();
    expect_bad(&run(&compressed), "savez_compressed", "compressed npz");

    // Missing arrays and sidecars.
    let no_weight = golden_copy(&dir, "k1x1", &[], |a| a.retain(|(n, _)| n != "weight"));
    expect_bad(&run(&no_weight), "missing array weight", "no weight");
    let no_json = dir.join("no_json.npz");
    fs::copy(&good, &no_json).unwrap();
    expect_bad(&run(&no_json), "no_json.json not found", "missing json");

    // Wrong dtypes.
    let ints = dir.join("ints.npz");
    {
        let arrays = read_all(&good);
        let mut npz = NpzWriter::new(File::create(&ints).unwrap());
        for (name, a) in &arrays {
            if name == "input" {
                npz.add_array(name.as_str(), &a.mapv(|v| v as i64)).unwrap();
            } else {
                npz.add_array(name.as_str(), a).unwrap();
            }
        }
        npz.finish().unwrap();
        fs::copy(golden.join("batch2.json"), dir.join("ints.json")).unwrap();
    }
    expect_bad(
        &run(&ints),
        "array input: dtype \"<i8\" is not supported",
        "int64 input",
    );
    let mixed = golden_copy(&dir, "dil2", &["offset"], |_| {});
    expect_bad(
        &run(&mixed),
        "offset is float32 but input is float64",
        "mixed",
    );

    // Wrong shapes.
    let short_offset = golden_copy(&dir, "groups2", &[], |a| {
        let (_, off) = a.iter_mut().find(|(n, _)| n == "offset").unwrap();
        let c = off.shape()[1];
        *off = off
            .slice_axis(ndarray::Axis(1), (0..c - 1).into())
            .to_owned();
    });
    expect_bad(
        &run(&short_offset),
        "offset has 17 channels; expected",
        "offset channels",
    );
    let flat_weight = golden_copy(&dir, "k5x5", &[], |a| {
        let (_, w) = a.iter_mut().find(|(n, _)| n == "weight").unwrap();
        let s = w.shape().to_vec();
        *w = w
            .clone()
            .into_shape_with_order(vec![s[0], s[1], s[2] * s[3]])
            .unwrap();
    });
    expect_bad(&run(&flat_weight), "weight has shape", "weight rank");
    let short_grad = golden_copy(&dir, "dil1x3", &[], |a| {
        let (_, g) = a.iter_mut().find(|(n, _)| n == "grad_out").unwrap();
        *g = g.slice_axis(ndarray::Axis(3), (0..1).into()).to_owned();
    });
    expect_bad(
        &run(&short_grad),
        "grad_out has 1 columns; expected",
        "grad_out columns",
    );

    // Bad sidecars.
    let bad_json = golden_copy(&dir, "k3x5", &[], |_| {});
    fs::write(dir.join("k3x5.json"), "{\"stride\": [1, 1],").unwrap();
    expect_bad(&run(&bad_json), "not valid JSON", "truncated json");
    fs::write(dir.join("k3x5.json"), "{\"strides\": [1, 1]}").unwrap();
    expect_bad(&run(&bad_json), "unknown key \"strides\"", "typo json");
    fs::write(dir.join("k3x5.json"), "{\"stride\": [0, 1]}").unwrap();
    expect_bad(&run(&bad_json), "stride", "stride 0");
    fs::write(dir.join("k3x5.json"), "{\"has_mask\": false}").unwrap();
    expect_bad(
        &run(&bad_json),
        "has_mask is false but",
        "has_mask mismatch",
    );

    // compare: results of different shapes, nothing in common.
    let out_a = dir.join("a.npz");
    expect_code(
        &deformconv(&[Path::new("run"), &good, "-o".as_ref(), &out_a]),
        0,
        "run",
    );
    let other = golden.join("batch3_v1.npz");
    expect_bad(
        &deformconv(&[Path::new("compare"), &good, &other]),
        "out has shape",
        "shape mismatch",
    );
    let inputs_only = golden_copy(&dir, "half_offsets", &[], |a| {
        a.retain(|(n, _)| !RESULTS.contains(&n.as_str()))
    });
    expect_bad(
        &deformconv(&[Path::new("compare"), &inputs_only, &out_a]),
        "no result array in common",
        "no common results",
    );
    expect_bad(
        &deformconv(&[Path::new("compare"), &good, &dir.join("absent.npz")]),
        "cannot open",
        "compare missing file",
    );

    // Usage errors: clap's format (an `error:` line, the usage, a hint), exit 2.
    expect_usage(
        &deformconv(&[Path::new("run"), &good]),
        "--output <OUT.npz>",
        "no -o",
    );
    expect_usage(
        &deformconv(&[Path::new("frobnicate")]),
        "unrecognized subcommand 'frobnicate'",
        "bad command",
    );
    expect_usage(
        &deformconv(&[Path::new("comapre")]),
        "a similar subcommand exists: 'compare'",
        "typo",
    );
}

/// Asserts a usage error: exit 2, clap's `error:` first line, `needle` somewhere, no panic.
fn expect_usage(out: &Output, needle: &str, what: &str) {
    expect_code(out, 2, what);
    let err = text(&out.stderr);
    assert!(err.starts_with("error: "), "{what}: {err}");
    assert!(err.contains(needle), "{what}: {err:?} lacks {needle:?}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

#[test]
fn help_and_version() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["compare", "--help"],
        &["bench", "--help"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let stdout = expect_code(&out, 0, &format!("{args:?}"));
        assert!(stdout.contains("Usage: deformconv"), "{args:?}: {stdout}");
    }
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let stdout = expect_code(&out, 0, "--version");
    assert_eq!(
        stdout.trim(),
        format!("deformconv {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bench_quick_prints_what_it_computed_and_timings() {
    let out = Command::new(BIN)
        .args(["bench", "--quick", "--repeats", "1"])
        .output()
        .unwrap();
    let stdout = expect_code(&out, 0, "bench --quick");
    for w in deformconv::workloads::all().map(|w| w.name) {
        assert!(stdout.contains(w), "{w} missing:\n{stdout}");
    }
    assert!(
        stdout.contains("GFLOP/s") && stdout.contains("sum(out)"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("[13/13] R50-DCN-c5"),
        "no progress line"
    );
}

#[test]
fn sidecar_defaults_inferred_offset_groups_and_asymmetric_padding() {
    let dir = scratch("sidecar");
    // depthwise_og4 without offset_groups in its JSON: inferred from the offset channels.
    let case = golden_copy(&dir, "depthwise_og4", &[], |_| {});
    let json = dir.join("depthwise_og4.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("offset_groups");
    fs::write(&json, v.to_string()).unwrap();
    let out = dir.join("og.npz");
    expect_code(
        &deformconv(&[Path::new("run"), &case, "-o".as_ref(), &out]),
        0,
        "run",
    );
    expect_code(
        &deformconv(&[Path::new("compare"), &case, &out]),
        0,
        "compare",
    );

    // A float32 case with per-side padding (top 1, bottom 0, left 0, right 2) on a 5x4 image
    // and a 3x3 kernel: H_out = 5 + 1 - 3 + 1 = 4, W_out = 4 + 2 - 3 + 1 = 4.
    let wave = |shape: &[usize], phase: f32| {
        ArrayD::from_shape_fn(IxDyn(shape), |i| {
            let k: usize = i
                .slice()
                .iter()
                .enumerate()
                .map(|(a, &b)| (a + 3) * b)
                .sum();
            (k as f32 * 0.37 + phase).sin() * 1.5
        })
    };
    let path = dir.join("asym.npz");
    let mut npz = NpzWriter::new(File::create(&path).unwrap());
    npz.add_array("input", &wave(&[1, 2, 5, 4], 0.0)).unwrap();
    npz.add_array("offset", &wave(&[1, 18, 4, 4], 1.0)).unwrap();
    npz.add_array("weight", &wave(&[3, 2, 3, 3], 2.0)).unwrap();
    npz.add_array("grad_out", &wave(&[1, 3, 4, 4], 3.0))
        .unwrap();
    npz.finish().unwrap();
    fs::write(
        dir.join("asym.json"),
        r#"{"padding": {"top": 1, "bottom": 0, "left": 0, "right": 2}}"#,
    )
    .unwrap();
    let (fast, exact) = (dir.join("fast.npz"), dir.join("exact.npz"));
    expect_code(
        &deformconv(&[Path::new("run"), &path, "-o".as_ref(), &fast]),
        0,
        "fast",
    );
    expect_code(
        &deformconv(&[
            Path::new("run"),
            &path,
            "-o".as_ref(),
            &exact,
            "--exact".as_ref(),
        ]),
        0,
        "exact",
    );
    let sidecar = fs::read_to_string(dir.join("exact.json")).unwrap();
    assert!(
        sidecar.contains(r#""right":2"#) && sidecar.contains(r#""top":1"#),
        "{sidecar}"
    );
    let report = expect_code(
        &deformconv(&[Path::new("compare"), &exact, &fast]),
        0,
        "cmp",
    );
    assert!(row(&report, "out").contains("[1, 3, 4, 4]"), "{report}");
    assert!(
        !report.contains("grad_mask"),
        "no mask, no grad_mask: {report}"
    );
}
