/*
 * Where the benchmarks write: the results file (--out, bench-out/<name>.json by
 * default) and scratch folders, each created under a parent folder that may not exist
 * yet. Header-only, static functions. Workload: a few calls per benchmark run.
 */
#ifndef TIDE_BENCHMARKS_BENCH_OUT_H
#define TIDE_BENCHMARKS_BENCH_OUT_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Creates the folder that holds path (its last component excluded; one level, as
   bench-out/ in the defaults) when missing. Never fails: a folder that cannot be made
   shows up as the caller's open or mkdir error. Blocks briefly; any thread. */
static inline void bench_make_parent(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        mkdir(dir, 0755);
    }
}

/* Opens path for writing the numbers, creating its folder first; NULL with the reason
   on stderr, prefixed with prog. The caller fcloses. Blocks briefly; any thread. */
static inline FILE *bench_out_open(const char *prog, const char *path)
{
    bench_make_parent(path);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        fprintf(stderr, "%s: cannot write %s: %s\n", prog, path, strerror(errno));
    return f;
}

#endif /* TIDE_BENCHMARKS_BENCH_OUT_H */
