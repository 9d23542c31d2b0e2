/*
 * Part of test_collectives_conformance (the collectives conformance suite; its cases run
 * in the order of main() in test_collectives_conformance.c): the mpi backend's single-copy
 * path ("direct": process_vm_writev / readv). Strided sender -> contiguous receiver and the
 * reverse, with the other end's layout given, runs of 1 B to more than a page, sizes around
 * the threshold, bit-exact with the gaps untouched, the backend's byte count proving the
 * path was used; the agreement symmetric; TIDE_COLL_CMA=0 falling back to the plain path;
 * size and layout disagreements giving TIDE_ERR_PROTOCOL at both ends; abort while a push
 * is pending.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/collectives.h"
#include "collectives/executor.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "conf_fixture.h"
#include "mpi_test.h"

/* ---- single copy ("direct": the mpi backend's process_vm_writev / readv path) ---------- */

static uint64_t direct_bytes(const tide_coll_comm_t *c)
{
    return be->direct_bytes != NULL ? be->direct_bytes(c) : 0;
}

/* Threshold the direct tests run with (bytes): set explicitly so the test knows it. */
#define DIRECT_MIN ((size_t)64 << 10)

/* One message of the direct tests: its size and both ends' layouts (run 0: contiguous). */
typedef struct dmsg {
    size_t bytes, srun, sstride, rrun, rstride;
} dmsg;

static size_t span_of(size_t bytes, size_t run, size_t stride)
{
    return run == 0 || bytes == 0 ? bytes : (bytes / run - 1) * stride + run;
}

static unsigned char dpat(int src, uint64_t salt, size_t j)
{
    return (unsigned char)((size_t)src * 131 + salt * 17 + j * 7 + (j >> 9));
}

static size_t at_of(size_t j, size_t run, size_t stride)
{
    return run ? (j / run) * stride + j % run : j;
}

/* Shapes of a direct test message: which ends are strided. */
enum { SHAPE_RECV_STRIDED, SHAPE_SEND_STRIDED, SHAPE_CONTIGUOUS, SHAPE_BOTH_STRIDED };

/* A message of that shape (the strided ends with runs from 1 byte to more than a page;
   both strided: the receiver's stride differs), sizes just below, at and above
   DIRECT_MIN, or up to 3 MiB more. */
static dmsg draw_dmsg(uint64_t *s, int shape)
{
    static const size_t runs[] = {1, 3, 64, 1000, 2368, 4096, 4099, 9000};
    size_t run = runs[rng_below(s, sizeof runs / sizeof runs[0])];
    size_t stride = run + 1 + (size_t)rng_below(s, run < 64 ? 16 : run);
    size_t nruns;
    switch (rng_below(s, 4)) {
    case 0:
        nruns = (DIRECT_MIN - 1) / run; /* just below the threshold: plain MPI */
        break;
    case 1:
        nruns = (DIRECT_MIN + run - 1) / run; /* at it (or just above) */
        break;
    case 2:
        nruns = (DIRECT_MIN + run - 1) / run + 1;
        break;
    default:
        nruns = (DIRECT_MIN + (size_t)rng_below(s, (uint64_t)3 << 20)) / run + 1;
        break;
    }
    if (nruns < 2)
        nruns = 2;
    dmsg m = {.bytes = nruns * run};
    if (shape == SHAPE_SEND_STRIDED || shape == SHAPE_BOTH_STRIDED) {
        m.srun = run;
        m.sstride = stride;
    }
    if (shape == SHAPE_RECV_STRIDED || shape == SHAPE_BOTH_STRIDED) {
        m.rrun = run;
        m.rstride = shape == SHAPE_BOTH_STRIDED ? stride + 8 : stride;
    }
    return m;
}

/* The same message as drawn by its sender src for this iteration. */
static dmsg dmsg_of(uint64_t salt, int src, int shape)
{
    uint64_t s = seed ^ 0xD1EC7ull ^ (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)src << 33);
    rng_next(&s);
    return draw_dmsg(&s, shape);
}

/* Ring exchanges, each batch: a strided sender's message, a small plain message, a
   strided receiver's, a contiguous one and one strided at both ends to the right
   neighbour, the same five from the left one, with both ends' layouts given. Checks
   every byte and gap, and that exactly the messages of at least DIRECT_MIN went by
   single copy, whatever their layouts (the sender pushes them all). expect_direct 0:
   single copy must be unused. */
#define NMSG 5
static void direct_ring(tide_coll_comm_t *c, int iters, int expect_direct, const char *what)
{
    int right = (me + 1) % np, left = (me - 1 + np) % np;
    uint64_t total = 0;
    for (int it = 0; it < iters; it++) {
        dmsg sm[NMSG], rm[NMSG];
        static const int shape[NMSG] = {SHAPE_SEND_STRIDED, -1, SHAPE_RECV_STRIDED,
                                        SHAPE_CONTIGUOUS, SHAPE_BOTH_STRIDED};
        for (int k = 0; k < NMSG; k++) {
            if (shape[k] < 0)
                continue;
            sm[k] = dmsg_of((uint64_t)it * NMSG + (uint64_t)k, me, shape[k]);
            rm[k] = dmsg_of((uint64_t)it * NMSG + (uint64_t)k, left, shape[k]);
        }
        sm[1] = (dmsg){.bytes = 100 + (size_t)(me % 7)};
        rm[1] = (dmsg){.bytes = 100 + (size_t)(left % 7)};
        if (it == 0) {
            /* once: more than one 16 MiB slice and more than IOV_MAX runs per call */
            sm[0] = rm[0] = (dmsg){
                .bytes = ((size_t)17 << 20) / 2368 * 2368, .srun = 2368, .sstride = 2368 + 64};
        }
        tide_p2p_op ops[2 * NMSG];
        tide_p2p_peer peers[2 * NMSG];
        unsigned char *sb[NMSG], *rb[NMSG];
        size_t rspan[NMSG];
        for (int k = 0; k < NMSG; k++) {
            size_t ss = span_of(sm[k].bytes, sm[k].srun, sm[k].sstride);
            rspan[k] = span_of(rm[k].bytes, rm[k].rrun, rm[k].rstride);
            sb[k] = malloc(ss + 1);
            rb[k] = malloc(rspan[k] + 1);
            memset(sb[k], 0xAB, ss);
            for (size_t j = 0; j < sm[k].bytes; j++)
                sb[k][at_of(j, sm[k].srun, sm[k].sstride)] =
                    dpat(me, (uint64_t)it * NMSG + (uint64_t)k, j);
            memset(rb[k], 0xEE, rspan[k]);
            ops[k] = (tide_p2p_op){.kind = TIDE_P2P_SEND,
                                   .peer = right,
                                   .buf = sb[k],
                                   .bytes = sm[k].bytes,
                                   .run = sm[k].srun,
                                   .stride = sm[k].sstride};
            peers[k] = (tide_p2p_peer){.run = sm[k].rrun, .stride = sm[k].rstride, .known = 1};
            ops[NMSG + k] = (tide_p2p_op){.kind = TIDE_P2P_RECV,
                                          .peer = left,
                                          .buf = rb[k],
                                          .bytes = rm[k].bytes,
                                          .run = rm[k].rrun,
                                          .stride = rm[k].rstride};
            peers[NMSG + k] =
                (tide_p2p_peer){.run = rm[k].srun, .stride = rm[k].sstride, .known = 1};
        }
        uint64_t d0 = direct_bytes(c);
        if (it % 2) {
            tide_coll_req_t *req = NULL;
            MT_OK(tide_coll_p2p_start_peers(c, ops, peers, 2 * NMSG, NULL, &req));
            int done = 0;
            while (!done)
                MT_OK(tide_coll_req_test(c, req, &done));
            tide_coll_req_free(c, &req);
        } else {
            tide_coll_req_t *req = NULL;
            MT_OK(tide_coll_p2p_start_peers(c, ops, peers, 2 * NMSG, NULL, &req));
            MT_OK(tide_coll_req_wait(c, req));
            tide_coll_req_free(c, &req);
        }
        uint64_t got = direct_bytes(c) - d0, want = 0;
        for (int k = 0; k < NMSG; k++) {
            for (size_t i = 0; i < rspan[k]; i++) {
                size_t run = rm[k].rrun ? rm[k].rrun : rspan[k];
                size_t stride = rm[k].rrun ? rm[k].rstride : rspan[k];
                size_t r = i / stride, b = i % stride;
                unsigned char w =
                    b < run ? dpat(left, (uint64_t)it * NMSG + (uint64_t)k, r * run + b) : 0xEE;
                if (rb[k][i] != w)
                    MT_FAIL("%s: iteration %d message %d (%zu bytes, runs %zu/%zu -> %zu/%zu) "
                            "byte %zu is %#x, not %#x",
                            what, it, k, rm[k].bytes, rm[k].srun, rm[k].sstride, rm[k].rrun,
                            rm[k].rstride, i, rb[k][i], w);
            }
            if (k != 1 && rm[k].bytes >= DIRECT_MIN && direct_to(c, left))
                want += rm[k].bytes;
            free(sb[k]);
            free(rb[k]);
        }
        MT_ASSERT(got == (expect_direct ? want : 0),
                  "%s: iteration %d: %llu bytes by single copy, expected %llu", what, it,
                  (unsigned long long)got, (unsigned long long)(expect_direct ? want : 0));
        total += got;
    }
    uint64_t all = 0;
    MPI_Allreduce(&total, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("%s: %llu bytes by single copy\n", what, (unsigned long long)all);
}

void test_p2p_direct(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2) {
        mt_pass("p2p_direct (no single-copy path to test here)");
        return;
    }
    cma_env("TIDE_COLL_CMA_MIN", "65536");
    tide_coll_comm_t *c = world_comm();
    int any = check_agreement(c, 0);
    if (!any && me == 0)
        printf("NOTE: single copy not available between these ranks (the agreement found no "
               "reachable peer); checking results only\n");
    direct_ring(c, 8, 1, "p2p_direct");
    tide_coll_comm_destroy(&c);

    /* TIDE_COLL_CMA=0: everything on the plain path, same results. */
    cma_env("TIDE_COLL_CMA", "0");
    c = world_comm();
    check_agreement(c, 1);
    direct_ring(c, 4, 0, "p2p_direct with TIDE_COLL_CMA=0");
    tide_coll_comm_destroy(&c);
    cma_env("TIDE_COLL_CMA", NULL);
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    mt_pass("p2p_direct");
}

/* Ranks 0 and 1 disagree about one message (variant: 0 sizes, 1 who is strided, 2 the
   receiver posts a plain receive, 3 a claimed layout): both get TIDE_ERR_PROTOCOL
   promptly and the receive buffer is not written (past the descriptor, in variant 2,
   where MPI delivers it into the plain receive). */
static void direct_mismatch(int variant)
{
    tide_coll_comm_t *c = world_comm();
    int ok = np >= 2 && direct_to(c, me == 0 ? 1 : 0);
    if (me <= 1 && ok) {
        size_t run = 2368, stride = 4736, bytes = run * 64;
        size_t rbytes = variant == 0 ? bytes + run : bytes;
        size_t sspan = span_of(bytes, run, stride), rspan = span_of(rbytes, run, stride);
        unsigned char *buf = malloc(sspan > rspan ? sspan : rspan);
        memset(buf, 0x3C, sspan > rspan ? sspan : rspan);
        tide_p2p_op op = {.peer = 1 - me, .buf = buf};
        tide_p2p_peer peer = {.known = 1};
        if (me == 0) { /* strided sender, says the receiver is contiguous: a push */
            op.kind = TIDE_P2P_SEND;
            op.bytes = bytes;
            op.run = run;
            op.stride = stride;
        } else {
            op.kind = TIDE_P2P_RECV;
            op.bytes = rbytes;
            peer.run = variant == 3 ? run / 2 : run;
            peer.stride = stride;
            if (variant == 1) { /* strided too, and says the sender is contiguous */
                op.run = run;
                op.stride = stride;
                peer.run = peer.stride = 0;
            }
        }
        uint64_t t0 = tide_now_ns();
        tide_status rc = tide_coll_p2p_start_peers(c, &op, variant == 2 && me == 1 ? NULL : &peer,
                                                   1, NULL, NULL);
        MT_ASSERT(rc == TIDE_ERR_INVALID, "out NULL refused");
        tide_coll_req_t *req = NULL;
        rc = tide_coll_p2p_start_peers(c, &op, variant == 2 && me == 1 ? NULL : &peer, 1, NULL,
                                       &req);
        if (rc == TIDE_OK)
            rc = tide_coll_req_wait(c, req);
        tide_coll_req_free(c, &req);
        double dt = (double)(tide_now_ns() - t0) / 1e9;
        MT_ASSERT(rc == TIDE_ERR_PROTOCOL, "mismatch %d: rank %d got %s (%s)", variant, me,
                  tide_status_name(rc), tide_last_error());
        MT_ASSERT(dt < 2.0, "mismatch %d: rank %d took %.3f s", variant, me, dt);
        if (me == 1)
            for (size_t i = variant == 2 ? 96 : 0; i < rspan; i++)
                MT_ASSERT(buf[i] == 0x3C, "mismatch %d: receive buffer byte %zu written", variant,
                          i);
        free(buf);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    tide_coll_comm_abort(c);
    tide_coll_comm_destroy(&c);
}

void test_direct_errors(void)
{
    if (strcmp(be->name, "mpi") != 0 || np < 2) {
        mt_pass("direct_errors (no single-copy path to test here)");
        return;
    }
    cma_env("TIDE_COLL_CMA_MIN", "65536");
    for (int v = 0; v < 4; v++)
        direct_mismatch(v);
    /* Abort while a push into rank 1 is pending: the pusher never posts (late 0), or
       posts after rank 1 gave up (late 1) and must stop at its liveness check. Rank 1
       returns ABORTED within 1 s of the abort and its buffer is never written. */
    for (int late = 0; late < 2; late++) {
        tide_coll_comm_t *c = world_comm();
        int ok = direct_to(c, me == 0 ? 1 : 0);
        size_t run = 2368, stride = 4736, bytes = run * 512;
        size_t sspan = span_of(bytes, run, stride);
        unsigned char *buf = malloc(sspan);
        memset(buf, 0x5D, sspan);
        if (me == 1 && ok) {
            struct aborter a = {c, 150, 0};
            pthread_t th;
            pthread_create(&th, NULL, abort_later, &a);
            tide_p2p_op op = {.kind = TIDE_P2P_RECV, .peer = 0, .buf = buf, .bytes = bytes};
            tide_p2p_peer peer = {.run = run, .stride = stride, .known = 1};
            tide_coll_req_t *req = NULL;
            tide_status rc = tide_coll_p2p_start_peers(c, &op, &peer, 1, NULL, &req);
            if (rc == TIDE_OK)
                rc = tide_coll_req_wait(c, req);
            uint64_t end = tide_now_ns();
            tide_coll_req_free(c, &req);
            pthread_join(th, NULL);
            MT_ASSERT(rc == TIDE_ERR_ABORTED, "push receive aborted (late %d): %s", late,
                      tide_status_name(rc));
            MT_ASSERT(end - a.at_ns < 1000ull * 1000000,
                      "push receive returned %.3f s after the abort (late %d)",
                      (double)(end - a.at_ns) / 1e9, late);
            for (size_t i = 0; i < bytes; i++)
                MT_ASSERT(buf[i] == 0x5D, "late %d: byte %zu written after the abort", late, i);
        } else if (me == 0 && ok && late) {
            tide_sleep_ms(350); /* rank 1 has given up by now */
            tide_p2p_op op = {.kind = TIDE_P2P_SEND,
                              .peer = 1,
                              .buf = buf,
                              .bytes = bytes,
                              .run = run,
                              .stride = stride};
            tide_p2p_peer peer = {.known = 1};
            tide_coll_req_t *req = NULL;
            tide_status rc = tide_coll_p2p_start_peers(c, &op, &peer, 1, NULL, &req);
            if (rc == TIDE_OK)
                rc = tide_coll_req_wait(c, req);
            tide_coll_req_free(c, &req);
            MT_ASSERT(rc == TIDE_ERR_PEER, "pusher after the receiver gave up: %s (%s)",
                      tide_status_name(rc), tide_last_error());
        }
        free(buf);
        MPI_Barrier(MPI_COMM_WORLD);
        tide_coll_comm_abort(c);
        tide_coll_comm_destroy(&c);
    }
    cma_env("TIDE_COLL_CMA_MIN", NULL);
    mt_pass("direct_errors");
}
