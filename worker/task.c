/*
 * worker/task: runs offline plugin jobs (include/tide/tide_task.h) on an idle rank's
 * main thread: dlopen the plugin by path or name, init (+ restore from the previous
 * attempt's blob), step until done, preemption (tided's preempt) or a layout switch
 * that needs this rank (then save the blob for the next attempt), fini; each outcome
 * is reported to tided as offline_status. Workload: one plugin at a time per rank.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tide/tide_task.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

static void report(tide_t *t, const char *job, tide_proto_job_state_t st, int code, double prog)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS);
    m.u.offline_status.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "%s", job);
    m.u.offline_status.state = st;
    m.u.offline_status.exit_code = code < -255 ? -255 : code > 255 ? 255 : code;
    m.u.offline_status.progress = prog < 0 ? 0 : prog > 1 ? 1 : prog;
    if (tide__ctl_send(t->ctl, &m) != TIDE_OK)
        TIDE_WARN(SUBSYS, "could not report offline job %s: %s", job, tide_last_error());
}

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

void tide__run_plugin(tide_t *t)
{
    tide_msg_t m;
    tide__ctl_lock(t->ctl);
    int got = tide__ctl_take_plugin(t->ctl, &m);
    tide__ctl_unlock(t->ctl);
    if (!got)
        return;
    tide_proto_offline_assign_t *a = &m.u.offline_assign;
    char job[TIDE_PROTO_NAME_MAX + 1];
    snprintf(job, sizeof job, "%s", a->job);
    void *h = open_plugin(a->plugin);
    const tide_task_v1 *ops = NULL;
    void *state = NULL;
    if (h == NULL) {
        TIDE_WARN(SUBSYS, "offline job %s: cannot load plugin %s: %s", job, a->plugin, dlerror());
        report(t, job, TIDE_JOB_FAILED, 127, 0);
        goto out;
    }
    tide_task_v1_get_fn get = (tide_task_v1_get_fn)(uintptr_t)dlsym(h, "tide_task_v1_get");
    ops = get ? get() : NULL;
    if (ops == NULL || ops->version != TIDE_TASK_ABI_VERSION || ops->init == NULL ||
        ops->step == NULL) {
        TIDE_WARN(SUBSYS, "offline job %s: %s does not export a version %d tide_task_v1_get", job,
                  a->plugin, TIDE_TASK_ABI_VERSION);
        ops = NULL;
        report(t, job, TIDE_JOB_FAILED, 126, 0);
        goto out;
    }
    tide_task_env env = {job, t->opts.device, t->be->mem_kind == TIDE_MEM_DEVICE, a->mem_cap,
                         a->attempt};
    if (ops->init(&state, (int)a->argc, a->argv, &env) != TIDE_OK) {
        TIDE_WARN(SUBSYS, "offline job %s: init failed: %s", job, tide_last_error());
        report(t, job, TIDE_JOB_FAILED, 1, 0);
        state = NULL;
        goto out;
    }
    if (a->attempt > 1)
        restore_blob(ops, state, job);
    report(t, job, TIDE_JOB_RUNNING, 0, 0);
    double progress = 0;
    for (;;) {
        tide__ctl_lock(t->ctl);
        int grace = tide__ctl_plugin_preempted(t->ctl, job);
        tide__agree *ag = tide__ctl_agree(t->ctl);
        int needed = ag->p_gen != 0 && ag->p_member;
        tide__ctl_unlock(t->ctl);
        if (grace >= 0 || needed) {
            save_blob(ops, state, job);
            report(t, job, TIDE_JOB_PREEMPTED, -15, progress);
            break;
        }
        int done = 0;
        tide_status rc = ops->step(state, &done, &progress);
        if (rc != TIDE_OK) {
            TIDE_WARN(SUBSYS, "offline job %s: step failed: %s", job, tide_strerror(rc));
            report(t, job, TIDE_JOB_FAILED, 1, progress);
            break;
        }
        if (done) {
            report(t, job, TIDE_JOB_DONE, 0, 1.0);
            break;
        }
    }
out:
    if (ops != NULL && ops->fini != NULL)
        ops->fini(state);
    if (h != NULL)
        dlclose(h);
    tide__ctl_lock(t->ctl);
    tide__ctl_plugin_preempted(t->ctl, NULL);
    tide__ctl_unlock(t->ctl);
    tide_msg_clear(&m);
}
