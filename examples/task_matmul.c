/*
 * task_matmul: an offline task plugin (include/tide/tide_task.h) that multiplies two
 * deterministic n x n f32 matrices, a band of rows of C = A * B per step, `rounds`
 * times (C accumulates). It stands for low-priority work that fills idle GPUs and
 * pipeline bubbles: bounded steps, a known step time, and exact save/restore, so a
 * preempted attempt resumes where it stopped and the result is the same as an
 * uninterrupted run.
 *
 *   TIDE_PLUGIN_DIR=<dir of libtide_task_matmul.so> on the workers, then
 *   tidectl submit --offline --plugin tide_task_matmul [--bubbles] -- \
 *       [--n 256] [--rounds 20] [--rows 8] [--out FILE]
 *
 * --rows sets the rows of C per step (the step time, ~2 n^2 rows flops). --out FILE gets
 * "rounds n checksum" once the task is done (tests compare it with a run that was never
 * preempted). Workload: n up to a few thousand; steps of microseconds to milliseconds.
 * Installed as source too (share/tide/examples/task_matmul/): it builds on its own with
 *   cc -std=c11 -fPIC -shared -I PREFIX/include task_matmul.c -o libmy_task.so
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tide/tide_task.h>

#define BLOB_MAGIC 0x74616d6d61746d31ull /* "tammatm1" */

typedef struct task {
    int n, rounds, rows;
    char out[512];
    float *a, *b, *c;
    int round, row; /* next band: round, first row */
    double est_ms;  /* moving average of a step's time (ms) */
} task;

typedef struct blob {
    unsigned long long magic;
    int n, rounds, round, row;
} blob;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Values in [-1, 1) from a counter: the matrices depend on nothing but n. */
static float value(unsigned long long i)
{
    i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    i ^= i >> 31;
    return (float)((double)(i >> 40) / (double)(1ull << 23)) - 1.0f;
}

static int parse(task *s, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *k = argv[i];
        if (i + 1 >= argc)
            return -1;
        const char *v = argv[++i];
        if (strcmp(k, "--n") == 0)
            s->n = atoi(v);
        else if (strcmp(k, "--rounds") == 0)
            s->rounds = atoi(v);
        else if (strcmp(k, "--rows") == 0)
            s->rows = atoi(v);
        else if (strcmp(k, "--out") == 0)
            snprintf(s->out, sizeof s->out, "%s", v);
        else
            return -1;
    }
    return s->n >= 1 && s->n <= 16384 && s->rounds >= 1 && s->rows >= 1 ? 0 : -1;
}

static void band(task *s, int r0, int r1)
{
    int n = s->n;
    for (int i = r0; i < r1; i++) {
        float *ci = s->c + (size_t)i * (size_t)n;
        for (int k = 0; k < n; k++) {
            float aik = s->a[(size_t)i * (size_t)n + (size_t)k];
            const float *bk = s->b + (size_t)k * (size_t)n;
            for (int j = 0; j < n; j++)
                ci[j] += aik * bk[j];
        }
    }
}

static tide_status t_init(void **state, int argc, char **argv, const tide_task_env *env)
{
    (void)env;
    task *s = calloc(1, sizeof *s);
    if (s == NULL)
        return TIDE_ERR_NOMEM;
    s->n = 256;
    s->rounds = 20;
    s->rows = 8;
    if (parse(s, argc, argv) != 0) {
        fprintf(stderr, "task_matmul: usage: [--n N] [--rounds R] [--rows K] [--out FILE]\n");
        free(s);
        return TIDE_ERR_INVALID;
    }
    size_t nn = (size_t)s->n * (size_t)s->n;
    s->a = malloc(nn * sizeof *s->a);
    s->b = malloc(nn * sizeof *s->b);
    s->c = calloc(nn, sizeof *s->c);
    if (s->a == NULL || s->b == NULL || s->c == NULL) {
        free(s->a);
        free(s->b);
        free(s->c);
        free(s);
        return TIDE_ERR_NOMEM;
    }
    for (size_t i = 0; i < nn; i++) {
        s->a[i] = value(i);
        s->b[i] = value(i + nn);
    }
    /* A first estimate from one band into scratch rows of C, undone at once: the
       runtime needs one before the task's first step may go into a bubble. */
    int r1 = s->rows < s->n ? s->rows : s->n;
    double t0 = now_ms();
    band(s, 0, r1);
    s->est_ms = now_ms() - t0;
    memset(s->c, 0, (size_t)r1 * (size_t)s->n * sizeof *s->c);
    *state = s;
    return TIDE_OK;
}

static double checksum(const task *s)
{
    double sum = 0;
    for (size_t i = 0; i < (size_t)s->n * (size_t)s->n; i++)
        sum += (double)s->c[i] * (double)((i % 7) + 1);
    return sum;
}

static tide_status t_step(void *state, int *done, double *progress)
{
    task *s = state;
    int r1 = s->row + s->rows < s->n ? s->row + s->rows : s->n;
    double t0 = now_ms();
    band(s, s->row, r1);
    double ms = now_ms() - t0;
    s->est_ms = 0.8 * s->est_ms + 0.2 * ms;
    s->row = r1;
    if (s->row == s->n) {
        s->row = 0;
        s->round++;
    }
    *progress = ((double)s->round * s->n + s->row) / ((double)s->rounds * s->n);
    if (s->round < s->rounds)
        return TIDE_OK;
    *done = 1;
    if (s->out[0] != '\0') {
        FILE *f = fopen(s->out, "w");
        if (f == NULL)
            return TIDE_ERR_IO;
        fprintf(f, "%d %d %.17g\n", s->rounds, s->n, checksum(s));
        if (fclose(f) != 0)
            return TIDE_ERR_IO;
    }
    return TIDE_OK;
}

static tide_status t_save(void *state, void **out, size_t *len)
{
    task *s = state;
    size_t nn = (size_t)s->n * (size_t)s->n;
    blob h = {BLOB_MAGIC, s->n, s->rounds, s->round, s->row};
    char *b = malloc(sizeof h + nn * sizeof *s->c);
    if (b == NULL)
        return TIDE_ERR_NOMEM;
    memcpy(b, &h, sizeof h);
    memcpy(b + sizeof h, s->c, nn * sizeof *s->c);
    *out = b;
    *len = sizeof h + nn * sizeof *s->c;
    return TIDE_OK;
}

static tide_status t_restore(void *state, const void *data, size_t len)
{
    task *s = state;
    size_t nn = (size_t)s->n * (size_t)s->n;
    blob h;
    if (len != sizeof h + nn * sizeof *s->c)
        return TIDE_ERR_INVALID;
    memcpy(&h, data, sizeof h);
    if (h.magic != BLOB_MAGIC || h.n != s->n || h.rounds != s->rounds || h.round < 0 ||
        h.round > s->rounds || h.row < 0 || h.row >= s->n)
        return TIDE_ERR_INVALID; /* another job's blob, or these arguments changed */
    memcpy(s->c, (const char *)data + sizeof h, nn * sizeof *s->c);
    s->round = h.round;
    s->row = h.row;
    return TIDE_OK;
}

static double t_estimate(void *state)
{
    const task *s = state;
    return s->est_ms;
}

static void t_fini(void *state)
{
    task *s = state;
    if (s == NULL)
        return;
    free(s->a);
    free(s->b);
    free(s->c);
    free(s);
}

static const tide_task_v1 ops = {
    TIDE_TASK_ABI_VERSION, "matmul", t_init, t_step, t_save, t_restore, t_estimate, t_fini};

/* The plugin's one exported symbol. Any thread; returns a static table. */
const tide_task_v1 *tide_task_v1_get(void);
const tide_task_v1 *tide_task_v1_get(void)
{
    return &ops;
}
