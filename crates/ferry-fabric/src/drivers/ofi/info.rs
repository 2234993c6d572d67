//! Choosing the provider entry (`fi_info`) for an address, naming endpoints, and reporting
//! what the chosen provider can do.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use ferry_ofi_sys as sys;

use super::ffi::{self, Info, Query};
use crate::caps::{Capabilities, Ordering, Progress};
use crate::error::{FabricError, Result};
use crate::{Address, Scheme};

/// Capabilities every ferry endpoint needs: tagged send/receive (tags keep connections and
/// control traffic apart) and RMA in both directions, as initiator and target.
const CAPS: u64 = sys::FI_TAGGED as u64
    | sys::FI_RMA as u64
    | sys::FI_READ as u64
    | sys::FI_WRITE as u64
    | sys::FI_REMOTE_READ as u64
    | sys::FI_REMOTE_WRITE as u64
    | sys::FI_SEND as u64
    | sys::FI_RECV as u64;

/// Registration modes the driver handles (see `Fabric::register` and the post paths).
const MR_MODE: u64 = (sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT) as u64;

/// Every op carries an `fi_context2` at the start of its context.
const MODE: u64 = sys::FI_CONTEXT | sys::FI_CONTEXT2;

/// The libfabric provider an address names.
pub(super) fn provider(addr: &Address) -> Result<&str> {
    match &addr.scheme {
        Scheme::Ofi(p) => Ok(p),
        Scheme::Tcp => Err(FabricError::InvalidArgument(format!(
            "{addr} is not an ofi address"
        ))),
    }
}

/// `fi_getinfo` for an RDM endpoint of `prov`, preferring entries that can filter receives by
/// source (FI_DIRECTED_RECV), which not every provider offers (ofi_rxm does not).
fn getinfo(
    prov: &str,
    node: Option<&str>,
    service: Option<&str>,
    source: bool,
) -> Result<Vec<Info>> {
    let mut last = None;
    for caps in [CAPS | sys::FI_DIRECTED_RECV, CAPS] {
        let q = Query {
            prov,
            node,
            service,
            source,
            caps,
            mr_mode: MR_MODE,
            mode: MODE,
            msg_order: sys::FI_ORDER_SAS as u64,
        };
        match ffi::getinfo(&q) {
            Ok(v) if !v.is_empty() => return Ok(v),
            Ok(_) => {}
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(FabricError::Ofi { code, .. }) if code == ffi::errno::ENODATA => {
            FabricError::Unavailable(format!(
                "no libfabric provider {prov:?} offers an RDM endpoint with tagged messages and \
                 RMA{}",
                node.map(|n| format!(" at {n}")).unwrap_or_default()
            ))
        }
        Some(e) => e,
        None => FabricError::Unavailable(format!("libfabric provider {prov:?} not found")),
    })
}

/// True if names of this address format are socket addresses.
fn is_sockaddr(format: u32) -> bool {
    format == sys::FI_SOCKADDR || format == sys::FI_SOCKADDR_IN || format == sys::FI_SOCKADDR_IN6
}

/// Parses a `struct sockaddr_in`/`sockaddr_in6` as the provider reports it.
pub(super) fn sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    if family == libc::AF_INET {
        let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
        Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
    } else if family == libc::AF_INET6 {
        let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
        Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
    } else {
        None
    }
}

/// The text of a string-format name (shm: `fi_shm://...`), without its NUL padding.
fn str_name(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Prefix shm (and other FI_ADDR_STR providers) put before the name proper.
fn strip_scheme(s: &str) -> &str {
    s.split_once("://").map_or(s, |(_, rest)| rest)
}

/// The ferry address of an endpoint name, in the scheme of `like`.
/// Names of other formats (efa, cxi: opaque device addresses) are written as hex.
pub(super) fn to_address(like: &Address, format: u32, name: &[u8]) -> Address {
    let (host, port) = match sockaddr(name).filter(|_| is_sockaddr(format)) {
        Some(sa) => (sa.ip().to_string(), Some(sa.port())),
        None if format == sys::FI_ADDR_STR => (strip_scheme(&str_name(name)).to_string(), None),
        None => (hex(name), None),
    };
    Address {
        scheme: like.scheme.clone(),
        host,
        port,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn resolve(addr: &Address) -> Result<Vec<SocketAddr>> {
    (addr.host.as_str(), addr.port.unwrap_or(0))
        .to_socket_addrs()
        .map(|it| it.collect())
        .map_err(|e| FabricError::io(format!("resolving {}", addr.host), e))
}

/// The entry a listener on `addr` binds: the one whose source address is exactly the one asked
/// for (getinfo also offers the host's other interfaces).
pub(super) fn for_listener(addr: &Address) -> Result<Info> {
    let prov = provider(addr)?;
    let service = addr.port.map(|p| p.to_string());
    // Providers whose names are not host:port (efa, cxi) may not resolve the node at all;
    // they listen on their default address (see Listener::local_addr).
    let infos =
        getinfo(prov, Some(&addr.host), service.as_deref(), true).or_else(|e| {
            match getinfo(prov, None, None, false) {
                Ok(v) if v.first().is_some_and(|i| !is_sockaddr(i.addr_format())) => Ok(v),
                _ => Err(e),
            }
        })?;
    let wanted = if addr.port.is_some() {
        resolve(addr).unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut infos = infos.into_iter().peekable();
    let first_format = infos.peek().map(Info::addr_format);
    match first_format {
        Some(f) if is_sockaddr(f) => infos
            .find(|i| sockaddr(&i.src_addr()).is_some_and(|sa| wanted.contains(&sa)))
            .ok_or_else(|| {
                FabricError::Unavailable(format!(
                    "libfabric provider {prov:?} has no interface with address {}",
                    addr.host_port()
                ))
            }),
        _ => infos.next().ok_or_else(|| {
            FabricError::Unavailable(format!("libfabric provider {prov:?} not found"))
        }),
    }
}

/// The name a listener on a name-addressed provider (shm) must be given explicitly: shm
/// would otherwise decorate the requested name (`name:uid:index`), and clients connect by the
/// plain name.
pub(super) fn listener_name(addr: &Address, info: &Info) -> Option<Vec<u8>> {
    (info.addr_format() == sys::FI_ADDR_STR).then(|| addr.host.as_bytes().to_vec())
}

/// Prefix of the names clients give themselves on name-addressed providers.
const CLIENT_PREFIX: &str = "ferryc-";

/// The name a client endpoint on a name-addressed provider (shm) takes: unique across
/// processes and time. shm's own choice (`pid:uid:index`) collides with the region a killed
/// process left behind under a recycled pid, and fi_enable then fails with EBUSY.
pub(super) fn client_name(info: &Info) -> Option<Vec<u8>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    (info.addr_format() == sys::FI_ADDR_STR).then(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{CLIENT_PREFIX}{}-{nanos:x}-{n}", std::process::id()).into_bytes()
    })
}

/// Removes the shared-memory regions that clients of processes no longer alive left in
/// /dev/shm (a killed process cannot clean up; each region holds 16 MiB). Only names of the
/// `client_name` form are touched, and only when their process is gone.
pub(super) fn sweep_dead_client_regions() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CLIENT_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The local IP the kernel would use to reach `addr` (no packet is sent).
fn source_ip(addr: &Address) -> Option<IpAddr> {
    let dest = resolve(addr).ok()?.into_iter().next()?;
    let any: SocketAddr = if dest.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(any).ok()?;
    sock.connect(dest).ok()?;
    Some(sock.local_addr().ok()?.ip())
}

/// The entry a client domain for `addr` binds: on IP fabrics, the interface that routes to
/// `addr` (any port); otherwise the provider's default.
pub(super) fn for_client(addr: &Address) -> Result<Info> {
    let prov = provider(addr)?;
    if addr.port.is_some() {
        if let Some(ip) = source_ip(addr) {
            let node = ip.to_string();
            let found = getinfo(prov, Some(&node), Some("0"), true)?
                .into_iter()
                .find(|i| {
                    is_sockaddr(i.addr_format())
                        && sockaddr(&i.src_addr()).is_some_and(|sa| sa.ip() == ip)
                });
            if let Some(info) = found {
                return Ok(info);
            }
        }
    }
    getinfo(prov, None, None, false)?
        .into_iter()
        .next()
        .ok_or_else(|| FabricError::Unavailable(format!("libfabric provider {prov:?} not found")))
}

/// The provider-format name of the listener at `addr`, for an endpoint whose names have
/// address format `format`.
/// Opaque formats are taken from the hex a listener reported (see [`to_address`]).
pub(super) fn peer_name(addr: &Address, format: u32) -> Result<Vec<u8>> {
    let prov = provider(addr)?;
    let opaque = !is_sockaddr(format) && format != sys::FI_ADDR_STR;
    if let Some(raw) = unhex(&addr.host).filter(|_| opaque && addr.port.is_none()) {
        return Ok(raw);
    }
    let service = addr.port.map(|p| p.to_string());
    getinfo(prov, Some(&addr.host), service.as_deref(), false)?
        .into_iter()
        .filter(|i| i.addr_format() == format)
        .map(|i| i.dest_addr())
        .find(|d| !d.is_empty())
        .ok_or_else(|| FabricError::BadAddress {
            addr: addr.to_string(),
            why: format!("libfabric provider {prov:?} cannot resolve it"),
        })
}

/// Workarounds for provider defects found with libfabric 1.17 (see `tests/ofi_driver.rs`).
/// Providers that could not be tested here (verbs, efa, cxi) get none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quirks {
    /// Receives get an overflow sink (`ffi::Sink`): shm and tcp;ofi_rxm mishandle messages
    /// longer than the posted receive.
    pub sink: bool,
    /// RMA is first granted by the target's driver (`rma.rs`): shm checks nothing on its fast
    /// (CMA) path and wedges the pair of endpoints when its command path refuses an access;
    /// ofi_rxm makes every region remotely readable, and tcp drops the connection on a
    /// refused access.
    pub checked_rma: bool,
    /// Writes ask for delivery completion, so the target has the data when they complete.
    /// Not on shm: its fast path completes on delivery anyway, and the flag disables it.
    pub write_delivery: bool,
    /// Endpoints of one process share memory (shm; see `ffi::LOCAL_EPS`).
    pub shares_local: bool,
    /// One thread at a time in the provider, the others queue their calls (`gate.rs`):
    /// shm copies RMA data inside the post, holding locks other calls spin on.
    pub funnel: bool,
}

/// The workarounds the provider of `info` needs.
pub(super) fn quirks(info: &Info) -> Quirks {
    let prov = info.prov_name();
    let shm = prov == "shm";
    let tcp = prov == "tcp" || prov.starts_with("tcp;");
    Quirks {
        // The sink is an extra receive iov entry, and unregistered.
        sink: (shm || tcp)
            && info.iov_limits().1 >= 2
            && info.mr_mode() & sys::FI_MR_LOCAL as u64 == 0,
        checked_rma: shm || tcp,
        write_delivery: !shm,
        shares_local: shm,
        funnel: shm,
    }
}

/// The RMA piece size that measured best with `ferry bench exs` (figures: docs/fabric.md,
/// "Driver tuning"). tcp;ofi_rxm streams 1 MiB pieces faster than whole 16 MiB reads. On
/// shm, since calls queue behind a copy (`gate.rs`), 4 MiB pieces win because the peer's
/// region lock, which shm holds for a whole copy, is free every 4 MiB. Unmeasured providers
/// are not split.
fn rma_piece(provider: &str) -> u64 {
    if provider.starts_with("tcp") {
        1 << 20
    } else if provider == "shm" {
        4 << 20
    } else {
        u64::MAX
    }
}

/// What the chosen provider entry can do, as ferry reports it.
pub(super) fn capabilities(addr: &Address, info: &Info) -> Capabilities {
    let (tx_iov, rx_iov) = info.iov_limits();
    let Quirks {
        sink, checked_rma, ..
    } = quirks(info);
    let order = info.msg_order();
    // A checked RMA reaches the provider only once the target answered its request
    // (`rma.rs`), so a send posted after it may overtake it, whatever the provider orders.
    let rma_order = |flag: u32| !checked_rma && order & u64::from(flag) != 0;
    Capabilities {
        driver: addr.driver_name(),
        provider: info.prov_name(),
        rma: true,
        // The local list of an RMA is bounded by the tx iov limit (rma_iov_limit bounds the
        // remote list); receives by the rx limit, less the sink.
        max_gather: tx_iov.min(rx_iov - usize::from(sink)).max(1),
        rma_gather: tx_iov.max(1),
        rma_iov_limit: info.rma_iov_limit().max(1),
        inline_size: info.inject_size(),
        max_msg_size: if sink {
            info.max_msg_size().min(ffi::SINK_LEN as u64)
        } else {
            info.max_msg_size()
        },
        rma_piece: rma_piece(&info.prov_name()),
        ordering: Ordering {
            send_after_send: order & sys::FI_ORDER_SAS as u64 != 0,
            send_after_write: rma_order(sys::FI_ORDER_SAW),
            write_after_write: rma_order(sys::FI_ORDER_WAW),
            // Inline sends complete at post time, ahead of earlier non-inline ones.
            completion_in_order: false,
        },
        progress: Progress::ManualThread,
        virt_addr: info.mr_mode() & sys::FI_MR_VIRT_ADDR as u64 != 0,
    }
}

/// The bits of a requested MR key the provider keeps: keys are drawn at random under this
/// mask, per registration.
pub(super) fn key_mask(info: &Info) -> u64 {
    let bits = (info.mr_key_size().min(8) * 8) as u32;
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits).wrapping_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sockaddrs() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&7000u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(sockaddr(&v4), Some("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(sockaddr(&v4[..6]), None);
        assert_eq!(sockaddr(&[]), None);
        let tcp: Address = "ofi+tcp://127.0.0.1:0".parse().unwrap();
        let text = to_address(&tcp, sys::FI_SOCKADDR_IN, &v4).to_string();
        assert_eq!(text, "ofi+tcp://127.0.0.1:7000");
        let shm: Address = "ofi+shm://x".parse().unwrap();
        let text = to_address(&shm, sys::FI_ADDR_STR, b"fi_shm://a\0\0").to_string();
        assert_eq!(text, "ofi+shm://a");
    }

    #[test]
    fn opaque_names_round_trip_through_hex() {
        let like: Address = "ofi+efa://x".parse().unwrap();
        let name = [0u8, 1, 0xab, 0xff];
        let a = to_address(&like, sys::FI_ADDR_EFA, &name);
        assert_eq!(a.host, "0001abff");
        assert_eq!(unhex(&a.host).unwrap(), name);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
