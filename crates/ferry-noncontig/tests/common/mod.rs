//! Real endpoint pairs (listener and client in one process, as the fabric conformance suite
//! does) and reference copies for the engine's tests.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_dtype::{pack, unpack, Datatype};
use ferry_fabric::{Access, Address, Buffer, Endpoint, Listener, MemoryRegion};
use ferry_noncontig::{LocalLayout, RemoteLayout};

pub const T: Duration = Duration::from_secs(20);
pub const DRIVERS: [&str; 3] = ["tcp", "ofi+tcp", "ofi+shm"];

pub fn listen_url(driver: &str) -> Address {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let url = match driver {
        "ofi+shm" => format!("ofi+shm://ferry-nc-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    };
    url.parse().expect("test address parses")
}

/// A connected pair: the client initiates RMA, the server owns the target memory.
pub struct Pair {
    pub _listener: Box<dyn Listener>,
    pub server: Box<dyn Endpoint>,
    pub client: Box<dyn Endpoint>,
}

pub fn pair(driver: &str) -> Pair {
    let listener = ferry_fabric::listen(&listen_url(driver)).expect("listen");
    let addr = listener.local_addr();
    let (server, client) = std::thread::scope(|s| {
        let accept = s.spawn(|| listener.accept(T));
        let client = ferry_fabric::connect(&addr, T).expect("connect");
        (
            accept.join().expect("accept thread").expect("accept"),
            client,
        )
    });
    // As after the layer above authenticated the client.
    server.enable_remote_access();
    Pair {
        _listener: listener,
        server,
        client,
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

impl Pair {
    /// A client-side region holding `data`.
    pub fn local(&self, data: &[u8]) -> MemoryRegion {
        self.client
            .domain()
            .register(&Buffer::from_slice(data), Access::LOCAL)
            .expect("register local")
    }

    /// A server-side region holding `data`, open to remote reads and writes by the client.
    pub fn target(&self, data: &[u8]) -> MemoryRegion {
        let r = self
            .server
            .domain()
            .register(&Buffer::from_slice(data), Access::ALL)
            .expect("register target");
        self.server.grant(&r).expect("grant target");
        r
    }
}

/// The bytes `dst` must hold after `src_layout` over `src` is moved into `dst_layout`:
/// pack the source, unpack into a copy of the destination.
/// A side as (bytes, origin, datatype, count).
pub type View<'a> = (&'a [u8], usize, &'a Datatype, u64);

pub fn reference(
    (src, src_origin, src_t, src_n): View<'_>,
    (dst, dst_origin, dst_t, dst_n): View<'_>,
) -> Vec<u8> {
    let packed = pack(src_t, src_n, src, src_origin).expect("reference pack");
    let mut out = dst.to_vec();
    unpack(dst_t, dst_n, &packed, &mut out, dst_origin).expect("reference unpack");
    out
}

pub fn local_layout(region: &MemoryRegion, origin: usize, t: &Datatype, n: u64) -> LocalLayout {
    LocalLayout::new(region.clone(), origin, t.clone(), n)
}

pub fn remote_layout(region: &MemoryRegion, origin: u64, t: &Datatype, n: u64) -> RemoteLayout {
    RemoteLayout::new(region.remote(..).expect("remote"), origin, t.clone(), n)
}
