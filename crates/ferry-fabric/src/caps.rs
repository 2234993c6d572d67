//! What a driver can do, reported honestly so the layers above can adapt.

/// Ordering guarantees between operations posted on one endpoint, as delivered at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ordering {
    /// Sends arrive in the order they were posted.
    pub send_after_send: bool,
    /// An RMA write is visible at the target before a later send is delivered there.
    pub send_after_write: bool,
    /// RMA writes are applied in the order they were posted.
    pub write_after_write: bool,
    /// Completions are reported in posting order (per operation kind).
    pub completion_in_order: bool,
}

/// Who drives data transfers forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A driver thread makes progress; callers only collect completions.
    Auto,
    /// The provider progresses only when polled; ferry runs a progress thread for it.
    ManualThread,
}

/// Capabilities of one driver (and, for libfabric, one provider).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// `tcp` or `ofi+<provider>`.
    pub driver: String,
    /// The provider actually selected (libfabric may layer a utility provider, e.g. `tcp;ofi_rxm`).
    pub provider: String,
    /// One-sided RMA read and write are available (natively or emulated by the driver itself).
    pub rma: bool,
    /// Most local segments one send, write or read may gather/scatter.
    pub max_gather: usize,
    /// Most local segments one RMA write or read may gather/scatter (receives may take
    /// fewer: `max_gather` bounds every operation).
    pub rma_gather: usize,
    /// Most remote segments (of one region) one RMA may address ([`crate::Endpoint::post_write_v`],
    /// [`crate::Endpoint::post_read_v`]); at least 1.
    pub rma_iov_limit: usize,
    /// Sends up to this size are copied at post time ("inline"), so their buffer is free at once.
    pub inline_size: usize,
    /// Largest single message or RMA transfer.
    pub max_msg_size: u64,
    /// The RMA size to split large transfers into (measured per driver, a hint): pieces of
    /// this size, several in flight, move a large transfer faster than one operation where
    /// the driver streams pieces better than it streams one giant operation. `u64::MAX` when
    /// splitting does not help.
    pub rma_piece: u64,
    /// Ordering guarantees.
    pub ordering: Ordering,
    /// Progress model.
    pub progress: Progress,
    /// Remote addresses are virtual addresses (true) or offsets into the region (false).
    pub virt_addr: bool,
}
