//! The server side of the handshake (fixed newstyle) as a state machine with no I/O: the
//! runtime sends [`Handshake::greeting`], then reads exactly [`Handshake::wants`] bytes at a
//! time and feeds them to [`Handshake::feed`], which says what to send back and whether to
//! go on, enter transmission ([`Next::Transmit`]) or close ([`Next::Close`]).
//!
//! Offered: `NBD_OPT_GO` / `NBD_OPT_INFO` (with `NBD_INFO_EXPORT`, `NAME`, `DESCRIPTION`,
//! `BLOCK_SIZE`), `NBD_OPT_LIST`, `NBD_OPT_ABORT`, the `NBD_OPT_EXPORT_NAME` fallback,
//! `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`
//! for `base:allocation`, and `NBD_OPT_STARTTLS` when the server has a certificate
//! ([`Handshake::offer_tls`]; the runtime then runs TLS on the socket, [`Next::StartTls`]).
//! An export that needs TLS is refused to a clear client with `NBD_REP_ERR_TLS_REQD`
//! (the specification's "selective TLS": the other options work in clear). Every other
//! option (extended headers included) is answered `NBD_REP_ERR_UNSUP` and negotiation goes
//! on.

use super::consts::*;
use super::option::{self, ClientOption, GoRequest, MetaRequest, OptionError, OptionHeader};
use super::wire::{len32, PutBe};

/// What the handshake needs to know of one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The name clients ask for.
    pub name: String,
    /// A line for humans (`NBD_INFO_DESCRIPTION`, the text of `NBD_REP_SERVER`).
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Writes are refused (`NBD_FLAG_READ_ONLY`).
    pub readonly: bool,
    /// Smallest addressable unit (1 for a buffered file; 4096 with `O_DIRECT`).
    pub min_block: u32,
    /// Size at which I/O is efficient.
    pub preferred_block: u32,
    /// Whether FLUSH on one connection covers writes made on every other
    /// (`NBD_FLAG_CAN_MULTI_CONN`).
    pub multi_conn: bool,
}

impl ExportInfo {
    /// The transmission flags of this export for a session that did (or did not) negotiate
    /// structured replies.
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = FLAG_HAS_FLAGS | FLAG_SEND_CACHE;
        if self.readonly {
            f |= FLAG_READ_ONLY;
        } else {
            f |= FLAG_SEND_FLUSH
                | FLAG_SEND_FUA
                | FLAG_SEND_TRIM
                | FLAG_SEND_WRITE_ZEROES
                | FLAG_SEND_FAST_ZERO;
        }
        if self.multi_conn {
            f |= FLAG_CAN_MULTI_CONN;
        }
        if structured {
            f |= FLAG_SEND_DF;
        }
        f
    }
}

/// The metadata context id `base:allocation` gets in `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What a successful handshake agreed on: the transmission phase starts from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Index of the export in the list the handshake was given.
    pub export: usize,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The id of `base:allocation` if the client selected it for this export.
    pub base_allocation: Option<u32>,
    /// The transmission flags sent.
    pub flags: u16,
    /// `NBD_OPT_GO` chose the export (not the older `NBD_OPT_EXPORT_NAME`, which cannot
    /// be answered with an error).
    pub by_go: bool,
}

impl Negotiated {
    /// What the server sends instead of the final step's bytes when it will not serve
    /// this client after all (its connection limit is reached): an `NBD_REP_ERR_POLICY`
    /// reply to the GO with `why` for humans, or nothing after `NBD_OPT_EXPORT_NAME`,
    /// which has no error reply (the server just closes). Either way the server closes
    /// next.
    pub fn refusal(&self, why: &str) -> Vec<u8> {
        match self.by_go {
            true => error_reply(OPT_GO, REP_ERR_POLICY, why),
            false => Vec::new(),
        }
    }
}

/// What to do after one [`Handshake::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Send the bytes, then read [`Handshake::wants`] bytes more.
    Continue,
    /// Send the bytes, then enter transmission.
    Transmit(Negotiated),
    /// Send the bytes (if any), then close: the reason is for the log.
    Close(String),
    /// Send the bytes (the acknowledgement of `NBD_OPT_STARTTLS`), run the TLS handshake
    /// on the socket, then go on reading options through TLS.
    StartTls,
}

/// The answer to one [`Handshake::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Bytes to send to the client, first.
    pub send: Vec<u8>,
    /// What to do next.
    pub next: Next,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData(OptionHeader),
    Finished,
}

/// The server handshake of one connection.
#[derive(Debug, Clone)]
pub struct Handshake {
    exports: Vec<ExportInfo>,
    state: State,
    no_zeroes: bool,
    structured: bool,
    /// The export `NBD_OPT_SET_META_CONTEXT` last selected `base:allocation` for.
    meta_for: Option<usize>,
    /// `None`: TLS not offered; else, per export, whether it refuses a clear client.
    tls_only: Option<Vec<bool>>,
    /// TLS was started.
    secured: bool,
}

impl Handshake {
    /// A handshake offering `exports` (the first is also the default export, the one an
    /// empty name selects).
    pub fn new(exports: Vec<ExportInfo>) -> Self {
        Handshake {
            exports,
            state: State::ClientFlags,
            no_zeroes: false,
            structured: false,
            meta_for: None,
            tls_only: None,
            secured: false,
        }
    }

    /// Offers `NBD_OPT_STARTTLS`; `tls_only[i]` says export `i` is refused to a client
    /// that did not start TLS.
    pub fn offer_tls(mut self, tls_only: Vec<bool>) -> Self {
        self.tls_only = Some(tls_only);
        self
    }

    /// Whether export `i` is closed to this client until it starts TLS.
    fn needs_tls(&self, i: usize) -> bool {
        !self.secured
            && (self.tls_only.as_ref()).is_some_and(|t| t.get(i).copied().unwrap_or(false))
    }

    /// The bytes the server sends first: `NBDMAGIC`, `IHAVEOPT`, the handshake flags.
    pub fn greeting(&self) -> Vec<u8> {
        let mut g = Vec::with_capacity(18);
        g.put_u64(NBDMAGIC);
        g.put_u64(IHAVEOPT);
        g.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        g
    }

    /// How many bytes the next [`Handshake::feed`] takes.
    pub fn wants(&self) -> usize {
        match self.state {
            State::ClientFlags => 4,
            State::OptionHeader => OPTION_HEADER_LEN,
            State::OptionData(h) => h.len as usize,
            State::Finished => 0,
        }
    }

    /// Feeds exactly [`Handshake::wants`] bytes read from the client.
    pub fn feed(&mut self, input: &[u8]) -> Step {
        if input.len() != self.wants() || self.state == State::Finished {
            return self.close(format!(
                "handshake fed {} bytes where it wanted {}",
                input.len(),
                self.wants()
            ));
        }
        match self.state {
            State::ClientFlags => self.client_flags(input),
            State::OptionHeader => self.option_header(input),
            State::OptionData(h) => {
                self.state = State::OptionHeader;
                self.option(h.option, input)
            }
            State::Finished => self.close("handshake already over".into()),
        }
    }

    fn close(&mut self, why: String) -> Step {
        self.state = State::Finished;
        Step {
            send: Vec::new(),
            next: Next::Close(why),
        }
    }

    fn client_flags(&mut self, input: &[u8]) -> Step {
        let mut b = [0u8; 4];
        b.copy_from_slice(input);
        let flags = u32::from_be_bytes(b);
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return self.close(format!("client flags {flags:#x} with unknown bits"));
        }
        self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
        self.state = State::OptionHeader;
        Step {
            send: Vec::new(),
            next: Next::Continue,
        }
    }

    fn option_header(&mut self, input: &[u8]) -> Step {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b.copy_from_slice(input);
        match option::decode_header(&b) {
            Err(e) => self.close(e.to_string()),
            Ok(h) if h.len == 0 => self.option(h.option, &[]),
            Ok(h) => {
                self.state = State::OptionData(h);
                Step {
                    send: Vec::new(),
                    next: Next::Continue,
                }
            }
        }
    }

    fn option(&mut self, opt: u32, data: &[u8]) -> Step {
        let decoded = match option::decode_option(opt, data) {
            Ok(o) => o,
            Err(_) if opt == OPT_EXPORT_NAME => {
                // EXPORT_NAME cannot be answered with an error: the session ends.
                return self.close("NBD_OPT_EXPORT_NAME with an invalid name".into());
            }
            Err(e) => {
                let code = match e {
                    OptionError::TooBig => REP_ERR_TOO_BIG,
                    OptionError::Invalid(_) => REP_ERR_INVALID,
                };
                return reply_continue(error_reply(opt, code, &e.to_string()));
            }
        };
        match decoded {
            ClientOption::ExportName(name) => self.export_name(&name),
            ClientOption::Abort => {
                self.state = State::Finished;
                Step {
                    send: reply(OPT_ABORT, REP_ACK, &[]),
                    next: Next::Close("client aborted the handshake".into()),
                }
            }
            ClientOption::List => reply_continue(self.list()),
            ClientOption::Info(g) => reply_continue(self.info(OPT_INFO, &g).0),
            ClientOption::Go(g) => self.go(&g),
            ClientOption::StructuredReply => {
                self.structured = true;
                reply_continue(reply(OPT_STRUCTURED_REPLY, REP_ACK, &[]))
            }
            ClientOption::ListMetaContext(m) => reply_continue(self.list_meta(&m)),
            ClientOption::SetMetaContext(m) => reply_continue(self.set_meta(&m)),
            ClientOption::StartTls => self.start_tls(),
            ClientOption::ExtendedHeaders => reply_continue(error_reply(
                opt,
                REP_ERR_UNSUP,
                "extended headers are not offered by this server version",
            )),
            ClientOption::Unknown(n) => reply_continue(error_reply(
                n,
                REP_ERR_UNSUP,
                &format!("option {n} is not supported"),
            )),
        }
    }

    /// The export `name` selects (the empty name is the default, the first export).
    fn find(&self, name: &str) -> Option<usize> {
        if name.is_empty() && !self.exports.is_empty() {
            return Some(0);
        }
        self.exports.iter().position(|e| e.name == name)
    }

    fn negotiated(&self, export: usize, by_go: bool) -> Negotiated {
        Negotiated {
            by_go,
            export,
            structured: self.structured,
            base_allocation: (self.meta_for == Some(export)).then_some(BASE_ALLOCATION_ID),
            flags: self.exports[export].transmission_flags(self.structured),
        }
    }

    fn start_tls(&mut self) -> Step {
        let opt = OPT_STARTTLS;
        if self.tls_only.is_none() {
            let msg =
                "TLS is not offered: this server has no certificate ([block] tls_certificate)";
            return reply_continue(error_reply(opt, REP_ERR_UNSUP, msg));
        }
        if self.secured {
            return reply_continue(error_reply(opt, REP_ERR_INVALID, "TLS is already on"));
        }
        // What was negotiated in clear does not carry over into TLS (the specification).
        self.secured = true;
        self.structured = false;
        self.meta_for = None;
        Step {
            send: reply(opt, REP_ACK, &[]),
            next: Next::StartTls,
        }
    }

    fn export_name(&mut self, name: &str) -> Step {
        let Some(i) = self.find(name) else {
            return self.close(format!("NBD_OPT_EXPORT_NAME for unknown export {name:?}"));
        };
        if self.needs_tls(i) {
            // EXPORT_NAME has no error reply: the session ends.
            return self.close(format!(
                "NBD_OPT_EXPORT_NAME in clear for TLS-only {name:?}"
            ));
        }
        let n = self.negotiated(i, false);
        let mut send = Vec::with_capacity(134);
        send.put_u64(self.exports[i].size);
        send.put_u16(n.flags);
        if !self.no_zeroes {
            send.extend_from_slice(&[0u8; 124]);
        }
        self.state = State::Finished;
        Step {
            send,
            next: Next::Transmit(n),
        }
    }

    fn list(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for e in &self.exports {
            let mut d = Vec::with_capacity(4 + e.name.len() + e.description.len());
            d.put_u32(len32(e.name.len()));
            d.extend_from_slice(e.name.as_bytes());
            d.extend_from_slice(e.description.as_bytes());
            out.extend_from_slice(&reply(OPT_LIST, REP_SERVER, &d));
        }
        out.extend_from_slice(&reply(OPT_LIST, REP_ACK, &[]));
        out
    }

    /// The replies to INFO or GO, and the export when it succeeded.
    fn info(&self, opt: u32, g: &GoRequest) -> (Vec<u8>, Option<usize>) {
        let Some(i) = self.find(&g.name) else {
            let msg = format!(
                "no export named {:?} here (NBD_OPT_LIST lists them)",
                g.name
            );
            return (error_reply(opt, REP_ERR_UNKNOWN, &msg), None);
        };
        if self.needs_tls(i) {
            let msg = format!(
                "export {:?} needs TLS: start it first (NBD_OPT_STARTTLS)",
                g.name
            );
            return (error_reply(opt, REP_ERR_TLS_REQD, &msg), None);
        }
        let e = &self.exports[i];
        let mut out = Vec::new();
        let mut d = Vec::with_capacity(12);
        d.put_u16(INFO_EXPORT);
        d.put_u64(e.size);
        d.put_u16(e.transmission_flags(self.structured));
        out.extend_from_slice(&reply(opt, REP_INFO, &d));
        if g.info.contains(&INFO_NAME) {
            out.extend_from_slice(&reply(opt, REP_INFO, &info_string(INFO_NAME, &e.name)));
        }
        if g.info.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
            let d = info_string(INFO_DESCRIPTION, &e.description);
            out.extend_from_slice(&reply(opt, REP_INFO, &d));
        }
        // Always sent: a client that did not ask may ignore it, and one that did learns
        // the alignment this export enforces.
        let mut d = Vec::with_capacity(14);
        d.put_u16(INFO_BLOCK_SIZE);
        d.put_u32(e.min_block);
        d.put_u32(e.preferred_block.max(e.min_block));
        d.put_u32(MAX_PAYLOAD);
        out.extend_from_slice(&reply(opt, REP_INFO, &d));
        out.extend_from_slice(&reply(opt, REP_ACK, &[]));
        (out, Some(i))
    }

    fn go(&mut self, g: &GoRequest) -> Step {
        match self.info(OPT_GO, g) {
            (send, Some(i)) => {
                self.state = State::Finished;
                Step {
                    send,
                    next: Next::Transmit(self.negotiated(i, true)),
                }
            }
            (send, None) => reply_continue(send),
        }
    }

    /// Whether `base:allocation` answers the queries (no query: every context).
    fn wants_base_allocation(queries: &[String], listing: bool) -> bool {
        (listing && queries.is_empty())
            || queries
                .iter()
                .any(|q| q == BASE_ALLOCATION || (listing && q == "base:"))
    }

    fn list_meta(&self, m: &MetaRequest) -> Vec<u8> {
        let opt = OPT_LIST_META_CONTEXT;
        if self.find(&m.export).is_none() {
            let msg = format!("no export named {:?} here", m.export);
            return error_reply(opt, REP_ERR_UNKNOWN, &msg);
        }
        let mut out = Vec::new();
        if Self::wants_base_allocation(&m.queries, true) {
            out.extend_from_slice(&reply(opt, REP_META_CONTEXT, &meta_context(0)));
        }
        out.extend_from_slice(&reply(opt, REP_ACK, &[]));
        out
    }

    fn set_meta(&mut self, m: &MetaRequest) -> Vec<u8> {
        let opt = OPT_SET_META_CONTEXT;
        // Every SET replaces the selection, failed ones included.
        self.meta_for = None;
        if !self.structured {
            let msg = "NBD_OPT_SET_META_CONTEXT needs NBD_OPT_STRUCTURED_REPLY first";
            return error_reply(opt, REP_ERR_INVALID, msg);
        }
        let Some(i) = self.find(&m.export) else {
            let msg = format!("no export named {:?} here", m.export);
            return error_reply(opt, REP_ERR_UNKNOWN, &msg);
        };
        let mut out = Vec::new();
        if Self::wants_base_allocation(&m.queries, false) {
            self.meta_for = Some(i);
            let d = meta_context(BASE_ALLOCATION_ID);
            out.extend_from_slice(&reply(opt, REP_META_CONTEXT, &d));
        }
        out.extend_from_slice(&reply(opt, REP_ACK, &[]));
        out
    }
}

fn reply_continue(send: Vec<u8>) -> Step {
    Step {
        send,
        next: Next::Continue,
    }
}

/// One option reply: magic, option, reply type, length, data.
pub fn reply(option: u32, rtype: u32, data: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(20 + data.len());
    r.put_u64(OPT_REPLY_MAGIC);
    r.put_u32(option);
    r.put_u32(rtype);
    r.put_u32(len32(data.len()));
    r.extend_from_slice(data);
    r
}

/// An error reply with a message for humans (cut to the specification's string limit).
fn error_reply(option: u32, rtype: u32, msg: &str) -> Vec<u8> {
    reply(option, rtype, truncate(msg, MAX_STRING).as_bytes())
}

/// `s` cut to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(2 + s.len());
    d.put_u16(kind);
    d.extend_from_slice(truncate(s, MAX_STRING).as_bytes());
    d
}

fn meta_context(id: u32) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + BASE_ALLOCATION.len());
    d.put_u32(id);
    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
    d
}
