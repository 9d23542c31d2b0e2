/*
 * tided with its state file on a file system that fills up (a small tmpfs, filled with a
 * file): failure detection and recovery go on in memory, tided says it is degraded (event,
 * tidectl status, metric), refuses operators' changes with the reason, and once the space
 * is freed it writes the whole in-memory truth back, so that a restart finds the job as
 * it is. Fake workers speak proto over DEALER sockets, like test_reliability. Needs root
 * (mount); a few seconds.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/coord_harness.h"

static void *ctx;
static coord_proc proc;
static char disk[272]; /* the tmpfs mount point, "" when not mounted */
static void *socks[8];
static int n_socks;

static void setup(void)
{
    ctx = zmq_ctx_new();
    cr_assert_eq(coord_tmpdir(&proc), 0);
    disk[0] = '\0';
}

static void teardown(void)
{
    coord_stop(&proc, SIGKILL);
    for (int i = 0; i < n_socks; i++)
        zmq_close(socks[i]);
    n_socks = 0;
    zmq_ctx_destroy(ctx);
    if (disk[0] != '\0')
        umount2(disk, MNT_DETACH);
    coord_cleanup(&proc);
}

static void *conn(int timeout_ms)
{
    void *s = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, timeout_ms);
    cr_assert_not_null(s);
    cr_assert_lt(n_socks, 8);
    socks[n_socks++] = s;
    return s;
}

typedef struct fake {
    void *sock;
    int32_t id;
} fake;

static fake w[2];   /* the job's two ranks */
static int w1_dead; /* rank 1 was "killed": it sends nothing more */

static void fake_up(fake *f, int rank)
{
    tide_msg_t m, r;
    f->sock = conn(5000);
    coord_mk_register(&m, "pool-a", rank, 2, "host0", rank, 1000 + rank);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0, "no register_ok for rank %d", rank);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK, "got %s", tide_msg_type_name(r.type));
    f->id = r.u.register_ok.worker;
    int short_ms = 20; /* from now on the fake reads what is there between heartbeats */
    zmq_setsockopt(f->sock, ZMQ_RCVTIMEO, &short_ms, sizeof short_ms);
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = f->id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "train");
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = 2;
    m.u.join.tp = 1;
    m.u.join.pp = 1;
    m.u.join.micro_batches = 1;
    cr_assert_eq(coord_send(f->sock, &m), 0);
}

static void beat(const fake *f, uint64_t gen)
{
    tide_msg_t m;
    coord_mk_heartbeat(&m, f->id, 5, gen);
    coord_send(f->sock, &m);
}

/* A heartbeat from every rank alive (the test's steps in between are short). */
static void beat_all(uint64_t gen)
{
    beat(&w[0], gen);
    if (!w1_dead)
        beat(&w[1], gen);
}

/* Status of the cluster: how long tided has been degraded (0: not) and worker id's state. */
static double degraded_ms(void *admin, int32_t id, tide_proto_worker_state_t *state)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_STATUS);
    cr_assert_eq(coord_call(admin, &m, &r), 0, "no status reply");
    cr_assert_eq(r.type, TIDE_MSG_STATUS_REPLY, "got %s", tide_msg_type_name(r.type));
    for (uint32_t i = 0; i < r.u.status_reply.n_rows; i++)
        if (r.u.status_reply.rows[i].worker == id && state != NULL)
            *state = r.u.status_reply.rows[i].state;
    double ms = r.u.status_reply.state_degraded_ms;
    tide_msg_clear(&r);
    return ms;
}

/* Events of kind (a glob) tided knows of, stored or held. */
static int count_events(void *admin, const char *kind)
{
    tide_msg_t m, r;
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    snprintf(m.u.events.kind, sizeof m.u.events.kind, "%s", kind);
    m.u.events.limit = 1000;
    cr_assert_eq(coord_call(admin, &m, &r), 0, "no events reply");
    cr_assert_eq(r.type, TIDE_MSG_EVENTS_REPLY, "got %s", tide_msg_type_name(r.type));
    int n = (int)r.u.events_reply.n_rows;
    tide_msg_clear(&r);
    return n;
}

/* The value of the metric line starting with name (followed by a space), or -1. */
static long scrape(int port, const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "cannot connect to metrics");
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    cr_assert_eq(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    static char text[1 << 17];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof text - 1 && (k = recv(fd, text + got, sizeof text - 1 - got, 0)) > 0)
        got += (size_t)k;
    close(fd);
    text[got] = '\0';
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(text, key);
    return at != NULL ? strtol(at + strlen(key), NULL, 10) : -1;
}

/* Fills the file system of path with a file `fill` until it has no room left. */
static void fill_disk(const char *fill)
{
    int fd = open(fill, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    static char buf[4096];
    ssize_t k;
    while ((k = write(fd, buf, sizeof buf)) > 0)
        beat_all(1);
    cr_assert_eq(errno, ENOSPC, "filling %s: %s", fill, strerror(errno));
    close(fd);
}

/* Submits offline jobs with long command lines until one is not acknowledged as saved
 * (the state file's writes fail); returns that reply's message in why. */
static void submit_until_refused(void *admin, char *why, size_t cap)
{
    static char arg[4000];
    memset(arg, 'x', sizeof arg - 1);
    char *argv[] = {"true", arg, arg, arg, arg};
    for (int i = 0; i < 2000; i++) {
        tide_msg_t m, r;
        tide_msg_init(&m, TIDE_MSG_SUBMIT);
        snprintf(m.u.submit.name, sizeof m.u.submit.name, "fill%04d", i);
        m.u.submit.kind = TIDE_JOB_COMMAND;
        m.u.submit.argv = argv;
        m.u.submit.argc = 5;
        beat_all(1);
        cr_assert_eq(coord_call(admin, &m, &r), 0, "submit %d got no answer", i);
        if (r.type == TIDE_MSG_ERROR) {
            cr_assert_eq(r.u.error.code, TIDE_ERR_IO, "submit %d: %s", i, r.u.error.message);
            snprintf(why, cap, "%s", r.u.error.message);
            tide_msg_clear(&r);
            return;
        }
        tide_msg_clear(&r);
    }
    cr_assert_fail("the full file system never refused a write");
}

/* Keeps w0 beating and answers its recovery's prepare and commit (w1 is silent); 1 once
 * done of gen 2 was sent within 10 s. */
static int recover_on(fake *w0)
{
    uint64_t t0 = tide_now_ns();
    while (tide_now_ns() - t0 < 10000000000ull) {
        tide_msg_t m, r;
        beat(w0, 1);
        if (coord_recv(w0->sock, &r) != 0)
            continue;
        int type = r.type;
        uint64_t gen = type == TIDE_MSG_PREPARE  ? r.u.prepare.gen
                       : type == TIDE_MSG_COMMIT ? r.u.commit.gen
                                                 : 0;
        tide_msg_clear(&r);
        if (type == TIDE_MSG_PREPARE && gen == 2) {
            tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
            m.u.prepare_ack.worker = w0->id;
            snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
            m.u.prepare_ack.gen = 2;
            m.u.prepare_ack.step = 5;
            cr_assert_eq(coord_send(w0->sock, &m), 0);
        }
        if (type == TIDE_MSG_COMMIT && gen == 2) {
            tide_msg_init(&m, TIDE_MSG_DONE);
            m.u.done.worker = w0->id;
            snprintf(m.u.done.job, sizeof m.u.done.job, "train");
            m.u.done.gen = 2;
            cr_assert_eq(coord_send(w0->sock, &m), 0);
            return 1;
        }
    }
    return 0;
}

Test(state_disk, full_disk_keeps_recovering_and_persists_when_freed, .init = setup,
     .fini = teardown, .timeout = 60)
{
    snprintf(disk, sizeof disk, "%s/disk", proc.dir);
    cr_assert_eq(mkdir(disk, 0700), 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=1m tide-state-test %s 2>/dev/null", disk);
    if (geteuid() != 0 || system(cmd) != 0) {
        disk[0] = '\0';
        cr_skip_test("needs root to mount a small tmpfs");
    }
    snprintf(proc.state, sizeof proc.state, "%s/state.db", disk);
    int port = coord_free_port();
    cr_assert_gt(port, 0, "no free loopback port");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    const char *extra[] = {"--heartbeat-ms", "200", "--miss-limit", "5", "--metrics", addr, NULL};
    int st = 0;
    cr_assert_eq(coord_start(&proc, TIDED_PATH, extra, &st), 0, "tided did not start (%d)", st);
    w1_dead = 0;
    fake_up(&w[0], 0);
    fake_up(&w[1], 1);
    void *admin = conn(5000);
    tide_msg_t m, r;
    for (int i = 0; i < 2; i++) {
        uint64_t t0 = tide_now_ns();
        int got = 0;
        while (!got && tide_now_ns() - t0 < 5000000000ull) {
            beat_all(0);
            if (coord_recv(w[i].sock, &r) == 0) {
                got = r.type == TIDE_MSG_LAYOUT;
                tide_msg_clear(&r);
            }
        }
        cr_assert(got, "rank %d got no layout", i);
    }

    /* the disk fills; the first change that cannot be saved is not acknowledged */
    char fill[500];
    snprintf(fill, sizeof fill, "%s/fill", disk);
    fill_disk(fill);
    char why[1024];
    submit_until_refused(admin, why, sizeof why);
    cr_expect_not_null(strstr(why, "cannot persist its state"), "%s", why);
    cr_expect_geq(count_events(admin, "state_degraded"), 1, "no state_degraded event");

    /* rank 1 dies while nothing can be saved: seen, and the job recovers on rank 0 */
    w1_dead = 1;
    cr_assert(recover_on(&w[0]), "no recovery while the state disk is full");
    tide_proto_worker_state_t ws = TIDE_WORKER_ONLINE;
    cr_assert_gt(degraded_ms(admin, w[1].id, &ws), 0, "status does not say degraded");
    cr_assert_eq(ws, TIDE_WORKER_FAILED, "the silent rank is not failed");
    cr_assert_geq(count_events(admin, "worker_failed"), 1);
    cr_assert_eq(scrape(port, "tide_state_degraded"), 1);
    cr_assert_gt(scrape(port, "tide_state_held_writes"), 0);
    uint64_t gen = 0, step = 0;
    int running = 0;
    for (int i = 0; i < 50 && gen != 2; i++) {
        beat(&w[0], 2);
        tide_sleep_ms(20);
        coord_job_state(admin, "train", &gen, &step, &running);
    }
    cr_assert_eq(gen, 2, "the recovery did not commit in memory");
    cr_assert_geq(count_events(admin, "recovered"), 1, "no recovered event while degraded");

    /* tidectl says so; an operator's change is refused with the reason */
    char out[8192];
    const char *status_args[] = {"status", NULL};
    cr_assert_eq(coord_tidectl(TIDECTL_PATH, proc.endpoint, status_args, out, sizeof out), 0);
    cr_assert_not_null(strstr(out, "state: DEGRADED"), "%s", out);
    const char *resize_args[] = {"resize", "train", "--dp", "1", NULL};
    cr_assert_neq(coord_tidectl_io(TIDECTL_PATH, proc.endpoint, resize_args, out, sizeof out, 1), 0,
                  "a resize was acknowledged while nothing can be saved");
    cr_assert_not_null(strstr(out, "cannot persist its state"), "%s", out);
    cr_assert_not_null(strstr(out, disk), "the refusal does not name the file system: %s", out);

    /* space again: the state is written back within a few retries */
    unlink(fill);
    int restored = 0;
    for (int i = 0; i < 100 && !restored; i++) {
        beat(&w[0], 2);
        tide_sleep_ms(50);
        restored = degraded_ms(admin, w[1].id, NULL) == 0;
    }
    cr_assert(restored, "still degraded 5 s after the space was freed");
    cr_assert_eq(scrape(port, "tide_state_degraded"), 0);
    cr_assert_eq(scrape(port, "tide_state_degraded_total"), 1);
    cr_assert_eq(count_events(admin, "state_restored"), 1);
    cr_assert_geq(count_events(admin, "recovered"), 1, "the held events were not written");
    tide_msg_init(&m, TIDE_MSG_CHECKPOINT);
    snprintf(m.u.checkpoint.job, sizeof m.u.checkpoint.job, "train");
    cr_assert_eq(coord_call(admin, &m, &r), 0);
    cr_assert(r.type != TIDE_MSG_ERROR || strstr(r.u.error.message, "persist") == NULL,
              "a change refused after the restore: %s", r.u.error.message);
    tide_msg_clear(&r);

    /* a restart finds the job as it is: generation 2 on rank 0, rank 1 failed */
    coord_stop(&proc, SIGKILL);
    cr_assert_eq(coord_start(&proc, TIDED_PATH, extra, &st), 0, "tided did not restart");
    void *admin2 = conn(5000);
    coord_job_state(admin2, "train", &gen, &step, &running);
    cr_assert_eq(gen, 2, "a restart found generation %llu, not the recovered 2",
                 (unsigned long long)gen);
    ws = TIDE_WORKER_ONLINE;
    cr_assert_eq(degraded_ms(admin2, w[1].id, &ws), 0);
    cr_assert_eq(ws, TIDE_WORKER_FAILED, "a restart forgot that rank 1 failed");
    cr_assert_geq(count_events(admin2, "state_degraded"), 1);
}
