//! A small reader of an ELF64 shared object's dynamic symbol table: the
//! names a library exports (defined, global or weak, default or protected
//! visibility) — what `nm -D --defined-only` lists.

use std::path::Path;

const SHT_DYNSYM: u32 = 11;
const STB_LOCAL: u8 = 0;
const STT_SECTION: u8 = 3;
const STV_HIDDEN: u8 = 2;
const STV_INTERNAL: u8 = 1;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The exported names of `path`, sorted.
pub(crate) fn exported_symbols(path: &Path) -> Result<Vec<String>, String> {
    let b = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    exported_from(&b).ok_or_else(|| "not a little-endian ELF64 file with a dynamic symbol table".to_string())
}

fn exported_from(b: &[u8]) -> Option<Vec<String>> {
    if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let shoff = usize::try_from(u64_at(b, 0x28)?).ok()?;
    let shentsize = usize::from(u16_at(b, 0x3a)?);
    let shnum = usize::from(u16_at(b, 0x3c)?);
    if shoff == 0 || shentsize < 64 {
        return None;
    }
    let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(b, h + 4)?,
            usize::try_from(u64_at(b, h + 24)?).ok()?,
            usize::try_from(u64_at(b, h + 32)?).ok()?,
            u32_at(b, h + 40)?,
            usize::try_from(u64_at(b, h + 56)?).ok()?,
        ))
    };
    let mut names = Vec::new();
    let mut found = false;
    for i in 0..shnum {
        let (kind, off, size, link, entsize) = section(i)?;
        if kind != SHT_DYNSYM {
            continue;
        }
        found = true;
        let (_, str_off, str_size, _, _) = section(link as usize)?;
        let strtab = b.get(str_off..str_off.checked_add(str_size)?)?;
        let entsize = if entsize == 0 { 24 } else { entsize };
        let syms = b.get(off..off.checked_add(size)?)?;
        for sym in syms.chunks_exact(entsize) {
            let name = u32_at(sym, 0)? as usize;
            let info = *sym.get(4)?;
            let other = *sym.get(5)?;
            let shndx = u16_at(sym, 6)?;
            let (bind, kind, vis) = (info >> 4, info & 0xf, other & 3);
            if shndx == 0
                || bind == STB_LOCAL
                || kind == STT_SECTION
                || vis == STV_HIDDEN
                || vis == STV_INTERNAL
            {
                continue;
            }
            let rest = strtab.get(name..)?;
            let end = rest.iter().position(|&c| c == 0)?;
            let s = String::from_utf8_lossy(&rest[..end]).into_owned();
            if !s.is_empty() {
                names.push(s);
            }
        }
    }
    if !found {
        return None;
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// True for `memplug_plugin_v<major>` (a versioned entry symbol).
pub(crate) fn is_entry_symbol(name: &str) -> bool {
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
    }

    #[test]
    fn garbage_is_not_elf() {
        assert!(exported_from(b"not an elf file at all").is_none());
        assert!(exported_from(&[]).is_none());
    }

    #[test]
    fn reads_a_real_library() {
        // libc exports malloc; any distribution's libc.so.6 is ELF64 LE on
        // the platforms ABI 1 targets.
        for p in
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
        {
            if let Ok(names) = exported_symbols(Path::new(p)) {
                assert!(names.iter().any(|n| n == "malloc"), "{p}: {}", names.len());
                return;
            }
        }
    }
}
