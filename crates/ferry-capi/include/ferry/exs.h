/*
 * ferry/exs.h — Extended Sockets (EXS): the C API of libferry.
 *
 * Asynchronous, message-oriented sockets with explicit memory registration and event
 * queues, after the Open Group's Extended Sockets API (ES-API) and the UNH-EXS additions
 * (bind, listen, fcntl, persistent transfers, offsets). One API over every fabric ferry
 * drives; the address URL picks the driver:
 *
 *     tcp://127.0.0.1:7000        ferry's native TCP driver
 *     ofi+tcp://127.0.0.1:7000    libfabric, tcp provider (ofi+verbs://, ofi+efa://, ...)
 *     ofi+shm://NAME              libfabric shared memory, one host
 *
 * Conventions
 *   - Sockets, queues and memory registrations are handles: small positive ints, like file
 *     descriptors, in one namespace. 0 and negative values are never valid handles, and a
 *     handle is not reused until 2^31 handles have been made.
 *   - A call that fails returns -1 and sets errno. Any call on a handle that is invalid,
 *     closed, or of the wrong kind (a queue passed as a socket) fails with EBADF.
 *   - Data operations (send, recv, sendfile), connect and accept are asynchronous: the call
 *     only starts them; each ends with exactly one event on the queue it names (a
 *     persistent send with EXS_NOTIFY_ON_READ also reports each read of it). The error of
 *     an operation that started is in its event's err, not in errno.
 *   - Every function is thread-safe.
 *
 * Memory rules
 *   Data moves directly between registered user memory and the fabric. Memory given to
 *   exs_mregister must stay allocated (not freed, unmapped or reallocated) until
 *   exs_mderegister on its handle has returned 0. A buffer passed to exs_send or exs_recv
 *   belongs to ferry until its completion event has been dequeued: do not touch it before.
 *
 * Contract details (one answer each; tests/c checks those marked *)
 *   - Persistent send buffers: unlike other buffers, a buffer exposed with EXS_PERSISTENT
 *     may be written while exposed (a producer updating values a peer samples). A peer's
 *     exs_recv_offset copies whatever bytes are there when its read happens, with no
 *     atomicity across bytes: put your own version or sequence field around the data.
 *   - EXS_EVT_SEND len: the bytes the receiver took (see exs_event_t), and nothing else.
 *   - exs_recv_offset of fewer bytes than the persistent send has from offset: err 0,
 *     len = the bytes read (a sample, not a truncation: never EMSGSIZE). *
 *   - exs_recv_offset at offset == the buffer's size: err 0, len 0. Past the size: err
 *     EINVAL (a bad offset). exs_send_offset that does not fit the peer's persistent recv
 *     buffer: err EMSGSIZE (a message too long for its buffer), nothing written. *
 *   - Flags: unknown bits fail the call synchronously (-1/EINVAL, no event); a known but
 *     invalid combination (EXS_NOTIFY_ON_READ without EXS_PERSISTENT) starts the operation
 *     and fails it in its event with EINVAL. *
 *   - Data calls on a connection that has ended (its EXS_EVT_CLOSE reported) return 0 and
 *     complete at once with err ENOTCONN. *
 *   - exs_connect completes when the peer's exs_accept has taken the connection and the
 *     EXS handshake is done, not when the fabric connection is up: the connect timeout
 *     covers the time the connection waits in the server's backlog.
 *   - exs_qdelete while other threads wait in exs_qdequeue on q: they wake and fail with
 *     EBADF. *
 *   - exs_bind: a host (or shm name) longer than 255 bytes is EINVAL; nothing is resolved
 *     there; exs_listen fails with EADDRNOTAVAIL if the host does not resolve. *
 *   - exs_listen: a backlog above 4096 is taken as 4096, without error (as listen(2) caps
 *     it at somaxconn).
 *   - EXS_F_SET_SMALL_PACKET_MAX on both sides: a connection uses the smaller of the two
 *     for both directions.
 *   - ofi+shm: each socket's libfabric endpoint maps a region /dev/shm/NAME (16 MiB on
 *     libfabric 1.17), removed when its last socket closes. A process that exits without
 *     exs_close leaves it behind: a later listener of the same name replaces it, and the
 *     regions of connecting sockets (ferryc-PID-...) of processes no longer alive are
 *     removed by the next process that opens ofi+shm for a connect.
 *
 * Build: cc app.c $(pkg-config --cflags --libs ferry)
 * Guide: docs/exs-c.md
 */
#ifndef FERRY_EXS_H
#define FERRY_EXS_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ------------------------------------------------------------------------ */

/** The API version this header describes. */
#define EXS_VERSION_MAJOR 1
#define EXS_VERSION_MINOR 0
/** Packs a version for exs_init. */
#define EXS_MAKE_VERSION(major, minor) (((major) << 16) | (minor))
/** Pass this to exs_init. */
#define EXS_VERSION EXS_MAKE_VERSION(EXS_VERSION_MAJOR, EXS_VERSION_MINOR)

/* ---- Types and constants ------------------------------------------------------------- */

/** An event queue handle (from exs_qcreate). */
typedef int exs_qhandle_t;
/** A memory registration handle (from exs_mregister). */
typedef int exs_mhandle_t;

/** What exs_qcreate and exs_mregister return on failure. */
#define EXS_QH_INVALID (-1)
#define EXS_MH_INVALID (-1)

/** The socket type EXS provides: reliable, ordered messages with boundaries. */
#define EXS_SOCK_SEQPACKET SOCK_SEQPACKET

/** Flags of exs_send / exs_recv (and their _offset forms, and exs_sendfile). */
/** The buffer stays posted: the peer receives from (or sends into) it again and again. */
#define EXS_PERSISTENT 1
/** With EXS_PERSISTENT on a send: an EXS_EVT_READ_NOTIFY each time the peer reads it. */
#define EXS_NOTIFY_ON_READ 2

/** Event types (exs_event_t.type). */
#define EXS_EVT_SEND 1        /**< a send completed; buf and len as posted */
#define EXS_EVT_RECV 2        /**< a recv completed; len = bytes received */
#define EXS_EVT_ACCEPT 3      /**< an exs_accept completed; the new socket is in accepted */
#define EXS_EVT_CONNECT 4     /**< an exs_connect completed (err != 0: it failed) */
#define EXS_EVT_READ_NOTIFY 5 /**< the peer read a persistent EXS_NOTIFY_ON_READ send */
#define EXS_EVT_CLOSE 6       /**< the connection ended (err: see exs_event_t) */

/**
 * A completion or notification, as exs_qdequeue returns it.
 *
 * - type:     EXS_EVT_*.
 * - sock:     the socket the operation was called on (for EXS_EVT_ACCEPT the listening
 *             socket; for EXS_EVT_CLOSE the socket that closed).
 * - accepted: EXS_EVT_ACCEPT: the new connected socket (-1 if err != 0). Its own events
 *             (close) go to the queue the accept named. Otherwise -1.
 * - err:      0, or an errno value. EXS_EVT_CLOSE: 0 if exs_close was called here first,
 *             EPIPE if the peer closed with exs_close, ECONNRESET if the connection was
 *             lost, EPROTO / EPROTONOSUPPORT if the peer broke the protocol or
 *             speaks another major version. Operations: EMSGSIZE (a message larger than the recv buffer: the
 *             buffer holds its prefix, len = buffer length; or a send past the end of the
 *             peer's persistent recv buffer), EINVAL (bad flags or offset), ECANCELED
 *             (the socket was closed here first), EPIPE (the peer closed), ECONNRESET
 *             (the connection was lost), ENOTCONN (posted after the connection ended),
 *             ECONNREFUSED / ETIMEDOUT (connect), EPROTO, EIO.
 *             A peer that dies without exs_close (even killed with transfers in flight)
 *             is noticed at once on tcp, and on ofi drivers after its keepalive heard
 *             nothing for FERRY_OFI_PEER_TIMEOUT seconds (default 10, fractions allowed;
 *             read when a socket first opens the driver): then every pending operation
 *             completes exactly once with ECONNRESET and the close event says ECONNRESET.
 * - buf:      the buffer pointer given to the operation (NULL for exs_sendfile, accept,
 *             connect and close; the persistent buffer for EXS_EVT_READ_NOTIFY).
 * - len:      bytes transferred: for EXS_EVT_SEND the bytes the receiver took (fewer than
 *             posted, with err 0, if its recv buffer was shorter), for EXS_EVT_RECV the
 *             bytes written, for EXS_EVT_READ_NOTIFY the bytes read.
 * - context:  the ctx given to the call (NULL for EXS_EVT_CLOSE).
 */
typedef struct exs_event {
    int type;
    int sock;
    int accepted;
    int err;
    void *buf;
    size_t len;
    void *context;
} exs_event_t;

/** exs_poll's entry; the EXS_POLL* bits have poll(2)'s values. */
struct exs_pollfd {
    int fd;        /**< a socket (or queue) handle; negative entries are skipped */
    short events;  /**< EXS_POLLIN | EXS_POLLOUT wanted */
    short revents; /**< what is ready; EXS_POLLERR, EXS_POLLHUP, EXS_POLLNVAL always */
};

#define EXS_POLLIN POLLIN
#define EXS_POLLOUT POLLOUT
#define EXS_POLLERR POLLERR
#define EXS_POLLHUP POLLHUP
#define EXS_POLLNVAL POLLNVAL

/** exs_fcntl commands. GET returns the value; SET takes it in arg and returns 0. */
#define EXS_F_GET_SEND_CREDITS 1      /**< advertisements this side may have outstanding */
#define EXS_F_SET_SEND_CREDITS 2      /**< 1..65535 (default 16) */
#define EXS_F_GET_RECV_CREDITS 3      /**< advertisements this side accepts outstanding */
#define EXS_F_SET_RECV_CREDITS 4      /**< 1..65535 (default 16) */
#define EXS_F_GET_SMALL_PACKET_MAX 5  /**< messages up to this size travel as immediate data */
#define EXS_F_SET_SMALL_PACKET_MAX 6  /**< 0..65536 bytes (default 512) */
#define EXS_F_GET_PUSH 7              /**< 1: sender-push rendezvous; 0: receiver pulls */
#define EXS_F_SET_PUSH 8              /**< 0 or 1 (default: the driver's faster one, pull) */
#define EXS_F_GET_CONNECT_TIMEOUT 9   /**< milliseconds an exs_connect may take */
#define EXS_F_SET_CONNECT_TIMEOUT 10  /**< 1..INT_MAX ms (default 30000) */

/* ---- Library ------------------------------------------------------------------------- */

/**
 * Checks that the program was built against a header this library implements. Call it
 * once, first, with EXS_VERSION (the ES-API requires it; this library does not enforce
 * the order). Fails with ENOTSUP if the major version differs or the header's minor
 * version is newer than the library's.
 */
int exs_init(int version);

/* ---- Sockets ------------------------------------------------------------------------- */

/**
 * Creates an EXS socket and returns its handle. domain: AF_UNSPEC, AF_INET or AF_INET6
 * (informational: the driver and address family come from the URL given to exs_bind or
 * exs_connect), else EAFNOSUPPORT. type: EXS_SOCK_SEQPACKET, else EINVAL. protocol: 0,
 * else EPROTONOSUPPORT.
 */
int exs_socket(int domain, int type, int protocol);

/**
 * Names the address a listening socket will use, e.g. "tcp://0.0.0.0:7000" (port 0 picks
 * a free port: read it with exs_getsockname after exs_listen) or "ofi+shm://myservice".
 * The address is parsed now (EINVAL if malformed) and bound by exs_listen, so settings
 * made with exs_fcntl in between still apply. Only for sockets that will listen: a bound
 * socket cannot connect (EINVAL). EINVAL if already bound; EISCONN if connected.
 */
int exs_bind(int sock, const char *url);

/**
 * Binds the address given to exs_bind and starts accepting connections: up to backlog
 * (<= 0: 16; at most 4096) wait, already connected at the fabric level, for exs_accept.
 * EDESTADDRREQ if not bound; EADDRINUSE and other bind errors of the driver. Calling it
 * again on a listening socket changes the backlog.
 */
int exs_listen(int sock, int backlog);

/**
 * Asks for the next connection on a listening socket. Returns 0 at once; an EXS_EVT_ACCEPT
 * on q follows, with the new connected socket in its accepted field (sock is the listening
 * socket, context is ctx). The new socket's own events (EXS_EVT_CLOSE) go to q too, and it
 * has the listener's fcntl settings. Several accepts may be pending; each takes one
 * connection, in order. Closing the listener fails the pending ones with ECANCELED.
 * EINVAL if sock is not listening.
 */
int exs_accept(int sock, exs_qhandle_t q, void *ctx);

/**
 * Connects to the listener at url. Returns 0 at once (EINVAL for a malformed URL or bad
 * fcntl settings, EISCONN if connected, EALREADY if connecting); an EXS_EVT_CONNECT on q
 * follows: err 0 when the connection and the EXS handshake are up, else why it failed
 * (ECONNREFUSED, ETIMEDOUT after EXS_F_SET_CONNECT_TIMEOUT, ...), after which another
 * exs_connect may be tried on the same socket. The socket's own events (EXS_EVT_CLOSE) go
 * to q. Closing the socket meanwhile makes the connect complete with ECANCELED at once.
 * Nothing listening at url is ECONNREFUSED as soon as the driver can tell: at once on tcp
 * and ofi+shm, within about 250 ms on ofi+tcp.
 */
int exs_connect(int sock, const char *url, exs_qhandle_t q, void *ctx);

/**
 * Sends buf[0..len) as one message. buf..buf+len must lie inside the registration mh
 * (EFAULT otherwise); the socket must be connected (ENOTCONN). The completion, with buf
 * and ctx, is an EXS_EVT_SEND on q. Sends are delivered in order; up to
 * EXS_F_SET_SMALL_PACKET_MAX bytes travel as immediate data, larger ones are read by the
 * peer directly from buf. flags: 0, EXS_PERSISTENT (buf stays exposed: the peer may
 * receive from it repeatedly, at offsets with exs_recv_offset, until the socket closes,
 * when the send completes with ECANCELED), or EXS_PERSISTENT | EXS_NOTIFY_ON_READ (plus an
 * EXS_EVT_READ_NOTIFY on q after each read). Other bits: EINVAL.
 */
int exs_send(int sock, void *buf, size_t len, int flags, exs_mhandle_t mh, exs_qhandle_t q,
             void *ctx);

/**
 * Receives the next message into buf[0..len) (inside registration mh, else EFAULT). An
 * EXS_EVT_RECV on q completes it; its len is the message length. A message longer than len
 * completes with err EMSGSIZE, the buffer holding its first len bytes. flags:
 * 0 or EXS_PERSISTENT (the buffer stays posted; every later peer send, which must then use
 * exs_send_offset or exs_send, writes into it directly and no recv event is reported until
 * the socket closes).
 */
int exs_recv(int sock, void *buf, size_t len, int flags, exs_mhandle_t mh, exs_qhandle_t q,
             void *ctx);

/** One segment of a noncontiguous message (exs_sendv, exs_recvv). */
struct exs_iovec {
    void *iov_base;
    size_t iov_len;
};

/**
 * Sends the bytes of iov[0..iovcnt), in list order, as one message (like exs_send; matched
 * by an exs_recv or exs_recvv). Every segment lies in the memory registered as mh. Large
 * segments go zero-copy (the peer gathers them by RMA, EXS 1.1); tiny ones (below the
 * driver's measured pack threshold) are packed first. EXS_EVT_SEND's buf is iov[0].iov_base.
 * -1/EFAULT if a segment is outside mh, -1/EINVAL for iovcnt < 0 or above 2^20.
 */
int exs_sendv(int sock, const struct exs_iovec *iov, int iovcnt, exs_mhandle_t mh,
              exs_qhandle_t q, void *ctx);

/**
 * Receives the next message into iov[0..iovcnt), in list order (like exs_recv; the peer
 * may use exs_send or exs_sendv). A message longer than the segments fills them and
 * completes with err EMSGSIZE; nothing outside them is written. -1/EINVAL if two segments
 * overlap, -1/EFAULT if one is outside mh.
 */
int exs_recvv(int sock, const struct exs_iovec *iov, int iovcnt, exs_mhandle_t mh,
              exs_qhandle_t q, void *ctx);

/**
 * Like exs_send, writing buf[0..len) at byte offset `offset` of the peer's persistent recv
 * buffer. A message that does not fit there completes with err EMSGSIZE (nothing written).
 */
int exs_send_offset(int sock, void *buf, size_t len, uint64_t offset, int flags,
                    exs_mhandle_t mh, exs_qhandle_t q, void *ctx);

/**
 * Like exs_recv, reading from byte offset `offset` of the peer's persistent send buffer.
 * Reads up to len bytes (fewer at the end of the buffer: the event's len says how many);
 * an offset past the end completes with err EINVAL.
 */
int exs_recv_offset(int sock, void *buf, size_t len, uint64_t offset, int flags,
                    exs_mhandle_t mh, exs_qhandle_t q, void *ctx);

/**
 * Sends len bytes of the open file fd from offset as one message, without copying them
 * through user space (the range is mapped from the page cache and read by the peer). The
 * file needs no registration; fd may be closed once this returns. EINVAL if the range lies
 * outside the file; the file must not be truncated below offset+len until the
 * EXS_EVT_SEND (buf NULL) arrives on q. flags as exs_send.
 */
int exs_sendfile(int sock, int fd, off_t offset, size_t len, int flags, exs_qhandle_t q,
                 void *ctx);

/**
 * Waits up to timeout_ms (negative: forever; 0: just look) until one of fds is ready, like
 * poll(2); returns how many entries have revents set (0 on timeout).
 *   connected socket: EXS_POLLIN  a message waits for a recv;
 *                     EXS_POLLOUT a send would go out at once (a send credit is free);
 *                     EXS_POLLHUP the connection ended.
 *   listening socket: EXS_POLLIN  a connection waits in the backlog, so an exs_accept
 *                     completes without waiting for a peer.
 *   queue handle:     EXS_POLLIN  an event waits.
 *   a socket whose last connect failed: EXS_POLLERR. Fresh or connecting sockets: nothing.
 *   not a valid handle: EXS_POLLNVAL.
 * Event queues are the fast path; exs_poll looks at its sockets in short sleeps (up to
 * 1 ms), so use it for readiness, not for every message.
 * As poll(2): nfds larger than RLIMIT_NOFILE's soft limit (e.g. (nfds_t)-1) fails with
 * EINVAL before any entry is read; fds NULL with nfds > 0 fails with EFAULT.
 */
int exs_poll(struct exs_pollfd *fds, nfds_t nfds, int timeout_ms);

/**
 * Gets or sets a socket setting (EXS_F_*). Not variadic (unlike fcntl(2)): the library is
 * written in Rust, which cannot define C variadic functions, and every command takes at
 * most one integer. Settings change only before the socket connects or listens: afterwards
 * SET fails with EISCONN (connecting or connected) or EINVAL (listening). Out-of-range
 * values and unknown commands: EINVAL. Both sides' credits are exchanged at connect.
 */
int exs_fcntl(int sock, int cmd, long arg);

/**
 * Closes a socket; the handle is invalid at once (a second exs_close fails with EBADF).
 * Connected: the peer is told; pending operations complete with ECANCELED and an
 * EXS_EVT_CLOSE (err 0) follows on the socket's queue, unless the connection had already
 * ended (then its EXS_EVT_CLOSE was reported then). Returns after the close message has
 * left (at most about a second). Listening: pending accepts complete with ECANCELED.
 * Connecting: the connect completes with ECANCELED.
 */
int exs_close(int sock);

/**
 * Writes the socket's own address as a NUL-terminated URL into buf (len bytes; ERANGE if
 * too small): the local end of a connection, the bound address of a listener (port
 * resolved), or the URL given to exs_bind. ENOTCONN for fresh sockets.
 */
int exs_getsockname(int sock, char *buf, size_t len);

/** Writes the peer's address as a URL into buf (ERANGE if too small); ENOTCONN if not
 * connected. */
int exs_getpeername(int sock, char *buf, size_t len);

/* ---- Event queues -------------------------------------------------------------------- */

/**
 * Creates an event queue. Any number of sockets and operations may report to one queue.
 * depth is a hint (the queue grows as needed); negative: EINVAL. Returns EXS_QH_INVALID
 * (-1) and errno on failure.
 */
exs_qhandle_t exs_qcreate(int depth);

/**
 * Takes up to max (> 0, else EINVAL) events from q into evs, waiting up to timeout_ms
 * (negative: forever; 0: do not wait) for the first. Returns how many were taken; 0 on
 * timeout. Events of one socket come in the order they happened, and an
 * EXS_EVT_ACCEPT/CONNECT comes before any event of the socket it announces.
 * Busy polling: with timeout_ms 0 the calling thread itself handles the completions its
 * queue's sockets have (no progress-thread wake-up or tick in between) and yields the CPU
 * if there were none, so a loop of zero-timeout calls sees an event as soon as the driver
 * has it; while such a loop runs, the sockets' progress threads stand by, and take over
 * within half a millisecond once it stops. (The drivers' own threads still move bytes.)
 * A blocking call (timeout_ms != 0) does the same for up to 50 us after the last
 * completion before it sleeps. Measured with tests/c/latency.c, 10 B one-way, medians of
 * 500: polling 13-35 us, blocking 13-60 us on tcp, ofi+tcp and ofi+shm.
 */
int exs_qdequeue(exs_qhandle_t q, exs_event_t *evs, int max, int timeout_ms);

/**
 * Deletes a queue. Delete it only once nothing reports to it any more (its sockets
 * closed and their events dequeued): events arriving later are lost, and the memory of
 * operations whose events are lost stays busy for exs_mderegister until their sockets
 * close. Threads waiting in exs_qdequeue on q wake and fail with EBADF.
 */
int exs_qdelete(exs_qhandle_t q);

/**
 * A file descriptor that is readable (poll, select, epoll) exactly while q holds events:
 * wait on it with your other descriptors, then exs_qdequeue with timeout 0. Owned by the
 * queue: do not close it; it stays valid until exs_qdelete.
 */
int exs_qfd(exs_qhandle_t q);

/* ---- Memory -------------------------------------------------------------------------- */

/**
 * Registers addr[0..len) for use as send and recv buffers (len > 0, addr non-NULL, flags
 * 0; else EINVAL) and returns its handle (EXS_MH_INVALID on failure). Any part of it may
 * be a buffer. The fabric registration itself happens on first use with each socket (per
 * fabric domain) and is cached until exs_mderegister. The memory must stay allocated
 * until exs_mderegister succeeds.
 */
exs_mhandle_t exs_mregister(void *addr, size_t len, int flags);

/**
 * Deregisters memory. EBUSY while an operation still holds it: one whose completion event
 * has not been dequeued yet (a persistent operation holds it until its socket closes).
 * After 0 the memory may be freed and the handle is invalid.
 */
int exs_mderegister(exs_mhandle_t mh);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_EXS_H */
