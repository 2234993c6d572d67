//! Generates the libfabric bindings and finds the symbol versions to load at run time.
//!
//! Most of libfabric's data-path API is `static inline` (dispatch through ops tables), so
//! bindgen also emits C shims for those functions, which are compiled here and linked into
//! this crate; they need no libfabric symbol. The few real exported functions ferry calls are
//! not linked at all: `src/loader.rs` opens libfabric with `dlopen` on first use and resolves
//! them with `dlvsym`, asking for the versions this build's linker binds. To learn those, a
//! probe program calling the five is linked against `-lfabric` here and its version
//! requirements are read back (`build/elf.rs`); they go to `OUT_DIR/linked.rs`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

#[path = "build/elf.rs"]
mod elf;

/// libfabric's exported (not inline) functions: none is linked. The first five are called
/// through the loaded table; `fi_allocinfo` is an inline call of `fi_dupinfo` (so its shim
/// would need the symbol): callers use `dupinfo(NULL)` instead.
const EXPORTED: &[&str] = &[
    "fi_getinfo",
    "fi_freeinfo",
    "fi_dupinfo",
    "fi_fabric",
    "fi_strerror",
    "fi_allocinfo",
    "fi_version",
    "fi_open",
    "fi_tostr",
    "fi_tostr_r",
    "fi_getparams",
    "fi_freeparams",
];

/// The functions ferry resolves at run time (`src/loader.rs` has one field per entry).
const LOADED: &[&str] = &[
    "fi_getinfo",
    "fi_freeinfo",
    "fi_dupinfo",
    "fi_fabric",
    "fi_strerror",
];

/// libfabric's file name if the probe does not say (an unversioned build of the library).
const DEFAULT_LIBRARY: &str = "libfabric.so.1";

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let shims = out.join("ofi_static_fns");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build/elf.rs");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_var("FI_.*");
    for f in EXPORTED {
        builder = builder.blocklist_function(f);
    }
    let bindings = builder
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

    cc::Build::new()
        .file(shims.with_extension("c"))
        .include(&manifest)
        .warnings(false)
        .compile("ofi_static_fns");

    let linked = probe_versions(&out);
    fs::write(out.join("linked.rs"), linked).expect("cannot write linked.rs");
}

/// Links a program calling the loaded functions against `-lfabric` and returns the Rust
/// source of `linked.rs`: the library's file name and the version bound for each function.
fn probe_versions(out: &Path) -> String {
    let src = out.join("probe.c");
    let exe = out.join("probe");
    fs::write(
        &src,
        "#include <rdma/fabric.h>\n\
         int main(int argc, char **argv) {\n\
           struct fi_info *i = fi_dupinfo(0);\n\
           (void)argv;\n\
           fi_getinfo(FI_VERSION(1, 0), 0, 0, 0, i, &i);\n\
           fi_fabric(0, 0, 0);\n\
           fi_freeinfo(i);\n\
           return fi_strerror(argc) != 0;\n\
         }\n",
    )
    .expect("cannot write probe.c");
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let status = compiler
        .to_command()
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-lfabric")
        .status()
        .expect("cannot run the C compiler to link the libfabric probe");
    assert!(
        status.success(),
        "linking a probe against -lfabric failed (is libfabric-dev installed?)"
    );
    let data = fs::read(&exe).expect("cannot read the libfabric probe");
    let needed = elf::needed_versions(&data)
        .expect("cannot read the symbol versions of the libfabric probe (not a 64-bit ELF file)");

    let library = needed
        .iter()
        .find(|n| LOADED.contains(&n.symbol.as_str()))
        .map_or(DEFAULT_LIBRARY, |n| n.file.as_str());
    let mut rs = String::new();
    rs.push_str("/// libfabric's file name (SONAME) as this build linked it.\n");
    writeln!(rs, "pub const LIBRARY: &CStr = c{library:?};").expect("write to String");
    for f in LOADED {
        let version = needed.iter().find(|n| n.symbol == *f).map(|n| &n.version);
        writeln!(
            rs,
            "/// The version of `{f}` this build's linker bound (`None`: exported unversioned)."
        )
        .expect("write to String");
        let value = version.map_or("None".to_string(), |v| format!("Some(c{v:?})"));
        writeln!(
            rs,
            "pub const {}: Option<&CStr> = {value};",
            f.to_uppercase()
        )
        .expect("write to String");
    }
    rs
}
