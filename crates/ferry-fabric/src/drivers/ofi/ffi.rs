//! Every libfabric call of the ofi driver, behind safe wrappers. This is the driver's only
//! module with `unsafe`.
//!
//! Ownership rules that make the wrappers sound:
//! - each open fid is closed exactly once by the Rust value that owns it, children before
//!   parents (endpoint, AV, CQ, then domain, then fabric), because children hold `Arc`s to
//!   their parents; a memory registration holds its domain (and, with `FI_MR_ENDPOINT`, its
//!   endpoint) so it may outlive the ferry `Domain` that made it;
//! - every operation handed to libfabric is a boxed [`OpCtx`] whose address is the libfabric
//!   context and is recorded in the [`Fabric`]'s table of operations in flight; only addresses
//!   found in that table are turned back into boxes, once, so a completion can never free
//!   memory twice or free something libfabric did not get from us;
//! - the memory an operation reads or writes is held by the op's [`LocalSlice`]s until the op
//!   is reclaimed, so it cannot be freed while libfabric may touch it.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use ferry_ofi_sys as sys;

use super::info::Quirks;
use super::lock;
use super::progress::Op;
use super::wedge::Watch;
use crate::error::{FabricError, Result};
use crate::mem::{Buffer, LocalSlice, Registration, RemoteSlice};

/// The libfabric API version ferry is written against.
const API_VERSION: u32 = sys::FI_VERSION(1, 17);

/// An address handle from the address vector.
pub(super) type FiAddr = sys::fi_addr_t;

/// "Any source", for receives that are not directed.
pub(super) const ADDR_UNSPEC: FiAddr = sys::FI_ADDR_UNSPEC;

/// Longest endpoint name accepted from a peer. Provider names are far shorter (sockaddr_in6
/// is 28 bytes, shm names at most 256); anything longer is refused before reaching libfabric.
pub(super) const MAX_NAME: usize = 256;

/// Positive libfabric error numbers the driver tells apart.
pub(super) mod errno {
    use ferry_ofi_sys as sys;
    pub const EAGAIN: i32 = sys::FI_EAGAIN as i32;
    pub const ECANCELED: i32 = sys::FI_ECANCELED as i32;
    pub const ETRUNC: i32 = sys::FI_ETRUNC as i32;
    pub const EACCES: i32 = sys::FI_EACCES as i32;
    pub const EKEYREJECTED: i32 = sys::FI_EKEYREJECTED as i32;
    pub const ENOKEY: i32 = sys::FI_ENOKEY as i32;
    pub const EINVAL: i32 = sys::FI_EINVAL as i32;
    pub const EFAULT: i32 = sys::FI_EFAULT as i32;
    pub const EIO: i32 = sys::FI_EIO as i32;
    pub const EREMOTEIO: i32 = sys::FI_EREMOTEIO as i32;
    pub const ENODATA: i32 = sys::FI_ENODATA as i32;
    pub const ECONNREFUSED: i32 = sys::FI_ECONNREFUSED as i32;
    pub const ECONNRESET: i32 = sys::FI_ECONNRESET as i32;
    pub const ECONNABORTED: i32 = sys::FI_ECONNABORTED as i32;
    pub const ENOTCONN: i32 = sys::FI_ENOTCONN as i32;
    pub const EPIPE: i32 = libc::EPIPE;
    pub const EHOSTUNREACH: i32 = sys::FI_EHOSTUNREACH as i32;
    pub const ETIMEDOUT: i32 = sys::FI_ETIMEDOUT as i32;
}

/// libfabric, opened on the first use of an ofi driver (`ferry_ofi_sys::loader`); a host
/// without it gets an error saying so, and processes on other drivers never load it.
fn lib() -> Result<&'static sys::Libfabric> {
    static SETTINGS: std::sync::Once = std::sync::Once::new();
    SETTINGS.call_once(provider_settings);
    sys::libfabric().map_err(|e| FabricError::Unavailable(e.to_string()))
}

/// Provider parameters ferry needs, set in the environment (libfabric's only way to take
/// them) before libfabric is first used, unless the user set them.
///
/// `FI_OFI_RXM_EAGER_LIMIT`: ofi_rxm 1.17 sends messages above its eager limit (16 KiB) by
/// rendezvous. One that arrives before its receive waits as an unexpected message; if the
/// peer's connection closes meanwhile (the peer died), rxm frees the connection's endpoint
/// but keeps the message, and the receive that later matches it starts the rendezvous read on
/// the freed endpoint: a NULL dereference that kills the process. Over tcp (direct send with
/// dynamic receive buffers) a message of any size up to the eager limit is sent straight from
/// the sender's buffer and lands straight in the posted receive, or in a buffer of its size if
/// unexpected, so with the limit at the largest message (the receive sink's size) there is no
/// rendezvous to crash. rxm over verbs keeps its fixed eager limit; a peer that is not ferry
/// may still send by rendezvous (docs/fabric.md).
fn provider_settings() {
    const EAGER_LIMIT: &str = "FI_OFI_RXM_EAGER_LIMIT";
    if std::env::var_os(EAGER_LIMIT).is_none() {
        // Changing the environment races with threads reading it through libc; this runs once,
        // before libfabric (the only reader of these names) is loaded.
        std::env::set_var(EAGER_LIMIT, SINK_LEN.to_string());
    }
}

/// libfabric's text for a (positive) error number.
pub(super) fn strerror(code: i32) -> String {
    // Errors come from libfabric calls, so it is loaded; if not, the number alone.
    let Some(lib) = sys::loaded() else {
        return format!("libfabric error {code}");
    };
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any input.
    let s = unsafe { CStr::from_ptr((lib.strerror)(code)) };
    s.to_string_lossy().into_owned()
}

/// The positive error number of a negative libfabric return value.
fn errcode(ret: isize) -> i32 {
    i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX)
}

/// A failed libfabric call as a ferry error.
pub(super) fn ofi_error(call: &'static str, ret: isize) -> FabricError {
    let code = errcode(ret);
    FabricError::Ofi {
        call,
        code,
        msg: strerror(code),
    }
}

fn check(call: &'static str, ret: i32) -> Result<()> {
    if ret < 0 {
        Err(ofi_error(call, ret as isize))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// fi_info

/// What to ask `fi_getinfo` for.
pub(super) struct Query<'a> {
    /// Provider name (`tcp`, `shm`, `verbs;ofi_rxm`, ...).
    pub prov: &'a str,
    /// Node (host, IP or shm name), if any.
    pub node: Option<&'a str>,
    /// Service (port), if any.
    pub service: Option<&'a str>,
    /// Node/service name the source (local) address rather than the destination.
    pub source: bool,
    /// Capabilities required.
    pub caps: u64,
    /// Memory-registration modes the driver handles.
    pub mr_mode: u64,
    /// Mode bits the driver can satisfy.
    pub mode: u64,
    /// Message ordering required.
    pub msg_order: u64,
}

/// One `fi_info` entry, owned (a `fi_dupinfo` copy), with the library that made it.
pub(super) struct Info(NonNull<sys::fi_info>, &'static sys::Libfabric);

// SAFETY: an Info is a private deep copy that libfabric never mutates; it is only read.
unsafe impl Send for Info {}
// SAFETY: as above; all accessors take &self and only read.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the pointer came from this library's fi_dupinfo and is freed once, here.
        unsafe { (self.1.freeinfo)(self.0.as_ptr()) }
    }
}

/// Borrows an attribute struct of `owner`; libfabric fills all of them in getinfo results,
/// but a null one reads as `None` rather than crashing.
fn attr<T>(_owner: &Info, p: *mut T) -> Option<&T> {
    // SAFETY: non-null attribute pointers of an owned fi_info stay valid until fi_freeinfo,
    // which happens only when `owner` drops; the borrow is tied to it.
    unsafe { p.as_ref() }
}

fn bytes_at(p: *const c_void, len: usize) -> Vec<u8> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: libfabric guarantees addr/addrlen pairs describe a valid buffer.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec()
}

impl Info {
    fn raw(&self) -> &sys::fi_info {
        // SAFETY: valid until drop.
        unsafe { self.0.as_ref() }
    }

    /// The provider actually selected, e.g. `tcp;ofi_rxm`.
    pub fn prov_name(&self) -> String {
        attr(self, self.raw().fabric_attr)
            .filter(|f| !f.prov_name.is_null())
            // SAFETY: prov_name is a NUL-terminated string owned by the fi_info.
            .map(|f| {
                unsafe { CStr::from_ptr(f.prov_name) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default()
    }

    /// The address format of this provider's names.
    pub fn addr_format(&self) -> u32 {
        self.raw().addr_format
    }

    /// The local address this entry would bind.
    pub fn src_addr(&self) -> Vec<u8> {
        bytes_at(self.raw().src_addr, self.raw().src_addrlen)
    }

    /// The resolved destination (for a destination query).
    pub fn dest_addr(&self) -> Vec<u8> {
        bytes_at(self.raw().dest_addr, self.raw().dest_addrlen)
    }

    /// Granted capabilities.
    pub fn caps(&self) -> u64 {
        self.raw().caps
    }

    /// Memory-registration modes the provider requires.
    pub fn mr_mode(&self) -> u64 {
        attr(self, self.raw().domain_attr).map_or(0, |d| d.mr_mode as u32 as u64)
    }

    /// Size of a requested MR key in bytes.
    pub fn mr_key_size(&self) -> usize {
        attr(self, self.raw().domain_attr).map_or(0, |d| d.mr_key_size)
    }

    /// Sends up to this size may be injected.
    pub fn inject_size(&self) -> usize {
        attr(self, self.raw().tx_attr).map_or(0, |t| t.inject_size)
    }

    /// Local segments per send / RMA, and per receive.
    pub fn iov_limits(&self) -> (usize, usize) {
        (
            attr(self, self.raw().tx_attr).map_or(1, |t| t.iov_limit),
            attr(self, self.raw().rx_attr).map_or(1, |r| r.iov_limit),
        )
    }

    /// Remote segments per RMA.
    pub fn rma_iov_limit(&self) -> usize {
        attr(self, self.raw().tx_attr).map_or(1, |t| t.rma_iov_limit)
    }

    /// Largest message.
    pub fn max_msg_size(&self) -> u64 {
        attr(self, self.raw().ep_attr).map_or(0, |e| e.max_msg_size as u64)
    }

    /// Ordering guaranteed on both the transmit and the receive side.
    pub fn msg_order(&self) -> u64 {
        let tx = attr(self, self.raw().tx_attr).map_or(0, |t| t.msg_order);
        let rx = attr(self, self.raw().rx_attr).map_or(0, |r| r.msg_order);
        tx & rx
    }
}

/// `fi_getinfo`: every matching entry, in libfabric's preference order.
pub(super) fn getinfo(q: &Query) -> Result<Vec<Info>> {
    let lib = lib()?;
    // SAFETY: fi_dupinfo(NULL) (the body of the inline fi_allocinfo) returns a zeroed fi_info
    // with all attribute structs allocated (or null on allocation failure, checked).
    let hints = unsafe { (lib.dupinfo)(ptr::null()) };
    let hints = NonNull::new(hints)
        .ok_or_else(|| FabricError::Unavailable("fi_dupinfo(NULL): out of memory".into()))?;
    let prov = CString::new(q.prov).map_err(|_| FabricError::BadAddress {
        addr: q.prov.into(),
        why: "provider name contains NUL".into(),
    })?;
    let node = q.node.map(CString::new).transpose();
    let service = q.service.map(CString::new).transpose();
    let (Ok(node), Ok(service)) = (node, service) else {
        // SAFETY: hints came from fi_dupinfo(NULL) and is freed once.
        unsafe { (lib.freeinfo)(hints.as_ptr()) };
        return Err(FabricError::BadAddress {
            addr: q.node.unwrap_or_default().into(),
            why: "contains NUL".into(),
        });
    };
    let mut list: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: hints and its attribute structs are valid (fi_dupinfo(NULL)); prov_name gets a
    // malloc'd copy because fi_freeinfo frees it; node/service outlive the call.
    let ret = unsafe {
        let h = &mut *hints.as_ptr();
        h.caps = q.caps;
        h.mode = q.mode;
        (*h.ep_attr).type_ = sys::FI_EP_RDM;
        (*h.domain_attr).mr_mode = q.mr_mode as i32;
        (*h.domain_attr).threading = sys::FI_THREAD_SAFE;
        (*h.tx_attr).msg_order = q.msg_order;
        (*h.rx_attr).msg_order = q.msg_order;
        (*h.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        let r = (lib.getinfo)(
            API_VERSION,
            node.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
            service.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
            if q.source { sys::FI_SOURCE } else { 0 },
            hints.as_ptr(),
            &mut list,
        );
        (lib.freeinfo)(hints.as_ptr());
        r
    };
    check("fi_getinfo", ret)?;
    let mut out = Vec::new();
    let mut cur = list;
    while let Some(entry) = NonNull::new(cur) {
        // SAFETY: walking the list fi_getinfo returned; each entry is duplicated (fi_dupinfo
        // copies one entry and clears `next`) before the list is freed.
        unsafe {
            if let Some(dup) = NonNull::new((lib.dupinfo)(entry.as_ptr())) {
                out.push(Info(dup, lib));
            }
            cur = entry.as_ref().next;
        }
    }
    // SAFETY: list came from fi_getinfo; freed once after copying.
    unsafe { (lib.freeinfo)(list) };
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Open objects

/// Closes a fid when dropped.
struct Closer {
    fid: *mut sys::fid,
    what: &'static str,
}

/// Keeps closes and the process's exit apart. `exit` runs libfabric's teardown (a library
/// destructor, after the `atexit` handlers) while the process's other threads go on, and a
/// thread closing an endpoint beside it crashed in shm's `smr_free` (module notes). Every
/// close holds this gate shared; [`bar_closes_at_exit`] takes it for good.
static CLOSES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The `atexit` handler (registered when the first fabric opens): waits up to a second for
/// the closes in progress, then keeps the gate, so a close that comes later waits for the
/// process to end instead of running beside libfabric's teardown.
extern "C" fn bar_closes_at_exit() {
    use std::sync::TryLockError;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match CLOSES.try_write() {
            Ok(gate) => return std::mem::forget(gate),
            Err(TryLockError::Poisoned(p)) => return std::mem::forget(p.into_inner()),
            Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => return,
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        let _gate = CLOSES.read().unwrap_or_else(|p| p.into_inner());
        // SAFETY: fid is an open libfabric object owned by this Closer, closed exactly once;
        // owners are arranged so children close first.
        let ret = unsafe { sys::fi_close(self.fid) };
        if ret != 0 {
            tracing::warn!(
                "fi_close({}) failed: {}",
                self.what,
                strerror(errcode(ret as isize))
            );
        }
    }
}

/// An open fabric + domain. Registrations hold it, so it closes after the last one.
pub(super) struct DomainFid {
    // Field order: domain closes before fabric.
    domain: *mut sys::fid_domain,
    _domain_close: Closer,
    _fabric_close: Closer,
}

/// The endpoint with its CQ and AV. Closes endpoint, then AV, then CQ, then releases the domain.
struct EpFid {
    _ep: Closer,
    _av: Closer,
    _cq: Closer,
    /// Leaves the registry of local endpoints only once the endpoint is really closed.
    local: OnceLock<LocalName>,
    _domain: Arc<DomainFid>,
}

/// shm lets an endpoint use the memory of another endpoint of the same process directly
/// (found by name when the peer is inserted into the AV), and frees that memory when the
/// owner closes: a peer still holding it in its AV would then crash on its next send or AV
/// removal. So the endpoints of such providers are registered here by name, and an AV entry
/// for one of them holds it open (see `Fabric::av_insert` and `Fabric::shutdown`).
static LOCAL_EPS: Mutex<Vec<LocalEntry>> = Mutex::new(Vec::new());

struct LocalEntry {
    key: Vec<u8>,
    id: u64,
    ep: Weak<EpFid>,
}

/// At process exit, removes the names of the shared-memory regions of endpoints still open
/// (held open for a same-process peer, or never closed before `exit`): shm unlinks a region
/// only when its endpoint closes, and every region left behind keeps 16 MiB of /dev/shm,
/// i.e. of RAM, until reboot. Unlinking removes only the name; mappings stay valid for the
/// threads still running.
extern "C" fn unlink_regions_at_exit() {
    // Never block at exit: a thread may hold the registry.
    let Ok(eps) = LOCAL_EPS.try_lock() else {
        return;
    };
    for e in eps.iter() {
        let mut path = b"/".to_vec();
        path.extend_from_slice(&e.key);
        if let Ok(c) = CString::new(path) {
            // SAFETY: c is a valid NUL-terminated string; shm_unlink only removes a name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

/// An endpoint's entry in [`LOCAL_EPS`], removed when dropped (after the endpoint closed).
struct LocalName {
    id: u64,
}

impl Drop for LocalName {
    fn drop(&mut self) {
        lock(&LOCAL_EPS).retain(|e| e.id != self.id);
    }
}

/// The part of a name that identifies the endpoint: without NUL padding or scheme prefix.
fn local_key(name: &[u8]) -> Vec<u8> {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let name = &name[..end];
    match name.windows(3).position(|w| w == b"://") {
        Some(i) => name[i + 3..].to_vec(),
        None => name.to_vec(),
    }
}

// SAFETY: libfabric objects of a domain opened with FI_THREAD_SAFE may be used from any thread.
unsafe impl Send for DomainFid {}
// SAFETY: as above.
unsafe impl Sync for DomainFid {}
// SAFETY: as above.
unsafe impl Send for EpFid {}
// SAFETY: as above.
unsafe impl Sync for EpFid {}

/// The context libfabric carries for one operation: its scratch space first, as the
/// FI_CONTEXT/FI_CONTEXT2 modes require, then ferry's record of the operation.
#[repr(C)]
struct OpCtx {
    fi: sys::fi_context2,
    op: Op,
}

/// Bookkeeping for an operation in flight, kept beside (not inside) its context so it can be
/// inspected without touching memory libfabric owns.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    /// The connection it belongs to (0: the domain's control traffic).
    pub conn: u64,
    /// For receives: posting order on the connection (`Some(0)` for control receives).
    pub recv_seq: Option<u64>,
    /// Cancelled because the peer closed: report `ConnectionLost`, not `Cancelled`.
    pub lost: bool,
}

/// One completion read from the CQ.
pub(super) struct Event {
    /// The context address (a key into the table of operations in flight).
    pub ctx: usize,
    /// Bytes transferred (receives: bytes placed in the buffer).
    pub len: usize,
    /// The failure, if the operation failed.
    pub err: Option<CqError>,
}

/// An error completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct CqError {
    /// Positive libfabric error number.
    pub code: i32,
    /// Provider-specific error number.
    pub prov_errno: i32,
    /// Bytes that did not fit (truncation).
    pub olen: usize,
}

/// A post call: context, local iov list, descriptors; returns libfabric's status.
type PostCall<'a> = dyn FnMut(*mut c_void, &[sys::iovec], &mut [*mut c_void]) -> isize + 'a;

/// One domain's libfabric objects: fabric, domain, CQ, AV and the RDM endpoint, plus the table
/// of operations in flight on it.
pub(super) struct Fabric {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    /// Extra receive space past every posted receive (see [`Sink`]).
    sink: Option<Sink>,
    /// The provider shares memory between endpoints of this process (see [`LOCAL_EPS`]).
    shares_local: bool,
    /// Flags of RMA writes (see `Quirks::write_delivery`).
    write_flags: u64,
    /// Endpoints of this process in our AV, held open until their entries are removed.
    pins: Mutex<Vec<(FiAddr, Arc<EpFid>)>>,
    /// Owns ep/AV/CQ; taken (closed) by [`Fabric::shutdown`].
    ep_fid: Mutex<Option<Arc<EpFid>>>,
    /// Shutdown could not close the endpoint (something else still holds it).
    ep_open: AtomicBool,
    domain: Arc<DomainFid>,
    mr_endpoint: bool,
    ops: Mutex<HashMap<usize, Meta>>,
    /// Times every call that may spin in the provider (`wedge.rs`).
    pub watch: Watch,
}

// SAFETY: see EpFid; the raw pointers are only used through FI_THREAD_SAFE calls, and the
// shared state (op table, ep_fid) is behind mutexes.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

/// A registered memory region's libfabric side.
pub(super) struct Mr {
    _close: Closer,
    desc: *mut c_void,
    key: u64,
    // Released after the MR closes: the endpoint it is bound to, and the domain.
    _ep: Option<Arc<EpFid>>,
    _domain: Arc<DomainFid>,
}

// SAFETY: the descriptor is an opaque provider handle passed back to FI_THREAD_SAFE calls.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Registration for Mr {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Mr {
    /// The remote key.
    pub fn key(&self) -> u64 {
        self.key
    }
}

/// Length of the [`Sink`]; also the largest message on providers that use one.
pub(super) const SINK_LEN: usize = 1 << 30;

/// Receive space appended to every posted receive on providers whose own truncation handling
/// is broken (libfabric 1.17): shm copies a message longer than the receive (past its 4 KiB
/// inline size) in an endless loop once the local iov runs out, wedging the receiving progress
/// thread; ofi_rxm over tcp (dynamic receive buffers) places nothing and drops the TCP
/// connection, losing the messages behind the truncated one. With the sink the provider never
/// truncates: the excess lands here and is discarded, and the driver reports the truncation.
///
/// A lazily backed anonymous mapping: it costs address space, not memory, except for pages a
/// truncated message touched, which are handed back after each truncation. It is not
/// registered, so it is only used on providers without FI_MR_LOCAL.
struct Sink {
    addr: NonNull<c_void>,
}

// SAFETY: the mapping is only ever written by the provider and never read; any thread may
// hand it to libfabric or release its pages.
unsafe impl Send for Sink {}
// SAFETY: as above.
unsafe impl Sync for Sink {}

impl Sink {
    fn new() -> Result<Sink> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                SINK_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(FabricError::io(
                "mapping the receive overflow sink",
                std::io::Error::last_os_error(),
            ));
        }
        NonNull::new(p)
            .map(|addr| Sink { addr })
            .ok_or_else(|| FabricError::Unavailable("mmap returned null".into()))
    }

    fn iov(&self) -> sys::iovec {
        sys::iovec {
            iov_base: self.addr.as_ptr(),
            iov_len: SINK_LEN,
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(); the endpoint that could write it is closed, since
        // the Fabric owning the sink is dropped only after shutdown.
        unsafe { libc::munmap(self.addr.as_ptr(), SINK_LEN) };
    }
}

impl Fabric {
    /// Opens fabric, domain, CQ, AV and endpoint for `info` and enables the endpoint.
    /// `name` overrides the endpoint's own address (fi_setname) before it is enabled.
    pub fn open(info: &Info, name: Option<&[u8]>, quirks: Quirks) -> Result<Fabric> {
        static GATE: std::sync::Once = std::sync::Once::new();
        // SAFETY: registering a plain extern "C" fn with no captured state.
        GATE.call_once(|| unsafe {
            libc::atexit(bar_closes_at_exit);
        });
        let raw = info.0.as_ptr();
        let mut fabric: *mut sys::fid_fabric = ptr::null_mut();
        // SAFETY: raw is a valid fi_info from getinfo (of the library info.1); its fabric_attr
        // is non-null there.
        check("fi_fabric", unsafe {
            (info.1.fabric)((*raw).fabric_attr, &mut fabric, ptr::null_mut())
        })?;
        // SAFETY: fabric was just opened; &mut (*fabric).fid is its embedded fid.
        let fabric_close = Closer {
            fid: unsafe { &mut (*fabric).fid },
            what: "fabric",
        };
        let mut domain: *mut sys::fid_domain = ptr::null_mut();
        // SAFETY: fabric is open, raw is valid.
        check("fi_domain", unsafe {
            sys::fi_domain(fabric, raw, &mut domain, ptr::null_mut())
        })?;
        let domain = Arc::new(DomainFid {
            domain,
            // SAFETY: domain was just opened.
            _domain_close: Closer {
                fid: unsafe { &mut (*domain).fid },
                what: "domain",
            },
            _fabric_close: fabric_close,
        });

        let cq = open_cq(domain.domain)?;
        // SAFETY: cq was just opened.
        let cq_close = Closer {
            fid: unsafe { &mut (*cq).fid },
            what: "cq",
        };
        let mut av_attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            ..Default::default()
        };
        let mut av: *mut sys::fid_av = ptr::null_mut();
        // SAFETY: domain is open; av_attr lives across the call.
        check("fi_av_open", unsafe {
            sys::fi_av_open(domain.domain, &mut av_attr, &mut av, ptr::null_mut())
        })?;
        // SAFETY: av was just opened.
        let av_close = Closer {
            fid: unsafe { &mut (*av).fid },
            what: "av",
        };
        let mut ep: *mut sys::fid_ep = ptr::null_mut();
        // SAFETY: domain is open, raw is valid.
        check("fi_endpoint", unsafe {
            sys::fi_endpoint(domain.domain, raw, &mut ep, ptr::null_mut())
        })?;
        let ep_fid = Arc::new(EpFid {
            // SAFETY: ep was just opened.
            _ep: Closer {
                fid: unsafe { &mut (*ep).fid },
                what: "endpoint",
            },
            _av: av_close,
            _cq: cq_close,
            local: OnceLock::new(),
            _domain: domain.clone(),
        });
        // SAFETY: ep, cq, av are open objects of the same domain.
        unsafe {
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(ep, &mut (*cq).fid, (sys::FI_TRANSMIT | sys::FI_RECV) as u64),
            )?;
            check("fi_ep_bind(av)", sys::fi_ep_bind(ep, &mut (*av).fid, 0))?;
            if let Some(name) = name {
                let mut buf = name.to_vec();
                buf.push(0);
                check(
                    "fi_setname",
                    sys::fi_setname(&mut (*ep).fid, buf.as_mut_ptr().cast(), buf.len()),
                )?;
            }
            check("fi_enable", sys::fi_enable(ep))?;
        }
        let fab = Fabric {
            ep,
            cq,
            av,
            sink: if quirks.sink {
                Some(Sink::new()?)
            } else {
                None
            },
            shares_local: quirks.shares_local,
            write_flags: if quirks.write_delivery {
                (sys::FI_COMPLETION | sys::FI_DELIVERY_COMPLETE) as u64
            } else {
                sys::FI_COMPLETION as u64
            },
            pins: Mutex::new(Vec::new()),
            ep_fid: Mutex::new(Some(ep_fid.clone())),
            ep_open: AtomicBool::new(false),
            domain,
            mr_endpoint: info.mr_mode() & sys::FI_MR_ENDPOINT as u64 != 0,
            ops: Mutex::new(HashMap::new()),
            watch: Watch::new(quirks.funnel),
        };
        if fab.shares_local {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            AT_EXIT.call_once(|| {
                // SAFETY: registering a plain extern "C" fn with no captured state.
                unsafe { libc::atexit(unlink_regions_at_exit) };
                // `exit_now` skips atexit handlers; the names must go then too.
                crate::health::before_exit_now(|| unlink_regions_at_exit());
            });
            let id = NEXT.fetch_add(1, SeqCst);
            let key = local_key(&fab.getname()?);
            let mut reg = lock(&LOCAL_EPS);
            reg.push(LocalEntry {
                key,
                id,
                ep: Arc::downgrade(&ep_fid),
            });
            let _ = ep_fid.local.set(LocalName { id });
        }
        Ok(fab)
    }

    /// The endpoint's own address, in the provider's format.
    pub fn getname(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; MAX_NAME];
        let mut len = buf.len();
        // SAFETY: buf has len writable bytes; len is updated to the name length.
        let ret =
            unsafe { sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        check("fi_getname", ret)?;
        buf.truncate(len.min(MAX_NAME));
        Ok(buf)
    }

    /// Inserts a peer's address (as its fi_getname bytes) into the AV.
    pub fn av_insert(&self, name: &[u8]) -> Result<FiAddr> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(FabricError::Protocol(format!(
                "peer address of {} bytes",
                name.len()
            )));
        }
        // The provider reads as many bytes as its own address format says, not name.len();
        // zero padding to twice the maximum keeps a short name from being over-read and
        // NUL-terminates string formats.
        let mut padded = vec![0u8; 2 * MAX_NAME];
        padded[..name.len()].copy_from_slice(name);
        let mut pins = lock(&self.pins);
        let pin = if self.shares_local {
            let key = local_key(name);
            match lock(&LOCAL_EPS).iter().find(|e| e.key == key) {
                Some(e) => Some(e.ep.upgrade().ok_or_else(|| {
                    FabricError::ConnectionLost("the peer endpoint is closing".into())
                })?),
                None => None,
            }
        } else {
            None
        };
        let mut addr: FiAddr = ADDR_UNSPEC;
        // shm maps the peer's region here.
        let in_call = self.watch.enter();
        // SAFETY: padded is readable for more than any provider address; addr is writable.
        let ret = unsafe {
            sys::fi_av_insert(
                self.av,
                padded.as_ptr().cast(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        drop(in_call);
        if ret != 1 {
            let ret = if ret < 0 {
                ret as isize
            } else {
                -(errno::EINVAL as isize)
            };
            return Err(ofi_error("fi_av_insert", ret));
        }
        if let Some(ep) = pin {
            pins.push((addr, ep));
        }
        Ok(addr)
    }

    /// Registers `buf` with the given access flags and key, bound to the endpoint when the
    /// provider requires FI_MR_ENDPOINT.
    pub fn register(&self, buf: &Buffer, access: u64, requested_key: u64) -> Result<Mr> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: buf is a live allocation of at least buf.len() bytes (and at least one page),
        // kept alive by the MemoryRegion that owns this Mr for as long as the Mr is open.
        check("fi_mr_reg", unsafe {
            sys::fi_mr_reg(
                self.domain.domain,
                buf.addr() as *const c_void,
                buf.len(),
                access,
                0,
                requested_key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        })?;
        // SAFETY: mr was just opened.
        let close = Closer {
            fid: unsafe { &mut (*mr).fid },
            what: "mr",
        };
        let ep = if self.mr_endpoint {
            let ep = self.lock_ep().clone().ok_or(FabricError::Cancelled)?;
            // SAFETY: mr and ep are open objects of the same domain.
            unsafe {
                check("fi_mr_bind", sys::fi_mr_bind(mr, &mut (*self.ep).fid, 0))?;
                check("fi_mr_enable", sys::fi_mr_enable(mr))?;
            }
            Some(ep)
        } else {
            None
        };
        // SAFETY: mr is open (and enabled where required).
        let (key, desc) = unsafe { (sys::fi_mr_key(mr), sys::fi_mr_desc(mr)) };
        if key == sys::FI_KEY_NOTAVAIL {
            return Err(FabricError::Unsupported(
                "provider uses raw MR keys (FI_MR_RAW)".into(),
            ));
        }
        Ok(Mr {
            _close: close,
            desc,
            key,
            _ep: ep,
            _domain: self.domain.clone(),
        })
    }

    fn lock_ep(&self) -> MutexGuard<'_, Option<Arc<EpFid>>> {
        lock(&self.ep_fid)
    }

    fn lock_ops(&self) -> MutexGuard<'_, HashMap<usize, Meta>> {
        lock(&self.ops)
    }

    // -----------------------------------------------------------------------------------------
    // Posting

    /// Hands `op` to libfabric through `call`, retrying while the provider says -FI_EAGAIN for
    /// as long as `again` (which should progress the CQ) allows.
    fn submit(
        &self,
        call_name: &'static str,
        op: Op,
        meta: Meta,
        again: &mut dyn FnMut() -> Result<()>,
        call: &mut PostCall<'_>,
    ) -> Result<()> {
        let (mut iov, mut desc) = local_iov(&op.slices)?;
        if let (Some(sink), Some(_)) = (&self.sink, meta.recv_seq) {
            iov.push(sink.iov());
            desc.push(ptr::null_mut());
        }
        let ctx = Box::into_raw(Box::new(OpCtx {
            fi: Default::default(),
            op,
        }));
        let key = ctx as usize;
        self.lock_ops().insert(key, meta);
        let fail = |e: FabricError| {
            self.lock_ops().remove(&key);
            // SAFETY: libfabric refused the op, so it holds no reference to ctx; the table
            // entry is removed, so this is the only reclaim.
            drop(unsafe { Box::from_raw(ctx) });
            Err(e)
        };
        loop {
            let in_call = self.watch.enter();
            let ret = call(ctx.cast(), &iov, &mut desc);
            drop(in_call);
            if ret == 0 {
                return Ok(());
            }
            if ret == -(libc::ENOMEM as isize) {
                // shm's way of saying its queue of posted receives (rx_attr.size) is full.
                return fail(FabricError::Unsupported(format!(
                    "{call_name}: the provider's queue of posted operations is full"
                )));
            }
            if ret != -(errno::EAGAIN as isize) {
                return fail(ofi_error(call_name, ret));
            }
            if let Err(e) = again() {
                return fail(e);
            }
        }
    }

    /// Tagged send of `op.slices` to `dest`.
    pub fn send(
        &self,
        op: Op,
        dest: FiAddr,
        tag: u64,
        conn: u64,
        again: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let meta = Meta {
            conn,
            recv_seq: None,
            lost: false,
        };
        self.submit("fi_tsendmsg", op, meta, again, &mut |ctx, iov, desc| {
            let msg = tagged_msg(iov, desc, dest, tag, ctx);
            // SAFETY: iov/desc describe registered memory held by the op until completion;
            // ctx is the op's boxed context, valid until reclaimed from the table.
            unsafe { sys::fi_tsendmsg(self.ep, &msg, sys::FI_COMPLETION as u64) }
        })
    }

    /// Tagged receive into `op.slices` from `src` (or any source).
    pub fn recv(
        &self,
        op: Op,
        src: FiAddr,
        tag: u64,
        meta: Meta,
        again: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.submit("fi_trecvmsg", op, meta, again, &mut |ctx, iov, desc| {
            let msg = tagged_msg(iov, desc, src, tag, ctx);
            // SAFETY: as in send; the receive memory is held by the op until completion.
            unsafe { sys::fi_trecvmsg(self.ep, &msg, sys::FI_COMPLETION as u64) }
        })
    }

    /// RMA write (`read == false`) or read of `op.slices` against the ranges of `remote`
    /// (in order, within the provider's `rma_iov_limit`) at `dest`.
    pub fn rma(
        &self,
        read: bool,
        op: Op,
        dest: FiAddr,
        remote: &[RemoteSlice],
        conn: u64,
        again: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let meta = Meta {
            conn,
            recv_seq: None,
            lost: false,
        };
        let rma_iov = remote
            .iter()
            .map(|r| {
                let len = usize::try_from(r.len).map_err(|_| {
                    FabricError::InvalidArgument("remote length overflows usize".into())
                })?;
                Ok(sys::fi_rma_iov {
                    addr: r.addr,
                    len,
                    key: r.key,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let name = if read { "fi_readmsg" } else { "fi_writemsg" };
        // Several ranges leave shm's fast path (which completes on delivery) for its command
        // path, which completes small writes when they are queued: ask for delivery.
        let write_flags = if rma_iov.len() > 1 {
            (sys::FI_COMPLETION | sys::FI_DELIVERY_COMPLETE) as u64
        } else {
            self.write_flags
        };
        self.submit(name, op, meta, again, &mut |ctx, iov, desc| {
            let msg = sys::fi_msg_rma {
                msg_iov: iov.as_ptr(),
                desc: desc.as_mut_ptr(),
                iov_count: iov.len(),
                addr: dest,
                rma_iov: rma_iov.as_ptr(),
                rma_iov_count: rma_iov.len(),
                context: ctx,
                data: 0,
            };
            // SAFETY: as in send; rma_iov lives across the call (libfabric copies it).
            unsafe {
                if read {
                    sys::fi_readmsg(self.ep, &msg, sys::FI_COMPLETION as u64)
                } else {
                    sys::fi_writemsg(self.ep, &msg, write_flags)
                }
            }
        })
    }

    /// Sends `data` (at most the inject size) without a completion: it is copied before this
    /// returns.
    pub fn inject(
        &self,
        data: &[u8],
        dest: FiAddr,
        tag: u64,
        again: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        loop {
            let in_call = self.watch.enter();
            // SAFETY: data is a live slice; fi_tinject copies it before returning.
            let ret =
                unsafe { sys::fi_tinject(self.ep, data.as_ptr().cast(), data.len(), dest, tag) };
            drop(in_call);
            if ret == 0 {
                return Ok(());
            }
            if ret != -(errno::EAGAIN as isize) {
                return Err(ofi_error("fi_tinject", ret));
            }
            again()?;
        }
    }

    // -----------------------------------------------------------------------------------------
    // Completions

    /// Reads up to `max` completions without blocking.
    pub fn read_cq(&self, max: usize, out: &mut Vec<Event>) {
        let mut entries: [sys::fi_cq_tagged_entry; 32] = Default::default();
        let n = max.clamp(1, entries.len());
        let in_call = self.watch.enter();
        // SAFETY: entries holds n entries of the CQ's format (tagged).
        let ret = unsafe { sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), n) };
        drop(in_call);
        if ret > 0 {
            for e in entries.iter().take(ret as usize) {
                out.push(Event {
                    ctx: e.op_context as usize,
                    len: e.len,
                    err: None,
                });
            }
        } else if ret == -(sys::FI_EAVAIL as isize) {
            let mut e = sys::fi_cq_err_entry::default();
            // SAFETY: e is a valid, zeroed error entry (err_data_size 0: the provider
            // points err_data at its own buffer, which is not used).
            let r = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
            if r > 0 {
                out.push(Event {
                    ctx: e.op_context as usize,
                    len: e.len,
                    err: Some(CqError {
                        code: errcode(e.err as isize),
                        prov_errno: e.prov_errno,
                        olen: e.olen,
                    }),
                });
            }
        } else if ret < 0 && ret != -(errno::EAGAIN as isize) {
            tracing::warn!("fi_cq_read: {}", strerror(errcode(ret)));
        }
    }

    /// Returns the pages a truncated message wrote into the sink to the kernel.
    pub fn release_sink(&self) {
        if let Some(sink) = &self.sink {
            // SAFETY: MADV_DONTNEED on our own private anonymous mapping only zeroes it; a
            // provider writing there concurrently writes discarded bytes either way.
            unsafe { libc::madvise(sink.addr.as_ptr(), SINK_LEN, libc::MADV_DONTNEED) };
        }
    }

    /// Reclaims the operation libfabric completed with context `ctx`.
    pub fn take(&self, ctx: usize) -> Option<(Op, Meta)> {
        let meta = self.lock_ops().remove(&ctx)?;
        // SAFETY: ctx was in the table, so it is a pointer from Box::into_raw in submit that
        // has not been reclaimed; removing the entry makes this the only reclaim, and libfabric
        // no longer uses a context it has completed.
        let b = unsafe { Box::from_raw(ctx as *mut OpCtx) };
        Some((b.op, meta))
    }

    /// The domain wedged (`wedge.rs`): shows `report` every user operation in flight, which
    /// will never complete, without reclaiming any (a thread stuck in the provider may still
    /// hold their contexts). Gives up if a stuck thread holds the table.
    pub fn report_stranded(&self, mut report: impl FnMut(&Op)) {
        let Ok(ops) = self.ops.try_lock() else {
            tracing::warn!("ofi: operations in flight on a wedged domain cannot be failed");
            return;
        };
        for &ctx in ops.keys() {
            // SAFETY: ctx is in the table, so it is a live Box<OpCtx> from submit that nobody
            // reclaims while the table is locked; only the `op` field is read (libfabric
            // writes only the `fi` context field).
            let op = unsafe { &(*(ctx as *const OpCtx)).op };
            report(op);
        }
    }

    /// Number of operations in flight.
    pub fn in_flight(&self) -> usize {
        self.lock_ops().len()
    }

    /// Operations in flight other than receives (sends and RMA).
    pub fn active(&self) -> usize {
        self.lock_ops()
            .values()
            .filter(|m| m.recv_seq.is_none())
            .count()
    }

    /// Posting order numbers of the receives in flight on `conn`.
    pub fn pending_recvs(&self, conn: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .lock_ops()
            .values()
            .filter(|m| m.conn == conn)
            .filter_map(|m| m.recv_seq)
            .collect();
        v.sort_unstable();
        v
    }

    /// Asks libfabric to cancel every receive in flight for which `select` returns true
    /// (`select` may mark it). Cancelled receives complete with -FI_ECANCELED.
    pub fn cancel_recvs(&self, mut select: impl FnMut(&mut Meta) -> bool) {
        // The table stays locked while cancelling so no selected context can be completed,
        // freed and reused by another op in between.
        let mut ops = self.lock_ops();
        for (&ctx, meta) in ops.iter_mut() {
            if meta.recv_seq.is_some() && select(meta) {
                let in_call = self.watch.enter();
                // SAFETY: ctx is a live context of this endpoint (in the table, table locked).
                let ret = unsafe { sys::fi_cancel(&mut (*self.ep).fid, ctx as *mut c_void) };
                drop(in_call);
                if ret != 0 && ret != -(sys::FI_ENOENT as isize) {
                    tracing::debug!("fi_cancel: {}", strerror(errcode(ret)));
                }
            }
        }
    }

    /// Closes the endpoint (unless a registration bound to it still holds it) and hands every
    /// operation that never completed to `orphan`. Their memory is released only if the
    /// endpoint really closed; otherwise it is leaked, since libfabric might still touch it.
    pub fn shutdown(&self, mut orphan: impl FnMut(&Op)) {
        // Entries for endpoints of this process go first, while those are still held open.
        for (mut addr, _) in lock(&self.pins).drain(..) {
            // SAFETY: addr is a live entry of our open AV; nothing posts any more.
            let ret = unsafe { sys::fi_av_remove(self.av, &mut addr, 1, 0) };
            if ret != 0 {
                tracing::warn!("fi_av_remove: {}", strerror(errcode(ret as isize)));
            }
        }
        let ep = self.lock_ep().take();
        let closed = match ep {
            Some(ep) => Arc::try_unwrap(ep).is_ok(),
            None => true,
        };
        self.ep_open.store(!closed, SeqCst);
        let left: Vec<usize> = self.lock_ops().drain().map(|(ctx, _)| ctx).collect();
        for ctx in left {
            let p = ctx as *mut OpCtx;
            if closed {
                // SAFETY: ctx came from the table (a live Box::into_raw pointer), drained so it
                // is reclaimed once; with the endpoint closed libfabric no longer uses it.
                let b = unsafe { Box::from_raw(p) };
                orphan(&b.op);
            } else {
                // SAFETY: as above, but only read: the allocation is deliberately leaked.
                orphan(unsafe { &(*p).op });
            }
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // A Fabric that was never shut down (failed construction of its domain) still owns its
        // endpoint; ops cannot exist yet, so just close.
        self.lock_ep().take();
        // Receives the provider still holds may point into the sink.
        if self.ep_open.load(SeqCst) {
            std::mem::forget(self.sink.take());
        }
    }
}

fn open_cq(domain: *mut sys::fid_domain) -> Result<*mut sys::fid_cq> {
    // No wait object: the progress thread sleeps on its own (see progress.rs), because
    // fi_cq_sread on ofi_rxm was seen spinning forever after a connection teardown.
    let mut attr = sys::fi_cq_attr {
        format: sys::FI_CQ_FORMAT_TAGGED,
        wait_obj: sys::FI_WAIT_NONE,
        ..Default::default()
    };
    let mut cq: *mut sys::fid_cq = ptr::null_mut();
    // SAFETY: domain is open; attr lives across the call.
    check("fi_cq_open", unsafe {
        sys::fi_cq_open(domain, &mut attr, &mut cq, ptr::null_mut())
    })?;
    Ok(cq)
}

/// A tagged-message descriptor over `iov`/`desc` (which must outlive the post it is used for).
fn tagged_msg(
    iov: &[sys::iovec],
    desc: &mut [*mut std::ffi::c_void],
    addr: FiAddr,
    tag: u64,
    context: *mut std::ffi::c_void,
) -> sys::fi_msg_tagged {
    sys::fi_msg_tagged {
        msg_iov: iov.as_ptr(),
        desc: desc.as_mut_ptr(),
        iov_count: iov.len(),
        addr,
        tag,
        ignore: 0,
        context,
        data: 0,
    }
}

/// Checks that a slice lies within its region: its fields are public, and libfabric is about
/// to be handed its address range.
fn in_bounds(s: &LocalSlice) -> Result<()> {
    match s.offset.checked_add(s.len) {
        Some(end) if end <= s.region.len() => Ok(()),
        _ => Err(FabricError::InvalidArgument(format!(
            "slice {}+{} outside its region of {} bytes",
            s.offset,
            s.len,
            s.region.len()
        ))),
    }
}

/// Checks a gather/scatter list the way posting it would, without posting (checked RMA posts
/// only after the target's grant, and must not fail then for a reason known now).
pub(super) fn validate(slices: &[LocalSlice]) -> Result<()> {
    local_iov(slices).map(|_| ())
}

/// The iovec and descriptor lists for a gather/scatter list of this driver's registrations.
fn local_iov(slices: &[LocalSlice]) -> Result<(Vec<sys::iovec>, Vec<*mut c_void>)> {
    let mut iov = Vec::with_capacity(slices.len());
    let mut desc = Vec::with_capacity(slices.len());
    for s in slices {
        in_bounds(s)?;
        let mr = s
            .region
            .registration()
            .downcast_ref::<Mr>()
            .ok_or_else(|| {
                FabricError::InvalidArgument("memory region was not registered by ofi".into())
            })?;
        iov.push(sys::iovec {
            iov_base: s.addr() as *mut c_void,
            iov_len: s.len,
        });
        desc.push(mr.desc);
    }
    Ok((iov, desc))
}
