/*
 * coordinator/metrics: the Prometheus text exposition that http.c serves on /metrics, and
 * the resize duration histogram's buckets. Workload: a scrape every few seconds; a
 * response is a few KB plus one line per online job and three per worker (~1.5 MB at
 * 10^4).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "coordinator/metrics.h"

/* Upper bounds (s) of the resize duration buckets: a live switch takes tens of ms to a
   few s, a recovery from a checkpoint or a slow plan longer, --resize-timeout-ms (120 s
   by default) ends the rest. */
static const double resize_bounds_s[TIDE_COORD_RESIZE_BUCKETS] = {
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
};

void tide__metrics_resize_observe(tide_coord_counters *c, uint64_t dur_ns)
{
    for (int i = 0; i < TIDE_COORD_RESIZE_BUCKETS; i++)
        if ((double)dur_ns <= resize_bounds_s[i] * 1e9) {
            c->resize_le[i]++;
            return;
        }
    /* beyond the last bound: only +Inf (the count) holds it */
}

/* Growable text buffer for the exposition. */
typedef struct text {
    char *p;
    size_t len, cap;
    int oom;
} text;

static void put(text *t, const char *fmt, ...) TIDE_PRINTF(2, 3);

static void put(text *t, const char *fmt, ...)
{
    if (t->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
            return;
        }
        if (t->p != NULL && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 8192;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *p = tide_realloc(t->p, cap);
        if (p == NULL) {
            t->oom = 1;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

/* v as a Prometheus label value (backslash, quote and newline escaped) into buf. */
static const char *label(const char *v, char *buf, size_t len)
{
    size_t k = 0;
    for (; *v != '\0' && k + 3 < len; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n') {
            buf[k++] = '\\';
            buf[k++] = *v == '\n' ? 'n' : *v;
        } else {
            buf[k++] = *v;
        }
    }
    buf[k] = '\0';
    return buf;
}

/* The histogram of committed resize durations (seconds). */
static void put_resize_histogram(text *t, const tide_coord_counters *c)
{
    put(t, "# HELP tide_resize_duration_seconds Time from resize request to committed "
           "generation.\n# TYPE tide_resize_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < TIDE_COORD_RESIZE_BUCKETS; i++) {
        cum += c->resize_le[i];
        put(t, "tide_resize_duration_seconds_bucket{le=\"%g\"} %llu\n", resize_bounds_s[i],
            (unsigned long long)cum);
    }
    put(t,
        "tide_resize_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
        "tide_resize_duration_seconds_sum %.6f\ntide_resize_duration_seconds_count %llu\n",
        (unsigned long long)c->resizes_committed, (double)c->resize_ns_sum / 1e9,
        (unsigned long long)c->resizes_committed);
}

/* One series per registered worker, labelled worker="ID": tided's worker id, the one
   tidectl status, drain, events and libtide's tide_worker_id name. */
static void put_workers(text *t, tide_coord_state_t *st)
{
    char pool[2 * TIDE_COORD_NAME_MAX], host[2 * TIDE_COORD_HOST_MAX], job[2 * TIDE_COORD_NAME_MAX];
    put(t, "# HELP tide_worker_info Where each worker is: its pool, rank in the pool, host and "
           "device (worker: tided's worker id, the WORKER of tidectl status).\n"
           "# TYPE tide_worker_info gauge\n");
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = &st->workers[i];
        if (w->pool[0])
            put(t,
                "tide_worker_info{worker=\"%d\",pool=\"%s\",rank=\"%d\",host=\"%s\","
                "device=\"%d\",kind=\"%s\"} 1\n",
                (int)w->id, label(w->pool, pool, sizeof pool), (int)w->rank,
                label(w->host, host, sizeof host), (int)w->device,
                tide_proto_device_kind_name((tide_proto_device_kind_t)w->kind));
    }
    put(t, "# HELP tide_worker_state Each worker's state and the online job holding it (1 per "
           "worker).\n# TYPE tide_worker_state gauge\n");
    for (size_t i = 0; i < st->n_workers; i++) {
        const tide_coord_worker_t *w = &st->workers[i];
        if (!w->pool[0])
            continue;
        const tide_coord_job_t *j = w->job ? tide_coord_job_get(st, w->job) : NULL;
        put(t, "tide_worker_state{worker=\"%d\",state=\"%s\",job=\"%s\"} 1\n", (int)w->id,
            tide_wstate_name(w->state), label(j ? j->name : "", job, sizeof job));
    }
    put(t, "# HELP tide_worker_step Steps each worker reported completed.\n"
           "# TYPE tide_worker_step gauge\n");
    for (size_t i = 0; i < st->n_workers; i++)
        if (st->workers[i].pool[0])
            put(t, "tide_worker_step{worker=\"%d\"} %lld\n", (int)st->workers[i].id,
                (long long)st->workers[i].step);
}

/* The jobs by kind and state, and each online job's generation and step. */
static void put_jobs(text *t, const tide_coord_state_t *st)
{
    size_t jobs[2][8] = {{0}};
    for (size_t i = 0; i < st->n_jobs; i++)
        if ((unsigned)st->jobs[i]->state < 8)
            jobs[st->jobs[i]->kind == TIDE_CJOB_ONLINE ? 0 : 1][st->jobs[i]->state]++;
    put(t, "# HELP tide_jobs Jobs by kind and state.\n# TYPE tide_jobs gauge\n");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8; i++)
            if (jobs[k][i])
                put(t, "tide_jobs{kind=\"%s\",state=\"%s\"} %zu\n", k ? "offline" : "online",
                    tide_jstate_name((tide_jstate)i), jobs[k][i]);
    put(t, "# HELP tide_job_generation Committed layout generation of each online job.\n"
           "# TYPE tide_job_generation gauge\n");
    for (size_t i = 0; i < st->n_jobs; i++)
        if (st->jobs[i]->kind == TIDE_CJOB_ONLINE)
            put(t, "tide_job_generation{job=\"%s\"} %llu\n", st->jobs[i]->name,
                (unsigned long long)st->jobs[i]->generation);
    put(t, "# HELP tide_job_step Steps completed by each online job.\n"
           "# TYPE tide_job_step gauge\n");
    for (size_t i = 0; i < st->n_jobs; i++)
        if (st->jobs[i]->kind == TIDE_CJOB_ONLINE)
            put(t, "tide_job_step{job=\"%s\"} %lld\n", st->jobs[i]->name,
                (long long)st->jobs[i]->step);
}

tide_status tide__metrics_render(tide_server_t *s, char **out, size_t *len)
{
    tide_coord_state_t *st = s->st;
    tide__loop_stats ls;
    tide__loop_stats_get(s, &ls);
    text t = {0};
    /* a worker that said bye is "left", never counted as failed */
    size_t by_state[TIDE_WS_LEFT + 1] = {0};
    for (size_t i = 0; i < st->n_workers; i++)
        if (st->workers[i].pool[0] && (unsigned)st->workers[i].state <= TIDE_WS_LEFT)
            by_state[st->workers[i].state]++;
    put(&t, "# HELP tide_gpus Workers (one per GPU or CPU device) by state.\n"
            "# TYPE tide_gpus gauge\n");
    for (int i = 0; i <= TIDE_WS_LEFT; i++)
        put(&t, "tide_gpus{state=\"%s\"} %zu\n", tide_wstate_name((tide_wstate)i), by_state[i]);
    put_workers(&t, st);
    put_jobs(&t, st);
    const tide_coord_counters *c = &st->counters;
    put(&t,
        "# HELP tide_resizes_total Layout switches by result.\n# TYPE tide_resizes_total counter\n"
        "tide_resizes_total{result=\"committed\"} %llu\ntide_resizes_total{result=\"aborted\"} "
        "%llu\n"
        "# HELP tide_recoveries_total Recoveries started after lost workers.\n"
        "# TYPE tide_recoveries_total counter\ntide_recoveries_total %llu\n"
        "# HELP tide_resharded_bytes_total Bytes moved by committed switches.\n"
        "# TYPE tide_resharded_bytes_total counter\ntide_resharded_bytes_total %llu\n"
        "# HELP tide_bubble_seconds_total Pipeline bubble time reported by workers.\n"
        "# TYPE tide_bubble_seconds_total counter\ntide_bubble_seconds_total %.6f\n"
        "# HELP tide_bubble_filled_seconds_total Bubble time used by offline task steps (worker-"
        "measured).\n# TYPE tide_bubble_filled_seconds_total counter\n"
        "tide_bubble_filled_seconds_total %.6f\n"
        "# HELP tide_preemptions_total Offline jobs preempted.\n"
        "# TYPE tide_preemptions_total counter\ntide_preemptions_total %llu\n"
        "# HELP tide_requests_total Requests handled (heartbeats excluded).\n"
        "# TYPE tide_requests_total counter\ntide_requests_total %llu\n"
        "# HELP tide_heartbeats_total Heartbeats received (one per worker, also inside host "
        "heartbeats).\n"
        "# TYPE tide_heartbeats_total counter\ntide_heartbeats_total %llu\n"
        "# HELP tide_heartbeat_messages_total Messages that carried heartbeats (heartbeat and "
        "host_heartbeat).\n"
        "# TYPE tide_heartbeat_messages_total counter\ntide_heartbeat_messages_total %llu\n"
        "# HELP tide_bad_requests_total Malformed or unexpected messages answered with an error.\n"
        "# TYPE tide_bad_requests_total counter\ntide_bad_requests_total %llu\n"
        "# HELP tide_denied_total Requests or connections refused by authentication.\n"
        "# TYPE tide_denied_total counter\ntide_denied_total %llu\n"
        "# HELP tide_clients_cut_total Connections cut for the bytes libzmq held of them "
        "(--max-client-mb).\n# TYPE tide_clients_cut_total counter\ntide_clients_cut_total %llu\n",
        (unsigned long long)c->resizes_committed, (unsigned long long)c->resizes_aborted,
        (unsigned long long)c->recoveries, (unsigned long long)c->bytes_resharded,
        (double)s->bubbles.bubble_ns / 1e9, (double)s->bubbles.filled_ns / 1e9,
        (unsigned long long)c->preemptions, (unsigned long long)c->requests,
        (unsigned long long)c->heartbeats, (unsigned long long)c->heartbeat_msgs,
        (unsigned long long)c->bad_requests, (unsigned long long)c->denied,
        (unsigned long long)c->clients_cut);
    put_resize_histogram(&t, c);
    put(&t,
        "# HELP tide_busy_refusals_total Requests refused because their client used its share "
        "of a pass.\n# TYPE tide_busy_refusals_total counter\ntide_busy_refusals_total %llu\n"
        "# HELP tide_dropped_messages_total Messages not delivered: client gone, or its queue "
        "and backlog full.\n# TYPE tide_dropped_messages_total counter\n"
        "tide_dropped_messages_total %llu\n"
        "# HELP tide_backlogged_clients Clients whose replies wait in tided's backlog.\n"
        "# TYPE tide_backlogged_clients gauge\ntide_backlogged_clients %zu\n",
        (unsigned long long)ls.refused_busy, (unsigned long long)ls.dropped_out, ls.n_backlog);
    const tide__health *h = tide__health_of(s);
    put(&t,
        "# HELP tide_state_degraded 1 while tided cannot write its state file (it decides in "
        "memory and refuses operators' changes), else 0.\n# TYPE tide_state_degraded gauge\n"
        "tide_state_degraded %d\n"
        "# HELP tide_state_degraded_total Times the state file stopped taking writes.\n"
        "# TYPE tide_state_degraded_total counter\ntide_state_degraded_total %llu\n"
        "# HELP tide_state_held_writes Writes (events, attempt reports) held in memory for the "
        "state file.\n# TYPE tide_state_held_writes gauge\ntide_state_held_writes %zu\n",
        h->degraded, (unsigned long long)h->episodes, h->degraded ? h->n : (size_t)0);
    if (t.oom) {
        tide_free(t.p);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory rendering metrics");
    }
    *out = t.p;
    *len = t.len;
    return TIDE_OK;
}
