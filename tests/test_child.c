/*
 * Unit tests for coordinator/child: commands run beside tided's loop. Output and exit
 * status come back, a command that cannot run is refused at start, a deadline kills the
 * whole process group (what the command started too), output past the cap is dropped
 * without blocking the child, the folder is the one asked for, tided's own descriptors
 * do not reach the child, and destroying a running child leaves no process. Each test
 * runs real processes for milliseconds.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "coordinator/child.h"

/* Polls c until it ends (fails the test after 10 s). */
static void finish(tide_child_t *c)
{
    uint64_t end = tide_now_ns() + 10000000000ull;
    while (!tide_child_poll(c, tide_now_ns())) {
        cr_assert(tide_now_ns() < end, "the child did not end within 10 s");
        tide_sleep_ms(2);
    }
}

/* 1 while pid runs (a zombie waiting for its reaper does not count: it is dead). */
static int alive(long pid)
{
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *end = strrchr(stat, ')'); /* "pid (comm) S ..." */
    return end != NULL && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
}

Test(child, output_and_exit_status)
{
    char *argv[] = {"sh", "-c", "echo out; echo err >&2; printf 'last line\\n\\n'; exit 3", NULL};
    tide_child_t *c = NULL;
    cr_assert_eq(tide_child_start(&c, argv, NULL, 5000), TIDE_OK);
    finish(c);
    cr_assert_eq(tide_child_how(c), TIDE_CHILD_EXITED);
    cr_assert_eq(tide_child_code(c), 3);
    size_t len = 0;
    const char *out = tide_child_output(c, &len);
    cr_assert_str_eq(out, "out\nerr\nlast line\n\n");
    cr_assert_eq(len, strlen(out));
    char line[64];
    tide_child_last_line(c, line, sizeof line);
    cr_assert_str_eq(line, "last line");
    tide_child_last_line(c, line, 5);
    cr_assert_str_eq(line, "last");
    tide_child_destroy(&c);
    cr_assert_null(c);
    tide_child_destroy(&c); /* NULL is fine */
}

Test(child, refuses_what_cannot_run)
{
    char *argv[] = {"tide-no-such-command-here", NULL};
    tide_child_t *c = NULL;
    cr_assert_eq(tide_child_start(&c, argv, NULL, 1000), TIDE_ERR_NOT_FOUND);
    cr_assert_null(c);
    char *empty[] = {NULL};
    cr_assert_eq(tide_child_start(&c, empty, NULL, 1000), TIDE_ERR_INVALID);
    char *sh[] = {"sh", "-c", "true", NULL};
    cr_assert_neq(tide_child_start(&c, sh, "/no/such/folder", 1000), TIDE_OK);
    cr_assert_null(c);
}

Test(child, deadline_kills_the_process_group)
{
    char pidfile[] = "/tmp/tide-child-XXXXXX";
    int fd = mkstemp(pidfile);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "sleep 30 & echo $! > %s; wait", pidfile);
    char *argv[] = {"sh", "-c", cmd, NULL};
    tide_child_t *c = NULL;
    uint64_t t0 = tide_now_ns();
    cr_assert_eq(tide_child_start(&c, argv, NULL, 200), TIDE_OK);
    finish(c);
    cr_assert_eq(tide_child_how(c), TIDE_CHILD_TIMEOUT);
    cr_assert_lt(tide_now_ns() - t0, 5000000000ull, "the deadline was not kept");
    FILE *f = fopen(pidfile, "r");
    long grandchild = 0;
    cr_assert(f != NULL && fscanf(f, "%ld", &grandchild) == 1);
    fclose(f);
    unlink(pidfile);
    for (int i = 0; i < 500 && alive(grandchild); i++)
        tide_sleep_ms(2);
    cr_assert(!alive(grandchild), "what the command started outlived its deadline");
    tide_child_destroy(&c);
}

Test(child, output_past_the_cap_is_dropped)
{
    /* 4 times the cap: the child never blocks on a full pipe */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "head -c %u /dev/zero | tr '\\0' x; echo; echo end",
             4 * TIDE_CHILD_OUT_MAX);
    char *argv[] = {"sh", "-c", cmd, NULL};
    tide_child_t *c = NULL;
    cr_assert_eq(tide_child_start(&c, argv, NULL, 10000), TIDE_OK);
    finish(c);
    cr_assert_eq(tide_child_how(c), TIDE_CHILD_EXITED);
    cr_assert_eq(tide_child_code(c), 0);
    size_t len = 0;
    tide_child_output(c, &len);
    cr_assert_eq(len, TIDE_CHILD_OUT_MAX);
    tide_child_destroy(&c);
}

Test(child, runs_in_the_folder_without_our_descriptors)
{
    int mine = open("/dev/null", O_RDONLY); /* not close-on-exec: closed for the child anyway */
    cr_assert_geq(mine, 3);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "pwd; [ -e /proc/self/fd/%d ] && echo open || echo closed; "
                              "read x && echo stdin || echo eof", mine);
    char *argv[] = {"sh", "-c", cmd, NULL};
    tide_child_t *c = NULL;
    cr_assert_eq(tide_child_start(&c, argv, "/tmp", 5000), TIDE_OK);
    finish(c);
    cr_assert_str_eq(tide_child_output(c, NULL), "/tmp\nclosed\neof\n");
    tide_child_destroy(&c);
    close(mine);
}

/* The pid a child running "echo $$; exec ..." printed (polls until it did). */
static long printed_pid(tide_child_t *c)
{
    long pid = 0;
    for (int i = 0; i < 5000 && pid == 0; i++) {
        cr_assert_eq(tide_child_poll(c, tide_now_ns()), 0, "the child ended early");
        pid = atol(tide_child_output(c, NULL));
        if (pid == 0)
            tide_sleep_ms(2);
    }
    cr_assert_gt(pid, 0);
    return pid;
}

Test(child, signaled_and_destroyed_while_running)
{
    char *argv[] = {"sh", "-c", "kill -TERM $$", NULL};
    tide_child_t *c = NULL;
    cr_assert_eq(tide_child_start(&c, argv, NULL, 5000), TIDE_OK);
    finish(c);
    cr_assert_eq(tide_child_how(c), TIDE_CHILD_SIGNALED);
    cr_assert_eq(tide_child_code(c), SIGTERM);
    tide_child_destroy(&c);

    /* a signal tided ignores is not ignored by the child */
    signal(SIGTERM, SIG_IGN);
    char *argv2[] = {"sh", "-c", "echo $$; exec sleep 30", NULL};
    cr_assert_eq(tide_child_start(&c, argv2, NULL, 0), TIDE_OK);
    signal(SIGTERM, SIG_DFL);
    kill((pid_t)printed_pid(c), SIGTERM);
    finish(c);
    cr_assert_eq(tide_child_how(c), TIDE_CHILD_SIGNALED);
    tide_child_destroy(&c);

    cr_assert_eq(tide_child_start(&c, argv2, NULL, 0), TIDE_OK);
    long pid = printed_pid(c);
    tide_child_destroy(&c); /* kills and reaps */
    cr_assert(!alive(pid), "a destroyed child still runs");
}
