//! The committed `include/memplug.h`, read back by bindgen (in `build.rs`),
//! describes exactly the Rust types of `memplug_sdk::abi`:
//!
//! * the same set of structs, each with the same size, alignment, field
//!   names in the same order, field offsets and field sizes;
//! * the same type aliases (`MemplugStatus`, function pointer typedefs, …),
//!   with the same size and alignment;
//! * the same `#define` constants with the same values (integers and the
//!   entry symbol string).
//!
//! bindgen's own layout tests, compiled into `bindings` below, pin its Rust
//! translation to the layout clang computes for the C header; this file then
//! compares that translation with the SDK. Together: C layout == SDK layout.

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unnecessary_transmutes,
    clippy::all
)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/memplug_bindings.rs"));
}

/// `structs()`, `typedefs()`, `int_constants()`, `str_constants()` of the header.
mod header {
    use super::bindings;
    include!(concat!(env!("OUT_DIR"), "/bindgen_layout.rs"));
}

use memplug_abi_tests::layout::sdk;
use std::collections::{BTreeMap, BTreeSet};

/// Names present on one side only, as a readable complaint (empty if none).
fn one_sided<'a>(
    what: &str,
    header: impl IntoIterator<Item = &'a str>,
    sdk: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let h: BTreeSet<&str> = header.into_iter().collect();
    let s: BTreeSet<&str> = sdk.into_iter().collect();
    let mut problems = Vec::new();
    for n in h.difference(&s) {
        problems.push(format!("{what} {n} is in include/memplug.h but not in memplug_sdk::abi"));
    }
    for n in s.difference(&h) {
        problems.push(format!("{what} {n} is in memplug_sdk::abi but not in include/memplug.h"));
    }
    problems
}

fn report(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "include/memplug.h and sdk/src/abi/ disagree (regenerate the header with \
         `MEMPLUG_BLESS=1 cargo test -p memplug-abi-tests --test header_drift` if abi/ is \
         right):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn both_sides_have_items_at_all() {
    // Guards against a parse that silently found nothing.
    assert!(header::structs().len() >= 15, "bindgen found {} structs", header::structs().len());
    assert!(sdk::structs().len() >= 15, "build.rs found {} SDK structs", sdk::structs().len());
    assert!(header::int_constants().len() >= 40);
}

#[test]
fn every_struct_matches() {
    let h: BTreeMap<_, _> = header::structs().into_iter().map(|s| (s.name, s)).collect();
    let s: BTreeMap<_, _> = sdk::structs().into_iter().map(|s| (s.name, s)).collect();
    let mut problems = one_sided("struct", h.keys().copied(), s.keys().copied());
    for (name, sl) in &s {
        if !sl.repr_c {
            problems.push(format!("struct {name} in memplug_sdk::abi is not #[repr(C)]"));
        }
        let Some(hl) = h.get(name) else { continue };
        if hl.size != sl.size {
            problems.push(format!("{name}: sizeof is {} in C, {} in Rust", hl.size, sl.size));
        }
        if hl.align != sl.align {
            problems.push(format!("{name}: alignment is {} in C, {} in Rust", hl.align, sl.align));
        }
        let hn: Vec<_> = hl.fields.iter().map(|f| f.name).collect();
        let sn: Vec<_> = sl.fields.iter().map(|f| f.name).collect();
        if hn != sn {
            problems.push(format!("{name}: fields are {hn:?} in C, {sn:?} in Rust"));
        }
        for sf in &sl.fields {
            let Some(hf) = hl.fields.iter().find(|f| f.name == sf.name) else {
                continue;
            };
            if hf.offset != sf.offset {
                problems
                    .push(format!("{name}.{}: offset {} in C, {} in Rust", sf.name, hf.offset, sf.offset));
            }
            if hf.size != sf.size {
                problems.push(format!("{name}.{}: size {} in C, {} in Rust", sf.name, hf.size, sf.size));
            }
        }
    }
    report(problems);
}

#[test]
fn every_typedef_matches() {
    let h: BTreeMap<_, _> = header::typedefs().into_iter().map(|t| (t.name, t)).collect();
    let s: BTreeMap<_, _> = sdk::typedefs().into_iter().map(|t| (t.name, t)).collect();
    let mut problems = one_sided("typedef", h.keys().copied(), s.keys().copied());
    for (name, st) in &s {
        if let Some(ht) = h.get(name) {
            if (ht.size, ht.align) != (st.size, st.align) {
                problems.push(format!(
                    "typedef {name}: size/align {}/{} in C, {}/{} in Rust",
                    ht.size, ht.align, st.size, st.align
                ));
            }
        }
    }
    report(problems);
}

#[test]
fn every_constant_matches() {
    let hi: BTreeMap<_, _> = header::int_constants().into_iter().collect();
    let si: BTreeMap<_, _> = sdk::int_constants().into_iter().collect();
    let hs: BTreeMap<_, _> = header::str_constants().into_iter().collect();
    let ss: BTreeMap<_, _> = sdk::str_constants().into_iter().collect();
    let mut problems =
        one_sided("constant", hi.keys().chain(hs.keys()).copied(), si.keys().chain(ss.keys()).copied());
    for (name, sv) in &si {
        if let Some(hv) = hi.get(name) {
            if hv != sv {
                problems.push(format!("{name} is {hv} in C, {sv} in Rust"));
            }
        }
    }
    for (name, sv) in &ss {
        if let Some(hv) = hs.get(name) {
            // A C string literal carries its NUL; the Rust &str does not.
            let c = hv.strip_suffix(b"\0").unwrap_or(hv);
            if c != *sv {
                problems.push(format!(
                    "{name} is {:?} in C, {:?} in Rust",
                    String::from_utf8_lossy(c),
                    String::from_utf8_lossy(sv)
                ));
            }
        }
    }
    report(problems);
}

/// The comparison is only as good as its inputs: check the generated tables
/// against a few numbers known by hand, so a generator that measured the
/// wrong thing cannot pass.
#[test]
fn tables_measure_what_they_claim() {
    let s = sdk::structs();
    let obj = s.iter().find(|s| s.name == "MemplugObjectRef").expect("MemplugObjectRef");
    assert_eq!(obj.size, core::mem::size_of::<memplug_sdk::abi::MemplugObjectRef>());
    let dev = obj.fields.iter().find(|f| f.name == "device").expect("device field");
    assert_eq!((dev.offset, dev.size), (16, 8));
    let h = header::structs();
    let plugin = h.iter().find(|s| s.name == "MemplugPlugin").expect("MemplugPlugin");
    assert_eq!(plugin.fields.first().map(|f| (f.name, f.offset, f.size)), Some(("struct_size", 0, 4)));
    assert_eq!(header::str_constants(), vec![("MEMPLUG_ENTRY_SYMBOL_V1", &b"memplug_plugin_v1\0"[..])]);
}
