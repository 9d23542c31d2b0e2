/*
 * worker/ctl: libtide's control client. A background thread owns the ZeroMQ DEALER
 * socket to tided: it registers, heartbeats (step, generation, idle and bubble time)
 * while the training thread computes, applies tided's reconfiguration commands to the
 * step-agreement state (agree.c) and answers them at once (prepare_ack), runs offline
 * command jobs (offline.c) and reports them. The training thread sends through an
 * inproc PAIR socket (ZeroMQ sockets are single-threaded), reads replies from a
 * mailbox, and reads the agreement state under the mutex at step boundaries.
 *
 * Workload: one heartbeat per period (1 s by default), a few messages per resize; the
 * thread wakes every 20 ms only while an offline child runs (to reap it promptly) and
 * every 2 ms while an ack waits for the program's preparation (tide_set_prepare).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/keyfile.h"
#include "core/log.h"
#include "worker/tide_int.h"
#include "worker/worker_int.h"

#define TIDE__SAVED_QUEUE 16 /* checkpoint reports waiting to be sent, at most */
#define SUBSYS            "worker"
#define REGISTER_RETRY_MS 1000 /* resend register until tided answers */
#define REPLIES_MAX       64   /* unread replies kept for the main thread */

struct tide__ctl {
    char endpoint[512];
    tide_proto_register_t reg;
    int hb_fixed_ms;
    void *zctx, *dealer, *pair_bg, *pair_main;
    void *mon; /* PAIR: the dealer's failed CURVE handshakes (main thread only) */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* --- under mu --- */
    int stop;
    int leave; /* destroy began: stop the offline command (SIGTERM, grace), take no more */
    int32_t worker_id;
    int registered;
    int ever_registered; /* a worker id was assigned once (bye is meaningful) */
    int hb_ms;
    char job[TIDE_PROTO_NAME_MAX + 1];
    tide__agree agree;
    tide_msg_t p_layout;                   /* the pending generation's layout message, or NONE */
    int job_ended;                         /* tided said the job ended (job_end) */
    char end_why[TIDE_PROTO_TEXT_MAX + 1]; /* and why */
    int64_t end_step;
    uint64_t released_gen; /* tided released this rank's pool at this generation (0: not) */
    uint64_t port_gen;     /* generation the join port below belongs to (0: none) */
    char port[TIDE_PROTO_TEXT_MAX + 1]; /* a join's MPI port name, relayed by tided */
    tide__abort_fn abort_fn;
    void *abort_ctx;
    char save_dir[TIDE_PROTO_TEXT_MAX + 1]; /* tided asked for a checkpoint under this root */
    int64_t save_step;                      /* at this step (-1: no request) */
    tide_proto_saved_t saved_q[TIDE__SAVED_QUEUE]; /* "saved" reports waiting for the
                                                      background thread (any thread posts
                                                      them: the checkpoint writer's) */
    int n_saved;
    int halt_code; /* tided halted the job (a tide_status); 0: not halted */
    char halt_reason[TIDE_PROTO_TEXT_MAX + 1];
    int fail_ms; /* tided's failure timeout (register_ok), ms; 0 before the first */
    int fenced;  /* this process was given up (tided said so, or its lease ran out): it sends
                    nothing more to tided but a last word, and touches no peer */
    char fence_reason[TIDE_PROTO_TEXT_MAX + 1];
    uint64_t idle_ns, bubble_ns, filled_ns, step_ns;
    uint32_t steps;
    uint8_t *done_bytes; /* last done sent, for duplicate commits */
    size_t done_len;
    uint64_t done_gen;
    tide_msg_t plugin; /* an assigned plugin job waiting for the main thread */
    int plugin_ready;
    char plugin_job[TIDE_PROTO_NAME_MAX + 1];
    int plugin_grace;         /* -1: not preempted */
    pid_t child_pid;          /* mirror of child.pid for tests and destroy */
    int child_grace;          /* mirror of child.grace_ms */
    tide__prepare_fn prep_fn; /* the program prepares new layouts (NULL: no) */
    void *prep_ctx;
    uint64_t prep_want_gen;     /* prepare of this generation held (ack deferred) */
    uint64_t prep_done_gen;     /* the last generation prep_fn finished */
    uint64_t prep_released_gen; /* the main thread ended a step: ack now, prepared or not */
    uint64_t prep_start_gen;    /* the last generation prep_fn was started for */
    uint64_t prep_run_gen;      /* prep_fn must still start for this generation, ack held or
                                   not: the participants build its communicators together */
    int prep_busy;              /* prep_thread runs prep_fn */
    pthread_t prep_thread;      /* joined by the background thread or destroy only */
    int prep_started;
    char child_job[TIDE_PROTO_NAME_MAX + 1];
    /* --- background thread only --- */
    tide__mailbox_t *replies;
    tide__child child;
    uint32_t child_attempt;    /* attempt number of the command running in child */
    char log_dir[512];         /* TIDE_LOG_DIR: where attempts' output goes */
    uint64_t log_cap;          /* TIDE_OFFLINE_LOG_CAP: bytes kept per attempt */
    int contain_known;         /* the containment below was decided (once, at first use) */
    char cg_parent[1024];      /* cgroup v2 directory for attempts' cgroups, "" when none */
    int leaving;               /* leave seen while a command ran: it is being stopped */
    uint64_t deferred_ack_gen; /* prepare_ack waiting for the offline child to stop */
    tide_proto_buf_t buf;
    uint64_t next_hb_ns, next_reg_ns;
    uint64_t last_hb_ns; /* monotonic ns of the last heartbeat sent that carried this rank's
                            (by itself or, aggregated, by its host's leader; 0: none yet) */
    /* host aggregation (hostbeat.c); host NULL: this rank sends its own heartbeats */
    tide__hostbeat_t *host;
    tide_proto_heartbeat_t *hb_beats; /* room for the host's ranks (leader) */
    uint64_t *hb_seqs;
    int *hb_slots;
    uint64_t next_send_ns; /* leader: the next host heartbeat (0: at once) */
    uint64_t self_ns;      /* the last heartbeat this rank sent itself (or registered) */
    int mon_bg;            /* under mu: the background thread reads the monitor from now on */
    int introduce;         /* under mu: the socket (re)connected: tided must hear this rank
                              itself once, or it cannot route messages to it */
    int bye;               /* under mu: destroy sent (or is sending) bye: this rank is off the
                              host's heartbeats and registers no more */
};

/* ---- helpers (background thread) ------------------------------------------------------ */

/* Encodes and sends m to tided without blocking; 1 when handed to ZeroMQ. */
static int send_dealer(tide__ctl_t *ctl, const tide_msg_t *m)
{
    if (tide_proto_encode(m, &ctl->buf) != TIDE_OK) {
        TIDE_ERROR(SUBSYS, "cannot encode '%s': %s", tide_msg_type_name(m->type),
                   tide_last_error());
        return 0;
    }
    if (zmq_send(ctl->dealer, ctl->buf.data, ctl->buf.len, ZMQ_DONTWAIT) < 0) {
        TIDE_WARN(SUBSYS, "dropped a '%s' to tided: %s", tide_msg_type_name(m->type),
                  zmq_strerror(errno));
        return 0;
    }
    return 1;
}

static void send_register(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int fenced = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    ctl->next_reg_ns = tide_now_ns() + REGISTER_RETRY_MS * 1000000ull;
    if (fenced)
        return; /* a fenced process never rejoins the pool */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_REGISTER);
    m.u.reg = ctl->reg;
    send_dealer(ctl, &m);
    ctl->next_reg_ns = tide_now_ns() + REGISTER_RETRY_MS * 1000000ull;
}

/*
 * This process was given up: by tided (its "fenced" answer) or by its own lease (it sent
 * no heartbeat for tided's whole failure timeout, so tided may have declared it failed
 * and its peers abandoned it). From now on its communicators count as aborted (the lease
 * is set in the past: see tide_coll_lease_set), the step's and the switch's operations
 * are aborted, and the program's next tide_step_begin fails with why. tell: also report
 * the failure to tided, so that a job it did not fail yet recovers without this rank.
 */
static void fence(tide__ctl_t *ctl, const char *why, int tell)
{
    tide_msg_t f;
    tide_msg_init(&f, TIDE_MSG_FAILURE);
    pthread_mutex_lock(&ctl->mu);
    if (ctl->fenced) {
        pthread_mutex_unlock(&ctl->mu);
        return;
    }
    ctl->fenced = 1;
    snprintf(ctl->fence_reason, sizeof ctl->fence_reason, "%s", why);
    tide_coll_lease_set(1); /* expired: not one more call into MPI or NCCL */
    if (ctl->host != NULL)
        tide__hostbeat_inactive(ctl->host); /* no leader speaks for it any more */
    if (ctl->abort_fn != NULL) {
        ctl->abort_fn(ctl->abort_ctx, 0);
        ctl->abort_fn(ctl->abort_ctx, 1);
    }
    f.u.failure.worker = ctl->worker_id;
    snprintf(f.u.failure.job, sizeof f.u.failure.job, "%s", ctl->job);
    f.u.failure.gen = ctl->agree.gen;
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    TIDE_ERROR(SUBSYS, "fenced: %s", why);
    if (ctl->child.pid > 0) /* tided runs its offline job elsewhere now: never two copies */
        tide__child_preempt(&ctl->child, ctl->child.grace_ms, tide_now_ns());
    if (tell) {
        f.u.failure.code = TIDE_ERR_STALE;
        snprintf(f.u.failure.reason, sizeof f.u.failure.reason, "%s", why);
        send_dealer(ctl, &f);
    }
}

/* Renews the lease from `sent` (monotonic ns), when a heartbeat carrying this rank's was
 * sent (by itself, or by its host's leader), or fences this process when it comes too
 * late: a rank of a job that no heartbeat carried for tided's failure timeout (it was
 * stopped or starved) may have been declared failed meanwhile, and must not send one
 * more message to peers that may have given it up. A rank outside any layout holds no
 * communicator: it only renews (tided re-registers it when it had failed it). 1 when
 * renewed (or nothing newer), 0 when fenced. */
static int lease_renew(tide__ctl_t *ctl, uint64_t sent)
{
    pthread_mutex_lock(&ctl->mu);
    int fail_ms = ctl->fail_ms;
    int in_job = ctl->job[0] != '\0' && (ctl->agree.member || ctl->agree.p_gen != 0);
    int fenced = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    if (fenced)
        return 0;
    if (sent <= ctl->last_hb_ns)
        return 1;
    uint64_t fail_ns = (uint64_t)fail_ms * 1000000ull;
    if (fail_ms > 0 && in_job && ctl->last_hb_ns != 0 && sent - ctl->last_hb_ns >= fail_ns) {
        char why[TIDE_PROTO_TEXT_MAX + 1];
        snprintf(why, sizeof why,
                 "this process sent no heartbeat for %llu ms (nor did its host's leader for it; "
                 "it was stopped or starved), past tided's failure timeout of %d ms: it may "
                 "have been declared failed and its job gone on without it, so it leaves "
                 "without touching its peers",
                 (unsigned long long)((sent - ctl->last_hb_ns) / 1000000ull), fail_ms);
        fence(ctl, why, 1);
        return 0;
    }
    ctl->last_hb_ns = sent;
    if (fail_ms > 0)
        tide_coll_lease_set(sent + fail_ns);
    return 1;
}

static void send_heartbeat(tide__ctl_t *ctl)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HEARTBEAT);
    pthread_mutex_lock(&ctl->mu);
    int ok = ctl->registered;
    m.u.heartbeat.worker = ctl->worker_id;
    m.u.heartbeat.step = ctl->agree.completed > 0 ? (uint64_t)ctl->agree.completed : 0;
    m.u.heartbeat.gen = ctl->agree.gen;
    m.u.heartbeat.idle_ms = (double)ctl->idle_ns / 1e6;
    m.u.heartbeat.bubble_ms = (double)ctl->bubble_ns / 1e6;
    m.u.heartbeat.filled_ms = (double)ctl->filled_ns / 1e6;
    m.u.heartbeat.step_ms = ctl->steps ? (double)ctl->step_ns / 1e6 / ctl->steps : 0.0;
    ctl->idle_ns = ctl->bubble_ns = ctl->filled_ns = ctl->step_ns = 0;
    ctl->steps = 0;
    int hb = ctl->hb_ms > 0 ? ctl->hb_ms : 1000;
    pthread_mutex_unlock(&ctl->mu);
    if (m.u.heartbeat.idle_ms > TIDE_PROTO_MS_MAX)
        m.u.heartbeat.idle_ms = TIDE_PROTO_MS_MAX;
    uint64_t now = tide_now_ns();
    if (ok && lease_renew(ctl, now))
        send_dealer(ctl, &m);
    ctl->next_hb_ns = now + (uint64_t)hb * 1000000ull;
}

/* The host's leader: one host heartbeat carrying every rank of the host that published
 * since the last one (its own among them); each carried slot is stamped with the send
 * time, which its rank's lease runs from. */
static void send_host(tide__ctl_t *ctl, int32_t me_worker, uint64_t now)
{
    size_t k = tide__hostbeat_collect(ctl->host, ctl->hb_beats, ctl->hb_seqs, ctl->hb_slots);
    int own = 0;
    for (size_t i = 0; i < k; i++)
        own |= ctl->hb_beats[i].worker == me_worker;
    if (!own || !lease_renew(ctl, now))
        return; /* its own slot was mid-write (next tick), or it was fenced: nothing sent */
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HOST_HEARTBEAT);
    m.u.host_heartbeat.worker = me_worker;
    m.u.host_heartbeat.beats = ctl->hb_beats; /* borrowed: never cleared */
    m.u.host_heartbeat.n_beats = (uint32_t)k;
    if (send_dealer(ctl, &m))
        for (size_t i = 0; i < k; i++)
            tide__hostbeat_sent(ctl->host, ctl->hb_slots[i], ctl->hb_seqs[i], now);
}

/*
 * One tick of host aggregation (every half period): this rank's heartbeat goes into its
 * slot; the host's leader (the lowest local rank publishing) sends the host heartbeat once
 * a period. A rank that no heartbeat carried for 1.5 periods (its leader died or stalls:
 * it takes over within two periods, before tided's failure timeout of several), or whose
 * socket (re)connected (tided learns a route only from a message on it), sends its own.
 * Its lease runs from the last heartbeat that carried it, whoever sent it.
 */
static void host_tick(tide__ctl_t *ctl)
{
    uint64_t now = tide_now_ns();
    tide__beat b;
    memset(&b, 0, sizeof b);
    pthread_mutex_lock(&ctl->mu);
    int ok = ctl->registered && !ctl->fenced && !ctl->bye;
    b.worker = ctl->worker_id;
    b.step = ctl->agree.completed > 0 ? (uint64_t)ctl->agree.completed : 0;
    b.gen = ctl->agree.gen;
    b.idle_ns = ctl->idle_ns;
    b.bubble_ns = ctl->bubble_ns;
    b.filled_ns = ctl->filled_ns;
    b.step_ns = ctl->step_ns;
    b.steps = ctl->steps;
    ctl->idle_ns = ctl->bubble_ns = ctl->filled_ns = ctl->step_ns = 0;
    ctl->steps = 0;
    int introduce = ctl->introduce;
    ctl->introduce = 0;
    uint64_t period = (uint64_t)(ctl->hb_ms > 0 ? ctl->hb_ms : 1000) * 1000000ull;
    /* under the lock: once destroy marked the slot inactive for the bye, no publish
       marks it active again */
    if (ok)
        tide__hostbeat_publish(ctl->host, &b, now);
    else
        tide__hostbeat_inactive(ctl->host);
    pthread_mutex_unlock(&ctl->mu);
    ctl->next_hb_ns = now + period / 2;
    if (!ok)
        return;
    int me = tide__hostbeat_me(ctl->host);
    if (tide__hostbeat_leader(ctl->host, now, 2 * period) == me) {
        /* every other tick: a little early rather than a tick late */
        if (now >= ctl->next_send_ns) {
            send_host(ctl, b.worker, now);
            ctl->next_send_ns = now + period - period / 4;
        }
        if (!introduce)
            return;
    } else {
        ctl->next_send_ns = 0; /* should it lead later: at once */
    }
    uint64_t covered = tide__hostbeat_covered(ctl->host);
    covered = covered > ctl->self_ns ? covered : ctl->self_ns;
    if (!introduce && now - covered <= period + period / 2) {
        lease_renew(ctl, covered);
        return;
    }
    tide_proto_heartbeat_t own;
    uint64_t seq = 0;
    if (!tide__hostbeat_own(ctl->host, &own, &seq) || !lease_renew(ctl, now))
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_HEARTBEAT);
    m.u.heartbeat = own;
    if (send_dealer(ctl, &m)) {
        tide__hostbeat_sent(ctl->host, me, seq, now);
        ctl->self_ns = now;
    }
}

static void send_offline_status(tide__ctl_t *ctl, const char *job, uint32_t attempt,
                                tide_proto_job_state_t st, int exit_code, const char *log,
                                const char *tail)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS);
    pthread_mutex_lock(&ctl->mu);
    m.u.offline_status.worker = ctl->worker_id;
    pthread_mutex_unlock(&ctl->mu);
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "%s", job);
    m.u.offline_status.attempt = attempt > 0 ? attempt : 1;
    m.u.offline_status.state = st;
    if (exit_code > 255)
        exit_code = 255;
    if (exit_code < -255)
        exit_code = -255;
    m.u.offline_status.exit_code = exit_code;
    m.u.offline_status.progress = st == TIDE_JOB_DONE ? 1.0 : 0.0;
    snprintf(m.u.offline_status.log, sizeof m.u.offline_status.log, "%s", log ? log : "");
    snprintf(m.u.offline_status.tail, sizeof m.u.offline_status.tail, "%s", tail ? tail : "");
    send_dealer(ctl, &m);
}

/* The last bytes of an attempt's output file (NULs shown as '?'), into out (len bytes). */
static void read_tail(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t want = len - 1;
    off_t from = sb.st_size > (off_t)want ? sb.st_size - (off_t)want : 0;
    ssize_t n = pread(fd, out, want, from);
    close(fd);
    if (n < 0)
        n = 0;
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\0')
            out[i] = '?';
    out[n] = '\0';
}

/* Makes the attempts' log directory (mode 0700). The default one under /tmp must be a
   directory of this user's, not a link someone left there. */
static tide_status log_dir_ready(const char *dir, int is_default)
{
    char path[512];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return tide_errorf(TIDE_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return tide_errorf(TIDE_ERR_IO, "cannot create the offline log directory %s: %s", path,
                           strerror(errno));
    struct stat sb;
    if ((is_default ? lstat(path, &sb) : stat(path, &sb)) != 0 || !S_ISDIR(sb.st_mode))
        return tide_errorf(TIDE_ERR_IO, "the offline log directory %s is not a directory", path);
    if (is_default && sb.st_uid != getuid())
        return tide_errorf(TIDE_ERR_DENIED,
                           "the offline log directory %s belongs to another user: set "
                           "TIDE_LOG_DIR",
                           path);
    return TIDE_OK;
}

static void send_ack(tide__ctl_t *ctl, uint64_t gen, int64_t step)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREPARE_ACK);
    pthread_mutex_lock(&ctl->mu);
    m.u.prepare_ack.worker = ctl->worker_id;
    snprintf(m.u.prepare_ack.job, sizeof m.u.prepare_ack.job, "%s", ctl->job);
    pthread_mutex_unlock(&ctl->mu);
    m.u.prepare_ack.gen = gen;
    m.u.prepare_ack.step = step > 0 ? (uint64_t)step : 0;
    send_dealer(ctl, &m);
    TIDE_INFO(SUBSYS, "prepare_ack generation %llu at step %lld", (unsigned long long)gen,
              (long long)step);
}

static void to_main(tide__ctl_t *ctl, tide_msg_t *m)
{
    while (tide__mailbox_len(ctl->replies) >= REPLIES_MAX) {
        tide_msg_t old;
        if (tide__mailbox_pop(ctl->replies, &old, 0) != TIDE_OK)
            break;
        tide_msg_clear(&old);
    }
    if (tide__mailbox_push(ctl->replies, m) != TIDE_OK)
        tide_msg_clear(m);
}

static int layout_has(const tide_proto_layout_t *l, int32_t rank)
{
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    for (size_t i = 0; i < n; i++)
        if (l->worker[i] == rank)
            return 1;
    return 0;
}

/* ---- handlers (background thread) ------------------------------------------------------- */

static void on_job_end(tide__ctl_t *ctl, const tide_proto_job_end_t *e)
{
    pthread_mutex_lock(&ctl->mu);
    if (strcmp(e->job, ctl->job) == 0) {
        ctl->job_ended = 1;
        ctl->end_step = (int64_t)e->step;
        snprintf(ctl->end_why, sizeof ctl->end_why, "%s", e->why);
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
}

int tide__ctl_job_ended(tide__ctl_t *ctl, int64_t *step, char *why, size_t why_len)
{
    pthread_mutex_lock(&ctl->mu);
    int ended = ctl->job_ended;
    if (ended && step != NULL)
        *step = ctl->end_step;
    if (ended && why != NULL && why_len > 0)
        snprintf(why, why_len, "%s", ctl->end_why);
    pthread_mutex_unlock(&ctl->mu);
    return ended;
}

static void on_release(tide__ctl_t *ctl, const tide_proto_release_t *r)
{
    pthread_mutex_lock(&ctl->mu);
    if (strcmp(r->job, ctl->job) == 0 && r->gen > ctl->released_gen) {
        ctl->released_gen = r->gen;
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
}

uint64_t tide__ctl_released(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    uint64_t gen = ctl->released_gen;
    pthread_mutex_unlock(&ctl->mu);
    return gen;
}

static void on_join_port(tide__ctl_t *ctl, const tide_proto_join_port_t *p)
{
    pthread_mutex_lock(&ctl->mu);
    if (strcmp(p->job, ctl->job) == 0 && p->gen >= ctl->port_gen) {
        ctl->port_gen = p->gen;
        snprintf(ctl->port, sizeof ctl->port, "%s", p->port);
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
}

int tide__ctl_join_port(tide__ctl_t *ctl, uint64_t gen, char *port, size_t len)
{
    pthread_mutex_lock(&ctl->mu);
    int have = ctl->port_gen == gen && ctl->port[0] != '\0';
    if (have)
        snprintf(port, len, "%s", ctl->port);
    pthread_mutex_unlock(&ctl->mu);
    return have;
}

static void on_layout(tide__ctl_t *ctl, tide_msg_t *m)
{
    tide_proto_layout_msg_t *lm = &m->u.layout;
    /* layouts name job ranks: this pool's ranks start at the base tided gives it */
    int32_t me = lm->base + ctl->reg.rank;
    pthread_mutex_lock(&ctl->mu);
    if (strcmp(lm->job, ctl->job) != 0) {
        pthread_mutex_unlock(&ctl->mu);
        TIDE_WARN(SUBSYS, "ignored a layout for job %s (this rank runs '%s')", lm->job, ctl->job);
        tide_msg_clear(m);
        return;
    }
    if (!lm->has_prev) {
        int first = ctl->agree.gen == 0;
        pthread_mutex_unlock(&ctl->mu);
        if (first)
            to_main(ctl, m); /* tide_join is waiting for it */
        tide_msg_clear(m);
        return;
    }
    int member_old = ctl->agree.gen == lm->prev.gen && layout_has(&lm->prev, me);
    if (tide__agree_layout(&ctl->agree, lm->layout.gen, layout_has(&lm->layout, me), member_old)) {
        /* what was being built ahead for a generation this one replaces is given up */
        if (ctl->abort_fn != NULL)
            ctl->abort_fn(ctl->abort_ctx, 2);
        tide_msg_clear(&ctl->p_layout);
        ctl->p_layout = *m;
        tide_msg_init(m, TIDE_MSG_NONE);
        TIDE_INFO(SUBSYS, "generation %llu pending (%d x %d x %d)",
                  (unsigned long long)lm->layout.gen, lm->layout.dp, lm->layout.tp, lm->layout.pp);
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
    tide_msg_clear(m);
}

static void on_prepare(tide__ctl_t *ctl, const tide_proto_prepare_t *p)
{
    int64_t step = 0;
    pthread_mutex_lock(&ctl->mu);
    int part = ctl->agree.p_member || ctl->agree.p_old;
    if (ctl->prep_fn != NULL && strcmp(p->job, ctl->job) == 0 && p->gen == ctl->agree.p_gen &&
        part && !ctl->agree.p_acked && ctl->prep_start_gen != p->gen)
        ctl->prep_run_gen = p->gen; /* started by prep_tick, released ack or not */
    if (ctl->prep_fn != NULL && strcmp(p->job, ctl->job) == 0 && p->gen == ctl->agree.p_gen &&
        part && !ctl->agree.p_acked && ctl->prep_done_gen != p->gen &&
        ctl->prep_released_gen != p->gen) {
        /* The program prepares the new layout (allocates and first-touches its buffers)
           on prep_thread while its steps go on; the ack, which bounds the steps left,
           waits for that, or for the end of the step running now (prep_tick). */
        if (ctl->prep_want_gen != p->gen)
            TIDE_INFO(SUBSYS, "generation %llu: preparing before the ack",
                      (unsigned long long)p->gen);
        ctl->prep_want_gen = p->gen;
        pthread_cond_broadcast(&ctl->cv);
        pthread_mutex_unlock(&ctl->mu);
        return;
    }
    int ok = strcmp(p->job, ctl->job) == 0 && tide__agree_prepare(&ctl->agree, p->gen, &step);
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    if (!ok) {
        TIDE_INFO(SUBSYS, "ignored prepare for generation %llu of %s", (unsigned long long)p->gen,
                  p->job);
        return;
    }
    if (ctl->child.pid > 0) {
        /* tided preempts our offline work for this grow: ack once it has stopped */
        ctl->deferred_ack_gen = p->gen;
        return;
    }
    send_ack(ctl, p->gen, step);
}

static void on_commit(tide__ctl_t *ctl, const tide_proto_commit_t *c)
{
    pthread_mutex_lock(&ctl->mu);
    tide__commit_result r =
        strcmp(c->job, ctl->job) == 0
            ? tide__agree_commit(&ctl->agree, c->gen, (int64_t)c->step, c->recover)
            : TIDE__COMMIT_IGNORED;
    if (r == TIDE__COMMIT_ABORT_STEP && ctl->abort_fn != NULL) {
        TIDE_WARN(SUBSYS,
                  "generation %llu switches after step %llu, inside the step this rank "
                  "runs: a peer failed; aborting the step's communicators",
                  (unsigned long long)c->gen, (unsigned long long)c->step);
        ctl->abort_fn(ctl->abort_ctx, 0);
    }
    if (r == TIDE__COMMIT_ABORT_BUILD && ctl->abort_fn != NULL) {
        TIDE_WARN(SUBSYS,
                  "recovery generation %llu while the first layout's communicators are built: "
                  "a member failed; abandoning them",
                  (unsigned long long)c->gen);
        ctl->abort_fn(ctl->abort_ctx, 1); /* they are published as a switch's new groups */
    }
    if (r == TIDE__COMMIT_DUP && ctl->done_gen == c->gen && ctl->done_bytes != NULL)
        zmq_send(ctl->dealer, ctl->done_bytes, ctl->done_len, ZMQ_DONTWAIT);
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    TIDE_INFO(SUBSYS, "commit generation %llu at step %llu (%d)", (unsigned long long)c->gen,
              (unsigned long long)c->step, (int)r);
}

static void on_abort(tide__ctl_t *ctl, const tide_proto_abort_t *a)
{
    pthread_mutex_lock(&ctl->mu);
    tide__abort_result r = strcmp(a->job, ctl->job) == 0 ? tide__agree_abort(&ctl->agree, a->gen)
                                                         : TIDE__ABORT_IGNORED;
    if (r == TIDE__ABORT_CLEARED)
        tide_msg_clear(&ctl->p_layout);
    if (r == TIDE__ABORT_CLEARED && ctl->abort_fn != NULL)
        ctl->abort_fn(ctl->abort_ctx, 2); /* what was built ahead for it is given up */
    if (r == TIDE__ABORT_SWITCHING && ctl->abort_fn != NULL)
        ctl->abort_fn(ctl->abort_ctx, 1);
    int32_t id = ctl->worker_id;
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    TIDE_WARN(SUBSYS, "tided aborted generation %llu of %s: %s", (unsigned long long)a->gen, a->job,
              a->reason);
    if (r == TIDE__ABORT_SWITCHED) {
        tide_msg_t f;
        tide_msg_init(&f, TIDE_MSG_FAILURE);
        f.u.failure.worker = id;
        snprintf(f.u.failure.job, sizeof f.u.failure.job, "%s", a->job);
        f.u.failure.gen = a->gen;
        f.u.failure.code = TIDE_ERR_STALE;
        snprintf(f.u.failure.reason, sizeof f.u.failure.reason,
                 "generation %llu was aborted after this worker switched to it; its old state "
                 "is gone",
                 (unsigned long long)a->gen);
        send_dealer(ctl, &f);
    }
}

/* tided says the job cannot go on: every wait of the program ends with the reason, and
   collectives blocked on a dead peer are aborted. */
static void on_halt(tide__ctl_t *ctl, const tide_proto_halt_t *h)
{
    pthread_mutex_lock(&ctl->mu);
    int mine = strcmp(h->job, ctl->job) == 0 && ctl->halt_code == 0;
    if (mine) {
        ctl->halt_code = h->code;
        snprintf(ctl->halt_reason, sizeof ctl->halt_reason, "%s", h->reason);
        if (ctl->abort_fn != NULL) {
            ctl->abort_fn(ctl->abort_ctx, 0);
            ctl->abort_fn(ctl->abort_ctx, 1);
        }
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
    if (mine)
        TIDE_ERROR(SUBSYS, "tided halted job %s at generation %llu: %s", h->job,
                   (unsigned long long)h->gen, h->reason);
}

/* tided asks for a checkpoint at a step: the main thread takes it at its step ends. */
static void on_save(tide__ctl_t *ctl, const tide_proto_save_t *m)
{
    pthread_mutex_lock(&ctl->mu);
    int mine = strcmp(m->job, ctl->job) == 0 && m->step <= (uint64_t)INT64_MAX;
    if (mine) {
        snprintf(ctl->save_dir, sizeof ctl->save_dir, "%s", m->dir);
        ctl->save_step = (int64_t)m->step;
    }
    pthread_mutex_unlock(&ctl->mu);
    if (mine)
        TIDE_INFO(SUBSYS, "tided asks for a checkpoint of step %llu under %s",
                  (unsigned long long)m->step, m->dir);
}

static void on_assign(tide__ctl_t *ctl, tide_msg_t *m)
{
    tide_proto_offline_assign_t *a = &m->u.offline_assign;
    if (a->kind == TIDE_JOB_PLUGIN) {
        pthread_mutex_lock(&ctl->mu);
        int busy = ctl->plugin_ready || ctl->plugin_job[0] != '\0';
        if (!busy) {
            tide_msg_clear(&ctl->plugin);
            /* the job's name first: a points into m, which gives its contents away */
            snprintf(ctl->plugin_job, sizeof ctl->plugin_job, "%s", a->job);
            ctl->plugin = *m;
            tide_msg_init(m, TIDE_MSG_NONE);
            ctl->plugin_ready = 1;
            ctl->plugin_grace = -1;
            pthread_cond_broadcast(&ctl->cv);
        }
        pthread_mutex_unlock(&ctl->mu);
        if (busy)
            send_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        return;
    }
    pthread_mutex_lock(&ctl->mu);
    int leave = ctl->leave;
    pthread_mutex_unlock(&ctl->mu);
    if (leave) {
        /* not the job's failure: it never started, and goes elsewhere */
        TIDE_INFO(SUBSYS, "offline job %s assigned while this worker leaves: not started", a->job);
        send_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        return;
    }
    if (ctl->child.pid > 0) {
        TIDE_WARN(SUBSYS, "offline job %s assigned while %s runs: refused", a->job, ctl->child.job);
        send_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        return;
    }
    char dev[48], name[TIDE_PROTO_NAME_MAX + 32], cap[64], cuda[160], vis[128], att[48];
    char log[1024], logenv[1100];
    /* TIDE_OFFLINE_DEVICE is the index the child passes to its own device calls: on a GPU
       worker, CUDA_VISIBLE_DEVICES (below) shows the child this worker's GPU only, as its
       device 0, so it is 0 there; on a CPU worker, the worker's index on its host */
    int gpu = ctl->reg.kind == TIDE_DEVICE_GPU;
    snprintf(dev, sizeof dev, "TIDE_OFFLINE_DEVICE=%d", gpu ? 0 : ctl->reg.device);
    snprintf(name, sizeof name, "TIDE_OFFLINE_JOB=%s", a->job);
    snprintf(cap, sizeof cap, "TIDE_OFFLINE_MEM_CAP=%llu", (unsigned long long)a->mem_cap);
    snprintf(att, sizeof att, "TIDE_OFFLINE_ATTEMPT=%u", a->attempt);
    /* one file per job, attempt and worker process: attempts on one host never share it */
    if (tide_proto_attempt_log_path(log, sizeof log, ctl->log_dir, a->job, a->attempt,
                                    (int)getpid()) != TIDE_OK)
        log[0] = '\0'; /* cannot be: log_dir is at most 511 bytes; then no file, said below */
    snprintf(logenv, sizeof logenv, "TIDE_OFFLINE_LOG=%s", log);
    char *env[6] = {dev, name, cap, att, logenv, cuda};
    size_t n_env = 5;
    tide_status rc = TIDE_OK;
    if (gpu) {
        /* the child sees this worker's GPU only, as its device 0 */
        rc = tide__cuda_visible(getenv("CUDA_VISIBLE_DEVICES"), ctl->reg.device, vis, sizeof vis);
        snprintf(cuda, sizeof cuda, "CUDA_VISIBLE_DEVICES=%s", vis);
        n_env = 6;
    }
    if (!ctl->contain_known) {
        /* decided once per worker, and said once: what keeps an attempt together */
        char why[512] = "";
        ctl->contain_known = 1;
        if (tide__offline_cgroup_parent(ctl->cg_parent, sizeof ctl->cg_parent, why, sizeof why))
            TIDE_INFO(SUBSYS,
                      "offline commands are contained by a cgroup v2 per attempt under %s "
                      "(killed with cgroup.kill), their keeper as subreaper, and "
                      "PR_SET_PDEATHSIG",
                      ctl->cg_parent);
        else
            TIDE_INFO(SUBSYS,
                      "offline commands are contained by their keeper as subreaper of the "
                      "attempt, a process group and PR_SET_PDEATHSIG; no cgroup (%s)",
                      why);
    }
    if (rc == TIDE_OK)
        rc = log_dir_ready(ctl->log_dir, getenv("TIDE_LOG_DIR") == NULL);
    char cg[1300] = "";
    if (ctl->cg_parent[0] != '\0')
        snprintf(cg, sizeof cg, "%s/tide-%d-%s-%u", ctl->cg_parent, (int)getpid(), a->job,
                 a->attempt);
    if (rc == TIDE_OK) {
        tide__child_cfg cc = {a->job,       a->argv,     a->argc,          env, n_env, log,
                              ctl->log_cap, a->grace_ms, cg[0] ? cg : NULL};
        rc = tide__child_spawn(&ctl->child, &cc);
    }
    if (rc != TIDE_OK) {
        TIDE_WARN(SUBSYS, "%s", tide_last_error());
        send_offline_status(ctl, a->job, a->attempt, TIDE_JOB_FAILED, 127, "", tide_last_error());
        return;
    }
    ctl->child_attempt = a->attempt;
    pthread_mutex_lock(&ctl->mu);
    ctl->child_pid = ctl->child.pid;
    ctl->child_grace = ctl->child.grace_ms;
    snprintf(ctl->child_job, sizeof ctl->child_job, "%s", a->job);
    pthread_mutex_unlock(&ctl->mu);
    send_offline_status(ctl, a->job, a->attempt, TIDE_JOB_RUNNING, 0, log, "");
}

static void on_preempt(tide__ctl_t *ctl, const tide_proto_preempt_t *p)
{
    if (ctl->child.pid > 0 && strcmp(ctl->child.job, p->job) == 0) {
        tide__child_preempt(&ctl->child, p->grace_ms, tide_now_ns());
        return;
    }
    pthread_mutex_lock(&ctl->mu);
    int unstarted = 0;
    uint32_t attempt = 0;
    if (strcmp(ctl->plugin_job, p->job) == 0) {
        if (ctl->plugin_ready) {
            attempt = ctl->plugin.u.offline_assign.attempt;
            /* The main thread never took it (busy joining or stepping): it stops here,
               with nothing to save; tided waits for this report to reuse the worker. */
            tide_msg_clear(&ctl->plugin);
            tide_msg_init(&ctl->plugin, TIDE_MSG_NONE);
            ctl->plugin_ready = 0;
            ctl->plugin_job[0] = '\0';
            ctl->plugin_grace = -1;
            unstarted = 1;
        } else {
            ctl->plugin_grace = p->grace_ms;
        }
        pthread_cond_broadcast(&ctl->cv);
    }
    pthread_mutex_unlock(&ctl->mu);
    if (unstarted)
        send_offline_status(ctl, p->job, attempt, TIDE_JOB_PREEMPTED, -15, "", "");
}

static void child_tick(tide__ctl_t *ctl)
{
    int code = 0;
    if (!tide__child_poll(&ctl->child, tide_now_ns(), &code))
        return;
    tide_proto_job_state_t st = ctl->child.preempted ? TIDE_JOB_PREEMPTED
                                : code == 0          ? TIDE_JOB_DONE
                                                     : TIDE_JOB_FAILED;
    TIDE_INFO(SUBSYS, "offline job %s ended: %s, exit code %d", ctl->child.job,
              tide_proto_job_state_name(st), code);
    /* The slot is free before tided hears of the end (it may assign the next job). */
    pthread_mutex_lock(&ctl->mu);
    ctl->child_pid = 0;
    ctl->child_job[0] = '\0';
    pthread_cond_broadcast(&ctl->cv); /* destroy may wait for it */
    pthread_mutex_unlock(&ctl->mu);
    char tail[TIDE_PROTO_TAIL_MAX + 1];
    read_tail(ctl->child.log, tail, sizeof tail);
    send_offline_status(ctl, ctl->child.job, ctl->child_attempt, st, code, ctl->child.log, tail);
    pthread_mutex_lock(&ctl->mu);
    int64_t step = ctl->agree.p_ack;
    uint64_t gen = ctl->deferred_ack_gen;
    int still = gen != 0 && ctl->agree.p_gen == gen;
    pthread_mutex_unlock(&ctl->mu);
    ctl->deferred_ack_gen = 0;
    if (still)
        send_ack(ctl, gen, step);
}

/* 1 once this process was fenced; takes ctl's lock. */
static int tide__ctl_fenced_now(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int f = ctl->fenced;
    pthread_mutex_unlock(&ctl->mu);
    return f;
}

static void on_message(tide__ctl_t *ctl, const void *data, size_t len)
{
    tide_msg_t m;
    if (tide_proto_decode(data, len, &m) != TIDE_OK) {
        TIDE_WARN(SUBSYS, "malformed message from tided (%zu bytes): %s", len, tide_last_error());
        return;
    }
    switch (m.type) {
    case TIDE_MSG_REGISTER_OK: {
        pthread_mutex_lock(&ctl->mu);
        int fenced = ctl->fenced;
        if (!fenced) {
            ctl->worker_id = m.u.register_ok.worker;
            ctl->registered = 1;
            ctl->ever_registered = 1;
            ctl->hb_ms = ctl->hb_fixed_ms > 0 ? ctl->hb_fixed_ms : m.u.register_ok.heartbeat_ms;
            ctl->fail_ms = m.u.register_ok.fail_ms;
        }
        pthread_cond_broadcast(&ctl->cv);
        pthread_mutex_unlock(&ctl->mu);
        if (fenced)
            break;
        TIDE_INFO(SUBSYS, "registered as worker %d (heartbeat %d ms, failure after %d ms)",
                  m.u.register_ok.worker, m.u.register_ok.heartbeat_ms, m.u.register_ok.fail_ms);
        /* tided counts from this message: so does the lease */
        ctl->last_hb_ns = tide_now_ns();
        ctl->self_ns = ctl->last_hb_ns; /* its own message: covered from here */
        tide_coll_lease_set(ctl->last_hb_ns + (uint64_t)m.u.register_ok.fail_ms * 1000000ull);
        ctl->next_hb_ns = tide_now_ns();
        break;
    }
    case TIDE_MSG_FENCED: {
        char why[TIDE_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "tided fenced worker %d: %s", m.u.fenced.worker,
                 m.u.fenced.reason);
        fence(ctl, why, 0);
        break;
    }
    case TIDE_MSG_LIVENESS_REPLY:
        to_main(ctl, &m);
        break;
    case TIDE_MSG_LAYOUT:
        on_layout(ctl, &m);
        break;
    case TIDE_MSG_JOIN_PORT:
        on_join_port(ctl, &m.u.join_port);
        break;
    case TIDE_MSG_JOB_END:
        on_job_end(ctl, &m.u.job_end);
        break;
    case TIDE_MSG_RELEASE:
        on_release(ctl, &m.u.release);
        break;
    case TIDE_MSG_PREPARE:
        on_prepare(ctl, &m.u.prepare);
        break;
    case TIDE_MSG_COMMIT:
        on_commit(ctl, &m.u.commit);
        break;
    case TIDE_MSG_ABORT:
        on_abort(ctl, &m.u.abort_);
        break;
    case TIDE_MSG_HALT:
        on_halt(ctl, &m.u.halt);
        break;
    case TIDE_MSG_SAVE:
        on_save(ctl, &m.u.save);
        break;
    case TIDE_MSG_OFFLINE_ASSIGN:
        on_assign(ctl, &m);
        break;
    case TIDE_MSG_PREEMPT:
        on_preempt(ctl, &m.u.preempt);
        break;
    case TIDE_MSG_ERROR:
        pthread_mutex_lock(&ctl->mu);
        int said_bye = ctl->bye;
        pthread_mutex_unlock(&ctl->mu);
        if ((m.u.error.code == TIDE_ERR_NOT_FOUND || m.u.error.code == TIDE_ERR_STALE) &&
            strstr(m.u.error.message, "register") != NULL && !tide__ctl_fenced_now(ctl) &&
            !said_bye) {
            /* tided lost us (new state file) or declared us failed: register again */
            TIDE_WARN(SUBSYS, "tided: %s; registering again", m.u.error.message);
            pthread_mutex_lock(&ctl->mu);
            ctl->registered = 0;
            pthread_mutex_unlock(&ctl->mu);
            send_register(ctl);
        } else {
            TIDE_INFO(SUBSYS, "tided error %d: %s", m.u.error.code, m.u.error.message);
        }
        to_main(ctl, &m);
        break;
    case TIDE_MSG_OK:
    case TIDE_MSG_STATUS_REPLY:
        to_main(ctl, &m);
        break;
    default:
        TIDE_WARN(SUBSYS, "unexpected '%s' from tided", tide_msg_type_name(m.type));
        break;
    }
    tide_msg_clear(&m);
}

typedef struct prep_arg {
    tide__ctl_t *ctl;
    uint64_t gen;
    tide_msg_t layout; /* a copy of the pending layout message */
} prep_arg;

static void *prep_main(void *arg)
{
    prep_arg *a = arg;
    tide__ctl_t *ctl = a->ctl;
    ctl->prep_fn(ctl->prep_ctx, a->gen, &a->layout.u.layout); /* prep_fn is fixed while busy */
    pthread_mutex_lock(&ctl->mu);
    ctl->prep_busy = 0;
    if (a->gen > ctl->prep_done_gen)
        ctl->prep_done_gen = a->gen;
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
    tide_msg_clear(&a->layout);
    tide_free(a);
    return NULL;
}

/* A deep copy of a layout message (through its encoding: one reader, one writer). */
static tide_status copy_layout_msg(const tide_msg_t *m, tide_msg_t *out)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(m, &b);
    if (rc == TIDE_OK)
        rc = tide_proto_decode(b.data, b.len, out);
    tide_proto_buf_destroy(&b);
    return rc;
}

/* Starts prep_fn for the generation that wants it (prep_run_gen) when it is still
   pending and no preparation runs (one of a generation it replaced may still be ending:
   tried again on the next tick). */
static void prep_start(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    uint64_t gen = ctl->prep_run_gen;
    const tide_msg_t *pm = ctl->p_layout.type == TIDE_MSG_LAYOUT ? &ctl->p_layout : NULL;
    if (gen != 0 && (ctl->agree.p_gen != gen || pm == NULL || pm->u.layout.layout.gen != gen))
        ctl->prep_run_gen = gen = 0; /* gone: aborted or replaced */
    if (gen == 0 || ctl->prep_busy || ctl->prep_start_gen == gen || ctl->prep_fn == NULL) {
        pthread_mutex_unlock(&ctl->mu);
        return;
    }
    ctl->prep_start_gen = gen;
    ctl->prep_run_gen = 0;
    prep_arg *a = tide_calloc(1, sizeof *a);
    tide_status rc = a != NULL ? copy_layout_msg(pm, &a->layout) : TIDE_ERR_NOMEM;
    if (rc == TIDE_OK)
        ctl->prep_busy = 1;
    pthread_mutex_unlock(&ctl->mu);
    if (rc == TIDE_OK) {
        a->ctl = ctl;
        a->gen = gen;
        if (ctl->prep_started)
            pthread_join(ctl->prep_thread, NULL); /* it finished: not busy */
        ctl->prep_started = 0;
        if (pthread_create(&ctl->prep_thread, NULL, prep_main, a) == 0) {
            ctl->prep_started = 1;
            return;
        }
        tide_msg_clear(&a->layout);
    }
    tide_free(a);
    TIDE_WARN(SUBSYS, "cannot prepare generation %llu; it switches unprepared",
              (unsigned long long)gen);
    pthread_mutex_lock(&ctl->mu);
    ctl->prep_busy = 0;
    ctl->prep_done_gen = gen;
    pthread_cond_broadcast(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
}

/* A prepare held for the program: start the preparation, and ack once it is done or the
   main thread ended a step meanwhile (so that no peer that acked at once waits for this
   rank's steps); nothing is sent when the generation went away (aborted, superseded). */
static void prep_tick(tide__ctl_t *ctl)
{
    prep_start(ctl);
    pthread_mutex_lock(&ctl->mu);
    uint64_t gen = ctl->prep_want_gen;
    int ready = gen != 0 && (ctl->prep_done_gen == gen || ctl->prep_released_gen == gen);
    int gone = gen != 0 && ctl->agree.p_gen != gen;
    if (ready || gone)
        ctl->prep_want_gen = 0;
    tide_proto_prepare_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.job, sizeof p.job, "%s", ctl->job);
    p.gen = gen;
    pthread_mutex_unlock(&ctl->mu);
    if (ready && !gone)
        on_prepare(ctl, &p);
}

/* ---- the thread ------------------------------------------------------------------------ */

/* Forwards what the main thread queued on the PAIR socket to tided. */
static void forward_main(tide__ctl_t *ctl)
{
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, ctl->pair_bg, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        if (zmq_msg_size(&f) > 0 && zmq_msg_send(&f, ctl->dealer, ZMQ_DONTWAIT) < 0)
            TIDE_WARN(SUBSYS, "dropped a message to tided: %s", zmq_strerror(errno));
        zmq_msg_close(&f);
    }
}

static unsigned monitor_events(tide__ctl_t *ctl);

static void *run(void *arg)
{
    tide__ctl_t *ctl = arg;
    send_register(ctl);
    for (;;) {
        pthread_mutex_lock(&ctl->mu);
        int stop = ctl->stop, registered = ctl->registered;
        pthread_mutex_unlock(&ctl->mu);
        pthread_mutex_lock(&ctl->mu);
        int leave = ctl->leave;
        pthread_mutex_unlock(&ctl->mu);
        if (leave && ctl->child.pid > 0 && !ctl->leaving) {
            /* The worker leaves: its command gets SIGTERM and its grace, as a preemption
               would, while heartbeats go on; destroy waits for its end before the bye. */
            ctl->leaving = 1;
            TIDE_INFO(SUBSYS, "leaving: stopping offline job %s (grace %d ms)", ctl->child.job,
                      ctl->child.grace_ms);
            tide__child_preempt(&ctl->child, ctl->child.grace_ms, tide_now_ns());
        }
        if (stop) {
            forward_main(ctl); /* a last bye */
            break;
        }
        uint64_t now = tide_now_ns();
        uint64_t due = registered ? ctl->next_hb_ns : ctl->next_reg_ns;
        long timeout = due > now ? (long)((due - now) / 1000000ull) + 1 : 0;
        if (ctl->child.pid > 0 && timeout > 20)
            timeout = 20;
        pthread_mutex_lock(&ctl->mu);
        int preparing = ctl->prep_want_gen != 0 || ctl->prep_run_gen != 0;
        pthread_mutex_unlock(&ctl->mu);
        if (preparing && timeout > 2)
            timeout = 2; /* the program's prepare ends on its thread: ack it promptly */
        pthread_mutex_lock(&ctl->mu);
        int mon = ctl->mon_bg && ctl->mon != NULL;
        pthread_mutex_unlock(&ctl->mu);
        zmq_pollitem_t items[3] = {{ctl->dealer, 0, ZMQ_POLLIN, 0},
                                   {ctl->pair_bg, 0, ZMQ_POLLIN, 0},
                                   {mon ? ctl->mon : NULL, 0, ZMQ_POLLIN, 0}};
        int r = zmq_poll(items, mon ? 3 : 2, timeout);
        if (r > 0 && mon && (items[2].revents & ZMQ_POLLIN))
            monitor_events(ctl);
        if (r < 0 && errno != EINTR) {
            TIDE_ERROR(SUBSYS, "zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (r > 0 && (items[1].revents & ZMQ_POLLIN))
            forward_main(ctl);
        if (r > 0 && (items[0].revents & ZMQ_POLLIN)) {
            for (int k = 0; k < 64; k++) {
                zmq_msg_t f;
                zmq_msg_init(&f);
                if (zmq_msg_recv(&f, ctl->dealer, ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&f);
                    break;
                }
                if (!zmq_msg_more(&f))
                    on_message(ctl, zmq_msg_data(&f), zmq_msg_size(&f));
                zmq_msg_close(&f);
            }
        }
        if (ctl->child.pid > 0)
            child_tick(ctl);
        if (preparing)
            prep_tick(ctl);
        for (;;) { /* checkpoint reports, oldest first */
            tide_msg_t saved;
            tide_msg_init(&saved, TIDE_MSG_SAVED);
            pthread_mutex_lock(&ctl->mu);
            int have = ctl->n_saved > 0 && !ctl->fenced;
            if (have) {
                saved.u.saved = ctl->saved_q[0];
                ctl->n_saved--;
                memmove(&ctl->saved_q[0], &ctl->saved_q[1],
                        (size_t)ctl->n_saved * sizeof ctl->saved_q[0]);
            }
            pthread_mutex_unlock(&ctl->mu);
            if (!have)
                break;
            send_dealer(ctl, &saved);
        }
        now = tide_now_ns();
        pthread_mutex_lock(&ctl->mu);
        registered = ctl->registered;
        pthread_mutex_unlock(&ctl->mu);
        if (ctl->host != NULL && now >= ctl->next_hb_ns)
            host_tick(ctl);
        else if (registered && now >= ctl->next_hb_ns)
            send_heartbeat(ctl);
        if (!registered && now >= ctl->next_reg_ns)
            send_register(ctl);
    }
    return NULL;
}

/* ---- CURVE keys ------------------------------------------------------------------------- */

/* Sets the CURVE keys on sock from TIDE_KEY's key pair file and TIDE_SERVER_KEY (a file
 * or its Z85 text), both read by core/keyfile, the reader tided and tidectl use. */
static tide_status setup_curve(void *sock, const char *key_file, const char *server_key)
{
    tide_keyfile k;
    char srv[TIDE_KEY_Z85_LEN + 1];
    if (tide_keyfile_read_pair(key_file, &k) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "TIDE_KEY: %s", tide_last_error());
    if (server_key == NULL || server_key[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "TIDE_KEY is set but TIDE_SERVER_KEY is not: give "
                                             "tided's public key (server.pub or its Z85 text)");
    if (tide_keyfile_server_key(server_key, srv) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "TIDE_SERVER_KEY: %s", tide_last_error());
    tide_status rc = TIDE_OK;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, srv, sizeof srv) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k.public_key, sizeof k.public_key) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k.secret_key, sizeof k.secret_key) != 0)
        rc = tide_errorf(TIDE_ERR_INVALID, "cannot use the CURVE keys (%s / %s): %s", key_file,
                         server_key, zmq_strerror(errno));
    memset(&k, 0, sizeof k);
    return rc;
}

/* Reads the monitor's events waiting: the first failed handshake (a
 * ZMQ_EVENT_HANDSHAKE_FAILED_* value, else 0) is returned; a connection made sets
 * introduce. The main thread until tide__ctl_new returns, the background thread after. */
static unsigned monitor_events(tide__ctl_t *ctl)
{
    unsigned found = 0;
    while (ctl->mon != NULL) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, ctl->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f) >= sizeof ev)
            memcpy(&ev, zmq_msg_data(&f), sizeof ev);
        int more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, ctl->mon, 0) < 0)
                more = 0;
            else
                more = zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        if (ev == ZMQ_EVENT_CONNECTED) {
            pthread_mutex_lock(&ctl->mu);
            ctl->introduce = 1;
            pthread_mutex_unlock(&ctl->mu);
        } else if (found == 0) {
            found = ev;
        }
    }
    return found;
}

/* The first failed-handshake event waiting on the monitor, or 0. Main thread. */
static unsigned handshake_refused(tide__ctl_t *ctl)
{
    return monitor_events(ctl);
}

/* ---- lifecycle (main thread) ------------------------------------------------------------- */

tide_status tide__ctl_new(tide__ctl_t **out, const tide__ctl_config *cfg)
{
    tide_status rc = TIDE_OK;
    *out = NULL;
    if (cfg->endpoint == NULL || cfg->endpoint[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "no tided endpoint: set TIDE_ENDPOINT");
    if (strlen(cfg->endpoint) >= 512)
        return tide_errorf(TIDE_ERR_INVALID, "tided endpoint too long");
    tide_msg_t probe;
    tide_msg_init(&probe, TIDE_MSG_REGISTER);
    probe.u.reg = cfg->reg;
    if (tide_msg_validate(&probe) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "cannot register: %s", tide_last_error());
    tide__ctl_t *ctl = tide_calloc(1, sizeof *ctl);
    if (ctl == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting the control client");
    snprintf(ctl->endpoint, sizeof ctl->endpoint, "%s", cfg->endpoint);
    ctl->reg = cfg->reg;
    ctl->hb_fixed_ms = cfg->heartbeat_ms;
    ctl->plugin_grace = -1;
    ctl->host = cfg->host;
    if (ctl->host != NULL) {
        size_t n = (size_t)tide__hostbeat_ranks(ctl->host);
        ctl->hb_beats = tide_calloc(n, sizeof *ctl->hb_beats);
        ctl->hb_seqs = tide_calloc(n, sizeof *ctl->hb_seqs);
        ctl->hb_slots = tide_calloc(n, sizeof *ctl->hb_slots);
        if (ctl->hb_beats == NULL || ctl->hb_seqs == NULL || ctl->hb_slots == NULL) {
            tide_free(ctl->hb_beats);
            tide_free(ctl->hb_seqs);
            tide_free(ctl->hb_slots);
            tide_free(ctl);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory for host heartbeats");
        }
    }
    const char *log_dir = getenv("TIDE_LOG_DIR");
    if (log_dir != NULL && log_dir[0] != '\0')
        snprintf(ctl->log_dir, sizeof ctl->log_dir, "%s", log_dir);
    else
        snprintf(ctl->log_dir, sizeof ctl->log_dir, "/tmp/tide-logs-%u", (unsigned)getuid());
    const char *cap_env = getenv("TIDE_OFFLINE_LOG_CAP");
    char *cap_end = NULL;
    unsigned long long cap = cap_env ? strtoull(cap_env, &cap_end, 10) : 0;
    ctl->log_cap = cap_env && cap_end != cap_env && *cap_end == '\0' ? cap : TIDE__LOG_CAP_DEFAULT;
    if (cap_env != NULL && ctl->log_cap != cap)
        TIDE_WARN(SUBSYS, "TIDE_OFFLINE_LOG_CAP=%s is not a byte count; using %llu", cap_env,
                  (unsigned long long)ctl->log_cap);
    tide__agree_init(&ctl->agree, 0);
    ctl->save_step = -1;
    tide_proto_buf_init(&ctl->buf);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&ctl->mu, NULL);
    pthread_cond_init(&ctl->cv, &ca);
    pthread_condattr_destroy(&ca);
    TIDE_CHECK_GOTO(tide__mailbox_new(&ctl->replies), rc, fail);
    ctl->zctx = zmq_ctx_new();
    if (ctl->zctx == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    ctl->dealer = zmq_socket(ctl->zctx, ZMQ_DEALER);
    ctl->pair_bg = zmq_socket(ctl->zctx, ZMQ_PAIR);
    ctl->pair_main = zmq_socket(ctl->zctx, ZMQ_PAIR);
    if (ctl->dealer == NULL || ctl->pair_bg == NULL || ctl->pair_main == NULL)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "zmq_socket: %s", zmq_strerror(errno));
    int linger = 500, hwm = 100000, zero = 0;
    int64_t maxmsg = (int64_t)TIDE_PROTO_MAX_MSG_BYTES + 1024;
    zmq_setsockopt(ctl->dealer, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(ctl->dealer, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ctl->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(ctl->pair_bg, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(ctl->pair_main, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(ctl->pair_main, ZMQ_SNDHWM, &zero, sizeof zero); /* never drop */
    zmq_setsockopt(ctl->pair_bg, ZMQ_RCVHWM, &zero, sizeof zero);
    if (cfg->key_file != NULL && cfg->key_file[0] != '\0')
        TIDE_CHECK_GOTO(setup_curve(ctl->dealer, cfg->key_file, cfg->server_key), rc, fail);
    {
        /* a refused handshake never produces a reply: watch for it so that tide_new fails
         * at once with the reason instead of timing out */
        char mon_ep[64];
        snprintf(mon_ep, sizeof mon_ep, "inproc://tide-ctl-mon-%p", (void *)ctl);
        /* with host heartbeats, connections too: after a reconnect (tided restarted, a
           network blip) tided knows no route to this rank until it speaks itself */
        if (zmq_socket_monitor(ctl->dealer, mon_ep,
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   (ctl->host != NULL ? ZMQ_EVENT_CONNECTED : 0)) == 0) {
            ctl->mon = zmq_socket(ctl->zctx, ZMQ_PAIR);
            if (ctl->mon != NULL) {
                zmq_setsockopt(ctl->mon, ZMQ_LINGER, &zero, sizeof zero);
                if (zmq_connect(ctl->mon, mon_ep) != 0) {
                    zmq_close(ctl->mon);
                    ctl->mon = NULL;
                }
            }
        }
    }
    if (zmq_connect(ctl->dealer, ctl->endpoint) != 0)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_INVALID, "cannot connect to tided at %s: %s",
                       ctl->endpoint, zmq_strerror(errno));
    char inproc[64];
    snprintf(inproc, sizeof inproc, "inproc://tide-ctl-%p", (void *)ctl);
    if (zmq_bind(ctl->pair_bg, inproc) != 0 || zmq_connect(ctl->pair_main, inproc) != 0)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "inproc pair: %s", zmq_strerror(errno));
    if (pthread_create(&ctl->thread, NULL, run, ctl) != 0)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_IO, "cannot start the heartbeat thread");
    ctl->thread_started = 1;

    /* wait for register_ok */
    int timeout = cfg->register_timeout_ms > 0 ? cfg->register_timeout_ms : 10000;
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout * 1000000ull;
    pthread_mutex_lock(&ctl->mu);
    int refused = 0;
    while (!ctl->registered && !ctl->fenced && !refused && tide_now_ns() < deadline) {
        tide__ctl_wait(ctl, 50);
        pthread_mutex_unlock(&ctl->mu);
        refused = handshake_refused(ctl);
        pthread_mutex_lock(&ctl->mu);
    }
    int ok = ctl->registered;
    char fenced[TIDE_PROTO_TEXT_MAX + 1] = "";
    if (!ok && ctl->fenced)
        snprintf(fenced, sizeof fenced, "%s", ctl->fence_reason);
    pthread_mutex_unlock(&ctl->mu);
    if (fenced[0] != '\0')
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_STALE,
                       "tided refused this process: %s (a process it gave up on cannot rejoin: "
                       "start a new one)",
                       fenced);
    if (!ok && refused)
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_DENIED,
                       "tided at %s refused the connection: the CURVE handshake failed (%s). %s",
                       ctl->endpoint,
                       refused == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "key not allowed"
                                                                  : "protocol error",
                       cfg->key_file ? "Is TIDE_KEY's .pub in tided's --auth directory, and "
                                       "TIDE_SERVER_KEY tided's server.pub?"
                                     : "tided requires CURVE: set TIDE_KEY (a worker key pair "
                                       "from tidectl keygen) and TIDE_SERVER_KEY");
    if (!ok) {
        tide_msg_t m;
        char why[TIDE_PROTO_TEXT_MAX + 8] = "";
        while (tide__mailbox_pop(ctl->replies, &m, 0) == TIDE_OK) {
            if (m.type == TIDE_MSG_ERROR)
                snprintf(why, sizeof why, ": %s", m.u.error.message);
            tide_msg_clear(&m);
        }
        TIDE_FAIL_GOTO(rc, fail, TIDE_ERR_TIMEOUT,
                       "tided at %s did not accept registration within %d ms%s (is tided "
                       "running? check TIDE_ENDPOINT%s)",
                       ctl->endpoint, timeout, why,
                       cfg->key_file ? ", TIDE_KEY and TIDE_SERVER_KEY" : "");
    }
    pthread_mutex_lock(&ctl->mu);
    ctl->mon_bg = 1; /* the monitor is the background thread's from now on */
    pthread_mutex_unlock(&ctl->mu);
    zmq_send(ctl->pair_main, "", 0, 0); /* wake it to poll the monitor too */
    *out = ctl;
    return TIDE_OK;
fail:
    tide__ctl_destroy(&ctl, 0);
    return rc;
}

void tide__ctl_destroy(tide__ctl_t **self_p, int say_bye)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__ctl_t *ctl = *self_p;
    if (ctl->thread_started) {
        /* the offline command first, while heartbeats go on: SIGTERM, then its grace */
        pthread_mutex_lock(&ctl->mu);
        ctl->leave = 1;
        pthread_mutex_unlock(&ctl->mu);
        zmq_send(ctl->pair_main, "", 0, 0); /* wake the thread */
        pthread_mutex_lock(&ctl->mu);
        uint64_t until = tide_now_ns() + ((uint64_t)TIDE__KEEPER_SLACK_MS + 2000u +
                                          (uint64_t)(ctl->child_grace > 0 ? ctl->child_grace : 0)) *
                                             1000000ull;
        while (ctl->child_pid > 0 && tide_now_ns() < until)
            tide__ctl_wait(ctl, 50);
        pthread_mutex_unlock(&ctl->mu);
        pthread_mutex_lock(&ctl->mu);
        int registered = ctl->ever_registered;
        int32_t id = ctl->worker_id;
        /* the step the program really ended at: heartbeats carry it only once a period */
        int64_t done = ctl->agree.completed;
        pthread_mutex_unlock(&ctl->mu);
        pthread_mutex_lock(&ctl->mu);
        ctl->bye = say_bye && registered;
        if (ctl->bye && ctl->host != NULL)
            tide__hostbeat_inactive(ctl->host); /* no leader speaks for it after its bye */
        pthread_mutex_unlock(&ctl->mu);
        if (say_bye && registered) {
            tide_msg_t m;
            tide_msg_init(&m, TIDE_MSG_BYE);
            m.u.bye.worker = id;
            m.u.bye.step = done > 0 ? (uint64_t)done : 0;
            tide__ctl_send(ctl, &m);
        }
        pthread_mutex_lock(&ctl->mu);
        ctl->stop = 1;
        pthread_mutex_unlock(&ctl->mu);
        zmq_send(ctl->pair_main, "", 0, 0); /* wake the thread (after the bye) */
        pthread_join(ctl->thread, NULL);
    }
    if (ctl->prep_started) /* the background thread is gone: only this thread joins */
        pthread_join(ctl->prep_thread, NULL);
    if (ctl->child.pid > 0) {
        /* the thread never ran the stop (it failed): the work cannot outlive the worker */
        int code = tide__child_stop(&ctl->child, ctl->child.grace_ms);
        char tail[TIDE_PROTO_TAIL_MAX + 1];
        read_tail(ctl->child.log, tail, sizeof tail);
        send_offline_status(ctl, ctl->child.job, ctl->child_attempt, TIDE_JOB_PREEMPTED, code,
                            ctl->child.log, tail);
    }
    if (ctl->mon)
        zmq_close(ctl->mon);
    if (ctl->dealer)
        zmq_close(ctl->dealer);
    if (ctl->pair_bg)
        zmq_close(ctl->pair_bg);
    if (ctl->pair_main)
        zmq_close(ctl->pair_main);
    if (ctl->zctx)
        zmq_ctx_term(ctl->zctx);
    tide__mailbox_destroy(&ctl->replies);
    tide_msg_clear(&ctl->p_layout);
    tide_msg_clear(&ctl->plugin);
    tide_free(ctl->done_bytes);
    tide_free(ctl->hb_beats);
    tide_free(ctl->hb_seqs);
    tide_free(ctl->hb_slots);
    tide_proto_buf_destroy(&ctl->buf);
    pthread_mutex_destroy(&ctl->mu);
    pthread_cond_destroy(&ctl->cv);
    tide_free(ctl);
    *self_p = NULL;
}

int32_t tide__ctl_worker_id(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int32_t id = ctl->worker_id;
    pthread_mutex_unlock(&ctl->mu);
    return id;
}

tide_status tide__ctl_send(tide__ctl_t *ctl, const tide_msg_t *msg)
{
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_encode(msg, &b);
    if (rc != TIDE_OK) {
        tide_proto_buf_destroy(&b);
        return rc;
    }
    if (msg->type == TIDE_MSG_DONE) {
        uint8_t *copy = tide_malloc(b.len);
        pthread_mutex_lock(&ctl->mu);
        if (copy != NULL) {
            memcpy(copy, b.data, b.len);
            tide_free(ctl->done_bytes);
            ctl->done_bytes = copy;
            ctl->done_len = b.len;
            ctl->done_gen = msg->u.done.gen;
        }
        pthread_mutex_unlock(&ctl->mu);
    }
    int r = zmq_send(ctl->pair_main, b.data, b.len, 0);
    tide_proto_buf_destroy(&b);
    if (r < 0)
        return tide_errorf(TIDE_ERR_IO, "cannot hand a '%s' to the heartbeat thread: %s",
                           tide_msg_type_name(msg->type), zmq_strerror(errno));
    return TIDE_OK;
}

tide_status tide__ctl_reply(tide__ctl_t *ctl, tide_msg_t *out, int timeout_ms)
{
    return tide__mailbox_pop(ctl->replies, out, timeout_ms);
}

void tide__ctl_set_abort(tide__ctl_t *ctl, tide__abort_fn fn, void *ctx)
{
    pthread_mutex_lock(&ctl->mu);
    ctl->abort_fn = fn;
    ctl->abort_ctx = ctx;
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_set_job(tide__ctl_t *ctl, const char *job, int64_t start_step)
{
    pthread_mutex_lock(&ctl->mu);
    snprintf(ctl->job, sizeof ctl->job, "%s", job);
    tide__agree_init(&ctl->agree, start_step);
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_lock(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
}

void tide__ctl_unlock(tide__ctl_t *ctl)
{
    pthread_mutex_unlock(&ctl->mu);
}

tide__agree *tide__ctl_agree(tide__ctl_t *ctl)
{
    return &ctl->agree;
}

const tide_proto_layout_msg_t *tide__ctl_pending_layout(tide__ctl_t *ctl)
{
    return ctl->p_layout.type == TIDE_MSG_LAYOUT ? &ctl->p_layout.u.layout : NULL;
}

void tide__ctl_wait(tide__ctl_t *ctl, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&ctl->cv, &ctl->mu, &ts);
}

void tide__ctl_add_idle(tide__ctl_t *ctl, uint64_t ns)
{
    pthread_mutex_lock(&ctl->mu);
    ctl->idle_ns += ns;
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_add_bubble(tide__ctl_t *ctl, uint64_t ns, uint64_t filled_ns)
{
    pthread_mutex_lock(&ctl->mu);
    ctl->bubble_ns += ns;
    ctl->filled_ns += filled_ns;
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_add_step(tide__ctl_t *ctl, uint64_t ns)
{
    pthread_mutex_lock(&ctl->mu);
    ctl->step_ns += ns;
    ctl->steps++;
    pthread_mutex_unlock(&ctl->mu);
}

int tide__ctl_take_plugin(tide__ctl_t *ctl, int bubbles_only, tide_msg_t *out)
{
    if (!ctl->plugin_ready || (bubbles_only && !ctl->plugin.u.offline_assign.bubbles))
        return 0;
    *out = ctl->plugin;
    tide_msg_init(&ctl->plugin, TIDE_MSG_NONE);
    ctl->plugin_ready = 0;
    return 1;
}

int tide__ctl_take_save(tide__ctl_t *ctl, char *dir, size_t len, int64_t *step)
{
    if (ctl->save_step < 0)
        return 0;
    snprintf(dir, len, "%s", ctl->save_dir);
    *step = ctl->save_step;
    ctl->save_step = -1;
    return 1;
}

void tide__ctl_post_saved(tide__ctl_t *ctl, const tide_proto_saved_t *m)
{
    pthread_mutex_lock(&ctl->mu);
    if (ctl->n_saved == TIDE__SAVED_QUEUE) { /* tided silent that long: the oldest goes */
        TIDE_WARN(SUBSYS, "checkpoint report of step %llu dropped: %d newer ones wait",
                  (unsigned long long)ctl->saved_q[0].step, TIDE__SAVED_QUEUE);
        ctl->n_saved--;
        memmove(&ctl->saved_q[0], &ctl->saved_q[1], (size_t)ctl->n_saved * sizeof *m);
    }
    ctl->saved_q[ctl->n_saved] = *m;
    ctl->saved_q[ctl->n_saved].worker = ctl->worker_id;
    ctl->n_saved++;
    pthread_mutex_unlock(&ctl->mu);
}

int tide__ctl_halted(tide__ctl_t *ctl, char *why, size_t len)
{
    if (ctl->halt_code != 0 && why != NULL && len > 0)
        snprintf(why, len, "%s", ctl->halt_reason);
    return ctl->halt_code;
}

int tide__ctl_fenced(tide__ctl_t *ctl, char *why, size_t len)
{
    if (ctl->fenced && why != NULL && len > 0)
        snprintf(why, len, "%s", ctl->fence_reason);
    return ctl->fenced;
}

int tide__ctl_plugin_preempted(tide__ctl_t *ctl, const char *job)
{
    return strcmp(ctl->plugin_job, job) == 0 ? ctl->plugin_grace : -1;
}

void tide__ctl_plugin_finished(tide__ctl_t *ctl, const char *job)
{
    if (strcmp(ctl->plugin_job, job) == 0) {
        ctl->plugin_job[0] = '\0';
        ctl->plugin_grace = -1;
    }
}

int tide__ctl_offline_pid(tide__ctl_t *ctl, char *job, size_t len)
{
    pthread_mutex_lock(&ctl->mu);
    int pid = (int)ctl->child_pid;
    if (job != NULL && len > 0)
        snprintf(job, len, "%s", ctl->child_job);
    pthread_mutex_unlock(&ctl->mu);
    return pid;
}

void tide__ctl_set_prepare(tide__ctl_t *ctl, tide__prepare_fn fn, void *ctx)
{
    pthread_mutex_lock(&ctl->mu);
    while (ctl->prep_busy)
        tide__ctl_wait(ctl, 100);
    ctl->prep_fn = fn;
    ctl->prep_ctx = ctx;
    if (fn == NULL)
        ctl->prep_released_gen = ctl->prep_want_gen; /* release a held prepare */
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_prepare_release(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    if (ctl->prep_want_gen != 0)
        ctl->prep_released_gen = ctl->prep_want_gen;
    pthread_mutex_unlock(&ctl->mu);
}

void tide__ctl_prepare_wait(tide__ctl_t *ctl)
{
    /* also one that is still to start for the pending generation (prep_tick starts it
       within milliseconds): its peers build communicators in theirs, and this rank's
       switch must find what they found */
    while (ctl->prep_busy || (ctl->prep_run_gen != 0 && ctl->prep_run_gen == ctl->agree.p_gen &&
                              ctl->prep_fn != NULL))
        tide__ctl_wait(ctl, 100);
}
