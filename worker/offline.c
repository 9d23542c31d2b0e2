/*
 * worker/offline: runs an offline command job as a child process of an idle worker.
 * The child gets its own process group (so SIGTERM/SIGKILL reach whatever it spawns),
 * the worker's environment plus TIDE_OFFLINE_* variables, and is preempted with
 * SIGTERM, a grace period, then SIGKILL. Spawned with posix_spawn (safe in a
 * multithreaded MPI process, unlike fork). Workload: one child at a time per worker,
 * polled every few tens of ms by the background thread.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/worker_int.h"

extern char **environ;

tide_status tide__cuda_visible(const char *parent, int device, char *out, size_t len)
{
    if (device < 0)
        return tide_errorf(TIDE_ERR_INVALID, "device index %d", device);
    if (parent == NULL || parent[0] == '\0') {
        snprintf(out, len, "%d", device);
        return TIDE_OK;
    }
    const char *p = parent;
    for (int i = 0; i < device && p != NULL; i++)
        if ((p = strchr(p, ',')) != NULL)
            p++;
    size_t n = p != NULL ? strcspn(p, ",") : 0;
    if (n == 0)
        return tide_errorf(TIDE_ERR_RANGE,
                           "device %d is not among CUDA_VISIBLE_DEVICES=%s of this worker", device,
                           parent);
    snprintf(out, len, "%.*s", (int)n, p);
    return TIDE_OK;
}

tide_status tide__child_spawn(tide__child *c, const char *job, char *const *argv, uint32_t argc,
                              char *const *env, size_t n_env)
{
    memset(c, 0, sizeof *c);
    if (argc == 0 || argv == NULL || argv[0] == NULL || argv[0][0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "offline job %s has an empty command line", job);
    size_t n_environ = 0;
    while (environ != NULL && environ[n_environ] != NULL)
        n_environ++;
    char **av = tide_calloc((size_t)argc + 1, sizeof *av);
    char **ev = tide_calloc(n_environ + n_env + 1, sizeof *ev);
    tide_status rc = TIDE_OK;
    posix_spawnattr_t attr;
    int attr_ok = 0;
    if (av == NULL || ev == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory starting offline job %s", job);
        goto out;
    }
    for (uint32_t i = 0; i < argc; i++)
        av[i] = argv[i];
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        ev[k++] = env[i];
    for (size_t i = 0; i < n_environ; i++) {
        /* extra entries win over the inherited ones of the same name */
        const char *eq = strchr(environ[i], '=');
        size_t name_len = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int shadowed = 0;
        for (size_t e = 0; e < n_env && !shadowed; e++)
            shadowed = strncmp(env[e], environ[i], name_len) == 0 && env[e][name_len] == '=';
        if (!shadowed)
            ev[k++] = environ[i];
    }
    if (posix_spawnattr_init(&attr) != 0) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "posix_spawnattr_init failed");
        goto out;
    }
    attr_ok = 1;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);   /* the worker's threads may block some */
    posix_spawnattr_setsigdefault(&attr, &all); /* ignored signals (SIGPIPE) back to default */
    posix_spawnattr_setpgroup(&attr, 0);        /* its own group: preemption reaches children */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    int err = posix_spawnp(&pid, av[0], NULL, &attr, av, ev);
    if (err != 0) {
        rc = tide_errorf(err == ENOENT ? TIDE_ERR_NOT_FOUND : TIDE_ERR_IO,
                         "cannot start offline job %s: %s: %s", job, av[0], strerror(err));
        goto out;
    }
    c->pid = pid;
    snprintf(c->job, sizeof c->job, "%s", job);
    TIDE_INFO("worker", "offline job %s started as pid %d (%s)", job, (int)pid, av[0]);
out:
    if (attr_ok)
        posix_spawnattr_destroy(&attr);
    tide_free(av);
    tide_free(ev);
    return rc;
}

void tide__child_preempt(tide__child *c, int grace_ms, uint64_t now_ns)
{
    if (c->pid <= 0 || c->preempted)
        return;
    c->preempted = 1;
    if (grace_ms < 0)
        grace_ms = 0;
    kill(-c->pid, SIGTERM);
    c->kill_at_ns = now_ns + (uint64_t)grace_ms * 1000000ull;
    if (c->kill_at_ns == 0)
        c->kill_at_ns = 1;
    TIDE_INFO("worker", "offline job %s (pid %d): SIGTERM, SIGKILL in %d ms", c->job, (int)c->pid,
              grace_ms);
}

static int decode_status(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return -WTERMSIG(st);
    return -255;
}

int tide__child_poll(tide__child *c, uint64_t now_ns, int *exit_code)
{
    if (c->pid <= 0)
        return 0;
    int st = 0;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) {
        *exit_code = decode_status(st);
        /* whatever it left behind in its group goes too */
        kill(-c->pid, SIGKILL);
        c->pid = 0;
        return 1;
    }
    if (r < 0 && errno == ECHILD) {
        *exit_code = -255; /* reaped elsewhere: unknown */
        c->pid = 0;
        return 1;
    }
    if (c->kill_at_ns != 0 && now_ns >= c->kill_at_ns && !c->killed) {
        c->killed = 1;
        kill(-c->pid, SIGKILL);
        TIDE_INFO("worker", "offline job %s (pid %d): grace period over, SIGKILL", c->job,
                  (int)c->pid);
    }
    return 0;
}

void tide__child_kill(tide__child *c)
{
    if (c->pid <= 0)
        return;
    kill(-c->pid, SIGKILL);
    int st;
    while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
    }
    c->pid = 0;
}
