/*
 * worker/offline_limits: the host memory and process-count limits of one attempt of an
 * offline command (tidectl submit --max-memory/--max-procs, tided --offline-max-*). The
 * keeper (offline_run.c) applies them: in the attempt's cgroup v2 (memory.max, pids.max)
 * when the attempt has one with those controllers enabled, else as rlimits of the command
 * set before exec (RLIMIT_AS, RLIMIT_NPROC). It says which in the attempt's log, and after
 * the attempt whether a limit ended it. Compiled into the keeper and libtide (tests).
 */
#ifndef TIDE_WORKER_OFFLINE_LIMITS_H
#define TIDE_WORKER_OFFLINE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tide__limits {
    uint64_t memory; /* bytes of host memory, 0: no limit */
    uint64_t procs;  /* processes, 0: no limit */
    int cg_memory;   /* memory.max of the attempt's cgroup holds it */
    int cg_pids;     /* pids.max of the attempt's cgroup holds it */
} tide__limits;

/* Writes l's limits into cgroup v2 directory dir where its controller is enabled there
   (memory.max, pids.max exist: the parent lists them in cgroup.subtree_control) and notes
   which it took in l->cg_memory, l->cg_pids. Touches those files only; any thread. */
void tide__limits_cgroup(tide__limits *l, const char *dir);

/* Sets RLIMIT_AS and RLIMIT_NPROC (soft and hard) of the calling process for the limits no
   cgroup holds; meant for the command's process before exec (inherited by all it starts).
   0, or -1 with why (the first failure) in why. Async-signal-safe apart from snprintf. */
int tide__limits_rlimits(const tide__limits *l, char *why, size_t len);

/* One line saying which limits are in force and how ("memory 256 MiB (RLIMIT_AS), ..."),
   "" when none; root: RLIMIT_NPROC does not bind a root command (said, not pretended).
   Pure but for root, which is passed. */
void tide__limits_describe(const tide__limits *l, int root, char *out, size_t len);

/* After the attempt (status from waitpid, dir its cgroup or NULL): 1 and the reason when a
   limit ended it or may have (cgroup: memory.events oom_kill, pids.events max; rlimits: the
   command failed while one was in force, which is how an allocation or fork refused by an
   rlimit shows), else 0. Reads the cgroup's files; any thread. */
int tide__limits_verdict(const tide__limits *l, const char *dir, int status, char *out, size_t len);

#endif
