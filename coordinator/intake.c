/*
 * coordinator/intake: per-connection accounting of what libzmq holds for a client (see
 * intake.h).
 */
#include <linux/tcp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "core/alloc.h"
#include "core/log.h"
#include "coordinator/intake.h"

#define CHECK_NS 20000000ull /* 20 ms between checks: a loopback client sends ~20 MB */
/* A sweep of every connection costs one getsockopt each: at 10,000 workers, one every
   20 ms took 65% of a core. libzmq holds a client's unread bytes in tided's memory, so a
   sweep is needed only once resident memory grew (by GROWN_SHARE of the limit since the
   last sweep), and at least every SWEEP_NS whatever it did (memory libzmq reuses from
   tided's own free heap costs nothing new, so that sweep need not be quick). A sweep that
   finds an unfinished message of more than SMALL_BYTES sweeps again at the next check, so
   an arriving large message is followed every 20 ms until it ends or is cut. */
#define SWEEP_NS    5000000000ull
#define GROWN_SHARE 4
#define SMALL_BYTES (64u << 10) /* an unfinished message this small is never cut for memory */

typedef struct conn {
    int open;      /* accepted and not closed (monitor events) */
    int read;      /* a message of it was read since the last check */
    uint64_t base; /* kernel bytes received from it at the last check that saw it read */
    long rss_base; /* tided's resident bytes when its unfinished bytes were last 0 */
} conn;

struct tide__intake {
    void *mon;      /* PAIR socket receiving the router's monitor events */
    conn *c;        /* indexed by fd */
    size_t cap;     /* entries in c */
    uint64_t limit; /* bytes */
    uint64_t next_ns, cut;
    uint64_t sweep_ns; /* the next sweep whatever the memory does */
    long rss_sweep;    /* resident bytes at the last sweep */
};

tide_status tide__intake_new(tide__intake **out, void *zctx, void *router, uint64_t limit)
{
    *out = NULL;
    if (limit == 0)
        return TIDE_OK;
    tide__intake *in = tide_calloc(1, sizeof *in);
    if (in == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting tided");
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://tided-intake-%p", (void *)in);
    in->limit = limit;
    in->mon = zmq_socket(zctx, ZMQ_PAIR);
    int linger = 0;
    if (in->mon != NULL)
        zmq_setsockopt(in->mon, ZMQ_LINGER, &linger, sizeof linger);
    if (in->mon == NULL ||
        zmq_socket_monitor(router, ep,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED) != 0 ||
        zmq_connect(in->mon, ep) != 0) {
        tide_status rc = tide_errorf(TIDE_ERR_IO, "cannot watch tided's connections: %s",
                                     zmq_strerror(zmq_errno()));
        tide__intake_destroy(&in);
        return rc;
    }
    *out = in;
    return TIDE_OK;
}

void tide__intake_destroy(tide__intake **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__intake *in = *self_p;
    if (in->mon != NULL)
        zmq_close(in->mon);
    tide_free(in->c);
    tide_free(in);
    *self_p = NULL;
}

void *tide__intake_socket(const tide__intake *in)
{
    return in != NULL ? in->mon : NULL;
}

/* The entry of fd, grown as needed; NULL when fd is out of range or memory is short. */
static conn *conn_of(tide__intake *in, int fd)
{
    if (fd < 0 || fd > (1 << 24))
        return NULL;
    if ((size_t)fd >= in->cap) {
        size_t cap = in->cap ? in->cap : 256;
        while (cap <= (size_t)fd)
            cap *= 2;
        conn *c = tide_reallocarray(in->c, cap, sizeof *c);
        if (c == NULL)
            return NULL;
        memset(c + in->cap, 0, (cap - in->cap) * sizeof *c);
        in->c = c;
        in->cap = cap;
    }
    return &in->c[fd];
}

/* tided's resident bytes now (0 when /proc cannot say). */
static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

void tide__intake_events(tide__intake *in)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, in->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev))
            zmq_msg_recv(&addr, in->mon, 0); /* the endpoint: unused */
        uint16_t kind = 0;
        int32_t fd = -1;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&kind, zmq_msg_data(&ev), 2);
            memcpy(&fd, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        conn *c = conn_of(in, fd);
        if (c != NULL) /* a new connection on a reused fd starts afresh, counted from now */
            *c = (conn){.open = kind == ZMQ_EVENT_ACCEPTED, .rss_base = rss_bytes()};
        zmq_msg_close(&addr);
        zmq_msg_close(&ev);
    }
}

/* Cuts connection fd: libzmq's read fails, it drops what it holds of the unfinished
   message and closes the connection (the client may reconnect). */
static void cut(tide__intake *in, int fd, const char *why)
{
    TIDE_WARN_LIMITED("server", "cut a client's connection (fd %d): %s", fd, why);
    shutdown(fd, SHUT_RDWR);
    in->c[fd].open = 0;
    in->cut++;
}

void tide__intake_read(tide__intake *in, int fd, int frames)
{
    if (in == NULL)
        return;
    conn *c = conn_of(in, fd);
    if (c == NULL || !c->open)
        return;
    c->read = 1;
    if (frames > TIDE__INTAKE_FRAMES_MAX) {
        char why[128];
        snprintf(why, sizeof why, "a message of %d frames (tide's have at most 3)", frames);
        cut(in, fd, why);
    }
}

/* Checks connection fd: unread bytes past the limit, or an unfinished message while
   tided's memory grew by the limit. 1 when fd has an unfinished message of more than
   SMALL_BYTES that was not cut. */
static int check_one(tide__intake *in, int fd, long rss)
{
    conn *c = &in->c[fd];
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0; /* not TCP (ipc://), or a kernel that does not count: not watched */
    uint64_t rx = ti.tcpi_bytes_received;
    if (c->read || rx < c->base) {
        c->base = rx;
        c->rss_base = rss;
        c->read = 0;
        return 0;
    }
    uint64_t unread = rx - c->base;
    if (unread == 0)
        c->rss_base = rss;
    long grown = rss - c->rss_base;
    char why[200];
    if (unread > in->limit)
        snprintf(why, sizeof why,
                 "%llu bytes sent past its last complete message, more than "
                 "--max-client-mb allows",
                 (unsigned long long)unread);
    else if (unread > SMALL_BYTES && grown > 0 && (uint64_t)grown > in->limit)
        snprintf(why, sizeof why,
                 "tided's memory grew by %ld MiB while it sent an unfinished "
                 "message (%llu bytes so far)",
                 grown >> 20, (unsigned long long)unread);
    else
        return unread > SMALL_BYTES; /* an unfinished message in flight: look again soon */
    cut(in, fd, why);
    return 0;
}

uint64_t tide__intake_check(tide__intake *in, uint64_t now_ns)
{
    if (in == NULL || now_ns < in->next_ns)
        return 0;
    in->next_ns = now_ns + CHECK_NS;
    long rss = rss_bytes();
    if (rss < in->rss_sweep) /* growth counts from the lowest point since the last sweep: */
        in->rss_sweep = rss; /* after a cut gave memory back, a new attack grows from there */
    if (now_ns < in->sweep_ns && rss - in->rss_sweep < (long)(in->limit / GROWN_SHARE))
        return 0;
    in->sweep_ns = now_ns + SWEEP_NS;
    in->rss_sweep = rss;
    uint64_t before = in->cut;
    int in_flight = 0;
    for (size_t fd = 0; fd < in->cap; fd++)
        if (in->c[fd].open)
            in_flight |= check_one(in, (int)fd, rss);
    if (in_flight) /* a large message arriving: every check sweeps until it ends or is cut */
        in->sweep_ns = now_ns;
    if (in->cut > before)
        malloc_trim(0); /* what libzmq freed goes back to the system, not only to malloc */
    return in->cut - before;
}

uint64_t tide__intake_cut(const tide__intake *in)
{
    return in != NULL ? in->cut : 0;
}
