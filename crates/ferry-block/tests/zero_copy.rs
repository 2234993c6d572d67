//! Reads sent without a copy through a user buffer (`sendfile` from a file export, pinned
//! pages of a memory export), checked by a real client (nbdsh, python3-libnbd) against
//! the bytes written, with simple and structured replies, over TCP and a Unix socket, with
//! `sendfile` forced on and off; and a file truncated under its export, which must read
//! as an error (or a closed connection), never as wrong bytes.

mod common;

use common::*;
use ferry_block::config::{BlockConfig, ExportConfig};
use ferry_block::server::ZeroCopyReads;
use ferry_block::BlockServer;

const MIB: u64 = 1 << 20;

/// A server of `exports` on loopback TCP and on the Unix socket `sock`, reads sent `mode`
/// (and short requests of an idle connection served by their reader but with `Off`).
fn serve(exports: Vec<ExportConfig>, sock: &std::path::Path, mode: ZeroCopyReads) -> Running {
    let cfg = BlockConfig {
        listen: vec!["127.0.0.1:0".into(), format!("unix:{}", sock.display())],
        exports,
        ..BlockConfig::default()
    };
    let mut server = BlockServer::new(&cfg).expect("server starts");
    server.set_zero_copy_reads(mode);
    server.set_inline_idle(mode != ZeroCopyReads::Off);
    start_server(server)
}

/// Writes through the client, then reads back long and short ranges (across a hole of
/// the file, across the memory export's pages) and compares them with the backing file
/// and with what was written.
#[test]
fn reads_match_what_was_written_with_and_without_sendfile() {
    for mode in [ZeroCopyReads::On, ZeroCopyReads::Off] {
        let dir = scratch("zcopy");
        let img = dir.join("disk.img");
        // Data, a hole at [5 MiB, 7 MiB), data to the end.
        sparse_file(&img, 8 * MIB, &[(0, 5 << 20), (7 * MIB, 1 << 20)]);
        let sock = dir.join("nbd.sock");
        let exports = vec![
            ExportConfig::file("disk", &img),
            ExportConfig::memory("ram", 8 * MIB),
        ];
        let s = serve(exports, &sock, mode);
        let script = format!(
            r#"
import os
img = "{img}"
uris = ["{tcp_disk}", "nbd+unix:///disk?socket={sock}",
        "{tcp_ram}", "nbd+unix:///ram?socket={sock}"]
data = os.urandom(3 * 1048576 + 4096)
for n, uri in enumerate(uris):
    for structured in (True, False):
        h = nbd.NBD()
        h.set_request_structured_replies(structured)
        h.connect_uri(uri)
        assert h.get_structured_replies_negotiated() == structured
        at = 512 + n * 4096
        h.pwrite(data, at)
        assert h.pread(len(data), at) == data, (uri, structured)
        assert h.pread(4096, at + 65536) == data[65536:65536 + 4096]
        assert h.pread(65536, at + 8192) == data[8192:8192 + 65536]
        if "disk" in uri:
            with open(img, "rb") as f:
                want = f.read()
            for off, ln in [(0, 1048576), (4 * 1048576, 2 * 1048576),
                            (5 * 1048576 - 4096, 65536), (6 * 1048576, 2 * 1048576),
                            (4 * 1048576 + 3, 1048576 + 5)]:
                assert h.pread(ln, off) == want[off:off + ln], (uri, structured, off, ln)
        else:
            # Never written: zeroes after the data.
            end = at + len(data)
            assert h.pread(1048576, end) == bytearray(1048576)
        h.shutdown()
print("ok")
"#,
            img = img.display(),
            tcp_disk = s.uri("disk"),
            tcp_ram = s.uri("ram"),
            sock = sock.display(),
        );
        let out = run(nbdsh().args(["-c", &script]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ok",
            "{mode:?}"
        );
    }
}

/// A file cut to 1 MiB under a 4 MiB export: reads beyond its new end and across it,
/// long (`sendfile`'s size) and short, simple and structured, fail with EIO, and the
/// connection goes on serving what is still there.
#[test]
fn a_file_truncated_under_the_export_reads_as_an_error() {
    for mode in [ZeroCopyReads::On, ZeroCopyReads::Off] {
        let dir = scratch("zcopy-trunc");
        let img = dir.join("disk.img");
        sparse_file(&img, 4 * MIB, &[(0, 4 << 20)]);
        let sock = dir.join("nbd.sock");
        let s = serve(vec![ExportConfig::file("disk", &img)], &sock, mode);
        let script = format!(
            r#"
import errno, os
img = "{img}"
with open(img, "rb") as f:
    want = f.read(1048576)
hs = []
for uri in ["{tcp}", "nbd+unix:///disk?socket={sock}"]:
    for structured in (True, False):
        h = nbd.NBD()
        h.set_request_structured_replies(structured)
        h.connect_uri(uri)
        hs.append(h)
os.truncate(img, 1048576)

def refused(f):
    try:
        got = f()
    except nbd.Error as e:
        assert e.errnum == errno.EIO, (e.string, e.errnum)
        return
    raise AssertionError("read {{}} bytes past the end".format(len(got)))

for h in hs:
    assert h.get_size() == 4 * 1048576
    refused(lambda: h.pread(1048576, 2 * 1048576))
    refused(lambda: h.pread(1048576, 512 * 1024))
    refused(lambda: h.pread(65536, 1048576 - 4096))
    refused(lambda: h.pread(4096, 1048576 - 2048))
    refused(lambda: h.pread(4096, 3 * 1048576))
    assert h.pread(1048576, 0) == want
    assert h.pread(65536, 1048576 - 65536) == want[-65536:]
    h.shutdown()
print("ok")
"#,
            img = img.display(),
            tcp = s.uri("disk"),
            sock = sock.display(),
        );
        let out = run(nbdsh().args(["-c", &script]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ok",
            "{mode:?}"
        );
    }
}
