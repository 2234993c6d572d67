//! A WAN emulator for tests and benchmarks: two network namespaces, A and B, joined by a
//! user-space delay line with a bottleneck.
//!
//! ```text
//!  namespace A                  this process (root namespace)              namespace B
//!  198.18.0.1  wan0 (TUN) ──► A→B: bottleneck ─► loss ─► delay ──► wan0 (TUN) 198.18.0.2
//!                         ◄── B→A: bottleneck ◄─ loss ◄─ delay ◄──
//! ```
//!
//! Each namespace has a TUN device whose descriptor this process opened from inside it
//! (setns on a helper thread). One thread per direction reads packets from one device,
//! passes them through a bottleneck (a link of the configured rate behind a drop-tail
//! queue of at least one bandwidth-delay product), optional random loss and reordering
//! (seeded), holds each until its release time and writes it to the other device.
//!
//! Why TUN with `IFF_VNET_HDR` and offloads: with TSO enabled on the device, the kernel
//! hands the line TCP GSO super-packets of up to 64 KiB (44 segments of a 1500-byte MTU)
//! in one read, and the far device accepts them whole in one write, so the line costs one
//! read and one write per 64 KiB instead of per 1.5 KiB while TCP still sees a 1500-byte
//! MTU (MSS 1448). Measured with iperf3, one stream, zero delay, on the 2-core
//! development machine: 5.3-7.9 Gbit/s with offloads against 1.1 Gbit/s with 1500-byte
//! packets (`--offload off`); docs/wan.md has the figures. A queue drop, a random loss or
//! a reordering still hits single segments: the line cuts a GSO packet at segment
//! boundaries (gso.rs) and sends on the runs that survive, so TCP sees the losses a real
//! path would give it.
//!
//! The two threads run at SCHED_FIFO priority (when allowed) so that a busy machine does
//! not postpone releases; see docs/wan.md for what that holds.
//! AF_PACKET on veth pairs was not built: it would need the same per-packet work plus
//! the veth's own, and TUN already passed the 5 Gbit/s mark.
//!
//! The rate counts every segment's headers (a GSO packet is billed as the 1500-byte
//! packets it stands for), so a cap means the same with and without offloads.
//!
//! Only addresses inside the namespaces it created are ever used (198.18.0.0/15, the
//! benchmarking range of RFC 2544). TCP buffer ceilings are raised inside the namespaces
//! (`net.ipv4.tcp_rmem` / `tcp_wmem` are per namespace) so one stream can fill the path;
//! the host's own are left alone: see [`HostLimits`].
#![deny(unsafe_code)]

mod error;
mod gso;
mod line;
mod netns;
mod sys;
pub mod units;

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use error::Error;
pub use line::LineStats;
use line::{Controls, LineConfig};
use netns::Netns;
use sys::TunMode;

/// Prefix of every namespace this crate creates: `fwan-PID-N-a` / `-b`.
pub const NETNS_PREFIX: &str = "fwan-";
/// Address of namespace A's end.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Address of namespace B's end.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// Host names of the two ends, in both namespaces' /etc/hosts (for commands run through
/// `ip netns exec`).
pub const HOST_A: &str = "ferry-wan-a";
pub const HOST_B: &str = "ferry-wan-b";
/// The device in each namespace.
const DEVICE: &str = "wan0";
/// Smallest bottleneck queue: four 64 KiB GSO packets, so a line with a tiny
/// bandwidth-delay product still passes whole GSO packets.
const MIN_QUEUE: u64 = 256 << 10;
/// Rate assumed for sizing buffers when there is no bottleneck.
const UNCAPPED_RATE_BPS: u64 = 10_000_000_000;

/// Whether packets cross the line as GSO super-packets or one MTU each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Offload {
    /// TCP GSO packets of up to 64 KiB (queue drops and losses still hit single
    /// 1500-byte segments: the line cuts the packet).
    #[default]
    On,
    /// 1500-byte packets: the sending stack segments before the device.
    Off,
}

/// What the emulated path looks like. Both directions get the same settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Round-trip time; each direction delays by half.
    pub rtt: Duration,
    /// Bottleneck rate in bits per second (IP packets); `None` for no bottleneck.
    pub rate_bps: Option<u64>,
    /// Drop-tail queue limit in bytes; `None`: one bandwidth-delay product (at least
    /// 256 KiB).
    pub queue_bytes: Option<u64>,
    /// Probability of dropping a packet, each direction.
    pub loss: f64,
    /// Probability of holding a packet `reorder_delay` longer than the others.
    pub reorder: f64,
    pub reorder_delay: Duration,
    /// Seed of the loss and reordering draws (A→B uses it, B→A uses it + 1).
    pub seed: u64,
    pub offload: Offload,
    /// Raise `tcp_rmem` / `tcp_wmem` in the namespaces so one stream can fill the path
    /// (default); false keeps the host's values, to see what a user would get.
    pub raise_buffers: bool,
    /// Run the two delay-line threads at SCHED_FIFO priority so a busy machine does not
    /// postpone releases (default; falls back to normal priority if refused).
    pub realtime: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rtt: Duration::ZERO,
            rate_bps: None,
            queue_bytes: None,
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(1),
            seed: 1,
            offload: Offload::On,
            raise_buffers: true,
            realtime: true,
        }
    }
}

impl Config {
    /// Bandwidth-delay product in bytes (rate × RTT), with the uncapped rate taken as
    /// 10 Gbit/s.
    pub fn bdp_bytes(&self) -> u64 {
        let rate = self.rate_bps.unwrap_or(UNCAPPED_RATE_BPS);
        (rate as f64 / 8.0 * self.rtt.as_secs_f64()) as u64
    }

    /// The bottleneck queue limit in effect.
    pub fn queue_limit(&self) -> u64 {
        self.queue_bytes
            .unwrap_or_else(|| self.bdp_bytes())
            .max(MIN_QUEUE)
    }

    /// `tcp_rmem` / `tcp_wmem` ceiling set in the namespaces: four bandwidth-delay
    /// products (the kernel counts buffer overhead too, and the sender needs room for
    /// retransmissions), between 64 MiB and 1 GiB.
    pub fn buffer_ceiling(&self) -> u64 {
        (4 * self.bdp_bytes()).clamp(64 << 20, 1 << 30)
    }

    fn tun_mode(&self) -> TunMode {
        match self.offload {
            Offload::On => TunMode::Offload,
            Offload::Off => TunMode::Plain,
        }
    }

    fn line(&self, seed: u64) -> LineConfig {
        LineConfig {
            delay: self.rtt / 2,
            rate_bps: self.rate_bps,
            queue_bytes: self.queue_limit(),
            loss: self.loss,
            reorder: self.reorder,
            reorder_delay: self.reorder_delay,
            seed,
            mode: self.tun_mode(),
            realtime: self.realtime,
        }
    }
}

/// One end of the path.
#[derive(Clone, Debug)]
pub struct Side {
    /// Namespace name, for `ip netns exec NAME ...`.
    pub netns: String,
    pub addr: Ipv4Addr,
}

/// A running emulator. Dropping it stops the line and deletes both namespaces.
pub struct Wan {
    a: Side,
    b: Side,
    config: Config,
    controls: Arc<Controls>,
    lines: Vec<JoinHandle<io::Result<()>>>,
    stats: [Arc<LineStats>; 2],
    // Dropped (deleted) after `Drop::drop` has stopped the lines.
    namespaces: [Netns; 2],
}

/// Checks that this process can run the emulator: root, /dev/net/tun and `ip`.
pub fn supported() -> Result<(), Error> {
    if !rustix::process::geteuid().is_root() {
        return Err(Error::Unsupported("needs root (network namespaces)".into()));
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err(Error::Unsupported("no /dev/net/tun".into()));
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Err(Error::Unsupported(
            "no `ip` (apt-get install iproute2)".into(),
        ));
    }
    Ok(())
}

impl Wan {
    /// Creates the namespaces, their devices and the delay line.
    pub fn up(config: Config) -> Result<Wan, Error> {
        supported()?;
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let base = format!("{NETNS_PREFIX}{}-{run}", std::process::id());
        let ns_a = Netns::create(&format!("{base}-a"))?;
        let ns_b = Netns::create(&format!("{base}-b"))?;
        for ns in [&ns_a, &ns_b] {
            ns.write_hosts(&[(ADDR_A, HOST_A), (ADDR_B, HOST_B)])?;
        }
        let mode = config.tun_mode();
        let tun_a = open_end(&ns_a, &config, mode, ADDR_A, ADDR_B)?;
        let tun_b = open_end(&ns_b, &config, mode, ADDR_B, ADDR_A)?;
        let controls = Arc::new(Controls::default());
        let stats = [Arc::default(), Arc::default()];
        let mut wan = Wan {
            a: Side {
                netns: ns_a.name.clone(),
                addr: ADDR_A,
            },
            b: Side {
                netns: ns_b.name.clone(),
                addr: ADDR_B,
            },
            config,
            controls,
            lines: Vec::new(),
            stats,
            namespaces: [ns_a, ns_b],
        };
        // Each device is read by one direction and written by the other.
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| Error::io("dup TUN descriptor".into(), e))
        };
        let (a_out, b_out) = (dup(&tun_a)?, dup(&tun_b)?);
        wan.start_line("a-to-b", 0, tun_a, b_out)?;
        wan.start_line("b-to-a", 1, tun_b, a_out)?;
        Ok(wan)
    }

    fn start_line(
        &mut self,
        name: &str,
        index: usize,
        input: OwnedFd,
        output: OwnedFd,
    ) -> Result<(), Error> {
        let cfg = self
            .config
            .line(self.config.seed.wrapping_add(index as u64));
        let (stats, controls) = (self.stats[index].clone(), self.controls.clone());
        let handle = std::thread::Builder::new()
            .name(format!("wan-{name}"))
            .spawn(move || line::run(cfg, input, output, stats, controls))
            .map_err(|e| Error::io("spawn delay-line thread".into(), e))?;
        self.lines.push(handle);
        Ok(())
    }

    /// Namespace A (198.18.0.1).
    pub fn a(&self) -> &Side {
        &self.a
    }

    /// Namespace B (198.18.0.2).
    pub fn b(&self) -> &Side {
        &self.b
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Cuts the link (`true`: both directions drop everything, including what is in
    /// flight when it would arrive) or restores it.
    pub fn set_cut(&self, cut: bool) {
        self.controls.cut.store(cut, Ordering::Relaxed);
    }

    /// Counters of the A→B direction.
    pub fn stats_a_to_b(&self) -> &LineStats {
        &self.stats[0]
    }

    /// Counters of the B→A direction.
    pub fn stats_b_to_a(&self) -> &LineStats {
        &self.stats[1]
    }

    /// `cmd` made to run in namespace A (through `ip netns exec`), with its arguments,
    /// environment and directory, plus `FERRY_WAN_A` / `FERRY_WAN_B` holding the two
    /// addresses. Set stdio on the returned command.
    pub fn exec_in_a(&self, cmd: Command) -> Command {
        self.exec_in(&self.a, cmd)
    }

    /// `cmd` made to run in namespace B; see [`Wan::exec_in_a`].
    pub fn exec_in_b(&self, cmd: Command) -> Command {
        self.exec_in(&self.b, cmd)
    }

    fn exec_in(&self, side: &Side, cmd: Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped
            .args(["netns", "exec", &side.netns])
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .env("FERRY_WAN_A", self.a.addr.to_string())
            .env("FERRY_WAN_B", self.b.addr.to_string());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(v) => wrapped.env(key, v),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// Runs `f` on a thread inside namespace A: sockets it creates belong to A and keep
    /// working from any thread afterwards. For Rust tests that talk across the path.
    pub fn in_a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        self.namespaces[0].enter(f)
    }

    /// Runs `f` on a thread inside namespace B; see [`Wan::in_a`].
    pub fn in_b<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        self.namespaces[1].enter(f)
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        self.controls.stop.store(true, Ordering::Relaxed);
        for line in self.lines.drain(..) {
            let _ = line.join();
        }
    }
}

/// Sets up one end: sysctls and the TUN device (from inside the namespace), then the
/// device's address, peer route and link state.
fn open_end(
    ns: &Netns,
    config: &Config,
    mode: TunMode,
    local: Ipv4Addr,
    peer: Ipv4Addr,
) -> Result<OwnedFd, Error> {
    let ceiling = config.buffer_ceiling();
    let raise = config.raise_buffers;
    let fd = ns.enter(|| -> Result<OwnedFd, Error> {
        // IPv4 only: no link-local addresses, router solicitations or MLD reports
        // crossing the line and landing in its counters.
        Netns::write_sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        Netns::write_sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        if raise {
            Netns::write_sysctl("net.ipv4.tcp_rmem", &format!("4096 131072 {ceiling}"))?;
            Netns::write_sysctl("net.ipv4.tcp_wmem", &format!("4096 16384 {ceiling}"))?;
        }
        let fd = sys::create_tun(DEVICE, mode)
            .map_err(|e| Error::io(format!("create TUN {DEVICE} in {}", ns.name), e))?;
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(|e| Error::io("set TUN non-blocking".into(), e.into()))?;
        Ok(fd)
    })??;
    let (local, peer) = (local.to_string(), peer.to_string());
    ns.ip(&["addr", "add", &local, "peer", &peer, "dev", DEVICE])?;
    // A long device queue: packets wait in the line's bottleneck queue, not here.
    ns.ip(&[
        "link",
        "set",
        DEVICE,
        "mtu",
        "1500",
        "txqueuelen",
        "10000",
        "up",
    ])?;
    Ok(fd)
}

/// The host's own socket-buffer ceilings (root namespace), which bound what one TCP
/// stream gets at distance outside the emulator.
#[derive(Clone, Debug)]
pub struct HostLimits {
    /// Third field of net.ipv4.tcp_rmem: the receive autotuning ceiling.
    pub tcp_rmem_max: u64,
    /// Third field of net.ipv4.tcp_wmem: the send autotuning ceiling.
    pub tcp_wmem_max: u64,
    /// net.core.rmem_max / wmem_max: the ceiling of an explicit SO_RCVBUF / SO_SNDBUF
    /// (which also turns autotuning off). Global: a namespace cannot raise them.
    pub core_rmem_max: u64,
    pub core_wmem_max: u64,
}

impl HostLimits {
    /// Reads them from /proc/sys (this thread's namespace: call from the root one).
    pub fn read() -> io::Result<HostLimits> {
        let third = |key: &str| -> io::Result<u64> {
            let text = std::fs::read_to_string(format!("/proc/sys/net/{key}"))?;
            text.split_whitespace()
                .last()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, key.to_string()))
        };
        Ok(HostLimits {
            tcp_rmem_max: third("ipv4/tcp_rmem")?,
            tcp_wmem_max: third("ipv4/tcp_wmem")?,
            core_rmem_max: third("core/rmem_max")?,
            core_wmem_max: third("core/wmem_max")?,
        })
    }

    /// Rough ceiling of one autotuned stream at `rtt`, in bits per second: about half of
    /// the smaller buffer ceiling holds data in flight (the rest is the kernel's
    /// per-packet overhead and, on the sender, data not yet acknowledged twice over).
    pub fn single_stream_bps(&self, rtt: Duration) -> Option<f64> {
        if rtt.is_zero() {
            return None;
        }
        let window = self.tcp_rmem_max.min(self.tcp_wmem_max) as f64 / 2.0;
        Some(window * 8.0 / rtt.as_secs_f64())
    }
}

/// ferry-wan namespaces whose creating process is gone (all of them with `include_live`).
/// Names are `fwan-PID-N-a|b`.
pub fn stale_namespaces(include_live: bool) -> Vec<String> {
    netns::list(NETNS_PREFIX)
        .into_iter()
        .filter(|name| {
            let pid = name[NETNS_PREFIX.len()..].split('-').next().unwrap_or("");
            let alive = !pid.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists();
            include_live || !alive
        })
        .collect()
}

/// Kills the processes left inside a namespace and deletes it.
pub fn remove_namespace(name: &str) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(["netns", "pids", name])
        .output()
        .map_err(|e| Error::io("run `ip netns pids`".into(), e))?;
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Some(pid) = pid.parse().ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    let deleted = netns::ip(&["netns", "del", name]);
    netns::remove_etc(name);
    deleted
}
