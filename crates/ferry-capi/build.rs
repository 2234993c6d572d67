//! Gives libferry.so its SONAME: binaries link against `libferry.so.0`, the ABI's major
//! version, so a later compatible release can replace the file under them.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libferry.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
