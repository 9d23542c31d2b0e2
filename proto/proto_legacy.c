/*
 * proto legacy (proto_legacy.h): the state-file formats of tided's schema 1, read into
 * records. Each parser is the one coordinator/state.c used before, moved here unchanged
 * in what it accepts, so that every file an older tided wrote reads exactly as it did;
 * the record it yields is then checked like any decoded one (tide_msg_validate). Runs
 * once per job when tided migrates a state file; never on a hot path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto_legacy.h"

#define LAYERS_MAX 1000000 /* the old text format's bound on layers */

/* Fails with TIDE_ERR_PROTOCOL: "stored <what> malformed: <why> in '<text>'" (text: NULL
   when it is not text). */
static tide_status malformed(tide_msg_t *out, const char *what, const char *text, const char *why)
{
    tide_msg_clear(out);
    if (text == NULL)
        return tide_errorf(TIDE_ERR_PROTOCOL, "stored %s malformed: %s", what, why);
    size_t n = strlen(text);
    return tide_errorf(TIDE_ERR_PROTOCOL, "stored %s malformed: %s in '%.*s%s'", what, why,
                       (int)(n < 120 ? n : 120), text, n < 120 ? "" : "...");
}

/* The record built checks like a decoded one; a refusal is bad stored data. */
static tide_status checked(tide_msg_t *out, const char *what)
{
    tide_status rc = tide_msg_validate(out);
    if (rc == TIDE_OK)
        return TIDE_OK;
    tide_msg_clear(out);
    return tide_errorf(TIDE_ERR_PROTOCOL, "stored %s: %s", what, tide_last_error());
}

/* ---- layout ------------------------------------------------------------------------------- */

/* strtol (leading blanks skipped, as the old reader did) into [lo, hi]; 0 or -1. */
static int parse_long(const char **p, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (end == *p || errno != 0 || v < lo || v > hi)
        return -1;
    *p = end;
    *out = v;
    return 0;
}

tide_status tide_proto_legacy_layout(const char *text, uint64_t gen, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_JOB_LAYOUT);
    tide_proto_layout_t *l = &out->u.job_layout.layout;
    const char *p = text;
    long v[5];
    for (int i = 0; i < 5; i++)
        if (parse_long(&p, 1, i == 3 ? LAYERS_MAX : TIDE_PROTO_DEGREE_MAX, &v[i]) != 0)
            return malformed(out, "layout", text, "a degree, layer or micro-batch count");
    if (*p++ != '|')
        return malformed(out, "layout", text, "no '|' after the degrees");
    if ((uint64_t)v[0] * (uint64_t)v[1] * (uint64_t)v[2] > TIDE_PROTO_WORKERS_MAX || v[3] < v[2])
        return malformed(out, "layout", text, "more workers than allowed, or pp > layers");
    l->gen = gen;
    l->dp = (int)v[0];
    l->tp = (int)v[1];
    l->pp = (int)v[2];
    l->num_layers = (int)v[3];
    l->micro_batches = (int)v[4];
    size_t n = (size_t)l->dp * (size_t)l->tp * (size_t)l->pp;
    l->stage_start = tide_malloc(((size_t)l->pp + 1) * sizeof *l->stage_start);
    l->worker = tide_malloc(n * sizeof *l->worker);
    if (l->stage_start == NULL || l->worker == NULL) {
        tide_msg_clear(out);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading a stored layout");
    }
    for (int s = 0; s <= l->pp; s++) {
        long x = 0;
        if (parse_long(&p, 0, l->num_layers, &x) != 0)
            return malformed(out, "layout", text, "a stage boundary");
        l->stage_start[s] = (int)x;
    }
    if (*p++ != '|')
        return malformed(out, "layout", text, "no worker list");
    for (size_t i = 0; i < n; i++) {
        long x = 0;
        if (parse_long(&p, 0, INT32_MAX, &x) != 0)
            return malformed(out, "layout", text, "fewer workers than dp * tp * pp");
        l->worker[i] = (int32_t)x;
    }
    if (*p != '\0')
        return malformed(out, "layout", text, "trailing text");
    return checked(out, "layout");
}

/* ---- pools ------------------------------------------------------------------------------- */

/* One more pool at the end of the record's (room for TIDE_PROTO_JOB_POOLS_MAX). */
static tide_proto_job_pool_t *add_pool(tide_msg_t *out)
{
    tide_proto_job_pools_t *x = &out->u.job_pools;
    if (x->pools == NULL)
        x->pools = tide_calloc(TIDE_PROTO_JOB_POOLS_MAX, sizeof *x->pools);
    if (x->pools == NULL || x->n_pools == TIDE_PROTO_JOB_POOLS_MAX)
        return NULL;
    return &x->pools[x->n_pools++];
}

tide_status tide_proto_legacy_pools(const char *text, int32_t size0, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_JOB_POOLS);
    if (text == NULL || text[0] == '\0')
        return TIDE_OK;
    if (strchr(text, ' ') == NULL) { /* a state file from before jobs spanned pools */
        size_t tl = strlen(text);
        if (tl > TIDE_PROTO_NAME_MAX)
            return malformed(out, "pool list", text, "a pool name too long");
        tide_proto_job_pool_t *p = add_pool(out);
        if (p == NULL)
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading pools");
        memcpy(p->name, text, tl + 1);
        p->size = size0 > 0 ? size0 : 1;
        p->connected = 1;
        return checked(out, "pool list");
    }
    for (const char *p = text; *p;) {
        char name[TIDE_PROTO_NAME_MAX + 1];
        int size = 0, conn = 0, used = 0, more = 0;
        unsigned long long left = 0;
        if (sscanf(p, "%127[^ ;] %d %d%n", name, &size, &conn, &used) != 3 || conn < 0 || conn > 2)
            return malformed(out, "pool list", text, "not 'name size state' per pool");
        if (conn == 2 && (sscanf(p + used, " %llu%n", &left, &more) != 1 || left == 0))
            return malformed(out, "pool list", text, "a pool left at no generation");
        tide_proto_job_pool_t *pool = add_pool(out);
        if (pool == NULL) {
            if (out->u.job_pools.pools == NULL) {
                tide_msg_clear(out);
                return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading pools");
            }
            return malformed(out, "pool list", text, "more than 16 pools");
        }
        memcpy(pool->name, name, sizeof pool->name);
        pool->size = size;
        pool->connected = conn == 1;
        pool->left = left;
        p += used + more;
        if (*p == ';')
            p++;
        else if (*p != '\0')
            return malformed(out, "pool list", text, "no ';' between pools");
    }
    return checked(out, "pool list");
}

/* ---- fit rules ------------------------------------------------------------------------------ */

/* One "DEGREE N[ WHAT]" line [p, end) into *r, exactly as the old writer wrote it (no other
   spacing, signs or leading zeros); 0 when it is not. */
static int parse_fit_line(const char *p, const char *end, tide_proto_fit_t *r)
{
    memset(r, 0, sizeof *r);
    size_t name = (size_t)(end - p) > 9 && strncmp(p, "dp_micro ", 9) == 0 ? 8 : 2;
    if ((size_t)(end - p) < name + 2 || p[name] != ' ')
        return 0;
    if (name == 8)
        r->degree = 3;
    else if (strncmp(p, "dp", 2) == 0)
        r->degree = 0;
    else if (strncmp(p, "tp", 2) == 0)
        r->degree = 1;
    else if (strncmp(p, "pp", 2) == 0)
        r->degree = 2;
    else
        return 0;
    const char *q = p + name + 1;
    if (*q < '1' || *q > '9')
        return 0;
    int64_t n = 0;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        if (n > (INT64_MAX - (*q - '0')) / 10)
            return 0;
        n = n * 10 + (*q - '0');
    }
    r->n = n;
    if (q == end)
        return 1;
    if (*q != ' ' || end - (q + 1) > TIDE_PROTO_FIT_WHAT_MAX || q + 1 == end)
        return 0;
    memcpy(r->what, q + 1, (size_t)(end - (q + 1)));
    return 1;
}

tide_status tide_proto_legacy_fit(const char *text, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_JOB_FIT);
    tide_proto_job_fit_t *x = &out->u.job_fit;
    if (text == NULL || text[0] == '\0')
        return TIDE_OK;
    x->fit = tide_calloc(TIDE_PROTO_FIT_MAX, sizeof *x->fit);
    if (x->fit == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading fit rules");
    for (const char *p = text; *p != '\0';) {
        const char *end = strchr(p, '\n');
        char why[64];
        snprintf(why, sizeof why, "fit rule %u", x->n_fit);
        if (end == NULL)
            return malformed(out, "fit rules", text, "a fit rule without its line end");
        if (x->n_fit == TIDE_PROTO_FIT_MAX)
            return malformed(out, "fit rules", text, "more than 32 fit rules");
        if (!parse_fit_line(p, end, &x->fit[x->n_fit]))
            return malformed(out, "fit rules", text, why);
        x->n_fit++;
        p = end + 1;
    }
    return checked(out, "fit rules");
}

/* ---- checkpoints ------------------------------------------------------------------------------
 */

tide_status tide_proto_legacy_ckpts(const char *text, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_JOB_CKPTS);
    tide_proto_job_ckpts_t *x = &out->u.job_ckpts;
    if (text == NULL || text[0] == '\0')
        return TIDE_OK;
    x->ckpts = tide_calloc(TIDE_PROTO_CKPTS_MAX, sizeof *x->ckpts);
    if (x->ckpts == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading checkpoints");
    for (const char *p = text; *p != '\0';) {
        const char *end = strchr(p, '\n'), *tab = strchr(p, '\t');
        char *num_end = NULL;
        errno = 0;
        long long step = strtoll(p, &num_end, 10);
        size_t dlen = end != NULL && tab != NULL && tab < end ? (size_t)(end - tab - 1) : 0;
        if (end == NULL || tab == NULL || tab > end || num_end != tab || p[0] < '0' || p[0] > '9' ||
            errno != 0 || dlen == 0 || dlen > TIDE_PROTO_TEXT_MAX)
            return malformed(out, "checkpoints", text, "not 'STEP<tab>DIR' per line");
        if (x->n_ckpts == TIDE_PROTO_CKPTS_MAX)
            return malformed(out, "checkpoints", text, "more than 8 checkpoints");
        if (x->n_ckpts > 0 && x->ckpts[x->n_ckpts - 1].step >= step)
            return malformed(out, "checkpoints", text, "steps not in increasing order");
        x->ckpts[x->n_ckpts].step = step;
        memcpy(x->ckpts[x->n_ckpts].dir, tab + 1, dlen);
        x->n_ckpts++;
        p = end + 1;
    }
    return checked(out, "checkpoints");
}

/* ---- argv ------------------------------------------------------------------------------------ */

tide_status tide_proto_legacy_argv(const void *bytes, size_t len, tide_msg_t *out)
{
    tide_msg_init(out, TIDE_MSG_JOB_ARGV);
    tide_proto_job_argv_t *x = &out->u.job_argv;
    const char *b = bytes;
    if (len == 0)
        return TIDE_OK;
    if (b[len - 1] != '\0')
        return malformed(out, "command line", NULL, "its last argument is not terminated");
    uint32_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += b[i] == '\0';
    if (n > TIDE_PROTO_ARGV_MAX)
        return malformed(out, "command line", NULL, "more than 256 arguments");
    x->argv = tide_calloc(n, sizeof *x->argv);
    if (x->argv == NULL)
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading a command line");
    for (size_t at = 0; x->argc < n; x->argc++) {
        x->argv[x->argc] = tide_strdup(b + at);
        if (x->argv[x->argc] == NULL) {
            tide_msg_clear(out);
            return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading a command line");
        }
        at += strlen(b + at) + 1;
    }
    return checked(out, "command line");
}
