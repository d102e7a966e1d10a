//! Files written so that a crash never leaves a half-written one and an existing file is never
//! replaced unless asked: images, settings, cache entries.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, synced, then moved in
/// place. Without `overwrite`, an existing `path` is an error and is left untouched.
pub fn save_atomic(path: &Path, bytes: &[u8], overwrite: bool) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("image");
    // Unique per process and call: two threads saving the same name must not share a temp file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{n}.tmp", std::process::id()));
    let io = |e| Error::write("output file", path, e);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        if overwrite {
            std::fs::rename(&tmp, path).map_err(io)
        } else {
            // A hard link refuses to replace an existing file, atomically.
            std::fs::hard_link(&tmp, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Error::OutputExists {
                        path: path.to_path_buf(),
                    }
                } else {
                    io(e)
                }
            })
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// The next free `NNNNN-<seed>.png` in `dir`, numbered after the highest existing one (A1111 style).
pub fn next_numbered_path(dir: &Path, seed: u64) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("outputs folder", dir, e))?;
    let mut highest = 0u64;
    for entry in std::fs::read_dir(dir)
        .map_err(|e| Error::io("outputs folder", dir, e))?
        .flatten()
    {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name.split('-').next().and_then(|n| n.parse::<u64>().ok()) {
            highest = highest.max(n);
        }
    }
    Ok(dir.join(format!("{:05}-{seed}.png", highest + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saving_never_clobbers_and_leaves_no_temp_files() {
        let dir = std::env::temp_dir().join(format!("latent-image-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.png");
        let _ = std::fs::remove_file(&path);
        save_atomic(&path, b"first", false).unwrap();
        let e = save_atomic(&path, b"second", false).unwrap_err();
        assert!(matches!(e, Error::OutputExists { .. }), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        save_atomic(&path, b"third", true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"third");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        assert!(save_atomic(&dir.join("no/such/dir/x.png"), b"x", false).is_err());

        let n1 = next_numbered_path(&dir, 7).unwrap();
        std::fs::write(&n1, b"x").unwrap();
        let n2 = next_numbered_path(&dir, 7).unwrap();
        assert_ne!(n1, n2);
        assert!(
            n2.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("00002-")
        );
    }
}
