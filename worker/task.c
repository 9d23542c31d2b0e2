/*
 * worker/task: runs offline plugin jobs (include/tide/tide_task.h) on a rank's main
 * thread: dlopen the plugin by path or name, init (+ restore from the previous
 * attempt's blob), steps, and at the end save (when preempted) and fini; each outcome
 * is reported to tided as offline_status. Two places run steps:
 *   - an idle rank runs them back to back until the job is done, preempted (tided's
 *     preempt) or a layout switch needs the rank;
 *   - a member of a pipeline-parallel job runs them inside its pipeline bubbles
 *     (tide_bubble_wait), only when the task's estimated step time fits in the time the
 *     wait is expected to leave, or is tiny against the whole wait (then for as long as
 *     the transfer is pending); the job is loaded, preempted and finished at step
 *     boundaries, never inside a step.
 * Workload: one plugin at a time per rank; bubble steps of micro- to milliseconds.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdarg.h>

#include <tide/tide_task.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

static void *open_plugin(const char *name)
{
    char path[1024];
    if (strchr(name, '/') != NULL)
        return dlopen(name, RTLD_NOW | RTLD_LOCAL);
    const char *dir = getenv("TIDE_PLUGIN_DIR");
    if (dir != NULL && dir[0] != '\0') {
        snprintf(path, sizeof path, "%s/lib%s.so", dir, name);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h != NULL)
            return h;
    }
    snprintf(path, sizeof path, "lib%s.so", name);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void blob_path(char *out, size_t len, const char *job)
{
    const char *dir = getenv("TIDE_TASK_DIR");
    snprintf(out, len, "%s/%s.ckpt", dir && dir[0] ? dir : "/tmp", job);
}

static void restore_blob(const tide_task_v1 *ops, void *state, const char *job)
{
    char path[1024];
    blob_path(path, sizeof path, job);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = n > 0 ? tide_malloc((size_t)n) : NULL;
    if (b != NULL && fread(b, 1, (size_t)n, f) == (size_t)n && ops->restore != NULL) {
        tide_status rc = ops->restore(state, b, (size_t)n);
        TIDE_INFO(SUBSYS, "offline job %s: restored %ld bytes from %s (%s)", job, n, path,
                  tide_strerror(rc));
    }
    tide_free(b);
    fclose(f);
}

static void save_blob(const tide_task_v1 *ops, void *state, const char *job)
{
    void *b = NULL;
    size_t n = 0;
    if (ops->save == NULL || ops->save(state, &b, &n) != TIDE_OK || b == NULL)
        return;
    char path[1024], tmp[1100];
    blob_path(path, sizeof path, job);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f != NULL) {
        int ok = fwrite(b, 1, n, f) == n;
        ok = fclose(f) == 0 && ok;
        if (ok && rename(tmp, path) == 0)
            TIDE_INFO(SUBSYS, "offline job %s: saved %zu bytes to %s", job, n, path);
        else
            remove(tmp);
    }
    free(b);
}

/* A loaded plugin job. */
struct tide__task {
    tide_msg_t m; /* the assignment (owns argv) */
    char job[TIDE_PROTO_NAME_MAX + 1];
    void *h;
    const tide_task_v1 *ops;
    void *state;
    double progress;
    uint64_t steps;
    tide_proto_job_state_t end; /* how it ended (reported by tide__task_stop) */
    int end_code;
    char why[TIDE_PROTO_TEXT_MAX + 1]; /* why it failed: the attempt's reported output (a
                                          plugin has no log file of its own) */
    tide_coll_stream_t stream; /* the task's low-priority stream (NULL for host workers) */
};

/* Ends k as failed with code: the reason goes to this process's log and, as the
   attempt's output, to tided (tidectl logs, the attempt's event). */
static void task_fail(tide__task *k, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void task_fail(tide__task *k, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->why, sizeof k->why, fmt, ap);
    va_end(ap);
    TIDE_WARN(SUBSYS, "offline job %s: %s", k->job, k->why);
    k->end = TIDE_JOB_FAILED;
    k->end_code = code;
}

/* Loads the job of assignment m (taken over) and reports it running; NULL when it
   cannot load or init (reported failed). */
static tide__task *task_load(tide_t *t, tide_msg_t *m)
{
    tide__task *k = tide_calloc(1, sizeof *k);
    if (k == NULL) {
        TIDE_WARN(SUBSYS, "offline job %s: out of memory loading it", m->u.offline_assign.job);
        tide__task_report(t, m->u.offline_assign.job, m->u.offline_assign.attempt, TIDE_JOB_FAILED,
                          12, 0, "[tide: out of memory loading the plugin]\n");
        tide_msg_clear(m);
        return NULL;
    }
    k->m = *m;
    tide_msg_init(m, TIDE_MSG_NONE);
    tide_proto_offline_assign_t *a = &k->m.u.offline_assign;
    snprintf(k->job, sizeof k->job, "%s", a->job);
    k->h = open_plugin(a->plugin);
    k->end = TIDE_JOB_FAILED;
    if (k->h == NULL) {
        const char *e = dlerror();
        task_fail(k, 127, "[tide: cannot load plugin %s: %s]\n", a->plugin, e ? e : "not found");
        goto fail;
    }
    tide_task_v1_get_fn get = (tide_task_v1_get_fn)(uintptr_t)dlsym(k->h, "tide_task_v1_get");
    k->ops = get ? get() : NULL;
    if (k->ops == NULL || k->ops->version != TIDE_TASK_ABI_VERSION || k->ops->init == NULL ||
        k->ops->step == NULL) {
        task_fail(k, 126, "[tide: plugin %s does not export a version %d tide_task_v1_get]\n",
                  a->plugin, TIDE_TASK_ABI_VERSION);
        k->ops = NULL;
        goto fail;
    }
    /* the main thread runs the task: its device is bound already (tide_new) */
    if (tide_coll_stream_new_low(t->be, t->device, &k->stream) != TIDE_OK) {
        task_fail(k, 1, "[tide: no stream for plugin %s: %s]\n", a->plugin, tide_last_error());
        k->ops = NULL; /* never initialised: no fini */
        goto fail;
    }
    tide_task_env env = {k->job,     t->device,  t->be->mem_kind == TIDE_MEM_DEVICE,
                         a->mem_cap, a->attempt, k->stream};
    if (k->ops->init(&k->state, (int)a->argc, a->argv, &env) != TIDE_OK) {
        task_fail(k, 1, "[tide: plugin %s: init failed: %s]\n", a->plugin, tide_last_error());
        k->state = NULL;
        k->ops = NULL; /* no fini for a state init did not create */
        goto fail;
    }
    if (a->attempt > 1)
        restore_blob(k->ops, k->state, k->job);
    k->end = TIDE_JOB_RUNNING;
    tide__task_report(t, k->job, a->attempt, TIDE_JOB_RUNNING, 0, 0, "");
    return k;
fail:
    tide__task_stop(t, &k, 0);
    return NULL;
}

/* Runs one step; 1 when the job ended (done or failed: tide__task_stop reports it), 0 to
   go on. */
static int task_step(tide_t *t, tide__task *k)
{
    int done = 0;
    tide_status rc = k->ops->step(k->state, &done, &k->progress);
    k->steps++;
    if (rc != TIDE_OK) {
        task_fail(k, 1, "[tide: step %llu failed: %s: %s]\n", (unsigned long long)k->steps,
                  tide_strerror(rc), tide_last_error());
        return 1;
    }
    if (done) {
        TIDE_INFO(SUBSYS, "offline job %s: done after %llu steps here", k->job,
                  (unsigned long long)k->steps);
        k->end = TIDE_JOB_DONE;
        k->progress = 1.0;
        return 1;
    }
    return 0;
}

void tide__task_stop(tide_t *t, tide__task **k_p, int preempted)
{
    tide__task *k = *k_p;
    if (k == NULL)
        return;
    if (preempted && k->ops != NULL && k->end == TIDE_JOB_RUNNING) {
        save_blob(k->ops, k->state, k->job);
        k->end = TIDE_JOB_PREEMPTED;
        k->end_code = -15;
    }
    if (k->ops != NULL && k->ops->fini != NULL)
        k->ops->fini(k->state);
    if (k->h != NULL)
        dlclose(k->h);
    tide_coll_stream_free(t->be, k->stream);
    /* The slot is freed before tided hears of the end: it may assign the next job at
       once, and a busy slot would refuse it. */
    if (strcmp(t->plugin_job, k->job) == 0) {
        t->plugin_job[0] = '\0';
        t->plugin_grace = -1;
    }
    tide__ctl_plugin_done(t->ctl, k->job);
    if (k->end != TIDE_JOB_RUNNING)
        tide__task_report(t, k->job, k->m.u.offline_assign.attempt, k->end, k->end_code,
                          k->progress, k->end == TIDE_JOB_FAILED ? k->why : "");
    else
        tide__task_report(t, k->job, k->m.u.offline_assign.attempt, TIDE_JOB_FAILED, 1,
                          k->progress, "[tide: stopped without a cause]\n");
    tide_msg_clear(&k->m);
    tide_free(k);
    *k_p = NULL;
}

/* ---- idle ranks ------------------------------------------------------------------------- */

/* The plugin job tided assigned, taken (bubbles_only: only one that may run inside
   pipeline bubbles); 0 when none waits. */
static int take_plugin(tide_t *t, int bubbles_only, tide_msg_t *out)
{
    if (!t->plugin_ready || (bubbles_only && !t->plugin.u.offline_assign.bubbles))
        return 0;
    *out = t->plugin;
    tide_msg_init(&t->plugin, TIDE_MSG_NONE);
    t->plugin_ready = 0;
    return 1;
}

/* Grace (ms) when tided preempted plugin job `job`, else -1. */
static int preempted(const tide_t *t, const char *job)
{
    return strcmp(t->plugin_job, job) == 0 ? t->plugin_grace : -1;
}

void tide__run_plugin(tide_t *t)
{
    tide_msg_t m;
    if (!take_plugin(t, 0, &m))
        return;
    tide__task *k = task_load(t, &m);
    while (k != NULL) {
        tide__drain(t); /* tided's preemption, or a layout that needs this rank */
        int grace = preempted(t, k->job);
        int needed = t->agree.p_gen != 0 && t->agree.p_member;
        if (grace >= 0 || needed) {
            tide__task_stop(t, &k, 1);
            break;
        }
        if (task_step(t, k))
            tide__task_stop(t, &k, 0);
    }
}

/* ---- pipeline bubbles ------------------------------------------------------------------- */

_Static_assert(sizeof(((tide_bubble_stats *)0)->task) > TIDE_PROTO_NAME_MAX,
               "tide_bubble_stats.task holds a job name");

/* A task step goes into a bubble when its estimate is at most FIT of the time the wait
   is expected to leave: estimates and windows both vary a little from step to step, and
   an overrun delays the pipeline. A step of at most SLACK of the whole expected wait
   also runs past that point, for as long as the transfer is pending: waits vary by more
   than their mean's few percent from step to step (on a shared machine, by tens of
   percent), and the part of a long wait beyond its expected length is otherwise lost,
   while such a step delays the transfer's completion by at most SLACK of the wait. */
#define FIT   0.7
#define SLACK 0.02

/* Task steps run in batches between two tests of the transfer, each batch at most
   BATCH_MS long and SLACK of the expected wait (and at most BATCH_MAX steps): a test
   costs about a microsecond, as much as one step of a small task, and the transfer's
   completion is seen (and, where this rank must act on it, progressed) only at a test,
   so a batch also bounds the delay a filled wait adds (ms). */
#define BATCH_MS  0.05
#define BATCH_MAX 4096

void tide__bubble_boundary(tide_t *t)
{
    int grace = t->btask ? preempted(t, t->btask->job) : -1;
    tide_msg_t m;
    int got = !t->btask && t->view.member && take_plugin(t, 1, &m);
    if (t->btask != NULL && (grace >= 0 || !t->view.member || t->finished)) {
        TIDE_INFO(SUBSYS, "offline job %s leaves rank %d's bubbles (%s) after %llu steps",
                  t->btask->job, t->rank, grace >= 0 ? "preempted" : "rank left the layout",
                  (unsigned long long)t->btask->steps);
        tide__task_stop(t, &t->btask, 1);
    }
    if (got) {
        t->btask = task_load(t, &m);
        if (t->btask != NULL)
            TIDE_INFO(SUBSYS, "rank %d fills its pipeline bubbles with offline job %s", t->rank,
                      t->btask->job);
    }
    t->bubble_k = 0;
}

/* The expected length of this step's k-th wait (ms), 0 when not known yet. Estimates
   belong to one generation: a new layout has a new schedule. */
static double expected_ms(tide_t *t, size_t k)
{
    if (t->win_gen != t->view.generation) {
        memset(t->win_ms, 0, sizeof t->win_ms);
        t->win_gen = t->view.generation;
    }
    return k < TIDE__BUBBLE_SLOTS ? t->win_ms[k] : 0.0;
}

static void learn(tide_t *t, size_t k, double ms)
{
    if (k >= TIDE__BUBBLE_SLOTS)
        return;
    double *w = &t->win_ms[k];
    *w = *w == 0.0 ? ms : 0.75 * *w + 0.25 * ms;
    if (*w <= 0.0)
        *w = 1e-6; /* known, and empty */
}

uint64_t tide__bubble_batch(double expect_ms, double elapsed_ms, double est_ms)
{
    if (!(expect_ms > 0.0) || !(est_ms >= 0.0) || isinf(est_ms))
        return 0; /* wait not learned yet, or no usable estimate */
    double left = expect_ms - elapsed_ms;
    if (!(est_ms <= FIT * left || est_ms <= SLACK * expect_ms))
        return 0;
    double batch = SLACK * expect_ms < BATCH_MS ? SLACK * expect_ms : BATCH_MS;
    if (est_ms <= 0.0 || batch <= est_ms)
        return 1; /* a step longer than a batch (or of unknown length) runs alone */
    double n = batch / est_ms;
    return n >= (double)BATCH_MAX ? BATCH_MAX : (uint64_t)n;
}

tide_status tide_bubble_wait(tide_t *t, tide_coll_comm_t *comm, tide_coll_req_t *req)
{
    if (t == NULL || comm == NULL || req == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_bubble_wait: t, comm and req are required");
    uint64_t t0 = tide_now_ns(), filled = 0, before_last = 0;
    size_t k = t->bubble_k++;
    double expect = expected_ms(t, k);
    int ready = 0, ran_last = 0;
    tide_status rc = TIDE_OK;
    while (t->btask != NULL && expect > 0) {
        rc = tide_coll_req_test(comm, req, &ready);
        if (rc != TIDE_OK || ready)
            break;
        uint64_t now = tide_now_ns();
        double est = t->btask->ops->estimated_step_ms
                         ? t->btask->ops->estimated_step_ms(t->btask->state)
                         : INFINITY;
        uint64_t n = tide__bubble_batch(expect, (double)(now - t0) / 1e6, est);
        if (n == 0)
            break;
        before_last = now;
        int ended = 0;
        for (uint64_t i = 0; i < n && !ended; i++) {
            ended = task_step(t, t->btask);
            t->bstats.task_steps++;
        }
        filled += tide_now_ns() - now;
        ran_last = 1;
        if (ended) {
            tide__task_stop(t, &t->btask, 0);
            break;
        }
    }
    if (rc == TIDE_OK && !ready)
        rc = tide_coll_req_wait(comm, req);
    uint64_t end = tide_now_ns();
    /* When the transfer finished during a task step, the window ended somewhere inside
       that step: learn the lower bound (the time before the step), so an overrun never
       inflates the estimate that decides the next fills. */
    uint64_t window = ran_last && ready ? before_last - t0 : end - t0;
    learn(t, k, (double)window / 1e6);
    t->bstats.windows++;
    t->bstats.bubble_ms += (double)(end - t0) / 1e6;
    t->bstats.filled_ms += (double)filled / 1e6;
    __atomic_add_fetch(&t->progress.bubble_ns, end - t0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->progress.filled_ns, filled, __ATOMIC_RELAXED);
    return rc;
}

void tide_bubble_stats_get(const tide_t *t, tide_bubble_stats *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof *out);
    if (t == NULL)
        return;
    *out = t->bstats;
    if (t->btask != NULL)
        snprintf(out->task, sizeof out->task, "%s", t->btask->job);
}
