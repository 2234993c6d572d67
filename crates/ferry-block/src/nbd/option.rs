//! Option requests of the handshake (fixed newstyle): the 16-byte header, the options this
//! server understands decoded from their data, and the client-side encoder the property
//! tests (and a future client) use. Decoding never panics: every length is checked against
//! the bytes present and the limits in [`super::consts`].

use super::consts::*;
use super::wire::{len32, Fields, PutBe};

/// The fixed part of an option request: which option and how many data bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option number (`NBD_OPT_*`).
    pub option: u32,
    /// Length of the option's data.
    pub len: u32,
}

/// Why an option header ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The header did not start with `IHAVEOPT`: the client is not speaking NBD options.
    #[error("option without the IHAVEOPT magic (got {0:#018x})")]
    Magic(u64),
    /// The data length is beyond [`MAX_OPTION_LEN`].
    #[error("option {option} with {len} bytes of data, more than the {max} allowed", max = MAX_OPTION_LEN)]
    TooLong {
        /// The option.
        option: u32,
        /// Its claimed data length.
        len: u32,
    },
}

/// Decodes an option header.
pub fn decode_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, HeaderError> {
    let mut f = Fields::new(b);
    let (magic, option, len) = (
        f.u64().unwrap_or(0),
        f.u32().unwrap_or(0),
        f.u32().unwrap_or(0),
    );
    if magic != IHAVEOPT {
        return Err(HeaderError::Magic(magic));
    }
    if len > MAX_OPTION_LEN {
        return Err(HeaderError::TooLong { option, len });
    }
    Ok(OptionHeader { option, len })
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    /// The export (empty: the default export).
    pub name: String,
    /// Information types asked for (`NBD_INFO_*`), in the client's order.
    pub info: Vec<u16>,
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    /// The export the contexts are for.
    pub export: String,
    /// The queries (`namespace:leaf`).
    pub queries: Vec<String>,
}

/// A decoded option request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: choose an export and enter transmission (no reply on error).
    ExportName(String),
    /// `NBD_OPT_ABORT`.
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS` (not offered in this version).
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(GoRequest),
    /// `NBD_OPT_GO`.
    Go(GoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaRequest),
    /// `NBD_OPT_EXTENDED_HEADERS` (not offered in this version).
    ExtendedHeaders,
    /// An option this server does not know, with its number.
    Unknown(u32),
}

/// Why an option's data was refused; the handshake answers `NBD_REP_ERR_INVALID` (or
/// `NBD_REP_ERR_TOO_BIG`) and negotiation goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// Syntactically invalid data: the message says what.
    #[error("{0}")]
    Invalid(&'static str),
    /// More queries than [`MAX_QUERIES`].
    #[error("more than {max} metadata-context queries", max = MAX_QUERIES)]
    TooBig,
}

/// Decodes option `option`'s `data` (whose length the header bounded).
pub fn decode_option(option: u32, data: &[u8]) -> Result<ClientOption, OptionError> {
    use OptionError::Invalid;
    let no_data = |o: ClientOption| {
        if data.is_empty() {
            Ok(o)
        } else {
            Err(Invalid("this option takes no data"))
        }
    };
    match option {
        OPT_EXPORT_NAME => Fields::new(data)
            .string(data.len())
            .map(ClientOption::ExportName)
            .map_err(Invalid),
        // The specification asks servers to ignore data sent with ABORT.
        OPT_ABORT => Ok(ClientOption::Abort),
        OPT_LIST => no_data(ClientOption::List),
        OPT_STARTTLS => no_data(ClientOption::StartTls),
        OPT_INFO => decode_go(data).map(ClientOption::Info),
        OPT_GO => decode_go(data).map(ClientOption::Go),
        OPT_STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
        OPT_LIST_META_CONTEXT => decode_meta(data).map(ClientOption::ListMetaContext),
        OPT_SET_META_CONTEXT => decode_meta(data).map(ClientOption::SetMetaContext),
        OPT_EXTENDED_HEADERS => no_data(ClientOption::ExtendedHeaders),
        other => Ok(ClientOption::Unknown(other)),
    }
}

fn decode_go(data: &[u8]) -> Result<GoRequest, OptionError> {
    use OptionError::Invalid;
    let mut f = Fields::new(data);
    let name_len = f
        .u32()
        .ok_or(Invalid("INFO/GO data shorter than 6 bytes"))?;
    let name = f.string(name_len as usize).map_err(Invalid)?;
    let n = f
        .u16()
        .ok_or(Invalid("INFO/GO without its request count"))?;
    let mut info = Vec::with_capacity(usize::from(n).min(f.remaining() / 2));
    for _ in 0..n {
        info.push(
            f.u16()
                .ok_or(Invalid("INFO/GO with fewer requests than it counts"))?,
        );
    }
    if f.remaining() != 0 {
        return Err(Invalid("INFO/GO with bytes after its requests"));
    }
    Ok(GoRequest { name, info })
}

fn decode_meta(data: &[u8]) -> Result<MetaRequest, OptionError> {
    use OptionError::Invalid;
    let mut f = Fields::new(data);
    let name_len = f
        .u32()
        .ok_or(Invalid("meta-context data without an export name"))?;
    let export = f.string(name_len as usize).map_err(Invalid)?;
    let n = f
        .u32()
        .ok_or(Invalid("meta-context data without a query count"))?;
    if n > MAX_QUERIES {
        return Err(OptionError::TooBig);
    }
    let mut queries = Vec::with_capacity((n as usize).min(f.remaining() / 4));
    for _ in 0..n {
        let len = f.u32().ok_or(Invalid("fewer queries than counted"))?;
        queries.push(f.string(len as usize).map_err(Invalid)?);
    }
    if f.remaining() != 0 {
        return Err(Invalid("meta-context data with bytes after its queries"));
    }
    Ok(MetaRequest { export, queries })
}

/// Encodes an option request as a client sends it (header and data).
pub fn encode_option(o: &ClientOption) -> Vec<u8> {
    let mut data = Vec::new();
    let option = match o {
        ClientOption::ExportName(name) => {
            data.extend_from_slice(name.as_bytes());
            OPT_EXPORT_NAME
        }
        ClientOption::Abort => OPT_ABORT,
        ClientOption::List => OPT_LIST,
        ClientOption::StartTls => OPT_STARTTLS,
        ClientOption::Info(g) | ClientOption::Go(g) => {
            data.put_u32(len32(g.name.len()));
            data.extend_from_slice(g.name.as_bytes());
            data.put_u16(u16::try_from(g.info.len()).unwrap_or(u16::MAX));
            for i in &g.info {
                data.put_u16(*i);
            }
            if matches!(o, ClientOption::Info(_)) {
                OPT_INFO
            } else {
                OPT_GO
            }
        }
        ClientOption::StructuredReply => OPT_STRUCTURED_REPLY,
        ClientOption::ListMetaContext(m) | ClientOption::SetMetaContext(m) => {
            data.put_u32(len32(m.export.len()));
            data.extend_from_slice(m.export.as_bytes());
            data.put_u32(len32(m.queries.len()));
            for q in &m.queries {
                data.put_u32(len32(q.len()));
                data.extend_from_slice(q.as_bytes());
            }
            if matches!(o, ClientOption::ListMetaContext(_)) {
                OPT_LIST_META_CONTEXT
            } else {
                OPT_SET_META_CONTEXT
            }
        }
        ClientOption::ExtendedHeaders => OPT_EXTENDED_HEADERS,
        ClientOption::Unknown(n) => *n,
    };
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    out.put_u64(IHAVEOPT);
    out.put_u32(option);
    out.put_u32(len32(data.len()));
    out.extend_from_slice(&data);
    out
}
