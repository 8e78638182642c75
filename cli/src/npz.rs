//! npz files (numpy `savez`) through `ndarray-npy`: float32 or float64 arrays by name.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, ArrayViewD};
use ndarray_npy::{NpzReader, NpzWriter, ReadNpyError, ReadNpzError};

use crate::failure::{Failure, Outcome};

/// An array as read: float32 or float64.
#[derive(Debug, Clone)]
pub enum AnyArray {
    /// float32 (`<f4`).
    F32(ArrayD<f32>),
    /// float64 (`<f8`).
    F64(ArrayD<f64>),
}

impl AnyArray {
    /// numpy's name of the element type.
    pub fn dtype(&self) -> &'static str {
        match self {
            AnyArray::F32(_) => "float32",
            AnyArray::F64(_) => "float64",
        }
    }
    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            AnyArray::F32(a) => a.shape(),
            AnyArray::F64(a) => a.shape(),
        }
    }
    /// The values widened to f64 (exact).
    pub fn to_f64(&self) -> ArrayD<f64> {
        match self {
            AnyArray::F32(a) => a.mapv(f64::from),
            AnyArray::F64(a) => a.clone(),
        }
    }
    /// Unit round-off of the element type.
    pub fn eps(&self) -> f64 {
        match self {
            AnyArray::F32(_) => f64::from(f32::EPSILON) / 2.0,
            AnyArray::F64(_) => f64::EPSILON / 2.0,
        }
    }
}

/// f32 or f64: the element types a case may have.
pub trait Element: deformconv::Float {
    /// numpy's name of the type.
    const DTYPE: &'static str;
    /// The array if it has this element type.
    fn from_any(a: AnyArray) -> Option<ArrayD<Self>>;
    /// A view to write.
    fn array_ref(a: ArrayViewD<'_, Self>) -> ArrayRef<'_>;
}

impl Element for f32 {
    const DTYPE: &'static str = "float32";
    fn from_any(a: AnyArray) -> Option<ArrayD<Self>> {
        match a {
            AnyArray::F32(a) => Some(a),
            AnyArray::F64(_) => None,
        }
    }
    fn array_ref(a: ArrayViewD<'_, Self>) -> ArrayRef<'_> {
        ArrayRef::F32(a)
    }
}

impl Element for f64 {
    const DTYPE: &'static str = "float64";
    fn from_any(a: AnyArray) -> Option<ArrayD<Self>> {
        match a {
            AnyArray::F64(a) => Some(a),
            AnyArray::F32(_) => None,
        }
    }
    fn array_ref(a: ArrayViewD<'_, Self>) -> ArrayRef<'_> {
        ArrayRef::F64(a)
    }
}

/// An open npz file: its array names, read on demand.
pub struct Npz {
    path: PathBuf,
    names: Vec<String>,
    reader: NpzReader<BufReader<File>>,
}

fn describe(e: &ReadNpzError) -> String {
    match e {
        ReadNpzError::Zip(z) if z.to_string().contains("Compression method not supported") => {
            "compressed npz (numpy.savez_compressed) is not supported; write it with numpy.savez"
                .to_string()
        }
        ReadNpzError::Zip(z) => {
            format!("not a valid npz file (truncated, or not a zip archive): {z}")
        }
        ReadNpzError::Npy(n) => format!("bad npy data: {n}"),
    }
}

impl Npz {
    /// Opens `path`; a missing, unreadable or truncated file is a bad file.
    pub fn open(path: &Path) -> Outcome<Self> {
        let file = File::open(path)
            .map_err(|e| Failure::bad(format!("{}: cannot open: {e}", path.display())))?;
        let bad = |e: ReadNpzError| Failure::bad(format!("{}: {}", path.display(), describe(&e)));
        let mut reader = NpzReader::new(BufReader::new(file)).map_err(bad)?;
        let names = reader.names().map_err(bad)?;
        Ok(Npz {
            path: path.to_path_buf(),
            names,
            reader,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file has an array called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Reads `name` if present; float32 or float64 only.
    pub fn get(&mut self, name: &str) -> Outcome<Option<AnyArray>> {
        if !self.has(name) {
            return Ok(None);
        }
        let path = self.path.display().to_string();
        let bad = |e: ReadNpzError| Failure::bad(format!("{path}: array {name}: {}", describe(&e)));
        match self.reader.by_name::<_, ndarray::IxDyn>(name) {
            Ok(a) => return Ok(Some(AnyArray::F64(a))),
            Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_))) => {}
            Err(e) => return Err(bad(e)),
        }
        match self.reader.by_name::<_, ndarray::IxDyn>(name) {
            Ok(a) => Ok(Some(AnyArray::F32(a))),
            Err(ReadNpzError::Npy(ReadNpyError::WrongDescriptor(d))) => Err(Failure::bad(format!(
                "{path}: array {name} has dtype {d}; expected float32 or float64"
            ))),
            Err(e) => Err(bad(e)),
        }
    }

    /// Reads `name`, which must be present.
    pub fn require(&mut self, name: &str) -> Outcome<AnyArray> {
        self.get(name)?.ok_or_else(|| {
            Failure::bad(format!(
                "{}: missing array {name} (has: {})",
                self.path.display(),
                if self.names.is_empty() {
                    "nothing".to_string()
                } else {
                    self.names.join(", ")
                }
            ))
        })
    }
}

/// A view of an array to write.
pub enum ArrayRef<'a> {
    /// float32.
    F32(ArrayViewD<'a, f32>),
    /// float64.
    F64(ArrayViewD<'a, f64>),
}

/// Writes `arrays` to an uncompressed npz at `path` (readable by `numpy.load`).
pub fn write(path: &Path, arrays: &[(&str, ArrayRef<'_>)]) -> Outcome<()> {
    let fail =
        |e: &dyn std::fmt::Display| Failure::bad(format!("{}: cannot write: {e}", path.display()));
    let file = File::create(path).map_err(|e| fail(&e))?;
    let mut npz = NpzWriter::new(std::io::BufWriter::new(file));
    for (name, array) in arrays {
        let written = match array {
            ArrayRef::F32(a) => npz.add_array(*name, a),
            ArrayRef::F64(a) => npz.add_array(*name, a),
        };
        written.map_err(|e| fail(&e))?;
    }
    let mut writer = npz.finish().map_err(|e| fail(&e))?;
    std::io::Write::flush(&mut writer).map_err(|e| fail(&e))
}
