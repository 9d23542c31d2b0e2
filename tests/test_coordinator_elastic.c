/*
 * Integration tests of the elastic policy inside tided (coordinator/elastic_tided.c): the
 * real tided and tidectl binaries, fake workers over DEALER sockets. Bad declarations are
 * refused with their reason and change nothing; a job with bounds grows onto its idle ranks
 * by itself, with an event that says why; a pinned job is left alone and unpinning lets the
 * policy shrink it to a lowered maximum; an operator's resize wins and holds the job;
 * `tidectl resize --wait` prints the switch's downtime and bytes, and exits 6 with the
 * reason when the switch aborts; bounds and priority declared by the join that makes a job
 * are checked as tidectl's and applied; a pool of several ranks is grown onto only once
 * all of them joined; a job's idle rank on a GPU another job holds gets no offline work.
 * A few seconds.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/coord_harness.h"

/* a failed assertion must not leave sockets that hang teardown (coord_harness.h) */
#define coord_connect(...) coord_tracked(coord_connect(__VA_ARGS__))
#define zmq_close(sock)    coord_close_tracked(sock)

extern char **environ;

typedef struct fake {
    void *sock;
    int32_t id;
    int held;       /* 1: first_layout read the layout of the policy's first switch for it */
    tide_msg_t msg; /* that layout, for switch_all */
} fake;

static void *ctx;
static coord_proc proc;

static void setup(void)
{
    ctx = zmq_ctx_new();
    cr_assert_eq(coord_tmpdir(&proc), 0);
}

static void teardown(void)
{
    coord_stop(&proc, SIGKILL);
    coord_close_all();
    zmq_ctx_destroy(ctx);
    coord_cleanup(&proc);
}

static void start(void)
{
    /* fakes send no heartbeats: none is failed while a test runs */
    static const char *const extra[] = {"--elastic-interval-ms", "0", "--heartbeat-ms", "20000",
                                        NULL};
    int st = 0;
    cr_assert_eq(coord_start(&proc, TIDED_PATH, extra, &st), 0, "tided did not start (%d)", st);
}

static int no_message(fake *w, tide_msg_type_t t, int ms);

static void expect_type(void *sock, tide_msg_type_t t, tide_msg_t *out)
{
    cr_assert_eq(coord_recv_type(sock, t, out), 0, "no '%s' arrived", tide_msg_type_name(t));
}

/* Four ranks of pool `pool`, two per host, registered; their joins to job "train" at
   (dp 1, tp 2) sent, declaring bounds min-max GPUs and priority prio (0: none). */
static void join_declared(fake *w, const char *pool, int32_t min, int32_t max, int32_t prio)
{
    static int launches; /* each launch its own processes */
    int pid0 = 1000 + 10 * launches++;
    tide_msg_t m, r;
    for (int i = 0; i < 4; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].sock = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
        cr_assert_not_null(w[i].sock);
        coord_mk_register(&m, pool, i, 4, i < 2 ? "host0" : "host1", i % 2, pid0 + i);
        cr_assert_eq(coord_call(w[i].sock, &m, &r), 0);
        cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK);
        w[i].id = r.u.register_ok.worker;
    }
    for (int i = 0; i < 4; i++) {
        tide_msg_init(&m, TIDE_MSG_JOIN);
        m.u.join.worker = w[i].id;
        snprintf(m.u.join.job, sizeof m.u.join.job, "train");
        m.u.join.total_bytes = 1 << 20;
        m.u.join.num_layers = 4;
        m.u.join.dp = 1;
        m.u.join.tp = 2;
        m.u.join.pp = 1;
        m.u.join.micro_batches = 1;
        m.u.join.min_gpus = min;
        m.u.join.max_gpus = max;
        m.u.join.priority = prio;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
}

/* The first layout of job "train" reaches two of the four fakes (a host's): they hold it,
   the other two are told they wait idle. Reads each fake only up to that answer, so that
   a switch the policy starts at once stays for switch_all. A rank that joined before the
   layout could be placed (its host's other rank had not joined yet) is only told the job
   waits for workers, and may hear of the policy's first switch next: that layout is kept
   for switch_all (fake.msg), the prepare behind it left unread. */
static void first_layout(fake *w)
{
    tide_msg_t r;
    int got = 0, state[4] = {0}; /* 0: no answer yet, 1: "waiting for" workers, 2: final */
    for (int t = 0; t < 200; t++) {
        int settled = got == 2;
        for (int i = 0; i < 4; i++)
            settled = settled && state[i] > 0;
        if (settled)
            break;
        zmq_pollitem_t it[4];
        for (int i = 0; i < 4; i++)
            it[i] = (zmq_pollitem_t){w[i].sock, 0, state[i] == 2 ? 0 : ZMQ_POLLIN, 0};
        if (zmq_poll(it, 4, 50) <= 0)
            continue;
        for (int i = 0; i < 4; i++) {
            if (state[i] == 2 || !(it[i].revents & ZMQ_POLLIN) || coord_recv(w[i].sock, &r) != 0)
                continue;
            if (r.type == TIDE_MSG_LAYOUT && r.u.layout.layout.gen > 1) {
                w[i].msg = r; /* the policy's switch, for switch_all */
                w[i].held = 1;
                state[i] = 2;
                continue;
            }
            int member = r.type == TIDE_MSG_LAYOUT && r.u.layout.layout.gen == 1;
            if (member || (r.type == TIDE_MSG_OK && strstr(r.u.ok.message, "waiting idle")))
                state[i] = 2;
            else if (r.type == TIDE_MSG_OK && strstr(r.u.ok.message, "waiting for"))
                state[i] = 1;
            got += member;
            tide_msg_clear(&r);
        }
    }
    cr_assert_eq(got, 2, "the first layout reached %d members", got);
}

/* join_declared with no bounds and priority, then its first layout. */
static void launch(fake *w)
{
    join_declared(w, "pool-a", 0, 0, 0);
    first_layout(w);
}

/* 1 when no message of type t reaches any of the 4 fakes within ms. */
static int no_message(fake *w, tide_msg_type_t t, int ms)
{
    uint64_t until = tide_now_ns() + (uint64_t)ms * 1000000ull;
    for (uint64_t now = tide_now_ns(); now < until; now = tide_now_ns()) {
        zmq_pollitem_t it[4];
        for (int i = 0; i < 4; i++)
            it[i] = (zmq_pollitem_t){w[i].sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(it, 4, (long)((until - now) / 1000000ull) + 1) <= 0)
            continue;
        for (int i = 0; i < 4; i++) {
            tide_msg_t r;
            if (!(it[i].revents & ZMQ_POLLIN) || coord_recv(w[i].sock, &r) != 0)
                continue;
            int hit = r.type == t;
            tide_msg_clear(&r);
            if (hit)
                return 0;
        }
    }
    return 1;
}

/* tidectl ARGS... against tided: its exit status, stdout and stderr into out. */
static int ctl(char *out, size_t cap, const char *const *args)
{
    return coord_tidectl_io(TIDECTL_PATH, proc.endpoint, args, out, cap, 1);
}

/* Starts tidectl ARGS... in the background, its output into the file path. */
static pid_t ctl_spawn(const char *path, const char *const *args)
{
    const char *argv[32] = {TIDECTL_PATH, "--endpoint", proc.endpoint};
    size_t n = 3;
    for (size_t i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = 0;
    cr_assert_eq(posix_spawn(&pid, TIDECTL_PATH, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Waits for pid; its exit status, its output (the file path) into out. */
static int ctl_reap(pid_t pid, const char *path, char *out, size_t cap)
{
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Every fake that gets generation gen's layout within ms acks it and, once the commit
   came, reports done (status rc, 1000 bytes, 5 ms); the number of fakes that took part,
   the layout's dp in *dp. As a worker does, none reports before its commit: the acks come
   on four sockets, and a done that tided reads before the last ack is refused ("before its
   commit"), which left a failed switch unreported until the switch timeout. */
static int switch_all(fake *w, uint64_t gen, int rc, int *dp)
{
    tide_msg_t m, r;
    int part[4] = {0}, n = 0;
    for (int i = 0; i < 4; i++) {
        if (w[i].held) {
            r = w[i].msg;
            w[i].held = 0;
        } else if (coord_recv_type(w[i].sock, TIDE_MSG_LAYOUT, &r) != 0)
            continue;
        cr_assert_eq(r.u.layout.layout.gen, gen);
        *dp = r.u.layout.layout.dp;
        tide_msg_clear(&r);
        expect_type(w[i].sock, TIDE_MSG_PREPARE, &r);
        tide_msg_clear(&r);
        tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
        m.u.prepare_ack.worker = w[i].id;
        snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "train");
        m.u.prepare_ack.gen = gen;
        m.u.prepare_ack.step = 10 * gen;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
        part[i] = 1;
        n++;
    }
    for (int i = 0; i < 4; i++) {
        if (!part[i])
            continue;
        expect_type(w[i].sock, TIDE_MSG_COMMIT, &r);
        tide_msg_clear(&r);
        tide_msg_init(&m, TIDE_MSG_DONE);
        m.u.done.worker = w[i].id;
        snprintf(m.u.done.job, sizeof m.u.done.job, "train");
        m.u.done.gen = gen;
        m.u.done.status = rc;
        m.u.done.bytes_moved = 1000;
        m.u.done.ms = 5.0 + i;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
        if (rc != 0)
            break; /* one failure aborts the switch */
    }
    return n;
}

/* The details of every event of kind, joined by '\n', into out; their number. */
static int events(const char *kind, char *out, size_t cap)
{
    tide_msg_t m, r;
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 1000;
    cr_assert_eq(coord_call(admin, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_EVENTS_REPLY);
    int n = 0;
    size_t k = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < r.u.events_reply.n_rows; i++) {
        if (strcmp(r.u.events_reply.rows[i].kind, kind) != 0)
            continue;
        n++;
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s\n",
                              r.u.events_reply.rows[i].detail);
        k = k < cap ? k : cap - 1;
    }
    tide_msg_clear(&r);
    zmq_close(admin);
    return n;
}

/* Polls until `kind` has n events (up to 5 s); their details into out. */
static void wait_events(const char *kind, int n, char *out, size_t cap)
{
    for (int t = 0; t < 250 && events(kind, out, cap) < n; t++)
        tide_sleep_ms(20);
    cr_assert_eq(events(kind, out, cap), n, "%d '%s' events expected: %s", n, kind, out);
}

Test(elastic_tided, bad_declarations_are_refused_and_change_nothing, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4];
    launch(w);
    char out[8192];
    static const struct {
        const char *args[6];
        int code;
        const char *why;
    } bad[] = {
        {{"bounds", "nosuch", "1", "2", NULL}, 1, "no online job named nosuch"},
        {{"pin", "nosuch", NULL}, 1, "no online job named nosuch"},
        {{"bounds", "train", "4", "2", NULL}, 1, "min 4 GPUs is above max 2"},
        {{"bounds", "train", "3", "3", NULL}, 1, "no layout of 3-3 GPUs exists"},
        {{"bounds", "train", "0", "2", NULL}, 2, "MIN must be an integer in 1-"},
        {{"priority", "train", "101", NULL}, 2, "P must be an integer in 0-100"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code = ctl(out, sizeof out, bad[i].args);
        cr_assert_eq(code, bad[i].code, "case %zu: exit %d: %s", i, code, out);
        cr_assert(strstr(out, bad[i].why), "case %zu: %s", i, out);
    }
    cr_assert_eq(events("elastic_bounds", out, sizeof out), 0, "%s", out);
    cr_assert(no_message(w, TIDE_MSG_LAYOUT, 1500), "a layout was sent");
    /* good ones survive a kill -9 of tided */
    const char *const good[][6] = {{"bounds", "train", "2", "2", "--steps=500", NULL},
                                   {"priority", "train", "7", NULL},
                                   {"pin", "train", NULL}};
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(ctl(out, sizeof out, good[i]), 0, "%s", out);
    cr_assert(strstr(out, "train: bounds 2-2 GPUs, priority 7, pinned"), "%s", out);
    coord_stop(&proc, SIGKILL);
    start();
    const char *const unpin[] = {"unpin", "train", NULL};
    cr_assert_eq(ctl(out, sizeof out, unpin), 0, "%s", out);
    cr_assert(strstr(out, "train: bounds 2-2 GPUs, priority 7, free"), "%s", out);
    wait_events("elastic_bounds", 4, out, sizeof out);
    cr_assert(strstr(out, "500 steps in all"), "%s", out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

Test(elastic_tided, a_job_grows_by_itself_is_pinned_and_an_operator_wins, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4];
    launch(w);
    char out[8192];
    int dp = 0;
    /* bounds: the policy grows the job onto its idle ranks, with the reason */
    const char *const bounds[] = {"bounds", "train", "2", "4", NULL};
    cr_assert_eq(ctl(out, sizeof out, bounds), 0, "%s", out);
    cr_assert(strstr(out, "bounds 2-4 GPUs"), "%s", out);
    cr_assert_eq(switch_all(w, 2, 0, &dp), 4);
    cr_assert_eq(dp, 2);
    wait_events("resized", 1, out, sizeof out);
    wait_events("elastic", 1, out, sizeof out);
    cr_assert(strstr(out, "generation 2: grow dp 1 -> 2"), "%s", out);
    cr_assert(strstr(out, "takes host1:0,1, gives up none"), "the GPUs taken: %s", out);
    /* pinned: a lowered maximum is not applied */
    const char *const pin[] = {"pin", "train", NULL}, *const unpin[] = {"unpin", "train", NULL};
    const char *const lower[] = {"bounds", "train", "2", "2", NULL};
    cr_assert_eq(ctl(out, sizeof out, pin), 0, "%s", out);
    cr_assert_eq(ctl(out, sizeof out, lower), 0, "%s", out);
    cr_assert(no_message(w, TIDE_MSG_LAYOUT, 1500), "a pinned job moved"); /* timer runs too */
    /* unpinned: the policy shrinks it to its maximum */
    cr_assert_eq(ctl(out, sizeof out, unpin), 0, "%s", out);
    cr_assert_eq(switch_all(w, 3, 0, &dp), 4);
    cr_assert_eq(dp, 1);
    wait_events("elastic", 2, out, sizeof out);
    cr_assert(strstr(out, "generation 3: bounds dp 2 -> 1"), "%s", out);
    /* an operator's resize wins over the bounds and holds the job; --wait prints the end */
    char path[400];
    snprintf(path, sizeof path, "%s/wait.out", proc.dir);
    const char *const resize[] = {"resize", "train", "--dp", "2", "--wait", "--wait-ms", "30000", NULL};
    pid_t pid = ctl_spawn(path, resize);
    cr_assert_eq(switch_all(w, 4, 0, &dp), 4);
    cr_assert_eq(ctl_reap(pid, path, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "generation 4 committed after step 41: downtime 8.0 ms"), "%s", out);
    cr_assert(strstr(out, "4000 bytes moved"), "%s", out);
    wait_events("elastic_hold", 1, out, sizeof out);
    cr_assert(no_message(w, TIDE_MSG_LAYOUT, 1500), "a held job moved");
    /* declaring bounds again hands it back: the policy shrinks it to its maximum */
    cr_assert_eq(ctl(out, sizeof out, lower), 0, "%s", out);
    cr_assert_eq(switch_all(w, 5, 0, &dp), 4);
    cr_assert_eq(dp, 1);
    wait_events("elastic", 3, out, sizeof out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

Test(elastic_tided, resize_wait_exits_6_with_the_reason_when_the_switch_aborts, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4];
    launch(w);
    char out[8192], path[400];
    int dp = 0;
    snprintf(path, sizeof path, "%s/wait.out", proc.dir);
    const char *const resize[] = {"resize", "train", "--dp", "2", "--wait", "--wait-ms", "30000", NULL};
    pid_t pid = ctl_spawn(path, resize);
    cr_assert_eq(switch_all(w, 2, TIDE_ERR_NOMEM, &dp), 4);
    cr_assert_eq(ctl_reap(pid, path, out, sizeof out), 6, "%s", out);
    cr_assert(strstr(out, "generation 2 aborted: worker"), "%s", out);
    cr_assert(strstr(out, "could not switch"), "%s", out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

/* Bounds and priority declared by the join that makes the job: bad ones refuse every
   rank's join with tided's reason and make no job; good ones are the job's (its event, the
   policy grows it by itself) until tidectl bounds changes them. */
Test(elastic_tided, bounds_declared_at_launch_apply_and_tidectl_wins_later, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4];
    char out[8192];
    join_declared(w, "pool-x", 4, 2, 5);
    for (int i = 0; i < 4; i++) {
        tide_msg_t r;
        expect_type(w[i].sock, TIDE_MSG_ERROR, &r);
        cr_assert(strstr(r.u.error.message, "job train cannot start: its bounds 4-2 GPUs: "
                                            "min 4 GPUs is above max 2"),
                  "%s", r.u.error.message);
        tide_msg_clear(&r);
        zmq_close(w[i].sock);
    }
    const char *const jobs[] = {"jobs", NULL};
    cr_assert_eq(ctl(out, sizeof out, jobs), 0, "%s", out);
    cr_assert_null(strstr(out, "train"), "a refused join made a job: %s", out);
    cr_assert_eq(events("job_created", out, sizeof out), 0, "%s", out);
    /* tp 2: 3 GPUs is no layout, as tidectl bounds says */
    join_declared(w, "pool-y", 3, 3, 0);
    for (int i = 0; i < 4; i++) {
        tide_msg_t r;
        expect_type(w[i].sock, TIDE_MSG_ERROR, &r);
        cr_assert(strstr(r.u.error.message, "no layout of 3-3 GPUs exists"), "%s",
                  r.u.error.message);
        tide_msg_clear(&r);
        zmq_close(w[i].sock);
    }
    join_declared(w, "pool-a", 2, 4, 5);
    first_layout(w);
    wait_events("elastic_bounds", 1, out, sizeof out);
    cr_assert(strstr(out, "bounds 2-4 GPUs, priority 5, free"), "%s", out);
    cr_assert(strstr(out, "declared at launch by pool pool-a"), "%s", out);
    int dp = 0;
    cr_assert_eq(switch_all(w, 2, 0, &dp), 4);
    cr_assert_eq(dp, 2);
    wait_events("elastic", 1, out, sizeof out);
    cr_assert(strstr(out, "generation 2: grow dp 1 -> 2"), "%s", out);
    /* tidectl's later declaration wins: the policy shrinks the job to its new maximum, and
       --wait follows that switch to its commit */
    char path[400];
    snprintf(path, sizeof path, "%s/wait.out", proc.dir);
    const char *const lower[] = {"bounds", "train", "2", "2", "--wait", "--wait-ms", "30000", NULL};
    pid_t pid = ctl_spawn(path, lower);
    cr_assert_eq(switch_all(w, 3, 0, &dp), 4);
    cr_assert_eq(dp, 1);
    cr_assert_eq(ctl_reap(pid, path, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "bounds 2-2 GPUs, priority 5, free; the policy starts generation 3"),
              "%s", out);
    cr_assert(strstr(out, "generation 3 committed after step 31: downtime 8.0 ms"), "%s", out);
    cr_assert(strstr(out, "4000 bytes moved"), "%s", out);
    /* nothing to change: --wait says so and returns */
    const char *const prio[] = {"priority", "train", "6", "--wait", NULL};
    cr_assert_eq(ctl(out, sizeof out, prio), 0, "%s", out);
    cr_assert(strstr(out, "no switch started: nothing to wait for"), "%s", out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
}

/* Registers ranks [0, n) of pool `pool` (size n) on `host`, and sends the joins of ranks
   [0, k) to job "train" at (dp 1, tp 2) with no declaration. */
static void register_pool(fake *w, const char *pool, int n, const char *host, int k)
{
    tide_msg_t m, r;
    for (int i = 0; i < n; i++) {
        w[i].sock = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
        cr_assert_not_null(w[i].sock);
        coord_mk_register(&m, pool, i, n, host, i, 2000 + i);
        cr_assert_eq(coord_call(w[i].sock, &m, &r), 0);
        cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK);
        w[i].id = r.u.register_ok.worker;
    }
    for (int i = 0; i < k; i++) {
        tide_msg_init(&m, TIDE_MSG_JOIN);
        m.u.join.worker = w[i].id;
        snprintf(m.u.join.job, sizeof m.u.join.job, "train");
        m.u.join.total_bytes = 1 << 20;
        m.u.join.num_layers = 4;
        m.u.join.dp = 1;
        m.u.join.tp = 2;
        m.u.join.pp = 1;
        m.u.join.micro_batches = 1;
        cr_assert_eq(coord_send(w[i].sock, &m), 0);
    }
}

/* A launch of several ranks joins a running job one rank at a time (4 GPUs per host): the
   policy grows the job onto that pool only once every rank of it joined (connecting a pool
   is collective over its ranks), not onto ranks that registered but have not joined yet. */
Test(elastic_tided, a_grow_waits_until_every_rank_of_a_joining_pool_joined, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4], b[2];
    char out[8192];
    int dp = 0;
    join_declared(w, "pool-a", 2, 8, 5);
    first_layout(w);
    cr_assert_eq(switch_all(w, 2, 0, &dp), 4);
    cr_assert_eq(dp, 2); /* pool-a's 4 GPUs all in the layout */
    wait_events("elastic", 1, out, sizeof out);
    /* pool-b: both ranks registered on host2, only its rank 0 joined */
    register_pool(b, "pool-b", 2, "host2", 1);
    wait_events("pool_joined", 1, out, sizeof out);
    cr_assert(no_message(w, TIDE_MSG_LAYOUT, 1500), "the job grew onto a half-joined pool");
    cr_assert_eq(events("elastic_failed", out, sizeof out), 0, "%s", out);
    cr_assert_eq(events("elastic", out, sizeof out), 1, "%s", out);
    /* its rank 1 joins: the policy grows the job onto the whole pool */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = b[1].id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "train");
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = 1;
    m.u.join.tp = 2;
    m.u.join.pp = 1;
    m.u.join.micro_batches = 1;
    cr_assert_eq(coord_send(b[1].sock, &m), 0);
    wait_events("elastic", 2, out, sizeof out);
    cr_assert(strstr(out, "generation 3: grow dp 2 -> 3"), "%s", out);
    cr_assert(strstr(out, "takes host2:0,1, gives up none"), "%s", out);
    cr_assert_eq(events("elastic_failed", out, sizeof out), 0, "%s", out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    for (int i = 0; i < 2; i++)
        zmq_close(b[i].sock);
}

/* One rank of pool `pool` on (host, device) registered and joined to job `job` at dp 1; its
   first layout received. */
static void join_one(fake *f, const char *pool, const char *job, const char *host, int device)
{
    tide_msg_t m, r;
    f->sock = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 5000);
    cr_assert_not_null(f->sock);
    coord_mk_register(&m, pool, 0, 1, host, device, 3000 + device);
    cr_assert_eq(coord_call(f->sock, &m, &r), 0);
    cr_assert_eq(r.type, TIDE_MSG_REGISTER_OK);
    f->id = r.u.register_ok.worker;
    tide_msg_init(&m, TIDE_MSG_JOIN);
    m.u.join.worker = f->id;
    snprintf(m.u.join.job, sizeof m.u.join.job, "%s", job);
    m.u.join.total_bytes = 1 << 20;
    m.u.join.num_layers = 4;
    m.u.join.dp = m.u.join.tp = m.u.join.pp = m.u.join.micro_batches = 1;
    cr_assert_eq(coord_send(f->sock, &m), 0);
    expect_type(f->sock, TIDE_MSG_LAYOUT, &r);
    tide_msg_clear(&r);
}

/* A job's idle rank on a GPU that a member of another job holds (a job yields GPUs to a
   higher-priority one launched there and keeps its ranks) gets no offline work: only the
   idle rank whose GPU nobody holds does. */
Test(elastic_tided, offline_work_skips_idle_ranks_on_gpus_another_job_holds, .init = setup,
     .fini = teardown)
{
    start();
    fake w[4], b, c;
    char out[8192];
    launch(w); /* "train": one host's two GPUs in its layout, the other host's two idle */
    join_one(&b, "pool-b", "b", "host0", 0); /* whichever host is idle, its GPU 0 is held */
    join_one(&c, "pool-c", "c", "host1", 0);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "off%d", i);
        const char *const submit[] = {"submit", "--offline", "--name", name, "--", "true", NULL};
        cr_assert_eq(ctl(out, sizeof out, submit), 0, "%s", out);
    }
    wait_events("offline_assigned", 1, out, sizeof out);
    tide_sleep_ms(1000);
    cr_assert_eq(events("offline_assigned", out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "device 1)"), "offline work on a GPU another job holds: %s", out);
    const char *const jobs[] = {"jobs", NULL};
    cr_assert_eq(ctl(out, sizeof out, jobs), 0, "%s", out);
    cr_assert(strstr(out, "queued"), "the second offline job waits: %s", out);
    for (int i = 0; i < 4; i++)
        zmq_close(w[i].sock);
    zmq_close(b.sock);
    zmq_close(c.sock);
}
