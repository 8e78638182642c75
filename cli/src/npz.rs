//! npz files (numpy `savez`: a zip archive of stored `.npy` members), read with every size
//! checked against the bytes that exist before anything is allocated, and written.
//!
//! A member is read in two steps: its first bytes (at most the largest header numpy writes),
//! parsed and checked by [`npy::parse_header`], then exactly the data that header implies,
//! which must equal what the member holds; and a stored member cannot claim more bytes than
//! the file has. So the largest allocation is the file's own size.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, ArrayViewD};
use zip::{CompressionMethod, ZipArchive};

use crate::failure::{Failure, Outcome};
pub use crate::npy::AnyArray;
use crate::npy::{self, Dtype};

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

/// Anything an npz can be read from: a file, or bytes in memory (the fuzz target).
pub trait Source: Read + Seek {}
impl<T: Read + Seek> Source for T {}

/// An open npz: its array names, read on demand.
pub struct Npz {
    path: PathBuf,
    names: Vec<String>,
    len: u64,
    archive: ZipArchive<Box<dyn Source>>,
}

impl Npz {
    /// Opens `path`; a missing, unreadable or truncated file is a bad file.
    pub fn open(path: &Path) -> Outcome<Self> {
        let bad = |e: &dyn std::fmt::Display| {
            Failure::bad(format!("{}: cannot open: {e}", path.display()))
        };
        let file = File::open(path).map_err(|e| bad(&e))?;
        let len = file.metadata().map_err(|e| bad(&e))?.len();
        Self::from_source(path, Box::new(BufReader::new(file)), len)
    }

    /// Reads an npz of `len` bytes from `source`; `path` names it in messages.
    pub fn from_source(path: &Path, source: Box<dyn Source>, len: u64) -> Outcome<Self> {
        let bad = |msg: String| Failure::bad(format!("{}: {msg}", path.display()));
        let archive = ZipArchive::new(source).map_err(|e| {
            bad(format!(
                "not a valid npz file (truncated, or not a zip archive): {}",
                one_line(&e)
            ))
        })?;
        let mut names = Vec::with_capacity(archive.len());
        for member in archive.file_names() {
            let name = member.strip_suffix(".npy").unwrap_or(member).to_string();
            if names.contains(&name) {
                return Err(bad(format!("array {name:?} appears twice")));
            }
            names.push(name);
        }
        Ok(Npz {
            path: path.to_path_buf(),
            names,
            len,
            archive,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of its arrays, in file order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether the file has an array called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Reads `name` if present; float32 or float64 only.
    pub fn get(&mut self, name: &str) -> Outcome<Option<AnyArray>> {
        let Some(index) = self.names.iter().position(|n| n == name) else {
            return Ok(None);
        };
        let (path, file_len) = (self.path.display().to_string(), self.len);
        let shown = name.escape_debug();
        let bad = |msg: String| Failure::bad(format!("{path}: array {shown}: {msg}"));
        // The raw entry first: its method and sizes, before a reader for it is made.
        let (method, size, stored) = {
            let raw = self
                .archive
                .by_index_raw(index)
                .map_err(|e| bad(one_line(&e)))?;
            (raw.compression(), raw.size(), raw.compressed_size())
        };
        if method != CompressionMethod::Stored {
            return Err(bad(
                "compressed npz (numpy.savez_compressed) is not supported; write it with numpy.savez"
                    .into(),
            ));
        }
        if size > file_len || stored != size {
            return Err(bad(format!(
                "the archive says it holds {size} bytes but the file has {file_len}"
            )));
        }
        let mut member = self
            .archive
            .by_index(index)
            .map_err(|e| bad(one_line(&e)))?;
        let head_len = size.min((12 + npy::MAX_HEADER_LEN) as u64) as usize;
        let mut head = vec![0; head_len];
        member
            .read_exact(&mut head)
            .map_err(|e| bad(format!("truncated: {}", one_line(&e))))?;
        let header = npy::parse_header(&head, size).map_err(&bad)?;
        // The data: what is already in `head`, then the rest from the member.
        let mut data = Vec::with_capacity(header.data_len);
        data.extend_from_slice(&head[header.data_offset.min(head.len())..]);
        let rest = header.data_len - data.len();
        member
            .take(rest as u64)
            .read_to_end(&mut data)
            .map_err(|e| bad(format!("truncated: {}", one_line(&e))))?;
        npy::decode(&header, &data).map(Some).map_err(bad)
    }

    /// Reads `name`, which must be present.
    pub fn require(&mut self, name: &str) -> Outcome<AnyArray> {
        self.get(name)?.ok_or_else(|| {
            Failure::bad(format!(
                "{}: missing array {} (has: {})",
                self.path.display(),
                name.escape_debug(),
                if self.names.is_empty() {
                    "nothing".to_string()
                } else {
                    let shown: Vec<String> = self
                        .names
                        .iter()
                        .map(|n| n.escape_debug().to_string())
                        .collect();
                    shown.join(", ")
                }
            ))
        })
    }
}

/// A message on one line (some library errors carry newlines).
fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A view of an array to write.
pub enum ArrayRef<'a> {
    /// float32.
    F32(ArrayViewD<'a, f32>),
    /// float64.
    F64(ArrayViewD<'a, f64>),
}

/// The bytes of an uncompressed npz holding `arrays` (readable by `numpy.load`).
pub fn to_bytes(arrays: &[(&str, ArrayRef<'_>)]) -> zip::result::ZipResult<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, array) in arrays {
        let npy = match array {
            ArrayRef::F32(a) => npy::encode(Dtype::F32, a.shape(), a.iter().copied(), |v, o| {
                o.extend_from_slice(&v.to_le_bytes())
            }),
            ArrayRef::F64(a) => npy::encode(Dtype::F64, a.shape(), a.iter().copied(), |v, o| {
                o.extend_from_slice(&v.to_le_bytes())
            }),
        };
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(npy.len() as u64 >= u64::from(u32::MAX));
        zip.start_file(format!("{name}.npy"), options)?;
        std::io::Write::write_all(&mut zip, &npy)?;
    }
    Ok(zip.finish()?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn open(bytes: Vec<u8>) -> Outcome<Npz> {
        let len = bytes.len() as u64;
        Npz::from_source(Path::new("t.npz"), Box::new(Cursor::new(bytes)), len)
    }

    #[test]
    fn written_arrays_read_back() {
        let a = ArrayD::from_shape_fn(ndarray::IxDyn(&[2, 3, 4]), |d| {
            (d[0] * 12 + d[1] * 4 + d[2]) as f32
        });
        let b = ArrayD::from_elem(ndarray::IxDyn(&[5]), -0.25f64);
        let bytes = to_bytes(&[
            ("a", ArrayRef::F32(a.view())),
            ("b", ArrayRef::F64(b.view())),
        ])
        .unwrap();
        let mut npz = open(bytes).unwrap();
        assert_eq!(npz.names(), ["a", "b"]);
        assert_eq!(npz.get("a").unwrap(), Some(AnyArray::F32(a)));
        assert_eq!(npz.get("b").unwrap(), Some(AnyArray::F64(b)));
        assert_eq!(npz.get("c").unwrap(), None);
        assert!(npz
            .require("c")
            .unwrap_err()
            .message
            .contains("missing array c (has: a, b)"));
    }

    #[test]
    fn not_a_zip_is_one_line() {
        for bytes in [Vec::new(), b"PK\x03\x04garbage".to_vec(), vec![0u8; 100]] {
            let e = open(bytes).err().expect("an error");
            assert_eq!(e.code, 2);
            assert!(e.message.contains("not a valid npz file") && !e.message.contains('\n'));
        }
    }
}
