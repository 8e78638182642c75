//! The command line's file readers on arbitrary bytes: an npz archive and its JSON sidecar,
//! as `deformconv run` and `compare` read them. Any input may be refused with a message; none
//! may panic, abort (an allocation of a claimed size), hang, or print more than one line.
//! A case that reads as valid and is small is then computed, fast and exact.
//!
//! Input layout: two bytes (little-endian) giving the sidecar's length, the sidecar's text,
//! then the npz bytes.
#![no_main]

use std::io::Cursor;
use std::path::Path;

use deformconv_cli::case::{self, AnyCase};
use deformconv_cli::npz::Npz;
use deformconv_cli::run;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let json_len = data
        .get(..2)
        .map_or(0, |b| usize::from(u16::from_le_bytes([b[0], b[1]])));
    let rest = data.get(2..).unwrap_or_default();
    let (json, npz) = rest.split_at(json_len.min(rest.len()));
    let json = String::from_utf8_lossy(json);
    let source = Box::new(Cursor::new(npz.to_vec()));
    let mut npz = match Npz::from_source(Path::new("fuzz.npz"), source, npz.len() as u64) {
        Ok(n) => n,
        Err(e) => return assert!(!e.message.contains('\n'), "{}", e.message),
    };
    for name in npz.names().to_vec() {
        if let Err(e) = npz.get(&name) {
            assert!(!e.message.contains('\n'), "{}", e.message);
        }
    }
    match case::from_parts(&mut npz, &json) {
        Ok(AnyCase::F32(c)) if c.geometry.forward_flops() <= 1e6 => {
            let _ = run::fast(&c);
            let _ = run::exact(&c);
        }
        Ok(AnyCase::F64(c)) if c.geometry.forward_flops() <= 1e6 => {
            let _ = run::fast(&c);
            let _ = run::exact(&c);
        }
        Ok(_) => {}
        Err(e) => assert!(!e.message.contains('\n'), "{}", e.message),
    }
});
