//! `sandbox-agent --version`: the version, the git commit and target triple
//! the binary was built from (build.rs), and the oldest glibc it runs on.
//!
//! The glibc line is read from the running binary itself: the newest
//! `GLIBC_x.y` among the symbol versions its dynamic section needs
//! (`.gnu.version_r`, what `objdump -T` lists). So a release binary made by
//! scripts/dist (linked against glibc 2.17) says 2.17, and a plain `cargo
//! build` says the newer glibc its build machine gave it; neither claims
//! what the other can do. `-V` prints the first line only.
use object::read::ReadCache;
use object::read::elf::ElfFile64;
use std::fs::File;

/// The text after `sandbox-agent ` that `--version` prints: four lines,
/// `0.1.0`, `commit: <12 hex digits or unknown>`, `target: <triple>`,
/// `glibc: <x.y> or newer` (or why it is not known).
pub(crate) fn long_version() -> String {
    let glibc = match needed_glibc() {
        Ok(Some(version)) => format!("{version} or newer"),
        Ok(None) => "not needed".to_owned(),
        Err(error) => format!("unknown ({error})"),
    };
    format!(
        "{}\ncommit: {}\ntarget: {}\nglibc: {glibc}",
        env!("CARGO_PKG_VERSION"),
        env!("SANDBOX_AGENT_COMMIT"),
        env!("SANDBOX_AGENT_TARGET"),
    )
}

/// The newest `GLIBC_` version the running binary needs, as `2.17`; `None`
/// when it needs none (linked statically, or against another libc).
///
/// # Errors
/// The binary cannot be opened (`/proc` not mounted) or is not a 64-bit
/// ELF file.
fn needed_glibc() -> Result<Option<String>, String> {
    // /proc/self/exe is the running file even after an upgrade replaced
    // the path it was started from.
    let file = File::open("/proc/self/exe")
        .or_else(|_| std::env::current_exe().and_then(File::open))
        .map_err(|error| format!("cannot open the running binary: {error}"))?;
    // Reads only the headers and the two small sections it needs.
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache)
        .map_err(|error| format!("not an ELF binary: {error}"))?;
    let endian = elf.endian();
    let sections = elf.elf_section_table();
    let invalid = |error: object::read::Error| format!("invalid version needs: {error}");
    let Some((mut needs, link)) = sections.gnu_verneed(endian, elf.data()).map_err(invalid)? else {
        return Ok(None);
    };
    let strings = sections
        .strings(endian, elf.data(), link)
        .map_err(invalid)?;
    let mut newest: Option<Vec<u32>> = None;
    while let Some((_library, mut versions)) = needs.next().map_err(invalid)? {
        while let Some(version) = versions.next().map_err(invalid)? {
            let name = version.name(endian, strings).map_err(invalid)?;
            if let Some(parsed) = glibc_version(name)
                && newest.as_ref().is_none_or(|newest| parsed > *newest)
            {
                newest = Some(parsed);
            }
        }
    }
    Ok(newest.map(|parts| {
        parts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }))
}

/// `GLIBC_2.17` → `[2, 17]`; `None` for `GLIBC_PRIVATE` and other names.
fn glibc_version(name: &[u8]) -> Option<Vec<u32>> {
    let digits = std::str::from_utf8(name.strip_prefix(b"GLIBC_")?).ok()?;
    digits.split('.').map(|part| part.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::glibc_version;

    #[test]
    fn glibc_versions_compare_by_number() {
        assert_eq!(glibc_version(b"GLIBC_2.17"), Some(vec![2, 17]));
        assert_eq!(glibc_version(b"GLIBC_2.2.5"), Some(vec![2, 2, 5]));
        assert!(glibc_version(b"GLIBC_2.2.5") < glibc_version(b"GLIBC_2.17"));
        assert_eq!(glibc_version(b"GLIBC_PRIVATE"), None);
        assert_eq!(glibc_version(b"GCC_3.0"), None);
    }
}
