//! Golden cases (torchvision float64 results, `tests/data/golden/`) and the relative
//! comparison the f64 paths are held to.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use deformconv::{ConvParams, Padding};
use ndarray::{ArrayD, Dimension};
use ndarray_npy::NpzReader;

/// The golden cases, inside the repository and the packaged crate (`tests/data/golden/`).
pub fn golden_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden");
    assert!(dir.is_dir(), "golden cases not found at {}", dir.display());
    dir
}

/// One golden case: its name, parameters and every array of its npz.
pub struct GoldenCase {
    pub name: String,
    pub params: ConvParams,
    pub has_mask: bool,
    pub has_bias: bool,
    pub arrays: BTreeMap<String, ArrayD<f64>>,
}

impl GoldenCase {
    pub fn get(&self, key: &str) -> &ArrayD<f64> {
        self.arrays
            .get(key)
            .unwrap_or_else(|| panic!("{}: array {key} missing", self.name))
    }
    pub fn get4(&self, key: &str) -> ndarray::ArrayView4<'_, f64> {
        self.get(key).view().into_dimensionality().unwrap()
    }
    pub fn opt4(&self, key: &str) -> Option<ndarray::ArrayView4<'_, f64>> {
        self.arrays
            .get(key)
            .map(|a| a.view().into_dimensionality().unwrap())
    }
}

fn pair(v: &serde_json::Value, key: &str) -> (usize, usize) {
    let a = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} not a pair"));
    (
        a[0].as_u64().unwrap() as usize,
        a[1].as_u64().unwrap() as usize,
    )
}

/// Parses a golden `NAME.json` sidecar into parameters.
pub fn params_from_json(v: &serde_json::Value) -> ConvParams {
    let (sh, sw) = pair(v, "stride");
    let (ph, pw) = pair(v, "padding");
    let (dh, dw) = pair(v, "dilation");
    ConvParams::default()
        .stride(sh, sw)
        .padding_sides(Padding::symmetric(ph, pw))
        .dilation(dh, dw)
        .groups(v["groups"].as_u64().unwrap() as usize)
        .offset_groups(v["offset_groups"].as_u64().unwrap() as usize)
}

/// Every golden case, sorted by name.
pub fn golden_cases() -> Vec<GoldenCase> {
    let dir = golden_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "npz").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let json: serde_json::Value =
                serde_json::from_reader(File::open(dir.join(format!("{name}.json"))).unwrap())
                    .unwrap();
            let mut npz =
                NpzReader::new(File::open(dir.join(format!("{name}.npz"))).unwrap()).unwrap();
            let mut arrays = BTreeMap::new();
            for key in npz.names().unwrap() {
                let a: ArrayD<f64> = npz.by_name(&key).unwrap();
                arrays.insert(key.trim_end_matches(".npy").to_string(), a);
            }
            GoldenCase {
                params: params_from_json(&json),
                has_mask: json["has_mask"].as_bool().unwrap(),
                has_bias: json["has_bias"].as_bool().unwrap(),
                name,
                arrays,
            }
        })
        .collect()
}

/// The worst element of `|got - want|` relative to `max |want|` (or 1 if all zero), with its
/// index: `(relative error, index, got, want)`.
pub fn worst_relative<D: Dimension>(
    got: &ndarray::ArrayView<'_, f64, D>,
    want: &ndarray::ArrayView<'_, f64, D>,
) -> (f64, Vec<usize>, f64, f64) {
    assert_eq!(got.shape(), want.shape(), "shape mismatch");
    let scale = want
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    let mut worst = (0.0, vec![], 0.0, 0.0);
    let (got, want) = (got.view().into_dyn(), want.view().into_dyn());
    for ((idx, &g), &w) in got.indexed_iter().zip(want.iter()) {
        let err = if g.is_nan() || w.is_nan() {
            if g.is_nan() && w.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (g - w).abs() / scale
        };
        if err > worst.0 || worst.1.is_empty() {
            worst = (err, idx.slice().to_vec(), g, w);
        }
    }
    worst
}

/// Asserts `got` matches `want` within `tol` relative to `max |want|`, naming the case, the
/// tensor, the worst index and both values on failure.
pub fn assert_rel_close<D: Dimension>(
    case: &str,
    tensor: &str,
    got: &ndarray::ArrayView<'_, f64, D>,
    want: &ndarray::ArrayView<'_, f64, D>,
    tol: f64,
) {
    let (err, idx, g, w) = worst_relative(got, want);
    assert!(
        err <= tol,
        "{case}: {tensor} differs at {idx:?}: got {g:e}, want {w:e} (relative error {err:e} > {tol:e})"
    );
}
