/*
 * worker/mailbox: a FIFO of decoded control messages between libtide's background
 * thread (producer) and the training thread (consumer), guarded by a mutex and a
 * condition variable. Two of them per runtime: the intents tided sends (drained by the
 * training thread at its step boundaries, its progress published under the same lock)
 * and the replies to the training thread's own requests. Workload: a few messages per
 * resize; a lock and a test per step boundary.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "worker/worker_int.h"

typedef struct node {
    struct node *next;
    tide_msg_t msg;
} node;

struct tide__mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    node *head, *tail;
    size_t len;
    int closed;
};

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

tide_status tide__mailbox_new(tide__mailbox_t **out)
{
    tide__mailbox_t *mb = tide_calloc(1, sizeof *mb);
    if (mb == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory allocating a mailbox");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&mb->mu, NULL);
    pthread_cond_init(&mb->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = mb;
    return TIDE_OK;
}

void tide__mailbox_destroy(tide__mailbox_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__mailbox_t *mb = *self_p;
    for (node *n = mb->head, *next; n != NULL; n = next) {
        next = n->next;
        tide_msg_clear(&n->msg);
        tide_free(n);
    }
    pthread_mutex_destroy(&mb->mu);
    pthread_cond_destroy(&mb->cv);
    tide_free(mb);
    *self_p = NULL;
}

/* Appends n (its message set); mu held. */
static void append(tide__mailbox_t *mb, node *n)
{
    n->next = NULL;
    if (mb->tail)
        mb->tail->next = n;
    else
        mb->head = n;
    mb->tail = n;
    mb->len++;
    pthread_cond_broadcast(&mb->cv);
}

tide_status tide__mailbox_push(tide__mailbox_t *mb, tide_msg_t *msg)
{
    node *n = tide_malloc(sizeof *n);
    if (n == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory queueing a '%s' message",
                           tide_msg_type_name(msg->type));
    pthread_mutex_lock(&mb->mu);
    if (mb->closed) {
        pthread_mutex_unlock(&mb->mu);
        tide_free(n);
        return tide_errorf(TIDE_ERR_CLOSED, "mailbox closed");
    }
    n->msg = *msg;
    tide_msg_init(msg, TIDE_MSG_NONE);
    append(mb, n);
    pthread_mutex_unlock(&mb->mu);
    return TIDE_OK;
}

tide_status tide__mailbox_push_with(tide__mailbox_t *mb, tide__mailbox_build_fn build, void *ctx)
{
    node *n = tide_malloc(sizeof *n);
    if (n == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory queueing a message");
    tide_msg_init(&n->msg, TIDE_MSG_NONE);
    pthread_mutex_lock(&mb->mu);
    int post = build(ctx, &n->msg) && !mb->closed;
    if (post)
        append(mb, n);
    pthread_mutex_unlock(&mb->mu);
    if (!post) {
        tide_msg_clear(&n->msg);
        tide_free(n);
    }
    return TIDE_OK;
}

void tide__mailbox_drain(tide__mailbox_t *mb, tide__mailbox_apply_fn apply, void *apply_ctx,
                         void (*then)(void *), void *then_ctx)
{
    pthread_mutex_lock(&mb->mu);
    node *n = mb->head;
    mb->head = mb->tail = NULL;
    mb->len = 0;
    while (n != NULL) {
        node *next = n->next;
        apply(apply_ctx, &n->msg);
        tide_msg_clear(&n->msg);
        tide_free(n);
        n = next;
    }
    if (then != NULL)
        then(then_ctx);
    pthread_mutex_unlock(&mb->mu);
}

void tide__mailbox_locked(tide__mailbox_t *mb, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&mb->mu);
    fn(ctx);
    pthread_mutex_unlock(&mb->mu);
}

void tide__mailbox_wait(tide__mailbox_t *mb, int timeout_ms)
{
    struct timespec ts;
    deadline_after(&ts, timeout_ms);
    pthread_mutex_lock(&mb->mu);
    if (mb->head == NULL && !mb->closed)
        pthread_cond_timedwait(&mb->cv, &mb->mu, &ts);
    pthread_mutex_unlock(&mb->mu);
}

tide_status tide__mailbox_pop(tide__mailbox_t *mb, tide_msg_t *out, int timeout_ms)
{
    struct timespec ts;
    if (timeout_ms >= 0)
        deadline_after(&ts, timeout_ms);
    pthread_mutex_lock(&mb->mu);
    while (mb->head == NULL && !mb->closed) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&mb->cv, &mb->mu);
        } else if (pthread_cond_timedwait(&mb->cv, &mb->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    node *n = mb->head;
    if (n == NULL) {
        int closed = mb->closed;
        pthread_mutex_unlock(&mb->mu);
        tide_msg_init(out, TIDE_MSG_NONE);
        return closed ? tide_errorf(TIDE_ERR_CLOSED, "mailbox closed")
                      : tide_errorf(TIDE_ERR_TIMEOUT, "no message within %d ms", timeout_ms);
    }
    mb->head = n->next;
    if (mb->head == NULL)
        mb->tail = NULL;
    mb->len--;
    pthread_mutex_unlock(&mb->mu);
    *out = n->msg;
    tide_free(n);
    return TIDE_OK;
}

void tide__mailbox_close(tide__mailbox_t *mb)
{
    pthread_mutex_lock(&mb->mu);
    mb->closed = 1;
    pthread_cond_broadcast(&mb->cv);
    pthread_mutex_unlock(&mb->mu);
}

size_t tide__mailbox_len(tide__mailbox_t *mb)
{
    pthread_mutex_lock(&mb->mu);
    size_t n = mb->len;
    pthread_mutex_unlock(&mb->mu);
    return n;
}
