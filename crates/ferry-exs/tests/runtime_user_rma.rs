//! One-sided RMA a face manages itself (`ExsSocket::grant`, `ExsSocket::rma`): on every
//! driver, the side that granted a buffer is written and read by its peer, completions
//! arrive as `Rma` events on the queue named, and a range the peer was not granted (a
//! forged key) fails that RMA only; several buffers are gathered or scattered by one RMA.

mod runtime_util;

use ferry_exs::proto::EventKind;
use ferry_exs::runtime::{EventQueue, ExsBuf};
use ferry_fabric::{Access, RemoteSlice};
use runtime_util::*;

const LEN: usize = 256 << 10;

fn rma_done(q: &EventQueue) -> ferry_exs::runtime::ExsEvent {
    let ev = next(q, "Rma");
    assert_eq!(ev.kind, EventKind::Rma, "{ev:?}");
    ev
}

/// A pair on `driver` whose side `b` granted `LEN` bytes to `a`: the pair, the buffer, its
/// remote range and a queue for `a`'s RMA events.
fn granted(driver: &str) -> (Pair, ExsBuf, RemoteSlice, EventQueue) {
    let p = pair(driver);
    let exposed = p.b.alloc_with(LEN, Access::ALL).unwrap();
    p.b.grant(&exposed).unwrap();
    let remote = exposed.region().remote(..).unwrap();
    (p, exposed, remote, EventQueue::new().unwrap())
}

#[test]
fn granted_memory_is_written_and_read_and_a_forged_key_is_refused() {
    for driver in DRIVERS {
        let (p, exposed, remote, rq) = granted(driver);

        let data = pattern(LEN, 7);
        let src = p.a.alloc_with(LEN, Access::LOCAL).unwrap();
        src.write_at(0, &data).unwrap();
        p.a.rma(&rq, true, src, remote, 11);
        let ev = rma_done(&rq);
        assert_eq!(
            (ev.ctx, ev.result, ev.len),
            (11, Ok(()), LEN as u64),
            "{driver}"
        );
        assert_eq!(exposed.to_vec(), data, "{driver}: written");

        exposed.write_at(0, &pattern(LEN, 9)).unwrap();
        let dst = p.a.alloc_with(LEN, Access::LOCAL).unwrap();
        p.a.rma(&rq, false, dst, remote, 12);
        let ev = rma_done(&rq);
        assert_eq!(ev.result, Ok(()), "{driver}");
        assert_eq!(ev.buf.unwrap().to_vec(), pattern(LEN, 9), "{driver}: read");

        // A key nobody granted: that RMA fails, the memory is untouched.
        let forged = RemoteSlice {
            key: remote.key ^ 0x5a5a,
            ..remote
        };
        let src = p.a.alloc_with(LEN, Access::LOCAL).unwrap();
        p.a.rma(&rq, true, src, forged, 13);
        let ev = rma_done(&rq);
        assert!(ev.result.is_err(), "{driver}: forged key accepted");
        assert_eq!(exposed.to_vec(), pattern(LEN, 9), "{driver}: untouched");
    }
}

/// `rma_v` gathers several buffers into one remote range and scatters one back over them,
/// as one operation; buffers whose lengths do not add up to the range fail that RMA only.
#[test]
fn several_buffers_are_gathered_and_scattered_by_one_rma() {
    for driver in DRIVERS {
        let (p, exposed, remote, rq) = granted(driver);
        let n = p.a.rma_gather().min(3);
        assert!(n >= 2, "{driver}: gathers {n}");
        // Uneven pieces that fill the range.
        let cuts: Vec<usize> = (0..n)
            .map(|i| (i * LEN / n) + i * 100)
            .chain([LEN])
            .collect();
        let data = pattern(LEN, 5);
        let bufs: Vec<_> = cuts
            .windows(2)
            .map(|w| {
                let b = p.a.alloc_with(w[1] - w[0], Access::LOCAL).unwrap();
                b.write_at(0, &data[w[0]..w[1]]).unwrap();
                b
            })
            .collect();
        p.a.rma_v(&rq, true, bufs, remote, 21);
        let ev = rma_done(&rq);
        assert_eq!(
            (ev.ctx, ev.result, ev.len),
            (21, Ok(()), LEN as u64),
            "{driver}"
        );
        assert_eq!(exposed.to_vec(), data, "{driver}: gathered");

        let outs: Vec<_> = cuts
            .windows(2)
            .map(|w| p.a.alloc_with(w[1] - w[0], Access::LOCAL).unwrap())
            .collect();
        let views = outs
            .iter()
            .map(|b| ExsBuf::new(b.region().clone()))
            .collect();
        p.a.rma_v(&rq, false, views, remote, 22);
        assert_eq!(rma_done(&rq).result, Ok(()), "{driver}");
        let back: Vec<u8> = outs.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(back, data, "{driver}: scattered");

        let short = vec![p.a.alloc_with(LEN / 2, Access::LOCAL).unwrap()];
        p.a.rma_v(&rq, true, short, remote, 23);
        assert!(
            rma_done(&rq).result.is_err(),
            "{driver}: lengths that do not add up"
        );
    }
}
