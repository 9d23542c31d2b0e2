/*
 * libtide's offline command runner: a command's exit code, environment (no MPI variables),
 * output kept per attempt with a cap, preemption (SIGTERM, the job's grace, then SIGKILL),
 * nothing of it (setsid grandchildren included) surviving a preemption or the worker; then
 * the same runner behind the control client, against a fake tided (tests/ctl_fixture.h):
 * assignments reported and preempted, a memory limit, the device a command sees, and a
 * leaving worker giving its command its grace.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/ctl_fixture.h"
#include "tests/tmp_tree.h"

/* ---- the runner ----------------------------------------------------------------------------- */

static int wait_child(tide__child *c, int timeout_ms)
{
    uint64_t deadline = tide_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int code = 9999;
    while (!tide__child_poll(c, tide_now_ns(), &code)) {
        cr_assert_lt(tide_now_ns(), deadline, "child still running after %d ms", timeout_ms);
        tide_sleep_ms(5);
    }
    return code;
}

/* A fresh directory for one test's logs and marker files, removed when the test ends. */
static void tmp_dir(char *out, size_t len)
{
    cr_assert_eq(tmp_tree_new(out, len, "tide-child"), 0, "mkdtemp: %s", strerror(errno));
}

static tide__child_cfg child_cfg(const char *job, char **argv, uint32_t argc, const char *log,
                                 int grace_ms, const char *cgroup)
{
    tide__child_cfg c = {job, argv, argc, NULL, 0, log, 1 << 20, grace_ms, cgroup, 0, 0};
    return c;
}

/* The whole file at path (NUL-terminated, tide_malloc'd; "" when missing). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 1 << 21);
    cr_assert_not_null(buf);
    if (f != NULL) {
        size_t n = fread(buf, 1, (1 << 21) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* The pid written in the file at path, waiting for it up to 3 s. */
static pid_t read_pid(const char *path)
{
    for (int i = 0; i < 300; i++) {
        char *s = slurp(path);
        long v = atol(s);
        free(s);
        if (v > 0)
            return (pid_t)v;
        tide_sleep_ms(10);
    }
    cr_assert_fail("no pid in %s", path);
    return -1;
}

/* True when pid is gone (or a zombie nobody reaped yet). */
static int gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && (p[2] == 'Z' || p[2] == 'X');
}

static int gone_within(pid_t pid, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (gone(pid))
            return 1;
        tide_sleep_ms(10);
    }
    return gone(pid);
}

Test(child, exit_codes_env_and_no_mpi_variables)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/a.log", dir);
    /* the worker is an MPI rank: its runtime's variables must not reach the command,
       which may use MPI itself */
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_MCA_ess", "pmi", 1);
    setenv("PMIX_RANK", "3", 1);
    setenv("PMIX_NAMESPACE", "prterun-x-1@1", 1);
    setenv("PMI_RANK", "3", 1);
    setenv("OPAL_PREFIX", "/nowhere", 1);
    setenv("TIDE_KEEP_ME", "yes", 1);
    tide__child c;
    char *argv[] = {"/bin/sh", "-c",
                    "test \"$TIDE_OFFLINE_JOB\" = j1 || exit 1; test \"$TIDE_KEEP_ME\" = yes || "
                    "exit 2; env | grep -E '^(OMPI_|PMIX_|PMI_|OPAL_)' && exit 4; "
                    "if command -v mpirun >/dev/null; then mpirun --allow-run-as-root "
                    "--oversubscribe -np 1 /bin/echo mpi-ok || exit 5; fi; exit 3"};
    char *env[] = {"TIDE_OFFLINE_JOB=j1"};
    tide__child_cfg cfg = child_cfg("j1", argv, 3, log, 1000, NULL);
    cfg.env = env;
    cfg.n_env = 1;
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK, "%s", tide_last_error());
    int code = wait_child(&c, 20000);
    char *out = slurp(log);
    cr_assert_eq(code, 3, "exit status %d; output: %s", code, out);
    free(out);
    char *ok[] = {"true"};
    cfg = child_cfg("j2", ok, 1, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 5000), 0);
    /* a program that cannot start: 127, and the reason in the attempt's log */
    char *bad[] = {"/nonexistent/tide-no-such-program"};
    cfg = child_cfg("j3", bad, 1, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 5000), 127);
    out = slurp(log);
    cr_assert(strstr(out, "cannot start /nonexistent/tide-no-such-program") != NULL, "%s", out);
    free(out);
    cfg = child_cfg("j4", bad, 0, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_ERR_INVALID);
    cr_expect_eq(tide__offline_env_keep("OMPI_COMM_WORLD_SIZE=2"), 0);
    cr_expect_eq(tide__offline_env_keep("PMIX_SERVER_URI41=x"), 0);
    cr_expect_eq(tide__offline_env_keep("PMI_FD=3"), 0);
    cr_expect_eq(tide__offline_env_keep("MPI_LOCALRANKID=0"), 0);
    cr_expect_eq(tide__offline_env_keep("PATH=/bin"), 1);
    cr_expect_eq(tide__offline_env_keep("MPI_LOCALRANKIDX=0"), 1);
    cr_expect_eq(tide__offline_env_keep("CUDA_VISIBLE_DEVICES=1"), 1);
}

/* Whether process pid ignores signal sig (its SigIgn mask in /proc). */
static int ignores(int pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "SigIgn: %llx", &mask) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return (mask & (1ull << (sig - 1))) != 0;
}

/* Whether a child of process pid (the offline supervisor: its child is the command)
   ignores signal sig within ms. */
static int wait_child_ignores(int pid, int sig, int ms)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
    for (int waited = 0; waited < ms; waited += 10) {
        FILE *f = fopen(path, "r");
        int child = 0, found = 0;
        while (f != NULL && !found && fscanf(f, "%d", &child) == 1)
            found = ignores(child, sig);
        if (f != NULL)
            fclose(f);
        if (found)
            return 1;
        tide_sleep_ms(10);
    }
    return 0;
}

Test(child, preempt_sigterm_then_sigkill_after_grace)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/p.log", dir);
    tide__child c;
    char *polite[] = {"sleep", "30"};
    tide__child_cfg cfg = child_cfg("p", polite, 2, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    tide_sleep_ms(50);
    tide__child_preempt(&c, 2000, tide_now_ns());
    cr_assert_eq(wait_child(&c, 1500), -SIGTERM, "a polite child dies of SIGTERM at once");

    /* a child that ignores SIGTERM is killed when the grace period ends, with its group */
    char *stubborn[] = {"/bin/sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"};
    cfg = child_cfg("s", stubborn, 3, log, 1000, NULL);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    /* the shell installed its trap (a fixed 100 ms was too short for a loaded ASan run) */
    cr_assert(wait_child_ignores(c.pid, SIGTERM, 10000), "the shell never ignored SIGTERM");
    uint64_t t0 = tide_now_ns();
    tide__child_preempt(&c, 300, t0);
    int code = wait_child(&c, 3000);
    uint64_t ms = (tide_now_ns() - t0) / 1000000ull;
    cr_assert_eq(code, -SIGKILL, "code %d", code);
    cr_assert_geq(ms, 280, "SIGKILL only after the grace period (%llu ms)", (unsigned long long)ms);
    cr_assert_lt(ms, 2000);
}

/* A command whose grandchild leaves its process group and session (setsid), ignoring
   SIGTERM: preempted, nothing of it survives; the grandchild got SIGTERM first. */
static void setsid_grandchild_does_not_survive(const char *cgroup)
{
    char dir[64], log[128], script[600];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/g.log", dir);
    snprintf(script, sizeof script,
             "setsid /bin/sh -c 'trap \"echo term >> %s/gc.term\" TERM; echo $$ > %s/gc.pid; "
             "while :; do sleep 0.05; done' & echo $$ > %s/c.pid; wait",
             dir, dir, dir);
    char *argv[] = {"/bin/sh", "-c", script};
    tide__child c;
    tide__child_cfg cfg = child_cfg("g", argv, 3, log, 1000, cgroup);
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK, "%s", tide_last_error());
    char path[160];
    snprintf(path, sizeof path, "%s/gc.pid", dir);
    pid_t gc = read_pid(path);
    snprintf(path, sizeof path, "%s/c.pid", dir);
    pid_t ch = read_pid(path);
    cr_assert_neq(getsid(gc), getsid(ch), "the grandchild runs in a session of its own");
    tide__child_preempt(&c, 400, tide_now_ns());
    wait_child(&c, 5000);
    cr_assert(gone_within(gc, 2000), "the setsid grandchild %d survived the preemption", (int)gc);
    cr_assert(gone(ch));
    snprintf(path, sizeof path, "%s/gc.term", dir);
    char *t = slurp(path);
    cr_expect(strstr(t, "term") != NULL, "the grandchild got SIGTERM before SIGKILL");
    free(t);
    if (cgroup != NULL) {
        struct stat sb;
        cr_expect_neq(stat(cgroup, &sb), 0, "the attempt's cgroup %s is removed", cgroup);
    }
}

Test(child, setsid_grandchild_does_not_survive_preemption_subreaper)
{
    setsid_grandchild_does_not_survive(NULL);
}

Test(child, setsid_grandchild_does_not_survive_preemption_cgroup)
{
    char parent[1024], why[512];
    if (!tide__offline_cgroup_parent(parent, sizeof parent, why, sizeof why)) {
        cr_skip_test("no writable cgroup v2 here: %s", why);
        return;
    }
    char cg[1200];
    snprintf(cg, sizeof cg, "%s/tide-test-%d", parent, (int)getpid());
    setsid_grandchild_does_not_survive(cg);
}

/* The worker dies (SIGKILL, no chance to clean up): its command gets SIGTERM, the grace,
   and nothing of it survives, so tided may run the job elsewhere without two copies. */
Test(child, nothing_survives_the_workers_death)
{
    char dir[64], log[128], script[700];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/d.log", dir);
    snprintf(script, sizeof script,
             "trap 'echo term > %s/c.term; exit 0' TERM; setsid /bin/sh -c 'trap \"\" TERM; "
             "echo $$ > %s/gc.pid; while :; do sleep 0.05; done' & echo $$ > %s/c.pid; "
             "while :; do sleep 0.05; done",
             dir, dir, dir);
    char parent[1024], why[512], cg[1200] = "";
    if (tide__offline_cgroup_parent(parent, sizeof parent, why, sizeof why))
        snprintf(cg, sizeof cg, "%s/tide-test-%d", parent, (int)getpid());
    pid_t worker = fork();
    cr_assert_geq(worker, 0);
    if (worker == 0) {
        char *argv[] = {"/bin/sh", "-c", script};
        tide__child c;
        tide__child_cfg cfg = child_cfg("d", argv, 3, log, 300, cg[0] ? cg : NULL);
        if (tide__child_spawn(&c, &cfg) != TIDE_OK)
            _exit(1);
        for (;;)
            pause();
    }
    char path[160];
    snprintf(path, sizeof path, "%s/gc.pid", dir);
    pid_t gc = read_pid(path);
    snprintf(path, sizeof path, "%s/c.pid", dir);
    pid_t ch = read_pid(path);
    kill(worker, SIGKILL);
    int st;
    waitpid(worker, &st, 0);
    cr_assert(gone_within(ch, 3000), "the command %d outlived its worker", (int)ch);
    cr_assert(gone_within(gc, 3000), "the setsid grandchild %d outlived the worker", (int)gc);
    snprintf(path, sizeof path, "%s/c.term", dir);
    char *t = slurp(path);
    cr_expect(strstr(t, "term") != NULL, "the command got SIGTERM, not only SIGKILL");
    free(t);
    t = slurp(log);
    cr_expect(strstr(t, "the worker is gone") != NULL, "%s", t);
    free(t);
}

/* Output goes to the attempt's file, capped: past the cap, a marker and nothing more. */
Test(child, output_is_kept_per_attempt_with_a_cap)
{
    char dir[64], log[128];
    tmp_dir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/o.log", dir);
    char *argv[] = {"/bin/sh", "-c",
                    "echo first-line; echo to-stderr >&2; i=0; while [ $i -lt 3000 ]; do "
                    "echo 0123456789012345678901234567890123456789; i=$((i+1)); done; "
                    "echo last-line"};
    tide__child c;
    tide__child_cfg cfg = child_cfg("o", argv, 3, log, 1000, NULL);
    cfg.log_cap = 10000;
    cr_assert_eq(tide__child_spawn(&c, &cfg), TIDE_OK);
    cr_assert_eq(wait_child(&c, 10000), 0);
    char *out = slurp(log);
    size_t n = strlen(out);
    cr_assert(strstr(out, "first-line\n") == out, "%.80s", out);
    cr_assert(strstr(out, "to-stderr") != NULL, "stderr is in the same file");
    cr_assert(strstr(out, "output cap of 10000 bytes reached") != NULL, "%s", out + 9900);
    cr_assert(strstr(out, "last-line") == NULL, "nothing past the cap is kept");
    cr_assert_lt(n, 10000 + 300, "the file holds %zu bytes", n);
    cr_assert(strstr(out, "bytes of output discarded in all") != NULL);
    free(out);
}

/* ---- behind the control client --------------------------------------------------------- */

static void send_assign(fake *f, const char *job, char **argv, uint32_t argc, int grace_ms)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_ASSIGN);
    snprintf(m.u.offline_assign.job, sizeof m.u.offline_assign.job, "%s", job);
    m.u.offline_assign.kind = TIDE_JOB_COMMAND;
    m.u.offline_assign.argv = argv;
    m.u.offline_assign.argc = argc;
    m.u.offline_assign.attempt = 2;
    m.u.offline_assign.grace_ms = grace_ms;
    fake_send(f, &m);
}

Test(ctl, offline_command_reported_and_preempted)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv1[] = {"/bin/sh", "-c", "echo said-something; exit 5"};
    send_assign(&f, "off1", argv1, 3, 1000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    cr_assert_eq(st.u.offline_status.attempt, 2);
    char want[160];
    snprintf(want, sizeof want, "%s/off1.2.%d.log", dir, (int)getpid());
    cr_assert_str_eq(st.u.offline_status.log, want, "one file per job, attempt and worker");
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_str_eq(st.u.offline_status.job, "off1");
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_FAILED);
    cr_assert_eq(st.u.offline_status.exit_code, 5);
    cr_assert_str_eq(st.u.offline_status.tail, "said-something\n", "the end reports the output");
    tide_msg_clear(&st);

    char *argv2[] = {"/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"};
    send_assign(&f, "off2", argv2, 3, 1000);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    char job[64];
    int pid = tide__ctl_offline_pid(ctl, job, sizeof job);
    cr_assert_gt(pid, 0);
    cr_assert_str_eq(job, "off2");
    /* running is reported at the spawn: on a loaded machine the shell may not have run
       its trap yet, and a SIGTERM then would end it before the test's point */
    cr_assert(wait_child_ignores(pid, SIGTERM, 10000), "the command never ignored SIGTERM");
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_PREEMPT);
    snprintf(m.u.preempt.job, sizeof m.u.preempt.job, "off2");
    m.u.preempt.grace_ms = 200;
    fake_send(&f, &m);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_PREEMPTED);
    cr_assert_eq(st.u.offline_status.exit_code, -SIGKILL, "ignored SIGTERM: killed after grace");
    tide_msg_clear(&st);
    cr_assert_eq(tide__ctl_offline_pid(ctl, NULL, 0), 0);
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
}

/* The assignment's max_memory reaches the attempt through the worker: a command allocating
   past it fails, and the report's tail (what tided's event and tidectl logs show) names the
   limit last. */
Test(ctl, offline_command_past_its_memory_limit_is_reported)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    setenv("TIDE_OFFLINE_CGROUP", "0", 1); /* the rlimit path, wherever this runs */
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv[] = {"awk", "BEGIN{s=\"x\"; while (length(s) < 67108864) s = s s; print \"grew\"}"};
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_OFFLINE_ASSIGN);
    snprintf(m.u.offline_assign.job, sizeof m.u.offline_assign.job, "hog");
    m.u.offline_assign.kind = TIDE_JOB_COMMAND;
    m.u.offline_assign.argv = argv;
    m.u.offline_assign.argc = 2;
    m.u.offline_assign.attempt = 1;
    m.u.offline_assign.grace_ms = 1000;
    m.u.offline_assign.max_memory = 32ull << 20;
    fake_send(&f, &m);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 30000);
    const char *tail = st.u.offline_status.tail;
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_FAILED, "%s", tail);
    cr_expect(strstr(tail, "grew") == NULL, "%s", tail);
    const char *last = strstr(tail, "[tide: the command failed");
    cr_assert_not_null(last, "%s", tail);
    cr_expect(strstr(last, "memory limit 32 MiB (RLIMIT_AS") != NULL, "%s", last);
    tide_msg_clear(&st);
    unsetenv("TIDE_OFFLINE_CGROUP");
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
}

/* What an offline command of a worker on local device 2 sees (CUDA_VISIBLE_DEVICES=4,5,6,7
   in the worker's environment), as its output's tail reports it. */
static char *command_sees(int kind)
{
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl_on(&f, kind, 2);
    char *argv[] = {"/bin/sh", "-c", "echo \"dev=$TIDE_OFFLINE_DEVICE vis=$CUDA_VISIBLE_DEVICES\""};
    send_assign(&f, "sees", argv, 3, 1000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_DONE, "%s", st.u.offline_status.tail);
    char *tail = strdup(st.u.offline_status.tail);
    tide_msg_clear(&st);
    tide__ctl_destroy(&ctl, 0);
    trainer_close();
    fake_close(&f);
    return tail;
}

/* The device index a command gets and the devices it sees agree: on a GPU worker it sees
   only the worker's GPU (the worker's device 2 is physical GPU 6 here), as its device 0,
   and TIDE_OFFLINE_DEVICE says 0; a CPU worker's command gets the worker's index and the
   worker's own CUDA_VISIBLE_DEVICES. */
Test(ctl, offline_command_device_index_matches_what_it_sees)
{
    char dir[64];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7", 1);
    char *gpu = command_sees(TIDE_DEVICE_GPU);
    cr_expect_str_eq(gpu, "dev=0 vis=6\n");
    free(gpu);
    char *cpu = command_sees(TIDE_DEVICE_CPU);
    cr_expect_str_eq(cpu, "dev=2 vis=4,5,6,7\n");
    free(cpu);
}

/* A worker that leaves while its command runs gives the command SIGTERM and the job's
   grace (not SIGKILL at once), reports it preempted (not failed), then says bye. */
Test(ctl, leaving_gives_the_command_sigterm_and_its_grace)
{
    char dir[64], script[300];
    tmp_dir(dir, sizeof dir);
    setenv("TIDE_LOG_DIR", dir, 1);
    snprintf(script, sizeof script,
             "trap 'sleep 0.3; echo cleaned-up > %s/term; exit 0' TERM; while :; do sleep "
             "0.05; done",
             dir);
    fake f;
    fake_open(&f);
    tide__ctl_t *ctl = start_ctl(&f);
    char *argv[] = {"/bin/sh", "-c", script};
    send_assign(&f, "leave", argv, 3, 5000);
    tide_msg_t st;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_RUNNING);
    tide_msg_clear(&st);
    tide_sleep_ms(150);
    uint64_t t0 = tide_now_ns();
    tide__ctl_destroy(&ctl, 1);
    trainer_close();
    uint64_t ms = (tide_now_ns() - t0) / 1000000ull;
    fake_expect(&f, TIDE_MSG_OFFLINE_STATUS, &st, 3000);
    cr_assert_eq(st.u.offline_status.state, TIDE_JOB_PREEMPTED);
    cr_assert_eq(st.u.offline_status.exit_code, 0, "it ended on its own after SIGTERM, got %d",
                 st.u.offline_status.exit_code);
    tide_msg_clear(&st);
    tide_msg_t bye;
    fake_expect(&f, TIDE_MSG_BYE, &bye, 3000);
    tide_msg_clear(&bye);
    char path[128];
    snprintf(path, sizeof path, "%s/term", dir);
    char *t = slurp(path);
    cr_assert(strstr(t, "cleaned-up") != NULL, "the command had its grace to clean up");
    free(t);
    cr_assert_geq(ms, 250, "destroy waited for the command (%llu ms)", (unsigned long long)ms);
    cr_assert_lt(ms, 4000, "and not for the whole grace (%llu ms)", (unsigned long long)ms);
    fake_close(&f);
}
