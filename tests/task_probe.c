/*
 * task_probe: an offline task plugin (tide_task.h) for tests. Its init writes where the
 * runtime put it, one line to the file named by --out:
 *
 *     rank=<OMPI_COMM_WORLD_RANK> device=<env.device> gpu=<env.gpu> stream=<null|set>
 *
 * and its only step ends the job. test_examples_bubbles runs it in a pipeline bubble
 * and compares the line with the worker's tide_device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tide/tide_task.h>

typedef struct probe {
    int steps;
} probe;

static tide_status p_init(void **state, int argc, char **argv, const tide_task_env *env)
{
    const char *out = NULL;
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], "--out") == 0)
            out = argv[i + 1];
    if (out == NULL || env == NULL) {
        fprintf(stderr, "task_probe: usage: --out FILE\n");
        return TIDE_ERR_INVALID;
    }
    probe *p = calloc(1, sizeof *p);
    if (p == NULL)
        return TIDE_ERR_NOMEM;
    FILE *f = fopen(out, "a");
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    int ok = f != NULL && fprintf(f, "rank=%s device=%d gpu=%d stream=%s\n", rank ? rank : "-1",
                                  env->device, env->gpu, env->stream ? "set" : "null") > 0;
    if (f != NULL)
        ok = fclose(f) == 0 && ok;
    if (!ok) {
        fprintf(stderr, "task_probe: cannot write %s\n", out);
        free(p);
        return TIDE_ERR_IO;
    }
    *state = p;
    return TIDE_OK;
}

static tide_status p_step(void *state, int *done, double *progress)
{
    probe *p = state;
    p->steps++;
    *done = 1;
    *progress = 1.0;
    return TIDE_OK;
}

static double p_estimate(void *state)
{
    (void)state;
    return 0.01; /* ms: fits any bubble */
}

static void p_fini(void *state)
{
    free(state);
}

static const tide_task_v1 ops = {
    .version = TIDE_TASK_ABI_VERSION,
    .name = "task_probe",
    .init = p_init,
    .step = p_step,
    .save = NULL,
    .restore = NULL,
    .estimated_step_ms = p_estimate,
    .fini = p_fini,
};

const tide_task_v1 *tide_task_v1_get(void);
const tide_task_v1 *tide_task_v1_get(void)
{
    return &ops;
}
