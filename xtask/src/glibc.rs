//! The GLIBC symbol versions an ELF binary needs (its `.gnu.version_r` entries for `libc.so.6`
//! and friends), so the GPU bundle can refuse binaries the device image's C library cannot run.

use std::path::Path;

use anyhow::{Context, bail};
use object::Endianness;
use object::read::elf::ElfFile64;

/// The newest GLIBC version `path` needs, as `(major, minor)`; `None` when it needs none.
pub fn newest_needed(path: &Path) -> anyhow::Result<Option<(u32, u32)>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let versions = needed_versions(&data)
        .with_context(|| format!("{}: reading its ELF version needs", path.display()))?;
    Ok(versions.iter().filter_map(|v| parse_glibc(v)).max())
}

/// Every version name the binary needs from its shared libraries (`GLIBC_2.34`, `GCC_3.0` …).
fn needed_versions(data: &[u8]) -> anyhow::Result<Vec<String>> {
    let file = ElfFile64::<Endianness>::parse(data)?;
    let endian = file.endian();
    let sections = file.elf_section_table();
    let mut names = Vec::new();
    if let Some((mut needs, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((_, mut aux)) = needs.next()? {
            while let Some(entry) = aux.next()? {
                names.push(String::from_utf8_lossy(entry.name(endian, strings)?).into_owned());
            }
        }
    }
    Ok(names)
}

/// `GLIBC_2.36` → `(2, 36)`; other names → `None`.
fn parse_glibc(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("GLIBC_")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// Fails when a binary needs a GLIBC newer than `(major, minor)`.
pub fn check_at_most(paths: &[&Path], (major, minor): (u32, u32)) -> anyhow::Result<()> {
    for path in paths {
        if let Some(v) = newest_needed(path)?
            && v > (major, minor)
        {
            bail!(
                "{} needs GLIBC {}.{}, newer than the device image's {major}.{minor}",
                path.display(),
                v.0,
                v.1
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_this_test_binary_needs_a_known_glibc() {
        assert_eq!(parse_glibc("GLIBC_2.36"), Some((2, 36)));
        assert_eq!(parse_glibc("GLIBC_2.2.5"), Some((2, 2)));
        assert_eq!(parse_glibc("GCC_3.0"), None);
        // This test binary links glibc dynamically: it needs some GLIBC_2.x, at most this
        // machine's (the same reader judges the bundle).
        let me = std::env::current_exe().unwrap();
        let newest = newest_needed(&me).unwrap().expect("a dynamically linked test binary");
        assert_eq!(newest.0, 2);
        assert!(check_at_most(&[&me], (2, 999)).is_ok());
        assert!(check_at_most(&[&me], (2, 0)).is_err());
        assert!(newest_needed(Path::new("Cargo.toml")).is_err());
    }
}
