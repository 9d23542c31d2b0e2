/*
 * coordinator/child: commands tided runs beside its loop (see child.h). posix_spawn starts
 * them (no fork of tided's address space); the pipe's read end is non-blocking, so a poll
 * costs one read and one waitpid. Every descriptor of tided's is close-on-exec or closed
 * in the child, so a Slurm command never holds tided's sockets or state file open.
 */
#include "coordinator/child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

extern char **environ;

struct tide_child {
    pid_t pid;
    int fd;               /* read end of the output pipe; -1 once at EOF */
    int reaped;           /* waitpid returned it */
    int wstatus;          /* its wait status once reaped */
    int timed_out;        /* tided killed it at its deadline */
    uint64_t deadline_ns; /* monotonic; 0: none */
    size_t len;           /* bytes of out kept */
    char out[TIDE_CHILD_OUT_MAX + 1];
};

/* The child's attributes: its own process group (a timeout kills all it started), every
 * signal at its default disposition and none blocked (tided ignores SIGPIPE). */
static int spawn_attr(posix_spawnattr_t *a)
{
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    int rc = posix_spawnattr_init(a);
    if (rc == 0)
        rc = posix_spawnattr_setflags(a, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
                                             POSIX_SPAWN_SETSIGMASK);
    if (rc == 0)
        rc = posix_spawnattr_setpgroup(a, 0);
    if (rc == 0)
        rc = posix_spawnattr_setsigdefault(a, &all);
    if (rc == 0)
        rc = posix_spawnattr_setsigmask(a, &none);
    return rc;
}

/* stdin from /dev/null, stdout and stderr into the pipe's write end w, nothing else of
 * tided's open, the folder cwd. */
static int spawn_files(posix_spawn_file_actions_t *f, int w, const char *cwd)
{
    int rc = posix_spawn_file_actions_init(f);
    if (rc == 0)
        rc = posix_spawn_file_actions_addopen(f, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(f, w, 1);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(f, w, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
    if (rc == 0)
        rc = posix_spawn_file_actions_addclosefrom_np(f, 3);
#endif
    if (rc == 0 && cwd != NULL)
        rc = posix_spawn_file_actions_addchdir_np(f, cwd);
    return rc;
}

tide_status tide_child_start(tide_child_t **out, char *const argv[], const char *cwd,
                             uint64_t timeout_ms)
{
    *out = NULL;
    if (argv == NULL || argv[0] == NULL || argv[0][0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "no command to run");
    tide_child_t *c = tide_calloc(1, sizeof *c);
    if (c == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory starting %s", argv[0]);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        tide_free(c);
        return tide_errorf(TIDE_ERR_IO, "cannot make a pipe for %s: %s", argv[0], strerror(errno));
    }
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t files;
    int rc = spawn_attr(&attr);
    int rc_f = rc == 0 ? spawn_files(&files, p[1], cwd) : rc;
    if (rc == 0 && rc_f == 0)
        rc = posix_spawnp(&c->pid, argv[0], &files, &attr, argv, environ);
    else
        rc = rc ? rc : rc_f;
    if (rc_f == 0)
        posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        tide_free(c);
        return tide_errorf(rc == ENOENT || rc == EACCES ? TIDE_ERR_NOT_FOUND : TIDE_ERR_IO,
                           "cannot run %s%s%s: %s", argv[0], cwd ? " in " : "", cwd ? cwd : "",
                           strerror(rc));
    }
    c->fd = p[0];
    (void)fcntl(c->fd, F_SETFL, O_NONBLOCK);
    c->deadline_ns = timeout_ms ? tide_now_ns() + timeout_ms * 1000000ull : 0;
    TIDE__LOG(TIDE_LOG_DEBUG, "child", "started %s (pid %d)", argv[0], (int)c->pid);
    *out = c;
    return TIDE_OK;
}

/* Reads what is in the pipe; at EOF closes it. */
static void drain(tide_child_t *c)
{
    char junk[4096];
    while (c->fd >= 0) {
        size_t room = TIDE_CHILD_OUT_MAX - c->len;
        char *to = room ? c->out + c->len : junk;
        ssize_t n = read(c->fd, to, room ? room : sizeof junk);
        if (n > 0) {
            if (room)
                c->len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) { /* every writer closed it: the child and all it started */
            close(c->fd);
            c->fd = -1;
        }
        break;
    }
    c->out[c->len] = '\0';
}

int tide_child_poll(tide_child_t *c, uint64_t now_ns)
{
    drain(c);
    if (!c->reaped) {
        pid_t r = waitpid(c->pid, &c->wstatus, WNOHANG);
        if (r == c->pid || (r < 0 && errno == ECHILD))
            c->reaped = 1;
    }
    if (!c->reaped && c->deadline_ns && now_ns >= c->deadline_ns && !c->timed_out) {
        c->timed_out = 1;
        (void)kill(-c->pid, SIGKILL);
    }
    if (!c->reaped)
        return 0;
    /* reaped: what it wrote before exiting is in the pipe now; a grandchild that keeps the
       pipe open is not waited for */
    drain(c);
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    return 1;
}

tide_child_end tide_child_how(const tide_child_t *c)
{
    if (c->timed_out)
        return TIDE_CHILD_TIMEOUT;
    return WIFSIGNALED(c->wstatus) ? TIDE_CHILD_SIGNALED : TIDE_CHILD_EXITED;
}

int tide_child_code(const tide_child_t *c)
{
    if (c->timed_out)
        return 0;
    if (WIFSIGNALED(c->wstatus))
        return WTERMSIG(c->wstatus);
    return WIFEXITED(c->wstatus) ? WEXITSTATUS(c->wstatus) : 0;
}

const char *tide_child_output(const tide_child_t *c, size_t *len)
{
    if (len != NULL)
        *len = c->len;
    return c->out;
}

void tide_child_last_line(const tide_child_t *c, char *buf, size_t len)
{
    if (len == 0)
        return;
    size_t end = c->len;
    while (end > 0 && (c->out[end - 1] == '\n' || c->out[end - 1] == '\r' || c->out[end - 1] == ' '))
        end--;
    size_t start = end;
    while (start > 0 && c->out[start - 1] != '\n')
        start--;
    size_t n = end - start < len - 1 ? end - start : len - 1;
    memcpy(buf, c->out + start, n);
    buf[n] = '\0';
}

void tide_child_destroy(tide_child_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide_child_t *c = *self_p;
    if (!c->reaped) {
        (void)kill(-c->pid, SIGKILL);
        while (waitpid(c->pid, &c->wstatus, 0) < 0 && errno == EINTR)
            ;
    }
    if (c->fd >= 0)
        close(c->fd);
    tide_free(c);
    *self_p = NULL;
}
