/*
 * An offline command's memory and process limits (worker/offline_limits.c) and the keeper
 * that applies them (tide-offline-run, started by tide__child_spawn as libtide does): the
 * rlimits a command gets, the cgroup path's detection on a directory that has (or lacks)
 * the controllers' files, the reasons written when a limit ended an attempt, and real
 * attempts that allocate or fork beyond their limit.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "worker/offline_limits.h"
#include "worker/worker_int.h"
#include "tests/tmp_tree.h"

/* A fresh directory for one test's logs and marker files, removed when the test ends. */
static void tmp_dir(char *out, size_t len)
{
    cr_assert_eq(tmp_tree_new(out, len, "tide-limits"), 0, "mkdtemp: %s", strerror(errno));
}

static void put_file(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* The whole file (static buffer, "" when missing). */
static const char *slurp(const char *dir, const char *name)
{
    static char buf[65536];
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The limits are the command's own rlimits, soft and hard, set in the process that execs
   it (a forked child here: the test keeps its own). */
Test(limits, rlimits_in_the_command_process)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        tide__limits l = {.memory = 256ull << 20, .procs = 77};
        char why[256];
        if (tide__limits_rlimits(&l, why, sizeof why) != 0)
            _exit(10);
        struct rlimit as, np;
        getrlimit(RLIMIT_AS, &as);
        getrlimit(RLIMIT_NPROC, &np);
        if (as.rlim_cur != 256ull << 20 || as.rlim_max != 256ull << 20)
            _exit(11);
        if (np.rlim_cur != 77 || np.rlim_max != 77)
            _exit(12);
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    /* a limit a cgroup holds is not set again as an rlimit */
    pid = fork();
    if (pid == 0) {
        struct rlimit before;
        getrlimit(RLIMIT_AS, &before);
        tide__limits l = {.memory = 1ull << 30, .cg_memory = 1};
        char why[256];
        struct rlimit after;
        _exit(tide__limits_rlimits(&l, why, sizeof why) == 0 && getrlimit(RLIMIT_AS, &after) == 0 &&
                      after.rlim_cur == before.rlim_cur
                  ? 0
                  : 1);
    }
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The cgroup path is taken where the controllers' files are (a directory standing in for
   a cgroup), not elsewhere; what the kernel counted names the limit. */
Test(limits, cgroup_detection_and_verdict)
{
    char with[64], without[64];
    tmp_dir(with, sizeof with);
    tmp_dir(without, sizeof without);
    put_file(with, "memory.max", "max\n");
    put_file(with, "pids.max", "max\n");
    tide__limits l = {.memory = 64ull << 20, .procs = 20};
    tide__limits_cgroup(&l, with);
    cr_expect(l.cg_memory && l.cg_pids);
    cr_expect_str_eq(slurp(with, "memory.max"), "67108864");
    cr_expect_str_eq(slurp(with, "pids.max"), "20");
    char out[640];
    tide__limits_describe(&l, 1, out, sizeof out);
    cr_expect(strstr(out, "memory 64 MiB (cgroup memory.max)") != NULL, "%s", out);
    cr_expect(strstr(out, "processes 20 (cgroup pids.max)") != NULL, "%s", out);
    put_file(with, "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n");
    cr_assert_eq(tide__limits_verdict(&l, with, SIGKILL, out, sizeof out), 1);
    cr_expect(strstr(out, "killed: memory limit 64 MiB (cgroup memory.max: 1 OOM kill") != NULL,
              "%s", out);
    put_file(with, "memory.events", "oom_kill 0\n");
    put_file(with, "pids.events", "max 3\n");
    cr_assert_eq(tide__limits_verdict(&l, with, 2 << 8, out, sizeof out), 1);
    cr_expect(strstr(out, "process limit 20 reached (cgroup pids.max: 3 fork") != NULL, "%s", out);
    put_file(with, "pids.events", "max 0\n");
    cr_expect_eq(tide__limits_verdict(&l, with, 0, out, sizeof out), 0, "nothing counted: %s", out);

    tide__limits r = {.memory = 64ull << 20, .procs = 20};
    tide__limits_cgroup(&r, without);
    cr_expect(!r.cg_memory && !r.cg_pids, "no controller files: rlimits");
    tide__limits_describe(&r, 1, out, sizeof out);
    cr_expect(strstr(out, "RLIMIT_AS") != NULL && strstr(out, "NOT enforced") != NULL, "%s", out);
    tide__limits_describe(&r, 0, out, sizeof out);
    cr_expect(strstr(out, "NOT enforced") == NULL, "%s", out);
    cr_expect_eq(tide__limits_verdict(&r, NULL, 0, out, sizeof out), 0, "exit 0: no verdict");
    cr_assert_eq(tide__limits_verdict(&r, NULL, 2 << 8, out, sizeof out), 1);
    cr_expect(strstr(out, "exit 2") && strstr(out, "memory limit 64 MiB (RLIMIT_AS") &&
                  strstr(out, "process limit 20 (RLIMIT_NPROC"),
              "%s", out);
    tide__limits none = {0};
    tide__limits_describe(&none, 0, out, sizeof out);
    cr_expect_str_eq(out, "");
    cr_expect_eq(tide__limits_verdict(&none, NULL, 2 << 8, out, sizeof out), 0);
}

static int run_attempt(const char *job, char **argv, uint32_t argc, const char *log,
                       uint64_t memory, uint32_t procs)
{
    tide__child c;
    tide__child_cfg cfg = {job, argv, argc, NULL, 0, log, 1 << 20, 500, NULL, memory, procs};
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK, "%s", tide_last_error());
    uint64_t deadline = tide_now_ns() + 30000000000ull;
    int code = 9999;
    while (!tide__child_poll(&c, tide_now_ns(), &code)) {
        cr_assert_lt(tide_now_ns(), deadline, "attempt %s still running after 30 s", job);
        tide_sleep_ms(10);
    }
    return code;
}

/* An attempt allocating past --max-memory fails, and its log names the limit last (the
   line the attempt's event and tidectl logs show). */
Test(limits, attempt_beyond_its_memory_limit)
{
    setenv("TIDE_OFFLINE_CGROUP", "0", 1); /* the rlimit path, wherever this runs */
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/m.log", dir);
    /* doubles a string to 64 MiB: 96 MiB of address space at the last step */
    char *argv[] = {"awk", "BEGIN{s=\"x\"; while (length(s) < 67108864) s = s s; print \"grew\"}"};
    int code = run_attempt("m", argv, 2, log, 32ull << 20, 0);
    const char *out = slurp(dir, "m.log");
    cr_assert_neq(code, 0, "the allocation beyond the limit failed: %s", out);
    cr_expect(strstr(out, "grew") == NULL, "%s", out);
    cr_expect(strstr(out, "[tide: limits of this attempt: memory 32 MiB (RLIMIT_AS") != NULL, "%s",
              out);
    const char *last = strstr(out, "[tide: the command failed");
    cr_assert_not_null(last, "%s", out);
    cr_expect(strstr(last, "memory limit 32 MiB (RLIMIT_AS") != NULL, "%s", last);
    cr_expect(strchr(last, '\n') == out + strlen(out) - 1, "the last line: %s", out);
    /* the same command within a larger limit runs */
    code = run_attempt("m2", argv, 2, log, 512ull << 20, 0);
    out = slurp(dir, "m.log");
    cr_expect_eq(code, 0, "%s", out);
    cr_expect(strstr(out, "grew") != NULL && strstr(out, "the command failed") == NULL, "%s", out);
}

/* An attempt forking past --max-procs (a bounded loop of 50 sleeps) is refused its forks
   and says so. RLIMIT_NPROC does not bind root: as root, the command runs as nobody
   through setpriv, which keeps the rlimit the keeper set before exec. */
Test(limits, attempt_beyond_its_process_limit)
{
    setenv("TIDE_OFFLINE_CGROUP", "0", 1);
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/p.log", dir);
    const char *loop = "i=0; while [ $i -lt 50 ]; do sleep 2 & i=$((i+1)); done; wait; echo all";
    char *as_nobody[] = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh",
                         "-c",      (char *)loop};
    char *as_self[] = {"/bin/sh", "-c", (char *)loop};
    int root = geteuid() == 0;
    if (root && access("/usr/bin/setpriv", X_OK) != 0 && access("/bin/setpriv", X_OK) != 0)
        cr_skip_test("root without setpriv: RLIMIT_NPROC cannot bind the command");
    int code = root ? run_attempt("p", as_nobody, 7, log, 0, 10)
                    : run_attempt("p", as_self, 3, log, 0, 10);
    const char *out = slurp(dir, "p.log");
    cr_assert_neq(code, 0, "forks beyond 10 processes were refused: %s", out);
    cr_expect(strstr(out, "all\n") == NULL, "%s", out);
    cr_expect(strstr(out, "processes 10 (RLIMIT_NPROC") != NULL, "%s", out);
    if (root)
        cr_expect(strstr(out, "NOT enforced while the command runs as root") != NULL, "%s", out);
    const char *last = strstr(out, "[tide: the command failed");
    cr_assert_not_null(last, "%s", out);
    cr_expect(strstr(last, "process limit 10 (RLIMIT_NPROC") != NULL, "%s", last);
}

/* A command whose last output has no newline (a progress line redrawn with \r, a process
   killed mid-line): the keeper's verdict still is a line of its own, the log's last, so
   that the attempt's event, which quotes the last line, starts with it. */
Test(limits, verdict_on_a_line_of_its_own)
{
    setenv("TIDE_OFFLINE_CGROUP", "0", 1);
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/n.log", dir);
    char *argv[] = {"/bin/sh", "-c", "printf 'step 1\\rstep 2\\rstep 3'; exit 3"};
    int code = run_attempt("n", argv, 3, log, 256ull << 20, 0);
    const char *out = slurp(dir, "n.log");
    cr_assert_eq(code, 3, "%s", out);
    cr_expect(strstr(out, "\rstep 3\n[tide: the command failed (exit 3) under memory limit "
                          "256 MiB") != NULL,
              "%s", out);
    const char *last = strrchr(out, '\r'); /* the progress line ends where the verdict starts */
    cr_assert_not_null(last);
    cr_expect_eq(strchr(last, '\n')[1], '[', "%s", out);
    cr_expect_eq(out[strlen(out) - 1], '\n', "%s", out);
    /* output ending in a newline gets no empty line before the verdict */
    char *lines[] = {"/bin/sh", "-c", "echo done; exit 4"};
    code = run_attempt("n2", lines, 3, log, 256ull << 20, 0);
    out = slurp(dir, "n.log");
    cr_assert_eq(code, 4, "%s", out);
    cr_expect(strstr(out, "done\n[tide: the command failed (exit 4)") != NULL, "%s", out);
}
