/*
 * MPI integration test of host heartbeats (worker/hostbeat.c) with the real tided
 * (--heartbeat-ms 200, --miss-limit 8: failure after 1.6 s) and its Prometheus metrics.
 * Four ranks on this host. Usage, under mpirun (with --enable-recovery for the scenarios
 * that kill a rank): test_worker_hostbeat TIDED SCENARIO, a row of
 * tests/scenarios/test_worker_hostbeat.h (--list prints them):
 *   count   over 3 s tided gets one heartbeat message per period carrying the four ranks'
 *           heartbeats (tide_heartbeat_messages_total against tide_heartbeats_total);
 *           the same ranks with TIDE_HEARTBEAT_AGGREGATE=0 send one message each; the
 *           non-leaders' leases stay valid on the leader's messages alone.
 *   member  rank 1 (not the leader) is killed: tided fails its worker only; the others
 *           stay alive on the leader's host heartbeats, three to a message.
 *   leader  rank 0 (the leader) is killed: tided fails its worker only; the others take
 *           over (their own heartbeats, then the next lowest rank leads) before tided's
 *           timeout, and one message per period carries the three of them again.
 * The last rank runs tided and checks; it is never killed. A failed check prints FAILED
 * and kills every rank.
 */
#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tide/tide.h>

#include "collectives/collectives.h" /* tide_coll_lease_expired */
#include "coord_harness.h"
#include "core/clock.h"
#include "mpi_test.h"
#include "tests/support/scenario.h"

#define HB_MS   200
/* tided's failure timeout, HB_MS * MISS = 5 s: a rank's own lease runs out when its process
   was not scheduled for that long, which is right (it may have been failed meanwhile) but is
   not what this test looks at; CI's sanitizer pass has seen whole-machine stalls of 3.7 s */
#define MISS    25
#define NRANKS  4
#define PERIODS 15 /* the metrics window: 3 s */

/* The scenarios (tests/scenarios/test_worker_hostbeat.h): counting, or a rank killed. */
static const mt_row scenarios[] = {
#define ROW(name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status)            \
    {name, ranks, timeout, labels, mpi, first, resizes, kill, ckpt, gen, status},
#include "scenarios/test_worker_hostbeat.h"
#undef ROW
};
static int g_rank, g_size, g_pids[NRANKS];

static void fail_all(void)
{
    fflush(stderr);
    fflush(stdout);
    for (int i = 0; i < g_size; i++)
        if (g_pids[i] > 0 && g_pids[i] != (int)getpid())
            kill(g_pids[i], SIGKILL);
    _exit(1);
}

#undef MT_FAIL
#define MT_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] %s:%d: FAILED: ", g_rank, __FILE__, __LINE__);                  \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        fail_all();                                                                                \
    } while (0)

/* ---- tided's metrics and status ---------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* The value of counter `name` in tided's Prometheus text on port. */
static double metric(int port, const char *name)
{
    static char buf[1 << 16];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    MT_ASSERT(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "metrics connect");
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    MT_ASSERT(write(fd, req, strlen(req)) == (ssize_t)strlen(req), "metrics request");
    size_t n = 0;
    ssize_t k;
    while (n + 1 < sizeof buf && (k = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)k;
    close(fd);
    buf[n] = '\0';
    size_t len = strlen(name);
    for (char *p = buf; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, len) == 0 && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    MT_FAIL("metric %s missing", name);
    return -1;
}

/* Heartbeats and heartbeat messages tided counted over PERIODS periods from now. */
static void window(int port, double *beats, double *msgs)
{
    double h0 = metric(port, "tide_heartbeats_total");
    double m0 = metric(port, "tide_heartbeat_messages_total");
    tide_sleep_ms((uint64_t)HB_MS * PERIODS);
    *beats = metric(port, "tide_heartbeats_total") - h0;
    *msgs = metric(port, "tide_heartbeat_messages_total") - m0;
}

/* The state tided shows for each of the n worker ids (-1: not listed). */
static void states(const char *endpoint, const int32_t *ids, int n, int *out)
{
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, endpoint, NULL, NULL, NULL, 5000);
    tide_msg_t q, r;
    tide_msg_init(&q, TIDE_MSG_STATUS);
    MT_ASSERT(s != NULL && coord_call(s, &q, &r) == 0 && r.type == TIDE_MSG_STATUS_REPLY,
              "status failed");
    for (int i = 0; i < n; i++) {
        out[i] = -1;
        for (uint32_t k = 0; k < r.u.status_reply.n_rows; k++)
            if (r.u.status_reply.rows[k].worker == ids[i])
                out[i] = (int)r.u.status_reply.rows[k].state;
    }
    tide_msg_clear(&r);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

/* One heartbeat message per period (a few more allowed: a rank whose leader's message
   came late sends its own) carrying `ranks` heartbeats each. */
static void check_window(int port, int ranks, const char *what)
{
    double beats, msgs;
    window(port, &beats, &msgs);
    printf("%s: %.0f heartbeats in %.0f messages over %d periods\n", what, beats, msgs, PERIODS);
    fflush(stdout);
    MT_ASSERT(msgs >= PERIODS * 0.6 && msgs <= PERIODS * 1.35 + 2,
              "%s: %.0f heartbeat messages in %d periods, not one per period", what, msgs, PERIODS);
    MT_ASSERT(beats >= (ranks - 0.5) * msgs,
              "%s: %.0f heartbeats in %.0f messages: not %d ranks to a message", what, beats, msgs,
              ranks);
    MT_ASSERT(beats >= ranks * PERIODS * 0.6 && beats <= ranks * (PERIODS * 1.35 + 2),
              "%s: %.0f heartbeats in %d periods of %d ranks", what, beats, PERIODS, ranks);
}

/* ---- the test ------------------------------------------------------------------------------ */

static coord_proc g_coord;

static tide_t *start(const char *endpoint, int aggregate, int32_t *ids)
{
    tide_options o;
    tide_options_init(&o);
    o.endpoint = endpoint;
    o.register_timeout_ms = 20000;
    o.heartbeat_aggregate = aggregate;
    tide_t *t = NULL;
    MT_OK(tide_new(&t, &o, MPI_COMM_WORLD));
    int32_t me = tide_worker_id(t);
    MPI_Allgather(&me, 1, MPI_INT32_T, ids, 1, MPI_INT32_T, MPI_COMM_WORLD);
    return t;
}

int main(int argc, char **argv)
{
    const mt_row *row = NULL;
    if (MT_ROWS_SELECT(argc, argv, 2, scenarios, &row))
        return 0; /* --list */
    mt_scenario sc;
    if (argc < 3 || row == NULL || mt_scenario_parse(row, &sc) != TIDE_OK ||
        (sc.kill.when[0] != '\0' &&
         (strcmp(sc.kill.when, "now") != 0 || sc.kill.rank < 0 || sc.kill.rank >= NRANKS - 1))) {
        fprintf(stderr, "usage: test_worker_hostbeat TIDED SCENARIO (a kill is \"now at rN\", "
                        "N below the last rank)\n");
        return 2;
    }
    int victim = sc.kill.rank; /* -1: nobody dies, the messages are counted */
    const char *rank_env = getenv("OMPI_COMM_WORLD_RANK");
    const char *size_env = getenv("OMPI_COMM_WORLD_SIZE");
    int checker = rank_env != NULL && size_env != NULL && atoi(rank_env) == atoi(size_env) - 1;
    char metrics[64] = "";
    int port = -1;
    if (checker) { /* before MPI_Init: fork is safe here */
        port = free_port();
        snprintf(metrics, sizeof metrics, "127.0.0.1:%d", port);
        char hb[16], miss[16];
        snprintf(hb, sizeof hb, "%d", HB_MS);
        snprintf(miss, sizeof miss, "%d", MISS);
        const char *flags[] = {"--heartbeat-ms", hb,  "--miss-limit", miss, "--metrics",
                               metrics,          NULL};
        if (coord_tmpdir(&g_coord) != 0 || coord_start(&g_coord, argv[1], flags, NULL) != 0)
            g_coord.endpoint[0] = '\0';
    }
    int prov = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MT_ASSERT(g_size == NRANKS && row->ranks == NRANKS, "run with %d ranks, not %d", NRANKS,
              g_size);
    int mypid = (int)getpid();
    MPI_Allgather(&mypid, 1, MPI_INT, g_pids, 1, MPI_INT, MPI_COMM_WORLD);
    char endpoint[256] = "", done[320] = "";
    if (checker) {
        snprintf(endpoint, sizeof endpoint, "%s", g_coord.endpoint);
        snprintf(done, sizeof done, "%s/done", g_coord.dir); /* the checker finished */
    }
    MPI_Bcast(endpoint, sizeof endpoint, MPI_CHAR, NRANKS - 1, MPI_COMM_WORLD);
    MPI_Bcast(done, sizeof done, MPI_CHAR, NRANKS - 1, MPI_COMM_WORLD);
    MT_ASSERT(endpoint[0] != '\0', "tided did not start");

    int32_t ids[NRANKS];
    tide_t *t = start(endpoint, 1, ids);
    MPI_Barrier(MPI_COMM_WORLD);
    tide_sleep_ms(HB_MS * 5); /* every rank published; the leader leads */
    const uint64_t fail_ms = (uint64_t)HB_MS * MISS;
    if (victim < 0) {
        if (checker)
            check_window(port, NRANKS, "aggregated");
        MPI_Barrier(MPI_COMM_WORLD);
        /* the leader's messages alone kept every lease (non-leaders sent none of their own
           after registering): no rank's lease ran out */
        int expired = tide_coll_lease_expired(), any = 0;
        MPI_Allreduce(&expired, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MT_ASSERT(any == 0, "a rank's lease ran out on host heartbeats");
        tide_destroy(&t);
        MPI_Barrier(MPI_COMM_WORLD);
        t = start(endpoint, 0, ids); /* TIDE_HEARTBEAT_AGGREGATE=0: one message each */
        MPI_Barrier(MPI_COMM_WORLD);
        tide_sleep_ms(HB_MS * 3);
        if (checker) {
            double beats, msgs;
            window(port, &beats, &msgs);
            printf("not aggregated: %.0f heartbeats in %.0f messages over %d periods\n", beats,
                   msgs, PERIODS);
            MT_ASSERT(beats <= msgs + NRANKS && msgs <= beats + NRANKS &&
                          msgs >= NRANKS * PERIODS * 0.6,
                      "TIDE_HEARTBEAT_AGGREGATE=0: %.0f heartbeats in %.0f messages", beats, msgs);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        if (g_rank == victim) {
            fprintf(stderr, "[rank %d] killed (the host's %s)\n", g_rank,
                    victim == 0 ? "leader" : "non-leader");
            fflush(stderr);
            raise(SIGKILL);
        }
        /* only the survivors from here, with no MPI until the end */
        if (checker) {
            /* the victim is failed after the timeout; the others never */
            tide_sleep_ms(fail_ms + 6 * HB_MS);
            int st[NRANKS];
            states(endpoint, ids, NRANKS, st);
            for (int i = 0; i < NRANKS; i++) {
                int want = i == victim ? TIDE_WORKER_FAILED : TIDE_WORKER_IDLE;
                MT_ASSERT(st[i] == want, "rank %d (worker %d) is %s, not %s", i, ids[i],
                          tide_proto_worker_state_name((tide_proto_worker_state_t)st[i]),
                          tide_proto_worker_state_name((tide_proto_worker_state_t)want));
            }
            check_window(port, NRANKS - 1,
                         victim == 0 ? "after the leader died" : "after a non-leader died");
            states(endpoint, ids, NRANKS, st);
            for (int i = 0; i < NRANKS; i++)
                MT_ASSERT(i == victim || st[i] == TIDE_WORKER_IDLE, "rank %d failed later", i);
            MT_ASSERT(tide_coll_lease_expired() == 0, "the checker's lease ran out");
            printf("test_worker_hostbeat: passed\n");
            fflush(stdout);
            FILE *d = fopen(done, "w");
            if (d != NULL)
                fclose(d);
        } else {
            /* the survivors stay (heartbeating) until the checker is done, their leases
               valid all along */
            uint64_t until = tide_now_ns() + 60ull * 1000000000ull;
            while (tide_now_ns() < until && access(done, F_OK) != 0) {
                MT_ASSERT(tide_coll_lease_expired() == 0, "rank %d's lease ran out", g_rank);
                tide_sleep_ms(50);
            }
        }
    }
    if (victim < 0 && checker) {
        printf("test_worker_hostbeat: passed\n");
        fflush(stdout);
    }
    tide_destroy(&t);
    MPI_Finalize();
    if (checker) {
        coord_stop(&g_coord, SIGTERM);
        coord_cleanup(&g_coord);
    }
    return 0;
}
