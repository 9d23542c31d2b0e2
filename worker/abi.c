/*
 * The layout of the public structs as compiled into this library (tide_abi_sizeof,
 * tide_abi_offsetof in tide.h), for bindings that mirror them by hand: the Python
 * package checks every struct it declares against these at load time, so a library
 * and a binding of different versions fail with a message naming the struct and the
 * field instead of corrupting memory. A field added to a struct changes its size; one
 * moved or retyped changes offsets; a field the binding mirrors must be listed here.
 * Workload: a few hundred string comparisons, once per load.
 */
#include <stddef.h>
#include <string.h>

#include <tide/tide.h>

/* X(type, field) for every field of every struct a binding may mirror. */
#define TIDE__ABI_FIELDS(X)                                                                        \
    X(tide_options, endpoint)                                                                      \
    X(tide_options, key_file)                                                                      \
    X(tide_options, server_key)                                                                    \
    X(tide_options, pool)                                                                          \
    X(tide_options, backend)                                                                       \
    X(tide_options, device)                                                                        \
    X(tide_options, mem_bytes)                                                                     \
    X(tide_options, register_timeout_ms)                                                           \
    X(tide_options, join_timeout_ms)                                                               \
    X(tide_options, switch_timeout_ms)                                                             \
    X(tide_options, staging_cap)                                                                   \
    X(tide_options, mem_strict)                                                                    \
    X(tide_options, heartbeat_aggregate)                                                           \
    X(tide_options, min_gpus)                                                                      \
    X(tide_options, max_gpus)                                                                      \
    X(tide_options, priority)                                                                      \
    X(tide_join_req, job)                                                                          \
    X(tide_join_req, collection)                                                                   \
    X(tide_join_req, dp)                                                                           \
    X(tide_join_req, tp)                                                                           \
    X(tide_join_req, pp)                                                                           \
    X(tide_join_req, micro_batches)                                                                \
    X(tide_join_req, start_step)                                                                   \
    X(tide_join_req, fit)                                                                          \
    X(tide_join_req, n_fit)                                                                        \
    X(tide_fit_rule, degree)                                                                       \
    X(tide_fit_rule, n)                                                                            \
    X(tide_fit_rule, what)                                                                         \
    X(tide_view, generation)                                                                       \
    X(tide_view, layout)                                                                           \
    X(tide_view, member)                                                                           \
    X(tide_view, pp_rank)                                                                          \
    X(tide_view, dp_rank)                                                                          \
    X(tide_view, tp_rank)                                                                          \
    X(tide_view, step)                                                                             \
    X(tide_view, all)                                                                              \
    X(tide_view, tp)                                                                               \
    X(tide_view, dp)                                                                               \
    X(tide_view, pp)                                                                               \
    X(tide_view, pp_prev)                                                                          \
    X(tide_view, pp_next)                                                                          \
    X(tide_layout_t, dp)                                                                           \
    X(tide_layout_t, tp)                                                                           \
    X(tide_layout_t, pp)                                                                           \
    X(tide_layout_t, num_layers)                                                                   \
    X(tide_layout_t, micro_batches)                                                                \
    X(tide_layout_t, stage_start)                                                                  \
    X(tide_layout_t, worker)                                                                       \
    X(tide_tensor_desc, name)                                                                      \
    X(tide_tensor_desc, dtype)                                                                     \
    X(tide_tensor_desc, ndim)                                                                      \
    X(tide_tensor_desc, shape)                                                                     \
    X(tide_tensor_desc, layer)                                                                     \
    X(tide_tensor_desc, tp)                                                                        \
    X(tide_tensor_desc, tp_dim)                                                                    \
    X(tide_tensor_desc, tp_segments)                                                               \
    X(tide_tensor_desc, dp)                                                                        \
    X(tide_p2p_op, kind)                                                                           \
    X(tide_p2p_op, peer)                                                                           \
    X(tide_p2p_op, buf)                                                                            \
    X(tide_p2p_op, bytes)                                                                          \
    X(tide_p2p_op, run)                                                                            \
    X(tide_p2p_op, stride)                                                                         \
    X(tide_reshard_stats, bytes_sent)                                                              \
    X(tide_reshard_stats, bytes_recv)                                                              \
    X(tide_reshard_stats, bytes_local)                                                             \
    X(tide_reshard_stats, plan_ms)                                                                 \
    X(tide_reshard_stats, move_ms)                                                                 \
    X(tide_reshard_stats, comm_ms)                                                                 \
    X(tide_reshard_stats, total_ms)                                                                \
    X(tide_reshard_stats, wait_ms)                                                                 \
    X(tide_reshard_stats, sync_ms)                                                                 \
    X(tide_reshard_stats, groups_ms)                                                               \
    X(tide_reshard_stats, teardown_ms)                                                             \
    X(tide_reshard_stats, prepared)                                                                \
    X(tide_reshard_stats, state_old)                                                               \
    X(tide_reshard_stats, state_new)                                                               \
    X(tide_reshard_stats, staging_cap)                                                             \
    X(tide_reshard_stats, mem_limit)                                                               \
    X(tide_reshard_stats, peak_extra)                                                              \
    X(tide_reshard_stats, no_room)                                                                 \
    X(tide_reshard_stats, bytes_kept)                                                              \
    X(tide_reshard_stats, bytes_shrunk)                                                            \
    X(tide_reshard_stats, bytes_rebuilt)                                                           \
    X(tide_reshard_stats, bytes_spilled)                                                           \
    X(tide_reshard_stats, fresh_bytes)                                                             \
    X(tide_reshard_stats, join_ms)                                                                 \
    X(tide_bubble_stats, windows)                                                                  \
    X(tide_bubble_stats, bubble_ms)                                                                \
    X(tide_bubble_stats, filled_ms)                                                                \
    X(tide_bubble_stats, task_steps)                                                               \
    X(tide_bubble_stats, task)

#define TIDE__ABI_TYPES(X)                                                                         \
    X(tide_options)                                                                                \
    X(tide_join_req)                                                                               \
    X(tide_fit_rule)                                                                               \
    X(tide_view)                                                                                   \
    X(tide_layout_t)                                                                               \
    X(tide_tensor_desc)                                                                            \
    X(tide_p2p_op)                                                                                 \
    X(tide_reshard_stats)                                                                          \
    X(tide_bubble_stats)

typedef struct abi_type {
    const char *name;
    size_t size;
} abi_type;

typedef struct abi_field {
    const char *type, *field;
    size_t offset;
} abi_field;

#define TYPE_ROW(t)     {#t, sizeof(t)},
#define FIELD_ROW(t, f) {#t, #f, offsetof(t, f)},
static const abi_type types[] = {TIDE__ABI_TYPES(TYPE_ROW)};
static const abi_field fields[] = {TIDE__ABI_FIELDS(FIELD_ROW)};
#undef TYPE_ROW
#undef FIELD_ROW

size_t tide_abi_sizeof(const char *type)
{
    for (size_t i = 0; type != NULL && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, type) == 0)
            return types[i].size;
    return 0;
}

size_t tide_abi_offsetof(const char *type, const char *field)
{
    for (size_t i = 0; type != NULL && field != NULL && i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].type, type) == 0 && strcmp(fields[i].field, field) == 0)
            return fields[i].offset;
    return (size_t)-1;
}

size_t tide_abi_nfields(const char *type)
{
    size_t n = 0;
    for (size_t i = 0; type != NULL && i < sizeof fields / sizeof fields[0]; i++)
        n += strcmp(fields[i].type, type) == 0;
    return n;
}
