/*
 * Ping-pong between two processes: the client sends a message, the server checks it and
 * answers with another, ROUNDS times, cycling through sizes that take every path
 * (immediate data, one fabric read, a large rendezvous). Both sides check every byte.
 *
 *   pingpong server LISTEN_URL ADDR_FILE     pingpong client ADDR
 */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#define ROUNDS 200
#define MAXLEN (1 << 20)

static const size_t sizes[] = {1, 64, 512, 513, 4096, 65536, MAXLEN};
#define NSIZES (sizeof sizes / sizeof sizes[0])

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int server = strcmp(argv[1], "server") == 0;
    g_role = server ? "pingpong server" : "pingpong client";
    OK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(64);
    OK(q);
    unsigned char *sbuf = alloc_mem(MAXLEN), *rbuf = alloc_mem(MAXLEN);
    exs_mhandle_t smh = exs_mregister(sbuf, MAXLEN, 0), rmh = exs_mregister(rbuf, MAXLEN, 0);
    OK(smh);
    OK(rmh);

    int s, l = -1;
    if (server) {
        if (argc != 4)
            usage(argv[0]);
        l = listen_on(argv[2], argv[3]);
        s = accept_one(l, q);
    } else {
        s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
        OK(s);
        connect_to(s, argv[2], q);
    }

    for (uint64_t r = 0; r < ROUNDS; r++) {
        size_t len = sizes[r % NSIZES];
        uint64_t ping = 2 * r, pong = 2 * r + 1;
        uint64_t mine = server ? pong : ping, theirs = server ? ping : pong;
        if (server) {
            /* Receive first, then answer. */
            OK(exs_recv(s, rbuf, MAXLEN, 0, rmh, q, ctx_of(1)));
            exs_event_t ev = wait_ok(q, EXS_EVT_RECV, ctx_of(1));
            CHECK(ev.len == len && ev.buf == rbuf, "round %llu: got %zu bytes", (unsigned long long)r, ev.len);
            CHECK(verify(rbuf, len, theirs) == len, "round %llu: bytes differ", (unsigned long long)r);
            fill(sbuf, len, mine);
            OK(exs_send(s, sbuf, len, 0, smh, q, ctx_of(2)));
            wait_ok(q, EXS_EVT_SEND, ctx_of(2));
        } else {
            /* Post the recv for the answer before sending, so it is ready when it comes. */
            OK(exs_recv(s, rbuf, MAXLEN, 0, rmh, q, ctx_of(1)));
            fill(sbuf, len, mine);
            OK(exs_send(s, sbuf, len, 0, smh, q, ctx_of(2)));
            exs_event_t sent = wait_ok(q, EXS_EVT_SEND, ctx_of(2));
            CHECK(sent.len == len && sent.buf == sbuf, "send event len %zu", sent.len);
            exs_event_t ev = wait_ok(q, EXS_EVT_RECV, ctx_of(1));
            CHECK(ev.len == len, "round %llu: got %zu bytes", (unsigned long long)r, ev.len);
            CHECK(verify(rbuf, len, theirs) == len, "round %llu: bytes differ", (unsigned long long)r);
        }
    }

    if (server) {
        /* The client closes; we see it, then close our side. */
        exs_event_t ev = wait_event(q, EXS_EVT_CLOSE, NULL);
        CHECK(ev.sock == s, "close event for %d", ev.sock);
        OK(exs_close(s));
        OK(exs_close(l));
    } else {
        OK(exs_close(s));
        exs_event_t ev = wait_event(q, EXS_EVT_CLOSE, NULL);
        CHECK(ev.sock == s && ev.err == 0, "close event for %d, err %d", ev.sock, ev.err);
    }
    OK(exs_mderegister(smh));
    OK(exs_mderegister(rmh));
    OK(exs_qdelete(q));
    free(sbuf);
    free(rbuf);
    printf("%s: %d round trips OK\n", g_role, ROUNDS);
    return 0;
}
