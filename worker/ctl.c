/*
 * worker/ctl: libtide's control client. A background thread owns the ZeroMQ DEALER
 * socket to tided: it registers, heartbeats (step, generation, idle and bubble time, read
 * from what the training thread publishes) while the training thread computes, turns
 * tided's messages into intents for the training thread and answers what must be answered
 * at once (ctl_tided.c), and runs offline command jobs (ctl_offline.c); what they all send
 * is ctl_out.c. The training thread sends through an inproc PAIR socket (ZeroMQ sockets
 * are single-threaded) and reads replies to its own requests from a mailbox; it never
 * reads this client's state.
 *
 * Workload: one heartbeat per period (1 s by default), a few messages per resize; the
 * thread wakes every 20 ms only while an offline child runs (to reap it promptly) and
 * every 2 ms while an ack waits for the preparation.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
#include "worker/ctl_int.h"
#include "worker/sched.h"

/* ---- helpers (background thread) ------------------------------------------------------ */

/* The training thread's step and generation now, and its counters since the last
   heartbeat (taken: they restart from 0). */
static void take_beat(tide__ctl_t *ctl, tide__beat *b)
{
    tide__progress *p = ctl->progress;
    int64_t done = __atomic_load_n(&p->completed, __ATOMIC_RELAXED);
    b->step = done > 0 ? (uint64_t)done : 0;
    b->gen = __atomic_load_n(&p->gen, __ATOMIC_RELAXED);
    b->idle_ns = __atomic_exchange_n(&p->idle_ns, 0, __ATOMIC_RELAXED);
    b->bubble_ns = __atomic_exchange_n(&p->bubble_ns, 0, __ATOMIC_RELAXED);
    b->filled_ns = __atomic_exchange_n(&p->filled_ns, 0, __ATOMIC_RELAXED);
    b->step_ns = __atomic_exchange_n(&p->step_ns, 0, __ATOMIC_RELAXED);
    b->steps = __atomic_exchange_n(&p->steps, 0, __ATOMIC_RELAXED);
    uint64_t since = __atomic_load_n(&p->step_since_ns, __ATOMIC_RELAXED), now = tide_now_ns();
    b->in_step_ns = since != 0 && now > since ? now - since : 0;
}

/* ms of a duration in ns, within what a heartbeat may carry. */
static double beat_ms(uint64_t ns)
{
    double ms = (double)ns / 1e6;
    return ms > TIDE_PROTO_MS_MAX ? TIDE_PROTO_MS_MAX : ms;
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
    /* a member of a layout, or taking part in an announced one (the control thread's own
       record of it: not the training thread's) */
    int in_job = ctl->job[0] != '\0' && (ctl->progress->member || ctl->pend.gen != 0);
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
        tide__ctl_fence(ctl, why, 1);
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
    tide__beat b;
    take_beat(ctl, &b);
    m.u.heartbeat.step = b.step;
    m.u.heartbeat.gen = b.gen;
    m.u.heartbeat.idle_ms = (double)b.idle_ns / 1e6;
    m.u.heartbeat.bubble_ms = (double)b.bubble_ns / 1e6;
    m.u.heartbeat.filled_ms = (double)b.filled_ns / 1e6;
    m.u.heartbeat.step_ms = b.steps ? (double)b.step_ns / 1e6 / b.steps : 0.0;
    m.u.heartbeat.in_step_ms = beat_ms(b.in_step_ns);
    int hb = ctl->hb_ms > 0 ? ctl->hb_ms : 1000;
    pthread_mutex_unlock(&ctl->mu);
    if (m.u.heartbeat.idle_ms > TIDE_PROTO_MS_MAX)
        m.u.heartbeat.idle_ms = TIDE_PROTO_MS_MAX;
    uint64_t now = tide_now_ns();
    if (ok && lease_renew(ctl, now))
        tide__ctl_send_now(ctl, &m);
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
    if (tide__ctl_send_now(ctl, &m))
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
    take_beat(ctl, &b);
    b.worker = ctl->worker_id;
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
    if (tide__ctl_send_now(ctl, &m)) {
        tide__hostbeat_sent(ctl->host, me, seq, now);
        ctl->self_ns = now;
    }
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

/* Reads what tided sent (up to 64 messages) and handles each. */
static void from_tided(tide__ctl_t *ctl)
{
    for (int k = 0; k < 64; k++) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, ctl->dealer, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        if (!zmq_msg_more(&f)) {
            tide_msg_t m;
            if (tide_proto_decode(zmq_msg_data(&f), zmq_msg_size(&f), &m) != TIDE_OK) {
                TIDE_WARN(SUBSYS, "malformed message from tided (%zu bytes): %s", zmq_msg_size(&f),
                          tide_last_error());
            } else {
                tide__ctl_on_tided(ctl, &m);
                tide_msg_clear(&m);
            }
        }
        zmq_msg_close(&f);
    }
}

/* Checkpoint reports posted by any thread, oldest first. */
static void send_saved(tide__ctl_t *ctl)
{
    for (;;) {
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
        tide__ctl_send_now(ctl, &saved);
    }
}

/* The worker leaves: its command gets SIGTERM and its grace, as a preemption would, while
   heartbeats go on; destroy waits for its end before the bye. */
static void leave_tick(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int leave = ctl->leave;
    pthread_mutex_unlock(&ctl->mu);
    if (leave && ctl->child.pid > 0 && !ctl->leaving) {
        ctl->leaving = 1;
        TIDE_INFO(SUBSYS, "leaving: stopping offline job %s (grace %d ms)", ctl->child.job,
                  ctl->child.grace_ms);
        tide__child_preempt(&ctl->child, ctl->child.grace_ms, tide_now_ns());
    }
}

/* The scheduler signalled that it takes this launch's node back: tided is asked to shrink
   the job off the launch (once per arrival; every rank of the launch asks, tided counts
   one). Not before registration: the arrival waits for it. */
static void leave_signal_tick(tide__ctl_t *ctl)
{
    pthread_mutex_lock(&ctl->mu);
    int32_t id = ctl->worker_id;
    int ok = ctl->registered && !ctl->fenced && !ctl->bye;
    pthread_mutex_unlock(&ctl->mu);
    if (ctl->leave_signo == 0 || !ok || !tide__sched_signal_take(&ctl->leave_seen))
        return;
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_LEAVE);
    m.u.leave.worker = id;
    snprintf(m.u.leave.reason, sizeof m.u.leave.reason,
             "signal %d (TIDE_LEAVE_SIGNAL) from its scheduler, which takes the node back",
             ctl->leave_signo);
    if (ctl->leave_signo == SIGUSR1)
        snprintf(m.u.leave.reason, sizeof m.u.leave.reason,
                 "SIGUSR1 from Slurm (its --signal notice): the node is taken back soon");
    TIDE_INFO(SUBSYS, "worker %d: %s; asking tided to shrink the job off this launch", id,
              m.u.leave.reason);
    tide__ctl_send_now(ctl, &m);
}

/* How long the next poll may wait (ms): until the next heartbeat or registration, 20 ms
   while a command runs, 2 ms while an ack waits for the preparation. */
static long poll_timeout(tide__ctl_t *ctl, int registered)
{
    uint64_t now = tide_now_ns();
    uint64_t due = registered ? ctl->next_hb_ns : ctl->next_reg_ns;
    long timeout = due > now ? (long)((due - now) / 1000000ull) + 1 : 0;
    if (ctl->child.pid > 0 && timeout > 20)
        timeout = 20;
    if (tide__ctl_holding(ctl) && timeout > 2)
        timeout = 2;
    return timeout;
}

static void *run(void *arg)
{
    tide__ctl_t *ctl = arg;
    tide__ctl_register(ctl);
    for (;;) {
        pthread_mutex_lock(&ctl->mu);
        int stop = ctl->stop, registered = ctl->registered;
        int mon = ctl->mon_bg && ctl->mon != NULL;
        pthread_mutex_unlock(&ctl->mu);
        leave_tick(ctl);
        if (stop) {
            forward_main(ctl); /* a last bye */
            break;
        }
        zmq_pollitem_t items[3] = {{ctl->dealer, 0, ZMQ_POLLIN, 0},
                                   {ctl->pair_bg, 0, ZMQ_POLLIN, 0},
                                   {mon ? ctl->mon : NULL, 0, ZMQ_POLLIN, 0}};
        int r = zmq_poll(items, mon ? 3 : 2, poll_timeout(ctl, registered));
        if (r > 0 && mon && (items[2].revents & ZMQ_POLLIN))
            monitor_events(ctl);
        if (r < 0 && errno != EINTR) {
            TIDE_ERROR(SUBSYS, "zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (r > 0 && (items[1].revents & ZMQ_POLLIN))
            forward_main(ctl);
        if (r > 0 && (items[0].revents & ZMQ_POLLIN))
            from_tided(ctl);
        if (ctl->child.pid > 0)
            tide__ctl_child_tick(ctl);
        tide__ctl_prep_tick(ctl);
        send_saved(ctl);
        leave_signal_tick(ctl);
        uint64_t now = tide_now_ns();
        pthread_mutex_lock(&ctl->mu);
        registered = ctl->registered;
        pthread_mutex_unlock(&ctl->mu);
        if (ctl->host != NULL && now >= ctl->next_hb_ns)
            host_tick(ctl);
        else if (registered && now >= ctl->next_hb_ns)
            send_heartbeat(ctl);
        if (!registered && now >= ctl->next_reg_ns)
            tide__ctl_register(ctl);
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

/* Where attempts' output goes and how much of it is kept (TIDE_LOG_DIR,
   TIDE_OFFLINE_LOG_CAP), read once. */
static void offline_settings(tide__ctl_t *ctl)
{
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
}

/* The client's memory, before any socket: a failure here leaves nothing to tear down but
   the allocation. */
static tide_status ctl_alloc(tide__ctl_t **out, const tide__ctl_config *cfg)
{
    tide__ctl_t *ctl = tide_calloc(1, sizeof *ctl);
    if (ctl == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting the control client");
    snprintf(ctl->endpoint, sizeof ctl->endpoint, "%s", cfg->endpoint);
    ctl->reg = cfg->reg;
    ctl->hb_fixed_ms = cfg->heartbeat_ms;
    ctl->host = cfg->host;
    ctl->intents = cfg->intents;
    ctl->progress = cfg->progress;
    ctl->gens = cfg->gens;
    ctl->prep = cfg->prep;
    tide_msg_init(&ctl->pend.layout, TIDE_MSG_NONE);
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
    offline_settings(ctl);
    tide_proto_buf_init(&ctl->buf);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&ctl->mu, NULL);
    pthread_cond_init(&ctl->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = ctl;
    return TIDE_OK;
}

/* A refused handshake never produces a reply: the monitor watches for it so that tide_new
   fails at once with the reason instead of timing out; with host heartbeats, connections
   too: after a reconnect (tided restarted, a network blip) tided knows no route to this
   rank until it speaks itself. */
static void open_monitor(tide__ctl_t *ctl)
{
    int zero = 0;
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://tide-ctl-mon-%p", (void *)ctl);
    if (zmq_socket_monitor(ctl->dealer, mon_ep,
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               (ctl->host != NULL ? ZMQ_EVENT_CONNECTED : 0)) != 0)
        return;
    ctl->mon = zmq_socket(ctl->zctx, ZMQ_PAIR);
    if (ctl->mon == NULL)
        return;
    zmq_setsockopt(ctl->mon, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(ctl->mon, mon_ep) != 0) {
        zmq_close(ctl->mon);
        ctl->mon = NULL;
    }
}

/* The sockets: the DEALER to tided (CURVE when keys are given), its monitor, and the
   inproc pair to the thread. */
static tide_status open_sockets(tide__ctl_t *ctl, const tide__ctl_config *cfg)
{
    ctl->zctx = zmq_ctx_new();
    if (ctl->zctx == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    ctl->dealer = zmq_socket(ctl->zctx, ZMQ_DEALER);
    ctl->pair_bg = zmq_socket(ctl->zctx, ZMQ_PAIR);
    ctl->pair_main = zmq_socket(ctl->zctx, ZMQ_PAIR);
    if (ctl->dealer == NULL || ctl->pair_bg == NULL || ctl->pair_main == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_socket: %s", zmq_strerror(errno));
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
        TIDE_CHECK(setup_curve(ctl->dealer, cfg->key_file, cfg->server_key));
    open_monitor(ctl);
    if (zmq_connect(ctl->dealer, ctl->endpoint) != 0)
        return tide_errorf(TIDE_ERR_INVALID, "cannot connect to tided at %s: %s", ctl->endpoint,
                           zmq_strerror(errno));
    char inproc[64];
    snprintf(inproc, sizeof inproc, "inproc://tide-ctl-%p", (void *)ctl);
    if (zmq_bind(ctl->pair_bg, inproc) != 0 || zmq_connect(ctl->pair_main, inproc) != 0)
        return tide_errorf(TIDE_ERR_IO, "inproc pair: %s", zmq_strerror(errno));
    return TIDE_OK;
}

static void wait_ms(tide__ctl_t *ctl, int timeout_ms)
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

/* Waits for register_ok; the reason it did not come, said so that the user can act. */
static tide_status await_registration(tide__ctl_t *ctl, const tide__ctl_config *cfg)
{
    int timeout = cfg->register_timeout_ms > 0 ? cfg->register_timeout_ms : 10000;
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout * 1000000ull;
    pthread_mutex_lock(&ctl->mu);
    int refused = 0;
    while (!ctl->registered && !ctl->fenced && !refused && tide_now_ns() < deadline) {
        wait_ms(ctl, 50);
        pthread_mutex_unlock(&ctl->mu);
        refused = handshake_refused(ctl);
        pthread_mutex_lock(&ctl->mu);
    }
    int ok = ctl->registered;
    char fenced[TIDE_PROTO_TEXT_MAX + 1] = "";
    if (!ok && ctl->fenced)
        snprintf(fenced, sizeof fenced, "%s", ctl->fence_reason);
    pthread_mutex_unlock(&ctl->mu);
    if (ok)
        return TIDE_OK;
    if (fenced[0] != '\0')
        return tide_errorf(TIDE_ERR_STALE,
                           "tided refused this process: %s (a process it gave up on cannot "
                           "rejoin: start a new one)",
                           fenced);
    if (refused)
        return tide_errorf(
            TIDE_ERR_DENIED,
            "tided at %s refused the connection: the CURVE handshake failed (%s). %s",
            ctl->endpoint,
            refused == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "key not allowed" : "protocol error",
            cfg->key_file ? "Is TIDE_KEY's .pub in tided's --auth directory, and "
                            "TIDE_SERVER_KEY tided's server.pub?"
                          : "tided requires CURVE: set TIDE_KEY (a worker key "
                            "pair from tidectl keygen) and TIDE_SERVER_KEY");
    tide_msg_t m;
    char why[TIDE_PROTO_TEXT_MAX + 8] = "";
    while (tide__mailbox_pop(ctl->replies, &m, 0) == TIDE_OK) {
        if (m.type == TIDE_MSG_ERROR)
            snprintf(why, sizeof why, ": %s", m.u.error.message);
        tide_msg_clear(&m);
    }
    return tide_errorf(TIDE_ERR_TIMEOUT,
                       "tided at %s did not accept registration within %d ms%s (is tided "
                       "running? check TIDE_ENDPOINT%s)",
                       ctl->endpoint, timeout, why,
                       cfg->key_file ? ", TIDE_KEY and TIDE_SERVER_KEY" : "");
}

tide_status tide__ctl_new(tide__ctl_t **out, const tide__ctl_config *cfg)
{
    *out = NULL;
    if (cfg->endpoint == NULL || cfg->endpoint[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "no tided endpoint: set TIDE_ENDPOINT");
    if (strlen(cfg->endpoint) >= 512)
        return tide_errorf(TIDE_ERR_INVALID, "tided endpoint too long");
    if (cfg->intents == NULL || cfg->progress == NULL || cfg->gens == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "the control client needs the runtime's intents, "
                                             "progress and abort words");
    tide_msg_t probe;
    tide_msg_init(&probe, TIDE_MSG_REGISTER);
    probe.u.reg = cfg->reg;
    if (tide_msg_validate(&probe) != TIDE_OK)
        return tide_errorf(TIDE_ERR_INVALID, "cannot register: %s", tide_last_error());
    int signo = 0;
    TIDE_CHECK(tide__sched_signal_parse(getenv("TIDE_LEAVE_SIGNAL"), &signo));
    tide__ctl_t *ctl = NULL;
    TIDE_CHECK(ctl_alloc(&ctl, cfg));
    tide_status rc = tide__sched_signal_catch(signo, &ctl->leave_seen);
    if (rc == TIDE_OK)
        ctl->leave_signo = signo; /* released by destroy */
    if (rc == TIDE_OK)
        rc = tide__mailbox_new(&ctl->replies);
    if (rc == TIDE_OK)
        rc = open_sockets(ctl, cfg);
    if (rc == TIDE_OK && pthread_create(&ctl->thread, NULL, run, ctl) != 0)
        rc = tide_errorf(TIDE_ERR_IO, "cannot start the heartbeat thread");
    if (rc == TIDE_OK) {
        ctl->thread_started = 1;
        rc = await_registration(ctl, cfg);
    }
    if (rc != TIDE_OK) {
        tide__ctl_destroy(&ctl, 0);
        return rc;
    }
    pthread_mutex_lock(&ctl->mu);
    ctl->mon_bg = 1; /* the monitor is the background thread's from now on */
    pthread_mutex_unlock(&ctl->mu);
    zmq_send(ctl->pair_main, "", 0, 0); /* wake it to poll the monitor too */
    *out = ctl;
    return TIDE_OK;
}

/* The offline command first, while heartbeats go on (SIGTERM, then its grace); then the
   bye (unless say_bye is 0), then the thread stops. */
static void stop_thread(tide__ctl_t *ctl, int say_bye)
{
    pthread_mutex_lock(&ctl->mu);
    ctl->leave = 1;
    pthread_mutex_unlock(&ctl->mu);
    zmq_send(ctl->pair_main, "", 0, 0); /* wake the thread */
    pthread_mutex_lock(&ctl->mu);
    uint64_t until = tide_now_ns() + ((uint64_t)TIDE__KEEPER_SLACK_MS + 2000u +
                                      (uint64_t)(ctl->child_grace > 0 ? ctl->child_grace : 0)) *
                                         1000000ull;
    while (ctl->child_pid > 0 && tide_now_ns() < until)
        wait_ms(ctl, 50);
    int registered = ctl->ever_registered;
    int32_t id = ctl->worker_id;
    ctl->bye = say_bye && registered;
    if (ctl->bye && ctl->host != NULL)
        tide__hostbeat_inactive(ctl->host); /* no leader speaks for it after its bye */
    pthread_mutex_unlock(&ctl->mu);
    if (say_bye && registered) {
        /* the step the program really ended at: heartbeats carry it only once a period */
        int64_t done = __atomic_load_n(&ctl->progress->completed, __ATOMIC_RELAXED);
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

void tide__ctl_destroy(tide__ctl_t **self_p, int say_bye)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__ctl_t *ctl = *self_p;
    if (ctl->thread_started)
        stop_thread(ctl, say_bye);
    if (ctl->child.pid > 0)
        tide__ctl_child_stop(ctl); /* the thread never ran the stop (it failed) */
    tide__sched_signal_release(ctl->leave_signo);
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
    tide_msg_clear(&ctl->pend.layout);
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

void tide__ctl_set_job(tide__ctl_t *ctl, const char *job)
{
    pthread_mutex_lock(&ctl->mu);
    snprintf(ctl->job, sizeof ctl->job, "%s", job);
    pthread_mutex_unlock(&ctl->mu);
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

void tide__ctl_plugin_done(tide__ctl_t *ctl, const char *job)
{
    pthread_mutex_lock(&ctl->mu);
    if (strcmp(ctl->plugin_job, job) == 0)
        ctl->plugin_job[0] = '\0';
    pthread_mutex_unlock(&ctl->mu);
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
