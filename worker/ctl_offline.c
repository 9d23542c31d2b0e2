/*
 * worker/ctl_offline: offline jobs on the control thread. A command job runs as a child
 * process (offline.c: its keeper, process group, cgroup, capped output) that this thread
 * starts, polls, preempts (SIGTERM, grace, SIGKILL) and reports; a plugin job is handed
 * to the training thread as an intent (task.c runs it) and this thread only remembers
 * that its slot is taken until the training thread says the job ended.
 *
 * Workload: one job at a time per worker; a poll every 20 ms while a command runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/ctl_int.h"

void tide__ctl_offline_status(tide__ctl_t *ctl, const char *job, uint32_t attempt,
                              tide_proto_job_state_t st, int exit_code, const char *log,
                              const char *tail)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_STATUS);
    pthread_mutex_lock(&ctl->mu);
    m.u.offline_status.worker = ctl->worker_id;
    pthread_mutex_unlock(&ctl->mu);
    snprintf(m.u.offline_status.job, sizeof m.u.offline_status.job, "%s", job);
    m.u.offline_status.attempt = attempt > 0 ? attempt : 1;
    m.u.offline_status.state = st;
    if (exit_code > 255)
        exit_code = 255;
    if (exit_code < -255)
        exit_code = -255;
    m.u.offline_status.exit_code = exit_code;
    m.u.offline_status.progress = st == TIDE_JOB_DONE ? 1.0 : 0.0;
    snprintf(m.u.offline_status.log, sizeof m.u.offline_status.log, "%s", log ? log : "");
    snprintf(m.u.offline_status.tail, sizeof m.u.offline_status.tail, "%s", tail ? tail : "");
    tide__ctl_send_now(ctl, &m);
}

/* The last bytes of an attempt's output file (NULs shown as '?'), into out (len bytes). */
static void read_tail(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t want = len - 1;
    off_t from = sb.st_size > (off_t)want ? sb.st_size - (off_t)want : 0;
    ssize_t n = pread(fd, out, want, from);
    close(fd);
    if (n < 0)
        n = 0;
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\0')
            out[i] = '?';
    out[n] = '\0';
}

/* Makes the attempts' log directory (mode 0700). The default one under /tmp must be a
   directory of this user's, not a link someone left there. */
static tide_status log_dir_ready(const char *dir, int is_default)
{
    char path[512];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return tide_errorf(TIDE_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return tide_errorf(TIDE_ERR_IO, "cannot create the offline log directory %s: %s", path,
                           strerror(errno));
    struct stat sb;
    if ((is_default ? lstat(path, &sb) : stat(path, &sb)) != 0 || !S_ISDIR(sb.st_mode))
        return tide_errorf(TIDE_ERR_IO, "the offline log directory %s is not a directory", path);
    if (is_default && sb.st_uid != getuid())
        return tide_errorf(TIDE_ERR_DENIED,
                           "the offline log directory %s belongs to another user: set "
                           "TIDE_LOG_DIR",
                           path);
    return TIDE_OK;
}

void tide__ctl_on_assign(tide__ctl_t *ctl, tide_msg_t *m)
{
    tide_proto_offline_assign_t *a = &m->u.offline_assign;
    if (a->kind == TIDE_JOB_PLUGIN) {
        /* the training thread runs it; one at a time */
        pthread_mutex_lock(&ctl->mu);
        int busy = ctl->plugin_job[0] != '\0';
        if (!busy)
            snprintf(ctl->plugin_job, sizeof ctl->plugin_job, "%s", a->job);
        pthread_mutex_unlock(&ctl->mu);
        if (busy)
            tide__ctl_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        else
            tide__mailbox_push(ctl->intents, m);
        return;
    }
    pthread_mutex_lock(&ctl->mu);
    int leave = ctl->leave;
    pthread_mutex_unlock(&ctl->mu);
    if (leave) {
        /* not the job's failure: it never started, and goes elsewhere */
        TIDE_INFO(SUBSYS, "offline job %s assigned while this worker leaves: not started", a->job);
        tide__ctl_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        return;
    }
    if (ctl->child.pid > 0) {
        TIDE_WARN(SUBSYS, "offline job %s assigned while %s runs: refused", a->job, ctl->child.job);
        tide__ctl_offline_status(ctl, a->job, a->attempt, TIDE_JOB_PREEMPTED, -15, "", "");
        return;
    }
    char dev[48], name[TIDE_PROTO_NAME_MAX + 32], cap[64], cuda[160], vis[128], att[48];
    char log[1024], logenv[1100];
    /* TIDE_OFFLINE_DEVICE is the index the child passes to its own device calls: on a GPU
       worker, CUDA_VISIBLE_DEVICES (below) shows the child this worker's GPU only, as its
       device 0, so it is 0 there; on a CPU worker, the worker's index on its host */
    int gpu = ctl->reg.kind == TIDE_DEVICE_GPU;
    snprintf(dev, sizeof dev, "TIDE_OFFLINE_DEVICE=%d", gpu ? 0 : ctl->reg.device);
    snprintf(name, sizeof name, "TIDE_OFFLINE_JOB=%s", a->job);
    snprintf(cap, sizeof cap, "TIDE_OFFLINE_MEM_CAP=%llu", (unsigned long long)a->mem_cap);
    snprintf(att, sizeof att, "TIDE_OFFLINE_ATTEMPT=%u", a->attempt);
    /* one file per job, attempt and worker process: attempts on one host never share it */
    if (tide_proto_attempt_log_path(log, sizeof log, ctl->log_dir, a->job, a->attempt,
                                    (int)getpid()) != TIDE_OK)
        log[0] = '\0'; /* cannot be: log_dir is at most 511 bytes; then no file, said below */
    snprintf(logenv, sizeof logenv, "TIDE_OFFLINE_LOG=%s", log);
    char *env[6] = {dev, name, cap, att, logenv, cuda};
    size_t n_env = 5;
    tide_status rc = TIDE_OK;
    if (gpu) {
        /* the child sees this worker's GPU only, as its device 0 */
        rc = tide__cuda_visible(getenv("CUDA_VISIBLE_DEVICES"), ctl->reg.device, vis, sizeof vis);
        snprintf(cuda, sizeof cuda, "CUDA_VISIBLE_DEVICES=%s", vis);
        n_env = 6;
    }
    if (!ctl->contain_known) {
        /* decided once per worker, and said once: what keeps an attempt together */
        char why[512] = "";
        ctl->contain_known = 1;
        if (tide__offline_cgroup_parent(ctl->cg_parent, sizeof ctl->cg_parent, why, sizeof why))
            TIDE_INFO(SUBSYS,
                      "offline commands are contained by a cgroup v2 per attempt under %s "
                      "(killed with cgroup.kill), their keeper as subreaper, and "
                      "PR_SET_PDEATHSIG",
                      ctl->cg_parent);
        else
            TIDE_INFO(SUBSYS,
                      "offline commands are contained by their keeper as subreaper of the "
                      "attempt, a process group and PR_SET_PDEATHSIG; no cgroup (%s)",
                      why);
    }
    if (rc == TIDE_OK)
        rc = log_dir_ready(ctl->log_dir, getenv("TIDE_LOG_DIR") == NULL);
    char cg[1300] = "";
    if (ctl->cg_parent[0] != '\0')
        snprintf(cg, sizeof cg, "%s/tide-%d-%s-%u", ctl->cg_parent, (int)getpid(), a->job,
                 a->attempt);
    if (rc == TIDE_OK) {
        tide__child_cfg cc = {a->job,       a->argv,     a->argc,           env,
                              n_env,        log,         ctl->log_cap,      a->grace_ms,
                              cg[0] ? cg : NULL, a->max_memory, a->max_procs};
        rc = tide__child_spawn(&ctl->child, &cc);
    }
    if (rc != TIDE_OK) {
        TIDE_WARN(SUBSYS, "%s", tide_last_error());
        tide__ctl_offline_status(ctl, a->job, a->attempt, TIDE_JOB_FAILED, 127, "",
                                 tide_last_error());
        return;
    }
    ctl->child_attempt = a->attempt;
    pthread_mutex_lock(&ctl->mu);
    ctl->child_pid = ctl->child.pid;
    ctl->child_grace = ctl->child.grace_ms;
    snprintf(ctl->child_job, sizeof ctl->child_job, "%s", a->job);
    pthread_mutex_unlock(&ctl->mu);
    tide__ctl_offline_status(ctl, a->job, a->attempt, TIDE_JOB_RUNNING, 0, log, "");
}

void tide__ctl_on_preempt(tide__ctl_t *ctl, tide_msg_t *m)
{
    const tide_proto_preempt_t *p = &m->u.preempt;
    if (ctl->child.pid > 0 && strcmp(ctl->child.job, p->job) == 0) {
        tide__child_preempt(&ctl->child, p->grace_ms, tide_now_ns());
        return;
    }
    /* a plugin job: the training thread stops it (saving its blob) or, when it never took
       it, reports it preempted (tided waits for that report to reuse the worker) */
    pthread_mutex_lock(&ctl->mu);
    int plugin = ctl->plugin_job[0] != '\0' && strcmp(ctl->plugin_job, p->job) == 0;
    pthread_mutex_unlock(&ctl->mu);
    if (plugin)
        tide__mailbox_push(ctl->intents, m);
}

void tide__ctl_child_tick(tide__ctl_t *ctl)
{
    int code = 0;
    if (!tide__child_poll(&ctl->child, tide_now_ns(), &code))
        return;
    tide_proto_job_state_t st = ctl->child.preempted ? TIDE_JOB_PREEMPTED
                                : code == 0          ? TIDE_JOB_DONE
                                                     : TIDE_JOB_FAILED;
    TIDE_INFO(SUBSYS, "offline job %s ended: %s, exit code %d", ctl->child.job,
              tide_proto_job_state_name(st), code);
    /* The slot is free before tided hears of the end (it may assign the next job). */
    pthread_mutex_lock(&ctl->mu);
    ctl->child_pid = 0;
    ctl->child_job[0] = '\0';
    pthread_cond_broadcast(&ctl->cv); /* destroy may wait for it */
    pthread_mutex_unlock(&ctl->mu);
    char tail[TIDE_PROTO_TAIL_MAX + 1];
    read_tail(ctl->child.log, tail, sizeof tail);
    tide__ctl_offline_status(ctl, ctl->child.job, ctl->child_attempt, st, code, ctl->child.log,
                             tail);
    uint64_t gen = ctl->deferred_ack_gen;
    int still = gen != 0 && ctl->pend.gen == gen;
    ctl->deferred_ack_gen = 0;
    if (still)
        tide__ctl_send_ack(ctl, gen, ctl->pend.ack);
}

void tide__ctl_child_stop(tide__ctl_t *ctl)
{
    /* the work cannot outlive the worker */
    int code = tide__child_stop(&ctl->child, ctl->child.grace_ms);
    char tail[TIDE_PROTO_TAIL_MAX + 1];
    read_tail(ctl->child.log, tail, sizeof tail);
    tide__ctl_offline_status(ctl, ctl->child.job, ctl->child_attempt, TIDE_JOB_PREEMPTED, code,
                             ctl->child.log, tail);
}
