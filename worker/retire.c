/*
 * worker/retire: the retirer (retire.h): a queue of communicators and the one thread that
 * destroys them, bound to the rank's device before its first destroy.
 *
 * Workload: a few communicators per switch; each destroy may take hundreds of ms (NCCL),
 * which is why it is not the training thread's.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "worker/retire.h"

#define SUBSYS "worker"

struct tide__retire {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the queue changed: work for the thread, room or an end for the owner */
    pthread_t thread;
    int started, stop;
    const tide_coll_backend_v1 *be;
    int device;
    struct {
        tide_coll_comm_t *c;
        tide__gen_t *word; /* a reference: the word c watches outlives c */
    } q[TIDE__RETIRE_MAX];
    size_t head, count; /* a ring of count entries from head */
    int busy;           /* the thread is destroying one it took off the queue */
};

static void *retire_main(void *arg)
{
    tide__retire_t *r = arg;
    tide_status rc = tide_coll_device_bind(r->be, r->device);
    if (rc != TIDE_OK) /* destroys still run: a device backend binds inside what needs it */
        TIDE_WARN(SUBSYS, "retiring communicators: binding device %d failed: %s", r->device,
                  tide_last_error());
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->count == 0 && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->count == 0) /* stop, and nothing left */
            break;
        tide_coll_comm_t *c = r->q[r->head].c;
        tide__gen_t *word = r->q[r->head].word;
        r->q[r->head].c = NULL;
        r->q[r->head].word = NULL;
        r->head = (r->head + 1) % TIDE__RETIRE_MAX;
        r->count--;
        r->busy = 1;
        pthread_mutex_unlock(&r->mu);
        tide_coll_comm_destroy(&c);
        tide__gen_put(&word);
        pthread_mutex_lock(&r->mu);
        r->busy = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

tide_status tide__retire_new(tide__retire_t **out, const tide_coll_backend_v1 *be, int device)
{
    tide__retire_t *r = tide_calloc(1, sizeof *r);
    *out = r;
    if (r == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the communicators' retirer");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->be = be;
    r->device = device;
    return TIDE_OK;
}

/* Starts the thread if it is not running; 0 when it runs. r->mu held. */
static int start_locked(tide__retire_t *r)
{
    if (r->started)
        return 0;
    if (pthread_create(&r->thread, NULL, retire_main, r) != 0) {
        TIDE_WARN(SUBSYS, "no thread to retire communicators on: destroying them inline");
        return -1;
    }
    r->started = 1;
    return 0;
}

void tide__retire_give(tide__retire_t *r, tide_coll_comm_t **c, tide__gen_t *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (c[i] == NULL)
            continue;
        int queued = 0;
        if (r != NULL) {
            pthread_mutex_lock(&r->mu);
            if (start_locked(r) == 0) {
                while (r->count == TIDE__RETIRE_MAX)
                    pthread_cond_wait(&r->cv, &r->mu);
                size_t k = (r->head + r->count) % TIDE__RETIRE_MAX;
                r->q[k].c = c[i];
                r->q[k].word = tide__gen_ref(words[i]);
                r->count++;
                c[i] = NULL;
                queued = 1;
                pthread_cond_broadcast(&r->cv);
            }
            pthread_mutex_unlock(&r->mu);
        }
        if (!queued)
            tide_coll_comm_destroy(&c[i]);
    }
}

void tide__retire_wait(tide__retire_t *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    while (r->count > 0 || r->busy)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void tide__retire_destroy(tide__retire_t **r_p)
{
    if (r_p == NULL || *r_p == NULL)
        return;
    tide__retire_t *r = *r_p;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    int started = r->started;
    pthread_mutex_unlock(&r->mu);
    if (started) /* the thread empties the queue before it ends */
        pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    tide_free(r);
    *r_p = NULL;
}
