/*
 * worker/offline: runs an offline command job on an idle worker. The worker starts the
 * attempt's keeper, tide-offline-run (worker/offline_run.c), with posix_spawn (safe in a
 * multithreaded MPI process, unlike fork); the keeper runs the command in a cgroup v2
 * of its own when this process may create one (else as the subreaper of the attempt),
 * writes its output to a capped file, and passes SIGTERM, then SIGKILL after the grace,
 * to every process of the attempt. The command gets the worker's environment without
 * the MPI runtime's variables, plus TIDE_OFFLINE_* and its device. Workload: one
 * attempt at a time per worker, polled every few tens of ms by the background thread.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* ---- settings and containment, decided once per process ------------------------------- */

/* Variables by which an MPI runtime tells a process who it is (Open MPI, PMIx, PMI, MPICH's
   Hydra, Open MPI's older ORTE and newer PRRTE): a command that inherited them would take
   itself for this worker's rank. */
static const char *const mpi_prefixes[] = {"OMPI_", "PMIX_", "PMI_",   "OPAL_",
                                           "ORTE_", "PRTE_", "HYDRA_", "MPIR_"};
static const char *const mpi_names[] = {"MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_FD",
                                        "PMI_PORT",        "PMI_RANK",        "PMI_SIZE"};

int tide__offline_env_keep(const char *entry)
{
    for (size_t i = 0; i < sizeof mpi_prefixes / sizeof *mpi_prefixes; i++)
        if (strncmp(entry, mpi_prefixes[i], strlen(mpi_prefixes[i])) == 0)
            return 0;
    size_t name_len = strcspn(entry, "=");
    for (size_t i = 0; i < sizeof mpi_names / sizeof *mpi_names; i++)
        if (strlen(mpi_names[i]) == name_len && strncmp(entry, mpi_names[i], name_len) == 0)
            return 0;
    return 1;
}

static int is_file(const char *path, int exec)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (!exec || access(path, X_OK) == 0);
}

tide_status tide__offline_shim(char *out, size_t len)
{
    const char *env = getenv("TIDE_OFFLINE_SHIM");
    if (env != NULL && env[0] != '\0') {
        if (!is_file(env, 1))
            return tide_errorf(TIDE_ERR_NOT_FOUND, "TIDE_OFFLINE_SHIM=%s is not an executable file",
                               env);
        snprintf(out, len, "%s", env);
        return TIDE_OK;
    }
    /* Where this code lies: libtide.so (installed: the keeper is in lib/tide/; build
       tree: next to it), or a program linked with the static library (the build tree's
       worker/ beside the program's folder). */
    char dirs[2][PATH_MAX];
    size_t n_dirs = 0;
    Dl_info info;
    if (dladdr((void *)tide__offline_shim, &info) != 0 && info.dli_fname != NULL &&
        strchr(info.dli_fname, '/') != NULL && realpath(info.dli_fname, dirs[n_dirs]) != NULL)
        n_dirs++;
    ssize_t n_exe = readlink("/proc/self/exe", dirs[n_dirs], sizeof dirs[n_dirs] - 1);
    if (n_exe > 0) {
        dirs[n_dirs][n_exe] = '\0';
        n_dirs++;
    }
    char tried[2048] = "";
    for (size_t d = 0; d < n_dirs; d++) {
        char *slash = strrchr(dirs[d], '/');
        if (slash == NULL)
            continue;
        *slash = '\0';
        const char *rel[] = {"tide/" TIDE__SHIM_NAME, TIDE__SHIM_NAME,
                             "../worker/" TIDE__SHIM_NAME};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            snprintf(out, len, "%s/%s", dirs[d], rel[i]);
            if (is_file(out, 1))
                return TIDE_OK;
            size_t n = strlen(tried);
            if (n + 2 < sizeof tried)
                snprintf(tried + n, sizeof tried - n, "%s%s", n ? ", " : "", out);
        }
    }
    return tide_errorf(TIDE_ERR_NOT_FOUND,
                       "cannot find " TIDE__SHIM_NAME " (tried %s): set TIDE_OFFLINE_SHIM to its "
                       "path (it is installed in lib/tide/)",
                       tried[0] ? tried : "nothing");
}

/* The cgroup v2 mount point, from /proc/self/mountinfo; 0 when there is none. */
static int cgroup2_mount(char *out, size_t len)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        /* ID PARENT MAJ:MIN ROOT MOUNT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER */
        char root[1024], mnt[1024], fstype[64];
        const char *dash = strstr(line, " - ");
        if (dash == NULL || sscanf(dash + 3, "%63s", fstype) != 1 || strcmp(fstype, "cgroup2"))
            continue;
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", root, mnt) != 2)
            continue;
        snprintf(out, len, "%s", mnt);
        found = 1;
    }
    fclose(f);
    return found;
}

int tide__offline_cgroup_parent(char *out, size_t len, char *why, size_t why_len)
{
    const char *env = getenv("TIDE_OFFLINE_CGROUP");
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
        snprintf(why, why_len, "TIDE_OFFLINE_CGROUP=%s", env);
        return 0;
    }
    char dir[PATH_MAX];
    if (env != NULL && env[0] == '/') {
        snprintf(dir, sizeof dir, "%s", env);
    } else {
        char mnt[1024], line[2048], self[2048] = "";
        if (!cgroup2_mount(mnt, sizeof mnt)) {
            snprintf(why, why_len, "no cgroup v2 file system is mounted");
            return 0;
        }
        FILE *f = fopen("/proc/self/cgroup", "re");
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            if (strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(self, sizeof self, "%s", line + 3);
            }
        if (f != NULL)
            fclose(f);
        if (self[0] != '/') {
            snprintf(why, why_len, "this process has no cgroup v2 path in /proc/self/cgroup");
            return 0;
        }
        snprintf(dir, sizeof dir, "%s%s", mnt, strcmp(self, "/") == 0 ? "" : self);
    }
    /* A probe: the attempt's cgroup is made beside it, the keeper moves the command in. */
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/tide-probe-%d", dir, (int)getpid());
    if (mkdir(probe, 0755) != 0 && errno != EEXIST) {
        snprintf(why, why_len, "cannot create a cgroup in %s: %s", dir, strerror(errno));
        return 0;
    }
    char procs[PATH_MAX + 96];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", probe);
    int ok = access(procs, W_OK) == 0;
    int err = errno;
    rmdir(probe);
    if (!ok) {
        snprintf(why, why_len, "cannot write %s: %s", procs, strerror(err));
        return 0;
    }
    snprintf(out, len, "%s", dir);
    return 1;
}

/* ---- one attempt -------------------------------------------------------------------------- */

static void cgroup_kill(const char *dir)
{
    if (dir[0] == '\0')
        return;
    char path[sizeof((tide__child *)0)->cgroup + 32];
    snprintf(path, sizeof path, "%s/cgroup.kill", dir);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "1", 1) < 0) {
            /* an older kernel: the keeper killed pid by pid */
        }
        close(fd);
    }
    for (int i = 0; i < 100 && rmdir(dir) != 0 && errno == EBUSY; i++)
        tide_sleep_ms(2);
}

tide_status tide__child_spawn(tide__child *c, const tide__child_cfg *cfg)
{
    memset(c, 0, sizeof *c);
    const char *job = cfg->job;
    if (cfg->argc == 0 || cfg->argv == NULL || cfg->argv[0] == NULL || cfg->argv[0][0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "offline job %s has an empty command line", job);
    if (cfg->log_path == NULL || cfg->log_path[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "offline job %s: no log file", job);
    char shim[PATH_MAX];
    TIDE_CHECK(tide__offline_shim(shim, sizeof shim));
    size_t n_environ = 0;
    while (environ != NULL && environ[n_environ] != NULL)
        n_environ++;
    enum { N_FIXED = 17 };
    char **av = tide_calloc((size_t)cfg->argc + N_FIXED + 1, sizeof *av);
    char **ev = tide_calloc(n_environ + cfg->n_env + 1, sizeof *ev);
    tide_status rc = TIDE_OK;
    posix_spawnattr_t attr;
    int attr_ok = 0;
    char parent[32], grace[32], cap[32], mem[32], procs[32];
    if (av == NULL || ev == NULL) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory starting offline job %s", job);
        goto out;
    }
    int grace_ms = cfg->grace_ms < 0 ? 0 : cfg->grace_ms;
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    snprintf(grace, sizeof grace, "%d", grace_ms);
    snprintf(cap, sizeof cap, "%llu", (unsigned long long)cfg->log_cap);
    if (cfg->cgroup != NULL && cfg->cgroup[0] != '\0')
        snprintf(c->cgroup, sizeof c->cgroup, "%s", cfg->cgroup);
    size_t a = 0;
    av[a++] = shim;
    av[a++] = "--parent";
    av[a++] = parent;
    av[a++] = "--grace";
    av[a++] = grace;
    av[a++] = "--log";
    av[a++] = (char *)cfg->log_path;
    av[a++] = "--cap";
    av[a++] = cap;
    if (c->cgroup[0] != '\0') {
        av[a++] = "--cgroup";
        av[a++] = c->cgroup;
    }
    if (cfg->max_memory != 0) {
        snprintf(mem, sizeof mem, "%llu", (unsigned long long)cfg->max_memory);
        av[a++] = "--max-memory";
        av[a++] = mem;
    }
    if (cfg->max_procs != 0) {
        snprintf(procs, sizeof procs, "%u", cfg->max_procs);
        av[a++] = "--max-procs";
        av[a++] = procs;
    }
    av[a++] = "--";
    for (uint32_t i = 0; i < cfg->argc; i++)
        av[a++] = cfg->argv[i];
    size_t k = 0;
    for (size_t i = 0; i < cfg->n_env; i++)
        ev[k++] = cfg->env[i];
    for (size_t i = 0; i < n_environ; i++) {
        /* extra entries win over the inherited ones of the same name; the MPI runtime's
           own variables stay with the worker */
        const char *eq = strchr(environ[i], '=');
        size_t name_len = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int shadowed = !tide__offline_env_keep(environ[i]);
        for (size_t e = 0; e < cfg->n_env && !shadowed; e++)
            shadowed =
                strncmp(cfg->env[e], environ[i], name_len) == 0 && cfg->env[e][name_len] == '=';
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
    posix_spawnattr_setpgroup(&attr, 0);        /* signals to the worker's group skip it */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    int err = posix_spawn(&pid, shim, NULL, &attr, av, ev);
    if (err != 0) {
        rc = tide_errorf(TIDE_ERR_IO, "cannot start offline job %s: %s: %s", job, shim,
                         strerror(err));
        goto out;
    }
    c->pid = pid;
    c->grace_ms = grace_ms;
    snprintf(c->job, sizeof c->job, "%s", job);
    snprintf(c->log, sizeof c->log, "%s", cfg->log_path);
    TIDE_INFO("worker", "offline job %s started (keeper pid %d: %s), output in %s", job, (int)pid,
              cfg->argv[0], cfg->log_path);
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
    kill(c->pid, SIGTERM); /* the keeper passes it to every process of the attempt */
    c->kill_at_ns = now_ns + (uint64_t)grace_ms * 1000000ull;
    if (c->kill_at_ns == 0)
        c->kill_at_ns = 1;
    TIDE_INFO("worker", "offline job %s (keeper pid %d): SIGTERM, SIGKILL in %d ms", c->job,
              (int)c->pid, grace_ms);
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
    if (r == c->pid || (r < 0 && errno == ECHILD)) {
        *exit_code = r == c->pid ? decode_status(st) : -255; /* reaped elsewhere: unknown */
        /* the keeper removes its cgroup; when it was killed itself, the worker does */
        cgroup_kill(c->cgroup);
        c->pid = 0;
        return 1;
    }
    if (c->kill_at_ns != 0 && now_ns >= c->kill_at_ns && !c->killed) {
        c->killed = 1;
        kill(c->pid, SIGUSR1); /* the keeper SIGKILLs the attempt and exits */
        c->hard_kill_at_ns = now_ns + TIDE__KEEPER_SLACK_MS * 1000000ull;
        TIDE_INFO("worker", "offline job %s (keeper pid %d): grace period over, SIGKILL", c->job,
                  (int)c->pid);
    }
    if (c->hard_kill_at_ns != 0 && now_ns >= c->hard_kill_at_ns) {
        c->hard_kill_at_ns = 0;
        TIDE_WARN("worker", "offline job %s: its keeper (pid %d) did not end; killing it", c->job,
                  (int)c->pid);
        cgroup_kill(c->cgroup);
        kill(-c->pid, SIGKILL);
    }
    return 0;
}

int tide__child_stop(tide__child *c, int grace_ms)
{
    int code = 0;
    tide__child_preempt(c, grace_ms, tide_now_ns());
    while (c->pid > 0 && !tide__child_poll(c, tide_now_ns(), &code))
        tide_sleep_ms(5);
    return code;
}
