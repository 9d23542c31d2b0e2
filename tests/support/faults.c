/*
 * Test support: the fault hook of the test programs (core/fault.h). Linked as an object
 * into test executables and the tests' build of train_mlp (tests/faults/train_mlp), it
 * installs itself before main and ends the process (_exit 86) where the environment
 * says, as the product once did on its own:
 *   TIDE_CKPT_FAULT=shards:K  once this process has completed K checkpoint shards
 *   TIDE_CKPT_FAULT=manifest  just before a checkpoint's manifest is renamed into place
 *   TIDE_JOIN_FAULT=STAGE:R   job rank R at STAGE (connect, merge) of a join's connection
 * The lines it logs first are what the tests look for.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"

static atomic_int shards_done; /* shards this process completed */

static void ckpt_fault(const char *point)
{
    const char *f = getenv("TIDE_CKPT_FAULT");
    if (f == NULL)
        return;
    if (strcmp(point, "shard") == 0) {
        int n = atomic_fetch_add(&shards_done, 1) + 1;
        if (strncmp(f, "shards:", 7) == 0 && atoi(f + 7) == n) {
            TIDE_WARN("ckpt", "TIDE_CKPT_FAULT=%s: exiting after %d shards", f, n);
            _exit(86);
        }
    } else if (strcmp(point, f) == 0) {
        TIDE_WARN("ckpt", "TIDE_CKPT_FAULT=%s: exiting", f);
        _exit(86);
    }
}

static void join_fault(const char *stage, long jrank)
{
    const char *f = getenv("TIDE_JOIN_FAULT");
    size_t n = strlen(stage);
    if (f == NULL || strncmp(f, stage, n) != 0 || f[n] != ':' || atol(f + n + 1) != jrank)
        return;
    TIDE_WARN("worker", "TIDE_JOIN_FAULT=%s: job rank %ld exits at stage %s of the join", f, jrank,
              stage);
    _exit(86);
}

static void hook(const char *module, const char *point, long arg)
{
    if (strcmp(module, "ckpt") == 0)
        ckpt_fault(point);
    else if (strcmp(module, "join") == 0)
        join_fault(point, arg);
}

/* Before main, so that every fault point the program reaches finds the hook. */
__attribute__((constructor)) static void install(void)
{
    tide__fault_set_hook(hook);
}
