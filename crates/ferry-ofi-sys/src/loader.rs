//! libfabric opened at run time: no ferry binary has libfabric as a link-time dependency,
//! so a process that never uses an `ofi` driver never loads it (nor what it pulls in: on
//! Debian, libpsm_infinipath, whose constructor alone costs 0.2 s at every start).
//!
//! The library is opened on the first call of [`libfabric`] (`dlopen`, `RTLD_NOW |
//! RTLD_LOCAL`, never closed) and the five exported functions ferry calls are resolved with
//! `dlvsym` at the versions the build's linker bound (`build.rs`), so a newer libfabric
//! gives the entry points matching the `struct fi_info` layout of the headers we compiled
//! against, as a linked binary would get.
//!
//! Loading runs libfabric's dependencies' constructors in the middle of a running process:
//! Debian's libinfinipath installs handlers for SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and
//! SIGABRT that print a backtrace and `exit(1)`. Linked, that happened before `main`, and the
//! process's own handlers came after; loaded late, it would replace them (`ferry serve`'s
//! graceful SIGTERM drain would become `exit(1)`). So every signal disposition that loading
//! changes is put back as it was.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

use crate::{fi_fabric_attr, fi_info, fid_fabric};

/// What the build bound: the library's file name and each function's version.
mod linked {
    use std::ffi::CStr;
    include!(concat!(env!("OUT_DIR"), "/linked.rs"));
}

/// `fi_getinfo(version, node, service, flags, hints, info)`.
pub type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const fi_info,
    *mut *mut fi_info,
) -> c_int;
/// `fi_freeinfo(info)`.
pub type FreeinfoFn = unsafe extern "C" fn(*mut fi_info);
/// `fi_dupinfo(info)`; `fi_dupinfo(NULL)` is `fi_allocinfo()`.
pub type DupinfoFn = unsafe extern "C" fn(*const fi_info) -> *mut fi_info;
/// `fi_fabric(attr, fabric, context)`.
pub type FabricFn =
    unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;
/// `fi_strerror(errnum)`.
pub type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The loaded library's entry points. Calling them is as unsafe as calling the C functions.
#[derive(Debug)]
pub struct Libfabric {
    /// `fi_getinfo`.
    pub getinfo: GetinfoFn,
    /// `fi_freeinfo`.
    pub freeinfo: FreeinfoFn,
    /// `fi_dupinfo` (and, with a null argument, `fi_allocinfo`).
    pub dupinfo: DupinfoFn,
    /// `fi_fabric`.
    pub fabric: FabricFn,
    /// `fi_strerror`.
    pub strerror: StrerrorFn,
}

/// Why libfabric could not be loaded; the text tells the user what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError(String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

static LOADED: OnceLock<Result<Libfabric, LoadError>> = OnceLock::new();

/// libfabric, opened on the first call (by any thread); later calls return the same table,
/// or the same error.
pub fn libfabric() -> Result<&'static Libfabric, LoadError> {
    LOADED
        .get_or_init(|| {
            load(
                linked::LIBRARY,
                [
                    (c"fi_getinfo", linked::FI_GETINFO),
                    (c"fi_freeinfo", linked::FI_FREEINFO),
                    (c"fi_dupinfo", linked::FI_DUPINFO),
                    (c"fi_fabric", linked::FI_FABRIC),
                    (c"fi_strerror", linked::FI_STRERROR),
                ],
            )
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// libfabric if it has been opened already; never opens it.
pub fn loaded() -> Option<&'static Libfabric> {
    LOADED.get().and_then(|r| r.as_ref().ok())
}

/// The text of the last `dlerror`, or `fallback`.
fn dlerror(fallback: &str) -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        fallback.to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Opens `library` and resolves `symbols` (name, version), in [`Libfabric`]'s field order.
fn load(library: &CStr, symbols: [(&CStr, Option<&CStr>); 5]) -> Result<Libfabric, LoadError> {
    let name = library.to_string_lossy();
    let signals = Dispositions::save();
    // SAFETY: library is NUL-terminated; opening libfabric runs its constructors, which is
    // what linking it did before (their signal handlers are undone just below).
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    signals.restore_changed();
    if handle.is_null() {
        return Err(LoadError(format!(
            "the ofi drivers need libfabric (cannot load {name}: {}; install libfabric1, or \
             use tcp://)",
            dlerror("dlopen failed")
        )));
    }
    let mut found = [std::ptr::null_mut::<c_void>(); 5];
    for (slot, (symbol, version)) in found.iter_mut().zip(symbols) {
        // SAFETY: handle is open (never closed); symbol and version are NUL-terminated.
        let p = unsafe {
            match version {
                Some(v) => libc::dlvsym(handle, symbol.as_ptr(), v.as_ptr()),
                None => libc::dlsym(handle, symbol.as_ptr()),
            }
        };
        if p.is_null() {
            let sym = symbol.to_string_lossy();
            let wanted = version.map_or(String::new(), |v| format!("@{}", v.to_string_lossy()));
            return Err(LoadError(format!(
                "{name} has no {sym}{wanted}, which this ferry was built against ({}); install \
                 a libfabric at least as new as the build's, or use tcp://",
                dlerror("symbol not found")
            )));
        }
        *slot = p;
    }
    let [getinfo, freeinfo, dupinfo, fabric, strerror] = found;
    // SAFETY: each pointer is the named libfabric function at the version the build's linker
    // bound for the prototypes in rdma/fabric.h, which these types transcribe (bindgen's
    // output for the same declarations).
    unsafe {
        Ok(Libfabric {
            getinfo: std::mem::transmute::<*mut c_void, GetinfoFn>(getinfo),
            freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(freeinfo),
            dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(dupinfo),
            fabric: std::mem::transmute::<*mut c_void, FabricFn>(fabric),
            strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(strerror),
        })
    }
}

/// The process's signal dispositions at one moment.
struct Dispositions(Vec<(c_int, libc::sigaction)>);

impl Dispositions {
    /// Every signal's current disposition (those `sigaction` refuses are left out).
    fn save() -> Dispositions {
        let mut saved = Vec::new();
        for sig in 1..=libc::SIGRTMAX() {
            // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty mask, no flags).
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a null new action, sigaction only writes the disposition to `old`.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0 {
                saved.push((sig, old));
            }
        }
        Dispositions(saved)
    }

    /// Puts back every disposition that differs (handler or flags) from the saved one.
    fn restore_changed(&self) {
        for (sig, was) in &self.0 {
            // SAFETY: as in save().
            let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as in save().
            let read = unsafe { libc::sigaction(*sig, std::ptr::null(), &mut now) };
            if read == 0 && (now.sa_sigaction != was.sa_sigaction || now.sa_flags != was.sa_flags) {
                // SAFETY: `was` is a disposition this process had (read back by sigaction), so
                // reinstating it installs no handler that was not already installed.
                unsafe { libc::sigaction(*sig, was, std::ptr::null_mut()) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions() -> [(&'static CStr, Option<&'static CStr>); 5] {
        [
            (c"fi_getinfo", linked::FI_GETINFO),
            (c"fi_freeinfo", linked::FI_FREEINFO),
            (c"fi_dupinfo", linked::FI_DUPINFO),
            (c"fi_fabric", linked::FI_FABRIC),
            (c"fi_strerror", linked::FI_STRERROR),
        ]
    }

    #[test]
    fn missing_library_is_an_error_naming_it() {
        let err = load(c"libfabric-not-here.so.1", versions()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("cannot load libfabric-not-here.so.1: "),
            "{text}"
        );
        // dlerror's text follows: it names the file too, and says why (in the C locale,
        // "cannot open shared object file: No such file or directory").
        assert_eq!(text.matches("libfabric-not-here.so.1").count(), 2, "{text}");
        assert!(text.contains("install libfabric1, or use tcp://"), "{text}");
    }

    #[test]
    fn missing_version_is_an_error_naming_it() {
        let mut symbols = versions();
        symbols[0].1 = Some(c"FABRIC_9.99");
        let err = load(linked::LIBRARY, symbols).unwrap_err();
        assert!(err.to_string().contains("fi_getinfo@FABRIC_9.99"), "{err}");
    }

    #[test]
    fn the_build_bound_versioned_symbols() {
        // libfabric has versioned its exports since 1.0; the probe must have seen that.
        assert_eq!(linked::LIBRARY, c"libfabric.so.1");
        for (sym, version) in versions() {
            let v = version.unwrap_or_else(|| panic!("{sym:?} unversioned"));
            assert!(v.to_bytes().starts_with(b"FABRIC_1."), "{sym:?}@{v:?}");
        }
    }

    #[test]
    fn loads_and_calls_strerror() {
        let lib = libfabric().expect("libfabric is installed where ferry is built");
        assert!(loaded().is_some());
        // SAFETY: fi_strerror returns a static NUL-terminated string for any input.
        let text = unsafe { CStr::from_ptr((lib.strerror)(libc::EAGAIN)) };
        assert!(!text.to_bytes().is_empty());
    }
}
