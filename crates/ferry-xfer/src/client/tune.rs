//! Tuning a copy to its path, with no flags: what one connection keeps in flight (its
//! staging ring, its window of GETs) follows the bandwidth-delay product, and how many
//! streams a copy uses follows what more streams deliver.
//!
//! - The round trip is measured at connect: the HELLO/WELCOME exchange is one round trip
//!   (plus the server's token check and admission, far below a millisecond). Every stream
//!   adds a sample; the smallest counts (queues only ever add to it).
//! - The rate is not known before data moves, so what a connection keeps in flight is sized
//!   for [`ASSUMED_RATE`] over that round trip (twice the bandwidth-delay product: the pull
//!   protocol holds a block for about two round trips, advert to acknowledgement), within
//!   [`MIN_BUFFER`]..=[`MAX_BUFFER`]. The server's own ring and admission limits stay
//!   authoritative: a client ring larger than the server's only holds buffers it does not
//!   fill.
//! - The delivery rate is measured as the copy goes ([`Growth`]): on a long path a copy
//!   without `-p` starts with the streams [`upfront_streams`] says (an upload
//!   [`UPFRONT_UPLOAD`], a download [`UPFRONT_DOWNLOAD`], `FERRY_UPFRONT_STREAMS` for
//!   either: the extra ones connect on their own threads while the first plans, and jobs
//!   are shared between them from the start), then adds one more while the rate grows by
//!   at least [`GROWTH`], up to [`MAX_AUTO_STREAMS`]. A short path adds no streams as it
//!   goes: a tree download opens one per core at once ([`short_tree_streams`]), anything
//!   else keeps one.

use std::time::Duration;

/// The rate a connection's in-flight data is sized to carry when nothing better is known,
/// in bytes per second (10 Gbit/s).
pub const ASSUMED_RATE: u64 = 10_000_000_000 / 8;
/// Least staging a path-sized connection holds: the loopback-tuned default (8 × 4 MiB).
pub const MIN_BUFFER: u64 = crate::DEFAULT_RING as u64 * crate::DEFAULT_BLOCK as u64;
/// Most staging a path-sized connection holds (receive buffers are registered memory).
pub const MAX_BUFFER: u64 = 128 << 20;
/// Most GETs a path-sized download keeps outstanding (64 KiB files: 64 MiB asked for). A
/// GET's answer arrives about two round trips after it leaves (the GETS frame, the PACK's
/// advert, its pull, its bytes), so the window must hold twice the bandwidth-delay
/// product and then some: 256 (16 MiB) left a 1 Gbit/s path at 50 ms idle between PACKs.
/// Each GET holds an open part file: [`open_file_room`] keeps the window inside the
/// process's limit on open files.
pub const MAX_GET_WINDOW: usize = 1024;
/// Open files kept free for everything else (sockets, the journal, libraries, the
/// streams' other connections) when the window is sized to the open-file limit.
pub const OTHER_FILES: u64 = 128;
/// Round trips up to this are a local path: one stream, the loopback-tuned defaults.
pub const LOCAL_RTT: Duration = Duration::from_millis(2);
/// Most streams a copy without `-p` grows to.
pub const MAX_AUTO_STREAMS: u16 = 8;
/// The rate must grow by this share after a stream was added for another to be tried.
pub const GROWTH: f64 = 0.10;
/// Streams an upload without `-p` opens at once on a long path, before any rate is
/// measured (the search then measures two, tries three, …). Each stream's slow start takes
/// about ten round trips at 50 ms, and a stream the search adds after its first period
/// (1.5 s in) came too late for a short copy: opened at once, a 1,000 × 64 KiB tree went up
/// 18 % faster at 50 ms and 1 Gbit/s, 1 GiB of zeros 13 % faster at 2 Gbit/s (docs/wan.md,
/// session 19). A single file under [`UPFRONT_MIN_FILE`] opens one.
pub const UPFRONT_UPLOAD: u16 = 2;
/// The smallest single file an upload opens [`UPFRONT_UPLOAD`] streams at once for: a
/// short copy does not repay a second slow start fighting the first for the bottleneck's
/// queue (128 MiB at 50 ms and 1 Gbit/s went up 10 % slower over two streams from the
/// start; 256 MiB took as long either way, 1 GiB 7 % less time).
pub const UPFRONT_MIN_FILE: u64 = 256 << 20;
/// Most streams a tree download without `-p` opens over a short path
/// ([`short_tree_streams`]).
pub const MAX_SHORT_TREE_STREAMS: u16 = 4;
/// Streams a download without `-p` opens at once on a long path: one. Two at once were
/// slower on the emulator (their slow starts overran the bottleneck's queue together, and
/// the second, starting two round trips later, lost most: a 1,000-file tree 8 %, 256 MiB
/// 9 % at 1 Gbit/s), so a download's second stream comes from the search, as before.
pub const UPFRONT_DOWNLOAD: u16 = 1;

/// How a connection's staging (the seed's "file buffer") is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// [`super::Options::ring`] blocks, and a window of [`super::GET_WINDOW`] GETs.
    Fixed,
    /// This many bytes (`ferry cp --buffer`), as blocks of the negotiated size.
    Bytes(u64),
    /// From the path's round trip (`ferry cp` without `--buffer`).
    Path,
}

/// What a copy decided from its path (shown by `ferry cp -v` and `--json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The smallest round trip seen (handshakes, requests, the transport's own), in
    /// microseconds.
    pub rtt_us: u64,
    /// The smallest round trip TCP itself measured on the copy's connections (`TCP_INFO`,
    /// at connect and as the copy goes), in microseconds; 0 where the driver measures none.
    pub tcp_rtt_us: u64,
    /// Staging blocks per connection (receive buffers posted, blocks sent ahead).
    pub ring: usize,
    /// The negotiated block size.
    pub block: u32,
    /// GETs a download keeps outstanding.
    pub get_window: usize,
    /// Streams used at most.
    pub streams: u16,
    /// Whether the copy chose its stream count (no `-p`).
    pub streams_auto: bool,
}

impl Tuning {
    /// Staging bytes per connection.
    pub fn buffer(&self) -> u64 {
        self.ring as u64 * u64::from(self.block)
    }

    /// Folds in another connection's decision: the smallest round trip, the most streams.
    pub(crate) fn merge(&mut self, o: &Tuning) {
        if self.ring == 0 {
            *self = *o;
            return;
        }
        if o.rtt_us > 0 {
            self.rtt_us = self.rtt_us.min(o.rtt_us);
        }
        if o.tcp_rtt_us > 0 && (self.tcp_rtt_us == 0 || o.tcp_rtt_us < self.tcp_rtt_us) {
            self.tcp_rtt_us = o.tcp_rtt_us;
        }
        self.streams = self.streams.max(o.streams);
    }
}

/// `d` in whole microseconds (saturating).
pub fn micros(d: Duration) -> u64 {
    d.as_micros().try_into().unwrap_or(u64::MAX)
}

/// Bytes `rate` (bytes per second) carries in `rtt`.
pub fn bdp(rtt: Duration, rate: u64) -> u64 {
    (rtt.as_secs_f64() * rate as f64) as u64
}

/// Staging bytes for a connection over a path of round trip `rtt`.
pub fn path_buffer(rtt: Duration) -> u64 {
    (2 * bdp(rtt, ASSUMED_RATE)).clamp(MIN_BUFFER, MAX_BUFFER)
}

/// Staging blocks of `block` bytes for `buffer`: `fixed` blocks (at least one) when the
/// buffer is [`Buffer::Fixed`] or the path is short (as before paths were measured),
/// else the bytes asked for or the path's, at least 2 blocks (one being filled while one
/// travels) and, from the path, never fewer than `fixed`.
pub fn ring_for(buffer: Buffer, fixed: usize, rtt: Duration, block: u32) -> usize {
    let blocks = |bytes: u64| {
        let n = bytes.div_ceil(u64::from(block.max(1)));
        usize::try_from(n).unwrap_or(usize::MAX).clamp(2, 1024)
    };
    match buffer {
        Buffer::Bytes(b) => blocks(b),
        Buffer::Path if long_path(rtt) => blocks(path_buffer(rtt)).max(fixed),
        Buffer::Fixed | Buffer::Path => fixed.max(1),
    }
}

/// GETs a download keeps outstanding over a path of round trip `rtt` so that files of
/// `mean_size` bytes keep twice the path's bandwidth-delay product (at [`ASSUMED_RATE`])
/// requested: at least [`super::GET_WINDOW`], at most [`MAX_GET_WINDOW`].
pub fn get_window(buffer: Buffer, rtt: Duration, mean_size: u64) -> usize {
    get_window_within(buffer, rtt, mean_size, open_file_room())
}

/// [`get_window`] with at most `room` GETs outstanding (never fewer than
/// [`super::GET_WINDOW`]).
pub fn get_window_within(buffer: Buffer, rtt: Duration, mean_size: u64, room: usize) -> usize {
    if buffer == Buffer::Fixed || !long_path(rtt) {
        return super::GET_WINDOW;
    }
    let want = (2 * bdp(rtt, ASSUMED_RATE)).div_ceil(mean_size.max(4096));
    usize::try_from(want)
        .unwrap_or(usize::MAX)
        .min(room)
        .clamp(super::GET_WINDOW, MAX_GET_WINDOW)
}

/// The GETs one stream may keep outstanding within the process's open-file limit
/// (`RLIMIT_NOFILE`'s soft limit): what [`OTHER_FILES`] leaves, shared by the most streams a
/// copy grows to ([`MAX_AUTO_STREAMS`]).
pub fn open_file_room() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    room_within(soft)
}

/// Raises this process's soft limit on open files to its hard limit (as the Go runtime
/// does for every program), so a copy's window of GETs is not held to the soft limit's
/// common default of 1,024. Best effort: the limit stays where it was if it cannot move.
pub fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let raised = rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!("open-file limit stays at {:?}: {e}", lim.current);
        }
    }
}

/// [`open_file_room`] under a soft limit of `soft` open files.
fn room_within(soft: u64) -> usize {
    let each = soft.saturating_sub(OTHER_FILES) / u64::from(MAX_AUTO_STREAMS);
    usize::try_from(each).unwrap_or(usize::MAX)
}

/// Free places of a window of `window` GETs before a refill asks for more: half of it on
/// a short path, as before (fewer, fuller GETS frames); a quarter on a long one, where the
/// window must stay nearly full to cover the path. (Refilled in halves, a window of 256
/// moved 128 files per four round trips at 50 ms.)
pub fn refill_for(window: usize, rtt: Duration) -> usize {
    if long_path(rtt) {
        (window / 4).max(1)
    } else {
        window - window / 2
    }
}

/// The most bytes of a GETS frame over a path of round trip `rtt` when the link sends
/// messages of up to `immediate` bytes inside their advertisement: on a long path no
/// more, so the frame arrives in half a round trip instead of being pulled in one and a
/// half; on a short one as large as a control frame may be.
pub fn gets_frame(rtt: Duration, immediate: usize) -> usize {
    if long_path(rtt) {
        immediate
    } else {
        crate::proto::MAX_CONTROL
    }
}

/// The mean size of `count` files of `bytes` together (for sizing a window of requests).
pub fn mean_size(bytes: u64, count: usize) -> u64 {
    bytes / (count.max(1) as u64)
}

/// Whether `addr` (a fabric address) names this host: a loopback address, `localhost`,
/// or shared memory. Such a path is local whatever its handshake took: on a busy host a
/// round trip through two processes waiting for a core can take milliseconds.
pub fn is_local(addr: &str) -> bool {
    let Ok(a) = addr.parse::<ferry_fabric::Address>() else {
        return false;
    };
    if matches!(&a.scheme, ferry_fabric::Scheme::Ofi(p) if p.starts_with("shm")) {
        return true;
    }
    a.host == "localhost"
        || a.host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a stream of a copy to `addr` may connect while the copy's other streams move
/// data: where the driver allows it ([`ferry_fabric::Scheme::connects_beside_busy_ones`]);
/// elsewhere the streams connect before data moves.
pub fn joins_while_busy(addr: &str) -> bool {
    addr.parse::<ferry_fabric::Address>()
        .map_or(true, |a| a.scheme.connects_beside_busy_ones())
}

/// Whether a path of round trip `rtt` is long enough for a copy without `-p` to try more
/// streams (on loopback and a LAN, more streams share the same cores and rarely help).
pub fn long_path(rtt: Duration) -> bool {
    rtt > LOCAL_RTT
}

/// What a copy without `-p` asks to open at once ([`upfront_streams`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upfront {
    /// On a long path ([`UPFRONT_UPLOAD`] or [`UPFRONT_DOWNLOAD`], or what
    /// `FERRY_UPFRONT_STREAMS` says).
    pub long: u16,
    /// On a short path (a tree download: [`short_tree_streams`]; else one).
    pub short: u16,
}

/// Streams a copy without `-p` opens before data moves over a path of round trip `rtt`,
/// when it may grow to `max`: `want`'s number for a long or a short path, within
/// 1..=`max`.
pub fn upfront_streams(rtt: Duration, max: u16, want: Upfront) -> u16 {
    let n = if long_path(rtt) {
        want.long
    } else {
        want.short
    };
    n.clamp(1, max.max(1))
}

/// Streams a tree download without `-p` opens over a short path, on a host of `cores`
/// cores: one per core, at most [`MAX_SHORT_TREE_STREAMS`]. A small file's cost is the
/// work on each end (opening, hashing, writing, renaming), not the path, and each stream
/// does its files' on its own threads: 10,000 × 64 KiB on loopback, 2 cores, took
/// 0.93–1.02 s over one stream, 0.63–0.77 s over two, 0.77–0.81 s over four (the two
/// processes share the cores). Uploads are not spread so: the server's side of a file
/// (its part, rename and group commit) did not gain (1.03–1.11 s over one stream,
/// 1.12–1.17 over two).
pub fn short_tree_streams(cores: usize) -> u16 {
    u16::try_from(cores)
        .unwrap_or(u16::MAX)
        .clamp(1, MAX_SHORT_TREE_STREAMS)
}

/// [`short_tree_streams`] of this host's cores.
pub fn short_tree_streams_here() -> u16 {
    short_tree_streams(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Streams an upload without `-p` opens at once (before the path is known): of a single
/// file of `size` bytes, [`UPFRONT_UPLOAD`] if it is at least [`UPFRONT_MIN_FILE`], else
/// one; of a tree (`None`), [`UPFRONT_UPLOAD`].
pub fn upload_upfront(size: Option<u64>) -> u16 {
    match size {
        Some(n) if n < UPFRONT_MIN_FILE => 1,
        _ => UPFRONT_UPLOAD,
    }
}

/// The most jobs one of `streams` working streams may take from a queue of `jobs` (those
/// taken so far and those left) while `waiting` more are still connecting: an even share
/// of them all, so that a window of up to [`MAX_GET_WINDOW`] GETs on the first stream does
/// not ask for a whole tree before the others are ready. No limit once none is waiting.
pub fn fair_share(jobs: usize, streams: usize, waiting: usize) -> usize {
    if waiting == 0 {
        return usize::MAX;
    }
    jobs.div_ceil(streams + waiting)
}

/// `FERRY_UPFRONT_STREAMS`, if set to a number: the streams a copy without `-p` opens at
/// once on a long path, uploads and downloads alike (1: the search alone, as before).
pub fn upfront_knob() -> Option<u16> {
    std::env::var("FERRY_UPFRONT_STREAMS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// The stream-count search of a copy without `-p`: it measures the delivery rate over
/// periods of [`Growth::period`] and says when to add a stream.
#[derive(Debug)]
pub struct Growth {
    period: Duration,
    max: u16,
    /// The rate of the last period before the latest stream was added (bytes/s).
    before: Option<f64>,
    done: bool,
}

impl Growth {
    /// A search up to `max` streams over a path of round trip `rtt`.
    pub fn new(rtt: Duration, max: u16) -> Growth {
        Growth {
            period: Self::period_for(rtt),
            max,
            before: None,
            done: max <= 1,
        }
    }

    /// How long a stream count is measured before the next decision: twenty round trips
    /// (a stream's slow start to 1 Gbit/s at 50 ms takes about ten, and BBR drains the
    /// queue it built after), 0.5 to 4 s.
    pub fn period_for(rtt: Duration) -> Duration {
        (rtt * 20).clamp(Duration::from_millis(500), Duration::from_secs(4))
    }

    /// The measuring period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Takes the rate (bytes/s) `streams` streams delivered over the last period: whether
    /// to add one. A stream is added after the first period, then again each time the
    /// last one raised the rate by [`GROWTH`] or more; once one did not, the search ends.
    pub fn add_after(&mut self, streams: u16, rate: f64) -> bool {
        if self.done || streams >= self.max {
            self.done = true;
            return false;
        }
        let grew = match self.before {
            None => true,
            Some(b) => rate >= b * (1.0 + GROWTH),
        };
        if grew {
            self.before = Some(rate);
        } else {
            self.done = true;
        }
        grew
    }

    /// Ends the search (a stream could not connect).
    pub fn stop(&mut self) {
        self.done = true;
    }

    /// Whether the search is over.
    pub fn done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn staging_follows_the_round_trip_within_bounds() {
        let block = crate::DEFAULT_BLOCK;
        let ms = Duration::from_millis;
        // Loopback and LAN: the loopback-tuned ring.
        assert_eq!(ring_for(Buffer::Path, 8, ms(0), block), crate::DEFAULT_RING);
        assert_eq!(ring_for(Buffer::Path, 8, ms(1), block), crate::DEFAULT_RING);
        // A short path keeps the ring in blocks, whatever their size (the old behaviour).
        assert_eq!(ring_for(Buffer::Path, 8, ms(1), 256 << 10), 8);
        assert_eq!(ring_for(Buffer::Path, 3, ms(0), block), 3);
        // A long one: bytes, in blocks of the negotiated size.
        assert_eq!(ring_for(Buffer::Path, 8, ms(10), 256 << 10), 128);
        // 10 ms at 10 Gbit/s: 2 × 12.5 MB = 25 MB, under the floor of 32 MiB.
        assert_eq!(ring_for(Buffer::Path, 8, ms(10), block), 8);
        // 20 ms: 50 MB → 12 blocks of 4 MiB.
        assert_eq!(ring_for(Buffer::Path, 8, ms(20), block), 12);
        // 50 ms: 125 MB → 30 blocks; 60 ms and beyond: the ceiling.
        assert_eq!(ring_for(Buffer::Path, 8, ms(50), block), 30);
        assert_eq!(
            ring_for(Buffer::Path, 8, ms(60), block) as u64,
            MAX_BUFFER / u64::from(block)
        );
        assert_eq!(
            ring_for(Buffer::Path, 8, ms(100), block),
            ring_for(Buffer::Path, 8, ms(60), block)
        );
        // --buffer: exactly that, in whole blocks, at least two.
        assert_eq!(ring_for(Buffer::Bytes(64 * MIB), 8, ms(50), block), 16);
        assert_eq!(ring_for(Buffer::Bytes(MIB), 8, ms(50), block), 2);
        assert_eq!(ring_for(Buffer::Bytes(9 * MIB), 8, ms(50), 1 << 20), 9);
        // Fixed: the ring given, whatever the path.
        assert_eq!(ring_for(Buffer::Fixed, 5, ms(100), block), 5);
    }

    #[test]
    fn the_get_window_covers_the_path_for_small_files() {
        let ms = Duration::from_millis;
        assert_eq!(
            get_window(Buffer::Fixed, ms(50), 65536),
            super::super::GET_WINDOW
        );
        assert_eq!(
            get_window(Buffer::Path, ms(0), 65536),
            super::super::GET_WINDOW
        );
        // 50 ms at 10 Gbit/s: 125 MB in flight, 1,908 files of 64 KiB: the ceiling, if
        // the open-file limit leaves room for it.
        let w = |rtt, size, room| get_window_within(Buffer::Path, rtt, size, room);
        assert_eq!(w(ms(50), 65536, usize::MAX), MAX_GET_WINDOW);
        // 1,024 open files (a common soft limit, which `ferry` raises to the hard one
        // where it can) for 8 streams: 112 each.
        assert_eq!(room_within(1024), 112);
        assert_eq!(w(ms(50), 65536, room_within(1024)), 112);
        assert_eq!(w(ms(50), 65536, room_within(256)), super::super::GET_WINDOW);
        // 20,000: 2,484 each, over the ceiling.
        assert_eq!(w(ms(50), 65536, room_within(20_000)), MAX_GET_WINDOW);
        assert_eq!(w(ms(50), 65536, room_within(4096)), 496);
        assert!(get_window(Buffer::Path, ms(50), 65536) <= open_file_room().max(32));
        // 2.5 ms: 6.25 MB → 96 files.
        assert_eq!(get_window(Buffer::Path, ms(2) + ms(1) / 2, 65536), 96);
        assert_eq!(
            get_window(Buffer::Path, ms(2), 65536),
            super::super::GET_WINDOW
        );
        // Large files: the floor.
        assert_eq!(
            get_window(Buffer::Path, ms(50), 1 << 30),
            super::super::GET_WINDOW
        );
    }

    #[test]
    fn a_long_path_refills_early_in_frames_that_travel_with_their_advert() {
        let ms = Duration::from_millis;
        assert_eq!(
            refill_for(32, ms(0)),
            16,
            "a short path: in halves, as before"
        );
        assert_eq!(refill_for(33, ms(1)), 17);
        assert_eq!(refill_for(256, ms(50)), 64);
        assert_eq!(refill_for(2, ms(50)), 1);
        assert_eq!(gets_frame(ms(0), 4096), crate::proto::MAX_CONTROL);
        assert_eq!(gets_frame(ms(50), 4096), 4096);
    }

    #[test]
    fn this_host_is_a_local_path() {
        for local in [
            "tcp://127.0.0.1:7370",
            "tcp://localhost:1",
            "tcp://[::1]:7370",
            "ofi+tcp://127.0.0.2:9",
            "ofi+shm://ferry",
        ] {
            assert!(is_local(local), "{local}");
        }
        for remote in ["tcp://198.18.0.1:7370", "ofi+tcp://dtn1:7370", "nonsense"] {
            assert!(!is_local(remote), "{remote}");
        }
    }

    #[test]
    fn a_long_path_opens_streams_up_front_a_short_one_per_core_for_a_tree() {
        let ms = Duration::from_millis;
        let long = |n| Upfront { long: n, short: 1 };
        // Loopback, a LAN, and the threshold itself: the short path's number.
        assert_eq!(upfront_streams(ms(0), 8, long(UPFRONT_UPLOAD)), 1);
        assert_eq!(upfront_streams(LOCAL_RTT, 8, long(UPFRONT_UPLOAD)), 1);
        assert_eq!(upfront_streams(ms(1), 8, long(4)), 1);
        let tree = Upfront {
            long: UPFRONT_DOWNLOAD,
            short: short_tree_streams(2),
        };
        assert_eq!(upfront_streams(ms(0), 8, tree), 2);
        assert_eq!(upfront_streams(ms(0), 1, tree), 1, "never past the maximum");
        // One per core, at most four.
        assert_eq!(short_tree_streams(0), 1);
        assert_eq!(short_tree_streams(1), 1);
        assert_eq!(short_tree_streams(3), 3);
        assert_eq!(short_tree_streams(64), MAX_SHORT_TREE_STREAMS);
        // Beyond it: an upload opens two at once, a download one (a tree's too).
        assert_eq!(upfront_streams(ms(3), 8, long(UPFRONT_UPLOAD)), 2);
        assert_eq!(upfront_streams(ms(50), 8, long(UPFRONT_UPLOAD)), 2);
        assert_eq!(upfront_streams(ms(50), 8, tree), 1);
        // What FERRY_UPFRONT_STREAMS asks for, within 1..=max.
        assert_eq!(upfront_streams(ms(50), 8, long(0)), 1);
        assert_eq!(upfront_streams(ms(50), 8, long(3)), 3);
        assert_eq!(upfront_streams(ms(50), 8, long(99)), 8);
        // An upload of one small file opens one; a large file or a tree two.
        assert_eq!(upload_upfront(Some(128 << 20)), 1);
        assert_eq!(upload_upfront(Some(0)), 1);
        assert_eq!(upload_upfront(Some(UPFRONT_MIN_FILE)), UPFRONT_UPLOAD);
        assert_eq!(upload_upfront(Some(1 << 30)), 2);
        assert_eq!(upload_upfront(None), 2);
        // Never past the search's maximum.
        assert_eq!(upfront_streams(ms(50), 1, long(UPFRONT_UPLOAD)), 1);
        assert_eq!(upfront_streams(ms(50), 0, long(UPFRONT_UPLOAD)), 1);
    }

    #[test]
    fn a_stream_takes_its_share_while_others_connect() {
        // 1,000 files, one stream working and one connecting: 500 each.
        assert_eq!(fair_share(1000, 1, 1), 500);
        assert_eq!(fair_share(1001, 1, 1), 501);
        assert_eq!(fair_share(1000, 1, 2), 334);
        assert_eq!(fair_share(3, 2, 1), 1);
        // A single job is taken at once.
        assert_eq!(fair_share(1, 1, 1), 1);
        // Nobody waiting: no limit.
        assert_eq!(fair_share(1000, 2, 0), usize::MAX);
        assert_eq!(fair_share(0, 1, 0), usize::MAX);
    }

    #[test]
    fn streams_are_added_while_the_rate_grows() {
        let mut g = Growth::new(Duration::from_millis(50), 8);
        assert_eq!(g.period(), Duration::from_secs(1));
        assert!(
            g.add_after(1, 100.0),
            "the first period always tries a second stream"
        );
        assert!(g.add_after(2, 150.0), "+50 %: try a third");
        assert!(!g.add_after(3, 160.0), "+7 %: stop");
        assert!(g.done());
        assert!(!g.add_after(3, 1000.0), "a search that ended stays ended");
        let mut capped = Growth::new(Duration::from_millis(50), 2);
        assert!(capped.add_after(1, 1.0));
        assert!(!capped.add_after(2, 100.0), "never past the maximum");
        assert!(Growth::new(Duration::ZERO, 1).done());
        assert_eq!(
            Growth::period_for(Duration::ZERO),
            Duration::from_millis(500)
        );
    }
}
