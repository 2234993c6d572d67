//! Helpers shared by the native tcp driver tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use ferry_fabric::{
    Access, Buffer, Completion, Endpoint, FabricError, Listener, LocalSlice, MemoryRegion,
};

/// Bound on every wait: a hang fails the test instead of blocking it.
pub const T: Duration = Duration::from_secs(20);

pub struct Pair {
    pub listener: Box<dyn Listener>,
    pub server: Box<dyn Endpoint>,
    pub client: Box<dyn Endpoint>,
}

pub fn listener() -> Box<dyn Listener> {
    ferry_fabric::listen(&"tcp://127.0.0.1:0".parse().unwrap()).expect("listen")
}

/// Accepts on `listener` while connecting a fresh client domain to it.
pub fn connect(listener: &dyn Listener) -> (Box<dyn Endpoint>, Box<dyn Endpoint>) {
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(T));
        let client = ferry_fabric::connect(&addr, T).expect("connect");
        (acc.join().unwrap().expect("accept"), client)
    })
}

/// A connected pair whose server side serves RMA (as after authentication).
pub fn pair() -> Pair {
    let listener = listener();
    let (server, client) = connect(&*listener);
    server.enable_remote_access();
    Pair {
        listener,
        server,
        client,
    }
}

/// Registers `len` zeroed bytes on `ep`'s domain and grants them to `ep`'s peer.
pub fn register(ep: &dyn Endpoint, len: usize, access: Access) -> MemoryRegion {
    register_data(ep, &vec![0; len], access)
}

/// Registers a copy of `data` on `ep`'s domain and grants it to `ep`'s peer.
pub fn register_data(ep: &dyn Endpoint, data: &[u8], access: Access) -> MemoryRegion {
    let r = ep
        .domain()
        .register(&Buffer::from_slice(data), access)
        .expect("register");
    ep.grant(&r).expect("grant");
    r
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

pub fn ok(ep: &dyn Endpoint) -> Completion {
    let c = ep.cq().wait(T).expect("completion within timeout");
    if let Err(e) = &c.result {
        panic!("{:?} (context {}) failed: {e}", c.op, c.context);
    }
    c
}

pub fn failed(ep: &dyn Endpoint) -> (Completion, FabricError) {
    let mut c = ep.cq().wait(T).expect("completion within timeout");
    match std::mem::replace(&mut c.result, Ok(())) {
        Err(e) => (c, e),
        Ok(()) => panic!(
            "{:?} (context {}) succeeded but should have failed",
            c.op, c.context
        ),
    }
}

/// `region[..len]` in `n` slices of about equal size.
pub fn split(region: &MemoryRegion, len: usize, n: usize) -> Vec<LocalSlice> {
    let step = len / n;
    (0..n)
        .map(|i| {
            let end = if i + 1 == n { len } else { (i + 1) * step };
            region.slice(i * step..end).unwrap()
        })
        .collect()
}

/// Grants the server region to the client and sends it its descriptor, as the layers above do.
pub fn advertise(p: &Pair, target: &MemoryRegion) -> ferry_fabric::RemoteSlice {
    p.server.grant(target).expect("grant");
    let msg = register_data(
        &*p.server,
        &target.remote(..).unwrap().encode(),
        Access::LOCAL,
    );
    let inbox = register(&*p.client, 64, Access::LOCAL);
    p.client.post_recv(&[inbox.full()], 0).unwrap();
    p.server.post_send(&[msg.full()], 0).unwrap();
    ok(&*p.server);
    ok(&*p.client);
    ferry_fabric::RemoteSlice::decode(&inbox.buffer().to_vec()).unwrap()
}
