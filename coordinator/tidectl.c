/*
 * tidectl: the operator CLI for tided. One command per run: it connects a
 * ZeroMQ DEALER socket to tided (CURVE when --key is given), sends one proto
 * request, waits up to --timeout-ms for the reply and prints it as an aligned
 * table or, with --json, as one JSON document. `top` repeats status + jobs
 * every --interval ms; `keygen` writes CURVE key files locally (format in
 * core/keyfile.h and the README, read by tided --auth).
 *
 * Exit codes (scripts rely on them): 0 ok; 1 refused by tided (its message
 * printed) or CURVE rejected; 2 bad usage, nothing sent; 3 cannot reach tided;
 * 4 timed out waiting for the reply; 5 keygen could not write its files.
 *
 * Workload: interactive use and scripts; a reply of a few thousand rows at most.
 * A socket monitor tells "never connected" (3) from "connected, no answer" (4)
 * and sees a rejected CURVE handshake (1) instead of waiting out the timeout.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/tidectl.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/keyfile.h"
#include "core/log.h"
#include "core/opts.h"

/* ---- settings -------------------------------------------------------------------------------- */

typedef struct settings {
    /* global */
    const char *endpoint;
    long long timeout_ms;
    const char *key;
    const char *server_key;
    int json;
    const char *log;
    /* resize */
    long long dp, tp, pp, micro;
    const char *stages;
    int dry_run;
    const char *placement;
    const char *dir; /* checkpoint: the root to save under */
    int allow_tp_across_hosts;
    /* submit */
    int offline;
    const char *name;
    long long priority;
    const char *mem_cap;
    const char *plugin;
    int bubbles;
    /* events */
    const char *since;
    long long after;
    long long limit;
    /* logs */
    long long attempt;
    int all;
    /* top */
    long long interval_ms;
    long long count;
    /* keygen */
    const char *role;
    int force;
    /* status */
    const char *job;
} settings_t;

#define OPT_END                                                                                    \
    {                                                                                              \
        NULL, NULL, 0, NULL, NULL, NULL, 0, 0                                                      \
    }

typedef struct command {
    const char *name;
    const char *synopsis;
    const char *summary;
    int (*run)(settings_t *s, int argc, char **argv, FILE *out, FILE *err);
    int nargs_min, nargs_max; /* positional arguments after the command name */
    tide_opt opts[10];        /* command flags (value pointers patched per run) */
} command_t;

/* ---- small formatting helpers ---------------------------------------------------------------- */

const char *tidectl_fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, unit[u]);
    return buf;
}

static const char *fmt_ms(double ms, char *buf, size_t len)
{
    if (ms < 1000.0)
        snprintf(buf, len, "%.0f ms", ms);
    else if (ms < 120000.0)
        snprintf(buf, len, "%.1f s", ms / 1000.0);
    else if (ms < 7200000.0)
        snprintf(buf, len, "%.1f min", ms / 60000.0);
    else
        snprintf(buf, len, "%.1f h", ms / 3600000.0);
    return buf;
}

static const char *fmt_time(int64_t ms, char *buf, size_t len)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (localtime_r(&t, &tm) == NULL) {
        snprintf(buf, len, "%lld", (long long)ms);
        return buf;
    }
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, len, "%s.%03d", base, (int)(ms % 1000));
    return buf;
}

/* Copies s for a terminal: control bytes become '?', at most max chars (then '~'). */
static const char *term_str(const char *s, size_t max, char *buf, size_t len)
{
    size_t k = 0, n = strlen(s);
    for (size_t i = 0; i < n && k + 2 < len; i++) {
        if (i == max - 1 && n > max) {
            buf[k++] = '~';
            break;
        }
        unsigned char ch = (unsigned char)s[i];
        buf[k++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    buf[k] = '\0';
    return buf;
}

void tidectl_json_str(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', out);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            p++;
        } else if (c == '\n') {
            fputs("\\n", out);
            p++;
        } else if (c == '\t') {
            fputs("\\t", out);
            p++;
        } else if (c == '\r') {
            fputs("\\r", out);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(out, "\\u%04x", c);
            p++;
        } else if (c < 0x80) {
            fputc(c, out);
            p++;
        } else {
            /* keep a well-formed UTF-8 sequence, replace anything else with U+FFFD */
            int n = (c >= 0xc2 && c <= 0xdf)   ? 2
                    : (c >= 0xe0 && c <= 0xef) ? 3
                    : (c >= 0xf0 && c <= 0xf4) ? 4
                                               : 0;
            int ok = n > 0;
            for (int i = 1; ok && i < n; i++)
                ok = (p[i] & 0xc0) == 0x80;
            if (ok && n == 3) /* no overlongs or surrogates */
                ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
            if (ok && n == 4)
                ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
            if (ok) {
                fwrite(p, 1, (size_t)n, out);
                p += n;
            } else {
                fputs("\\ufffd", out);
                p++;
            }
        }
    }
    fputc('"', out);
}

/* A JSON string, or null for "". */
static void json_str_or_null(FILE *out, const char *s)
{
    if (s[0] == '\0')
        fputs("null", out);
    else
        tidectl_json_str(out, s);
}

/* ---- tables ---------------------------------------------------------------------------------- */

#define MAX_COLS 16
#define CELL     64

/* A text table: cells are built row by row, widths measured, then printed aligned. */
typedef struct table {
    int ncols;
    const char *head[MAX_COLS];
    int right[MAX_COLS]; /* right-align numbers */
    size_t width[MAX_COLS];
    char (*cells)[MAX_COLS][CELL];
    size_t nrows, cap;
} table_t;

static void table_init(table_t *t, int ncols, const char *const *head, const int *right)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols;
    for (int c = 0; c < ncols; c++) {
        t->head[c] = head[c];
        t->right[c] = right[c];
        t->width[c] = strlen(head[c]);
    }
}

/* Adds a row; cells beyond the first allocation failure are dropped (printed tables only). */
static char (*table_row(table_t *t))[CELL]
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 32;
        void *p = tide_reallocarray(t->cells, cap, sizeof *t->cells);
        if (p == NULL)
            return NULL;
        t->cells = p;
        t->cap = cap;
    }
    memset(t->cells[t->nrows], 0, sizeof *t->cells);
    return t->cells[t->nrows++];
}

static void table_print(table_t *t, FILE *out)
{
    for (size_t r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols; c++) {
            size_t w = strlen(t->cells[r][c]);
            if (w > t->width[c])
                t->width[c] = w;
        }
    for (size_t r = 0; r <= t->nrows; r++) { /* r == 0: the header */
        for (int c = 0; c < t->ncols; c++) {
            const char *cell = r == 0 ? t->head[c] : t->cells[r - 1][c];
            if (c + 1 == t->ncols && !t->right[c])
                fputs(cell, out); /* no trailing blanks */
            else if (c + 1 == t->ncols)
                fprintf(out, "%*s", (int)t->width[c], cell);
            else if (t->right[c])
                fprintf(out, "%*s  ", (int)t->width[c], cell);
            else
                fprintf(out, "%-*s  ", (int)t->width[c], cell);
        }
        fputc('\n', out);
    }
    tide_free(t->cells);
    t->cells = NULL;
}

/* ---- status ---------------------------------------------------------------------------------- */

/* The status reply as one JSON object, no newline. */
static void status_json(FILE *out, const tide_proto_status_reply_t *r)
{
    {
        fprintf(out, "{\"time_ms\":%lld,\"ompi_server\":", (long long)r->time_ms);
        tidectl_json_str(out, r->ompi_server);
        fprintf(out, ",\"gpus\":[");
        for (uint32_t i = 0; i < r->n_rows; i++) {
            const tide_proto_gpu_row_t *g = &r->rows[i];
            fprintf(out, "%s{\"worker\":%d,\"host\":", i ? "," : "", g->worker);
            tidectl_json_str(out, g->host);
            fprintf(out,
                    ",\"device\":%d,\"kind\":\"%s\",\"state\":\"%s\",\"mem_bytes\":%llu,\"job\":",
                    g->device, tide_proto_device_kind_name(g->kind),
                    tide_proto_worker_state_name(g->state), (unsigned long long)g->mem_bytes);
            json_str_or_null(out, g->job);
            fprintf(out,
                    ",\"stage\":%d,\"dp_rank\":%d,\"tp_rank\":%d,\"step\":%llu,\"bubble_pct\":%.3f,"
                    "\"offline\":",
                    g->stage, g->dp_rank, g->tp_rank, (unsigned long long)g->step, g->bubble_pct);
            json_str_or_null(out, g->offline);
            fprintf(out, ",\"last_seen_ms\":%lld}", (long long)g->last_seen_ms);
        }
        fputs("]}", out);
    }
}

void tidectl_print_status(FILE *out, const tide_proto_status_reply_t *r, int json)
{
    if (json) {
        status_json(out, r);
        fputc('\n', out);
        return;
    }
    static const char *const head[] = {"WORKER", "HOST", "DEV",     "KIND",   "STATE",   "JOB",
                                       "ROLE",   "STEP", "BUBBLE%", "MEMORY", "OFFLINE", "SEEN"};
    static const int right[] = {1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1};
    table_t t;
    table_init(&t, 12, head, right);
    int count[TIDE_WORKER_LEFT + 1] = {0};
    for (uint32_t i = 0; i < r->n_rows; i++) {
        const tide_proto_gpu_row_t *g = &r->rows[i];
        char(*c)[CELL] = table_row(&t);
        if (c == NULL)
            break;
        if ((int)g->state >= 0 && (int)g->state <= TIDE_WORKER_LEFT)
            count[g->state]++;
        snprintf(c[0], CELL, "%d", g->worker);
        term_str(g->host, 40, c[1], CELL); /* long enough for most FQDNs */
        snprintf(c[2], CELL, "%d", g->device);
        snprintf(c[3], CELL, "%s", tide_proto_device_kind_name(g->kind));
        snprintf(c[4], CELL, "%s", tide_proto_worker_state_name(g->state));
        term_str(g->job[0] ? g->job : "-", 24, c[5], CELL);
        if (g->stage >= 0)
            snprintf(c[6], CELL, "pp%d/dp%d/tp%d", g->stage, g->dp_rank < 0 ? 0 : g->dp_rank,
                     g->tp_rank < 0 ? 0 : g->tp_rank);
        else
            snprintf(c[6], CELL, "-");
        if (g->job[0])
            snprintf(c[7], CELL, "%llu", (unsigned long long)g->step);
        else
            snprintf(c[7], CELL, "-");
        snprintf(c[8], CELL, "%.1f", g->bubble_pct);
        tidectl_fmt_bytes(g->mem_bytes, c[9], CELL);
        term_str(g->offline[0] ? g->offline : "-", 24, c[10], CELL);
        if (r->time_ms >= g->last_seen_ms && g->last_seen_ms > 0) {
            char ago[32];
            snprintf(c[11], CELL, "%s ago",
                     fmt_ms((double)(r->time_ms - g->last_seen_ms), ago, sizeof ago));
        } else {
            snprintf(c[11], CELL, "-");
        }
    }
    fprintf(out, "%u GPUs: %d online, %d offline work, %d idle, %d draining, %d failed", r->n_rows,
            count[TIDE_WORKER_ONLINE], count[TIDE_WORKER_OFFLINE], count[TIDE_WORKER_IDLE],
            count[TIDE_WORKER_DRAINING], count[TIDE_WORKER_FAILED]);
    if (count[TIDE_WORKER_LEFT] > 0)
        fprintf(out, ", %d left", count[TIDE_WORKER_LEFT]);
    fputc('\n', out);
    if (r->ompi_server[0] != '\0')
        fprintf(out, "pools join running jobs through ompi-server %s (mpirun --ompi-server)\n",
                r->ompi_server);
    if (r->n_rows == 0) {
        tide_free(t.cells);
        fprintf(out, "no workers registered yet (start a pool with mpirun; it registers itself)\n");
        return;
    }
    table_print(&t, out);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

/* The jobs reply as one JSON object, no newline. */
static void jobs_json(FILE *out, const tide_proto_jobs_reply_t *r)
{
    {
        fputs("{\"jobs\":[", out);
        for (uint32_t i = 0; i < r->n_rows; i++) {
            const tide_proto_job_row_t *j = &r->rows[i];
            fprintf(out, "%s{\"name\":", i ? "," : "");
            tidectl_json_str(out, j->name);
            fprintf(out,
                    ",\"kind\":\"%s\",\"state\":\"%s\",\"gen\":%llu,\"dp\":%d,\"tp\":%d,\"pp\":%d,"
                    "\"workers\":%u,\"step\":%llu,\"throughput\":%.6g,\"priority\":%d,"
                    "\"attempts\":%u}",
                    tide_proto_job_kind_name(j->kind), tide_proto_job_state_name(j->state),
                    (unsigned long long)j->gen, j->dp, j->tp, j->pp, j->workers,
                    (unsigned long long)j->step, j->throughput, j->priority, j->attempts);
        }
        fputs("]}", out);
    }
}

void tidectl_print_jobs(FILE *out, const tide_proto_jobs_reply_t *r, int json)
{
    if (json) {
        jobs_json(out, r);
        fputc('\n', out);
        return;
    }
    if (r->n_rows == 0) {
        fprintf(out, "no jobs (online jobs join when their workers start; tidectl submit "
                     "--offline queues offline work)\n");
        return;
    }
    static const char *const head[] = {"JOB",     "KIND", "STATE",   "GEN",      "LAYOUT",
                                       "WORKERS", "STEP", "STEPS/S", "PRIORITY", "ATTEMPTS"};
    static const int right[] = {0, 0, 0, 1, 0, 1, 1, 1, 1, 1};
    table_t t;
    table_init(&t, 10, head, right);
    for (uint32_t i = 0; i < r->n_rows; i++) {
        const tide_proto_job_row_t *j = &r->rows[i];
        char(*c)[CELL] = table_row(&t);
        if (c == NULL)
            break;
        int online = j->kind == TIDE_JOB_ONLINE;
        term_str(j->name, 32, c[0], CELL);
        snprintf(c[1], CELL, "%s", tide_proto_job_kind_name(j->kind));
        snprintf(c[2], CELL, "%s", tide_proto_job_state_name(j->state));
        if (online) {
            snprintf(c[3], CELL, "%llu", (unsigned long long)j->gen);
            snprintf(c[4], CELL, "dp%d tp%d pp%d", j->dp, j->tp, j->pp);
            snprintf(c[6], CELL, "%llu", (unsigned long long)j->step);
            snprintf(c[7], CELL, "%.2f", j->throughput);
            snprintf(c[8], CELL, "-");
            snprintf(c[9], CELL, "-");
        } else {
            snprintf(c[3], CELL, "-");
            snprintf(c[4], CELL, "-");
            snprintf(c[6], CELL, "-");
            snprintf(c[7], CELL, "-");
            snprintf(c[8], CELL, "%d", j->priority);
            snprintf(c[9], CELL, "%u", j->attempts);
        }
        snprintf(c[5], CELL, "%u", j->workers);
    }
    table_print(&t, out);
}

/* ---- events ---------------------------------------------------------------------------------- */

void tidectl_print_events(FILE *out, const tide_proto_events_reply_t *r, int json)
{
    if (json) {
        fputs("{\"events\":[", out);
        for (uint32_t i = 0; i < r->n_rows; i++) {
            const tide_proto_event_row_t *e = &r->rows[i];
            fprintf(out, "%s{\"id\":%llu,\"time_ms\":%lld,\"job\":", i ? "," : "",
                    (unsigned long long)e->id, (long long)e->time_ms);
            json_str_or_null(out, e->job);
            fputs(",\"kind\":", out);
            tidectl_json_str(out, e->kind);
            fputs(",\"detail\":", out);
            tidectl_json_str(out, e->detail);
            fputc('}', out);
        }
        fputs("]}\n", out);
        return;
    }
    if (r->n_rows == 0) {
        fprintf(out, "no events in that range\n");
        return;
    }
    static const char *const head[] = {"ID", "TIME", "JOB", "KIND", "DETAIL"};
    static const int right[] = {1, 0, 0, 0, 0};
    table_t t;
    table_init(&t, 5, head, right);
    /* details are long: print them after the aligned columns, unclipped */
    for (uint32_t i = 0; i < r->n_rows; i++) {
        const tide_proto_event_row_t *e = &r->rows[i];
        char(*c)[CELL] = table_row(&t);
        if (c == NULL)
            break;
        snprintf(c[0], CELL, "%llu", (unsigned long long)e->id);
        fmt_time(e->time_ms, c[1], CELL);
        term_str(e->job[0] ? e->job : "-", 24, c[2], CELL);
        term_str(e->kind, 24, c[3], CELL);
    }
    size_t rows = t.nrows;
    /* table_print frees the cells, so print the detail column by hand */
    for (size_t k = 0; k < rows; k++)
        for (int col = 0; col < 4; col++) {
            size_t w = strlen(t.cells[k][col]);
            if (w > t.width[col])
                t.width[col] = w;
        }
    fprintf(out, "%*s  %-*s  %-*s  %-*s  %s\n", (int)t.width[0], head[0], (int)t.width[1], head[1],
            (int)t.width[2], head[2], (int)t.width[3], head[3], head[4]);
    for (size_t k = 0; k < rows; k++) {
        char detail[TIDE_PROTO_TEXT_MAX + 2];
        term_str(r->rows[k].detail, sizeof detail - 1, detail, sizeof detail);
        fprintf(out, "%*s  %-*s  %-*s  %-*s  %s\n", (int)t.width[0], t.cells[k][0], (int)t.width[1],
                t.cells[k][1], (int)t.width[2], t.cells[k][2], (int)t.width[3], t.cells[k][3],
                detail);
    }
    tide_free(t.cells);
}

/* ---- resize ---------------------------------------------------------------------------------- */

static void fmt_stages(const tide_proto_layout_t *l, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int s = 0; s < l->pp && k + 1 < len; s++) {
        int n = snprintf(buf + k, len - k, "%s%d-%d", s ? "," : "", l->stage_start[s],
                         l->stage_start[s + 1] - 1);
        if (n < 0 || (size_t)n >= len - k) {
            snprintf(buf + (len > 4 ? len - 4 : 0), len > 4 ? 4 : len, "...");
            return;
        }
        k += (size_t)n;
    }
}

void tidectl_print_resize(FILE *out, const tide_proto_resize_reply_t *r, int json)
{
    const tide_proto_layout_t *l = &r->layout;
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    if (json) {
        fputs("{\"job\":", out);
        tidectl_json_str(out, r->job);
        fprintf(out,
                ",\"dry_run\":%s,\"generation\":%llu,\"layout\":{\"dp\":%d,\"tp\":%d,\"pp\":%d,"
                "\"layers\":%d,\"micro_batches\":%d,\"stages\":[",
                r->dry_run ? "true" : "false", (unsigned long long)l->gen, l->dp, l->tp, l->pp,
                l->num_layers, l->micro_batches);
        for (int s = 0; s <= l->pp; s++)
            fprintf(out, "%s%d", s ? "," : "", l->stage_start[s]);
        fputs("],\"workers\":[", out);
        for (size_t i = 0; i < n; i++)
            fprintf(out, "%s%d", i ? "," : "", l->worker[i]);
        fprintf(out,
                "]},\"bytes_sent\":%llu,\"bytes_default\":%llu,\"bytes_local\":%llu,"
                "\"max_send\":%llu,\"messages\":%llu,\"est_ms\":%.3f,\"preempted\":%u,"
                "\"cross_host\":%llu,\"cross_host_default\":%llu}\n",
                (unsigned long long)r->bytes_sent, (unsigned long long)r->bytes_default,
                (unsigned long long)r->bytes_local, (unsigned long long)r->max_send,
                (unsigned long long)r->messages, r->est_ms, r->preempted,
                (unsigned long long)r->cross_host, (unsigned long long)r->cross_host_default);
        return;
    }
    char stages[256], b1[32], b2[32], b3[32], t[32];
    fmt_stages(l, stages, sizeof stages);
    if (r->dry_run)
        fprintf(out, "dry run for %s (nothing changed): generation %llu would be\n", r->job,
                (unsigned long long)l->gen);
    else
        fprintf(out, "resizing %s to generation %llu\n", r->job, (unsigned long long)l->gen);
    fprintf(out, "  layout        dp %d, tp %d, pp %d; stages %s; %d micro-batches\n", l->dp, l->tp,
            l->pp, stages, l->micro_batches);
    /* tided's worker ids, the WORKER column of tidectl status (what drain takes) */
    fprintf(out, "  workers       %zu:", n);
    for (size_t i = 0; i < n && i < 32; i++)
        fprintf(out, " %d", l->worker[i]);
    fprintf(out, "%s  (order: pp, dp, tp)\n", n > 32 ? " ..." : "");
    char b5[32];
    fprintf(out, "  bytes sent    %s over the network in %llu messages (%s across hosts)\n",
            tidectl_fmt_bytes(r->bytes_sent, b1, sizeof b1), (unsigned long long)r->messages,
            tidectl_fmt_bytes(r->cross_host, b5, sizeof b5));
    if (r->dry_run) {
        char b4[32];
        fprintf(out,
                "  rank order    %s with the default rank order (--placement default), %s "
                "across hosts\n",
                tidectl_fmt_bytes(r->bytes_default, b4, sizeof b4),
                tidectl_fmt_bytes(r->cross_host_default, b5, sizeof b5));
    }
    fprintf(out, "  largest send  %s from one worker\n",
            tidectl_fmt_bytes(r->max_send, b2, sizeof b2));
    fprintf(out, "  local copies  %s\n", tidectl_fmt_bytes(r->bytes_local, b3, sizeof b3));
    fprintf(out, "  estimated     %s\n", fmt_ms(r->est_ms, t, sizeof t));
    if (r->preempted)
        fprintf(out, "  preempts      %u offline job%s\n", r->preempted,
                r->preempted == 1 ? "" : "s");
}

/* ---- parsing --------------------------------------------------------------------------------- */

static int parse_int(const char **p, long long *v)
{
    char *end;
    if (!isdigit((unsigned char)**p))
        return -1;
    errno = 0;
    *v = strtoll(*p, &end, 10);
    if (errno != 0)
        return -1;
    *p = end;
    return 0;
}

tide_status tidectl_parse_stages(const char *text, int **starts, uint32_t *n)
{
    *starts = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *q = text; *q; q++)
        cap += *q == ',';
    if (cap > TIDE_PROTO_DEGREE_MAX)
        return tide_errorf(TIDE_ERR_INVALID, "--stages: more than %d stages",
                           TIDE_PROTO_DEGREE_MAX);
    int *s = tide_malloc((cap + 1) * sizeof *s);
    if (s == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory parsing --stages");
    const char *p = text;
    uint32_t k = 0;
    long long expect = 0;
    for (;;) {
        long long a, b;
        const char *at = p;
        if (parse_int(&p, &a) != 0)
            goto bad;
        b = a;
        if (*p == '-') {
            p++;
            if (parse_int(&p, &b) != 0)
                goto bad;
        }
        if (a != expect) {
            tide_free(s);
            return tide_errorf(TIDE_ERR_INVALID,
                               "--stages: stage %u starts at layer %lld but must start at %lld "
                               "(ranges are inclusive, contiguous, from layer 0: 0-11,12-23)",
                               k, a, expect);
        }
        if (b < a || b >= (long long)TIDE_PROTO_LAYERS_MAX) {
            tide_free(s);
            return tide_errorf(TIDE_ERR_INVALID,
                               "--stages: '%.*s' is not a layer range a-b with a <= b",
                               (int)(p - at), at);
        }
        s[k++] = (int)a;
        expect = b + 1;
        if (*p == '\0')
            break;
        if (*p != ',')
            goto bad;
        p++;
    }
    s[k] = (int)expect;
    *starts = s;
    *n = k + 1;
    return TIDE_OK;
bad:
    tide_free(s);
    return tide_errorf(TIDE_ERR_INVALID,
                       "--stages: cannot parse '%s' at '%s' (expected inclusive layer ranges "
                       "like 0-11,12-23)",
                       text, p);
}

tide_status tidectl_parse_since(const char *text, int64_t now_ms, int64_t *since_ms)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end != text && errno == 0 && v >= 0) {
        double unit = 0;
        if (strcmp(end, "s") == 0)
            unit = 1e3;
        else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
            unit = 60e3;
        else if (strcmp(end, "h") == 0)
            unit = 3600e3;
        else if (strcmp(end, "d") == 0)
            unit = 86400e3;
        else if (strcmp(end, "ms") == 0)
            unit = 1;
        if (unit > 0) {
            double ago = v * unit;
            *since_ms = ago >= (double)now_ms ? 0 : now_ms - (int64_t)ago;
            return TIDE_OK;
        }
        if (*end == '\0' && strchr(text, '.') == NULL) {
            *since_ms = (int64_t)strtoll(text, NULL, 10); /* epoch ms */
            return TIDE_OK;
        }
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int y, mo, d, h = 0, mi = 0, sec = 0;
    char sep = 0, z = 0;
    int got = sscanf(text, "%4d-%2d-%2d%c%2d:%2d:%2d%c", &y, &mo, &d, &sep, &h, &mi, &sec, &z);
    if (got == 3 || ((got == 6 || got == 7 || got == 8) && (sep == 'T' || sep == ' '))) {
        if (got == 6) {
            /* "HH:MM" then maybe 'Z' */
            sec = 0;
            z = text[strlen(text) - 1] == 'Z' ? 'Z' : 0;
        }
        if (got == 8 && z != 'Z')
            goto bad;
        if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
            goto bad;
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = h;
        tm.tm_min = mi;
        tm.tm_sec = sec;
        tm.tm_isdst = -1;
        time_t t = z == 'Z' ? timegm(&tm) : mktime(&tm);
        if (t == (time_t)-1)
            goto bad;
        *since_ms = (int64_t)t * 1000;
        return TIDE_OK;
    }
bad:
    return tide_errorf(TIDE_ERR_INVALID,
                       "--since '%s': expected a duration ago (90s, 10m, 2h, 1d), a time "
                       "(2024-05-01 12:00, 2024-05-01T12:00:00Z) or epoch milliseconds",
                       text);
}

tide_status tidectl_parse_bytes(const char *text, uint64_t *bytes)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || v < 0)
        goto bad;
    double mult = 1;
    const char *u = end;
    if (*u) {
        const char *units = "KMGTPE";
        const char *k = strchr(units, toupper((unsigned char)*u));
        if (k == NULL)
            goto bad;
        for (const char *q = units; q <= k; q++)
            mult *= 1024.0;
        u++;
        if (strcmp(u, "") != 0 && strcmp(u, "i") != 0 && strcmp(u, "iB") != 0 &&
            strcmp(u, "B") != 0)
            goto bad;
    }
    double b = v * mult;
    if (b >= 18446744073709551615.0)
        goto bad;
    *bytes = (uint64_t)b;
    return TIDE_OK;
bad:
    return tide_errorf(TIDE_ERR_INVALID,
                       "'%s' is not a byte count (examples: 1000, 512M, 16G, 16GiB)", text);
}

tide_status tidectl_read_key(const char *path_or_z85, char *pub, char *secret)
{
    if (secret == NULL)
        return tide_keyfile_server_key(path_or_z85, pub);
    tide_keyfile k;
    TIDE_CHECK(tide_keyfile_read_pair(path_or_z85, &k));
    memcpy(pub, k.public_key, sizeof k.public_key);
    memcpy(secret, k.secret_key, sizeof k.secret_key);
    memset(&k, 0, sizeof k);
    return TIDE_OK;
}

/* ---- connection ------------------------------------------------------------------------------ */

typedef struct conn {
    void *ctx, *sock, *mon;
    const char *endpoint;
    int timeout_ms;
    int curve;
    int connected; /* TCP connection established at least once */
    int refused;   /* a connect attempt failed (nobody listening) */
    int handshake_failed;
    unsigned handshake_event;
} conn_t;

static void conn_close(conn_t *c)
{
    if (c->mon)
        zmq_close(c->mon);
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    memset(c, 0, sizeof *c);
}

/* Opens the DEALER socket; returns an exit code (0 or USAGE with a message on err). */
static int conn_open(conn_t *c, const settings_t *s, FILE *err)
{
    memset(c, 0, sizeof *c);
    c->endpoint = s->endpoint;
    c->timeout_ms = (int)s->timeout_ms;
    char pub[41], secret[41], server[41];
    if ((s->key != NULL) != (s->server_key != NULL)) {
        fprintf(err, "tidectl: CURVE needs both --key (your key pair file) and --server-key "
                     "(tided's server.pub), or neither\n");
        return TIDECTL_EXIT_USAGE;
    }
    if (s->key) {
        if (tidectl_read_key(s->key, pub, secret) != TIDE_OK ||
            tidectl_read_key(s->server_key, server, NULL) != TIDE_OK) {
            fprintf(err, "tidectl: %s\n", tide_last_error());
            return TIDECTL_EXIT_USAGE;
        }
        c->curve = 1;
    }
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    if (c->sock == NULL) {
        fprintf(err, "tidectl: cannot create a ZeroMQ socket: %s\n", zmq_strerror(zmq_errno()));
        conn_close(c);
        return TIDECTL_EXIT_LOCAL;
    }
    int zero = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (c->curve) {
        if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server, 41) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, secret, 41) != 0) {
            fprintf(err, "tidectl: cannot use the CURVE keys: %s\n", zmq_strerror(zmq_errno()));
            conn_close(c);
            return TIDECTL_EXIT_USAGE;
        }
    }
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://tidectl-monitor-%p", (void *)c);
    if (zmq_socket_monitor(
            c->sock, mon_ep,
            ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED |
                ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0) {
        c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
        if (c->mon && zmq_connect(c->mon, mon_ep) != 0) {
            zmq_close(c->mon);
            c->mon = NULL;
        }
    }
    if (zmq_connect(c->sock, s->endpoint) != 0) {
        fprintf(err,
                "tidectl: --endpoint '%s': %s (expected a ZeroMQ endpoint such as "
                "tcp://127.0.0.1:5555)\n",
                s->endpoint, zmq_strerror(zmq_errno()));
        conn_close(c);
        return TIDECTL_EXIT_USAGE;
    }
    return TIDECTL_EXIT_OK;
}

/* Drains the monitor socket, updating what is known about the connection. */
static void conn_events(conn_t *c)
{
    while (c->mon) {
        zmq_msg_t f1, f2;
        zmq_msg_init(&f1);
        if (zmq_msg_recv(&f1, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f1);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f1) >= 2)
            memcpy(&ev, zmq_msg_data(&f1), sizeof ev);
        zmq_msg_close(&f1);
        zmq_msg_init(&f2);
        if (zmq_msg_recv(&f2, c->mon, 0) >= 0) /* the endpoint frame */
            zmq_msg_close(&f2);
        switch (ev) {
        case ZMQ_EVENT_CONNECTED:
            c->connected = 1;
            break;
        case ZMQ_EVENT_CONNECT_RETRIED:
            c->refused = 1;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            c->handshake_failed = 1;
            c->handshake_event = ev;
            break;
        default:
            break;
        }
    }
}

static int handshake_exit(const conn_t *c, FILE *err)
{
    if (c->curve)
        fprintf(err,
                "tidectl: refused by tided at %s: the CURVE handshake failed (%s). Is your "
                "key's .pub file in tided's --auth directory, and is --server-key tided's "
                "server.pub?\n",
                c->endpoint,
                c->handshake_event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "key not allowed"
                                                                      : "protocol error");
    else
        fprintf(err,
                "tidectl: refused by tided at %s: the handshake failed. tided probably "
                "requires CURVE: pass --key NAME.key and --server-key server.pub (see "
                "tidectl keygen --help)\n",
                c->endpoint);
    return TIDECTL_EXIT_REFUSED;
}

/*
 * Sends req and waits for one reply into *rep (owned by the caller afterwards). Returns
 * 0 with any decoded reply (the caller checks for "error"), else an exit code with the
 * reason printed on err.
 */
static int conn_call(conn_t *c, const tide_msg_t *req, tide_msg_t *rep, FILE *err)
{
    tide_msg_init(rep, TIDE_MSG_NONE);
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    if (tide_proto_encode(req, &b) != TIDE_OK) {
        fprintf(err, "tidectl: %s\n", tide_last_error());
        tide_proto_buf_destroy(&b);
        return TIDECTL_EXIT_USAGE;
    }
    /* [empty delimiter][payload]: the REQ-compatible envelope tided mirrors back */
    if (zmq_send(c->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(c->sock, b.data, b.len, ZMQ_DONTWAIT) < 0) {
        fprintf(err, "tidectl: cannot queue the request: %s\n", zmq_strerror(zmq_errno()));
        tide_proto_buf_destroy(&b);
        return TIDECTL_EXIT_UNREACHABLE;
    }
    tide_proto_buf_destroy(&b);
    uint64_t deadline = tide_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    for (;;) {
        conn_events(c);
        if (c->handshake_failed)
            return handshake_exit(c, err);
        uint64_t now = tide_now_ns();
        if (now >= deadline)
            break;
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        long wait_ms = (long)((deadline - now + 999999) / 1000000);
        int rc = zmq_poll(items, c->mon ? 2 : 1, wait_ms);
        if (rc < 0 && zmq_errno() != EINTR) {
            fprintf(err, "tidectl: polling the socket failed: %s\n", zmq_strerror(zmq_errno()));
            return TIDECTL_EXIT_UNREACHABLE;
        }
        if (rc <= 0 || !(items[0].revents & ZMQ_POLLIN))
            continue;
        /* read every frame; the payload is the last one */
        zmq_msg_t last;
        zmq_msg_init(&last);
        int more = 1;
        while (more) {
            zmq_msg_close(&last);
            zmq_msg_init(&last);
            if (zmq_msg_recv(&last, c->sock, 0) < 0)
                break;
            more = zmq_msg_more(&last);
        }
        tide_status drc = tide_proto_decode(zmq_msg_data(&last), zmq_msg_size(&last), rep);
        zmq_msg_close(&last);
        if (drc != TIDE_OK) {
            fprintf(err,
                    "tidectl: tided at %s sent a reply this tidectl cannot read (%s): are "
                    "tidectl and tided the same version?\n",
                    c->endpoint, tide_last_error());
            return TIDECTL_EXIT_REFUSED;
        }
        return TIDECTL_EXIT_OK;
    }
    if (c->connected) {
        fprintf(err,
                "tidectl: timed out after %d ms waiting for tided at %s: it accepted the "
                "connection but did not answer (busy or stuck? check its log, or raise "
                "--timeout-ms)\n",
                c->timeout_ms, c->endpoint);
        return TIDECTL_EXIT_TIMEOUT;
    }
    fprintf(err,
            "tidectl: cannot reach tided at %s (%s within %d ms): is tided running? check "
            "--endpoint or TIDE_ENDPOINT\n",
            c->endpoint, c->refused ? "connection refused" : "no connection", c->timeout_ms);
    return TIDECTL_EXIT_UNREACHABLE;
}

/* One request, one reply: prints tided's error (exit 1) or hands the reply over. */
static int call_once(settings_t *s, const tide_msg_t *req, tide_msg_t *rep, tide_msg_type_t want,
                     FILE *err)
{
    conn_t c;
    int rc = conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    rc = conn_call(&c, req, rep, err);
    conn_close(&c);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (rep->type == TIDE_MSG_ERROR) {
        char msg[TIDE_PROTO_TEXT_MAX + 2];
        fprintf(err, "tidectl: tided refused %s: %s (%s)\n", tide_msg_type_name(req->type),
                term_str(rep->u.error.message, sizeof msg - 1, msg, sizeof msg),
                tide_status_name((tide_status)rep->u.error.code));
        tide_msg_clear(rep);
        return TIDECTL_EXIT_REFUSED;
    }
    if (rep->type != want) {
        fprintf(err, "tidectl: tided answered %s with '%s', expected '%s'\n",
                tide_msg_type_name(req->type), tide_msg_type_name(rep->type),
                tide_msg_type_name(want));
        tide_msg_clear(rep);
        return TIDECTL_EXIT_REFUSED;
    }
    return TIDECTL_EXIT_OK;
}

/* ---- commands -------------------------------------------------------------------------------- */

static int usage_error(FILE *err, const char *cmd, const char *fmt, ...) TIDE_PRINTF(3, 4);

static int usage_error(FILE *err, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(err, "tidectl %s: ", cmd);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fprintf(err, " (see tidectl %s --help)\n", cmd);
    return TIDECTL_EXIT_USAGE;
}

/*
 * The whole worker table (all: with the workers that left; job: only that job's workers,
 * NULL or "" for every worker) into *out, one status page
 * after another as tided cuts them (a STATUS_REPLY holding every row; the caller clears
 * it). The pages follow tided's `next` cursor, which only grows, so this ends; a worker
 * that registers or goes meanwhile may be missed or seen, never doubled.
 */
static int fetch_status(conn_t *c, int all, const char *job, tide_msg_t *out, FILE *err)
{
    tide_msg_init(out, TIDE_MSG_STATUS_REPLY);
    tide_proto_status_reply_t *acc = &out->u.status_reply;
    size_t cap = 0;
    int32_t from = 0;
    for (;;) {
        tide_msg_t req, rep;
        tide_msg_init(&req, TIDE_MSG_STATUS);
        req.u.status.from = from;
        req.u.status.all = all;
        snprintf(req.u.status.job, sizeof req.u.status.job, "%s", job ? job : "");
        int rc = conn_call(c, &req, &rep, err);
        if (rc == TIDECTL_EXIT_OK && rep.type != TIDE_MSG_STATUS_REPLY) {
            char msg[TIDE_PROTO_TEXT_MAX + 2];
            if (rep.type == TIDE_MSG_ERROR)
                fprintf(err, "tidectl: tided refused status: %s (%s)\n",
                        term_str(rep.u.error.message, sizeof msg - 1, msg, sizeof msg),
                        tide_status_name((tide_status)rep.u.error.code));
            else
                fprintf(err, "tidectl: tided answered status with '%s'\n",
                        tide_msg_type_name(rep.type));
            tide_msg_clear(&rep);
            rc = TIDECTL_EXIT_REFUSED;
        }
        if (rc != TIDECTL_EXIT_OK) {
            tide_msg_clear(out);
            return rc;
        }
        const tide_proto_status_reply_t *pg = &rep.u.status_reply;
        if (acc->n_rows + (size_t)pg->n_rows > cap) {
            size_t ncap = cap ? cap : 256;
            while (ncap < acc->n_rows + (size_t)pg->n_rows)
                ncap *= 2;
            tide_proto_gpu_row_t *r = tide_reallocarray(acc->rows, ncap, sizeof *r);
            if (r == NULL) {
                fprintf(err, "tidectl: out of memory listing %zu workers\n",
                        acc->n_rows + (size_t)pg->n_rows);
                tide_msg_clear(&rep);
                tide_msg_clear(out);
                return TIDECTL_EXIT_LOCAL;
            }
            acc->rows = r;
            cap = ncap;
        }
        if (pg->n_rows > 0)
            memcpy(acc->rows + acc->n_rows, pg->rows, pg->n_rows * sizeof *pg->rows);
        acc->n_rows += pg->n_rows;
        acc->time_ms = pg->time_ms;
        acc->total = pg->total;
        memcpy(acc->ompi_server, pg->ompi_server, sizeof acc->ompi_server);
        int32_t next = pg->next;
        tide_msg_clear(&rep);
        if (next < 0)
            break;
        if (next <= from) { /* proto checks next > every row; a page always moves on */
            fprintf(err, "tidectl: tided's status page did not move on (next %d after %d)\n", next,
                    from);
            tide_msg_clear(out);
            return TIDECTL_EXIT_REFUSED;
        }
        from = next;
    }
    acc->next = -1;
    return TIDECTL_EXIT_OK;
}

static int copy_job(FILE *err, const char *cmd, const char *what, const char *name, char *dst);

static int cmd_status(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    char job[TIDE_PROTO_NAME_MAX + 1] = "";
    if (s->job != NULL) {
        int vrc = copy_job(err, "status", "--job", s->job, job);
        if (vrc != TIDECTL_EXIT_OK)
            return vrc;
    }
    conn_t c;
    int rc = conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    tide_msg_t rep;
    rc = fetch_status(&c, s->all, job, &rep, err);
    conn_close(&c);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_status(out, &rep.u.status_reply, s->json);
        tide_msg_clear(&rep);
    }
    return rc;
}

static int cmd_jobs(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_JOBS);
    int rc = call_once(s, &req, &rep, TIDE_MSG_JOBS_REPLY, err);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_jobs(out, &rep.u.jobs_reply, s->json);
        tide_msg_clear(&rep);
    }
    return rc;
}

static int copy_job(FILE *err, const char *cmd, const char *what, const char *name, char *dst)
{
    if (strlen(name) == 0 || strlen(name) > TIDE_PROTO_NAME_MAX)
        return usage_error(err, cmd, "%s must be 1 to %d characters", what, TIDE_PROTO_NAME_MAX);
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-:", *p))
            return usage_error(err, cmd, "%s '%s' may hold only letters, digits and . _ - :", what,
                               name);
    strcpy(dst, name);
    return TIDECTL_EXIT_OK;
}

/* Fills the degrees of r left at 0 with the job's current ones (asks tided for its jobs). */
static int keep_degrees(settings_t *s, tide_proto_resize_t *r, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_JOBS);
    int rc = call_once(s, &req, &rep, TIDE_MSG_JOBS_REPLY, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    const tide_proto_jobs_reply_t *jr = &rep.u.jobs_reply;
    const tide_proto_job_row_t *row = NULL;
    for (uint32_t i = 0; i < jr->n_rows && row == NULL; i++)
        if (jr->rows[i].kind == TIDE_JOB_ONLINE && strcmp(jr->rows[i].name, r->job) == 0)
            row = &jr->rows[i];
    if (row == NULL || row->dp == 0) {
        fprintf(err,
                "tidectl resize: no running online job '%s' to take the degrees not given "
                "from (tidectl jobs lists them); give --dp, --tp and --pp\n",
                r->job);
        tide_msg_clear(&rep);
        return TIDECTL_EXIT_REFUSED;
    }
    r->dp = r->dp ? r->dp : row->dp;
    r->tp = r->tp ? r->tp : row->tp;
    r->pp = r->pp ? r->pp : row->pp;
    tide_msg_clear(&rep);
    return TIDECTL_EXIT_OK;
}

static int cmd_resize(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_RESIZE);
    tide_proto_resize_t *r = &req.u.resize;
    int rc = copy_job(err, "resize", "JOB", argv[0], r->job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->dp == 0 && s->tp == 0 && s->pp == 0 && s->stages == NULL && s->micro == 0)
        return usage_error(err, "resize",
                           "give the new layout with --dp, --tp, --pp and/or --micro-batches "
                           "(what is not given stays as it is)");
    r->micro_batches = (int)s->micro;
    r->dp = (int)s->dp;
    r->tp = (int)s->tp;
    r->pp = (int)s->pp;
    if (r->dp == 0 || r->tp == 0 || r->pp == 0) {
        rc = keep_degrees(s, r, err);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    }
    uint64_t n = (uint64_t)r->dp * (uint64_t)r->tp * (uint64_t)r->pp;
    if (n > TIDE_PROTO_WORKERS_MAX)
        return usage_error(err, "resize", "dp*tp*pp = %llu is more than %u workers",
                           (unsigned long long)n, TIDE_PROTO_WORKERS_MAX);
    r->dry_run = s->dry_run;
    r->tp_across_hosts = s->allow_tp_across_hosts;
    if (tide_proto_placement_parse(s->placement, &r->placement) != TIDE_OK)
        return usage_error(err, "resize", "--placement %s", tide_last_error());
    if (s->stages) {
        if (tidectl_parse_stages(s->stages, &r->stage_start, &r->n_stages) != TIDE_OK)
            return usage_error(err, "resize", "%s", tide_last_error());
        if (r->n_stages != (uint32_t)r->pp + 1) {
            rc = usage_error(err, "resize", "--stages gives %u stages but --pp is %d",
                             r->n_stages - 1, r->pp);
            tide_msg_clear(&req);
            return rc;
        }
    }
    rc = call_once(s, &req, &rep, TIDE_MSG_RESIZE_REPLY, err);
    tide_msg_clear(&req);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_resize(out, &rep.u.resize_reply, s->json);
        tide_msg_clear(&rep);
    }
    return rc;
}

/* Default offline job name: the command's base name plus time and pid, in the name charset. */
static void default_name(const char *cmd, char *dst, size_t len)
{
    const char *base = strrchr(cmd, '/');
    base = base ? base + 1 : cmd;
    char clean[48];
    size_t k = 0;
    for (const char *p = base; *p && k + 1 < sizeof clean; p++)
        clean[k++] = (isalnum((unsigned char)*p) || strchr("._-", *p)) ? *p : '_';
    clean[k] = '\0';
    snprintf(dst, len, "%s-%lld-%d", k ? clean : "job", (long long)(tide_wall_ms() / 1000),
             (int)getpid());
}

static int cmd_submit(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    if (!s->offline)
        return usage_error(err, "submit",
                           "only offline jobs are submitted: add --offline (online jobs start "
                           "with mpirun and join tided themselves)");
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_SUBMIT);
    tide_proto_submit_t *m = &req.u.submit;
    if (s->plugin) {
        m->kind = TIDE_JOB_PLUGIN;
        int rc = copy_job(err, "submit", "--plugin", s->plugin, m->plugin);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    } else {
        m->kind = TIDE_JOB_COMMAND;
        if (argc == 0)
            return usage_error(
                err, "submit",
                "give the command after '--': tidectl submit --offline -- CMD ARGS...");
    }
    if ((uint32_t)argc > TIDE_PROTO_ARGV_MAX)
        return usage_error(err, "submit", "%d arguments; at most %d", argc, TIDE_PROTO_ARGV_MAX);
    for (int i = 0; i < argc; i++)
        if (strlen(argv[i]) > TIDE_PROTO_ARG_MAX)
            return usage_error(err, "submit", "argument %d is longer than %d bytes", i,
                               TIDE_PROTO_ARG_MAX);
    if (s->name) {
        int rc = copy_job(err, "submit", "--name", s->name, m->name);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    } else {
        default_name(argc ? argv[0] : s->plugin, m->name, sizeof m->name);
    }
    m->argv = argv; /* borrowed: req is not cleared */
    m->argc = (uint32_t)argc;
    m->priority = (int)s->priority;
    m->bubbles = s->bubbles;
    if (s->mem_cap && tidectl_parse_bytes(s->mem_cap, &m->mem_cap) != TIDE_OK)
        return usage_error(err, "submit", "--mem-cap %s", tide_last_error());
    int rc = call_once(s, &req, &rep, TIDE_MSG_OK, err);
    if (rc == TIDECTL_EXIT_OK) {
        const char *name = rep.u.ok.job[0] ? rep.u.ok.job : m->name;
        if (s->json) {
            fputs("{\"job\":", out);
            tidectl_json_str(out, name);
            fputs(",\"message\":", out);
            tidectl_json_str(out, rep.u.ok.message);
            fputs("}\n", out);
        } else {
            char msg[TIDE_PROTO_TEXT_MAX + 2];
            fprintf(out, "submitted offline job %s%s%s\n", name, rep.u.ok.message[0] ? ": " : "",
                    term_str(rep.u.ok.message, sizeof msg - 1, msg, sizeof msg));
        }
        tide_msg_clear(&rep);
    }
    return rc;
}

static int print_ok(settings_t *s, tide_msg_t *rep, FILE *out, const char *what)
{
    if (s->json) {
        fputs("{\"job\":", out);
        json_str_or_null(out, rep->u.ok.job);
        fputs(",\"message\":", out);
        tidectl_json_str(out, rep->u.ok.message);
        fputs("}\n", out);
    } else {
        char msg[TIDE_PROTO_TEXT_MAX + 2];
        fprintf(out, "%s\n",
                rep->u.ok.message[0] ? term_str(rep->u.ok.message, sizeof msg - 1, msg, sizeof msg)
                                     : what);
    }
    tide_msg_clear(rep);
    return TIDECTL_EXIT_OK;
}

static int cmd_cancel(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_CANCEL);
    int rc = copy_job(err, "cancel", "JOB", argv[0], req.u.cancel.job);
    if (rc == TIDECTL_EXIT_OK)
        rc = call_once(s, &req, &rep, TIDE_MSG_OK, err);
    return rc == TIDECTL_EXIT_OK ? print_ok(s, &rep, out, "cancelled") : rc;
}

static int cmd_drain(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    char *end;
    errno = 0;
    long long w = strtoll(argv[0], &end, 10);
    if (*argv[0] == '\0' || *end != '\0' || errno != 0 || w < 0 || w > INT32_MAX)
        return usage_error(err, "drain",
                           "WORKER must be a worker id (the WORKER column of tidectl status), "
                           "not '%s'",
                           argv[0]);
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_DRAIN);
    req.u.drain.worker = (int32_t)w;
    int rc = call_once(s, &req, &rep, TIDE_MSG_OK, err);
    return rc == TIDECTL_EXIT_OK ? print_ok(s, &rep, out, "draining") : rc;
}

static int cmd_checkpoint(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_CHECKPOINT);
    int rc = copy_job(err, "checkpoint", "JOB", argv[0], req.u.checkpoint.job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->dir != NULL) {
        /* the workers resolve nothing: a relative root is this shell's, made absolute */
        char cwd[TIDE_PROTO_TEXT_MAX + 1] = "";
        if (s->dir[0] != '/' && getcwd(cwd, sizeof cwd) == NULL)
            return usage_error(err, "checkpoint", "cannot make --dir %s absolute: %s", s->dir,
                               strerror(errno));
        int len = snprintf(req.u.checkpoint.dir, sizeof req.u.checkpoint.dir, "%s%s%s", cwd,
                           cwd[0] ? "/" : "", s->dir);
        if (s->dir[0] == '\0' || len < 0 || (size_t)len >= sizeof req.u.checkpoint.dir)
            return usage_error(err, "checkpoint", "--dir must be a path of 1 to %zu bytes",
                               sizeof req.u.checkpoint.dir - 1);
    }
    rc = call_once(s, &req, &rep, TIDE_MSG_OK, err);
    return rc == TIDECTL_EXIT_OK ? print_ok(s, &rep, out, "checkpoint requested") : rc;
}

static int cmd_events(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_EVENTS);
    req.u.events.since_id = (uint64_t)s->after;
    req.u.events.limit = (uint32_t)s->limit;
    if (s->since &&
        tidectl_parse_since(s->since, tide_wall_ms(), &req.u.events.since_ms) != TIDE_OK)
        return usage_error(err, "events", "%s", tide_last_error());
    int rc = call_once(s, &req, &rep, TIDE_MSG_EVENTS_REPLY, err);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_events(out, &rep.u.events_reply, s->json);
        tide_msg_clear(&rep);
    }
    return rc;
}

/* Prints the attempt log at path to out when it is one (tide_proto_attempt_log_ok for job
   and attempt, a regular file reached without a symbolic link at its end) and can be
   read; 1 when it did. tided reports paths workers gave: never any other file. */
static int print_file(FILE *out, const char *path, const char *job, uint32_t attempt)
{
    if (!tide_proto_attempt_log_ok(path, job, attempt))
        return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return 0;
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        close(fd);
        return 0;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, out);
    fclose(f);
    return 1;
}

/*
 * One attempt's output. The worker that ran it kept the whole (capped) output in a file
 * on its host, and reported the file's last bytes to tided when the attempt ended: on
 * the worker's host tidectl prints the file, elsewhere the tail tided holds, saying
 * where the rest is.
 */
static void print_attempt(FILE *out, const char *job, const tide_proto_attempt_row_t *a,
                          const char *here, int json, int first)
{
    char code[32] = "";
    if (a->state != TIDE_JOB_RUNNING)
        snprintf(code, sizeof code, ", exit code %d", a->exit_code);
    int local = a->log[0] != '\0' && strcmp(a->host, here) == 0;
    if (json) {
        fprintf(out, "%s{\"job\":", first ? "" : ",");
        tidectl_json_str(out, job);
        fprintf(out, ",\"attempt\":%u,\"worker\":%d,\"host\":", a->attempt, a->worker);
        tidectl_json_str(out, a->host);
        fprintf(out, ",\"log\":");
        tidectl_json_str(out, a->log);
        fprintf(out, ",\"state\":\"%s\",\"exit_code\":%d,\"time_ms\":%lld,\"tail\":",
                tide_proto_job_state_name(a->state), a->exit_code, (long long)a->time_ms);
        tidectl_json_str(out, a->tail);
        fprintf(out, ",\"log_here\":%s}",
                local && tide_proto_attempt_log_ok(a->log, job, a->attempt) &&
                        access(a->log, R_OK) == 0
                    ? "true"
                    : "false");
        return;
    }
    fprintf(out, "== %s attempt %u on worker %d (%s): %s%s; log %s ==\n", job, a->attempt,
            a->worker, a->host[0] ? a->host : "?", tide_proto_job_state_name(a->state), code,
            a->log[0] ? a->log : "(none)");
    if (local && print_file(out, a->log, job, a->attempt))
        return;
    if (a->tail[0] != '\0') {
        fputs(a->tail, out);
        if (a->tail[strlen(a->tail) - 1] != '\n')
            fputc('\n', out);
        fprintf(out,
                "[tidectl: the last %zu bytes, as the worker reported them at the end; the "
                "whole output is in %s on %s]\n",
                strlen(a->tail), a->log[0] ? a->log : "no file", a->host);
    } else if (a->state == TIDE_JOB_RUNNING) {
        fprintf(out, "[tidectl: no end reported yet; the output so far is in %s on %s]\n",
                a->log[0] ? a->log : "no file", a->host);
    } else {
        fprintf(out, "[tidectl: no output recorded]\n");
    }
}

static int cmd_logs(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_LOGS);
    int rc = copy_job(err, "logs", "JOB", argv[0], req.u.logs.job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->attempt > 0 && s->all)
        return usage_error(err, "logs", "give --attempt N or --all, not both");
    req.u.logs.attempt = (uint32_t)s->attempt;
    rc = call_once(s, &req, &rep, TIDE_MSG_LOGS_REPLY, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    const tide_proto_logs_reply_t *r = &rep.u.logs_reply;
    char here[256] = "";
    if (gethostname(here, sizeof here - 1) != 0)
        here[0] = '\0';
    /* default: the latest attempt; --attempt N: that one (tided sent only it); --all */
    uint32_t from = s->all || s->attempt > 0 || r->n_rows == 0 ? 0 : r->n_rows - 1;
    if (s->json)
        fputc('[', out);
    for (uint32_t i = from; i < r->n_rows; i++)
        print_attempt(out, r->job, &r->rows[i], here, s->json, i == from);
    if (s->json)
        fputs("]\n", out);
    else if (r->n_rows == 0)
        fprintf(out, "%s has not run yet\n", r->job);
    tide_msg_clear(&rep);
    return TIDECTL_EXIT_OK;
}

static int cmd_top(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    conn_t c;
    int rc = conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    int tty = isatty(fileno(out));
    for (long long i = 0; s->count == 0 || i < s->count; i++) {
        if (i > 0)
            tide_sleep_ms((uint64_t)s->interval_ms);
        tide_msg_t req, st, jobs;
        rc = fetch_status(&c, 0, NULL, &st, err);
        if (rc != TIDECTL_EXIT_OK)
            break;
        tide_msg_init(&req, TIDE_MSG_JOBS);
        rc = conn_call(&c, &req, &jobs, err);
        if (rc != TIDECTL_EXIT_OK) {
            tide_msg_clear(&st);
            break;
        }
        if (st.type != TIDE_MSG_STATUS_REPLY || jobs.type != TIDE_MSG_JOBS_REPLY) {
            const tide_msg_t *bad = st.type != TIDE_MSG_STATUS_REPLY ? &st : &jobs;
            if (bad->type == TIDE_MSG_ERROR)
                fprintf(err, "tidectl: tided refused top: %s\n", bad->u.error.message);
            else
                fprintf(err, "tidectl: unexpected '%s' reply\n", tide_msg_type_name(bad->type));
            tide_msg_clear(&st);
            tide_msg_clear(&jobs);
            rc = TIDECTL_EXIT_REFUSED;
            break;
        }
        if (s->json) {
            /* one line per refresh (NDJSON) */
            fputs("{\"status\":", out);
            status_json(out, &st.u.status_reply);
            fputs(",\"jobs\":", out);
            jobs_json(out, &jobs.u.jobs_reply);
            fputs("}\n", out);
        } else {
            char when[48];
            if (tty)
                fputs("\033[H\033[2J", out);
            else if (i > 0)
                fputc('\n', out);
            fprintf(out, "tide top  %s  (%s, every %lld ms)\n\n",
                    fmt_time(st.u.status_reply.time_ms, when, sizeof when), s->endpoint,
                    s->interval_ms);
            tidectl_print_status(out, &st.u.status_reply, 0);
            fputc('\n', out);
            tidectl_print_jobs(out, &jobs.u.jobs_reply, 0);
        }
        fflush(out);
        tide_msg_clear(&st);
        tide_msg_clear(&jobs);
    }
    conn_close(&c);
    return rc;
}

/* Writes one key file through core/keyfile; returns an exit code with the reason on err. */
static int write_key(const char *path, const tide_keyfile *k, int secret, const char *comment,
                     int force, FILE *err)
{
    tide_status rc = tide_keyfile_write(path, k, secret, comment, secret ? 0600 : 0644, force);
    if (rc == TIDE_ERR_EXISTS) {
        fprintf(err, "tidectl keygen: %s exists; pass --force to replace it\n", path);
        return TIDECTL_EXIT_USAGE;
    }
    if (rc != TIDE_OK) {
        fprintf(err, "tidectl keygen: %s\n", tide_last_error());
        return TIDECTL_EXIT_LOCAL;
    }
    return TIDECTL_EXIT_OK;
}

static int cmd_keygen(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    const char *dir = argv[0];
    const char *role = s->role;
    int is_server = strcmp(role, "server") == 0;
    tide_keyfile k;
    memset(&k, 0, sizeof k);
    if (!is_server && tide_key_role_parse(role, &k.role) != TIDE_OK)
        return usage_error(err, "keygen",
                           "--role must be admin, worker, reader or server, not '%s'", role);
    const char *name = is_server ? "server" : (s->name ? s->name : role);
    if (!is_server && strcmp(name, "server") == 0)
        return usage_error(err, "keygen", "the name 'server' is reserved for --role server");
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-", *p))
            return usage_error(err, "keygen", "--name '%s' may hold only letters, digits and . _ -",
                               name);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(err, "tidectl keygen: cannot create %s: %s\n", dir, strerror(errno));
        return TIDECTL_EXIT_LOCAL;
    }
    if (zmq_curve_keypair(k.public_key, k.secret_key) != 0) {
        fprintf(err, "tidectl keygen: this libzmq cannot make CURVE keys: %s\n",
                zmq_strerror(zmq_errno()));
        return TIDECTL_EXIT_LOCAL;
    }
    char key_path[4096], pub_path[4096], key_note[256], pub_note[256];
    snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name);
    snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name);
    if (is_server) {
        snprintf(key_note, sizeof key_note,
                 "tided's CURVE key pair: keep secret; tided --auth %s reads it", dir);
        snprintf(pub_note, sizeof pub_note,
                 "tided's public key: give it to clients (tidectl --server-key, TIDE_SERVER_KEY)");
    } else {
        snprintf(key_note, sizeof key_note,
                 "tide CURVE key pair '%s': keep secret (tidectl --key, TIDE_KEY)", name);
        snprintf(pub_note, sizeof pub_note,
                 "allowed key '%s' for tided --auth: copy into its directory", name);
    }
    struct stat sb;
    if (!s->force && (lstat(key_path, &sb) == 0 || lstat(pub_path, &sb) == 0)) {
        fprintf(err, "tidectl keygen: %s or %s exists; pass --force to replace them\n", key_path,
                pub_path);
        return TIDECTL_EXIT_USAGE;
    }
    int rc = write_key(key_path, &k, 1, key_note, s->force, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = write_key(pub_path, &k, 0, pub_note, s->force, err);
    char pub[41];
    memcpy(pub, k.public_key, sizeof pub);
    memset(&k, 0, sizeof k);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->json) {
        fprintf(out, "{\"role\":\"%s\",\"name\":", role);
        tidectl_json_str(out, name);
        fputs(",\"key_file\":", out);
        tidectl_json_str(out, key_path);
        fputs(",\"pub_file\":", out);
        tidectl_json_str(out, pub_path);
        fprintf(out, ",\"public\":\"%s\"}\n", pub);
    } else {
        fprintf(out, "wrote %s (secret, mode 0600) and %s\npublic key %s\n", key_path, pub_path,
                pub);
        if (is_server)
            fprintf(out, "start tided --auth %s; clients pass --server-key %s\n", dir, pub_path);
        else
            fprintf(out, "%s.pub must be in tided's --auth directory; clients pass --key %s\n",
                    name, key_path);
    }
    return TIDECTL_EXIT_OK;
}

/* ---- command table and main ------------------------------------------------------------------ */

/* Flag value pointers are filled in per run (settings live on tidectl_main's stack). */
#define V(field) ((void *)offsetof(settings_t, field))

static const command_t commands[] = {
    {"status",
     "status [--all] [--job JOB] [--json]",
     "table of GPUs: host, device, state, job, role, step, bubble %",
     cmd_status,
     0,
     0,
     {{"all", NULL, TIDE_OPT_BOOL, V(all), "0",
       "also list the workers that left (bye), until tided forgets them (--retention-ms)", 0, 0},
      {"job", NULL, TIDE_OPT_STRING, V(job), NULL,
       "only this job's workers: the ranks of its launches (online), the worker running it "
       "(offline)",
       0, 0},
      OPT_END}},
    {"jobs", "jobs [--json]", "table of online and offline jobs", cmd_jobs, 0, 0, {OPT_END}},
    {"resize",
     "resize JOB [--dp N] [--tp N] [--pp N] [--micro-batches N] [--stages 0-11,12-23] "
     "[--dry-run] [--placement P] [--allow-tp-across-hosts] (what is not given stays as it is)",
     "switch a running job to a new layout (or, with --dry-run, show the reshard plan)",
     cmd_resize,
     1,
     1,
     {{"dp", NULL, TIDE_OPT_INT, V(dp), NULL, "data-parallel degree", 1, TIDE_PROTO_DEGREE_MAX},
      {"tp", NULL, TIDE_OPT_INT, V(tp), NULL, "tensor-parallel degree", 1, TIDE_PROTO_DEGREE_MAX},
      {"pp", NULL, TIDE_OPT_INT, V(pp), NULL, "pipeline stages", 1, TIDE_PROTO_DEGREE_MAX},
      {"micro-batches", NULL, TIDE_OPT_INT, V(micro), NULL,
       "micro-batches per step of each dp rank (a pipeline's schedule)", 1, TIDE_PROTO_MICRO_MAX},
      {"stages", NULL, TIDE_OPT_STRING, V(stages), NULL,
       "inclusive layer ranges per stage, e.g. 0-11,12-23 (default: the job's when pp stays, "
       "else an even split)",
       0, 0},
      {"dry-run", NULL, TIDE_OPT_BOOL, V(dry_run), "0",
       "plan only: print bytes to move, largest send, estimated time", 0, 0},
      {"placement", NULL, TIDE_OPT_STRING, V(placement), "optimal",
       "optimal (fewest bytes, TP groups inside a host) or default (plain rank order)", 0, 0},
      {"allow-tp-across-hosts", NULL, TIDE_OPT_BOOL, V(allow_tp_across_hosts), "0",
       "let a TP group span hosts (its collectives then cross the network); without it a "
       "layout whose TP groups do not fit inside hosts is refused",
       0, 0},
      OPT_END}},
    {"submit",
     "submit --offline [--name N] [--priority P] [--mem-cap 16G] [--bubbles] "
     "[--plugin NAME] -- CMD ARGS...",
     "queue offline work for idle GPUs (a command, or a task plugin)",
     cmd_submit,
     0,
     TIDE_PROTO_ARGV_MAX + 1,
     {{"offline", NULL, TIDE_OPT_BOOL, V(offline), "0", "required: the job is offline work", 0, 0},
      {"name", NULL, TIDE_OPT_STRING, V(name), NULL, "job name (default: CMD-TIME-PID)", 0, 0},
      {"priority", NULL, TIDE_OPT_INT, V(priority), "0", "higher runs first", -1000, 1000},
      {"mem-cap", NULL, TIDE_OPT_STRING, V(mem_cap), NULL, "device memory cap, e.g. 16G", 0, 0},
      {"plugin", NULL, TIDE_OPT_STRING, V(plugin), NULL,
       "run the named task plugin instead of a command", 0, 0},
      {"bubbles", NULL, TIDE_OPT_BOOL, V(bubbles), "0",
       "may also run inside pipeline bubbles (plugins)", 0, 0},
      OPT_END}},
    {"cancel", "cancel JOB", "cancel a job", cmd_cancel, 1, 1, {OPT_END}},
    {"drain",
     "drain WORKER",
     "move work off a worker and give it no more",
     cmd_drain,
     1,
     1,
     {OPT_END}},
    {"checkpoint",
     "checkpoint JOB [--dir ROOT] [--json]",
     "have a running job save a checkpoint (asynchronously, at a step its ranks have not "
     "reached yet); tidectl events says checkpoint_saved when it is complete",
     cmd_checkpoint,
     1,
     1,
     {{"dir", NULL, TIDE_OPT_STRING, V(dir), NULL,
       "root to save under, on the workers' file system (default: where the job's last "
       "checkpoint went)",
       0, 0},
      OPT_END}},
    {"events",
     "events [--since 10m] [--after ID] [--limit N] [--json]",
     "the event history, oldest first",
     cmd_events,
     0,
     0,
     {{"since", NULL, TIDE_OPT_STRING, V(since), NULL,
       "only events from then on: 10m, 2h, 1d, 2024-05-01 12:00, or epoch ms", 0, 0},
      {"after", NULL, TIDE_OPT_INT, V(after), "0", "only events with a larger id", 0,
       9223372036854775807LL},
      {"limit", NULL, TIDE_OPT_INT, V(limit), "100", "at most this many events", 1,
       TIDE_PROTO_EVENTS_MAX},
      OPT_END}},
    {"logs",
     "logs JOB [--attempt N | --all] [--json]",
     "an offline command's output (stdout and stderr), by attempt: the latest by default",
     cmd_logs,
     1,
     1,
     {{"attempt", NULL, TIDE_OPT_INT, V(attempt), "0", "this attempt (1 is the first run)", 0,
       UINT32_MAX},
      {"all", NULL, TIDE_OPT_BOOL, V(all), "0", "every attempt tided recorded (its last 100)", 0,
       0},
      OPT_END}},
    {"top",
     "top [--interval MS] [--count N] [--json]",
     "refreshing status and jobs view",
     cmd_top,
     0,
     0,
     {{"interval", NULL, TIDE_OPT_INT, V(interval_ms), "1000", "refresh period in ms", 50, 3600000},
      {"count", NULL, TIDE_OPT_INT, V(count), "0", "stop after N refreshes (0: until Ctrl-C)", 0,
       1000000000},
      OPT_END}},
    {"keygen",
     "keygen DIR [--role admin|worker|reader|server] [--name NAME] [--force]",
     "write a CURVE key pair: DIR/NAME.key (secret) and DIR/NAME.pub",
     cmd_keygen,
     1,
     1,
     {{"role", NULL, TIDE_OPT_STRING, V(role), "admin", "admin, worker or server", 0, 0},
      {"name", NULL, TIDE_OPT_STRING, V(name), NULL, "file name (default: the role)", 0, 0},
      {"force", NULL, TIDE_OPT_BOOL, V(force), "0", "replace existing files", 0, 0},
      OPT_END}},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const tide_opt global_opts[] = {
    {"endpoint", "TIDE_ENDPOINT", TIDE_OPT_STRING, V(endpoint), "tcp://127.0.0.1:5555",
     "tided's ZeroMQ endpoint", 0, 0},
    {"timeout-ms", "TIDE_TIMEOUT_MS", TIDE_OPT_INT, V(timeout_ms), "5000",
     "how long to wait for tided's reply", 1, 3600000},
    {"key", "TIDE_KEY", TIDE_OPT_STRING, V(key), NULL, "your CURVE key pair file (NAME.key)", 0, 0},
    {"server-key", "TIDE_SERVER_KEY", TIDE_OPT_STRING, V(server_key), NULL,
     "tided's public key: server.pub or its 40-character Z85 text", 0, 0},
    {"json", NULL, TIDE_OPT_BOOL, V(json), "0", "machine-readable output", 0, 0},
    {"log", "TIDE_LOG", TIDE_OPT_STRING, V(log), "warn", "log level: error, warn, info, debug", 0,
     0},
};
#define N_GLOBAL (sizeof global_opts / sizeof global_opts[0])

static void print_usage(FILE *f)
{
    fprintf(f, "usage: tidectl [--endpoint E] [--timeout-ms MS] [--key F --server-key F] [--json] "
               "COMMAND ...\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nglobal options:\n");
    for (size_t i = 0; i < N_GLOBAL; i++) {
        char flag[40];
        snprintf(flag, sizeof flag, "--%s%s", global_opts[i].name,
                 global_opts[i].type == TIDE_OPT_BOOL ? "" : " V");
        fprintf(f, "  %-18s %s", flag, global_opts[i].help);
        if (global_opts[i].def)
            fprintf(f, " [default %s]", global_opts[i].def);
        if (global_opts[i].env)
            fprintf(f, " [env %s]", global_opts[i].env);
        fputc('\n', f);
    }
    fprintf(f, "\nexit codes: 0 ok; 1 refused by tided (message printed); 2 bad usage; "
               "3 cannot reach tided;\n            4 timed out waiting for the reply; 5 keygen "
               "could not write its files\n"
               "'tidectl COMMAND --help' shows a command's options.\n");
}

/* Index of the command word: the first argument that is neither a flag nor a flag's value. */
static int find_command(int argc, char **argv, int *help)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return i;
        if (strchr(a, '=') != NULL)
            continue;
        for (size_t g = 0; g < N_GLOBAL; g++)
            if (strcmp(a + 2, global_opts[g].name) == 0 && global_opts[g].type != TIDE_OPT_BOOL)
                i++; /* skip the value */
    }
    return -1;
}

int tidectl_main(int argc, char **argv, FILE *out, FILE *err)
{
    int help = 0;
    int ci = find_command(argc, argv, &help);
    if (ci < 0) {
        print_usage(help ? out : err);
        return help ? TIDECTL_EXIT_OK : TIDECTL_EXIT_USAGE;
    }
    const command_t *cmd = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[ci], commands[i].name) == 0)
            cmd = &commands[i];
    if (cmd == NULL) {
        fprintf(err, "tidectl: unknown command '%s'; commands:", argv[ci]);
        for (size_t i = 0; i < N_COMMANDS; i++)
            fprintf(err, " %s", commands[i].name);
        fprintf(err, " (tidectl --help explains them)\n");
        return TIDECTL_EXIT_USAGE;
    }
    /* one option table: global flags + this command's, value pointers into s */
    settings_t s;
    memset(&s, 0, sizeof s);
    tide_opt table[N_GLOBAL + 8 + 1];
    size_t n = 0;
    for (size_t i = 0; i < N_GLOBAL; i++)
        table[n++] = global_opts[i];
    for (size_t i = 0; i < 8 && cmd->opts[i].name; i++)
        table[n++] = cmd->opts[i];
    table[n] = (tide_opt)OPT_END;
    for (size_t i = 0; i < n; i++)
        table[i].value = (char *)&s + (size_t)table[i].value;
    int npos = 0;
    if (tide_opts_parse(table, argc, argv, &npos, &help) != TIDE_OK) {
        fprintf(err, "tidectl %s: %s\n", cmd->name, tide_last_error());
        return TIDECTL_EXIT_USAGE;
    }
    if (help) {
        char syn[256];
        snprintf(syn, sizeof syn, "%s", cmd->synopsis);
        fprintf(out, "%s\n\n", cmd->summary);
        tide_opts_usage(out, "tidectl", syn, table);
        return TIDECTL_EXIT_OK;
    }
    tide_log_level lvl;
    if (tide_log_parse_level(s.log, &lvl) != TIDE_OK) {
        fprintf(err, "tidectl: --log %s\n", tide_last_error());
        return TIDECTL_EXIT_USAGE;
    }
    tide_log_set_level(lvl);
    tide_opts_log("tidectl", table);
    /* positional: argv[1] is the command word, then its arguments */
    int nargs = npos - 1;
    char **args = argv + 2;
    if (nargs < cmd->nargs_min || nargs > cmd->nargs_max) {
        if (cmd->nargs_min == cmd->nargs_max && cmd->nargs_min == 0)
            return usage_error(err, cmd->name, "takes no arguments, got '%s'", args[0]);
        return usage_error(err, cmd->name, "usage: tidectl %s", cmd->synopsis);
    }
    int rc = cmd->run(&s, nargs, args, out, err);
    fflush(out);
    return rc;
}

#ifndef TIDECTL_NO_MAIN
int main(int argc, char **argv)
{
    return tidectl_main(argc, argv, stdout, stderr);
}
#endif
