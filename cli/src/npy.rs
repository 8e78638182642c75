//! One `.npy` array (numpy's format, versions 1 to 3), read from bytes whose length is known
//! before anything is allocated, and written.
//!
//! The header is checked completely before the data is touched: the magic and version, a
//! header length of at most [`MAX_HEADER_LEN`], a flat dict with exactly the keys `descr`,
//! `fortran_order` and `shape`, a dtype of `f4` or `f8` (either byte order), a shape whose
//! element count and byte size do not overflow, and a byte size equal to what the member
//! holds. The dict is read by a small scanner of its own, flat by construction: a structured
//! or nested `descr` is an unsupported dtype, not a recursion.

use ndarray::{ArrayD, IxDyn, ShapeBuilder};

/// numpy's own limit on a header it will read (`numpy.lib.format`, `max_header_size`).
pub const MAX_HEADER_LEN: usize = 10_000;

/// At most this many axes (numpy's `NPY_MAXDIMS` is 64).
const MAX_DIMS: usize = 64;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element type of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// float32.
    F32,
    /// float64.
    F64,
}

impl Dtype {
    /// numpy's name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }
}

/// A checked header: what the data that follows must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Element type.
    pub dtype: Dtype,
    /// Big-endian data (`>f4`, `>f8`).
    pub big_endian: bool,
    /// Column-major data.
    pub fortran_order: bool,
    /// The shape.
    pub shape: Vec<usize>,
    /// Bytes of magic, version, length field and header: where the data starts.
    pub data_offset: usize,
    /// Bytes of data: elements times element size.
    pub data_len: usize,
}

/// An array as read: float32 or float64.
#[derive(Debug, Clone, PartialEq)]
pub enum AnyArray {
    /// float32.
    F32(ArrayD<f32>),
    /// float64.
    F64(ArrayD<f64>),
}

/// Parses and checks the header at the start of `bytes`, a member of `total_len` bytes in all
/// (`bytes` may be just its beginning). The data must be exactly the rest of the member.
pub fn parse_header(bytes: &[u8], total_len: u64) -> Result<Header, String> {
    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not an npy array (no \\x93NUMPY magic)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_bytes, utf8) = match major {
        1 => (2, false),
        2 => (4, false),
        3 => (4, true),
        _ => {
            return Err(format!(
                "npy format version {major}.{minor} is not supported"
            ))
        }
    };
    let start = 8 + len_bytes;
    let len_field = bytes
        .get(8..start)
        .ok_or("npy header truncated (no header length)")?;
    let header_len = len_field
        .iter()
        .rev()
        .fold(0usize, |n, &b| (n << 8) | usize::from(b));
    if header_len > MAX_HEADER_LEN {
        return Err(format!(
            "npy header of {header_len} bytes; at most {MAX_HEADER_LEN} are read"
        ));
    }
    let text = bytes
        .get(start..start + header_len)
        .ok_or_else(|| format!("npy header truncated (claims {header_len} bytes)"))?;
    let text = if utf8 {
        std::str::from_utf8(text).map_err(|_| "npy header is not UTF-8".to_string())?
    } else {
        std::str::from_utf8(text)
            .ok()
            .filter(|t| t.is_ascii())
            .ok_or("npy header is not ASCII")?
    };
    let dict = Dict::parse(text)?;
    let elements = dict
        .shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("shape {:?} has too many elements", dict.shape))?;
    // An array type's rule: the non-zero axes multiply to at most isize::MAX, even when an
    // empty axis makes the array itself hold nothing.
    dict.shape
        .iter()
        .filter(|&&d| d > 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| format!("shape {:?} is too large to hold", dict.shape))?;
    let data_len = elements
        .checked_mul(dict.dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| format!("shape {:?} is too large to hold", dict.shape))?;
    let data_offset = start + header_len;
    let actual = total_len.saturating_sub(data_offset as u64);
    if actual != data_len as u64 {
        return Err(format!(
            "shape {:?} of {} needs {data_len} bytes of data but the array holds {actual}",
            dict.shape,
            dict.dtype.name()
        ));
    }
    Ok(Header {
        dtype: dict.dtype,
        big_endian: dict.big_endian,
        fortran_order: dict.fortran_order,
        shape: dict.shape,
        data_offset,
        data_len,
    })
}

/// Decodes the data that follows a checked header (`data.len() == header.data_len`).
pub fn decode(header: &Header, data: &[u8]) -> Result<AnyArray, String> {
    if data.len() != header.data_len {
        return Err(format!(
            "npy data of {} bytes; the header says {}",
            data.len(),
            header.data_len
        ));
    }
    let shape = IxDyn(&header.shape).set_f(header.fortran_order);
    let wrong = |e: ndarray::ShapeError| format!("npy shape {:?}: {e}", header.shape);
    Ok(match header.dtype {
        Dtype::F32 => {
            let values = data
                .chunks_exact(4)
                .map(|c| {
                    let b = [c[0], c[1], c[2], c[3]];
                    if header.big_endian {
                        f32::from_be_bytes(b)
                    } else {
                        f32::from_le_bytes(b)
                    }
                })
                .collect();
            AnyArray::F32(ArrayD::from_shape_vec(shape, values).map_err(wrong)?)
        }
        Dtype::F64 => {
            let values = data
                .chunks_exact(8)
                .map(|c| {
                    let b = [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
                    if header.big_endian {
                        f64::from_be_bytes(b)
                    } else {
                        f64::from_le_bytes(b)
                    }
                })
                .collect();
            AnyArray::F64(ArrayD::from_shape_vec(shape, values).map_err(wrong)?)
        }
    })
}

/// The bytes of an npy (version 1.0, little-endian, C order) holding `values` of `shape`.
pub fn encode<T: Copy>(
    dtype: Dtype,
    shape: &[usize],
    values: impl Iterator<Item = T>,
    le_bytes: impl Fn(T, &mut Vec<u8>),
) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let descr = match dtype {
        Dtype::F32 => "<f4",
        Dtype::F64 => "<f8",
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Pad with spaces and a newline so that the data starts on a 64-byte boundary.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        le_bytes(v, &mut out);
    }
    out
}

/// The three keys of a header dict.
struct Dict {
    dtype: Dtype,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// A token of the header dict: strings, integers, the two booleans, punctuation.
#[derive(Debug, PartialEq)]
enum Token<'a> {
    Str(&'a str),
    Int(&'a str),
    Bool(bool),
    Punct(char),
}

/// A flat scanner: Python literals without nesting beyond one tuple of integers.
struct Scanner<'a> {
    rest: &'a str,
}

impl<'a> Scanner<'a> {
    fn next(&mut self) -> Result<Option<Token<'a>>, String> {
        self.rest = self.rest.trim_start();
        let Some(c) = self.rest.chars().next() else {
            return Ok(None);
        };
        let token = match c {
            '{' | '}' | '(' | ')' | '[' | ']' | ':' | ',' => {
                self.rest = &self.rest[1..];
                Token::Punct(c)
            }
            '\'' | '"' => {
                let body = &self.rest[1..];
                let end = body.find(c).ok_or("npy header: a string is not closed")?;
                self.rest = &body[end + 1..];
                Token::Str(&body[..end])
            }
            '0'..='9' => {
                let end = self
                    .rest
                    .find(|ch: char| !ch.is_ascii_digit())
                    .unwrap_or(self.rest.len());
                let (digits, rest) = self.rest.split_at(end);
                // Python 2 long literals (`3L`) appear in old files.
                self.rest = rest.strip_prefix('L').unwrap_or(rest);
                Token::Int(digits)
            }
            _ => {
                let word_end = self
                    .rest
                    .find(|ch: char| !ch.is_ascii_alphanumeric() && ch != '_')
                    .unwrap_or(self.rest.len())
                    .max(c.len_utf8());
                let (word, rest) = self.rest.split_at(word_end);
                self.rest = rest;
                match word {
                    "True" => Token::Bool(true),
                    "False" => Token::Bool(false),
                    _ => {
                        return Err(format!(
                            "npy header: unexpected {:?}",
                            word.chars().take(20).collect::<String>()
                        ))
                    }
                }
            }
        };
        Ok(Some(token))
    }

    fn expect(&mut self, want: char) -> Result<(), String> {
        match self.next()? {
            Some(Token::Punct(c)) if c == want => Ok(()),
            other => Err(format!("npy header: expected '{want}', found {other:?}")),
        }
    }
}

fn dtype(descr: &str) -> Result<(Dtype, bool), String> {
    let (order, kind) = match descr.as_bytes().first() {
        Some(b'<' | b'|' | b'=') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    // `=` is native order; numpy writes `<` on every little-endian machine.
    match kind {
        "f4" => Ok((Dtype::F32, order)),
        "f8" => Ok((Dtype::F64, order)),
        _ => Err(format!(
            "dtype {descr:?} is not supported; expected float32 ('<f4') or float64 ('<f8')"
        )),
    }
}

impl Dict {
    fn parse(text: &str) -> Result<Dict, String> {
        let mut s = Scanner { rest: text };
        s.expect('{')?;
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        loop {
            let key = match s.next()? {
                Some(Token::Punct('}')) => break,
                Some(Token::Str(k)) => k,
                other => return Err(format!("npy header: expected a key, found {other:?}")),
            };
            s.expect(':')?;
            match key {
                "descr" => match s.next()? {
                    Some(Token::Str(d)) if descr.is_none() => descr = Some(dtype(d)?),
                    Some(Token::Str(_)) => return Err("npy header: descr given twice".into()),
                    _ => {
                        return Err(
                            "npy header: descr is not a plain dtype string (structured dtypes are not supported)"
                                .into(),
                        )
                    }
                },
                "fortran_order" => match s.next()? {
                    Some(Token::Bool(b)) if fortran.is_none() => fortran = Some(b),
                    _ => return Err("npy header: fortran_order must be True or False, once".into()),
                },
                "shape" if shape.is_none() => shape = Some(Self::shape(&mut s)?),
                other => return Err(format!("npy header: unexpected key {other:?}")),
            }
            match s.next()? {
                Some(Token::Punct(',')) => {}
                Some(Token::Punct('}')) => break,
                other => return Err(format!("npy header: expected ',' or '}}', found {other:?}")),
            }
        }
        if s.next()?.is_some() {
            return Err("npy header: text after the dict".into());
        }
        let (dtype, big_endian) = descr.ok_or("npy header: no descr")?;
        Ok(Dict {
            dtype,
            big_endian,
            fortran_order: fortran.ok_or("npy header: no fortran_order")?,
            shape: shape.ok_or("npy header: no shape")?,
        })
    }

    fn shape(s: &mut Scanner<'_>) -> Result<Vec<usize>, String> {
        s.expect('(')?;
        let mut dims = Vec::new();
        loop {
            match s.next()? {
                Some(Token::Punct(')')) => return Ok(dims),
                Some(Token::Int(d)) => {
                    if dims.len() == MAX_DIMS {
                        return Err(format!("npy header: more than {MAX_DIMS} axes"));
                    }
                    dims.push(
                        d.parse()
                            .map_err(|_| format!("npy header: axis length {d} is too large"))?,
                    );
                }
                other => {
                    return Err(format!(
                        "npy header: shape must be a tuple of integers, found {other:?}"
                    ))
                }
            }
            match s.next()? {
                Some(Token::Punct(',')) => {}
                Some(Token::Punct(')')) => return Ok(dims),
                other => return Err(format!("npy header: expected ',' or ')', found {other:?}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data_len: usize, version: u8) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[version, 0]);
        if version == 1 {
            b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        } else {
            b.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
        b.extend_from_slice(header.as_bytes());
        b.resize(b.len() + data_len, 0);
        b
    }

    fn header_of(bytes: &[u8]) -> Result<Header, String> {
        parse_header(bytes, bytes.len() as u64)
    }

    #[test]
    fn numpy_headers_parse() {
        let b = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }      \n",
            48,
            1,
        );
        let h = header_of(&b).unwrap();
        assert_eq!(
            (h.dtype, h.shape.clone(), h.data_len),
            (Dtype::F64, vec![2, 3], 48)
        );
        for (shape, n) in [("()", 1), ("(5,)", 5), ("(0, 7)", 0)] {
            let text = format!("{{'descr': '>f4', 'fortran_order': True, 'shape': {shape}}}");
            let h = header_of(&npy(&text, 4 * n, 2)).unwrap();
            assert!(h.big_endian && h.fortran_order, "{shape}");
        }
    }

    #[test]
    fn round_trip_of_encode_and_decode() {
        let values = [1.5f32, -2.0, 3.25, 0.0, f32::INFINITY, -0.5];
        let bytes = encode(Dtype::F32, &[2, 3], values.iter().copied(), |v, out| {
            out.extend_from_slice(&v.to_le_bytes())
        });
        let h = header_of(&bytes).unwrap();
        assert_eq!(h.data_offset % 64, 0, "data aligned as numpy aligns it");
        let AnyArray::F32(a) = decode(&h, &bytes[h.data_offset..]).unwrap() else {
            panic!("not f32")
        };
        assert_eq!(a.shape(), &[2, 3]);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), values);
    }

    #[test]
    fn fortran_order_and_big_endian_data_decode() {
        let mut b = npy(
            "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 2), }",
            0,
            1,
        );
        for v in [1.0f64, 2.0, 3.0, 4.0] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        let h = header_of(&b).unwrap();
        let AnyArray::F64(a) = decode(&h, &b[h.data_offset..]).unwrap() else {
            panic!("not f64")
        };
        // Column-major: the second value is row 1 of column 0.
        assert_eq!(a[[1, 0]], 2.0);
        assert_eq!(a[[0, 1]], 3.0);
    }

    #[test]
    fn hostile_headers_are_refused_before_any_allocation() {
        let h = |text: &str| header_of(&npy(text, 16, 1)).unwrap_err();
        // D1: a claimed size far beyond the member's bytes.
        assert!(
            h("{'descr': '<f8', 'fortran_order': False, 'shape': (8589934592,)}")
                .contains("needs 68719476736 bytes of data but the array holds 16")
        );
        // D2: an element count that overflows.
        assert!(
            h("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775808)}")
                .contains("too large")
        );
        assert!(h(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2)}"
        )
        .contains("too many elements"));
        // D3: a nested descr is an unsupported dtype, found in one step.
        let nested = format!(
            "{{'descr': {}'<f4'{}, 'fortran_order': False, 'shape': (1,)}}",
            "[('a', ".repeat(20),
            ")]".repeat(20)
        );
        assert!(h(&nested).contains("structured dtypes are not supported"));
        // Other dtypes, keys and syntax.
        assert!(h("{'descr': '<i8', 'fortran_order': False, 'shape': (2,)}").contains("'<f4'"));
        assert!(h("{'descr': '<f8', 'fortran_order': False}").contains("no shape"));
        assert!(
            h("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), 'x': 1}")
                .contains("unexpected key")
        );
        assert!(h("{'descr': '<f8' 'fortran_order'").contains("expected ','"));
        assert!(h("{'descr': '<f8', 'shape': (-2,)}").contains("unexpected"));
        // A header length beyond numpy's own limit.
        let mut b = npy("", 0, 2);
        b[8..12].copy_from_slice(&(1u32 << 31).to_le_bytes());
        assert!(header_of(&b).unwrap_err().contains("at most 10000"));
        // Truncations.
        assert!(header_of(&b[..9]).is_err());
        assert!(header_of(b"\x93NUMPY").is_err());
        assert!(header_of(b"PK\x03\x04").unwrap_err().contains("magic"));
    }

    #[test]
    fn every_error_is_one_line() {
        let mut b = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}",
            16,
            1,
        );
        for cut in 0..b.len() {
            if let Err(e) = parse_header(&b[..cut], cut as u64) {
                assert!(!e.contains('\n'), "{e}");
            }
        }
        b[20] = b'\n';
        assert!(!header_of(&b).unwrap_err().contains('\n'));
    }
}
