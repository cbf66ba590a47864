//! The names a shared library exports, read from its ELF dynamic symbol
//! table with the `object` crate: defined, global or weak, default or
//! protected visibility — what `nm -D --defined-only` lists, less the
//! symbols the linker makes for version definitions.
//!
//! A library linked with a version script (`MEMPLUG_1.0 { global:
//! memplug_plugin_v1; local: *; };`) carries one absolute, zero-sized
//! symbol per version it defines, named after the version (`MEMPLUG_1.0`).
//! It names a version, not code or data: it is not an export, and counting
//! it would fail a correctly built plugin.
//!
//! Used by `exports.only_entry_symbols`, and public so the tests that
//! inspect exports read them the same way.

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::read::StringTable;
use object::{Endianness, FileKind};
use std::collections::BTreeSet;
use std::path::Path;

/// The exported names of the library at `path`, sorted, each whole, with
/// version-definition symbols left out. ELF32 and ELF64 of either byte
/// order are read.
///
/// # Errors
/// When the file cannot be read, is not ELF, is malformed, or has no
/// dynamic symbol table; the message says which.
pub fn exported_symbols(path: &Path) -> Result<Vec<String>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    exported_from(&data)
}

/// [`exported_symbols`] of a library already in memory.
///
/// # Errors
/// As [`exported_symbols`].
pub fn exported_from(data: &[u8]) -> Result<Vec<String>, String> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => exported::<elf::FileHeader64<Endianness>>(data),
        Ok(FileKind::Elf32) => exported::<elf::FileHeader32<Endianness>>(data),
        Ok(other) => Err(format!("not an ELF file (it reads as {other:?})")),
        Err(e) => Err(format!("not an ELF file ({e})")),
    }
}

fn exported<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<Vec<String>, String> {
    let bad = |e: object::Error| format!("malformed ELF file: {e}");
    let header = Elf::parse(data).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    let sections = header.sections(endian, data).map_err(bad)?;
    if !sections.iter().any(|s| s.sh_type(endian) == elf::SHT_DYNSYM) {
        return Err("the ELF file has no dynamic symbol table (not a shared library?)".into());
    }
    let dynsym = sections.symbols(endian, data, elf::SHT_DYNSYM).map_err(bad)?;
    let versions = version_names(&sections, endian, data).map_err(bad)?;
    let mut names = BTreeSet::new();
    for sym in dynsym.symbols() {
        let shndx = sym.st_shndx(endian);
        let vis = sym.st_visibility();
        if shndx == elf::SHN_UNDEF
            || sym.st_bind() == elf::STB_LOCAL
            || sym.st_type() == elf::STT_SECTION
            || sym.st_type() == elf::STT_FILE
            || vis == elf::STV_HIDDEN
            || vis == elf::STV_INTERNAL
        {
            continue;
        }
        let raw = sym.name(endian, dynsym.strings()).map_err(bad)?;
        if raw.is_empty() {
            continue;
        }
        let is_version = shndx == elf::SHN_ABS && sym.st_size(endian).into() == 0 && versions.contains(raw);
        if is_version {
            continue;
        }
        names.insert(String::from_utf8_lossy(raw).into_owned());
    }
    Ok(names.into_iter().collect())
}

/// The names of every version the library defines (`SHT_GNU_VERDEF`),
/// the base version (the library's own name) included.
fn version_names<'data, Elf: FileHeader<Endian = Endianness>>(
    sections: &object::read::elf::SectionTable<'data, Elf, &'data [u8]>,
    endian: Endianness,
    data: &'data [u8],
) -> object::Result<BTreeSet<&'data [u8]>> {
    let mut names = BTreeSet::new();
    let Some((mut defs, link)) = sections.gnu_verdef(endian, data)? else {
        return Ok(names);
    };
    let strings: StringTable<'data, &'data [u8]> = sections.strings(endian, data, link)?;
    while let Some((_, mut aux)) = defs.next()? {
        if let Some(a) = aux.next()? {
            names.insert(a.name(endian, strings)?);
        }
    }
    Ok(names)
}

/// True for `memplug_plugin_v<major>` (a versioned entry symbol).
pub fn is_entry_symbol(name: &str) -> bool {
    name.strip_prefix("memplug_plugin_v")
        .is_some_and(|v| !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) && !v.starts_with('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_symbol_names() {
        assert!(is_entry_symbol("memplug_plugin_v1"));
        assert!(is_entry_symbol("memplug_plugin_v12"));
        assert!(!is_entry_symbol("memplug_plugin_v"));
        assert!(!is_entry_symbol("memplug_plugin"));
        assert!(!is_entry_symbol("memplug_plugin_v0"));
        assert!(!is_entry_symbol("memplug_plugin_v1x"));
        assert!(!is_entry_symbol("MEMPLUG_1.0"));
    }

    #[test]
    fn garbage_is_not_elf() {
        assert!(exported_from(b"not an elf file at all").is_err());
        assert!(exported_from(&[]).is_err());
        // An ELF magic with nothing behind it is malformed, not a panic.
        let mut stub = b"\x7fELF\x02\x01\x01".to_vec();
        stub.resize(80, 0);
        assert!(exported_from(&stub).is_err());
    }

    #[test]
    fn reads_a_real_library() {
        // libc exports malloc and defines versions (GLIBC_2.2.5, ...), none
        // of which may show up as an export.
        for p in
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
        {
            if let Ok(names) = exported_symbols(Path::new(p)) {
                assert!(names.iter().any(|n| n == "malloc"), "{p}: {}", names.len());
                assert!(
                    !names.iter().any(|n| n.starts_with("GLIBC_")),
                    "{p}: a version counted as an export"
                );
                return;
            }
        }
    }
}
