/*
 * Two generic assignment solvers that placement (place.c) is built on, with no notion
 * of workers, hosts or layouts: a maximum-gain assignment of rows to columns (the
 * Hungarian method) and a minimum-cost flow (successive shortest paths) for
 * transportation problems. Internal to reshard/; integer arithmetic throughout, so
 * results are exact and deterministic (ties go to the lower index). Workload: matrices
 * and graphs of a few hundred rows or nodes, many times per placement decision.
 */
#ifndef TIDE_RESHARD_ASSIGN_H
#define TIDE_RESHARD_ASSIGN_H

#include <stdint.h>

#include <tide/status.h>

/*
 * Max-gain assignment of the n rows of g (n x m, row-major, m >= n) to distinct
 * columns: a[row] = column (caller's array of n); *value the total gain (value may be
 * NULL). O(n^2 m) time, O(n + m) scratch memory (TIDE_ERR_NOMEM when it cannot be had).
 * Gains must keep every partial sum within int64. Any thread.
 */
tide_status tide__assign_max(const int64_t *g, int n, int m, int *a, int64_t *value);

/*
 * A flow network with capacities and costs, in caller-owned storage
 * (tide__flow_init / tide__flow_clear). Edge e and its reverse e ^ 1 are stored side
 * by side: after tide__flow_run, cap[e ^ 1] is the flow that edge e carries, which a
 * caller may decrement as it hands that flow out unit by unit.
 */
typedef struct tide__flow {
    int nv, ne, cap_e;
    int *head, *next, *to;
    int64_t *cap, *cost;
} tide__flow;

/* Sets up an empty network of nv nodes with room for max_edges edges; on failure f is
   cleared and TIDE_ERR_NOMEM returned. Any thread. */
tide_status tide__flow_init(tide__flow *f, int nv, int max_edges);

/* Frees the network's arrays and zeroes f; safe on a zeroed or cleared f. */
void tide__flow_clear(tide__flow *f);

/* Adds edge u -> v (within the room given to tide__flow_init) and its reverse; returns
   the edge's index (the reverse is index ^ 1). */
int tide__flow_edge(tide__flow *f, int u, int v, int64_t cap, int64_t cost);

/*
 * Sends up to `want` units from s to t at minimum cost (Bellman-Ford queue, augmenting
 * by bottlenecks); *flow the amount sent, less than want when the network cannot carry
 * it. TIDE_ERR_NOMEM when its scratch arrays cannot be had. Any thread.
 */
tide_status tide__flow_run(tide__flow *f, int s, int t, int64_t want, int64_t *flow);

#endif /* TIDE_RESHARD_ASSIGN_H */
