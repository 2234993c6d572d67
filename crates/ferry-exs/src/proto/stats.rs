//! Counters a connection keeps, for `exs` diagnostics and benchmarks.

/// What one connection did. Counters only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Frames handed to the runtime to send.
    pub frames_sent: u64,
    /// Frames received and accepted.
    pub frames_received: u64,
    /// Explicit CREDIT frames sent (credits that found no other frame to ride on).
    pub credit_frames: u64,
    /// Operations that had to wait for a credit before their unsolicited frame could go
    /// (each counted once, when it reaches the head of its queue and finds none).
    pub credit_stalls: u64,
    /// Messages sent as pull ADVERTs.
    pub adverts: u64,
    /// Messages sent as immediate data.
    pub immediates: u64,
    /// Messages sent by the push rendezvous.
    pub pushes: u64,
    /// Messages written into the peer's persistent recv block.
    pub block_writes: u64,
    /// Reads from the peer's persistent send block.
    pub block_reads: u64,
    /// Payload bytes this side sent that the peer accepted.
    pub bytes_sent: u64,
    /// Payload bytes delivered into this side's buffers.
    pub bytes_received: u64,
}
