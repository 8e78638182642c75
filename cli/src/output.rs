//! Where results go: files replaced atomically, and stdout that a closed pipe cannot crash.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::failure::{Failure, Outcome};

/// Prints `text` and a newline on stdout. A reader that went away (`| head -c1`, EPIPE) or a
/// full disk ends the printing quietly: the command still exits with its verdict's code.
pub fn say(text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// A file to be written next to its destination and renamed into place.
struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Gone after a successful rename; a leftover of a failure is removed.
        let _ = fs::remove_file(&self.tmp);
    }
}

fn stage(dest: &Path, bytes: &[u8]) -> Outcome<Staged> {
    let fail =
        |e: &dyn std::fmt::Display| Failure::bad(format!("{}: cannot write: {e}", dest.display()));
    // A device or directory is not replaced by a file (`-o /dev/full` as root would be).
    if fs::metadata(dest).is_ok_and(|m| !m.is_file()) {
        return Err(fail(&"exists and is not a regular file"));
    }
    let name = dest
        .file_name()
        .ok_or_else(|| fail(&"not a file name"))?
        .to_string_lossy();
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty());
    let tmp = dir
        .unwrap_or(Path::new("."))
        .join(format!(".{name}.{}.tmp", std::process::id()));
    let staged = Staged {
        tmp,
        dest: dest.to_path_buf(),
    };
    let mut file = fs::File::create(&staged.tmp).map_err(|e| fail(&e))?;
    file.write_all(bytes).map_err(|e| fail(&e))?;
    file.sync_all().map_err(|e| fail(&e))?;
    Ok(staged)
}

/// Writes every `(path, bytes)` or none: each goes to a temporary file in its destination's
/// directory first, and only when all are complete on disk are they renamed into place. A
/// failure (a full disk, a missing directory) leaves every destination as it was.
pub fn write_all_or_nothing(files: &[(&Path, &[u8])]) -> Outcome<()> {
    let staged = files
        .iter()
        .map(|(dest, bytes)| stage(dest, bytes))
        .collect::<Outcome<Vec<_>>>()?;
    for s in &staged {
        fs::rename(&s.tmp, &s.dest)
            .map_err(|e| Failure::bad(format!("{}: cannot write: {e}", s.dest.display())))?;
    }
    Ok(())
}

/// Whether two paths name one file (resolved through links when they exist).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_nothing() {
        let dir = std::env::temp_dir().join(format!("deformconv-output-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.npz"), dir.join("a.json"));
        fs::write(&a, "old").unwrap();
        // The second destination's directory does not exist: nothing is replaced.
        let missing = dir.join("no/such/dir/x.json");
        assert!(write_all_or_nothing(&[(&a, b"new"), (&missing, b"{}")]).is_err());
        assert_eq!(fs::read_to_string(&a).unwrap(), "old");
        assert_eq!(
            fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left"
        );
        write_all_or_nothing(&[(&a, b"new"), (&b, b"{}")]).unwrap();
        assert_eq!(fs::read_to_string(&a).unwrap(), "new");
        assert_eq!(fs::read_to_string(&b).unwrap(), "{}");
        assert!(same_file(&a, &dir.join("./a.npz")));
        assert!(!same_file(&a, &b));
        fs::remove_dir_all(&dir).unwrap();
    }
}
