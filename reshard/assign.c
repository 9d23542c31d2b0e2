/*
 * Generic assignment solvers for placement (see assign.h): the Hungarian method for a
 * maximum-gain assignment and a minimum-cost flow for transportation problems. Scratch
 * memory comes from tide_calloc, so allocation failures are injectable and become
 * TIDE_ERR_NOMEM. Workload: a few hundred rows or nodes, many calls per placement.
 */
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "reshard/assign.h"

/* ---- assignment (Hungarian) ------------------------------------------------------------------ */

/* The classic potentials method on costs -g. */
tide_status tide__assign_max(const int64_t *g, int n, int m, int *a, int64_t *value)
{
    tide_status rc = TIDE_OK;
    int64_t *u = tide_calloc((size_t)n + 1, sizeof *u), *v = tide_calloc((size_t)m + 1, sizeof *v);
    int64_t *minv = tide_calloc((size_t)m + 1, sizeof *minv);
    int *p = tide_calloc((size_t)m + 1, sizeof *p), *way = tide_calloc((size_t)m + 1, sizeof *way);
    char *used = tide_calloc((size_t)m + 1, 1);
    if (!u || !v || !minv || !p || !way || !used) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory in an assignment of %d x %d", n, m);
        goto out;
    }
    for (int i = 1; i <= n; i++) {
        p[0] = i;
        int j0 = 0;
        for (int j = 0; j <= m; j++) {
            minv[j] = INT64_MAX;
            used[j] = 0;
        }
        do {
            used[j0] = 1;
            int i0 = p[j0], j1 = 0;
            int64_t delta = INT64_MAX;
            for (int j = 1; j <= m; j++) {
                if (used[j])
                    continue;
                int64_t cur = -g[(size_t)(i0 - 1) * (size_t)m + (size_t)(j - 1)] - u[i0] - v[j];
                if (cur < minv[j]) {
                    minv[j] = cur;
                    way[j] = j0;
                }
                if (minv[j] < delta) {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for (int j = 0; j <= m; j++) {
                if (used[j]) {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
        } while (p[j0] != 0);
        do {
            int j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }
    int64_t total = 0;
    for (int j = 1; j <= m; j++)
        if (p[j] != 0) {
            a[p[j] - 1] = j - 1;
            total += g[(size_t)(p[j] - 1) * (size_t)m + (size_t)(j - 1)];
        }
    if (value)
        *value = total;
out:
    tide_free(u);
    tide_free(v);
    tide_free(minv);
    tide_free(p);
    tide_free(way);
    tide_free(used);
    return rc;
}

/* ---- min-cost flow (transportation problems) --------------------------------------------------
 */

void tide__flow_clear(tide__flow *f)
{
    tide_free(f->head);
    tide_free(f->next);
    tide_free(f->to);
    tide_free(f->cap);
    tide_free(f->cost);
    memset(f, 0, sizeof *f);
}

tide_status tide__flow_init(tide__flow *f, int nv, int max_edges)
{
    memset(f, 0, sizeof *f);
    f->nv = nv;
    f->cap_e = 2 * max_edges;
    f->head = tide_calloc((size_t)nv, sizeof *f->head);
    f->next = tide_calloc((size_t)f->cap_e, sizeof *f->next);
    f->to = tide_calloc((size_t)f->cap_e, sizeof *f->to);
    f->cap = tide_calloc((size_t)f->cap_e, sizeof *f->cap);
    f->cost = tide_calloc((size_t)f->cap_e, sizeof *f->cost);
    if (!f->head || !f->next || !f->to || !f->cap || !f->cost) {
        tide__flow_clear(f);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for a flow of %d nodes", nv);
    }
    for (int v = 0; v < nv; v++)
        f->head[v] = -1;
    return TIDE_OK;
}

int tide__flow_edge(tide__flow *f, int u, int v, int64_t cap, int64_t cost)
{
    int e = f->ne;
    f->to[e] = v;
    f->cap[e] = cap;
    f->cost[e] = cost;
    f->next[e] = f->head[u];
    f->head[u] = e;
    f->to[e + 1] = u;
    f->cap[e + 1] = 0;
    f->cost[e + 1] = -cost;
    f->next[e + 1] = f->head[v];
    f->head[v] = e + 1;
    f->ne += 2;
    return e;
}

/* Successive shortest paths: graphs here have a few hundred nodes, so a Bellman-Ford
   queue is fast enough and needs no potentials. */
tide_status tide__flow_run(tide__flow *f, int s, int t, int64_t want, int64_t *flow)
{
    tide_status rc = TIDE_OK;
    int64_t *dist = tide_calloc((size_t)f->nv, sizeof *dist);
    int *pe = tide_calloc((size_t)f->nv, sizeof *pe),
        *queue = tide_calloc((size_t)f->nv, sizeof *queue);
    char *inq = tide_calloc((size_t)f->nv, 1);
    if (!dist || !pe || !queue || !inq) {
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory running a flow");
        goto out;
    }
    *flow = 0;
    while (*flow < want) {
        for (int v = 0; v < f->nv; v++) {
            dist[v] = INT64_MAX;
            pe[v] = -1;
            inq[v] = 0;
        }
        dist[s] = 0;
        int qh = 0, qn = 1;
        queue[0] = s;
        inq[s] = 1;
        while (qn > 0) {
            int u = queue[qh];
            qh = (qh + 1) % f->nv;
            qn--;
            inq[u] = 0;
            for (int e = f->head[u]; e >= 0; e = f->next[e]) {
                if (f->cap[e] <= 0)
                    continue;
                int v = f->to[e];
                int64_t nd = dist[u] + f->cost[e];
                /* Ties go to the lower edge index: deterministic. */
                if (nd < dist[v]) {
                    dist[v] = nd;
                    pe[v] = e;
                    if (!inq[v]) {
                        queue[(qh + qn) % f->nv] = v;
                        qn++;
                        inq[v] = 1;
                    }
                }
            }
        }
        if (pe[t] < 0)
            break;
        int64_t push = want - *flow;
        for (int v = t; v != s; v = f->to[pe[v] ^ 1])
            push = f->cap[pe[v]] < push ? f->cap[pe[v]] : push;
        for (int v = t; v != s; v = f->to[pe[v] ^ 1]) {
            f->cap[pe[v]] -= push;
            f->cap[pe[v] ^ 1] += push;
        }
        *flow += push;
    }
out:
    tide_free(dist);
    tide_free(pe);
    tide_free(queue);
    tide_free(inq);
    return rc;
}
