//! Hostile files through the binary: each defect of issue 15 (D1-D6 and the minor ones) as a
//! file or a command line that broke the tool before and gets one line and a documented exit
//! code now. The table in `docs/hostile-inputs.md` ("Files") lists them.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The binary under test; `DEFORMCONV_BIN` points these tests at another build (an old
/// one, to see each defect fail there).
fn bin() -> String {
    std::env::var("DEFORMCONV_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_deformconv").into())
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/data/golden/{name}"))
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hostile_files")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit 2 and exactly one line on stderr that contains `needle`.
fn expect_one_line(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}

/// An npz whose members are `(name, raw npy bytes)`, stored as numpy.savez stores them.
fn raw_npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    for (name, bytes) in members {
        let o = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        zip.start_file(format!("{name}.npy"), o).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// npy bytes of version `major` with header text `header` and `data` after it.
fn npy(major: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = b"\x93NUMPY".to_vec();
    b.extend_from_slice(&[major, 0]);
    if major == 1 {
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        b.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

/// A case whose `input` member is `input` and whose other members are a valid 1x1 problem.
fn case_with_input(dir: &Path, input: Vec<u8>) -> PathBuf {
    let one = |shape: &str| {
        npy(
            1,
            &format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"),
            &1.0f64.to_le_bytes(),
        )
    };
    let path = dir.join("case.npz");
    raw_npz(
        &path,
        &[
            ("input", input),
            ("offset", {
                let mut b = npy(
                    1,
                    "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 1, 1), }",
                    &[0u8; 16],
                );
                b.truncate(b.len());
                b
            }),
            ("weight", one("(1, 1, 1, 1)")),
        ],
    );
    fs::write(dir.join("case.json"), "{}").unwrap();
    path
}

#[test]
fn d1_claimed_sizes_beyond_the_file_are_refused_before_allocating() {
    let dir = scratch("d1");
    // 2^33 float64 elements claimed, 8 bytes present: the old reader allocated 64 GiB.
    let case = case_with_input(
        &dir,
        npy(
            1,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (8589934592,), }",
            &[0; 8],
        ),
    );
    let out = dir.join("out.npz");
    expect_one_line(
        &run(&["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()]),
        "needs 68719476736 bytes of data but the array holds 8",
    );
    // An npy v2 header_len of 4 GiB.
    let mut v2 = npy(2, "", &[]);
    v2[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let case = case_with_input(&dir, v2);
    expect_one_line(
        &run(&["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()]),
        "npy header of 4294967295 bytes; at most 10000 are read",
    );
    assert!(!out.exists());
}

#[test]
fn d2_an_overflowing_shape_is_refused_not_a_panic() {
    let dir = scratch("d2");
    let case = case_with_input(
        &dir,
        npy(
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775808), }",
            &[],
        ),
    );
    let out = dir.join("out.npz");
    expect_one_line(
        &run(&["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()]),
        "is too large to hold",
    );
}

#[test]
fn d3_a_deeply_nested_descr_is_one_step_not_a_hang() {
    let dir = scratch("d3");
    // 40 levels: the old recursive parser doubled its time per level (20 levels took 5.5 s).
    let header = format!(
        "{{'descr': {}'<f4'{}, 'fortran_order': False, 'shape': (1,), }}",
        "[('a', ".repeat(40),
        ")]".repeat(40)
    );
    let case = case_with_input(&dir, npy(1, &header, &[0; 4]));
    let out = dir.join("out.npz");
    expect_one_line(
        &run(&["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()]),
        "structured dtypes are not supported",
    );
    // A syntax error is one line too (it was six).
    let case = case_with_input(&dir, npy(1, "{'descr': '<f4' 'shape'", &[]));
    expect_one_line(
        &run(&["run", case.to_str().unwrap(), "-o", out.to_str().unwrap()]),
        "npy header: expected ','",
    );
}

#[test]
fn d4_an_output_whose_sidecar_collides_is_refused() {
    let dir = scratch("d4");
    let case = dir.join("k1x1.npz");
    fs::copy(golden("k1x1.npz"), &case).unwrap();
    fs::copy(golden("k1x1.json"), dir.join("k1x1.json")).unwrap();
    let c = case.to_str().unwrap();
    for (out, why) in [
        ("res.json", "its parameters sidecar would be the same file"),
        ("k1x1.json", "its parameters sidecar would be the same file"),
        ("k1x1", "its parameters sidecar would overwrite the case's"),
    ] {
        let out = dir.join(out);
        let before = fs::read(dir.join("k1x1.json")).unwrap();
        expect_one_line(&run(&["run", c, "-o", out.to_str().unwrap()]), why);
        assert_eq!(fs::read(dir.join("k1x1.json")).unwrap(), before);
    }
    assert!(!dir.join("res.json").exists());
    // Overwriting the case itself with its results is allowed, and keeps a readable case.
    let res = run(&["run", c, "-o", c]);
    assert_eq!(res.status.code(), Some(0), "{}", text(&res.stderr));
    let again = run(&["run", c, "-o", dir.join("again.npz").to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    // A device is not replaced by a file (and `ZipWriter drop failed` is gone).
    expect_one_line(
        &run(&["run", c, "-o", "/dev/full"]),
        "/dev/full: cannot write: exists and is not a regular file",
    );
}

#[test]
fn d5_a_failed_write_leaves_the_input_whole() {
    let dir = scratch("d5");
    let case = dir.join("k3x5.npz");
    fs::copy(golden("k3x5.npz"), &case).unwrap();
    fs::copy(golden("k3x5.json"), dir.join("k3x5.json")).unwrap();
    let before = fs::read(&case).unwrap();
    // A full disk, as the process sees one: files may not grow past 4 KiB (EFBIG), with
    // SIGXFSZ ignored so that the write fails instead of killing the process.
    let script = format!(
        "trap '' XFSZ; ulimit -f 4; exec {} run {1} -o {1}",
        bin(),
        case.display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot write"), "{err}");
    assert_eq!(fs::read(&case).unwrap(), before, "the input was changed");
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn d6_a_closed_stdout_keeps_the_verdict() {
    let dir = scratch("d6");
    let case = golden("dil2.npz");
    let exact = dir.join("exact.npz");
    let made = run(&[
        "run",
        case.to_str().unwrap(),
        "-o",
        exact.to_str().unwrap(),
        "--exact",
    ]);
    assert_eq!(made.status.code(), Some(0));
    for (actual, verdict) in [(&case, 0), (&exact, 0)] {
        // `| head -c1`: the reader takes one byte and goes away.
        let mut child = Command::new(bin())
            .args(["compare", exact.to_str().unwrap(), actual.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut one = [0u8; 1];
        child.stdout.take().unwrap().read_exact(&mut one).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(verdict), "{}", text(&out.stderr));
        assert!(!text(&out.stderr).contains("panicked"));
    }
}

#[test]
fn sidecar_mistakes_are_named_and_torch_style_parameters_accepted() {
    let dir = scratch("sidecar");
    let case = dir.join("k1x1.npz");
    fs::copy(golden("k1x1.npz"), &case).unwrap();
    let (c, out) = (case.to_str().unwrap(), dir.join("o.npz"));
    let o = out.to_str().unwrap();
    let with_json = |json: &str| {
        fs::write(dir.join("k1x1.json"), json).unwrap();
        run(&["run", c, "-o", o])
    };
    expect_one_line(
        &with_json(r#"{"groups": 1, "groups": 2}"#),
        "key \"groups\" appears twice",
    );
    expect_one_line(&with_json(r#"{"has_mask": false}"#), "has an array mask");
    expect_one_line(
        &with_json(r#"{"convention": "caffe"}"#),
        "convention must be \"torchvision\", \"mmcv\" or \"dcn_v1\"",
    );
    for ok in [
        r#"{"padding": 0, "stride": 1, "dilation": 1}"#,
        r#"{"padding": [0, 0, 0, 0], "convention": "mmcv"}"#,
    ] {
        let r = with_json(ok);
        assert_eq!(r.status.code(), Some(0), "{ok}: {}", text(&r.stderr));
    }
    // The convention is written back to the results' sidecar.
    let written = fs::read_to_string(dir.join("o.json")).unwrap();
    assert!(written.contains("\"convention\":\"mmcv\""), "{written}");
}

#[test]
fn missing_results_fail_unless_excluded_and_rtol_needs_no_sidecar() {
    let dir = scratch("missing");
    let case = golden("groups2.npz");
    let exact = dir.join("exact.npz");
    let made = run(&[
        "run",
        case.to_str().unwrap(),
        "-o",
        exact.to_str().unwrap(),
        "--exact",
    ]);
    assert_eq!(made.status.code(), Some(0));
    // An actual file with only out and grad_input (as a dump that drops `.grad is None`).
    let partial = dir.join("partial.npz");
    {
        let mut r = ndarray_npy::NpzReader::new(fs::File::open(&exact).unwrap()).unwrap();
        let mut w = ndarray_npy::NpzWriter::new(fs::File::create(&partial).unwrap());
        for name in ["out", "grad_input"] {
            let a: ndarray::ArrayD<f64> = r.by_name(name).unwrap();
            w.add_array(name, &a).unwrap();
        }
        w.finish().unwrap();
    }
    let (e, a) = (exact.to_str().unwrap(), partial.to_str().unwrap());
    let strict = run(&["compare", e, a]);
    assert_eq!(strict.status.code(), Some(1));
    let report = text(&strict.stdout);
    assert!(report.contains("MISSING grad_offset"), "{report}");
    let only = run(&["compare", e, a, "--only", "out,grad_input"]);
    assert_eq!(only.status.code(), Some(0), "{}", text(&only.stdout));
    // --rtol with a broken sidecar beside the expected file: compared, the bound noted absent.
    fs::write(dir.join("exact.json"), "{ broken").unwrap();
    let loose = run(&["compare", e, a, "--only", "out", "--rtol", "1e-9"]);
    assert_eq!(loose.status.code(), Some(0), "{}", text(&loose.stderr));
    assert!(text(&loose.stdout).contains("no error bound from"));
    // Without --rtol the broken sidecar is a bad file.
    expect_one_line(&run(&["compare", e, a, "--only", "out"]), "not valid JSON");
}

/// Rewrites every float array of `src` through `f` into `dst` (float32 kept float32).
fn map_npz(src: &Path, dst: &Path, keep: &[&str], f: impl Fn(f32) -> f32) {
    let mut r = ndarray_npy::NpzReader::new(fs::File::open(src).unwrap()).unwrap();
    let mut w = ndarray_npy::NpzWriter::new(fs::File::create(dst).unwrap());
    for name in r.names().unwrap() {
        if !keep.contains(&name.as_str()) {
            continue;
        }
        let a: ndarray::ArrayD<f64> = r.by_name(&name).unwrap();
        w.add_array(name.as_str(), &a.mapv(|v| f(v as f32)))
            .unwrap();
    }
    w.finish().unwrap();
}

/// bf16 rounding of an f32 (to nearest, ties to even; finite inputs).
fn bf16(v: f32) -> f32 {
    let b = v.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

#[test]
fn precision_profiles_from_the_flag_or_the_sidecar_and_a_json_report() {
    let dir = scratch("precision");
    let case = golden("groups2.npz");
    let exact = dir.join("exact.npz");
    let c = case.to_str().unwrap();
    let made = run(&["run", c, "-o", exact.to_str().unwrap(), "--exact"]);
    assert_eq!(made.status.code(), Some(0));
    // Results stored in bf16 (then widened to f32): a bf16 kernel's output.
    let mine = dir.join("mine.npz");
    let results = [
        "out",
        "grad_input",
        "grad_offset",
        "grad_mask",
        "grad_weight",
        "grad_bias",
    ];
    map_npz(&exact, &mine, &results, bf16);
    let (e, a) = (exact.to_str().unwrap(), mine.to_str().unwrap());
    let as_f32 = run(&["compare", e, a]);
    assert_eq!(as_f32.status.code(), Some(1), "bf16 results pass as f32");
    let report = dir.join("report.json");
    let as_bf16 = run(&[
        "compare",
        e,
        a,
        "--precision",
        "bf16",
        "--json",
        report.to_str().unwrap(),
    ]);
    assert_eq!(as_bf16.status.code(), Some(0), "{}", text(&as_bf16.stdout));
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["passed"], true);
    assert_eq!(v["precision"], "bf16");
    assert_eq!(v["tensors"].as_array().unwrap().len(), results.len());
    assert!(v["tensors"][0]["err_over_bound"].as_f64().unwrap() <= 1.0);
    // The same declared in the expected file's sidecar.
    let json = dir.join("exact.json");
    let mut params: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    params["precision"] = "bf16".into();
    fs::write(&json, params.to_string()).unwrap();
    let declared = run(&["compare", e, a]);
    assert_eq!(
        declared.status.code(),
        Some(0),
        "{}",
        text(&declared.stdout)
    );
    assert!(text(&declared.stdout).contains("precision bf16 (declared)"));
}

#[test]
fn an_mmcv_kernel_passes_under_its_convention_and_fails_under_torchvision() {
    let dir = scratch("convention");
    // Samples exactly on -1 and H - 1: where mmcv's offset gradient differs.
    let case = dir.join("oob.npz");
    fs::copy(golden("oob_boundary.npz"), &case).unwrap();
    let tv = fs::read_to_string(golden("oob_boundary.json")).unwrap();
    let mut mmcv: serde_json::Value = serde_json::from_str(&tv).unwrap();
    mmcv["convention"] = "mmcv".into();
    let (c, dir_s) = (case.to_str().unwrap(), dir.to_str().unwrap());
    let path = |n: &str| format!("{dir_s}/{n}");
    // "The kernel under test": our fast path under mmcv's convention, in f64.
    fs::write(dir.join("oob.json"), mmcv.to_string()).unwrap();
    assert_eq!(
        run(&["run", c, "-o", &path("mine.npz")]).status.code(),
        Some(0)
    );
    assert_eq!(
        run(&["run", c, "-o", &path("exact_mmcv.npz"), "--exact"])
            .status
            .code(),
        Some(0)
    );
    fs::write(dir.join("oob.json"), &tv).unwrap();
    assert_eq!(
        run(&["run", c, "-o", &path("exact_tv.npz"), "--exact"])
            .status
            .code(),
        Some(0)
    );
    let same = run(&["compare", &path("exact_mmcv.npz"), &path("mine.npz")]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stdout));
    let other = run(&["compare", &path("exact_tv.npz"), &path("mine.npz")]);
    assert_eq!(other.status.code(), Some(1), "{}", text(&other.stdout));
    assert!(
        text(&other.stdout).contains("tensor(s): grad_offset"),
        "{}",
        text(&other.stdout)
    );
}
