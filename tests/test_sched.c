/*
 * Unit tests for worker/sched: what libtide reads of a Slurm allocation from its
 * environment (a launch outside Slurm reports none; a bad job id none; a value the
 * protocol cannot carry is left out or cut), TIDE_LEAVE_SIGNAL's values, and the leave
 * signal: caught by every runtime of the process, counted per runtime, chained to the
 * program's own handler and given back when the last runtime goes. In-process, ms.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "worker/sched.h"

static const char *const slurm_vars[] = {"SLURM_JOB_ID",       "SLURM_JOBID",
                                         "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                                         "SLURMD_NODENAME",    "SLURM_STEP_GPUS",
                                         "SLURM_JOB_GPUS",     "SLURM_JOB_PARTITION",
                                         "SLURM_RESTART_COUNT"};

static void clear_slurm(void)
{
    for (size_t i = 0; i < sizeof slurm_vars / sizeof slurm_vars[0]; i++)
        unsetenv(slurm_vars[i]);
}

TestSuite(sched, .init = clear_slurm, .fini = clear_slurm);

Test(sched, outside_slurm_no_allocation)
{
    tide_proto_alloc_t a;
    memset(&a, 'x', sizeof a);
    tide__sched_alloc(&a);
    cr_expect_str_eq(a.sched, "");
    cr_expect_str_eq(a.id, "");
    cr_expect_str_eq(a.nodes, "");
    cr_expect_eq(a.restarts, 0);
}

Test(sched, a_slurm_launch_reports_its_allocation)
{
    setenv("SLURM_JOB_ID", "4321", 1);
    setenv("SLURM_JOB_NODELIST", "h[1-2]", 1);
    setenv("SLURMD_NODENAME", "h2", 1);
    setenv("SLURM_JOB_GPUS", "0,1,2,3", 1);
    setenv("SLURM_STEP_GPUS", "2,3", 1); /* the step's own win */
    setenv("SLURM_JOB_PARTITION", "low", 1);
    setenv("SLURM_RESTART_COUNT", "2", 1);
    tide_proto_alloc_t a;
    tide__sched_alloc(&a);
    cr_expect_str_eq(a.sched, "slurm");
    cr_expect_str_eq(a.id, "4321");
    cr_expect_str_eq(a.nodes, "h[1-2]");
    cr_expect_str_eq(a.node, "h2");
    cr_expect_str_eq(a.gpus, "2,3");
    cr_expect_str_eq(a.partition, "low");
    cr_expect_eq(a.restarts, 2);
    /* older names, no GPUs, a restart count that is not one */
    clear_slurm();
    setenv("SLURM_JOBID", "77_3", 1);
    setenv("SLURM_NODELIST", "gpu01", 1);
    setenv("SLURM_RESTART_COUNT", "-1", 1);
    tide__sched_alloc(&a);
    cr_expect_str_eq(a.id, "77_3");
    cr_expect_str_eq(a.nodes, "gpu01");
    cr_expect_str_eq(a.gpus, "");
    cr_expect_eq(a.restarts, 0);
    cr_expect_neq(a.node[0], '\0', "the host's name stands in for SLURMD_NODENAME");
}

Test(sched, what_the_protocol_cannot_carry_is_left_out)
{
    setenv("SLURM_JOB_ID", "12; rm -rf", 1);
    tide_proto_alloc_t a;
    tide__sched_alloc(&a);
    cr_expect_str_eq(a.sched, "", "a job id that is none");
    setenv("SLURM_JOB_ID", "12", 1);
    setenv("SLURM_JOB_PARTITION", "low prio", 1);
    char big[3000];
    memset(big, 'h', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    setenv("SLURM_JOB_NODELIST", big, 1);
    tide__sched_alloc(&a);
    cr_expect_str_eq(a.id, "12");
    cr_expect_str_eq(a.partition, "", "a value with a space");
    cr_expect_eq(strlen(a.nodes), sizeof a.nodes - 1);
    cr_expect_str_eq(a.nodes + strlen(a.nodes) - 3, "...", "a cut hostlist says so");
}

Test(sched, leave_signal_values)
{
    int s = -1;
    cr_expect_eq(tide__sched_signal_parse(NULL, &s), TIDE_OK);
    cr_expect_eq(s, 0);
    cr_expect_eq(tide__sched_signal_parse("", &s), TIDE_OK);
    cr_expect_eq(s, 0);
    cr_expect_eq(tide__sched_signal_parse("USR1", &s), TIDE_OK);
    cr_expect_eq(s, SIGUSR1);
    cr_expect_eq(tide__sched_signal_parse("sigusr2", &s), TIDE_OK);
    cr_expect_eq(s, SIGUSR2);
    cr_expect_eq(tide__sched_signal_parse("1", &s), TIDE_OK);
    cr_expect_eq(s, SIGHUP);
    cr_expect_eq(tide__sched_signal_parse("TERM", &s), TIDE_ERR_INVALID);
    cr_expect_eq(tide__sched_signal_parse("KILL", &s), TIDE_ERR_INVALID);
    cr_expect_eq(tide__sched_signal_parse("9", &s), TIDE_ERR_INVALID);
    cr_expect_eq(tide__sched_signal_parse("USR1x", &s), TIDE_ERR_INVALID);
}

static volatile sig_atomic_t program_saw;

static void program_handler(int signo)
{
    (void)signo;
    program_saw++;
}

Test(sched, leave_signal_is_counted_per_runtime_and_chained)
{
    signal(SIGUSR2, program_handler);
    unsigned a = 0, b = 0;
    cr_assert_eq(tide__sched_signal_catch(SIGUSR2, &a), TIDE_OK);
    cr_assert_eq(tide__sched_signal_catch(SIGUSR2, &b), TIDE_OK); /* a second runtime */
    unsigned c = 0;
    cr_expect_eq(tide__sched_signal_catch(SIGUSR1, &c), TIDE_ERR_BUSY);
    cr_expect_eq(tide__sched_signal_take(&a), 0);
    raise(SIGUSR2);
    cr_expect_eq(program_saw, 1, "the program's own handler was not called");
    cr_expect_eq(tide__sched_signal_take(&a), 1);
    cr_expect_eq(tide__sched_signal_take(&a), 0);
    cr_expect_eq(tide__sched_signal_take(&b), 1, "each runtime sees the signal");
    tide__sched_signal_release(SIGUSR2);
    raise(SIGUSR2);
    cr_expect_eq(tide__sched_signal_take(&a), 1, "still caught while a runtime catches it");
    tide__sched_signal_release(SIGUSR2);
    struct sigaction now;
    sigaction(SIGUSR2, NULL, &now);
    cr_expect(now.sa_handler == program_handler, "the program's disposition was not put back");
    raise(SIGUSR2);
    cr_expect_eq(program_saw, 3);
    cr_expect_eq(tide__sched_signal_take(&a), 0);
    cr_expect_eq(tide__sched_signal_catch(0, &c), TIDE_OK); /* none asked: nothing caught */
    tide__sched_signal_release(0);
    signal(SIGUSR2, SIG_DFL);
}
