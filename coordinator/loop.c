/*
 * coordinator/loop: tided's core (see loop.h): registration, timers, hooks and the loop
 * itself, the small part every pass goes through. What a pass calls sits beside it
 * (loop_int.h): loop_serve.c reads, checks and dispatches requests and queues replies;
 * loop_persist.c holds the batch's writes, its commit and the degraded mode; loop_bind.c
 * opens the sockets. Handlers live in their own modules; server.c registers them.
 *
 * A loop iteration: zmq_poll on the ROUTER socket, the ZAP socket and the registered
 * sources; drain up to BATCH requests or PASS_MS of work; run the tick hooks when a tick
 * is due (failure scan, switch deadlines, retention) and the scheduling hooks when asked
 * (backfill); commit the batch's SQLite transaction; only then send the batch's replies
 * and commands. Heartbeats change only volatile fields: no transaction, no reply.
 *
 * Liveness never depends on how long the loop was busy: a message is stamped with the
 * time it is read (s->now_ns), and the ROUTER queue's last empty time (drained_ns) tells
 * the liveness hook when everything sent before it has been read. No client can starve
 * the others: see loop_serve.c.
 */
#include <assert.h>
#include <errno.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/health.h"
#include "coordinator/intake.h"
#include "coordinator/loop_int.h"
#include "coordinator/outbox.h"

/* ---- registration ---------------------------------------------------------------------------- */

void tide__on_message(tide_server_t *s, tide_msg_type_t type, tide__msg_fn fn, unsigned flags)
{
    assert(type > TIDE_MSG_NONE && type < TIDE_MSG__COUNT && s->core->handlers[type].fn == NULL);
    s->core->handlers[type] = (handler){fn, flags};
}

static void add_hook(hooks *h, tide__hook_fn fn)
{
    assert(h->n < HOOKS_MAX);
    h->fn[h->n++] = fn;
}

static void run_hooks(tide_server_t *s, const hooks *h)
{
    for (int i = 0; i < h->n; i++)
        h->fn[i](s);
}

void tide__on_tick(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->tick, fn);
}

void tide__on_schedule(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->schedule, fn);
}

void tide__on_load(tide_server_t *s, tide__hook_fn fn)
{
    add_hook(&s->core->load, fn);
}

void tide__on_poll(tide_server_t *s, tide__poll_fill_fn fill, tide__poll_handle_fn handle)
{
    assert(s->core->n_sources < SOURCES_MAX);
    s->core->sources[s->core->n_sources++] = (source){fill, handle, 0, 0};
}

/* ---- timers ---------------------------------------------------------------------------------- */

void tide__reschedule(tide_server_t *s)
{
    s->core->want_schedule = 1;
}

void tide__reschedule_at(tide_server_t *s, uint64_t at_ns)
{
    tide__core *c = s->core;
    if (at_ns == 0)
        return; /* no time: nothing to wait for */
    if (c->next_schedule_ns == 0 || at_ns < c->next_schedule_ns)
        c->next_schedule_ns = at_ns;
}

void tide__tick_soon(tide_server_t *s)
{
    s->core->tick_soon = 1;
}

uint64_t tide__tick_ns(const tide_server_t *s)
{
    uint64_t every = (uint64_t)s->cfg.heartbeat_ms * 1000000ull / 4;
    return every < 20000000ull ? 20000000ull : every;
}

uint64_t tide__drained_ns(const tide_server_t *s)
{
    return s->core->drained_ns;
}

size_t tide__outbox_bytes(const tide_server_t *s)
{
    return s->core->ob.bytes;
}

void tide__loop_stats_get(const tide_server_t *s, tide__loop_stats *out)
{
    out->refused_busy = s->core->refused_busy;
    out->dropped_out = s->core->ob.dropped;
    out->n_backlog = s->core->ob.n_backlog;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

tide_status tide__core_new(tide_server_t *s)
{
    tide__core *c = tide_calloc(1, sizeof *c);
    if (c != NULL)
        c->peers = tide_calloc(PEER_SLOTS, sizeof *c->peers);
    if (c == NULL || c->peers == NULL) {
        tide_free(c);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting tided");
    }
    tide__outbox_init(&c->ob);
    tide__health_init(&c->health);
    s->core = c;
    return TIDE_OK;
}

tide_status tide__core_load(tide_server_t *s)
{
    tide__core *c = s->core;
    TIDE_CHECK(tide_coord_state_new(&s->st));
    TIDE_CHECK(tide_store_open_ex(&c->store, s->cfg.state_path, s->cfg.sync_full,
                                  s->cfg.accept_state_loss));
    TIDE_CHECK(tide_store_load(c->store, s->st));
    s->now_ns = tide_now_ns();
    run_hooks(s, &c->load);
    c->next_tick_ns = s->now_ns;
    c->drained_ns = s->now_ns;
    c->want_schedule = 1;
    return TIDE_OK;
}

void tide__core_destroy(tide_server_t *s)
{
    tide__core *c = s->core;
    if (c == NULL)
        return;
    tide__outbox_clear(&c->ob);
    tide__health_clear(&c->health);
    tide_free(c->peers);
    tide__intake_destroy(&c->intake);
    if (c->router)
        zmq_close(c->router);
    if (c->zap)
        zmq_close(c->zap);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    tide__auth_free(&c->auth);
    tide_store_close(&c->store);
    tide_free(c);
    s->core = NULL;
}

/* ---- the loop -------------------------------------------------------------------------------- */

/* Gathers: ZeroMQ signals the loop once per wakeup, not per message, so waiting a moment
 * after a pass lets a second's 10^4 heartbeats arrive in ~500 passes instead of 10^4
 * wakeups (context switches and eventfd writes dominated tided's CPU). */
static void gather(tide_server_t *s, uint64_t pass_ns, int full)
{
    uint64_t batch_ns = (uint64_t)(s->cfg.batch_ms > 0 ? s->cfg.batch_ms : 0) * 1000000ull;
    if (batch_ns == 0 || pass_ns == 0 || full || s->core->want_schedule)
        return;
    uint64_t now = tide_now_ns();
    if (now - pass_ns < batch_ns)
        tide_sleep_ms((batch_ns - (now - pass_ns) + 999999ull) / 1000000ull);
}

/* Fills the iteration's poll items: [0] the ROUTER socket, then ZAP (*zap_at, -1 without
 * it), then each source's; returns their count. */
static int poll_items(tide_server_t *s, zmq_pollitem_t *items, int *zap_at)
{
    tide__core *c = s->core;
    int n = 0;
    items[n++] = (zmq_pollitem_t){c->router, 0, ZMQ_POLLIN, 0};
    *zap_at = -1;
    if (c->zap) {
        *zap_at = n;
        items[n++] = (zmq_pollitem_t){c->zap, 0, ZMQ_POLLIN, 0};
    }
    c->intake_at = -1;
    if (tide__intake_socket(c->intake) != NULL) {
        c->intake_at = n;
        items[n++] = (zmq_pollitem_t){tide__intake_socket(c->intake), 0, ZMQ_POLLIN, 0};
    }
    for (int i = 0; i < c->n_sources; i++) {
        source *src = &c->sources[i];
        src->at = n;
        src->n = src->fill(s, items + n, POLL_ITEMS - n);
        n += src->n;
    }
    return n;
}

static long poll_timeout(const tide__core *c)
{
    uint64_t now = tide_now_ns();
    long timeout = c->next_tick_ns > now ? (long)((c->next_tick_ns - now) / 1000000ull) + 1 : 0;
    if (c->want_schedule)
        return 0;
    if (c->ob.n_backlog > 0 && timeout > 2)
        return 2; /* a client's full queue may have room again: see outbox.c */
    if (c->intake != NULL && timeout > 20)
        return 20; /* an unfinished message wakes nothing: its connection is checked anyway */
    return timeout;
}

/* Handles up to BATCH requests or PASS_MS of them; returns how many. Notes when the
 * ROUTER queue was seen empty (drained_ns). */
static int read_pass(tide_server_t *s, int readable)
{
    tide__core *c = s->core;
    int handled = 0;
    c->pass_no++;
    if (!readable) {
        c->drained_ns = s->now_ns;
        return 0;
    }
    uint64_t pass_end = s->now_ns + (uint64_t)PASS_MS * 1000000ull;
    for (;;) {
        uint64_t before = tide_now_ns();
        if (handled >= BATCH || c->fatal != TIDE_OK || before >= pass_end)
            break;
        if (!tide__core_recv_one(s)) {
            c->drained_ns = before;
            break;
        }
        handled++;
    }
    return handled;
}

/* Runs the tick hooks when a tick is due (never while nothing can be saved). */
static void run_ticks(tide_server_t *s)
{
    tide__core *c = s->core;
    uint64_t every = tide__tick_ns(s);
    if (s->now_ns < c->next_tick_ns)
        return;
    c->tick_soon = 0;
    run_hooks(s, &c->tick);
    if (c->next_schedule_ns != 0 && s->now_ns >= c->next_schedule_ns)
        c->want_schedule = 1; /* a time given to tide__reschedule_at came */
    c->next_tick_ns = c->tick_soon ? s->now_ns : s->now_ns + every;
}

static void run_schedule(tide_server_t *s)
{
    tide__core *c = s->core;
    c->want_schedule = 0;
    c->next_schedule_ns = 0;
    run_hooks(s, &c->schedule);
}

tide_status tide__core_run(tide_server_t *s)
{
    tide__core *c = s->core;
    zmq_pollitem_t items[POLL_ITEMS];
    uint64_t pass_ns = 0; /* the last request's time in the previous pass that handled some */
    int full = 0;         /* it stopped at BATCH requests or PASS_MS: more are waiting */
    while (!s->stop && c->fatal == TIDE_OK) {
        gather(s, pass_ns, full);
        int zap_at = -1;
        int n = poll_items(s, items, &zap_at);
        int r = zmq_poll(items, n, poll_timeout(c));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return tide_errorf(TIDE_ERR_IO, "zmq_poll: %s", zmq_strerror(errno));
        }
        s->now_ns = tide_now_ns();
        if (zap_at >= 0 && (items[zap_at].revents & ZMQ_POLLIN))
            tide__auth_zap(c->zap, &c->auth, &s->st->counters.denied);
        if (c->intake_at >= 0 && (items[c->intake_at].revents & ZMQ_POLLIN))
            tide__intake_events(c->intake);
        int handled = read_pass(s, items[0].revents & ZMQ_POLLIN);
        full = handled > 0 && c->drained_ns < s->now_ns;
        pass_ns = handled > 0 ? s->now_ns : 0;
        s->now_ns = tide_now_ns();
        run_ticks(s);
        s->st->counters.clients_cut += tide__intake_check(c->intake, s->now_ns);
        if (c->want_schedule && c->fatal == TIDE_OK)
            run_schedule(s);
        tide__core_finish_batch(s);
        for (int i = 0; i < c->n_sources; i++)
            c->sources[i].handle(s, items + c->sources[i].at, c->sources[i].n);
    }
    tide__core_finish_batch(s);
    tide__core_try_persist(s, 1); /* a last try: what a restart finds */
    if (c->health.degraded) {
        TIDE_ERROR("server", "stopped degraded: changes since the state file failed (%s) are "
                             "not on disk", c->health.why);
        return tide_errorf(TIDE_ERR_IO, "stopped with its state not persisted: %s",
                           c->health.why);
    }
    TIDE_INFO("server", "stopped");
    return TIDE_OK;
}
