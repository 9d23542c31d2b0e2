/*
 * tide_task: the offline task plugin interface. Documented in tide's docs/offline.md
 * (installed as share/doc/tide/docs/offline.md); a complete plugin is
 * share/tide/examples/task_matmul/task_matmul.c, built as lib/tide/libtide_task_matmul.so.
 *
 * A plugin is a shared object that libtide loads with dlopen when tided assigns a
 * plugin job to a worker ("tidectl submit --offline --plugin NAME [--bubbles]"). NAME
 * is a bare name (tided's protocol carries no paths, so a coordinator can only name
 * plugins that a worker's own settings offer), resolved as $TIDE_PLUGIN_DIR/libNAME.so,
 * then libNAME.so on the loader's search path. The object exports one symbol:
 *
 *     const tide_task_v1 *tide_task_v1_get(void);
 *
 * The runtime drives the task in bounded units of work (steps) on the worker's main
 * thread while it is idle, or inside the pipeline bubbles of the online job it runs
 * (jobs submitted with --bubbles; tide_bubble_wait in tide.h: a step starts only when
 * estimated_step_ms fits in the expected rest of the bubble), and between steps
 * checks for preemption: on preemption it
 * calls save (the blob is written to $TIDE_TASK_DIR/<job>.ckpt, default /tmp) and
 * fini; the next attempt of the job calls restore with that blob after init.
 * Workload: steps of milliseconds to a few seconds; estimated_step_ms tells the runtime
 * whether a step fits in an idle window.
 */
#ifndef TIDE_TIDE_TASK_H
#define TIDE_TIDE_TASK_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_TASK_ABI_VERSION 1

/* What the runtime tells a task about where it runs. */
typedef struct tide_task_env {
    const char *job;  /* offline job name */
    int device;       /* the worker's local device index (tide_device; host-memory
                         workers: their index on the host); current on the calling thread
                         when init and every later function run */
    int gpu;          /* 1 when the device is a CUDA device */
    uint64_t mem_cap; /* bytes the task may allocate on the device; 0 = no cap */
    uint32_t attempt; /* 1 for the first run of the job */
    void *stream;     /* gpu: a non-blocking cudaStream_t of the lowest priority the device
                         offers (cudaDeviceGetStreamPriorityRange's least), owned by the
                         runtime (valid until fini returns). Launch the task's work there:
                         libtide's own streams (its collectives and copies) have the greatest
                         priority, so the GPU schedules them first. On NVIDIA GPUs the least
                         is 0, also the default stream's: the training's own kernels there
                         share the task's priority, which is why the runtime starts task steps
                         only on idle workers and inside bubbles. NULL otherwise */
} tide_task_env;

/* The table a plugin exports. Every function is called on one thread, in order:
   init, then restore (only when a saved blob exists), then step until *done or
   preemption, then save (only when preempted), then fini. */
typedef struct tide_task_v1 {
    int version;      /* TIDE_TASK_ABI_VERSION */
    const char *name; /* for logs */
    /* Creates the task's state from argv (the job's arguments). */
    tide_status (*init)(void **state, int argc, char **argv, const tide_task_env *env);
    /* Runs one bounded unit of work; sets *done = 1 when the task is complete;
     *progress in [0, 1] (may be left unchanged). */
    tide_status (*step)(void *state, int *done, double *progress);
    /* Serialises the state into a malloc'd blob (the runtime frees it with free()). */
    tide_status (*save)(void *state, void **blob, size_t *len);
    /* Restores the state saved by an earlier attempt. */
    tide_status (*restore)(void *state, const void *blob, size_t len);
    /* Expected duration of the next step, ms (decides whether it fits in a bubble). */
    double (*estimated_step_ms)(void *state);
    /* Frees the state; NULL state is fine. */
    void (*fini)(void *state);
} tide_task_v1;

/* The symbol a plugin exports (name: "tide_task_v1_get"). */
typedef const tide_task_v1 *(*tide_task_v1_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TIDE_TASK_H */
