/*
 * Part of the test_examples_tide_recover executable (tests/test_examples_tide_recover.c):
 * the checkpoint scenarios (ckpt-zero1, ckpt-dp1, ckpt-corrupt, ckpt-request). The victim
 * waits for its checkpoint to be known to tided, or damages it, before it dies; rank 0
 * requests a checkpoint with `tidectl checkpoint` while training and checks that it holds
 * exactly the state after its step; every checkpoint is complete on disk at the end and the
 * root is removed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "coord_harness.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "examples/mlp_mpi.h"
#include "examples/mlp_tide.h"
#include "tide_recover_int.h"

/* ckpt modes: the first checkpoint step (every g.every up to STEPS) that a `tidectl
   --json events` reply does not show exactly once as a checkpoint_saved event; -1 when
   none. */
int unreported_checkpoint(const char *events)
{
    char want[32];
    for (int k = g.every; k <= g.steps; k += g.every) {
        snprintf(want, sizeof want, "step %d", k);
        int n = events_with(events, "checkpoint_saved", want);
        /* ckpt-corrupt: generation 3 redoes the step of the refused checkpoint, and may save
           it again (remove_checkpoints checks the files agree) */
        if (n != 1 && !(g.corrupt && k == g.ckpt_at && n == 2))
            return k;
    }
    return -1;
}

/* ckpt modes, the victim before it dies: its own shard of the checkpoint of step is on
   disk, and tided has heard that the checkpoint is complete (its checkpoint_saved event),
   so that the job rolls back to that checkpoint however the ranks are scheduled. */
void wait_checkpoint_known(tide_t *t, int step)
{
    static char buf[1 << 18];
    char want[32];
    MT_OK(tide_checkpoint_wait(t));
    snprintf(want, sizeof want, "step %d", step);
    uint64_t deadline = tide_now_ns() + CKPT_WAIT_S * 1000000000ull;
    for (;;) {
        int rc = tidectl_events(g_tidectl, g_endpoint, buf, sizeof buf);
        if (rc == 0 && events_with(buf, "checkpoint_saved", want) > 0)
            break;
        MT_ASSERT(tide_now_ns() < deadline,
                  "no checkpoint_saved event with \"%s\" within %d s (tidectl exit %d): %s", want,
                  CKPT_WAIT_S, rc, buf);
        tide_sleep_ms(50);
    }
    fprintf(stderr, "[rank %d] the checkpoint of step %d is complete and known to tided\n", g_rank,
            step);
    fflush(stderr);
}

/* ckpt-corrupt, the victim before it dies: flips one byte in the middle of a shard file of
   the checkpoint of step (the first shard-*.bin by name), so that the rollback to it fails
   its chunk check on whichever member reads that chunk. */
void damage_checkpoint(int step)
{
    char dir[512], path[1024], best[256] = "";
    tide_ckpt_step_dir(g_ckpt_root, step, dir, sizeof dir);
    DIR *d = opendir(dir);
    MT_ASSERT(d != NULL, "cannot open %s: %s", dir, strerror(errno));
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "shard-", 6) == 0 && n > 4 &&
            strcmp(e->d_name + n - 4, ".bin") == 0 &&
            (best[0] == '\0' || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    MT_ASSERT(best[0] != '\0', "no shard-*.bin in %s", dir);
    snprintf(path, sizeof path, "%s/%s", dir, best);
    int fd = open(path, O_RDWR);
    MT_ASSERT(fd >= 0, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    MT_ASSERT(fstat(fd, &st) == 0 && st.st_size > 0, "%s is empty", path);
    off_t at = st.st_size / 2;
    unsigned char b = 0;
    MT_ASSERT(pread(fd, &b, 1, at) == 1, "cannot read %s: %s", path, strerror(errno));
    b ^= 0x5a;
    MT_ASSERT(pwrite(fd, &b, 1, at) == 1 && fsync(fd) == 0, "cannot damage %s: %s", path,
              strerror(errno));
    close(fd);
    fprintf(stderr, "[rank %d] flipped byte %lld of %lld of %s\n", g_rank, (long long)at,
            (long long)st.st_size, path);
    fflush(stderr);
}

/* ckpt-request, rank 0 in generation 1 after `completed` steps: `tidectl checkpoint` without
   a root (the job saved none yet) and for an unknown job is refused with what to do; with
   --dir it is granted for a step no rank has reached yet, which goes into r->req_step. */
void request_checkpoint(record *r, int completed)
{
    static char out[8192];
    const char *nodir[] = {"checkpoint", JOB, NULL};
    int code = coord_tidectl_io(g_tidectl, g_endpoint, nodir, out, sizeof out, 1);
    MT_ASSERT(code != 0 && strstr(out, "pass --dir ROOT") != NULL,
              "tidectl checkpoint %s without --dir, before any checkpoint: want a non-zero exit "
              "and \"pass --dir ROOT\"; exit %d: %s",
              JOB, code, out);
    const char *nojob[] = {"checkpoint", "nosuchjob", "--dir", "/tmp/x", NULL};
    code = coord_tidectl_io(g_tidectl, g_endpoint, nojob, out, sizeof out, 1);
    MT_ASSERT(code != 0 && strstr(out, "no online job named nosuchjob") != NULL,
              "tidectl checkpoint nosuchjob: want a non-zero exit and \"no online job named "
              "nosuchjob\"; exit %d: %s",
              code, out);
    const char *ask[] = {"--json", "checkpoint", JOB, "--dir", g_ckpt_root, NULL};
    code = coord_tidectl_io(g_tidectl, g_endpoint, ask, out, sizeof out, 1);
    const char *at = strstr(out, "\"message\":\"job " JOB " saves the checkpoint of step ");
    MT_ASSERT(code == 0 && strstr(out, "{\"job\":\"" JOB "\",") == out && at != NULL,
              "tidectl --json checkpoint %s --dir %s: want exit 0 and {\"job\":\"%s\", "
              "\"message\":\"job %s saves the checkpoint of step S ...\"}; exit %d: %s",
              JOB, g_ckpt_root, JOB, JOB, code, out);
    char *end = NULL;
    long long s =
        strtoll(at + strlen("\"message\":\"job " JOB " saves the checkpoint of step "), &end, 10);
    char under[320];
    snprintf(under, sizeof under, " under %s (about ", g_ckpt_root);
    MT_ASSERT(end != NULL && strncmp(end, under, strlen(under)) == 0 &&
                  strstr(end, "`tidectl events` says checkpoint_saved when it is complete") != NULL,
              "tidectl checkpoint's message must name the root and say how to follow the save: "
              "%s",
              out);
    MT_ASSERT(s > completed && s < g.steps,
              "tided chose step %lld for the checkpoint; rank 0 has completed %d steps and the job "
              "ends after %d: the step must lie between (if it does not, the test's steps are too "
              "fast for the request to land before the job ends)",
              s, completed, g.steps);
    r->req_step = s;
    printf("recover-ckpt-request: after %d steps, %s", completed, out);
    fflush(stdout);
}

/* ckpt-request, every member after each step from 2 on: the full state gathered; rank 0
   keeps the one after r->req_step completed steps. */
void keep_requested_state(tide_t *t, const tide_mlp_t *m, record *r, int64_t step)
{
    void **full = NULL;
    MT_OK(tide_mlp_tide_gather(t, m, tide_view_get(t), &full));
    if (full != NULL && r->req_step > 0 && step == r->req_step - 1) {
        r->at_req = full;
        return;
    }
    tide_mlp_full_free(r->coll, &full);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

/* ckpt modes, rank 0 once every survivor left the runtime: every checkpoint is complete
   on disk (keep 0: none pruned; the one the job rolled back to among them), then the whole
   root goes. */
void remove_checkpoints(const char *root)
{
    char manifest[512];
    struct stat st;
    for (int k = g.every; k <= g.steps && !g.request; k += g.every) {
        snprintf(manifest, sizeof manifest, "%s/step-%012d/MANIFEST", root, k);
        MT_ASSERT(stat(manifest, &st) == 0, "no %s after the run", manifest);
        /* ckpt-corrupt: the damaged one fails its check unless it was saved again */
        tide_ckpt_t *ck = NULL;
        snprintf(manifest, sizeof manifest, "%s/step-%012d", root, k);
        MT_OK(tide_ckpt_open(&ck, manifest));
        tide_status rc = tide_ckpt_verify(ck);
        tide_ckpt_close(&ck);
        if (g.corrupt && k == g.ckpt_at && !g_resaved)
            MT_ASSERT(rc == TIDE_ERR_INVALID && strstr(tide_last_error(), "shard-") != NULL,
                      "the damaged checkpoint %s (not saved again) must fail its check naming "
                      "the shard; got %s: %s",
                      manifest, tide_strerror(rc), tide_last_error());
        else
            MT_ASSERT(rc == TIDE_OK, "checkpoint %s: %s", manifest, tide_last_error());
    }
    MT_ASSERT(nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0, "cannot remove %s", root);
}

/* ckpt-request, rank 0 after the job ended: the checkpoint tided was asked for (step
   rec->req_step under g_ckpt_root) is complete, reported, and holds exactly the state
   gathered after that many steps. */
static void check_requested(record *rec)
{
    static char buf[1 << 18];
    char want[64], dir[512], manifest[600];
    const int64_t s = rec->req_step;
    MT_ASSERT(s > 0 && rec->at_req != NULL, "rank 0 kept no state for the requested step %lld",
              (long long)s);
    /* the publisher waited until the checkpoint was published, not until tided heard */
    snprintf(want, sizeof want, "step %lld", (long long)s);
    tide_ckpt_step_dir(g_ckpt_root, s, dir, sizeof dir);
    uint64_t deadline = tide_now_ns() + 10 * 1000000000ull;
    for (;;) {
        MT_ASSERT(tidectl_events(g_tidectl, g_endpoint, buf, sizeof buf) == 0,
                  "tidectl events failed: %s", buf);
        if (events_with(buf, "checkpoint_saved", want) > 0 || tide_now_ns() >= deadline)
            break;
        tide_sleep_ms(50);
    }
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_requested\"") == 1 &&
                  events_with(buf, "checkpoint_requested", want) == 1,
              "want one checkpoint_requested event, \"%s\": %s", want, buf);
    char obj[2048];
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_saved\"") == 1 &&
                  object_with(buf, "\"kind\":\"checkpoint_saved\"", obj, sizeof obj) &&
                  has_text(obj, want) && strstr(obj, dir) != NULL,
              "want one checkpoint_saved event, \"%s saved in %s\", within 10 s of the end of the "
              "save: %s",
              want, dir, buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_failed\"") == 0, "a checkpoint failed: %s", buf);
    snprintf(manifest, sizeof manifest, "%s/MANIFEST", dir);
    struct stat st;
    MT_ASSERT(stat(manifest, &st) == 0, "no %s after the run", manifest);

    /* its content, read whole into one process's layout, is the state after s steps */
    const tide_collection_t *c = rec->coll;
    tide_ckpt_t *ck = NULL;
    MT_OK(tide_ckpt_open(&ck, dir));
    MT_ASSERT(tide_ckpt_step(ck) == s, "%s holds step %lld, want %lld", dir,
              (long long)tide_ckpt_step(ck), (long long)s);
    MT_OK(tide_ckpt_verify(ck));
    MT_OK(tide_ckpt_check_collection(ck, c));
    tide_layout_t *l = NULL;
    MT_OK(tide_layout_new(&l, 1, 1, 1, tide_collection_num_layers(c), g.micro));
    size_t n = tide_collection_size(c);
    void **bufs = tide_calloc(n, sizeof *bufs);
    MT_ASSERT(bufs != NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tide_shard_bytes(l, c, i, 0, 0, 0);
        MT_ASSERT(b == tide_tensor_bytes(tide_collection_tensor(c, i)),
                  "tensor %zu: %llu bytes on (1, 1, 1)", i, (unsigned long long)b);
        bufs[i] = tide_malloc(b ? (size_t)b : 1);
        MT_ASSERT(bufs[i] != NULL, "out of memory");
    }
    tide_ckpt_load_stats ls;
    MT_OK(tide_ckpt_load(ck, l, 0, 0, 0, bufs, &ls));
    for (size_t i = 0; i < n; i++) {
        const tide_tensor_desc *d = tide_collection_tensor(c, i);
        MT_ASSERT(memcmp(bufs[i], rec->at_req[i], tide_tensor_bytes(d)) == 0,
                  "tensor %s of the checkpoint of step %lld differs from the state gathered "
                  "after %lld steps",
                  d->name, (long long)s, (long long)s);
        tide_free(bufs[i]);
    }
    tide_free(bufs);
    tide_layout_destroy(&l);
    printf("recover-ckpt-request: %s (%zu shard files, %llu bytes read; checkpoint_requested "
           "and checkpoint_saved reported) holds the state after %lld steps bit for bit\n",
           dir, tide_ckpt_num_shards(ck), (unsigned long long)ls.bytes_read, (long long)s);
    fflush(stdout);
    tide_ckpt_close(&ck);
}

/* ckpt-request, every rank after training: each step ran once, losses as the never-failed
   runs', final state as the same-layout run's, the requested checkpoint checked (rank 0),
   and the end of the run. Returns the exit status. */
int finish_request(tide_t *t, tide_mlp_t *m, record *rec, const double *ref,
                   const double *ref_layouts, void ***want, int is_root)
{
    MT_OK(tide_checkpoint_wait(t)); /* this rank's shard written (and published, rank 0) */
    MPI_Comm all = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &all);
    const tide_view *v = tide_view_get(t);
    MT_ASSERT(v->generation == 1 && rec->switches == 0 && rec->befores == 0,
              "no switch expected (generation %llu, %d switches)",
              (unsigned long long)v->generation, rec->switches);
    static double lo[MAX_STEPS], hi[MAX_STEPS];
    for (int k = 0; k < g.steps; k++) {
        MT_ASSERT(rec->ran[k] == 1, "step %d ran %d times on rank %d", k, rec->ran[k], g_rank);
        lo[k] = hi[k] = rec->loss[k];
    }
    MPI_Allreduce(MPI_IN_PLACE, lo, g.steps, MPI_DOUBLE, MPI_MIN, all);
    MPI_Allreduce(MPI_IN_PLACE, hi, g.steps, MPI_DOUBLE, MPI_MAX, all);
    void **full = NULL;
    MT_OK(tide_mlp_tide_gather(t, m, v, &full));
    if (g_rank == 0) {
        double worst = 0.0;
        for (int k = 0; k < g.steps; k++) {
            MT_ASSERT(lo[k] == hi[k] && lo[k] == ref_layouts[k],
                      "step %d: loss %.17g..%.17g on the ranks vs %.17g of the same layout over "
                      "plain MPI",
                      k, lo[k], hi[k], ref_layouts[k]);
            double rel = fabs(lo[k] - ref[k]) / fabs(ref[k]);
            worst = fmax(worst, rel);
            MT_ASSERT(rel <= REL_TOL, "step %d: loss %.9g vs %.9g in one process (rel %.2e)", k,
                      lo[k], ref[k], rel);
        }
        MT_ASSERT(full != NULL, "rank 0 gathered nothing");
        compare_state(rec->coll, full, *want, 0.0);
        check_requested(rec);
        printf("recover-ckpt-request: %d steps on (dp %d, tp %d, pp %d); max loss rel diff %.2e "
               "to one process; losses and final state bit-identical to plain MPI\n",
               g.steps, g.first.dp, g.first.tp, g.first.pp, worst);
        fflush(stdout);
    }
    tide_mlp_full_free(rec->coll, &full);
    tide_mlp_full_free(rec->coll, &rec->at_req);
    tide_mlp_full_free(rec->coll, want);
    MPI_Barrier(all);
    tide_destroy(&t);
    tide_mlp_destroy(&m);
    MPI_Barrier(all);
    if (g_rank == 0)
        remove_checkpoints(g_ckpt_root);
    record_free_layouts(rec);
    return pass(&all, &rec->coll, is_root);
}
