/*
 * tidectl's commands that read: status, jobs, logs and top (events: tidectl_events.c). Each asks
 * tided and prints the reply (tidectl_print.c); logs prints an attempt's file itself when it is on
 * this host.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator/tidectl_int.h"
#include "core/clock.h"

/* One status listing printed in format; with --watch, a header above it (and on a
   terminal the screen cleared first), round i of the refreshes. */
static int status_once(settings_t *s, conn_t *c, const char *job, int format, long long i,
                       FILE *out, FILE *err)
{
    tide_msg_t rep;
    int rc = tidectl__fetch_status(c, s->all, job, &rep, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->watch && format != TIDECTL_JSON) {
        char when[48];
        if (isatty(fileno(out)))
            fputs("\033[H\033[2J", out);
        else if (i > 0)
            fputc('\n', out);
        fprintf(out, "tidectl status  %s  (%s, every %lld ms)\n\n",
                tidectl__fmt_time(rep.u.status_reply.time_ms, when, sizeof when), s->endpoint,
                s->interval_ms);
    }
    tidectl_print_status(out, &rep.u.status_reply, format);
    fflush(out);
    tide_msg_clear(&rep);
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_status(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    char job[TIDE_PROTO_NAME_MAX + 1] = "";
    if (s->job != NULL) {
        int vrc = tidectl__copy_job(err, "status", "--job", s->job, job);
        if (vrc != TIDECTL_EXIT_OK)
            return vrc;
    }
    int format = s->json ? TIDECTL_JSON : TIDECTL_TABLE;
    if (s->output != NULL && strcmp(s->output, "wide") == 0 && !s->json)
        format = TIDECTL_WIDE;
    else if (s->output != NULL && strcmp(s->output, "wide") != 0)
        return tidectl__usage_error(err, "status", "-o/--output takes 'wide', not '%s'",
                                    s->output);
    if (!s->watch && s->count != 0)
        return tidectl__usage_error(err, "status", "--count needs --watch");
    conn_t c;
    int rc = tidectl__conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    for (long long i = 0; rc == TIDECTL_EXIT_OK && (!s->watch || s->count == 0 || i < s->count);
         i++) {
        if (i > 0)
            tide_sleep_ms((uint64_t)s->interval_ms);
        rc = status_once(s, &c, job, format, i, out, err);
        if (!s->watch)
            break;
    }
    tidectl__conn_close(&c);
    return rc;
}

int tidectl__cmd_jobs(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_JOBS);
    int rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_JOBS_REPLY, err);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_jobs(out, &rep.u.jobs_reply, s->json);
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
        if (a->log[0] == '\0') /* a plugin's attempt, or a command that never started */
            fprintf(out, "[tidectl: as the worker on %s reported it at the end; no output file]\n",
                    a->host);
        else
            fprintf(out,
                    "[tidectl: the last %zu bytes, as the worker reported them at the end; the "
                    "whole output is in %s on %s]\n",
                    strlen(a->tail), a->log, a->host);
    } else if (a->state == TIDE_JOB_RUNNING) {
        fprintf(out, "[tidectl: no end reported yet; the output so far is in %s on %s]\n",
                a->log[0] ? a->log : "no file", a->host);
    } else {
        fprintf(out, "[tidectl: no output recorded]\n");
    }
}

int tidectl__cmd_logs(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_LOGS);
    int rc = tidectl__copy_job(err, "logs", "JOB", argv[0], req.u.logs.job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->attempt > 0 && s->all)
        return tidectl__usage_error(err, "logs", "give --attempt N or --all, not both");
    req.u.logs.attempt = (uint32_t)s->attempt;
    rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_LOGS_REPLY, err);
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

int tidectl__cmd_top(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    conn_t c;
    int rc = tidectl__conn_open(&c, s, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    int tty = isatty(fileno(out));
    for (long long i = 0; s->count == 0 || i < s->count; i++) {
        if (i > 0)
            tide_sleep_ms((uint64_t)s->interval_ms);
        tide_msg_t req, st, jobs;
        rc = tidectl__fetch_status(&c, 0, NULL, &st, err);
        if (rc != TIDECTL_EXIT_OK)
            break;
        tide_msg_init(&req, TIDE_MSG_JOBS);
        rc = tidectl__conn_call(&c, &req, &jobs, err);
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
            tidectl__status_json(out, &st.u.status_reply);
            fputs(",\"jobs\":", out);
            tidectl__jobs_json(out, &jobs.u.jobs_reply);
            fputs("}\n", out);
        } else {
            char when[48];
            if (tty)
                fputs("\033[H\033[2J", out);
            else if (i > 0)
                fputc('\n', out);
            fprintf(out, "tide top  %s  (%s, every %lld ms)\n\n",
                    tidectl__fmt_time(st.u.status_reply.time_ms, when, sizeof when), s->endpoint,
                    s->interval_ms);
            tidectl_print_status(out, &st.u.status_reply, 0);
            fputc('\n', out);
            tidectl_print_jobs(out, &jobs.u.jobs_reply, 0);
        }
        fflush(out);
        tide_msg_clear(&st);
        tide_msg_clear(&jobs);
    }
    tidectl__conn_close(&c);
    return rc;
}
