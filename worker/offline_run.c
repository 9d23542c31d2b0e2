/*
 * tide-offline-run: the keeper of one attempt of an offline command job. libtide starts
 * it (posix_spawn) instead of the command itself; it starts the command and keeps
 * everything the command spawns inside the attempt, so that nothing outlives a
 * preemption or the worker:
 *
 *   - it is the child subreaper of the attempt (PR_SET_CHILD_SUBREAPER): a descendant
 *     whose parent exits, even one that called setsid, is re-parented to it, so "every
 *     process of the attempt" is "every descendant of this process";
 *   - with --cgroup DIR, the command runs in that cgroup v2 (created here, killed with
 *     cgroup.kill or pid by pid, removed at the end): what the kernel counts as the
 *     attempt, whatever it does;
 *   - the worker's death reaches it as SIGTERM (PR_SET_PDEATHSIG), the command's as
 *     SIGKILL when this process itself is killed;
 *   - SIGTERM (a preemption, the worker leaving or dying) is passed to every process of
 *     the attempt, and SIGKILL follows after --grace ms, or at once on SIGUSR1; when the
 *     command ends, whatever it left behind is killed;
 *   - the command's stdout and stderr go to --log FILE, at most --cap bytes, then one
 *     marker line and the rest is discarded (never into the worker's own output);
 *   - --max-memory BYTES and --max-procs N bound the attempt (offline_limits.h): in its
 *     cgroup when the controllers are there, else as the command's rlimits; the log says
 *     which at the start and, when the command failed under one, names it at the end.
 *
 * It exits with the command's exit status, or dies of the signal that killed the
 * command, so the worker sees what the command did. 125: it could not run the attempt
 * (bad arguments, log file); 127: the command could not be started (the reason is in the
 * log). Single-threaded (fork is fine here); one process per attempt, idle in poll.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/version.h"
#include "worker/offline_limits.h"

#define EXIT_SETUP   125
#define REAP_WAIT_MS 5000 /* bound on the wait for killed processes to go */

typedef struct run {
    pid_t parent;      /* the worker; its death reads as SIGTERM */
    long grace_ms;     /* SIGTERM -> SIGKILL */
    const char *log;   /* output file */
    uint64_t cap;      /* bytes of output kept */
    const char *cgdir; /* cgroup v2 directory of the attempt, or NULL */
    int cg_ok;         /* the command was moved into cgdir */
    tide__limits lim;  /* --max-memory, --max-procs and how they are applied */
    char **argv;       /* the command */
    pid_t cmd;
    int log_fd;
    int mid_line; /* the log's last byte is not a newline: the command's line is unfinished */
    uint64_t written, dropped;
} run;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void log_line(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A line of the keeper's own in the log (not counted against the cap), on a line of its
   own: after output without a final newline (a progress bar redrawn with \r, a process
   killed mid-line) it would extend the command's line, and the attempt's event, which
   quotes the last line, would show the command's text and may lose the keeper's. */
static void log_line(run *r, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + 1, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || r->log_fd < 0)
        return;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    int nl = r->mid_line && buf[1] != '\n';
    buf[0] = '\n';
    if (n > 0 && write(r->log_fd, buf + !nl, (size_t)n + (size_t)nl) < 0) {
        /* nowhere else to say it */
    }
    if (n > 0)
        r->mid_line = buf[n] != '\n';
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    int err = errno;
    close(fd);
    errno = err;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Sends sig to every pid listed in the cgroup's cgroup.procs; the number signalled. */
static int signal_cgroup(const run *r, int sig)
{
    if (!r->cg_ok)
        return 0;
    if (sig == SIGKILL && write_file(r->cgdir, "cgroup.kill", "1") == 0)
        return 1; /* the kernel kills every member, forks racing it included */
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", r->cgdir);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    int n = 0;
    long pid;
    while (fscanf(f, "%ld", &pid) == 1)
        if (pid > 0 && (pid_t)pid != getpid() && kill((pid_t)pid, sig) == 0)
            n++;
    fclose(f);
    return n;
}

static int cgroup_empty(const run *r)
{
    if (!r->cg_ok)
        return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", r->cgdir);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 1;
    long pid;
    int empty = fscanf(f, "%ld", &pid) != 1;
    fclose(f);
    return empty;
}

/* Parent pid of pid from /proc/PID/stat, or -1. */
static pid_t ppid_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    int ppid = -1;
    char state;
    if (p == NULL || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
        return -1;
    return (pid_t)ppid;
}

/*
 * Sends sig to every descendant of this process (a subreaper: orphans of the attempt are
 * its children, so the descendants are the whole attempt). Returns how many it found.
 * Scans /proc once: O(processes on the host).
 */
static int signal_descendants(int sig)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    size_t cap = 1024, n = 0;
    pid_t *pid = malloc(cap * sizeof *pid), *ppid = malloc(cap * sizeof *ppid);
    struct dirent *e;
    while (pid != NULL && ppid != NULL && (e = readdir(d)) != NULL) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        if (*end != '\0' || v <= 0)
            continue;
        pid_t pp = ppid_of((pid_t)v);
        if (pp < 0)
            continue;
        if (n == cap) {
            cap *= 2;
            pid_t *a = realloc(pid, cap * sizeof *pid), *b = NULL;
            if (a != NULL)
                pid = a;
            b = realloc(ppid, cap * sizeof *ppid);
            if (b != NULL)
                ppid = b;
            if (a == NULL || b == NULL)
                break;
        }
        pid[n] = (pid_t)v;
        ppid[n] = pp;
        n++;
    }
    closedir(d);
    int found = 0;
    if (pid != NULL && ppid != NULL) {
        /* mark descendants: repeat until no new one is found (depth passes) */
        unsigned char *in = calloc(n ? n : 1, 1);
        for (int changed = 1; in != NULL && changed;) {
            changed = 0;
            for (size_t i = 0; i < n; i++) {
                if (in[i])
                    continue;
                int mine = ppid[i] == getpid();
                for (size_t k = 0; k < n && !mine; k++)
                    mine = in[k] && pid[k] == ppid[i];
                if (mine) {
                    in[i] = 1;
                    changed = 1;
                }
            }
        }
        for (size_t i = 0; in != NULL && i < n; i++)
            if (in[i] && kill(pid[i], sig) == 0)
                found++;
        free(in);
    }
    free(pid);
    free(ppid);
    return found;
}

static void signal_attempt(run *r, int sig)
{
    signal_cgroup(r, sig);
    signal_descendants(sig);
}

/* Appends output to the log within the cap; the first byte past it writes the marker. */
static void take_output(run *r, const char *buf, size_t n)
{
    if (r->written < r->cap) {
        size_t room = (size_t)(r->cap - r->written);
        size_t k = n < room ? n : room;
        ssize_t w = write(r->log_fd, buf, k);
        if (w > 0) {
            r->written += (uint64_t)w;
            r->mid_line = buf[w - 1] != '\n';
        }
        buf += k;
        n -= k;
        if (n > 0 && r->written >= r->cap)
            log_line(r, "\n[tide: output cap of %llu bytes reached; the rest is discarded]\n",
                     (unsigned long long)r->cap);
    }
    r->dropped += n;
}

/* Reaps every child that ended (orphans of the attempt included); notes the command's. */
static void reap(run *r, int *status, int *cmd_done)
{
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0)
        if (p == r->cmd) {
            *status = st;
            *cmd_done = 1;
        }
}

static int usage(const char *why)
{
    fprintf(stderr,
            "tide-offline-run: %s\n"
            "usage: tide-offline-run --parent PID --grace MS --log FILE --cap BYTES "
            "[--cgroup DIR] [--max-memory BYTES] [--max-procs N] -- PROGRAM [ARGS...]\n"
            "       tide-offline-run --version\n"
            "(started by libtide for offline command jobs; not meant to be run by hand)\n",
            why);
    return EXIT_SETUP;
}

/* The command's process: its own group, in the cgroup, output to the pipe. */
static void exec_command(run *r, int out_fd, int go_fd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* this keeper killed: the command goes too */
    char c = 0;
    while (read(go_fd, &c, 1) < 0 && errno == EINTR) {
        /* the keeper moves it into the cgroup first, and says which limits it holds */
    }
    close(go_fd);
    r->lim.cg_memory = (c & 1) != 0;
    r->lim.cg_pids = (c & 2) != 0;
    char why[256];
    if (tide__limits_rlimits(&r->lim, why, sizeof why) != 0) {
        dprintf(out_fd, "[tide: cannot apply the attempt's limits: %s; not started]\n", why);
        _exit(127); /* never run unbounded what was asked to be bounded */
    }
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0)
        dup2(null, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    execvp(r->argv[0], r->argv);
    dprintf(2, "[tide: cannot start %s: %s]\n", r->argv[0], strerror(errno));
    _exit(127);
}

/* Reads the flags into r; 0, or the usage error's exit code. */
static int parse(run *r, int argc, char **argv)
{
    long long cap = -1, parent = -1;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (v == NULL)
            return usage("a flag without its value");
        char *end = NULL;
        if (strcmp(a, "--parent") == 0)
            parent = strtoll(v, &end, 10);
        else if (strcmp(a, "--grace") == 0)
            r->grace_ms = strtol(v, &end, 10);
        else if (strcmp(a, "--cap") == 0)
            cap = strtoll(v, &end, 10);
        else if (strcmp(a, "--log") == 0)
            r->log = v;
        else if (strcmp(a, "--cgroup") == 0)
            r->cgdir = v;
        else if (strcmp(a, "--max-memory") == 0)
            r->lim.memory = strtoull(v, &end, 10);
        else if (strcmp(a, "--max-procs") == 0)
            r->lim.procs = strtoull(v, &end, 10);
        else
            return usage("unknown flag");
        if (end != NULL && (*end != '\0' || end == v))
            return usage("a number is malformed");
        i++;
    }
    if (i >= argc || argv[i][0] == '\0')
        return usage("no command after --");
    if (parent <= 0 || r->grace_ms < 0 || cap < 0 || r->log == NULL)
        return usage("--parent, --grace, --log and --cap are required");
    r->parent = (pid_t)parent;
    r->cap = (uint64_t)cap;
    r->argv = argv + i;
    return 0;
}

/* Signals through a signalfd (blocked before anything can send them), the worker's death
   as SIGTERM, subreaper of the attempt, the log open, the cgroup made. The signalfd, or -1
   (nothing may start: EXIT_SETUP). */
static int setup(run *r)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGUSR1);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != r->parent)
        return -1; /* the worker died before we could watch it: start nothing */
    if (sfd < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        fprintf(stderr, "tide-offline-run: signalfd/subreaper: %s\n", strerror(errno));
        return -1;
    }
    r->log_fd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (r->log_fd < 0) {
        fprintf(stderr, "tide-offline-run: cannot open the log %s: %s\n", r->log, strerror(errno));
        return -1;
    }
    if (r->cgdir != NULL && mkdir(r->cgdir, 0755) != 0 && errno != EEXIST) {
        log_line(r, "[tide: cannot create cgroup %s (%s): contained by a subreaper only]\n",
                 r->cgdir, strerror(errno));
        r->cgdir = NULL;
    }
    return sfd;
}

/* Forks the command into its own process group (and cgroup), and lets it exec only once
   it is contained. The read end of its output pipe, or -1. */
static int start(run *r)
{
    int out[2], go[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) {
        log_line(r, "[tide: pipe: %s]\n", strerror(errno));
        return -1;
    }
    r->cmd = fork();
    if (r->cmd < 0) {
        log_line(r, "[tide: fork: %s]\n", strerror(errno));
        return -1;
    }
    if (r->cmd == 0) {
        close(out[0]);
        close(go[1]);
        exec_command(r, out[1], go[0]);
    }
    close(out[1]);
    close(go[0]);
    setpgid(r->cmd, r->cmd); /* both set it: no race with the first kill */
    if (r->cgdir != NULL) {
        char pid[32];
        snprintf(pid, sizeof pid, "%d", (int)r->cmd);
        if (write_file(r->cgdir, "cgroup.procs", pid) == 0) {
            r->cg_ok = 1;
            tide__limits_cgroup(&r->lim, r->cgdir);
        } else {
            log_line(r, "[tide: cannot join cgroup %s (%s): contained by a subreaper only]\n",
                     r->cgdir, strerror(errno));
            rmdir(r->cgdir);
        }
    }
    char lim[512];
    tide__limits_describe(&r->lim, geteuid() == 0, lim, sizeof lim);
    if (lim[0] != '\0')
        log_line(r, "[tide: limits of this attempt: %s]\n", lim);
    char go_byte = (char)('@' | (r->lim.cg_memory ? 1 : 0) | (r->lim.cg_pids ? 2 : 0));
    if (write(go[1], &go_byte, 1) < 0) {
        /* the command died already: its status says so */
    }
    close(go[1]);
    return out[0];
}

/* The watch loop's state: the command's status, output pipe, and the grace clock. */
typedef struct watch {
    int status, cmd_done, pipe_open, term;
    uint64_t kill_at, reap_until;
    int out;
} watch;

/* The command ended: what it left behind goes too, at once, or, when the attempt was told
   to stop, once its grace is over (they may be cleaning up). 1 when the watch ends;
   *grace_left: the grace still runs. */
static int sweep(run *r, watch *w, int *grace_left)
{
    uint64_t t = now_ms();
    *grace_left = w->term && w->kill_at != 0 && t < w->kill_at;
    int sig = *grace_left ? 0 : SIGKILL;
    int left = signal_descendants(sig);
    if (!cgroup_empty(r)) {
        if (sig != 0)
            signal_cgroup(r, sig);
        left++;
    }
    reap(r, &w->status, &w->cmd_done);
    if (left == 0)
        return 1;
    if (!*grace_left && w->reap_until == 0)
        w->reap_until = t + REAP_WAIT_MS;
    if (w->reap_until != 0 && t >= w->reap_until) {
        log_line(r, "[tide: processes of the attempt still alive after %d ms]\n", REAP_WAIT_MS);
        return 1;
    }
    return 0;
}

/* A signal for the keeper: SIGUSR1 ends the grace, the first of the others stops the
   attempt (SIGTERM, then SIGKILL after the grace). */
static void on_signal(run *r, watch *w, int sfd)
{
    struct signalfd_siginfo si;
    if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si)
        return;
    int sig = (int)si.ssi_signo;
    if (sig == SIGUSR1) {
        w->kill_at = now_ms(); /* the worker says the grace is over */
    } else if (sig != SIGCHLD && !w->term) {
        w->term = 1;
        log_line(r, "\n[tide: %s: SIGTERM to the attempt, SIGKILL in %ld ms]\n",
                 getppid() != r->parent ? "the worker is gone" : "stopping", r->grace_ms);
        signal_attempt(r, SIGTERM);
        w->kill_at = now_ms() + (uint64_t)r->grace_ms;
    }
}

/* Copies the command's output into the log and follows signals until the command and
   every process of the attempt are gone. */
static void watch_attempt(run *r, watch *w, int sfd)
{
    static char buf[65536];
    for (;;) {
        reap(r, &w->status, &w->cmd_done);
        int grace_left = 0;
        if (w->cmd_done && sweep(r, w, &grace_left))
            break;
        int timeout = -1;
        if (w->cmd_done) {
            timeout = grace_left ? 50 : 10;
        } else if (w->kill_at != 0) {
            uint64_t t = now_ms();
            timeout = t >= w->kill_at ? 0 : (int)(w->kill_at - t);
        }
        struct pollfd pf[2] = {{sfd, POLLIN, 0}, {w->pipe_open ? w->out : -1, POLLIN, 0}};
        if (poll(pf, 2, timeout) < 0 && errno != EINTR)
            break;
        if (pf[1].revents != 0) {
            ssize_t k = read(w->out, buf, sizeof buf);
            if (k > 0) {
                take_output(r, buf, (size_t)k);
            } else if (k == 0 || errno != EINTR) {
                w->pipe_open = 0;
                close(w->out);
            }
        }
        if (pf[0].revents != 0)
            on_signal(r, w, sfd);
        if (w->kill_at != 0 && now_ms() >= w->kill_at) {
            signal_attempt(r, SIGKILL);
            w->kill_at = 0;
        }
    }
    if (w->pipe_open) {
        /* every writer is dead (or stuck past REAP_WAIT_MS): read what is left */
        fcntl(w->out, F_SETFL, O_NONBLOCK);
        ssize_t k;
        while ((k = read(w->out, buf, sizeof buf)) > 0)
            take_output(r, buf, (size_t)k);
        close(w->out);
    }
}

/* Ends as the command ended: its exit code, or its signal raised on the keeper itself.
   A limit that ended the attempt is the log's last line: the attempt's event quotes it. */
static int finish(run *r, int status, int stopped)
{
    if (r->dropped > 0)
        log_line(r, "[tide: %llu bytes of output discarded in all]\n",
                 (unsigned long long)r->dropped);
    char why[640];
    if (!stopped && tide__limits_verdict(&r->lim, r->cg_ok ? r->cgdir : NULL, status, why,
                                         sizeof why))
        log_line(r, "[tide: %s]\n", why);
    close(r->log_fd);
    if (r->cg_ok && rmdir(r->cgdir) != 0 && errno != ENOENT)
        fprintf(stderr, "tide-offline-run: cannot remove cgroup %s: %s\n", r->cgdir,
                strerror(errno));
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        prctl(PR_SET_PDEATHSIG, 0);
        raise(sig);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_SETUP;
}

int main(int argc, char **argv)
{
    run r;
    memset(&r, 0, sizeof r);
    r.log_fd = -1;
    r.grace_ms = -1;
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        tide_version_print(stdout, "tide-offline-run");
        return 0;
    }
    int code = parse(&r, argc, argv);
    if (code != 0)
        return code;
    int sfd = setup(&r);
    if (sfd < 0)
        return EXIT_SETUP;
    watch w;
    memset(&w, 0, sizeof w);
    w.pipe_open = 1;
    w.out = start(&r);
    if (w.out < 0)
        return EXIT_SETUP;
    watch_attempt(&r, &w, sfd);
    return finish(&r, w.status, w.term);
}
