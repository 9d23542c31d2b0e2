/*
 * worker/ctl_int: the control client's own state and the functions its files share, each
 * calling only the ones below it: ctl.c (the thread, its lifecycle, heartbeats, lease),
 * ctl_tided.c (tided's messages turned into intents and immediate answers), ctl_offline.c
 * (offline command jobs), ctl_out.c (what they send). Only the control client includes
 * it.
 */
#ifndef TIDE_WORKER_CTL_INT_H
#define TIDE_WORKER_CTL_INT_H

#include "worker/prep.h"
#include "worker/worker_int.h"

#define SUBSYS            "worker"
#define TIDE__SAVED_QUEUE 16   /* checkpoint reports waiting to be sent, at most */
#define REGISTER_RETRY_MS 1000 /* resend register until tided answers */
#define REPLIES_MAX       64   /* unread replies kept for the training thread */

/* The generation tided announced last, as the control thread answers for it: whether this
   rank takes part, the ack it sent, whether the ack waits for the preparation. */
typedef struct tide__ctl_pending {
    uint64_t gen;   /* 0: none */
    int member_new; /* in the new layout */
    int p_old;      /* in the layout it starts from, which this rank runs */
    int acked;
    int64_t ack;   /* the completed steps the ack reported */
    int committed; /* commit seen */
    int held;      /* the ack waits for the preparation (or the next step end) */
    tide_msg_t layout;
} tide__ctl_pending;

struct tide__ctl {
    char endpoint[512];
    tide_proto_register_t reg;
    int hb_fixed_ms;
    void *zctx, *dealer, *pair_bg, *pair_main;
    void *mon; /* PAIR: the dealer's failed CURVE handshakes (main thread only) */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* borrowed from the runtime, which outlives this client */
    tide__mailbox_t *intents; /* what tided asks of the training thread */
    tide__progress *progress; /* what the training thread publishes of its steps */
    tide__gens_t *gens;       /* the generations' abort words */
    tide__prep_t *prep;       /* the preparation of announced generations (NULL: none) */
    tide__mailbox_t *replies; /* answers to the training thread's own requests (owned) */
    int proposals_closed;     /* under intents' lock: the training thread drained for the
                                 last time; checkpoint proposals go unanswered */
    /* --- under mu --- */
    int stop;
    int leave; /* destroy began: stop the offline command (SIGTERM, grace), take no more */
    int32_t worker_id;
    int registered;
    int ever_registered; /* a worker id was assigned once (bye is meaningful) */
    int hb_ms;
    char job[TIDE_PROTO_NAME_MAX + 1];
    tide_proto_saved_t saved_q[TIDE__SAVED_QUEUE]; /* "saved" reports waiting to be sent
                                                      (any thread posts them) */
    int n_saved;
    int halted;  /* tided halted the job: said to the training thread once */
    int fail_ms; /* tided's failure timeout (register_ok), ms; 0 before the first */
    int fenced;  /* this process was given up (tided said so, or its lease ran out): it sends
                    nothing more to tided but a last word, and touches no peer */
    char fence_reason[TIDE_PROTO_TEXT_MAX + 1];
    uint8_t *done_bytes; /* last done sent, for duplicate commits */
    size_t done_len;
    uint64_t done_gen;
    char plugin_job[TIDE_PROTO_NAME_MAX + 1]; /* a plugin job handed to the training thread
                                                 and not finished there ("" when none) */
    pid_t child_pid;                          /* mirror of child.pid for tests and destroy */
    int child_grace;                          /* mirror of child.grace_ms */
    char child_job[TIDE_PROTO_NAME_MAX + 1];
    int mon_bg;    /* the background thread reads the monitor from now on */
    int introduce; /* the socket (re)connected: tided must hear this rank itself once, or it
                      cannot route messages to it */
    int bye;       /* destroy sent (or is sending) bye: this rank is off the host's heartbeats
                      and registers no more */
    /* the scheduler's notice that it takes the node back (TIDE_LEAVE_SIGNAL, worker/sched.h):
       set before the thread starts, then the background thread's */
    int leave_signo;       /* 0: none caught */
    unsigned leave_seen;   /* arrivals of it already told to tided */
    /* --- background thread only --- */
    tide__ctl_pending pend;
    uint64_t seen_gen; /* the newest generation announced (never reused) */
    tide__child child;
    uint32_t child_attempt;    /* attempt number of the command running in child */
    char log_dir[512];         /* TIDE_LOG_DIR: where attempts' output goes */
    uint64_t log_cap;          /* TIDE_OFFLINE_LOG_CAP: bytes kept per attempt */
    int contain_known;         /* the containment below was decided (once, at first use) */
    char cg_parent[1024];      /* cgroup v2 directory for attempts' cgroups, "" when none */
    int leaving;               /* leave seen while a command ran: it is being stopped */
    uint64_t deferred_ack_gen; /* prepare_ack waiting for the offline child to stop */
    tide_proto_buf_t buf;
    uint64_t next_hb_ns, next_reg_ns;
    uint64_t last_hb_ns; /* monotonic ns of the last heartbeat sent that carried this rank's
                            (by itself or, aggregated, by its host's leader; 0: none yet) */
    /* host aggregation (hostbeat.c); host NULL: this rank sends its own heartbeats */
    tide__hostbeat_t *host;
    tide_proto_heartbeat_t *hb_beats; /* room for the host's ranks (leader) */
    uint64_t *hb_seqs;
    int *hb_slots;
    uint64_t next_send_ns; /* leader: the next host heartbeat (0: at once) */
    uint64_t self_ns;      /* the last heartbeat this rank sent itself (or registered) */
};

/* ---- ctl_out.c ---- */

/* Encodes and sends m to tided without blocking; 1 when handed to ZeroMQ. Background
   thread. */
int tide__ctl_send_now(tide__ctl_t *ctl, const tide_msg_t *m);

/* Queues m (moved) for the training thread's replies (the oldest dropped past
   REPLIES_MAX). */
void tide__ctl_to_main(tide__ctl_t *ctl, tide_msg_t *m);

/* This process was given up (tided's answer, or its own lease): every generation's word
   is set, the lease expires, the training thread hears why; tell: tided too. */
void tide__ctl_fence(tide__ctl_t *ctl, const char *why, int tell);

/* 1 once fenced; takes mu. */
int tide__ctl_is_fenced(tide__ctl_t *ctl);

/* Register again (tided lost this rank). */
void tide__ctl_register(tide__ctl_t *ctl);

/* ---- ctl_tided.c: tided's messages ---- */

/* Handles one decoded message from tided (m may be moved from). Background thread. */
void tide__ctl_on_tided(tide__ctl_t *ctl, tide_msg_t *m);

/* An ack held for the preparation goes out once it may (tide__prep_ready). */
void tide__ctl_prep_tick(tide__ctl_t *ctl);

/* 1 when a held ack waits (the thread polls every 2 ms then). */
int tide__ctl_holding(const tide__ctl_t *ctl);

/* Sends the pending generation's ack (after an offline child stopped). */
void tide__ctl_send_ack(tide__ctl_t *ctl, uint64_t gen, int64_t step);

/* Answers checkpoint proposal `id` (for step) of this rank's job: done steps completed when
   it heard it, as a member or not (control thread). */
void tide__ctl_send_save_ack(tide__ctl_t *ctl, uint64_t id, uint64_t step, int64_t done,
                             int member);

/* ---- ctl_offline.c: offline command jobs (and plugin ones handed to the training thread) */

void tide__ctl_on_assign(tide__ctl_t *ctl, tide_msg_t *m);
void tide__ctl_on_preempt(tide__ctl_t *ctl, tide_msg_t *m);

/* Reaps the command when it ended and reports it; a deferred ack goes out then. */
void tide__ctl_child_tick(tide__ctl_t *ctl);

/* Stops a command the thread left running (its start failed) and reports it. */
void tide__ctl_child_stop(tide__ctl_t *ctl);

/* Reports an offline attempt's state to tided. */
void tide__ctl_offline_status(tide__ctl_t *ctl, const char *job, uint32_t attempt,
                              tide_proto_job_state_t st, int exit_code, const char *log,
                              const char *tail);

#endif /* TIDE_WORKER_CTL_INT_H */
