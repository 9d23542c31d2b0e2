/*
 * coordinator/child: a command tided runs without waiting for it (the Slurm provider's
 * sbatch, scontrol, squeue). The child gets /dev/null as stdin, one pipe for stdout and
 * stderr together, tided's environment, a process group of its own and default signal
 * dispositions; tided reads the pipe without blocking and reaps the child with WNOHANG
 * from its loop, and kills the group when the child outlives its deadline. Nothing here
 * blocks (spawning is posix_spawn, which returns once the child has exec'd or failed).
 *
 * Workload: a few children at a time, each living milliseconds to seconds, with output
 * of a few KiB (the first TIDE_CHILD_OUT_MAX bytes are kept, the rest is read and dropped).
 * One thread: the event loop's.
 */
#ifndef TIDE_COORD_CHILD_H
#define TIDE_COORD_CHILD_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_CHILD_OUT_MAX (64u << 10) /* bytes of output kept */

typedef struct tide_child tide_child_t;

/* How a child ended (tide_child_poll returned 1). */
typedef enum tide_child_end {
    TIDE_CHILD_EXITED = 0,   /* exited: tide_child_code is its exit status */
    TIDE_CHILD_SIGNALED = 1, /* killed by a signal not of ours: tide_child_code is the signal */
    TIDE_CHILD_TIMEOUT = 2,  /* outlived its deadline: tided killed it */
} tide_child_end;

/* Starts argv[0] (searched in PATH) with argv, in folder cwd (NULL: tided's), to be ended
 * by timeout_ms (0: never). TIDE_ERR_NOT_FOUND when argv[0] cannot be run, TIDE_ERR_IO
 * when the pipe or the spawn fails. Caller owns *out (tide_child_destroy). Loop thread. */
tide_status tide_child_start(tide_child_t **out, char *const argv[], const char *cwd,
                             uint64_t timeout_ms);

/* Reads what the child wrote since the last call and reaps it when it ended; at now_ns
 * past its deadline, kills its process group. Returns 1 once it has ended (and every
 * byte it wrote was read), 0 while it runs. Never blocks. */
int tide_child_poll(tide_child_t *c, uint64_t now_ns);

/* How the child ended; meaningful once tide_child_poll returned 1. */
tide_child_end tide_child_how(const tide_child_t *c);

/* Exit status (EXITED) or signal number (SIGNALED); 0 for TIMEOUT. */
int tide_child_code(const tide_child_t *c);

/* Its output so far, NUL-terminated, stdout and stderr interleaved as written; *len
 * (when non-NULL) its length. Borrowed: valid until the next poll or destroy. */
const char *tide_child_output(const tide_child_t *c, size_t *len);

/* Its output's last non-empty line (Slurm's commands end with their error), copied into
 * buf of size len; "" when it wrote nothing. */
void tide_child_last_line(const tide_child_t *c, char *buf, size_t len);

/* Kills a child that still runs (its whole process group, SIGKILL), reaps it, closes the
 * pipe, frees *self_p and sets it to NULL; NULL is fine. May wait for the kill to land
 * (microseconds): only a child already killed is waited for. */
void tide_child_destroy(tide_child_t **self_p);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_CHILD_H */
