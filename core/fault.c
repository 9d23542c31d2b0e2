/*
 * Fault points (fault.h): one process-wide hook, absent in the product. The pointer is
 * atomic because points are reached on any thread (the checkpoint saver's, a join's
 * connection thread) while a test installs its hook before main.
 */
#include <stdatomic.h>
#include <stddef.h>

#include "fault.h"

static _Atomic(tide_fault_hook) fault_hook;

void tide__fault_set_hook(tide_fault_hook hook)
{
    atomic_store(&fault_hook, hook);
}

void tide__fault_point(const char *module, const char *point, long arg)
{
    tide_fault_hook h = atomic_load_explicit(&fault_hook, memory_order_relaxed);
    if (h != NULL)
        h(module, point, arg);
}
