//! The server's request dispatch as a pure router: a decoded request in, a [`Route`] out
//! (refuse it, expand a batch, start a GET or a PUT, list, stat…). The server's request
//! loop executes routes; nothing here touches a file, a link or a clock.

use crate::export::{refuse, Refusal};
use crate::proto::{self, ErrorCode, Msg};
use ferry_service::journal::Ident;
use ferry_service::roots::Target;

/// A PUT (or PUT_FILE, or OPEN) as the server handles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutReq {
    /// The transfer id the client chose.
    pub file_id: u32,
    /// Continue a part of the same source if there is one.
    pub resume: bool,
    /// Replace a read-only destination (the client's `--force`).
    pub force: bool,
    /// Permission bits for the file.
    pub mode: u32,
    /// Its size.
    pub size: u64,
    /// The source's mtime (ns since the epoch), when the client sent it.
    pub mtime: Option<i64>,
    /// The connection's block size.
    pub block: u32,
    /// The connection's ring (the writer queues at most this many blocks).
    pub ring: usize,
}

impl PutReq {
    /// What identifies the source the upload comes from (a part of another is not resumed).
    pub fn ident(&self) -> Ident {
        Ident {
            size: self.size,
            mtime: self.mtime.unwrap_or(0),
        }
    }

    /// How the upload may treat its destination.
    pub fn target(&self) -> Target {
        Target {
            resume: self.resume,
            force: self.force,
        }
    }
}

/// A SEND_TO (third-party copy) as the server handles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendToReq {
    /// The request id.
    pub file_id: u32,
    /// Copy a tree.
    pub recursive: bool,
    /// The source path on this server.
    pub path: String,
    /// The destination server's address.
    pub dest: String,
    /// The path there.
    pub dest_path: String,
    /// The token for the destination (empty with a grant).
    pub token: String,
    /// Streams to the destination.
    pub streams: u16,
    /// Follow symbolic links that stay inside the root (1.9).
    pub follow: bool,
    /// `--include` and `--exclude` patterns (1.9).
    pub patterns: Option<(Vec<String>, Vec<String>)>,
    /// Copy only these files of the tree (1.9: what a sync found to differ).
    pub only: Option<Vec<String>>,
    /// The destination's grant (`ferry_service::grants`), proven there instead of a token;
    /// `dest_path` is then the placed target.
    pub grant: Option<[u8; 32]>,
}

/// What the server does with one request.
#[derive(Debug)]
pub enum Route {
    /// BYE: the connection ends.
    Bye,
    /// COPIES: the asking credential's third-party copies in progress.
    Copies,
    /// ABORT_COPY: stop one of them.
    AbortCopy(u64),
    /// A GETS frame: its files are answered one by one, each as if its GET came alone.
    Batch(Vec<Msg>),
    /// Refused without looking further.
    Refuse {
        /// The transfer id the ERROR carries.
        file_id: u32,
        /// Why.
        refusal: Refusal,
    },
    /// A request of the memory root (memory mode): served by the virtual files.
    Virtual(Msg),
    /// STAT.
    Stat(String),
    /// LIST.
    List(String),
    /// MKDIR.
    Mkdir {
        /// Permission bits.
        mode: u32,
        /// The directory.
        path: String,
    },
    /// REMOVE.
    Remove(String),
    /// SUM: the file's BLAKE3.
    Sum(String),
    /// GET `length` bytes at `offset`.
    Get {
        /// The transfer id.
        file_id: u32,
        /// First byte.
        offset: u64,
        /// Bytes (`u64::MAX`: to the end).
        length: u64,
        /// The file.
        path: String,
    },
    /// PUT: an upload conversation ([`crate::conv::upload::Receiver::put`]).
    Put(PutReq, String),
    /// PUT_FILE: a whole file in the request frame, its payload the frame's last `len` bytes.
    PutFile {
        /// The request.
        req: PutReq,
        /// The file.
        path: String,
        /// The payload's BLAKE3 as sent.
        blake3: [u8; 32],
        /// The payload's length.
        len: u32,
    },
    /// OPEN: a parallel upload starts (answered with HAVE).
    Open(PutReq, String),
    /// PUT_RANGE: one range of an OPENed upload.
    PutRange {
        /// The upload.
        file_id: u32,
        /// First byte.
        offset: u64,
        /// Bytes.
        length: u64,
    },
    /// CLOSE: every range of an OPENed upload arrived.
    Close {
        /// The upload.
        file_id: u32,
        /// Its length as the client counts it.
        length: u64,
        /// The source's BLAKE3.
        blake3: Option<[u8; 32]>,
    },
    /// SEND_TO: a copy from this server to another.
    SendTo(SendToReq),
    /// GRANT: mint a grant for another server to write `path` here.
    Grant {
        /// The path and everything beneath it.
        tree: bool,
        /// Seconds it may wait for its use (0: the default).
        ttl_secs: u32,
        /// `root/relative/path`.
        path: String,
    },
    /// Not a request (a reply or a data frame): the connection ends.
    Unexpected(Msg),
}

/// What is shutting down refused requests hear.
pub(crate) const DRAINING: &str =
    "the server is shutting down; try again shortly (ferry cp --retries does)";

/// Routes one connection's requests.
#[derive(Debug, Clone, Copy)]
pub struct Router {
    /// The agreed block size.
    pub block: u32,
    /// The connection's ring.
    pub ring: usize,
    /// The server serves the memory root (memory mode).
    pub mem: bool,
}

impl Router {
    /// Whether `msg` joins the PUT_FILEs waiting to be committed together; any other
    /// request commits them first, so answers keep request order.
    pub fn joins_commits(msg: &Msg) -> bool {
        matches!(msg, Msg::PutFile { .. })
    }

    /// Whether `msg`'s answer may join an open PACK: only whole-file GETs of real files,
    /// and a GETS, which is such GETs (each is asked again as it is answered); anything
    /// else sends the PACK first, so answers leave in request order. (A GETS that sent the
    /// PACK made every batch end in a PACK of the one file that did not fit the last.)
    pub fn packs(&self, msg: &Msg) -> bool {
        match msg {
            Msg::Gets { .. } => true,
            Msg::Get {
                offset: 0,
                length: u64::MAX,
                path,
                ..
            } => !(self.mem && crate::mem::classify(path).is_some()),
            _ => false,
        }
    }

    /// Routes a request. Once a drain's grace is over (`stopping`), every request but BYE
    /// is refused (Unavailable); a GETS batch is expanded first, so each of its GETs is
    /// refused alone.
    pub fn route(&self, msg: Msg, stopping: bool) -> Route {
        if let Msg::Gets { files } = msg {
            return Route::Batch(
                files
                    .into_iter()
                    .map(|(file_id, path)| Msg::Get {
                        file_id,
                        offset: 0,
                        length: u64::MAX,
                        path,
                    })
                    .collect(),
            );
        }
        if stopping && msg != Msg::Bye {
            return Route::Refuse {
                file_id: transfer_of(&msg),
                refusal: refuse(ErrorCode::Unavailable, DRAINING),
            };
        }
        if self.mem && names_virtual(&msg) {
            return Route::Virtual(msg);
        }
        self.dispatch(msg)
    }

    /// Routes a request by its kind alone (no drain, no memory root).
    pub fn dispatch(&self, msg: Msg) -> Route {
        let (block, ring) = (self.block, self.ring);
        match msg {
            Msg::Bye => Route::Bye,
            Msg::Stat { path } => Route::Stat(path),
            Msg::List { path } => Route::List(path),
            Msg::Mkdir { mode, path } => Route::Mkdir { mode, path },
            Msg::Remove { path } => Route::Remove(path),
            Msg::Sum { path } => Route::Sum(path),
            Msg::Get {
                file_id,
                offset,
                length,
                path,
            } => Route::Get {
                file_id,
                offset,
                length,
                path,
            },
            Msg::Put {
                file_id,
                flags,
                mode,
                size,
                mtime,
                path,
            } => Route::Put(
                PutReq {
                    file_id,
                    resume: flags & proto::PUT_RESUME != 0,
                    force: flags & proto::PUT_FORCE != 0,
                    mode,
                    size,
                    mtime,
                    block,
                    ring,
                },
                path,
            ),
            Msg::PutFile {
                flags,
                file_id,
                mode,
                mtime,
                blake3,
                path,
                len,
            } => Route::PutFile {
                req: PutReq {
                    file_id,
                    resume: false,
                    force: flags & proto::PUT_FILE_FORCE != 0,
                    mode,
                    size: u64::from(len),
                    mtime: Some(mtime),
                    block,
                    ring,
                },
                path,
                blake3,
                len,
            },
            Msg::Open {
                flags,
                file_id,
                mode,
                size,
                mtime,
                path,
            } => Route::Open(
                PutReq {
                    file_id,
                    resume: flags & proto::OPEN_RESUME != 0,
                    force: flags & proto::OPEN_FORCE != 0,
                    mode,
                    size,
                    mtime: Some(mtime),
                    block,
                    ring,
                },
                path,
            ),
            Msg::PutRange {
                file_id,
                offset,
                length,
            } => Route::PutRange {
                file_id,
                offset,
                length,
            },
            Msg::Close {
                file_id,
                length,
                blake3,
            } => Route::Close {
                file_id,
                length,
                blake3,
            },
            Msg::SendTo {
                flags,
                file_id,
                path,
                dest,
                dest_path,
                token,
                streams,
                follow,
                patterns,
                only,
                grant,
            } => Route::SendTo(SendToReq {
                file_id,
                recursive: flags & proto::SEND_RECURSIVE != 0,
                path,
                dest,
                dest_path,
                token,
                streams,
                follow,
                patterns,
                only,
                grant,
            }),
            Msg::Grant {
                flags,
                ttl_secs,
                path,
            } => Route::Grant {
                tree: flags & proto::GRANT_TREE != 0,
                ttl_secs,
                path,
            },
            Msg::Copies => Route::Copies,
            Msg::AbortCopy { id } => Route::AbortCopy(id),
            m => Route::Unexpected(m),
        }
    }
}

impl Route {
    /// What the audit log calls this route, the path it names (`#ID` for a parallel
    /// upload's CLOSE, which names its transfer), the bytes it asks to move, and whether it
    /// only looks (a listing, a stat, a sum: logged at debug level when no audit file is
    /// set); `None` for routes that are not requests of their own.
    pub fn audited(&self) -> Option<(&'static str, String, u64, bool)> {
        Some(match self {
            Route::Stat(p) => ("stat", p.clone(), 0, true),
            Route::List(p) => ("list", p.clone(), 0, true),
            Route::Sum(p) => ("sum", p.clone(), 0, true),
            Route::Mkdir { path, .. } => ("mkdir", path.clone(), 0, false),
            Route::Remove(p) => ("remove", p.clone(), 0, false),
            Route::Get { path, length, .. } => ("get", path.clone(), *length, false),
            Route::Put(req, path) => ("put", path.clone(), req.size, false),
            Route::PutFile { path, len, .. } => ("put", path.clone(), u64::from(*len), false),
            Route::Open(req, path) => ("open", path.clone(), req.size, false),
            Route::Close {
                file_id, length, ..
            } => ("close", format!("#{file_id}"), *length, false),
            Route::SendTo(req) => ("send_to", req.path.clone(), 0, false),
            Route::Grant { path, .. } => ("grant", path.clone(), 0, false),
            Route::Copies => ("copies", String::new(), 0, true),
            Route::AbortCopy(id) => ("abort_copy", format!("#{id}"), 0, false),
            Route::Virtual(msg) => return Route::virtual_audited(msg),
            Route::Bye
            | Route::Batch(_)
            | Route::Refuse { .. }
            | Route::PutRange { .. }
            | Route::Unexpected(_) => return None,
        })
    }

    /// [`Route::audited`] for a request of the memory root ([`Route::Virtual`]): what the
    /// same request of a real root is called, and the bytes it asks to move.
    pub fn virtual_audited(msg: &Msg) -> Option<(&'static str, String, u64, bool)> {
        Some(match msg {
            Msg::Stat { path } => ("stat", path.clone(), 0, true),
            Msg::List { path } => ("list", path.clone(), 0, true),
            Msg::Sum { path } => ("sum", path.clone(), 0, true),
            Msg::Mkdir { path, .. } => ("mkdir", path.clone(), 0, false),
            Msg::Remove { path } => ("remove", path.clone(), 0, false),
            Msg::Get { path, length, .. } => ("get", path.clone(), *length, false),
            Msg::Put { path, size, .. } => ("put", path.clone(), *size, false),
            Msg::Open { path, size, .. } => ("open", path.clone(), *size, false),
            _ => return None,
        })
    }

    /// The path this route resolves on the server, whether it writes there, and the
    /// transfer id a refusal carries: what a credential's rights are checked against
    /// ([`ferry_service::roots::Roots::permit`]). `None` for routes that name no path
    /// (their file was checked when it was opened).
    pub fn access(&self) -> Option<(&str, bool, u32)> {
        match self {
            Route::Stat(p) | Route::List(p) | Route::Sum(p) => Some((p, false, 0)),
            Route::Mkdir { path, .. } => Some((path, true, 0)),
            Route::Remove(p) => Some((p, true, 0)),
            Route::Get { path, file_id, .. } => Some((path, false, *file_id)),
            Route::Put(req, path) | Route::Open(req, path) | Route::PutFile { req, path, .. } => {
                Some((path, true, req.file_id))
            }
            Route::SendTo(req) => Some((&req.path, false, req.file_id)),
            // Only what the credential may write can be granted.
            Route::Grant { path, .. } => Some((path, true, 0)),
            Route::Virtual(msg) => {
                let write = matches!(
                    msg,
                    Msg::Mkdir { .. } | Msg::Remove { .. } | Msg::Put { .. } | Msg::Open { .. }
                );
                match msg {
                    Msg::Stat { path }
                    | Msg::List { path }
                    | Msg::Sum { path }
                    | Msg::Mkdir { path, .. }
                    | Msg::Remove { path }
                    | Msg::Get { path, .. }
                    | Msg::Put { path, .. }
                    | Msg::Open { path, .. } => Some((path, write, transfer_of(msg))),
                    _ => None,
                }
            }
            Route::Bye
            | Route::Copies
            | Route::AbortCopy(_)
            | Route::Batch(_)
            | Route::Refuse { .. }
            | Route::PutRange { .. }
            | Route::Close { .. }
            | Route::Unexpected(_) => None,
        }
    }
}

/// The transfer id a refusal of `msg` carries (0 for requests without one).
fn transfer_of(msg: &Msg) -> u32 {
    match msg {
        Msg::Get { file_id, .. }
        | Msg::Put { file_id, .. }
        | Msg::Open { file_id, .. }
        | Msg::PutRange { file_id, .. }
        | Msg::Close { file_id, .. } => *file_id,
        _ => 0,
    }
}

/// Whether `msg` names a path of the memory root (`mem/…`).
fn names_virtual(msg: &Msg) -> bool {
    let path = match msg {
        Msg::Stat { path }
        | Msg::List { path }
        | Msg::Sum { path }
        | Msg::Mkdir { path, .. }
        | Msg::Remove { path }
        | Msg::Get { path, .. }
        | Msg::Put { path, .. }
        | Msg::Open { path, .. } => path,
        _ => return false,
    };
    crate::mem::classify(path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        Router {
            block: 1 << 20,
            ring: 4,
            mem: false,
        }
    }

    #[test]
    fn a_draining_server_refuses_all_but_bye_with_the_transfer_id() {
        let put = Msg::Put {
            file_id: 7,
            flags: 0,
            mode: 0o644,
            size: 1,
            mtime: None,
            path: "r/a".into(),
        };
        match router().route(put, true) {
            Route::Refuse { file_id, refusal } => {
                assert_eq!(file_id, 7);
                assert_eq!(refusal.code, ErrorCode::Unavailable);
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(router().route(Msg::Bye, true), Route::Bye));
        let stat = Msg::Stat { path: "r".into() };
        assert!(matches!(
            router().route(stat, true),
            Route::Refuse { file_id: 0, .. }
        ));
    }

    #[test]
    fn gets_expand_to_whole_file_gets_in_order_even_while_draining() {
        let gets = Msg::Gets {
            files: vec![(1, "r/a".into()), (2, "r/b".into())],
        };
        let Route::Batch(v) = router().route(gets, true) else {
            panic!("not a batch")
        };
        let ids: Vec<u32> = v
            .iter()
            .map(|m| match m {
                Msg::Get {
                    file_id,
                    offset: 0,
                    length: u64::MAX,
                    ..
                } => *file_id,
                m => panic!("{m:?}"),
            })
            .collect();
        assert_eq!(ids, [1, 2]);
    }

    #[test]
    fn put_flags_become_the_request_and_the_connection_sizes_come_along() {
        let put = Msg::Put {
            file_id: 3,
            flags: proto::PUT_RESUME | proto::PUT_FORCE,
            mode: 0o600,
            size: 9,
            mtime: Some(5),
            path: "r/a".into(),
        };
        let Route::Put(req, path) = router().route(put, false) else {
            panic!("not a PUT")
        };
        assert_eq!(path, "r/a");
        assert!(req.resume && req.force);
        assert_eq!((req.block, req.ring, req.size), (1 << 20, 4, 9));
        assert_eq!(req.ident().mtime, 5);
    }

    #[test]
    fn memory_paths_go_to_the_virtual_files_only_in_memory_mode() {
        let get = || Msg::Get {
            file_id: 1,
            offset: 0,
            length: u64::MAX,
            path: "mem/zero/1k".into(),
        };
        let mem = Router {
            mem: true,
            ..router()
        };
        assert!(matches!(mem.route(get(), false), Route::Virtual(_)));
        assert!(!mem.packs(&get()));
        assert!(matches!(router().route(get(), false), Route::Get { .. }));
        assert!(router().packs(&get()));
    }

    #[test]
    fn a_gets_keeps_the_open_pack_and_other_requests_send_it() {
        let gets = Msg::Gets {
            files: vec![(1, "r/a".into()), (2, "r/b".into())],
        };
        assert!(
            router().packs(&gets),
            "the next batch's files join the pack"
        );
        let ranged = Msg::Get {
            file_id: 1,
            offset: 5,
            length: u64::MAX,
            path: "r/a".into(),
        };
        assert!(!router().packs(&ranged));
        assert!(!router().packs(&Msg::Stat { path: "r".into() }));
    }

    #[test]
    fn replies_and_data_frames_are_not_requests() {
        let ok = Msg::Ok { file_id: 1 };
        assert!(matches!(router().route(ok, false), Route::Unexpected(_)));
    }
}
