//! Reads both descriptions of the ABI and writes, into `OUT_DIR`:
//!
//! * `memplug_bindings.rs`: bindgen's Rust translation of the committed
//!   `include/memplug.h` (bindgen's own layout tests included: they pin the
//!   translation to the layout clang computes for the C header).
//! * `bindgen_layout.rs` / `sdk_layout.rs`: for every struct, type alias and
//!   constant found in the bindgen output / in `sdk/src/abi/`, code that
//!   measures it (size, alignment, each field's offset and size, each value).
//!
//! The item lists come from parsing the sources with `syn`, not from a
//! hand-kept list, so a struct added on one side only shows up as missing on
//! the other (`tests/layout_bindgen.rs`), and `tests/c_layout.rs` asserts
//! every Rust layout from C.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("abi-tests lives in the workspace root");
    // MEMPLUG_ABI_TESTS_HEADER points the checks at another header (a
    // frozen one of a released minor, or a deliberately broken copy).
    println!("cargo:rerun-if-env-changed=MEMPLUG_ABI_TESTS_HEADER");
    let header = env::var_os("MEMPLUG_ABI_TESTS_HEADER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("include").join("memplug.h"));
    // The ABI's Rust source: sdk/src/abi/, one module per part.
    let abi_dir = root.join("sdk").join("src").join("abi");
    let mut abi_files: Vec<PathBuf> = fs::read_dir(&abi_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", abi_dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    abi_files.sort();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed={}", abi_dir.display());
    for f in &abi_files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    let bindings = run_bindgen(&header);
    write(&out.join("memplug_bindings.rs"), &bindings);

    let header_items = Items::collect(&bindings, "bindgen output of include/memplug.h");
    write(&out.join("bindgen_layout.rs"), &header_items.tables("bindings", "memplug_abi_tests::layout"));

    let mut sdk_items = Items::default();
    for f in &abi_files {
        let src = fs::read_to_string(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
        let what = format!("sdk/src/abi/{}", f.file_name().expect("file name").to_string_lossy());
        sdk_items.append(Items::collect(&src, &what));
    }
    write(&out.join("sdk_layout.rs"), &sdk_items.tables("memplug_sdk::abi", "crate::layout"));
}

fn run_bindgen(header: &Path) -> String {
    let header = header.to_str().expect("UTF-8 path to memplug.h");
    bindgen::Builder::default()
        .header(header)
        // Only what memplug.h itself declares, not <stdint.h>.
        .allowlist_file(".*memplug\\.h")
        .clang_args(["-x", "c", "-std=c99"])
        .rust_target(bindgen::RustTarget::stable(80, 0).expect("Rust 1.80 target"))
        .layout_tests(true)
        .generate_comments(false)
        .formatter(bindgen::Formatter::None)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen could not translate {header}: {e}. \
                 It needs libclang (Debian: apt-get install libclang-dev clang)."
            )
        })
        .to_string()
}

fn write(path: &Path, text: &str) {
    // Unchanged output keeps the tests from rebuilding.
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// The measurable items of one Rust source file.
#[derive(Default)]
struct Items {
    /// (name, is `#[repr(C)]`, field names in declaration order)
    structs: Vec<(String, bool, Vec<String>)>,
    /// `pub type` aliases.
    typedefs: Vec<String>,
    /// Integer constants.
    int_consts: Vec<String>,
    /// String (`&str`) or byte-string (`&[u8; N]`) constants.
    str_consts: Vec<String>,
}

impl Items {
    /// Adds `other`'s items after these.
    fn append(&mut self, other: Items) {
        self.structs.extend(other.structs);
        self.typedefs.extend(other.typedefs);
        self.int_consts.extend(other.int_consts);
        self.str_consts.extend(other.str_consts);
    }

    fn collect(src: &str, what: &str) -> Items {
        let file = syn::parse_file(src).unwrap_or_else(|e| panic!("cannot parse {what}: {e}"));
        let mut items = Items::default();
        for item in &file.items {
            match item {
                syn::Item::Struct(s) if is_pub(&s.vis) => {
                    let repr_c = s.attrs.iter().any(is_repr_c);
                    let fields = match &s.fields {
                        syn::Fields::Named(f) => f
                            .named
                            .iter()
                            .map(|f| f.ident.as_ref().expect("named field").to_string())
                            .collect(),
                        _ => panic!("{what}: struct {} has unnamed fields", s.ident),
                    };
                    items.structs.push((s.ident.to_string(), repr_c, fields));
                }
                syn::Item::Type(t) if is_pub(&t.vis) => items.typedefs.push(t.ident.to_string()),
                syn::Item::Const(c) if is_pub(&c.vis) => {
                    if matches!(*c.ty, syn::Type::Reference(_)) {
                        items.str_consts.push(c.ident.to_string());
                    } else {
                        items.int_consts.push(c.ident.to_string());
                    }
                }
                _ => {}
            }
        }
        items
    }

    /// Rust source with four functions measuring every item, reached through
    /// `items_path` (`bindings`, `memplug_sdk::abi`); the layout types live
    /// at `types_path`.
    fn tables(&self, items_path: &str, types_path: &str) -> String {
        let mut s = String::new();
        let p = items_path;
        let t = types_path;
        writeln!(s, "// @generated by abi-tests/build.rs from {p}; do not edit.\n").unwrap();

        writeln!(s, "/// Every struct: size, alignment, fields.").unwrap();
        writeln!(s, "pub fn structs() -> ::std::vec::Vec<{t}::StructLayout> {{").unwrap();
        writeln!(s, "    ::std::vec![").unwrap();
        for (name, repr_c, fields) in &self.structs {
            writeln!(s, "        {t}::StructLayout {{").unwrap();
            writeln!(s, "            name: {name:?},").unwrap();
            writeln!(s, "            size: ::core::mem::size_of::<{p}::{name}>(),").unwrap();
            writeln!(s, "            align: ::core::mem::align_of::<{p}::{name}>(),").unwrap();
            writeln!(s, "            repr_c: {repr_c},").unwrap();
            writeln!(s, "            fields: ::std::vec![").unwrap();
            for f in fields {
                writeln!(
                    s,
                    "                {t}::FieldLayout {{ name: {f:?}, \
                     offset: ::core::mem::offset_of!({p}::{name}, {f}), \
                     size: {t}::field_size(|v: &{p}::{name}| &v.{f}) }},"
                )
                .unwrap();
            }
            writeln!(s, "            ],").unwrap();
            writeln!(s, "        }},").unwrap();
        }
        writeln!(s, "    ]\n}}\n").unwrap();

        writeln!(s, "/// Every `pub type`: size and alignment.").unwrap();
        writeln!(s, "pub fn typedefs() -> ::std::vec::Vec<{t}::TypedefLayout> {{").unwrap();
        writeln!(s, "    ::std::vec![").unwrap();
        for name in &self.typedefs {
            writeln!(
                s,
                "        {t}::TypedefLayout {{ name: {name:?}, \
                 size: ::core::mem::size_of::<{p}::{name}>(), \
                 align: ::core::mem::align_of::<{p}::{name}>() }},"
            )
            .unwrap();
        }
        writeln!(s, "    ]\n}}\n").unwrap();

        writeln!(s, "/// Every integer constant, widened without loss.").unwrap();
        writeln!(s, "pub fn int_constants() -> ::std::vec::Vec<(&'static str, i128)> {{").unwrap();
        writeln!(s, "    ::std::vec![").unwrap();
        for name in &self.int_consts {
            writeln!(s, "        ({name:?}, {p}::{name} as i128),").unwrap();
        }
        writeln!(s, "    ]\n}}\n").unwrap();

        writeln!(s, "/// Every string constant, as bytes (a C string keeps its NUL).").unwrap();
        writeln!(s, "pub fn str_constants() -> ::std::vec::Vec<(&'static str, &'static [u8])> {{").unwrap();
        writeln!(s, "    ::std::vec![").unwrap();
        for name in &self.str_consts {
            writeln!(s, "        ({name:?}, {t}::AsBytes::as_bytes_(&{p}::{name})),").unwrap();
        }
        writeln!(s, "    ]\n}}").unwrap();
        s
    }
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

fn is_repr_c(attr: &syn::Attribute) -> bool {
    if !attr.path().is_ident("repr") {
        return false;
    }
    let mut c = false;
    let _ = attr.parse_nested_meta(|m| {
        c |= m.path.is_ident("C");
        Ok(())
    });
    c
}
