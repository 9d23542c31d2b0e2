/*
 * worker/offline_limits: an offline attempt's memory and process limits (offline_limits.h).
 * A cgroup is preferred because it binds the attempt as a whole (every process, whatever
 * user it runs as) and the kernel counts what it refused; rlimits are the fallback where
 * the worker may not make one with those controllers (this machine's cgroup v2 mount has
 * neither): RLIMIT_AS bounds each process's address space, RLIMIT_NPROC the processes of
 * the command's real user, and neither binds root's processes for NPROC.
 */
#include "worker/offline_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((uint64_t)1024 * 1024)

/* Writes text into dir/name when the file exists; 0 on success (O_TRUNC as a shell's
   "echo > memory.max": the cgroup file system ignores it, a plain file stays exact). */
static int put(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

void tide__limits_cgroup(tide__limits *l, const char *dir)
{
    char v[32];
    if (dir == NULL)
        return;
    if (l->memory != 0) {
        snprintf(v, sizeof v, "%" PRIu64, l->memory);
        l->cg_memory = put(dir, "memory.max", v) == 0;
        if (l->cg_memory)
            put(dir, "memory.swap.max", "0"); /* else the limit only moves pages to swap */
    }
    if (l->procs != 0) {
        snprintf(v, sizeof v, "%" PRIu64, l->procs);
        l->cg_pids = put(dir, "pids.max", v) == 0;
    }
}

/* Sets soft and hard limit res to v, or to the hard limit when that is lower (only root may
   raise it: the lower one binds anyway). */
static int set_one(int res, uint64_t v)
{
    struct rlimit r;
    if (getrlimit(res, &r) != 0)
        return -1;
    rlim_t want = (rlim_t)v;
    if (r.rlim_max != RLIM_INFINITY && r.rlim_max < want)
        want = r.rlim_max;
    r.rlim_cur = r.rlim_max = want;
    return setrlimit(res, &r);
}

int tide__limits_rlimits(const tide__limits *l, char *why, size_t len)
{
    if (l->memory != 0 && !l->cg_memory && set_one(RLIMIT_AS, l->memory) != 0) {
        snprintf(why, len, "setrlimit(RLIMIT_AS): %s", strerror(errno));
        return -1;
    }
    if (l->procs != 0 && !l->cg_pids && set_one(RLIMIT_NPROC, l->procs) != 0) {
        snprintf(why, len, "setrlimit(RLIMIT_NPROC): %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* "256 MiB" when whole MiB, else "N bytes". */
static void bytes_text(uint64_t b, char *out, size_t len)
{
    if (b % MIB == 0)
        snprintf(out, len, "%" PRIu64 " MiB", b / MIB);
    else
        snprintf(out, len, "%" PRIu64 " bytes", b);
}

void tide__limits_describe(const tide__limits *l, int root, char *out, size_t len)
{
    char mem[160] = "", procs[256] = "", b[48];
    if (l->memory != 0) {
        bytes_text(l->memory, b, sizeof b);
        snprintf(mem, sizeof mem, "memory %s (%s)", b,
                 l->cg_memory ? "cgroup memory.max"
                              : "RLIMIT_AS: per process address space, which a CUDA program "
                                "reserves far beyond what it uses");
    }
    if (l->procs != 0)
        snprintf(procs, sizeof procs, "%sprocesses %" PRIu64 " (%s)", mem[0] ? ", " : "", l->procs,
                 l->cg_pids ? "cgroup pids.max"
                 : root     ? "RLIMIT_NPROC: counted per user; NOT enforced while the command "
                              "runs as root, binds once it runs as another user"
                            : "RLIMIT_NPROC: counts every process of the command's user");
    snprintf(out, len, "%s%s", mem, procs);
}

/* The value of key in a cgroup "key value" file (memory.events, pids.events); 0 if none. */
static uint64_t event_count(const char *dir, const char *file, const char *key)
{
    char path[4096], k[64];
    unsigned long long v = 0, found = 0;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "re");
    while (f != NULL && fscanf(f, "%63s %llu", k, &v) == 2)
        if (strcmp(k, key) == 0)
            found = v;
    if (f != NULL)
        fclose(f);
    return found;
}

/* "exit 1" or "SIGKILL" style text of a wait status. */
static void status_text(int status, char *out, size_t len)
{
    if (WIFSIGNALED(status))
        snprintf(out, len, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(out, len, "exit %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int tide__limits_verdict(const tide__limits *l, const char *dir, int status, char *out, size_t len)
{
    char b[48], how[96];
    uint64_t oom = dir != NULL && l->cg_memory ? event_count(dir, "memory.events", "oom_kill") : 0;
    uint64_t forks = dir != NULL && l->cg_pids ? event_count(dir, "pids.events", "max") : 0;
    bytes_text(l->memory, b, sizeof b);
    if (oom > 0) {
        snprintf(out, len,
                 "killed: memory limit %s (cgroup memory.max: %" PRIu64
                 " OOM kill(s) in the attempt)",
                 b, oom);
        return 1;
    }
    if (forks > 0) {
        snprintf(out, len,
                 "process limit %" PRIu64 " reached (cgroup pids.max: %" PRIu64 " fork(s) refused)",
                 l->procs, forks);
        return 1;
    }
    int failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int rl_mem = l->memory != 0 && !l->cg_memory, rl_procs = l->procs != 0 && !l->cg_pids;
    if (!failed || (!rl_mem && !rl_procs))
        return 0;
    status_text(status, how, sizeof how);
    char mem[160] = "", procs[160] = "";
    if (rl_mem)
        snprintf(mem, sizeof mem, "memory limit %s (RLIMIT_AS: an allocation beyond it fails)", b);
    if (rl_procs)
        snprintf(procs, sizeof procs,
                 "%sprocess limit %" PRIu64 " (RLIMIT_NPROC: a fork beyond it fails)",
                 rl_mem ? "; " : "", l->procs);
    snprintf(out, len,
             "the command failed (%s) under %s%s; its own last words above say "
             "whether a limit refused it",
             how, mem, procs);
    return 1;
}
