//! Hands the target and host triples to the crate: the `cc` crate needs
//! them to pick and configure a compiler, and cargo gives them to build
//! scripts only, not to the tests that compile C at run time
//! (`c_compiler`).

fn main() {
    for var in ["TARGET", "HOST"] {
        let value = std::env::var(var).unwrap_or_else(|_| panic!("cargo sets {var} for build scripts"));
        println!("cargo:rustc-env=MEMPLUG_TEST_SUPPORT_{var}={value}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
