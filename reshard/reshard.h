/*
 * reshard: reshard plans, lower bounds and placement over the tensor collections and
 * layouts of <tide/collection.h> (the public part of this module, which a program uses).
 *
 * Pure C, no I/O, deterministic: every worker and the coordinator compute the
 * same plan from the same inputs. Workload: collections of up to ~10^5 tensors,
 * layouts of up to a few thousand workers; planning a 175B model over 1,024
 * workers is expected to take tens of milliseconds on one core.
 *
 * Units: shapes and element indices in elements; every offset, length and
 * volume in a plan is in bytes.
 */
#ifndef TIDE_RESHARD_H
#define TIDE_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include <tide/collection.h> /* tensors, collections, layouts, shard geometry */
#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A Megatron-style transformer (or MLP-only stack when attention is 0). */
typedef struct tide_model_spec {
    int layers;       /* transformer blocks */
    int64_t hidden;   /* model width */
    int64_t ffn;      /* MLP inner width (0: 4 * hidden) */
    int64_t heads;    /* attention heads (ignored without attention) */
    int64_t vocab;    /* embedding rows; 0: no embedding/head tensors */
    int attention;    /* 1: ln1, fused qkv (3 segments), proj; 0: MLP blocks only */
    int adam;         /* 1: add "<name>.exp_avg" and "<name>.exp_avg_sq" per parameter */
    int zero1;        /* 1: Adam moments are DP-sharded (ZeRO-1) */
    tide_dtype dtype; /* parameter and moment dtype */
} tide_model_spec;

/*
 * Builds the collection for spec: "embed.weight" (PRE, split along vocab);
 * per block i "layer.i.ln1.{weight,bias}", "layer.i.qkv.{weight,bias}" (split
 * along output dim, 3 segments), "layer.i.proj.weight" (split along input dim),
 * "layer.i.proj.bias", "layer.i.ln2.{weight,bias}", "layer.i.fc1.{weight,bias}"
 * (column: split along output dim), "layer.i.fc2.weight" (row: split along input
 * dim), "layer.i.fc2.bias"; "final_ln.{weight,bias}" and "head.weight" (POST);
 * "step" (ALL, i64 [1]). Weights are [out, in]. Caller owns *out.
 */
tide_status tide_collection_build_gpt(tide_collection_t **out, const tide_model_spec *spec);

/* ---- reshard plans --------------------------------------------------------------- */

/*
 * One piece of a plan: count runs of run bytes of tensor `tensor`, read from
 * worker src's old local buffer at src_off + k * src_stride and written to
 * worker dst's new local buffer at dst_off + k * dst_stride (k < count).
 * src == dst is a local copy, never sent.
 */
typedef struct tide_xfer {
    uint32_t tensor;
    int32_t src, dst;
    uint64_t src_off, dst_off;
    uint64_t run, count;
    uint64_t src_stride, dst_stride;
} tide_xfer;

typedef struct tide_plan_summary {
    uint64_t bytes_sent;     /* over the network: sum of run * count with src != dst */
    uint64_t bytes_local;    /* copied locally */
    uint64_t lower_bound;    /* bytes each destination needs and does not hold, summed */
    uint64_t max_send;       /* largest per-worker send volume */
    uint64_t max_recv;       /* largest per-worker receive volume */
    uint64_t balanced_bound; /* lower bound on max_send given who holds what */
    uint64_t messages;       /* (src, dst) pairs with src != dst and data to move */
    size_t n_xfers;          /* pieces with src != dst */
    size_t n_copies;         /* pieces with src == dst */
} tide_plan_summary;

typedef struct tide_plan {
    tide_xfer *items; /* sorted by (src, dst, tensor, dst_off) */
    size_t n;
    tide_plan_summary summary;
    /* tide_reshard_plan_for only (NULL and 0 for a full plan): for every worker of the
       whole plan, sorted by id, the number of its peer streams (distinct sender ->
       receiver pairs with bytes that it is part of), so that each rank can size its
       chunks as from the full plan (collectives/executor.h) */
    int32_t *stream_worker;
    uint32_t *stream_count;
    size_t n_stream;
} tide_plan_t;

/*
 * Computes the plan that turns the state laid out under old into new, for the
 * workers marked alive (alive[w] != 0 for w < n_alive; NULL means all alive).
 * Bytes a destination already holds are copied locally; the other bytes come
 * from live holders chosen to balance per-worker send volume. If some byte has
 * no live holder, fails with TIDE_ERR_NO_HOLDER and a detail naming the tensor
 * and region. Deterministic; caller owns *out. Any thread.
 */
tide_status tide_reshard_plan(const tide_layout_t *old_l, const tide_layout_t *new_l,
                              const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                              tide_plan_t **out);

/*
 * The same plan restricted to the items where worker is src or dst, in the
 * same order; equal to filtering tide_reshard_plan's result, so the union over
 * workers is the plan. Its summary holds the whole plan's totals, with
 * n_xfers / n_copies counting this worker's items. Destinations the worker
 * does not send to are passed by tensor class, not tensor by tensor: a
 * worker's share of the plan, not the whole plan. stream_worker/stream_count
 * give every worker's peer-stream count, which the executor needs to run a
 * plan_for on each rank instead of the full plan. Caller owns *out.
 */
tide_status tide_reshard_plan_for(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                  const tide_collection_t *c, const uint8_t *alive, size_t n_alive,
                                  int32_t worker, tide_plan_t **out);

/* Frees *self_p and sets it to NULL; NULL is fine. */
void tide_plan_destroy(tide_plan_t **self_p);

/* The plan's totals, each field equal to the same field of tide_plan_summary;
   cross_host: see tide_reshard_plan_totals_hosts (0 from tide_reshard_plan_totals). */
typedef struct tide_plan_totals {
    uint64_t bytes_sent, bytes_local, lower_bound;
    uint64_t max_send, max_recv, balanced_bound;
    uint64_t messages;
    uint64_t cross_host; /* bytes sent between workers on different hosts */
} tide_plan_totals;

/*
 * The totals of tide_reshard_plan(old_l, new_l, c, alive, n_alive) without
 * building its items: what the coordinator needs to decide and estimate.
 * Equal field by field to the full plan's summary, and fails exactly when it
 * fails (same status and detail). O(workers * tensor classes per stage), not
 * O(workers * tensors): milliseconds at 10^4 workers. Any thread.
 */
tide_status tide_reshard_plan_totals(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                     const tide_collection_t *c, const uint8_t *alive,
                                     size_t n_alive, tide_plan_totals *out);

/*
 * tide_reshard_plan_totals, and in out->cross_host the bytes of the plan's items whose
 * source and destination are on different hosts: host_of[w] (w < n_host) is worker w's
 * host, any value >= 0; a worker w >= n_host or with host_of[w] < 0 has no known host and
 * its transfers count as not crossing. Exactly the sum over the full plan's items (what
 * the workers move), from the same walk as the other totals. Any thread.
 */
tide_status tide_reshard_plan_totals_hosts(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                           const tide_collection_t *c, const uint8_t *alive,
                                           size_t n_alive, const int32_t *host_of, size_t n_host,
                                           tide_plan_totals *out);

/* Exact lower bound on bytes sent for (old, new), in bytes. */
tide_status tide_reshard_lower_bound(const tide_layout_t *old_l, const tide_layout_t *new_l,
                                     const tide_collection_t *c, uint64_t *bytes);

/* ---- placement ------------------------------------------------------------------ */

/* One worker the new layout may use, and the machine it runs on. */
typedef struct tide_place_worker {
    int32_t id;   /* worker id >= 0, unique */
    int32_t host; /* host id >= 0; workers with the same host share a machine */
} tide_place_worker;

/* The new layout's shape and the workers it may use. */
typedef struct tide_place_request {
    int dp, tp, pp;                   /* new degrees, >= 1 */
    int micro_batches;                /* >= 1 */
    const int *stage_start;           /* pp + 1 layer boundaries, or NULL for even stages */
    const tide_place_worker *workers; /* available workers: old members still alive and idle
                                         ones, never failed ones; at least dp * tp * pp */
    size_t n_workers;
    int tp_across_hosts; /* 0 (default): every TP group inside one host, and
                            TIDE_ERR_NO_DEVICE when the hosts lack room; 1: hosts do not
                            constrain TP groups (the job allowed it) */
} tide_place_request;

/*
 * Chooses which available worker takes each coordinate of the new layout so
 * that tide_reshard_plan(old_l, *out, c, ...) sends the fewest bytes, subject
 * to, in order: only req->workers are used; each TP group sits inside one host
 * unless req->tp_across_hosts (TIDE_ERR_NO_DEVICE with the counts when the
 * hosts have room for fewer groups than dp * pp);
 * then, among maps sending the same bytes, pipeline neighbours (same dp rank,
 * adjacent stages) on the same or adjacent hosts, then workers keeping their
 * old (pp, dp, tp) coordinates. Workers of old_l absent from req->workers are
 * treated as lost (their state must come from replicas). old_l may be NULL (a
 * fresh job). Exact (minimum bytes) when tp = 1, when hosts do not constrain
 * TP groups, when every host has room for at most one new TP group, or when
 * the search space is small; otherwise a greedy start refined by exchanges.
 * ZeRO-1 ranges are matched after TP groups are formed. Pure and
 * deterministic; O(workers * tp + classes^2) for regular clusters (tens of ms
 * at 1,024 workers). Caller owns *out. Any thread.
 */
tide_status tide_reshard_place(const tide_layout_t *old_l, const tide_collection_t *c,
                               const tide_place_request *req, tide_layout_t **out);

/*
 * The plain rank order over req->workers as given: coordinate index k (tp
 * fastest, then dp, then pp) gets req->workers[k].id. For `--placement
 * default` and for comparing against tide_reshard_place. Caller owns *out.
 */
tide_status tide_reshard_place_default(const tide_collection_t *c, const tide_place_request *req,
                                       tide_layout_t **out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_RESHARD_H */
