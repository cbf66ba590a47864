//! Compiles the shim's one C++ function, the thrower of a refused
//! allocation (`cpp/refusal.cpp`: PyTorch turns only a C++ exception into a
//! Python error), into the library.

fn main() {
    println!("cargo:rerun-if-changed=cpp/refusal.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .extra_warnings(true)
        .flag("-Werror")
        .file("cpp/refusal.cpp")
        .compile("memplug_torch_refusal");
}
