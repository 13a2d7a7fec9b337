//! Writing a file whole: what the cubin cache and the GPU run's records share.

use std::path::Path;

/// Writes `bytes` to `path` through a temporary file beside it and a rename, creating the
/// folder if needed, so a reader (or a kill) never sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
