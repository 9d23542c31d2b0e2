/*
 * Fault points: named places on the product's crash-safety paths (a checkpoint shard
 * complete on disk, a manifest about to be published, a join's connection between two
 * MPI calls) where a test may end the process to prove what a crash there leaves
 * behind. A point does nothing unless a hook is installed, and the product installs
 * none: it reads no environment for them and never exits at one. The tests' hook
 * (tests/support/faults.c, linked only into test programs and the tests' build of
 * train_mlp) reads TIDE_CKPT_FAULT and TIDE_JOIN_FAULT and exits where they say.
 * Cost when no hook is installed: one relaxed atomic load per point.
 */
#ifndef TIDE_CORE_FAULT_H
#define TIDE_CORE_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

/* A hook: called at every fault point reached with its module ("ckpt", "join"), its
   point's name and an argument the point defines (join: the job rank; else 0). It may
   end the process; it must not call back into tide. Any thread. */
typedef void (*tide_fault_hook)(const char *module, const char *point, long arg);

/* Installs hook (NULL: none) for every fault point of the process; any thread. */
void tide__fault_set_hook(tide_fault_hook hook);

/* A fault point: calls the installed hook, if any, with these arguments; any thread. */
void tide__fault_point(const char *module, const char *point, long arg);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_FAULT_H */
