/*
 * Temporary directories of tests: a fresh one under /tmp, removed with everything in it
 * when the process that made it exits (Criterion runs each test in a process of its own,
 * so a test's directory goes when the test ends, passed or failed), and the removal of a
 * tree. Header-only, like ctl_fixture.h. A test's own thread only.
 */
#ifndef TIDE_TESTS_TMP_TREE_H
#define TIDE_TESTS_TMP_TREE_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TMP_TREE_MAX 16 /* directories one process removes at its exit */

static char tmp_tree_dirs[TMP_TREE_MAX][64];
static int tmp_tree_n;
static pid_t tmp_tree_pid;

static inline int tmp_tree_remove(const char *path, const struct stat *sb, int flag,
                                  struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path); /* best effort: what cannot go stays */
    return 0;
}

/* Removes dir and everything below it, depth first, following no link and staying on
 * dir's file system (a mount left below it is not entered). Blocks on the file system. */
static inline void tmp_tree_rm(const char *dir)
{
    nftw(dir, tmp_tree_remove, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

static inline void tmp_tree_at_exit(void)
{
    if (getpid() != tmp_tree_pid) /* a forked child exiting leaves its parent's dirs */
        return;
    for (int i = 0; i < tmp_tree_n; i++)
        tmp_tree_rm(tmp_tree_dirs[i]);
}

/* Makes /tmp/PREFIX-XXXXXX into out (len bytes); returns 0, or -1 when mkdtemp failed.
 * The directory and what it holds are removed when this process exits normally. */
static inline int tmp_tree_new(char *out, size_t len, const char *prefix)
{
    if ((size_t)snprintf(out, len, "/tmp/%s-XXXXXX", prefix) >= len || mkdtemp(out) == NULL)
        return -1;
    if (tmp_tree_n == 0 || tmp_tree_pid != getpid()) {
        tmp_tree_n = 0;
        tmp_tree_pid = getpid();
        atexit(tmp_tree_at_exit);
    }
    if (tmp_tree_n < TMP_TREE_MAX &&
        (size_t)snprintf(tmp_tree_dirs[tmp_tree_n], sizeof tmp_tree_dirs[0], "%s", out) <
            sizeof tmp_tree_dirs[0])
        tmp_tree_n++;
    return 0;
}

#endif
