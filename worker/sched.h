/*
 * worker/sched: what libtide knows of the batch scheduler its launch runs under (Slurm):
 * the allocation, read from the environment once at tide_new and sent with registration,
 * and the "leave" signal. A scheduler that will take the launch's node back (preemption,
 * a time limit) signals it ahead of time (sbatch --signal, scancel --signal); with
 * TIDE_LEAVE_SIGNAL set (tide-slurm-pools sets USR1), libtide catches that signal and its
 * control thread asks tided to shrink the job off the launch (a "leave" message), so the
 * launch goes as a planned change instead of a failure. Internal to libtide.
 */
#ifndef TIDE_WORKER_SCHED_H
#define TIDE_WORKER_SCHED_H

#include <tide/status.h>
#include "proto/proto.h"

/* Fills *out from Slurm's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURMD_NODENAME,
 * SLURM_STEP_GPUS or SLURM_JOB_GPUS, SLURM_JOB_PARTITION, SLURM_RESTART_COUNT); all empty
 * outside Slurm. A value the protocol cannot carry is left out with a warning (a job id
 * that is not one is ignored whole); never fails. Any thread; reads the environment. */
void tide__sched_alloc(tide_proto_alloc_t *out);

/* Parses a TIDE_LEAVE_SIGNAL value ("USR1", "SIGUSR1", "10") into *signo; "" or NULL: 0
 * (none). Only signals a scheduler sends as a notice are taken (USR1, USR2, HUP, URG: TERM
 * and INT must still end the program); TIDE_ERR_INVALID names them otherwise. Pure. */
tide_status tide__sched_signal_parse(const char *text, int *signo);

/* Catches signal signo (0: nothing) for the process: a handler that counts its arrivals
 * (and calls a handler the program had installed before); *seen starts at the count now.
 * The process's runtimes share one catch: TIDE_ERR_BUSY when another signal is caught
 * already. Undone by tide__sched_signal_release. Any thread, once per runtime. */
tide_status tide__sched_signal_catch(int signo, unsigned *seen);

/* 1 when the caught signal arrived since *seen (which it updates), else 0. Any thread. */
int tide__sched_signal_take(unsigned *seen);

/* This runtime stops catching signo (0: nothing); the last one puts back the disposition
 * signo had before the first catch. */
void tide__sched_signal_release(int signo);

#endif /* TIDE_WORKER_SCHED_H */
