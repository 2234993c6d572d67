//! The only FFI of the crate: the TUN ioctls, which no safe wrapper covers.
//!
//! Everything else (open, read, write, poll, setns) goes through rustix's safe calls.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{open, Mode, OFlags};

/// Size of `struct virtio_net_hdr` (no mergeable buffers): the kernel's default for
/// `IFF_VNET_HDR`, so no `TUNSETVNETHDRSZ` is needed; it is set anyway to be explicit.
pub(crate) const VNET_HDR_LEN: usize = 10;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _union_rest: [u8; 22],
}

/// How a TUN device hands packets to the delay line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TunMode {
    /// `IFF_VNET_HDR` with checksum and TSO offloads: the kernel passes TCP GSO
    /// super-packets (up to 64 KiB) whole, each behind a 10-byte `virtio_net_hdr`.
    Offload,
    /// One MTU-sized packet per read, no header: the stack segments before the device.
    Plain,
}

/// Creates the TUN device `name` in the calling thread's network namespace and returns its
/// queue. The device lives as long as the returned descriptor.
pub(crate) fn create_tun(name: &str, mode: TunMode) -> io::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} is too long"),
        ));
    }
    let fd = open(
        "/dev/net/tun",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _union_rest: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
    if mode == TunMode::Offload {
        flags |= libc::IFF_VNET_HDR;
    }
    // The flag constants all fit in the 16-bit ifr_flags (IFF_VNET_HDR is 0x4000).
    req.flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF reads (and writes back the name of) a `struct ifreq`; `req` is a
    // live, properly sized #[repr(C)] ifreq for the duration of the call, and `fd` is open.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) })?;
    if mode == TunMode::Offload {
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which points to a
        // live local for the duration of the call.
        check(unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                libc::TUNSETVNETHDRSZ,
                &hdr_len as *const libc::c_int,
            )
        })?;
        set_offload(&fd)?;
    }
    Ok(fd)
}

/// Enables checksum and TCP segmentation offloads, so the stack hands the device TCP GSO
/// packets instead of segmenting them itself. UDP segmentation (USO) stays off: UDP
/// datagrams then cross one by one, and every GSO packet the line sees is TCP, which it
/// knows how to cut (gso.rs).
fn set_offload(fd: &OwnedFd) -> io::Result<()> {
    let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes its unsigned argument by value; `fd` is open.
    check(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            offloads as libc::c_ulong,
        )
    })
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Moves the calling thread to SCHED_FIFO at `priority`, so that it runs as soon as a
/// release time comes instead of waiting behind the machine's other work.
pub(crate) fn make_realtime(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a live sched_param for the call.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) })
}
