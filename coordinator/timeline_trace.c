/*
 * coordinator/timeline_trace: a job's timeline (timeline_int.h) as a Chrome trace (the
 * JSON "Trace Event Format" Perfetto and chrome://tracing open): a process per host, a
 * thread per GPU, a complete event ("X") per segment, and the job's marks on a process of
 * their own ("reconfigurations" with their downtime as durations, checkpoints and
 * failures as instants). Times in microseconds from the timeline's start.
 */
#include <errno.h>
#include <string.h>

#include "core/error.h"
#include "coordinator/timeline_int.h"

/* s as a JSON string (our names and hosts: printable ASCII; others become '?'). */
static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else
            fputc(c >= 0x20 && c < 0x7f ? c : '?', out);
    }
    fputc('"', out);
}

/* pid of row i: one per host, in row order (rows are sorted by host); 1-based, 0 is the
   job's own process (its marks). */
static int pid_of(const tide_timeline_t *t, size_t i)
{
    int pid = 1;
    for (size_t k = 1; k <= i; k++)
        pid += strcmp(t->rows[k].host, t->rows[k - 1].host) != 0;
    return pid;
}

static void names(const tide_timeline_t *t, FILE *out)
{
    fputs("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":", out);
    json_str(out, t->job);
    fputs("}}", out);
    for (size_t i = 0; i < t->n_rows; i++) {
        const row_t *r = &t->rows[i];
        int pid = pid_of(t, i);
        if (i == 0 || pid != pid_of(t, i - 1)) {
            fprintf(
                out,
                ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":", pid);
            json_str(out, r->host[0] ? r->host : "?");
            fputs("}}", out);
        }
        fprintf(out,
                ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{"
                "\"name\":\"GPU %d (worker %d)\"}}",
                pid, r->worker, r->device, r->worker);
    }
}

static void segments(const tide_timeline_t *t, FILE *out)
{
    for (size_t i = 0; i < t->n_segs; i++) {
        const seg_t *s = &t->segs[i];
        char name[TIDE_PROTO_NAME_MAX + 32];
        if (s->kind == SEG_ONLINE)
            snprintf(name, sizeof name, "g%llu p%d d%d t%d", (unsigned long long)s->gen, s->p, s->d,
                     s->t);
        else
            snprintf(name, sizeof name, "%s", s->kind == SEG_FAILED ? "failed" : s->job);
        fputs(",\n{\"ph\":\"X\",\"name\":", out);
        json_str(out, name);
        fprintf(out, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,\"dur\":%lld}",
                tide__timeline_seg_class[s->kind], pid_of(t, s->row), t->rows[s->row].worker,
                (long long)(s->t0 - t->start) * 1000, (long long)(s->t1 - s->t0) * 1000);
    }
}

static void marks(const tide_timeline_t *t, FILE *out)
{
    for (size_t i = 0; i < t->n_marks; i++) {
        const mark_t *m = &t->marks[i];
        fputs(",\n{\"name\":", out);
        json_str(out, m->text);
        if (m->kind <= MK_ABORT)
            fprintf(out, ",\"ph\":\"X\",\"dur\":%lld", (long long)(m->t1 - m->t0) * 1000);
        else
            fputs(",\"ph\":\"i\",\"s\":\"g\"", out);
        fprintf(out,
                ",\"cat\":\"%s\",\"pid\":0,\"tid\":0,\"ts\":%lld,\"args\":{\"gen\":%llu,"
                "\"ms\":%.1f,\"step\":%lld,\"worker\":%d}}",
                tide__timeline_mark_class[m->kind], (long long)(m->t0 - t->start) * 1000,
                (unsigned long long)m->gen, m->ms, (long long)m->step, m->worker);
    }
}

tide_status tide_timeline_trace(const tide_timeline_t *t, FILE *out)
{
    fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"job\":", out);
    json_str(out, t->job);
    fprintf(out, ",\"start_ms\":%lld},\"traceEvents\":[\n", (long long)t->start);
    names(t, out);
    segments(t, out);
    marks(t, out);
    fputs("\n]}\n", out);
    if (fflush(out) != 0 || ferror(out))
        return tide_errorf(TIDE_ERR_IO, "writing the trace: %s", strerror(errno));
    return TIDE_OK;
}
