/*
 * worker/gens: one abort word per generation, the state libtide's threads truly share.
 * Every communicator of generation G (its groups, the switch to it, what the preparation
 * builds ahead for it) is made with G's word as its cancel flag and its watch word
 * (collectives.h): the control thread aborts them by setting the word, never touching a
 * communicator. Next to the word, G's switch state decides, by compare-and-swap, the race
 * between tided's abort of G and the training thread's commit of G: whichever comes first
 * wins, and the other learns it (an abort after the commit is reported as a failure; a
 * commit after the abort fails the switch).
 *
 * A word lives as long as someone holds it (the registry while G may still be aborted,
 * the training thread while G's communicators exist, the preparation while it builds for
 * G): reference counted, so a communicator never watches freed memory.
 *
 * Workload: a few words per resize; lookups under a mutex a handful of times per resize.
 */
#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "worker/worker_int.h"

struct tide__gen {
    uint64_t gen;
    int word;               /* the abort word: 0 alive, 1 aborted (__atomic) */
    int state;              /* tide__gen_state (__atomic) */
    int refs;               /* (__atomic) */
    int in_switch;          /* the training thread runs the switch to it (__atomic) */
    struct tide__gen *next; /* the registry's list (its mutex) */
};

struct tide__gens {
    pthread_mutex_t mu;
    tide__gen_t *head; /* newest first; each holds one reference of the registry's */
    int dead;          /* kill_all: every word, present and future, is set */
};

tide_status tide__gens_new(tide__gens_t **out)
{
    tide__gens_t *gs = tide_calloc(1, sizeof *gs);
    if (gs == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory for the generations' abort words");
    pthread_mutex_init(&gs->mu, NULL);
    *out = gs;
    return TIDE_OK;
}

void tide__gens_destroy(tide__gens_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    tide__gens_t *gs = *self_p;
    tide__gen_t *g = gs->head;
    while (g != NULL) {
        tide__gen_t *next = g->next;
        tide__gen_put(&g);
        g = next;
    }
    pthread_mutex_destroy(&gs->mu);
    tide_free(gs);
    *self_p = NULL;
}

/* The registry's entry of gen, or NULL; mu held. */
static tide__gen_t *find(tide__gens_t *gs, uint64_t gen)
{
    for (tide__gen_t *g = gs->head; g != NULL; g = g->next)
        if (g->gen == gen)
            return g;
    return NULL;
}

tide__gen_t *tide__gens_get(tide__gens_t *gs, uint64_t gen)
{
    pthread_mutex_lock(&gs->mu);
    tide__gen_t *g = find(gs, gen);
    if (g == NULL) {
        g = tide_calloc(1, sizeof *g);
        if (g != NULL) {
            g->gen = gen;
            g->refs = 1; /* the registry's */
            g->word = gs->dead;
            g->next = gs->head;
            gs->head = g;
        }
    }
    if (g != NULL)
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&gs->mu);
    return g;
}

tide__gen_t *tide__gen_ref(tide__gen_t *g)
{
    if (g != NULL)
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void tide__gen_put(tide__gen_t **g_p)
{
    if (g_p == NULL || *g_p == NULL)
        return;
    if (__atomic_sub_fetch(&(*g_p)->refs, 1, __ATOMIC_ACQ_REL) == 0)
        tide_free(*g_p);
    *g_p = NULL;
}

uint64_t tide__gen_id(const tide__gen_t *g)
{
    return g->gen;
}

const int *tide__gen_word(const tide__gen_t *g)
{
    return g != NULL ? &g->word : NULL;
}

int tide__gen_aborted(const tide__gen_t *g)
{
    return g != NULL && __atomic_load_n(&g->word, __ATOMIC_ACQUIRE) != 0;
}

tide__gen_state tide__gen_get_state(const tide__gen_t *g)
{
    return (tide__gen_state)__atomic_load_n(&g->state, __ATOMIC_ACQUIRE);
}

/* state from -> to by compare-and-swap; the state found in *seen. */
static int cas(tide__gen_t *g, int from, int to, int *seen)
{
    *seen = from;
    return __atomic_compare_exchange_n(&g->state, seen, to, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int tide__gen_switching(tide__gen_t *g)
{
    int seen;
    if (!cas(g, TIDE__GEN_PENDING, TIDE__GEN_SWITCHING, &seen))
        return 0;
    __atomic_store_n(&g->in_switch, 1, __ATOMIC_RELEASE);
    return 1;
}

void tide__gen_switch_failed(tide__gen_t *g)
{
    int seen;
    cas(g, TIDE__GEN_SWITCHING, TIDE__GEN_PENDING, &seen);
    __atomic_store_n(&g->in_switch, 0, __ATOMIC_RELEASE);
}

int tide__gen_commit(tide__gen_t *g)
{
    int seen;
    int ok = cas(g, TIDE__GEN_SWITCHING, TIDE__GEN_COMMITTED, &seen) ||
             cas(g, TIDE__GEN_PENDING, TIDE__GEN_COMMITTED, &seen);
    if (ok)
        __atomic_store_n(&g->in_switch, 0, __ATOMIC_RELEASE);
    return ok;
}

int tide__gens_in_switch(tide__gens_t *gs)
{
    pthread_mutex_lock(&gs->mu);
    int any = 0;
    for (tide__gen_t *g = gs->head; g != NULL && !any; g = g->next)
        any = __atomic_load_n(&g->in_switch, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&gs->mu);
    return any;
}

tide__gen_state tide__gens_abort(tide__gens_t *gs, uint64_t gen)
{
    pthread_mutex_lock(&gs->mu);
    tide__gen_t *g = find(gs, gen);
    tide__gen_state was = TIDE__GEN_UNKNOWN;
    if (g != NULL) {
        int seen = TIDE__GEN_PENDING;
        for (;;) {
            if (seen == TIDE__GEN_COMMITTED || seen == TIDE__GEN_ABORTED)
                break;
            if (cas(g, seen, TIDE__GEN_ABORTED, &seen)) {
                __atomic_store_n(&g->word, 1, __ATOMIC_RELEASE);
                break;
            }
        }
        was = (tide__gen_state)seen;
    }
    pthread_mutex_unlock(&gs->mu);
    return was;
}

tide__gen_state tide__gens_state(tide__gens_t *gs, uint64_t gen)
{
    pthread_mutex_lock(&gs->mu);
    tide__gen_t *g = find(gs, gen);
    tide__gen_state st = g != NULL ? tide__gen_get_state(g) : TIDE__GEN_UNKNOWN;
    pthread_mutex_unlock(&gs->mu);
    return st;
}

void tide__gens_kill(tide__gens_t *gs, uint64_t gen)
{
    pthread_mutex_lock(&gs->mu);
    tide__gen_t *g = find(gs, gen);
    if (g != NULL)
        __atomic_store_n(&g->word, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&gs->mu);
}

void tide__gens_kill_all(tide__gens_t *gs)
{
    pthread_mutex_lock(&gs->mu);
    gs->dead = 1;
    for (tide__gen_t *g = gs->head; g != NULL; g = g->next)
        __atomic_store_n(&g->word, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&gs->mu);
}

void tide__gens_kill_above(tide__gens_t *gs, uint64_t gen)
{
    pthread_mutex_lock(&gs->mu);
    for (tide__gen_t *g = gs->head; g != NULL; g = g->next)
        if (g->gen > gen)
            __atomic_store_n(&g->word, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&gs->mu);
}

void tide__gens_retire(tide__gens_t *gs, uint64_t below)
{
    pthread_mutex_lock(&gs->mu);
    tide__gen_t **pp = &gs->head;
    while (*pp != NULL) {
        tide__gen_t *g = *pp;
        if (g->gen < below) {
            *pp = g->next;
            tide__gen_put(&g);
        } else {
            pp = &g->next;
        }
    }
    pthread_mutex_unlock(&gs->mu);
}
