/*
 * worker/rollback: one rank's part of a recovery that rolls the job back to a checkpoint
 * (tided found no survivor holding some lost state and named the job's last complete
 * checkpoint in the generation's layout message). Instead of running a reshard plan, each
 * member of the new layout reads exactly the bytes of its new shards from the checkpoint's
 * files (ckpt/, checked chunk by chunk), and every participant agrees over the switch
 * communicator on whether all loads succeeded, so that a damaged checkpoint fails the
 * switch everywhere (tided then tries the one before it) and never half of the job.
 * The same loader serves a program that resumes from a checkpoint itself
 * (tide_checkpoint_find, tide_checkpoint_load): one rank's shards of the current layout.
 * Workload: once per such recovery or restart; file reads dominate.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

/* Loads ck into bufs (the backend's memory kind) for coordinate (p, d, tt) of nl. */
static tide_status load_into(tide_t *t, const tide_ckpt_t *ck, const tide_layout_t *nl, int p,
                             int d, int tt, void *const *bufs, tide_ckpt_load_stats *st)
{
    if (t->be->mem_kind == TIDE_MEM_HOST)
        return tide_ckpt_load(ck, nl, p, d, tt, bufs, st);
    /* device memory: one tensor at a time through one host buffer of the largest one's size,
       pinned where the backend has such memory (host_alloc), so that the copies to the
       device run at full speed */
    size_t n_t = t->n_tensors;
    uint64_t most = 0;
    for (size_t i = 0; i < n_t; i++) {
        uint64_t n = tide_shard_bytes(nl, t->coll, i, p, d, tt);
        if (bufs[i] != NULL && n > most)
            most = n;
    }
    if (most == 0)
        return TIDE_OK;
    void **one = tide_calloc(n_t, sizeof *one);
    if (one == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory loading a checkpoint");
    void *host = NULL;
    tide_status rc = TIDE_OK;
    if (t->be->host_alloc != NULL)
        rc = t->be->host_alloc((size_t)most, &host);
    else if ((host = tide_malloc((size_t)most)) == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory staging %llu bytes of a checkpoint",
                         (unsigned long long)most);
    for (size_t i = 0; rc == TIDE_OK && i < n_t; i++) {
        uint64_t n = tide_shard_bytes(nl, t->coll, i, p, d, tt);
        if (n == 0 || bufs[i] == NULL)
            continue;
        one[i] = host;
        tide_ckpt_load_stats s1;
        rc = tide_ckpt_load(ck, nl, p, d, tt, one, &s1);
        if (rc == TIDE_OK)
            rc = tide_copy_from_host(t, bufs[i], host, (size_t)n);
        st->bytes_needed += s1.bytes_needed;
        st->bytes_read += s1.bytes_read;
        st->files += s1.files;
        one[i] = NULL;
    }
    if (t->be->host_alloc != NULL)
        t->be->host_free(host);
    else
        tide_free(host);
    tide_free(one);
    return rc;
}

tide_status tide__rollback_load(tide_t *t, const char *dir, int64_t step, const tide_layout_t *nl,
                                int p, int d, int tt, void *const *bufs, uint64_t *bytes_read)
{
    tide_ckpt_t *ck = NULL;
    tide_ckpt_load_stats st;
    memset(&st, 0, sizeof st);
    tide_status rc = tide_ckpt_open(&ck, dir);
    if (rc == TIDE_OK && tide_ckpt_step(ck) != step)
        rc = tide_errorf(TIDE_ERR_INVALID,
                         "checkpoint %s holds step %lld, not step %lld as tided said", dir,
                         (long long)tide_ckpt_step(ck), (long long)step);
    if (rc == TIDE_OK)
        rc = tide_ckpt_check_collection(ck, t->coll);
    if (rc == TIDE_OK)
        rc = load_into(t, ck, nl, p, d, tt, bufs, &st);
    tide_ckpt_close(&ck);
    *bytes_read = st.bytes_read;
    return rc;
}

tide_status tide__rollback_agree(tide_t *t, tide_coll_comm_t *sw, tide_status mine)
{
    int32_t flag = mine != TIDE_OK, any = 0;
    void *dev = NULL;
    tide_status rc = tide_mem_alloc(t, 2 * sizeof flag, &dev);
    if (rc == TIDE_OK)
        rc = tide_copy_from_host(t, dev, &flag, sizeof flag);
    if (rc == TIDE_OK)
        rc = tide_coll_allreduce(sw, dev, (char *)dev + sizeof flag, 1, TIDE_I32, TIDE_RED_MAX,
                                 NULL);
    if (rc == TIDE_OK)
        rc = tide_copy_to_host(t, &any, (char *)dev + sizeof flag, sizeof any);
    tide_mem_free(t, dev);
    if (rc != TIDE_OK)
        return rc;
    if (mine != TIDE_OK)
        return mine; /* its own detail stands */
    if (any)
        return tide_errorf(TIDE_ERR_INVALID,
                           "another participant could not load the checkpoint (its log names "
                           "the file)");
    return TIDE_OK;
}

tide_status tide_checkpoint_find(const char *path, char *dir, size_t len, int64_t *step)
{
    if (path == NULL || path[0] == '\0' || dir == NULL || len == 0 || step == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint_find: no path, or no room for "
                                             "the answer");
    return tide_ckpt_find(path, INT64_MAX, dir, len, step);
}

tide_status tide_checkpoint_load(tide_t *t, const char *path, void *const *bufs)
{
    if (t == NULL || path == NULL || path[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint_load: no runtime or path");
    if (t->coll == NULL || t->layout == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_checkpoint_load: join a job first");
    if (!t->view.member)
        return TIDE_OK;
    const tide_view *v = &t->view;
    for (size_t i = 0; i < t->n_tensors; i++)
        if ((bufs == NULL || bufs[i] == NULL) &&
            tide_shard_bytes(t->layout, t->coll, i, v->pp_rank, v->dp_rank, v->tp_rank) > 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "tide_checkpoint_load: no buffer for tensor %s, which this rank "
                               "holds",
                               tide_collection_tensor(t->coll, i)->name);
    char dir[4096];
    int64_t step = 0;
    TIDE_CHECK(tide_ckpt_find(path, INT64_MAX, dir, sizeof dir, &step));
    if (step != v->step)
        return tide_errorf(TIDE_ERR_INVALID,
                           "checkpoint %s holds step %lld and the job is at step %lld: join "
                           "with start_step = the checkpoint's step (tide_checkpoint_find)",
                           dir, (long long)step, (long long)v->step);
    uint64_t bytes = 0;
    tide_status rc = tide__rollback_load(t, dir, step, t->layout, v->pp_rank, v->dp_rank,
                                         v->tp_rank, bufs, &bytes);
    if (rc == TIDE_OK)
        TIDE_INFO(SUBSYS, "loaded checkpoint %s (step %lld): %llu bytes read", dir, (long long)step,
                  (unsigned long long)bytes);
    return rc;
}
