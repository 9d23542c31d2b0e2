/*
 * coordinator/slurm: the Slurm provider (provider.h). A grow is a small state machine of
 * Slurm commands run as child processes (child.h), one step per tick:
 *   show    `scontrol show job -o TEMPLATE`: the batch script, folder, partition and name
 *           of an allocation the job already runs in;
 *   submit  `sbatch --parsable --nodes N --partition P --job-name NAME --chdir DIR SCRIPT`:
 *           the same script again (its #SBATCH lines apply, -N overrides theirs);
 *   wait    the allocation, in one `squeue` every poll_ms for all waited ones: pending
 *           (an event per new reason; cancelled at once for a reason that can never clear,
 *           or after pending_ms), then running (event) or gone;
 *   cancel  `scancel ID`.
 * A watched allocation (one giving its nodes back after a grace signal) only waits: it is
 * seen leave (pending again after its requeue) and start again. Nothing here touches
 * tided's state: findings are events through the sink; the pools of a started allocation
 * reach tided by registering. Loop thread only.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/child.h"
#include "coordinator/provider.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

#define JOB_MAX   128
#define FIELD_MAX 1024

typedef enum phase { PH_SHOW, PH_SUBMIT, PH_WAIT, PH_CANCEL } phase;

/* One allocation asked for (a grow) or watched (leaving after a grace signal). */
typedef struct entry {
    char job[JOB_MAX];            /* the online job it is for */
    char tmpl[TIDE_ALLOC_ID_MAX]; /* grow: the allocation whose script is submitted again */
    char id[TIDE_ALLOC_ID_MAX];   /* Slurm's id ("" before sbatch answered) */
    int nodes;                    /* grow: nodes asked for */
    int watch;                    /* 1: a watched allocation, not one this provider asked for */
    int left;                     /* watch: it was seen not running (requeued) */
    int cancel;                   /* cancel it as soon as its id is known (its job ended) */
    phase ph;
    char reason[96];       /* the pending reason last reported */
    char started[32];      /* watch: the start time squeue gave while it was leaving */
    char partition[128];   /* grow: where it was submitted */
    uint64_t since_ns;     /* submitted or watched since */
    tide_child_t *child;   /* the command of this entry's step, NULL between steps */
} entry;

typedef struct slurm {
    tide_slurm_config cfg;
    tide_provider_event_fn sink;
    void *ctx;
    entry *e;
    size_t n, cap;
    tide_child_t *poll; /* the squeue of all waited entries, NULL between polls */
    uint64_t next_poll_ns;
} slurm;

static void event(slurm *p, const char *job, const char *kind, const char *fmt, ...)
    TIDE_PRINTF(4, 5);

static void event(slurm *p, const char *job, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    TIDE_INFO("slurm", "%s %s: %s", job, kind, detail);
    if (p->sink != NULL)
        p->sink(p->ctx, job, kind, detail);
}

/* ---- Slurm's text -------------------------------------------------------------------------- */

tide_status tide_slurm_field(const char *line, const char *key, char *out, size_t len)
{
    size_t kl = strlen(key);
    const char *at = line;
    for (;;) {
        at = strstr(at, key);
        if (at == NULL)
            return tide_errorf(TIDE_ERR_NOT_FOUND, "no %s= in Slurm's answer", key);
        if ((at == line || at[-1] == ' ') && at[kl] == '=')
            break;
        at += kl;
    }
    const char *v = at + kl + 1, *end = v;
    /* the value runs to the next " Key=" (values may hold spaces; keys never do) */
    for (const char *q = v; *q != '\0' && *q != '\n'; q++) {
        end = q + 1;
        if (q[0] != ' ')
            continue;
        const char *k = q + 1;
        while ((*k >= 'A' && *k <= 'Z') || (*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') ||
               *k == '/' || *k == ':' || *k == '_')
            k++;
        if (k > q + 1 && *k == '=' && q[1] >= 'A' && q[1] <= 'Z') {
            end = q;
            break;
        }
    }
    size_t n = (size_t)(end - v);
    if ((n == 6 && strncmp(v, "(null)", 6) == 0) || n == 0)
        return tide_errorf(TIDE_ERR_NOT_FOUND, "%s is empty in Slurm's answer", key);
    if (n >= len)
        return tide_errorf(TIDE_ERR_RANGE, "%s= is longer than %zu bytes", key, len - 1);
    memcpy(out, v, n);
    out[n] = '\0';
    return TIDE_OK;
}

int tide_slurm_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n >= TIDE_ALLOC_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || id[i] == '_'))
            return 0;
    return id[0] != '_';
}

tide_status tide_slurm_parsable_id(const char *text, char *out, size_t len)
{
    size_t n = strcspn(text, ";\n");
    if (n == 0 || n >= len || n >= TIDE_ALLOC_ID_MAX)
        return tide_errorf(TIDE_ERR_PROTOCOL, "sbatch printed no job id: '%.60s'", text);
    memcpy(out, text, n);
    out[n] = '\0';
    if (!tide_slurm_id_ok(out))
        return tide_errorf(TIDE_ERR_PROTOCOL, "sbatch printed no job id: '%.60s'", text);
    return TIDE_OK;
}

int tide_slurm_reason_fatal(const char *reason)
{
    /* limits a pending job can never get past as submitted (Slurm's job_reason names) */
    static const char *const fatal[] = {
        "PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig",     "InvalidAccount",
        "InvalidQOS",         "QOSMaxNodePerJobLimit", "AssocMaxNodesPerJobLimit",
        "BadConstraints",     "DependencyNeverSatisfied", "AccountNotAllowed", "QOSNotAllowed",
        "PartitionDown",      "PartitionInactive"};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        if (strcmp(reason, fatal[i]) == 0)
            return 1;
    return 0;
}

/* What a pending reason means, for events. */
static const char *reason_text(const char *r)
{
    if (strcmp(r, "Resources") == 0)
        return "no free nodes yet";
    if (strcmp(r, "Priority") == 0)
        return "jobs of higher priority come first";
    if (strcmp(r, "BeginTime") == 0)
        return "not before its begin time: Slurm holds a requeued job about two minutes";
    if (strcmp(r, "PartitionNodeLimit") == 0)
        return "more nodes than the partition allows";
    if (strcmp(r, "PartitionConfig") == 0)
        return "more nodes (or other resources) than the partition has";
    if (strcmp(r, "PartitionTimeLimit") == 0)
        return "a longer time limit than the partition allows";
    if (strcmp(r, "ReqNodeNotAvail") == 0)
        return "a node it needs is down, drained or reserved";
    if (strncmp(r, "JobHeld", 7) == 0)
        return "held: scontrol release releases it";
    return tide_slurm_reason_fatal(r) ? "a limit it can never get past" : "waiting";
}

/* ---- commands ------------------------------------------------------------------------------ */

/* argv[0] for Slurm command `name`: cfg.bin/name, or name (found in PATH). */
static const char *cmd(const slurm *p, const char *name, char *buf, size_t len)
{
    if (p->cfg.bin[0] == '\0')
        return name;
    snprintf(buf, len, "%s/%s", p->cfg.bin, name);
    return buf;
}

/* Starts `name args...` (NULL-terminated) as e's step (e NULL: the poll). */
static tide_status run(slurm *p, tide_child_t **out, const char *cwd, const char *name, ...)
{
    char path[1200];
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)cmd(p, name, path, sizeof path);
    va_list ap;
    va_start(ap, name);
    const char *a;
    while (n < 15 && (a = va_arg(ap, const char *)) != NULL)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return tide_child_start(out, argv, cwd, p->cfg.cmd_ms);
}

/* How a finished child failed, in words ("" when it exited 0). */
static void failure(const tide_child_t *c, char *buf, size_t len)
{
    char last[512];
    tide_child_last_line(c, last, sizeof last);
    switch (tide_child_how(c)) {
    case TIDE_CHILD_TIMEOUT:
        snprintf(buf, len, "no answer within its deadline%s%.400s", last[0] ? ": " : "", last);
        return;
    case TIDE_CHILD_SIGNALED:
        snprintf(buf, len, "killed by signal %d", tide_child_code(c));
        return;
    case TIDE_CHILD_EXITED:
        if (tide_child_code(c) == 0)
            buf[0] = '\0';
        else
            snprintf(buf, len, "%s", last[0] ? last : "failed without a word");
        return;
    }
}

static void drop(slurm *p, size_t i)
{
    tide_child_destroy(&p->e[i].child);
    p->e[i] = p->e[p->n - 1];
    p->n--;
}

static void start_cancel(slurm *p, entry *e)
{
    tide_child_destroy(&e->child);
    e->ph = PH_CANCEL;
    if (run(p, &e->child, NULL, "scancel", e->id, (const char *)NULL) != TIDE_OK)
        event(p, e->job, "allocation_cancelled", "cannot cancel Slurm job %s: %s", e->id,
              tide_last_error());
}

/* show finished: submit the template's script again. Returns 0 when e is done with. */
static int after_show(slurm *p, entry *e)
{
    char why[512], script[FIELD_MAX], dir[FIELD_MAX], name[256];
    failure(e->child, why, sizeof why);
    if (why[0] != '\0') {
        event(p, e->job, "grow_refused", "cannot read Slurm job %s (the job's allocation): %s",
              e->tmpl, why);
        return 0;
    }
    const char *out = tide_child_output(e->child, NULL);
    if (tide_slurm_field(out, "Command", script, sizeof script) != TIDE_OK || script[0] != '/') {
        event(p, e->job, "grow_refused",
              "Slurm job %s has no batch script file to submit again (salloc, --wrap or a script "
              "from stdin): launch the new nodes' pools by hand", e->tmpl);
        return 0;
    }
    if (tide_slurm_field(out, "WorkDir", dir, sizeof dir) != TIDE_OK)
        snprintf(dir, sizeof dir, "/");
    if (tide_slurm_field(out, "Partition", e->partition, sizeof e->partition) != TIDE_OK)
        e->partition[0] = '\0';
    if (tide_slurm_field(out, "JobName", name, sizeof name) != TIDE_OK)
        snprintf(name, sizeof name, "tide-%s", e->job);
    char nodes[32], part[160], jname[300], chdir[FIELD_MAX + 16];
    snprintf(nodes, sizeof nodes, "--nodes=%d", e->nodes);
    snprintf(part, sizeof part, "--partition=%s", e->partition);
    snprintf(jname, sizeof jname, "--job-name=%s", name);
    snprintf(chdir, sizeof chdir, "--chdir=%s", dir);
    tide_child_destroy(&e->child);
    e->ph = PH_SUBMIT;
    tide_status rc =
        e->partition[0] ? run(p, &e->child, NULL, "sbatch", "--parsable", nodes, part, jname, chdir,
                              script, (const char *)NULL)
                        : run(p, &e->child, NULL, "sbatch", "--parsable", nodes, jname, chdir, script,
                              (const char *)NULL);
    if (rc != TIDE_OK) {
        event(p, e->job, "grow_refused", "cannot run sbatch: %s", tide_last_error());
        return 0;
    }
    return 1;
}

/* sbatch finished: the allocation is asked for. Returns 0 when e is done with. */
static int after_submit(slurm *p, entry *e, uint64_t now)
{
    char why[512];
    failure(e->child, why, sizeof why);
    if (why[0] == '\0' &&
        tide_slurm_parsable_id(tide_child_output(e->child, NULL), e->id, sizeof e->id) != TIDE_OK)
        snprintf(why, sizeof why, "%s", tide_last_error());
    tide_child_destroy(&e->child);
    if (why[0] != '\0') {
        event(p, e->job, "grow_refused", "Slurm refused %d more node%s for job %s: %s", e->nodes,
              e->nodes == 1 ? "" : "s", e->job, why);
        return 0;
    }
    event(p, e->job, "allocation_submitted",
          "Slurm job %s: %d node%s%s%s for job %s, the batch script of Slurm job %s again", e->id,
          e->nodes, e->nodes == 1 ? "" : "s", e->partition[0] ? " in partition " : "",
          e->partition, e->job, e->tmpl);
    e->ph = PH_WAIT;
    e->since_ns = now;
    if (e->cancel) {
        event(p, e->job, "allocation_cancelled", "Slurm job %s cancelled: job %s ended", e->id,
              e->job);
        start_cancel(p, e);
    }
    return 1;
}

/* Advances every entry whose command finished. */
static void step_children(slurm *p, uint64_t now)
{
    for (size_t i = 0; i < p->n;) {
        entry *e = &p->e[i];
        if (e->child == NULL || !tide_child_poll(e->child, now)) {
            i++;
            continue;
        }
        int keep = 1;
        if (e->ph == PH_SHOW)
            keep = after_show(p, e);
        else if (e->ph == PH_SUBMIT)
            keep = after_submit(p, e, now);
        else if (e->ph == PH_CANCEL)
            keep = 0;
        if (keep)
            i++;
        else
            drop(p, i);
    }
}

/* One squeue line's verdict on e (f: ID, STATE, REASON, NODES, START). Returns 0 when e is
 * done with. */
static int judge(slurm *p, entry *e, char *const f[5], uint64_t now)
{
    const char *state = f[1], *reason = f[2], *nodes = f[3];
    if (strcmp(state, "RUNNING") == 0 || strcmp(state, "CONFIGURING") == 0) {
        /* a watched allocation still giving its nodes back, unless it started again between
           two polls (a new start time) */
        if (e->watch && !e->left && e->started[0] == '\0')
            snprintf(e->started, sizeof e->started, "%s", f[4]);
        if (e->watch && !e->left && strcmp(e->started, f[4]) == 0)
            return 1;
        event(p, e->job, "allocation_started",
              "Slurm job %s %s on %s: its pools join job %s as they start", e->id,
              e->watch ? "started again" : "started", nodes, e->job);
        return 0;
    }
    if (strcmp(state, "PENDING") != 0 && strcmp(state, "REQUEUED") != 0) {
        if (e->watch && !e->left && strcmp(state, "COMPLETING") == 0)
            return 1;
        event(p, e->job, "allocation_ended",
              "Slurm job %s is %s%s: it will not come back%s", e->id, state,
              e->watch ? " instead of requeued" : " before it started",
              e->watch ? " (sbatch --requeue, and tide-slurm-pools requeues it)" : "");
        return 0;
    }
    e->left = 1;
    if (!e->watch && tide_slurm_reason_fatal(reason)) {
        event(p, e->job, "grow_refused", "Slurm cannot start job %s as asked: %s (%s); cancelled",
              e->id, reason, reason_text(reason));
        start_cancel(p, e);
        return 1;
    }
    if (!e->watch && p->cfg.pending_ms && now - e->since_ns > p->cfg.pending_ms * 1000000ull) {
        event(p, e->job, "grow_refused",
              "Slurm job %s still pending after %.1f s (%s: %s); cancelled", e->id,
              (double)p->cfg.pending_ms / 1000.0, reason, reason_text(reason));
        start_cancel(p, e);
        return 1;
    }
    /* "None" is Slurm's reason before its scheduler first looks at the job: no reason yet */
    if (strcmp(reason, "None") != 0 && strcmp(reason, e->reason) != 0) {
        snprintf(e->reason, sizeof e->reason, "%s", reason);
        event(p, e->job, "allocation_pending", "Slurm job %s for job %s waits: %s (%s)", e->id,
              e->job, reason, reason_text(reason));
    }
    return 1;
}

/* Finds id's line in squeue's output and splits it into f[0..4] (pointing into line, of
 * size len); 0 when absent. */
static int find_line(const char *out, const char *id, char *line, size_t len, char *f[5])
{
    size_t il = strlen(id);
    for (const char *l = out; l != NULL && *l != '\0';) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        if (n > il && strncmp(l, id, il) == 0 && l[il] == '|') {
            snprintf(line, len, "%.*s", (int)n, l);
            f[0] = line;
            for (int k = 1; k < 5; k++) {
                char *bar = strchr(f[k - 1], '|');
                if (bar != NULL)
                    *bar = '\0';
                f[k] = bar != NULL ? bar + 1 : line + strlen(line); /* "" past the last */
            }
            return 1;
        }
        l = nl ? nl + 1 : NULL;
    }
    return 0;
}

/* The squeue of every waited entry finished: judge each. */
static void after_poll(slurm *p, uint64_t now)
{
    char why[512];
    failure(p->poll, why, sizeof why);
    const char *out = tide_child_output(p->poll, NULL);
    /* squeue of only unknown ids fails with "Invalid job id": they are all gone */
    int gone_all = why[0] != '\0' && strstr(out, "Invalid job id") != NULL;
    if (why[0] != '\0' && !gone_all) {
        TIDE_WARN("slurm", "squeue failed: %s", why);
        tide_child_destroy(&p->poll);
        return;
    }
    for (size_t i = 0; i < p->n;) {
        entry *e = &p->e[i];
        char line[512], *f[5];
        int keep = 1;
        if (e->ph != PH_WAIT || e->child != NULL) {
            i++;
            continue;
        }
        if (!gone_all && find_line(out, e->id, line, sizeof line, f))
            keep = judge(p, e, f, now);
        else {
            event(p, e->job, "allocation_ended", "Slurm job %s is gone (Slurm forgot it)", e->id);
            keep = 0;
        }
        if (keep)
            i++;
        else
            drop(p, i);
    }
    tide_child_destroy(&p->poll);
}

/* Starts the squeue of every waited entry when it is time. */
static void start_poll(slurm *p, uint64_t now)
{
    if (p->poll != NULL || now < p->next_poll_ns)
        return;
    char ids[2048] = "";
    size_t at = 0;
    for (size_t i = 0; i < p->n; i++) {
        const entry *e = &p->e[i];
        if (e->ph != PH_WAIT || e->child != NULL || at + strlen(e->id) + 2 >= sizeof ids)
            continue;
        at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%s", at ? "," : "", e->id);
    }
    if (at == 0)
        return;
    p->next_poll_ns = now + p->cfg.poll_ms * 1000000ull;
    if (run(p, &p->poll, NULL, "squeue", "--noheader", "--states=all", "--format=%i|%T|%r|%N|%S",
            "--jobs", ids, (const char *)NULL) != TIDE_OK)
        TIDE_WARN("slurm", "cannot run squeue: %s", tide_last_error());
}

/* ---- the provider's table ------------------------------------------------------------------ */

static entry *add(slurm *p, const char *job)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        entry *e = tide_realloc(p->e, cap * sizeof *e);
        if (e == NULL)
            return NULL;
        p->e = e;
        p->cap = cap;
    }
    entry *e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->job, sizeof e->job, "%s", job);
    return e;
}

static tide_status slurm_grow(void *self, const char *job, const char *alloc, int nodes, char *why,
                              size_t len)
{
    slurm *p = self;
    if (nodes < 1 || nodes > 4096) {
        snprintf(why, len, "--nodes %d: 1..4096", nodes);
        return TIDE_ERR_INVALID;
    }
    if (!tide_slurm_id_ok(alloc)) {
        snprintf(why, len, "'%s' is no Slurm job id", alloc);
        return TIDE_ERR_INVALID;
    }
    for (size_t i = 0; i < p->n; i++)
        if (!p->e[i].watch && strcmp(p->e[i].job, job) == 0 && p->e[i].ph != PH_CANCEL) {
            snprintf(why, len, "job %s already waits for Slurm job %s (%s): one request at a time",
                     job, p->e[i].id[0] ? p->e[i].id : "being submitted",
                     p->e[i].reason[0] ? p->e[i].reason : "submitted");
            return TIDE_ERR_BUSY;
        }
    entry *e = add(p, job);
    if (e == NULL) {
        snprintf(why, len, "out of memory");
        return TIDE_ERR_NOMEM;
    }
    snprintf(e->tmpl, sizeof e->tmpl, "%s", alloc);
    e->nodes = nodes;
    e->ph = PH_SHOW;
    e->since_ns = tide_now_ns();
    if (run(p, &e->child, NULL, "scontrol", "show", "job", "-o", alloc, (const char *)NULL) !=
        TIDE_OK) {
        snprintf(why, len, "cannot run scontrol: %s", tide_last_error());
        p->n--;
        return TIDE_ERR_UNSUPPORTED;
    }
    snprintf(why, len, "asking Slurm for %d more node%s for job %s (the batch script of Slurm job %s"
                       " again); events say when they start", nodes, nodes == 1 ? "" : "s", job,
             alloc);
    return TIDE_OK;
}

static void slurm_watch(void *self, const char *job, const char *alloc)
{
    slurm *p = self;
    if (!tide_slurm_id_ok(alloc))
        return;
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->e[i].id, alloc) == 0)
            return;
    entry *e = add(p, job);
    if (e == NULL)
        return;
    snprintf(e->id, sizeof e->id, "%s", alloc);
    e->watch = 1;
    e->ph = PH_WAIT;
    e->since_ns = tide_now_ns();
}

static void slurm_job_ended(void *self, const char *job)
{
    slurm *p = self;
    for (size_t i = 0; i < p->n;) {
        entry *e = &p->e[i];
        if (strcmp(e->job, job) != 0 || e->ph == PH_CANCEL) {
            i++;
            continue;
        }
        if (e->watch || e->ph == PH_SHOW) {
            drop(p, i);
            continue;
        }
        if (e->ph == PH_SUBMIT)
            e->cancel = 1; /* cancelled once sbatch says its id */
        else {
            event(p, e->job, "allocation_cancelled", "Slurm job %s cancelled: job %s ended", e->id,
                  e->job);
            start_cancel(p, e);
        }
        i++;
    }
}

static void slurm_describe(void *self, const char *job, char *out, size_t len)
{
    slurm *p = self;
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < p->n && at + 1 < len; i++) {
        const entry *e = &p->e[i];
        if (strcmp(e->job, job) != 0 || e->ph == PH_CANCEL)
            continue;
        const char *what = e->watch ? (e->left ? "requeued" : "leaving")
                                    : (e->ph == PH_WAIT ? "pending" : "submitting");
        int n = snprintf(out + at, len - at, "%sslurm %s %s%s%s%s", at ? "; " : "",
                         e->id[0] ? e->id : "-", what, e->reason[0] ? " (" : "", e->reason,
                         e->reason[0] ? ")" : "");
        if (n < 0)
            break;
        at += (size_t)n;
    }
    if (at >= len)
        out[len - 1] = '\0';
}

static void slurm_tick(void *self, uint64_t now)
{
    slurm *p = self;
    step_children(p, now);
    if (p->poll != NULL && tide_child_poll(p->poll, now))
        after_poll(p, now);
    start_poll(p, now);
}

static void slurm_destroy(void *self)
{
    slurm *p = self;
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n; i++)
        tide_child_destroy(&p->e[i].child);
    tide_child_destroy(&p->poll);
    tide_free(p->e);
    tide_free(p);
}

static const tide_provider_v1 slurm_ops = {
    .name = "slurm",
    .grow = slurm_grow,
    .watch = slurm_watch,
    .job_ended = slurm_job_ended,
    .describe = slurm_describe,
    .tick = slurm_tick,
    .destroy = slurm_destroy,
};

tide_status tide_provider_slurm(tide_provider_t *out, const tide_slurm_config *cfg,
                                tide_provider_event_fn sink, void *ctx)
{
    slurm *p = tide_calloc(1, sizeof *p);
    if (p == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory making the Slurm provider");
    p->cfg = *cfg;
    if (p->cfg.poll_ms == 0)
        p->cfg.poll_ms = 2000;
    if (p->cfg.cmd_ms == 0)
        p->cfg.cmd_ms = 30000;
    p->sink = sink;
    p->ctx = ctx;
    out->ops = &slurm_ops;
    out->self = p;
    return TIDE_OK;
}

/* ---- the "none" provider ------------------------------------------------------------------- */

static tide_status none_grow(void *self, const char *job, const char *alloc, int nodes, char *why,
                             size_t len)
{
    (void)self;
    (void)alloc;
    (void)nodes;
    snprintf(why, len,
             "tided has no provider of nodes (start it with --provider slurm to grow jobs by new "
             "Slurm allocations); to grow job %s, launch its program on the new hosts and resize",
             job);
    return TIDE_ERR_UNSUPPORTED;
}

static void none_watch(void *self, const char *job, const char *alloc)
{
    (void)self;
    (void)job;
    (void)alloc;
}

static void none_job_ended(void *self, const char *job)
{
    (void)self;
    (void)job;
}

static void none_describe(void *self, const char *job, char *out, size_t len)
{
    (void)self;
    (void)job;
    if (len)
        out[0] = '\0';
}

static void none_tick(void *self, uint64_t now)
{
    (void)self;
    (void)now;
}

static void none_destroy(void *self)
{
    (void)self;
}

static const tide_provider_v1 none_ops = {
    .name = "none",
    .grow = none_grow,
    .watch = none_watch,
    .job_ended = none_job_ended,
    .describe = none_describe,
    .tick = none_tick,
    .destroy = none_destroy,
};

void tide_provider_none(tide_provider_t *out)
{
    out->ops = &none_ops;
    out->self = NULL;
}

tide_status tide_provider_parse(const char *text, int *slurm_on)
{
    if (text != NULL && strcmp(text, "none") == 0) {
        *slurm_on = 0;
        return TIDE_OK;
    }
    if (text != NULL && strcmp(text, "slurm") == 0) {
        *slurm_on = 1;
        return TIDE_OK;
    }
    return tide_errorf(TIDE_ERR_INVALID, "--provider '%s': none or slurm", text ? text : "");
}
