/*
 * Connects that do not go through, in the server process (the client only makes one
 * plain connection at the end):
 *   - closing a socket whose connect waits for an exs_accept completes the connect with
 *     ECANCELED at once (not when the connect timeout expires);
 *   - connecting to the name of a listener this process closed, after a connection went
 *     through it, fails with ECONNREFUSED at once (not ETIMEDOUT after the timeout) and does
 *     not crash (ofi+shm crashed in fi_av_insert).
 * The connect timeout is 20 s; each of these must answer within LIMIT_MS.
 *
 *   connect server LISTEN_URL ADDR_FILE     connect client ADDR
 */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "common.h"

#define LIMIT_MS 2000

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Another listening URL like url: port 0 again, or the shm name with a suffix. */
static void other_url(char *out, size_t n, const char *url, const char *suffix)
{
    size_t len = strlen(url);
    if (len > 2 && strcmp(url + len - 2, ":0") == 0)
        snprintf(out, n, "%s", url);
    else
        snprintf(out, n, "%s-%s", url, suffix);
}

static int fresh_socket(void)
{
    int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(s);
    OK(exs_fcntl(s, EXS_F_SET_CONNECT_TIMEOUT, 20000));
    return s;
}

/* The next event on q within LIMIT_MS of `since`. */
static exs_event_t soon(exs_qhandle_t q, long since, const char *what)
{
    long left = since + LIMIT_MS - now_ms();
    exs_event_t ev;
    int n = exs_qdequeue(q, &ev, 1, left > 0 ? (int)left : 0);
    CHECK(n == 1, "no event within %d ms: %s", LIMIT_MS, what);
    return ev;
}

static void listen_at(const char *url, int *l, char *addr, size_t n)
{
    *l = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
    OK(*l);
    OK(exs_bind(*l, url));
    OK(exs_listen(*l, 4));
    OK(exs_getsockname(*l, addr, n));
}

/* Closing a connecting socket cancels its connect at once. */
static void close_while_connecting(exs_qhandle_t q, const char *url)
{
    char addr[512];
    int l;
    listen_at(url, &l, addr, sizeof addr);
    int s = fresh_socket();
    OK(exs_connect(s, addr, q, ctx_of(1)));
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL); /* the CONNECT reaches the listener, which does not accept */
    long t = now_ms();
    OK(exs_close(s));
    exs_event_t ev = soon(q, t, "the cancelled connect");
    errno = ev.err;
    CHECK(ev.type == EXS_EVT_CONNECT && ev.context == ctx_of(1) && ev.err == ECANCELED,
          "event %s err %d", evt_name(ev.type), ev.err);
    printf("%s: closing a connecting socket: ECANCELED after %ld ms\n", g_role, now_ms() - t);
    OK(exs_close(l));
}

/* Connecting to a listener this process closed is refused at once. */
static void connect_to_closed_listener(exs_qhandle_t q, const char *url)
{
    char addr[512];
    int l;
    listen_at(url, &l, addr, sizeof addr);
    int c = fresh_socket();
    OK(exs_connect(c, addr, q, ctx_of(2)));
    OK(exs_accept(l, q, ctx_of(3)));
    int a = -1, connected = 0;
    while (a < 0 || !connected) {
        exs_event_t ev = soon(q, now_ms(), "connect and accept");
        errno = ev.err;
        CHECK(ev.err == 0, "%s failed", evt_name(ev.type));
        if (ev.type == EXS_EVT_ACCEPT)
            a = ev.accepted;
        else if (ev.type == EXS_EVT_CONNECT)
            connected = 1;
    }
    OK(exs_close(c));
    OK(exs_close(a));
    OK(exs_close(l));
    /* Their close events. */
    for (int i = 0; i < 2; i++)
        CHECK(soon(q, now_ms(), "close events").type == EXS_EVT_CLOSE, "not a close event");
    int s = fresh_socket();
    long t = now_ms();
    OK(exs_connect(s, addr, q, ctx_of(4)));
    exs_event_t ev = soon(q, t, "the refused connect");
    errno = ev.err;
    CHECK(ev.type == EXS_EVT_CONNECT && ev.context == ctx_of(4) && ev.err == ECONNREFUSED,
          "event %s err %d", evt_name(ev.type), ev.err);
    printf("%s: connecting to a closed listener: ECONNREFUSED after %ld ms\n", g_role,
           now_ms() - t);
    OK(exs_close(s));
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage(argv[0]);
    int server = strcmp(argv[1], "server") == 0;
    g_role = server ? "connect server" : "connect client";
    OK(exs_init(EXS_VERSION));
    exs_qhandle_t q = exs_qcreate(64);
    OK(q);
    if (!server) {
        int s = exs_socket(AF_UNSPEC, EXS_SOCK_SEQPACKET, 0);
        OK(s);
        connect_to(s, argv[2], q);
        static char byte = 1;
        exs_mhandle_t mh = exs_mregister(&byte, 1, 0);
        OK(mh);
        OK(exs_send(s, &byte, 1, 0, mh, q, ctx_of(5)));
        wait_ok(q, EXS_EVT_SEND, ctx_of(5));
        wait_event(q, EXS_EVT_CLOSE, NULL);
        OK(exs_close(s));
        return 0;
    }
    if (argc != 4)
        usage(argv[0]);
    char url[600];
    other_url(url, sizeof url, argv[2], "cancel");
    close_while_connecting(q, url);
    other_url(url, sizeof url, argv[2], "closed");
    connect_to_closed_listener(q, url);
    int l = listen_on(argv[2], argv[3]);
    int s = accept_one(l, q);
    static char byte;
    exs_mhandle_t mh = exs_mregister(&byte, 1, 0);
    OK(mh);
    OK(exs_recv(s, &byte, 1, 0, mh, q, ctx_of(5)));
    wait_ok(q, EXS_EVT_RECV, ctx_of(5));
    OK(exs_close(s));
    OK(exs_close(l));
    return 0;
}
