//! Credit accounting for one connection, both directions.
//!
//! A credit is one unsolicited frame in flight: the sender spends one per ADVERT, PUSH_REQ,
//! RECV_ADVERT or READ_NOTIFY, and the receiver returns it in the header of a later frame.
//! The receiver returns a credit no earlier than the response that finishes the operation
//! (ACK, refused PUSH_GRANT) or, for operations without a final response (push after its
//! DONE, READ_NOTIFY once handled), once it is done with it. That keeps every response
//! bounded by the operations the peer still has open, which is what makes the control-buffer
//! count in `docs/protocol.md` (section "EXS control protocol") sufficient.

use super::wire::Hello;
use super::Config;

/// A snapshot of the counters, for the runtime's diagnostics and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditState {
    /// Negotiated: unsolicited frames this side may have outstanding at the peer.
    pub send_window: u16,
    /// Of those, how many this side may still send.
    pub available: u32,
    /// Negotiated: unsolicited frames the peer may have outstanding here.
    pub recv_window: u16,
    /// The peer's credits this side holds (received, not yet returned).
    pub held: u32,
    /// Of those, how many are free to return with the next frame.
    pub owed: u32,
}

/// The live counters (all zero until the HELLO exchange).
#[derive(Debug, Default)]
pub(crate) struct Credits(CreditState);

impl Credits {
    /// Windows are the smaller of what one side offers and the other accepts, computed the
    /// same way on both sides from the two HELLOs.
    pub fn negotiate(local: &Config, peer: &Hello) -> Self {
        let send_window = local.send_credits.min(peer.recv_credits);
        Credits(CreditState {
            send_window,
            available: send_window.into(),
            recv_window: local.recv_credits.min(peer.send_credits),
            held: 0,
            owed: 0,
        })
    }

    pub fn state(&self) -> CreditState {
        self.0
    }

    /// Spends a credit if one is available.
    pub fn try_take(&mut self) -> bool {
        let ok = self.0.available > 0;
        if ok {
            self.0.available -= 1;
        }
        ok
    }

    /// The peer returned `n` credits; more than were spent is a protocol violation.
    pub fn returned(&mut self, n: u16) -> Result<(), ()> {
        let now = self.0.available + u32::from(n);
        if now > self.0.send_window.into() {
            return Err(());
        }
        self.0.available = now;
        Ok(())
    }

    /// The peer spent a credit on us; beyond the window is a protocol violation.
    pub fn received(&mut self) -> Result<(), ()> {
        if self.0.held >= self.0.recv_window.into() {
            return Err(());
        }
        self.0.held += 1;
        Ok(())
    }

    /// An operation finished without a response to carry its credit back.
    pub fn free(&mut self) {
        debug_assert!(self.0.owed < self.0.held);
        self.0.owed += 1;
    }

    /// Credits to put in an outgoing header: everything owed, plus the frame's own if it is
    /// the final response of a peer operation.
    pub fn take_return(&mut self, own: bool) -> u16 {
        let n = self.0.owed + u32::from(own);
        debug_assert!(n <= self.0.held);
        self.0.held -= n;
        self.0.owed = 0;
        // n <= held <= recv_window, a u16.
        n as u16
    }

    /// An explicit CREDIT frame is worth sending when half the window is owed, or when
    /// nothing else of the peer's is pending here, so no response would carry them soon.
    pub fn should_flush(&self) -> bool {
        let s = &self.0;
        s.owed > 0 && (2 * s.owed >= u32::from(s.recv_window) || s.owed == s.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(send: u16, recv: u16, peer_send: u16, peer_recv: u16) -> Credits {
        let cfg = Config {
            send_credits: send,
            recv_credits: recv,
            ..Config::default()
        };
        let hello = Hello {
            minor: 0,
            send_credits: peer_send,
            recv_credits: peer_recv,
            max_imm: 0,
        };
        Credits::negotiate(&cfg, &hello)
    }

    #[test]
    fn windows_are_the_minimum_of_both_offers() {
        let c = pair(8, 4, 2, 16).state();
        assert_eq!((c.send_window, c.recv_window, c.available), (8, 2, 8));
        let c = pair(8, 4, 9, 3).state();
        assert_eq!((c.send_window, c.recv_window), (3, 4));
    }

    #[test]
    fn spending_and_returning_is_bounded_by_the_window() {
        let mut c = pair(2, 2, 2, 2);
        assert!(c.try_take() && c.try_take() && !c.try_take());
        assert!(c.returned(3).is_err());
        assert!(c.returned(2).is_ok());
        assert!(c.received().is_ok() && c.received().is_ok());
        assert!(c.received().is_err());
        assert!(!c.should_flush());
        c.free();
        // One of two owed is half the window.
        assert!(c.should_flush());
        assert_eq!(c.take_return(true), 2);
        assert_eq!(c.state().held, 0);
    }

    #[test]
    fn flushes_when_nothing_else_is_pending() {
        let mut c = pair(8, 8, 8, 8);
        c.received().unwrap();
        c.received().unwrap();
        c.free();
        assert!(!c.should_flush(), "1 of 8 owed and another op pending");
        c.free();
        assert!(c.should_flush(), "all held credits are owed");
    }
}
