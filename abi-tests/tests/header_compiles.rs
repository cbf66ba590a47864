//! `include/memplug.h` compiles alone and included twice, as C99 (gcc and
//! clang) and as C++ (g++ and clang++, -std=c++11 and -std=c++17), with
//! `-Wall -Wextra -Wpedantic -Werror`; and the entry symbol name it defines
//! is the one the Rust SDK uses.
//!
//! The translation units are `abi-tests/c/header_twice.c` and
//! `abi-tests/c/header_twice.cpp` (ctest compiles them too).

use memplug_test_support::{c_compiler, cxx_compiler, include_dir, repo_root, run_tool, STRICT_WARNINGS};

fn syntax_check(compiler: &str, std: &str, lang: Option<&str>, src: &std::path::Path) {
    let mut cmd =
        if compiler.ends_with("++") { cxx_compiler(Some(compiler)) } else { c_compiler(Some(compiler)) };
    cmd.arg(format!("-std={std}")).args(STRICT_WARNINGS).arg("-I").arg(include_dir()).arg("-fsyntax-only");
    if let Some(lang) = lang {
        cmd.args(["-x", lang]);
    }
    cmd.arg(src);
    run_tool(cmd);
}

fn c_unit() -> std::path::PathBuf {
    repo_root().join("abi-tests/c/header_twice.c")
}

fn cxx_unit() -> std::path::PathBuf {
    repo_root().join("abi-tests/c/header_twice.cpp")
}

#[test]
fn header_alone_as_c99() {
    // The header itself as the whole translation unit: nothing before it.
    let header = include_dir().join("memplug.h");
    for cc in ["gcc", "clang"] {
        syntax_check(cc, "c99", Some("c"), &header);
    }
}

#[test]
fn header_alone_as_cxx() {
    let header = include_dir().join("memplug.h");
    for cxx in ["g++", "clang++"] {
        for std in ["c++11", "c++17"] {
            syntax_check(cxx, std, Some("c++"), &header);
        }
    }
}

#[test]
fn header_twice_as_c99_gcc() {
    syntax_check("gcc", "c99", None, &c_unit());
}

#[test]
fn header_twice_as_c99_clang() {
    syntax_check("clang", "c99", None, &c_unit());
}

#[test]
fn header_twice_as_cxx_gxx() {
    for std in ["c++11", "c++17"] {
        syntax_check("g++", std, None, &cxx_unit());
    }
}

#[test]
fn header_twice_as_cxx_clangxx() {
    for std in ["c++11", "c++17"] {
        syntax_check("clang++", std, None, &cxx_unit());
    }
}

/// What the preprocessor defines `MEMPLUG_ENTRY_SYMBOL_V1` to, as a string.
fn entry_symbol_in_header() -> String {
    let out = c_compiler(Some("gcc"))
        .args(["-std=c99", "-E", "-dM", "-x", "c"])
        .arg(include_dir().join("memplug.h"))
        .output()
        .expect("run gcc -E -dM");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let defines = String::from_utf8(out.stdout).expect("UTF-8 preprocessor output");
    let line = defines
        .lines()
        .find_map(|l| l.strip_prefix("#define MEMPLUG_ENTRY_SYMBOL_V1 "))
        .expect("memplug.h does not define MEMPLUG_ENTRY_SYMBOL_V1");
    let literal = line.trim();
    assert!(
        literal.len() >= 2
            && literal.starts_with('"')
            && literal.ends_with('"')
            && !literal[1..].contains('\\'),
        "MEMPLUG_ENTRY_SYMBOL_V1 is not a plain string literal: {literal}"
    );
    literal[1..literal.len() - 1].to_owned()
}

#[test]
fn entry_symbol_matches_the_sdk() {
    assert_eq!(entry_symbol_in_header(), memplug_sdk::abi::MEMPLUG_ENTRY_SYMBOL_V1);
    // The major is part of the name (ARCHITECTURE.md section 3, Versioning).
    assert!(memplug_sdk::abi::MEMPLUG_ENTRY_SYMBOL_V1
        .ends_with(&format!("_v{}", memplug_sdk::abi::MEMPLUG_ABI_MAJOR)));
}
