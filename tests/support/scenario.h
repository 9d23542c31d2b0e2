/*
 * Scenario tables for the MPI integration tests (tests/scenarios/, one header per
 * driver). A scenario is one row: its name, the ranks it runs on, its ctest timeout,
 * labels and mpirun options, the job's first layout, the layouts it is resized to, who
 * dies when, the checkpoint period, the generation the job must end in and the status
 * its training must return. A driver (one test executable) adds its own columns after
 * these (its hooks). CMake reads the same table file and registers one ctest entry per
 * row (tide_add_scenarios in cmake/TideTesting.cmake), so adding a scenario is adding a
 * line.
 *
 * A table file holds one ROW(...) per line and nothing else but comments:
 *   ROW("name", ranks, timeout_s, "labels", "mpi", "first", "resizes", "kill", ckpt_every,
 *       gen, status, driver columns...)
 * Layouts are "DPxTPxPP", then optionally ":STAGES" (inclusive layer ranges, "0-2,3-3")
 * and "/MICRO" (micro-batches per dp rank); "resizes" lists layouts separated by spaces.
 * "kill" is "WHEN [STEP] at TARGET": WHEN a word the driver knows (after, grads, ...),
 * STEP counted from the start of the generation the kill happens in, TARGET "pPdDtT" (a
 * coordinate of that generation's layout) or "rN" (pool rank N).
 *
 * Adding a scenario is adding a line. A resize-and-kill one, in
 * tests/scenarios/test_examples_tide_recover.h: 8 ranks start in (dp 2, tp 2, pp 2), are
 * resized to (dp 2, tp 1, pp 2), and 4 steps into that generation the member at
 * (pp 1, dp 1, tp 0) is SIGKILLed; generation 3 is the recovery, an idle rank taking its
 * place in the same layout (the columns after TIDE_OK are that driver's):
 *   ROW("resize-spare", 8, 150, "", "recovery", "2x2x2", "2x1x2", "after 4 at p1d1t0", 0, 3,
 *       TIDE_OK, "2x1x2", 0, 32, 24, 0, 0, 0)
 * The next configure registers test_examples_tide_recover_resize-spare (label mpi).
 */
#ifndef TIDE_TESTS_SUPPORT_SCENARIO_H
#define TIDE_TESTS_SUPPORT_SCENARIO_H

#include <stddef.h>
#include <stdio.h>

#include <tide/status.h>

#define MT_MAX_RESIZES 8
#define MT_STAGES_LEN  64

/* The generic columns of a row, as written in the table. */
typedef struct mt_row {
    const char *name;    /* ctest name: PREFIX_name (PREFIX alone for "") */
    int ranks;           /* mpirun -np */
    int timeout;         /* ctest timeout, s */
    const char *labels;  /* ctest labels besides mpi, ';'-free ("slow"), or "" */
    const char *mpi;     /* "recovery": mpirun --enable-recovery --mca async_mpi_finalize 1 */
    const char *first;   /* the first layout, "" when the scenario runs no job */
    const char *resizes; /* the layouts resized to, in order, "" for none */
    const char *kill;    /* who dies when, "" when nobody does */
    int ckpt_every;      /* steps between periodic checkpoints, 0 for none */
    int gen;             /* the generation the job ends in (0: no job) */
    tide_status status;  /* what training returns on the survivors */
} mt_row;

typedef struct mt_layout {
    int dp, tp, pp;
    int micro;                  /* micro-batches per dp rank; 0: not given */
    char stages[MT_STAGES_LEN]; /* "0-2,3-3", or "" for even stages */
} mt_layout;

typedef struct mt_kill {
    char when[16]; /* "" when nobody dies */
    int step;      /* -1 when not given */
    int rank;      /* pool rank, or -1 when the target is a coordinate */
    int p, d, t;   /* the coordinate when rank is -1 */
} mt_kill;

/* A row parsed. */
typedef struct mt_scenario {
    const mt_row *row;
    int has_first;
    mt_layout first;
    mt_layout resize[MT_MAX_RESIZES];
    int n_resizes;
    mt_kill kill;
} mt_scenario;

/* Parses "DPxTPxPP[:STAGES][/MICRO]"; TIDE_ERR_INVALID naming the text otherwise. */
tide_status mt_layout_parse(const char *s, mt_layout *out);

/* Parses a kill ("" gives when ""); TIDE_ERR_INVALID naming the text otherwise. */
tide_status mt_kill_parse(const char *s, mt_kill *out);

/* Parses the row's layouts and kill into *out (out->row = row). */
tide_status mt_scenario_parse(const mt_row *row, mt_scenario *out);

/* The layout as "DPxTPxPP[:STAGES][/MICRO]" into buf; returns buf. */
const char *mt_layout_str(const mt_layout *l, char *buf, size_t len);

/*
 * rows: an array of n driver rows of stride bytes, each beginning with its mt_row.
 * mt_rows_print writes one line per row (name, ranks, timeout, labels, mpi: what CMake
 * registers), and mt_rows_find returns the row called name, or NULL after printing the
 * names there are to stderr.
 */
void mt_rows_print(const void *rows, size_t n, size_t stride, FILE *out);
const mt_row *mt_rows_find(const void *rows, size_t n, size_t stride, const char *name);

/*
 * The usual start of a driver's main: with "--list" as argv[1], prints the table and
 * returns 1 (the caller exits 0); else finds the row named by argv[name_arg] (NULL,
 * with a usage line naming the rows on stderr, when there is none) and returns 0. A
 * table of one row named "" (a test of one scenario) takes no name: that row it is.
 */
int mt_rows_select(int argc, char **argv, int name_arg, const void *rows, size_t n, size_t stride,
                   const mt_row **out);

#define MT_ROWS_SELECT(argc, argv, name_arg, rows, out)                                            \
    mt_rows_select((argc), (argv), (name_arg), (rows), sizeof(rows) / sizeof((rows)[0]),           \
                   sizeof((rows)[0]), (out))

#endif /* TIDE_TESTS_SUPPORT_SCENARIO_H */
