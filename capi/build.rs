//! Gives the shared library a SONAME (`libmemplug_host.so`), so programs
//! linked against it record that name rather than the build path.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "android" || os.ends_with("bsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmemplug_host.so");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
