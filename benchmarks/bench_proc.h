/*
 * Child processes for the benchmarks that drive whole programs (resize_bench,
 * bubble_bench): start a command with its output in a log file, reap it (showing the
 * log's tail when it failed), and build mpirun command lines. Header-only, static
 * functions. Workload: a few processes per benchmark run.
 */
#ifndef TIDE_BENCHMARKS_BENCH_PROC_H
#define TIDE_BENCHMARKS_BENCH_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Wall-clock microseconds (CLOCK_REALTIME, as train_mlp's traces). */
static inline int64_t bench_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Starts argv (PATH search) with stdout and stderr to log; returns the pid or -1 (the
   reason printed, prefixed with prog). Never blocks. */
static inline pid_t bench_spawn_logged(const char *prog, char *const *argv, const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) {
        fprintf(stderr, "%s: cannot start %s: %s\n", prog, argv[0], strerror(err));
        return -1;
    }
    return pid;
}

/* Waits for pid (blocks); 0 when it exited with status 0, else prints the tail of its
   log. *exit_us (may be NULL) gets the wall time it was reaped. */
static inline int bench_reap(const char *prog, pid_t pid, const char *what, const char *log,
                             int64_t *exit_us)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (exit_us != NULL)
        *exit_us = bench_wall_us();
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    fprintf(stderr, "%s: %s failed (status %d); the end of %s:\n", prog, what, st, log);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "tail -15 '%s' >&2", log);
    if (system(cmd) != 0)
        fprintf(stderr, "(could not show %s)\n", log);
    return -1;
}

/* A command line being built: argv NULL-terminated, numbers kept in store. */
typedef struct bench_cmd {
    char *argv[96];
    char store[48][64];
    int n, ns;
} bench_cmd;

static inline void bench_add(bench_cmd *c, const char *s)
{
    if (c->n < 95)
        c->argv[c->n++] = (char *)s;
    c->argv[c->n] = NULL;
}

static inline void bench_addf(bench_cmd *c, const char *flag, long long v)
{
    bench_add(c, flag);
    if (c->ns < 48) {
        snprintf(c->store[c->ns], sizeof c->store[0], "%lld", v);
        bench_add(c, c->store[c->ns++]);
    }
}

/* Starts c with `mpirun --oversubscribe --bind-to none [--allow-run-as-root] -np np`. */
static inline void bench_mpirun(bench_cmd *c, const char *mpirun, int np)
{
    memset(c, 0, sizeof *c);
    bench_add(c, mpirun);
    bench_add(c, "--oversubscribe");
    bench_add(c, "--bind-to");
    bench_add(c, "none");
    if (getuid() == 0)
        bench_add(c, "--allow-run-as-root");
    bench_addf(c, "-np", np);
}

#endif /* TIDE_BENCHMARKS_BENCH_PROC_H */
