/*
 * coordinator/members: who holds what in an online job (see members.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "coordinator/members.h"
#include "proto/proto_reshard.h"

tide_coord_worker_t *tide__job_worker(tide_server_t *s, const tide_coord_job_t *j, int32_t rank)
{
    int32_t r = 0;
    int p = tide_coord_job_locate(j, rank, &r);
    return p < 0 ? NULL : tide_coord_worker_find(s->st, j->pools[p].name, r);
}

void tide__layout_msg_init(tide_msg_t *m, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_init(m, TIDE_MSG_LAYOUT);
    snprintf(m->u.layout.job, sizeof m->u.layout.job, "%s", j->name);
    int p = tide_coord_job_pool_find(j, w->pool);
    m->u.layout.base = p >= 0 ? j->pools[p].base : 0;
    m->u.layout.world = tide_coord_job_world(j, 0);
    if (m->u.layout.world < 1)
        m->u.layout.world = 1;
}

tide_status tide__layout_worker_ids(tide_server_t *s, const tide_coord_job_t *j,
                                    const tide_layout_t *l, tide_layout_t **out)
{
    *out = NULL;
    tide_layout_t *c = NULL;
    TIDE_CHECK(tide_layout_copy(&c, l));
    for (size_t i = 0; i < tide_layout_size(c); i++) {
        const tide_coord_worker_t *w = tide__job_worker(s, j, c->worker[i]);
        if (w == NULL) {
            int32_t rank = c->worker[i];
            tide_layout_destroy(&c);
            return tide_errorf(TIDE_ERR_NOT_FOUND,
                               "job %s: job rank %d holds a coordinate but no registered "
                               "worker holds it",
                               j->name, (int)rank);
        }
        c->worker[i] = w->id;
    }
    *out = c;
    return TIDE_OK;
}

size_t tide__live_members(const tide_server_t *s, const tide_coord_job_t *j)
{
    size_t n = 0;
    for (size_t i = 0; i < s->st->n_workers; i++) {
        const tide_coord_worker_t *w = &s->st->workers[i];
        n += w->pool[0] != '\0' && w->job == j->id && !tide_coord_worker_gone(w);
    }
    return n;
}

void tide__job_release(tide_server_t *s, tide_coord_job_t *j, tide_jstate to)
{
    tide_reconf_destroy(&j->reconf);
    for (size_t i = 0; i < s->st->n_workers; i++) {
        tide_coord_worker_t *w = &s->st->workers[i];
        if (w->pool[0] == '\0' || w->job != j->id)
            continue;
        w->job = 0;
        if (w->state == TIDE_WS_ONLINE)
            w->state = TIDE_WS_IDLE;
        tide__save_worker(s, w);
    }
    j->state = to;
    tide__reschedule(s);
}

void tide__send_layout(tide_server_t *s, const tide_coord_job_t *j, const tide_coord_worker_t *w)
{
    tide_msg_t m;
    tide__layout_msg_init(&m, j, w);
    tide_proto_layout_from(&m.u.layout.layout, j->layout, j->generation);
    m.u.layout.has_prev = 0;
    tide__send_worker(s, w, &m);
}

typedef struct host_ref {
    const char *host;
    size_t idx;
} host_ref;

static int cmp_host_ref(const void *a, const void *b)
{
    return strcmp(((const host_ref *)a)->host, ((const host_ref *)b)->host);
}

tide_status tide__candidates(tide_server_t *s, const tide_coord_job_t *j, int joining,
                             tide_policy_worker **out, size_t *n_out)
{
    tide_coord_state_t *st = s->st;
    *out = NULL;
    *n_out = 0;
    /* the job's launches' ranks, through the (pool, rank) index: a decision costs the job's
       size, not the worker table's */
    size_t cap = 1;
    for (int p = 0; p < j->n_pools; p++)
        cap += (size_t)j->pools[p].size;
    int32_t world = tide_coord_job_world(j, 0);
    tide_policy_worker *c = tide_malloc(cap * sizeof *c);
    host_ref *h = tide_malloc(cap * sizeof *h);
    uint8_t *member = tide_calloc(world > 0 ? (size_t)world : 1, 1); /* job rank in the layout */
    if (c == NULL || h == NULL || member == NULL) {
        tide_free(c);
        tide_free(h);
        tide_free(member);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory listing candidate workers");
    }
    for (size_t i = 0; j->layout != NULL && i < tide_layout_size(j->layout); i++)
        if (j->layout->worker[i] >= 0 && j->layout->worker[i] < world)
            member[j->layout->worker[i]] = 1;
    size_t n = 0;
    for (int p = 0; p < j->n_pools; p++) {
        if (j->pools[p].left || (!j->pools[p].connected && !joining))
            continue; /* a pool that left: its launch has exited or is exiting */
        for (int32_t rank = 0; rank < j->pools[p].size; rank++) {
            const tide_coord_worker_t *w = tide_coord_worker_find(st, j->pools[p].name, rank);
            if (w == NULL)
                continue;
            if (tide_coord_worker_gone(w) || w->state == TIDE_WS_DRAINING)
                continue;
            int32_t jr = j->pools[p].base + w->rank;
            tide_policy_worker pw = {jr, 0, TIDE_PW_IDLE, 0};
            if (w->state == TIDE_WS_ONLINE && w->job == j->id && jr < world && member[jr]) {
                pw.cls = TIDE_PW_MEMBER;
            } else if (w->joined != j->id) {
                continue; /* runs another program: cannot take a coordinate of this job */
            } else if (w->state == TIDE_WS_IDLE && (w->job == 0 || w->job == j->id)) {
                pw.cls = TIDE_PW_IDLE;
            } else if (w->state == TIDE_WS_OFFLINE && w->offline_job != 0) {
                const tide_coord_job_t *oj = tide_coord_job_get(st, w->offline_job);
                pw.cls = TIDE_PW_OFFLINE;
                pw.priority = oj ? oj->priority : 0;
            } else {
                continue;
            }
            h[n] = (host_ref){w->host, n};
            c[n++] = pw;
        }
    }
    tide_free(member);
    qsort(h, n, sizeof *h, cmp_host_ref);
    int32_t host = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(h[i].host, h[i - 1].host) != 0)
            host++;
        c[h[i].idx].host = host;
    }
    tide_free(h);
    *out = c;
    *n_out = n;
    return TIDE_OK;
}

tide_status tide__job_collection(const tide_coord_job_t *j, tide_collection_t **out)
{
    *out = NULL;
    if (j->join_blob == NULL)
        return TIDE_OK;
    tide_msg_t jm;
    tide_status rc = tide_proto_decode(j->join_blob, j->join_len, &jm);
    if (rc != TIDE_OK)
        return tide_errorf(rc, "job %s: its stored join message does not decode: %s", j->name,
                           tide_last_error());
    tide_collection_t *c = NULL;
    if (jm.type != TIDE_MSG_JOIN || jm.u.join.n_tensors == 0)
        goto out;
    TIDE_CHECK_GOTO(tide_proto_tensors_to(jm.u.join.tensors, jm.u.join.n_tensors,
                                          jm.u.join.num_layers, &c),
                    rc, out);
    *out = c;
    c = NULL;
out:
    tide_collection_destroy(&c);
    tide_msg_clear(&jm);
    return rc;
}
