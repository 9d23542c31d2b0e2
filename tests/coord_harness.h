/*
 * Test and benchmark harness for tided: starts the real tided binary on a free
 * loopback port (tcp://127.0.0.1:* with --endpoint-file) with a state file in a
 * temporary directory, and speaks proto over DEALER sockets like a worker or
 * tidectl would. Header-only (static functions) so tests and benchmarks share
 * it without a library. Workload: a handful of sockets per test.
 */
#ifndef TIDE_TESTS_COORD_HARNESS_H
#define TIDE_TESTS_COORD_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "tmp_tree.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "proto/proto.h"

typedef struct coord_proc {
    pid_t pid;
    char dir[256];
    char endpoint[256];
    char state[320];
    char epfile[320];
} coord_proc;

/* A loopback TCP port free right now (the kernel picks it); -1 when none can be had. */
static inline int coord_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
    close(fd);
    return ok ? ntohs(sa.sin_port) : -1;
}

/* Creates a fresh temporary directory for one tided instance. */
static inline int coord_tmpdir(coord_proc *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/tide-coord-XXXXXX");
    if (mkdtemp(p->dir) == NULL)
        return -1;
    snprintf(p->state, sizeof p->state, "%s/state.db", p->dir);
    snprintf(p->epfile, sizeof p->epfile, "%s/endpoint", p->dir);
    return 0;
}

/*
 * Starts tided with the state file of p and extra flags (NULL-terminated);
 * waits (up to 10 s) for its endpoint file. Returns 0, or -1 when tided exited
 * or never listened (its exit status in *status when non-NULL).
 */
static inline int coord_start(coord_proc *p, const char *tided, const char *const *extra,
                              int *status)
{
    unlink(p->epfile);
    const char *argv[64];
    int n = 0;
    argv[n++] = tided;
    argv[n++] = "--endpoint";
    argv[n++] = "tcp://127.0.0.1:*";
    argv[n++] = "--endpoint-file";
    argv[n++] = p->epfile;
    argv[n++] = "--state";
    argv[n++] = p->state;
    argv[n++] = "--no-sync-full";
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test that started it */
        execv(tided, (char *const *)argv);
        _exit(127);
    }
    p->pid = pid;
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(p->epfile, "r");
        if (f != NULL) {
            int ok = fgets(p->endpoint, sizeof p->endpoint, f) != NULL;
            fclose(f);
            if (ok) {
                p->endpoint[strcspn(p->endpoint, "\n")] = '\0';
                return 0;
            }
        }
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            if (status)
                *status = st;
            return -1;
        }
        tide_sleep_ms(10);
    }
    return -1;
}

extern char **environ;

/*
 * Runs argv (argv[0] a path, NULL-terminated) and waits for it; its stdout (and its stderr
 * too when with_stderr) goes into out (cap bytes, NUL-terminated) when out is not NULL.
 * Returns its exit status, 128 + the signal that killed it, or -1 when it could not run.
 * Blocks; any thread.
 */
static inline int coord_run_io(const char *const *argv, char *out, size_t cap, int with_stderr)
{
    int fd[2];
    if (pipe(fd) != 0) {
        if (out != NULL && cap > 0)
            snprintf(out, cap, "cannot make a pipe for %s: %s", argv[0], strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    if (with_stderr) /* the reason of a refusal: tidectl prints it on stderr */
        posix_spawn_file_actions_adddup2(&fa, fd[1], 2);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        if (out != NULL && cap > 0)
            snprintf(out, cap, "cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    size_t got = 0;
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < k; i++)
            if (out != NULL && got + 1 < cap)
                out[got++] = buf[i];
    if (out != NULL && cap > 0)
        out[got] = '\0';
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* coord_run_io of `TIDECTL --endpoint ENDPOINT args...` (args NULL-terminated, at most 28). */
static inline int coord_tidectl_io(const char *tidectl, const char *endpoint,
                                   const char *const *args, char *out, size_t cap, int with_stderr)
{
    const char *argv[32] = {tidectl, "--endpoint", endpoint};
    int n = 3;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return coord_run_io(argv, out, cap, with_stderr);
}

/* coord_tidectl_io with stdout only. */
static inline int coord_tidectl(const char *tidectl, const char *endpoint, const char *const *args,
                                char *out, size_t cap)
{
    return coord_tidectl_io(tidectl, endpoint, args, out, cap, 0);
}

/* Sends sig to tided and reaps it; returns its wait status. */
static inline int coord_stop(coord_proc *p, int sig)
{
    int st = 0;
    if (p->pid > 0) {
        kill(p->pid, sig);
        waitpid(p->pid, &st, 0);
        p->pid = 0;
    }
    return st;
}

/* Removes the temporary directory and everything in it (tided's files and the test's). */
static inline void coord_cleanup(coord_proc *p)
{
    if (p->dir[0] != '\0')
        tmp_tree_rm(p->dir);
}

/*
 * A DEALER connected to endpoint; with keyfile (a "public/secret" pair file)
 * and server_pub (Z85) it uses CURVE. Receive timeout timeout_ms.
 */
static inline void *coord_connect(void *ctx, const char *endpoint, const char *client_pub,
                                  const char *client_secret, const char *server_pub, int timeout_ms)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, hwm = 1 << 20;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    /* a DEALER without a peer (refused handshake) would block a send forever */
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (server_pub != NULL) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, 41);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, client_pub, 41);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, client_secret, 41);
    }
    if (zmq_connect(s, endpoint) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

static inline int coord_send_raw(void *sock, const void *data, size_t len)
{
    return zmq_send(sock, data, len, 0) < 0 ? -1 : 0;
}

static inline int coord_send(void *sock, const tide_msg_t *m)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    if (tide_proto_encode(m, &b) != TIDE_OK) {
        tide_proto_buf_destroy(&b);
        return -1;
    }
    int rc = coord_send_raw(sock, b.data, b.len);
    tide_proto_buf_destroy(&b);
    return rc;
}

/*
 * Sockets a test opened and has not closed, for a fixture's teardown: a failed assertion
 * leaves a test before its own zmq_close calls, and zmq_ctx_destroy then waits for those
 * sockets forever (the test hangs until ctest's timeout instead of failing). A test file
 * opts in with
 *   #define coord_connect(...) coord_tracked(coord_connect(__VA_ARGS__))
 *   #define zmq_close(sock)    coord_close_tracked(sock)
 * after this header (a macro is not expanded again inside its own expansion), and calls
 * coord_close_all() before zmq_ctx_destroy.
 */
static void *coord_socks[256];
static int coord_n_socks;

static inline void *coord_tracked(void *sock)
{
    if (sock != NULL && coord_n_socks < (int)(sizeof coord_socks / sizeof coord_socks[0]))
        coord_socks[coord_n_socks++] = sock;
    return sock;
}

static inline int coord_close_tracked(void *sock)
{
    for (int i = 0; i < coord_n_socks; i++)
        if (coord_socks[i] == sock) {
            coord_socks[i] = coord_socks[--coord_n_socks];
            break;
        }
    return zmq_close(sock);
}

/* Closes (linger 0) what the test left open. */
static inline void coord_close_all(void)
{
    int linger = 0;
    while (coord_n_socks > 0) {
        void *s = coord_socks[--coord_n_socks];
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(s);
    }
}

/* Receives one message (within the socket's timeout); 0 ok, -1 timeout or bad message. */
static inline int coord_recv(void *sock, tide_msg_t *out)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        tide_msg_init(out, TIDE_MSG_NONE);
        return -1;
    }
    tide_status rc = tide_proto_decode(zmq_msg_data(&m), zmq_msg_size(&m), out);
    zmq_msg_close(&m);
    return rc == TIDE_OK ? 0 : -1;
}

/* Receives one message arriving within ms; 0 ok, -1 none (or a bad one). */
static inline int coord_recv_within(void *sock, tide_msg_t *out, int ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) {
        tide_msg_init(out, TIDE_MSG_NONE);
        return -1;
    }
    return coord_recv(sock, out);
}

/* Receives until a message of type t arrives (others are dropped); 0 ok, -1 timeout. */
static inline int coord_recv_type(void *sock, tide_msg_type_t t, tide_msg_t *out)
{
    for (int i = 0; i < 64; i++) {
        if (coord_recv(sock, out) != 0)
            return -1;
        if (out->type == t)
            return 0;
        tide_msg_clear(out);
    }
    return -1;
}

/* Sends a request and waits for its reply. */
static inline int coord_call(void *sock, const tide_msg_t *req, tide_msg_t *reply)
{
    if (coord_send(sock, req) != 0)
        return -1;
    return coord_recv(sock, reply);
}

/* The generation, step and whether it is running of the online job named job, from a jobs
   request on sock; 0, or -1 without a reply (*gen 0 when the job is not listed). */
static inline int coord_job_state(void *sock, const char *job, uint64_t *gen, uint64_t *step,
                                  int *running)
{
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_JOBS);
    *gen = *step = 0;
    *running = 0;
    if (coord_call(sock, &q, &r) != 0 || r.type != TIDE_MSG_JOBS_REPLY) {
        tide_msg_clear(&r);
        return -1;
    }
    for (uint32_t i = 0; i < r.u.jobs_reply.n_rows; i++) {
        const tide_proto_job_row_t *row = &r.u.jobs_reply.rows[i];
        if (strcmp(row->name, job) != 0)
            continue;
        *gen = row->gen;
        *step = row->step;
        *running = row->state == TIDE_JOB_RUNNING;
    }
    tide_msg_clear(&r);
    return 0;
}

static inline void coord_mk_register(tide_msg_t *m, const char *pool, int rank, int size,
                                     const char *host, int device, int pid)
{
    tide_msg_init(m, TIDE_MSG_REGISTER);
    snprintf(m->u.reg.pool, sizeof m->u.reg.pool, "%s", pool);
    m->u.reg.rank = rank;
    m->u.reg.size = size;
    snprintf(m->u.reg.host, sizeof m->u.reg.host, "%s", host);
    m->u.reg.device = device;
    m->u.reg.mem_bytes = 80ull << 30;
    m->u.reg.kind = TIDE_DEVICE_GPU;
    m->u.reg.pid = pid;
}

static inline void coord_mk_heartbeat(tide_msg_t *m, int32_t worker, uint64_t step, uint64_t gen)
{
    tide_msg_init(m, TIDE_MSG_HEARTBEAT);
    m->u.heartbeat.worker = worker;
    m->u.heartbeat.step = step;
    m->u.heartbeat.gen = gen;
    m->u.heartbeat.step_ms = 100;
    m->u.heartbeat.bubble_ms = 10;
}

#endif /* TIDE_TESTS_COORD_HARNESS_H */
