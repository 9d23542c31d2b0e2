/*
 * tidectl's text out: the replies of tided as aligned tables or one JSON document, byte
 * counts, times, and strings made safe for a terminal. Pure formatting: no socket, no
 * state. Workload: a reply of a few thousand rows at most.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator/tidectl_int.h"
#include "core/alloc.h"

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

const char *tidectl__fmt_time(int64_t ms, char *buf, size_t len)
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
const char *tidectl__term_str(const char *s, size_t max, char *buf, size_t len)
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
void tidectl__json_str_or_null(FILE *out, const char *s)
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
void tidectl__status_json(FILE *out, const tide_proto_status_reply_t *r)
{
    {
        fprintf(out, "{\"time_ms\":%lld,\"ompi_server\":", (long long)r->time_ms);
        tidectl_json_str(out, r->ompi_server);
        if (r->state_degraded_ms > 0) /* only while degraded: older readers see what they knew */
            fprintf(out, ",\"state_degraded_ms\":%.0f", r->state_degraded_ms);
        fprintf(out, ",\"gpus\":[");
        for (uint32_t i = 0; i < r->n_rows; i++) {
            const tide_proto_gpu_row_t *g = &r->rows[i];
            fprintf(out, "%s{\"worker\":%d,\"host\":", i ? "," : "", g->worker);
            tidectl_json_str(out, g->host);
            fprintf(out,
                    ",\"device\":%d,\"kind\":\"%s\",\"state\":\"%s\",\"mem_bytes\":%llu,\"job\":",
                    g->device, tide_proto_device_kind_name(g->kind),
                    tide_proto_worker_state_name(g->state), (unsigned long long)g->mem_bytes);
            tidectl__json_str_or_null(out, g->job);
            fprintf(out,
                    ",\"stage\":%d,\"dp_rank\":%d,\"tp_rank\":%d,\"step\":%llu,\"bubble_pct\":%.3f,"
                    "\"offline\":",
                    g->stage, g->dp_rank, g->tp_rank, (unsigned long long)g->step, g->bubble_pct);
            tidectl__json_str_or_null(out, g->offline);
            /* keys added later go last: scripts match the earlier ones in order */
            fprintf(out, ",\"last_seen_ms\":%lld,\"pid\":%d,\"pool\":", (long long)g->last_seen_ms,
                    g->pid);
            tidectl__json_str_or_null(out, g->pool);
            fprintf(out, ",\"pool_rank\":%d,\"alloc\":", g->pool_rank);
            tidectl__json_str_or_null(out, g->alloc);
            fputc('}', out);
        }
        fputs("]}", out);
    }
}

void tidectl_print_status(FILE *out, const tide_proto_status_reply_t *r, int format)
{
    if (format == TIDECTL_JSON) {
        tidectl__status_json(out, r);
        fputc('\n', out);
        return;
    }
    /* ALLOC only when some launch runs in a scheduler's allocation; wide: the columns that
       map a row to a process (which mpirun launch, which of its ranks, which pid on HOST) */
    static const char *const usual[] = {"WORKER", "HOST", "DEV",     "KIND",   "STATE",   "JOB",
                                        "ROLE",   "STEP", "BUBBLE%", "MEMORY", "OFFLINE", "SEEN"};
    static const int usual_right[] = {1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1};
    const char *head[MAX_COLS];
    int right[MAX_COLS], n = 12;
    memcpy(head, usual, sizeof usual);
    memcpy(right, usual_right, sizeof usual_right);
    int allocs = 0, wide = format == TIDECTL_WIDE;
    for (uint32_t i = 0; i < r->n_rows; i++)
        allocs |= r->rows[i].alloc[0] != '\0';
    int at_alloc = allocs ? n++ : -1, at_pool = wide ? n : -1;
    if (allocs) {
        head[at_alloc] = "ALLOC";
        right[at_alloc] = 0;
    }
    if (wide) {
        static const char *const w[] = {"POOL", "RANK", "PID"};
        for (int k = 0; k < 3; k++, n++) {
            head[n] = w[k];
            right[n] = k > 0;
        }
    }
    table_t t;
    table_init(&t, n, head, right);
    int count[TIDE_WORKER_LEFT + 1] = {0};
    for (uint32_t i = 0; i < r->n_rows; i++) {
        const tide_proto_gpu_row_t *g = &r->rows[i];
        char(*c)[CELL] = table_row(&t);
        if (c == NULL)
            break;
        if ((int)g->state >= 0 && (int)g->state <= TIDE_WORKER_LEFT)
            count[g->state]++;
        snprintf(c[0], CELL, "%d", g->worker);
        tidectl__term_str(g->host, 40, c[1], CELL); /* long enough for most FQDNs */
        snprintf(c[2], CELL, "%d", g->device);
        snprintf(c[3], CELL, "%s", tide_proto_device_kind_name(g->kind));
        snprintf(c[4], CELL, "%s", tide_proto_worker_state_name(g->state));
        tidectl__term_str(g->job[0] ? g->job : "-", 24, c[5], CELL);
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
        tidectl__term_str(g->offline[0] ? g->offline : "-", 24, c[10], CELL);
        if (r->time_ms >= g->last_seen_ms && g->last_seen_ms > 0) {
            char ago[32];
            snprintf(c[11], CELL, "%s ago",
                     fmt_ms((double)(r->time_ms - g->last_seen_ms), ago, sizeof ago));
        } else {
            snprintf(c[11], CELL, "-");
        }
        if (allocs)
            tidectl__term_str(g->alloc[0] ? g->alloc : "-", 40, c[at_alloc], CELL);
        if (wide) {
            tidectl__term_str(g->pool[0] ? g->pool : "-", 40, c[at_pool], CELL);
            snprintf(c[at_pool + 1], CELL, "%d", g->pool_rank);
            if (g->pid > 0)
                snprintf(c[at_pool + 2], CELL, "%d", g->pid);
            else
                snprintf(c[at_pool + 2], CELL, "-");
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
    if (r->state_degraded_ms > 0)
        fprintf(out,
                "state: DEGRADED for %.0f s: tided cannot write its state file; it keeps "
                "detecting and recovering failures in memory and refuses operators' changes "
                "until it can (tidectl events --type 'state_*' says why)\n",
                r->state_degraded_ms / 1000.0);
    if (r->n_rows == 0) {
        tide_free(t.cells);
        fprintf(out, "no workers registered yet (start a pool with mpirun; it registers itself)\n");
        return;
    }
    table_print(&t, out);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

/* What keeps the elastic policy off a job (tide_proto_job_row_t.hold), as a word. */
static const char *hold_name(int32_t hold)
{
    return hold == 1 ? "pinned" : hold == 2 ? "operator" : "free";
}

/* An online job's BOUNDS cell: "4-12", "-" without bounds, with " pinned" or " held" (an
   operator's resize in force) when the policy leaves it alone. */
static void bounds_cell(const tide_proto_job_row_t *j, char *out, size_t cap)
{
    const char *why = j->hold == 1 ? " pinned" : j->hold == 2 ? " held" : "";
    if (j->max_gpus > 0)
        snprintf(out, cap, "%d-%d%s", j->min_gpus, j->max_gpus, why);
    else
        snprintf(out, cap, "-%s", why);
}

/* The jobs reply as one JSON object, no newline. */
void tidectl__jobs_json(FILE *out, const tide_proto_jobs_reply_t *r)
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
                    "\"attempts\":%u,",
                    tide_proto_job_kind_name(j->kind), tide_proto_job_state_name(j->state),
                    (unsigned long long)j->gen, j->dp, j->tp, j->pp, j->workers,
                    (unsigned long long)j->step, j->throughput, j->priority, j->attempts);
            if (j->kind == TIDE_JOB_ONLINE)
                fprintf(out, "\"min_gpus\":%d,\"max_gpus\":%d,\"hold\":\"%s\",", j->min_gpus,
                        j->max_gpus, hold_name(j->hold));
            fputs("\"allocs\":", out);
            tidectl__json_str_or_null(out, j->allocs);
            fputc('}', out);
        }
        fputs("]}", out);
    }
}

void tidectl_print_jobs(FILE *out, const tide_proto_jobs_reply_t *r, int json)
{
    if (json) {
        tidectl__jobs_json(out, r);
        fputc('\n', out);
        return;
    }
    if (r->n_rows == 0) {
        fprintf(out, "no jobs (online jobs join when their workers start; tidectl submit "
                     "--offline queues offline work)\n");
        return;
    }
    static const char *const head[] = {"JOB",     "KIND",     "STATE",  "GEN",
                                       "LAYOUT",  "WORKERS",  "STEP",   "STEPS/S",
                                       "PRIORITY", "ATTEMPTS", "BOUNDS", "ALLOCATIONS"};
    static const int right[] = {0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0};
    int allocs = 0; /* the ALLOCATIONS column only when some job has one */
    for (uint32_t i = 0; i < r->n_rows; i++)
        allocs |= r->rows[i].allocs[0] != '\0';
    table_t t;
    table_init(&t, allocs ? 12 : 11, head, right);
    for (uint32_t i = 0; i < r->n_rows; i++) {
        const tide_proto_job_row_t *j = &r->rows[i];
        char(*c)[CELL] = table_row(&t);
        if (c == NULL)
            break;
        int online = j->kind == TIDE_JOB_ONLINE;
        tidectl__term_str(j->name, 32, c[0], CELL);
        snprintf(c[1], CELL, "%s", tide_proto_job_kind_name(j->kind));
        snprintf(c[2], CELL, "%s", tide_proto_job_state_name(j->state));
        if (online) {
            snprintf(c[3], CELL, "%llu", (unsigned long long)j->gen);
            snprintf(c[4], CELL, "dp%d tp%d pp%d", j->dp, j->tp, j->pp);
            snprintf(c[6], CELL, "%llu", (unsigned long long)j->step);
            snprintf(c[7], CELL, "%.2f", j->throughput);
            snprintf(c[8], CELL, "%d", j->priority);
            snprintf(c[9], CELL, "-");
            bounds_cell(j, c[10], CELL);
        } else {
            snprintf(c[3], CELL, "-");
            snprintf(c[4], CELL, "-");
            snprintf(c[6], CELL, "-");
            snprintf(c[7], CELL, "-");
            snprintf(c[8], CELL, "%d", j->priority);
            snprintf(c[9], CELL, "%u", j->attempts);
            snprintf(c[10], CELL, "-");
        }
        snprintf(c[5], CELL, "%u", j->workers);
        if (allocs)
            tidectl__term_str(j->allocs[0] ? j->allocs : "-", CELL - 1, c[11], CELL);
    }
    table_print(&t, out);
}

/* ---- events ---------------------------------------------------------------------------------- */

/* "key":value for the typed fields of e that apply (none: nothing). */
static void event_fields_json(FILE *out, const tide_proto_event_fields_t *f)
{
    if (f->gen)
        fprintf(out, ",\"gen\":%llu", (unsigned long long)f->gen);
    if (f->dp)
        fprintf(out, ",\"dp\":%d,\"tp\":%d,\"pp\":%d", f->dp, f->tp, f->pp);
    if (f->from_dp)
        fprintf(out, ",\"from_dp\":%d,\"from_tp\":%d,\"from_pp\":%d", f->from_dp, f->from_tp,
                f->from_pp);
    if (f->n_workers) {
        fputs(",\"workers\":[", out);
        for (uint32_t i = 0; i < f->n_workers; i++)
            fprintf(out, "%s%d", i ? "," : "", f->workers[i]);
        fputc(']', out);
    }
    if (f->host[0]) {
        fputs(",\"host\":", out);
        tidectl_json_str(out, f->host);
    }
    if (f->step >= 0)
        fprintf(out, ",\"step\":%lld", (long long)f->step);
    if (f->steps_lost)
        fprintf(out, ",\"steps_lost\":%lld", (long long)f->steps_lost);
    if (f->bytes)
        fprintf(out, ",\"bytes\":%llu", (unsigned long long)f->bytes);
    if (f->ms > 0)
        fprintf(out, ",\"ms\":%.3f", f->ms);
    if (f->downtime_ms > 0)
        fprintf(out, ",\"downtime_ms\":%.3f", f->downtime_ms);
    if (f->bubbles)
        fputs(",\"bubbles\":true", out);
    if (f->reason[0]) {
        fputs(",\"reason\":", out);
        tidectl_json_str(out, f->reason);
    }
}

void tidectl__event_json(FILE *out, const tide_proto_event_row_t *e)
{
    fprintf(out, "{\"id\":%llu,\"time_ms\":%lld,\"job\":", (unsigned long long)e->id,
            (long long)e->time_ms);
    tidectl__json_str_or_null(out, e->job);
    fputs(",\"kind\":", out);
    tidectl_json_str(out, e->kind);
    fputs(",\"detail\":", out);
    tidectl_json_str(out, e->detail);
    event_fields_json(out, &e->fields);
    fputs("}\n", out);
}

void tidectl_print_events(FILE *out, const tide_proto_events_reply_t *r, int json)
{
    if (json) {
        for (uint32_t i = 0; i < r->n_rows; i++)
            tidectl__event_json(out, &r->rows[i]);
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
        tidectl__fmt_time(e->time_ms, c[1], CELL);
        tidectl__term_str(e->job[0] ? e->job : "-", 24, c[2], CELL);
        tidectl__term_str(e->kind, 24, c[3], CELL);
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
        tidectl__term_str(r->rows[k].detail, sizeof detail - 1, detail, sizeof detail);
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
