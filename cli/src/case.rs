//! A case: the operands of one problem (from `CASE.npz`) and its parameters (from the JSON
//! sidecar `CASE.json`, the format of `tests/data/golden/`).
//!
//! ```json
//! {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
//!  "offset_groups": 1, "has_mask": true, "has_bias": false}
//! ```
//!
//! Every key is optional: stride, padding and dilation default to `[1, 1]`, `[0, 0]`, `[1, 1]`,
//! groups to 1, offset_groups to what the offset's channels imply, convention to
//! `"torchvision"` (also `"mmcv"`, `"dcn_v1"`). Stride, padding and dilation may be written as
//! torch does, `n` or `[h, w]`; padding also per side, `[top, bottom, left, right]` or
//! `{"top": t, "bottom": b, "left": l, "right": r}`. `has_mask` and `has_bias`, when given,
//! must agree with the arrays present. A key given twice is an error.

use std::path::{Path, PathBuf};

use deformconv::compare::Precision;
use deformconv::{ConvParams, Convention, Geometry, Padding};
use ndarray::{Array1, Array4, ArrayD, Ix1, Ix4};
use serde_json::{json, Value};

use crate::failure::{Failure, Outcome};
use crate::npz::{AnyArray, ArrayRef, Element, Npz};

/// The operands of one problem in element type `T`, validated.
#[derive(Debug, Clone)]
pub struct Case<T> {
    /// `[N, C_in, H, W]`.
    pub input: Array4<T>,
    /// `[N, 2 G_off kh kw, H_out, W_out]`.
    pub offset: Array4<T>,
    /// DCN v2 mask, if any.
    pub mask: Option<Array4<T>>,
    /// `[C_out, C_in/groups, kh, kw]`.
    pub weight: Array4<T>,
    /// `[C_out]`, if any.
    pub bias: Option<Array1<T>>,
    /// Output gradient, if the gradients are wanted.
    pub grad_out: Option<Array4<T>>,
    /// Parameters.
    pub params: ConvParams,
    /// The checked geometry.
    pub geometry: Geometry,
    /// The precision the kernel under test computes in, if the sidecar declares it.
    pub precision: Option<Precision>,
}

/// A case in the element type of its arrays.
#[derive(Debug, Clone)]
pub enum AnyCase {
    /// float32 arrays.
    F32(Case<f32>),
    /// float64 arrays.
    F64(Case<f64>),
}

/// `CASE.json` for `CASE.npz`.
pub fn sidecar(npz: &Path) -> PathBuf {
    npz.with_extension("json")
}

/// Whether `npz` holds the operands of a case (input, offset, weight).
pub fn has_operands(npz: &Npz) -> bool {
    ["input", "offset", "weight"].iter().all(|n| npz.has(n))
}

/// The parameters as read from the sidecar, before the offset groups are known.
struct JsonParams {
    params: ConvParams,
    precision: Option<Precision>,
    offset_groups: Option<usize>,
    has_mask: Option<bool>,
    has_bias: Option<bool>,
}

/// A JSON object's entries in file order, duplicates kept (serde_json's map keeps the last).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of parameters")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Entries, M::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = m.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn parse_json(text: &str) -> Result<JsonParams, String> {
    let Entries(entries) = serde_json::from_str(text)
        .map_err(|e| format!("not valid JSON (an object of parameters): {e}"))?;
    for (i, (key, _)) in entries.iter().enumerate() {
        if entries[..i].iter().any(|(k, _)| k == key) {
            return Err(format!("key {key:?} appears twice"));
        }
    }
    parse_params(&entries)
}

fn read_json(path: &Path) -> Outcome<JsonParams> {
    // A sidecar is a few hundred bytes; more than a megabyte is not one.
    const MAX_SIDECAR: u64 = 1 << 20;
    let bad = |msg: String| Failure::bad(format!("{}: {msg}", path.display()));
    let len = std::fs::metadata(path)
        .map_err(|e| bad(format!("cannot read the parameters sidecar: {e}")))?
        .len();
    if len > MAX_SIDECAR {
        return Err(bad(format!(
            "a parameters sidecar of {len} bytes; at most {MAX_SIDECAR} are read"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("cannot read the parameters sidecar: {e}")))?;
    parse_json(&text).map_err(bad)
}

fn count(key: &str, v: &Value) -> Result<usize, String> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{key} must be a non-negative integer, got {}", short(v)))
}

/// A value in a message, cut to a readable length.
fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// `n` or `[h, w]`, as torch writes an int-or-pair parameter.
fn pair(key: &str, v: &Value) -> Result<(usize, usize), String> {
    match v.as_array().map(Vec::as_slice) {
        None if v.is_number() => count(key, v).map(|n| (n, n)),
        Some([a, b]) => Ok((count(key, a)?, count(key, b)?)),
        _ => Err(format!("{key} must be n or [h, w], got {}", short(v))),
    }
}

fn flag(key: &str, v: &Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("{key} must be true or false, got {}", short(v)))
}

fn convention(v: &Value) -> Result<Convention, String> {
    match v.as_str() {
        Some("torchvision") => Ok(Convention::Torchvision),
        Some("mmcv") => Ok(Convention::Mmcv),
        Some("dcn_v1") => Ok(Convention::DcnV1),
        _ => Err(format!(
            "convention must be \"torchvision\", \"mmcv\" or \"dcn_v1\", got {}",
            short(v)
        )),
    }
}

/// The sidecar's name of a convention.
pub fn convention_name(c: Convention) -> &'static str {
    match c {
        Convention::Torchvision => "torchvision",
        Convention::Mmcv => "mmcv",
        Convention::DcnV1 => "dcn_v1",
    }
}

const KNOWN_KEYS: &str =
    "stride, padding, dilation, groups, offset_groups, has_mask, has_bias, convention, precision";

fn precision(v: &Value) -> Result<Precision, String> {
    v.as_str().and_then(Precision::from_name).ok_or_else(|| {
        format!(
            "precision must be \"f64\", \"f32\", \"tf32\", \"bf16\" or \"f16\", got {}",
            short(v)
        )
    })
}

fn parse_params(entries: &[(String, Value)]) -> Result<JsonParams, String> {
    let mut p = JsonParams {
        params: ConvParams::default(),
        precision: None,
        offset_groups: None,
        has_mask: None,
        has_bias: None,
    };
    for (key, v) in entries {
        match key.as_str() {
            "stride" => {
                let (h, w) = pair(key, v)?;
                p.params = p.params.stride(h, w);
            }
            "dilation" => {
                let (h, w) = pair(key, v)?;
                p.params = p.params.dilation(h, w);
            }
            "padding" => {
                p.params = p.params.padding_sides(padding(v)?);
            }
            "groups" => p.params = p.params.groups(count(key, v)?),
            "offset_groups" => p.offset_groups = Some(count(key, v)?),
            "has_mask" => p.has_mask = Some(flag(key, v)?),
            "has_bias" => p.has_bias = Some(flag(key, v)?),
            "convention" => p.params = p.params.convention(convention(v)?),
            "precision" => p.precision = Some(precision(v)?),
            other => {
                let mut shown: String = other.chars().take(40).collect();
                if shown.len() < other.len() {
                    shown.push_str("...");
                }
                return Err(format!("unknown key {shown:?} (known: {KNOWN_KEYS})"));
            }
        }
    }
    Ok(p)
}

/// `n`, `[h, w]`, `[top, bottom, left, right]` or `{"top", "bottom", "left", "right"}`.
fn padding(v: &Value) -> Result<Padding, String> {
    if let Value::Object(sides) = v {
        let mut pad = Padding::default();
        for (side, n) in sides {
            let n = count("padding", n)?;
            match side.as_str() {
                "top" => pad.top = n,
                "bottom" => pad.bottom = n,
                "left" => pad.left = n,
                "right" => pad.right = n,
                _ => {
                    return Err("unknown padding side (known: top, bottom, left, right)".to_string())
                }
            }
        }
        return Ok(pad);
    }
    if let Some([t, b, l, r]) = v.as_array().map(Vec::as_slice) {
        let c = |x| count("padding", x);
        return Ok(Padding {
            top: c(t)?,
            bottom: c(b)?,
            left: c(l)?,
            right: c(r)?,
        });
    }
    let (h, w) = pair("padding", v).map_err(|_| {
        format!(
            "padding must be n, [h, w], [top, bottom, left, right] or {{\"top\", \"bottom\", \"left\", \"right\"}}, got {}",
            short(v)
        )
    })?;
    Ok(Padding::symmetric(h, w))
}

/// The sidecar JSON of a case (golden format; padding as an object only when asymmetric; the
/// convention only when it is not torchvision's, the precision when one was declared).
pub fn params_json<T>(c: &Case<T>) -> Value {
    let (params, has_mask, has_bias) = (&c.params, c.mask.is_some(), c.bias.is_some());
    let p = params.padding;
    let padding = if p.top == p.bottom && p.left == p.right {
        json!([p.top, p.left])
    } else {
        json!({"top": p.top, "bottom": p.bottom, "left": p.left, "right": p.right})
    };
    let mut v = json!({
        "stride": [params.stride.0, params.stride.1],
        "padding": padding,
        "dilation": [params.dilation.0, params.dilation.1],
        "groups": params.groups,
        "offset_groups": params.offset_groups,
        "has_mask": has_mask,
        "has_bias": has_bias,
    });
    if params.convention != Convention::Torchvision {
        v["convention"] = json!(convention_name(params.convention));
    }
    if let Some(p) = c.precision {
        v["precision"] = json!(p.name());
    }
    v
}

/// Reads and validates the case `CASE.npz` + `CASE.json`.
pub fn read(path: &Path) -> Outcome<AnyCase> {
    let mut npz = Npz::open(path)?;
    read_from(&mut npz)
}

/// Reads and validates the case held by an open npz (its sidecar next to it).
pub fn read_from(npz: &mut Npz) -> Outcome<AnyCase> {
    let json_path = sidecar(npz.path());
    if !json_path.is_file() {
        return Err(Failure::bad(format!(
            "{}: parameters sidecar {} not found (stride, padding, dilation, groups, offset_groups; see docs/oracle-guide.md)",
            npz.path().display(),
            json_path.display()
        )));
    }
    let json = read_json(&json_path)?;
    build_case(npz, json, &json_path)
}

/// Validates the case held by `npz` with the parameters of the sidecar text `json` (from
/// memory: the fuzz target's entry point).
pub fn from_parts(npz: &mut Npz, json: &str) -> Outcome<AnyCase> {
    let json_path = sidecar(npz.path());
    let params =
        parse_json(json).map_err(|m| Failure::bad(format!("{}: {m}", json_path.display())))?;
    build_case(npz, params, &json_path)
}

fn build_case(npz: &mut Npz, json: JsonParams, json_path: &Path) -> Outcome<AnyCase> {
    let input = npz.require("input")?;
    let mut arrays: Vec<(&str, Option<AnyArray>)> = vec![("input", Some(input.clone()))];
    for name in ["offset", "weight"] {
        arrays.push((name, Some(npz.require(name)?)));
    }
    for name in ["mask", "bias", "grad_out"] {
        arrays.push((name, npz.get(name)?));
    }
    let file = npz.path().display().to_string();
    for (name, a) in &arrays {
        if let Some(a) = a {
            if a.dtype() != input.dtype() {
                return Err(Failure::bad(format!(
                    "{file}: {name} is {} but input is {}; every operand of a case must have one dtype",
                    a.dtype(),
                    input.dtype()
                )));
            }
        }
    }
    for (key, name, flag) in [
        ("has_mask", "mask", json.has_mask),
        ("has_bias", "bias", json.has_bias),
    ] {
        let present = arrays.iter().any(|(n, a)| *n == name && a.is_some());
        if let Some(said) = flag {
            if said != present {
                return Err(Failure::bad(format!(
                    "{}: {key} is {said} but {file} {} array {name}",
                    json_path.display(),
                    if present { "has an" } else { "has no" }
                )));
            }
        }
    }
    let take = |name: &str| -> Option<AnyArray> {
        arrays
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, a)| a.clone())
    };
    let ctx = Context {
        file: &file,
        json_offset_groups: json.offset_groups,
        params: json.params,
        precision: json.precision,
    };
    Ok(match input {
        AnyArray::F32(_) => AnyCase::F32(ctx.build(take)?),
        AnyArray::F64(_) => AnyCase::F64(ctx.build(take)?),
    })
}

struct Context<'a> {
    file: &'a str,
    json_offset_groups: Option<usize>,
    params: ConvParams,
    precision: Option<Precision>,
}

/// The expected rank and axes of each operand, for messages.
fn axes(name: &str) -> (usize, &'static str) {
    match name {
        "input" => (4, "[N, C_in, H, W]"),
        "offset" => (4, "[N, 2*offset_groups*kh*kw, H_out, W_out]"),
        "mask" => (4, "[N, offset_groups*kh*kw, H_out, W_out]"),
        "weight" => (4, "[C_out, C_in/groups, kh, kw]"),
        "bias" => (1, "[C_out]"),
        _ => (4, "[N, C_out, H_out, W_out]"),
    }
}

impl Context<'_> {
    fn build<T: Element>(&self, take: impl Fn(&str) -> Option<AnyArray>) -> Outcome<Case<T>> {
        let bad = |msg: String| Failure::bad(format!("{}: {msg}", self.file));
        let rank_checked = |name: &str| -> Outcome<Option<ArrayD<T>>> {
            let Some(a) = take(name) else { return Ok(None) };
            let (rank, layout) = axes(name);
            if a.shape().len() != rank {
                return Err(bad(format!(
                    "{name} has shape {:?} ({} dimensions); expected {rank} dimensions {layout}",
                    a.shape(),
                    a.shape().len()
                )));
            }
            let dtype = a.dtype();
            T::from_any(a)
                .map(Some)
                .ok_or_else(|| bad(format!("{name} is {dtype}; expected {}", T::DTYPE)))
        };
        let four = |name: &str| -> Outcome<Option<Array4<T>>> {
            rank_checked(name)?
                .map(|a| a.into_dimensionality::<Ix4>())
                .transpose()
                .map_err(|e| bad(format!("{name}: {e}")))
        };
        let missing = |name: &str| bad(format!("missing array {name}"));
        let input = four("input")?.ok_or_else(|| missing("input"))?;
        let offset = four("offset")?.ok_or_else(|| missing("offset"))?;
        let weight = four("weight")?.ok_or_else(|| missing("weight"))?;
        let mask = four("mask")?;
        let grad_out = four("grad_out")?;
        let bias = rank_checked("bias")?
            .map(|a| a.into_dimensionality::<Ix1>())
            .transpose()
            .map_err(|e| bad(format!("bias: {e}")))?;

        let (ws, is) = (weight.shape(), input.shape());
        let offset_groups = match (
            self.json_offset_groups,
            ws[2].checked_mul(ws[3]).and_then(|t| t.checked_mul(2)),
        ) {
            (Some(g), _) => g,
            (None, Some(per_group)) if per_group > 0 && offset.shape()[1] % per_group == 0 => {
                offset.shape()[1] / per_group
            }
            _ => {
                return Err(bad(format!(
                    "offset has {} channels, not a multiple of 2 * kh({}) * kw({}); give offset_groups in the JSON sidecar",
                    offset.shape()[1],
                    ws[2],
                    ws[3]
                )))
            }
        };
        let params = self.params.offset_groups(offset_groups);
        let geometry = Geometry::new(
            [is[0], is[1], is[2], is[3]],
            [ws[0], ws[1], ws[2], ws[3]],
            &params,
        )
        .map_err(|e| bad(e.to_string()))?;
        geometry
            .check_offset(offset.shape())
            .map_err(|e| bad(e.to_string()))?;
        if let Some(m) = &mask {
            geometry
                .check_mask(m.shape())
                .map_err(|e| bad(e.to_string()))?;
        }
        if let Some(b) = &bias {
            geometry
                .check_bias(b.len())
                .map_err(|e| bad(e.to_string()))?;
        }
        if let Some(g) = &grad_out {
            geometry
                .check_out("grad_out", g.shape())
                .map_err(|e| bad(e.to_string()))?;
        }
        Ok(Case {
            input,
            offset,
            mask,
            weight,
            bias,
            grad_out,
            params,
            geometry,
            precision: self.precision,
        })
    }
}

fn wrap<T: Element>(a: &Array4<T>) -> ArrayRef<'_> {
    T::array_ref(a.view().into_dyn())
}

impl<T: Element> Case<T> {
    /// The operands as named views, in file order, for writing.
    pub fn operand_refs(&self) -> Vec<(&'static str, ArrayRef<'_>)> {
        let mut v = vec![("input", wrap(&self.input)), ("offset", wrap(&self.offset))];
        if let Some(m) = &self.mask {
            v.push(("mask", wrap(m)));
        }
        v.push(("weight", wrap(&self.weight)));
        if let Some(b) = &self.bias {
            v.push(("bias", T::array_ref(b.view().into_dyn())));
        }
        if let Some(g) = &self.grad_out {
            v.push(("grad_out", wrap(g)));
        }
        v
    }

    /// The same case in f64 (exact widening).
    pub fn to_f64(&self) -> Case<f64> {
        let w = |a: &Array4<T>| a.mapv(T::to_f64);
        Case {
            input: w(&self.input),
            offset: w(&self.offset),
            mask: self.mask.as_ref().map(w),
            weight: w(&self.weight),
            bias: self.bias.as_ref().map(|b| b.mapv(T::to_f64)),
            grad_out: self.grad_out.as_ref().map(w),
            params: self.params,
            geometry: self.geometry,
            precision: self.precision,
        }
    }
}
