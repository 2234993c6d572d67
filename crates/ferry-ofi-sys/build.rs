//! Generates the libfabric bindings. Most of libfabric's data-path API is `static inline`
//! (dispatch through ops tables), so bindgen also emits C shims for those functions, which
//! are compiled here and linked into this crate.

use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shims = out.join("ofi_static_fns");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=fabric");

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_var("FI_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&shims)
        .derive_default(true)
        .prepend_enum_name(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen failed on rdma/fabric.h (is libfabric-dev installed?)");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    cc::Build::new()
        .file(shims.with_extension("c"))
        .include(&manifest)
        .warnings(false)
        .compile("ofi_static_fns");
}
