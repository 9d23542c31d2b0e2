/*
 * coordinator/loop_bind: the core's sockets (see loop_int.h): the ZAP handler's socket when
 * keys are asked for, the ROUTER socket with its limits, its bind, the intake watch on its
 * connections, and the endpoint file that tells scripts and tests that tided serves.
 * server.c calls these at start, on the startup thread, before the loop runs;
 * tide__core_destroy (loop.c) closes what they opened.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "coordinator/intake.h"
#include "coordinator/loop_int.h"

/* ---- sockets --------------------------------------------------------------------------------- */

static tide_status write_endpoint_file(const char *path, const char *ep)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot write --endpoint-file %s: %s", path,
                           strerror(errno));
    fprintf(f, "%s\n", ep);
    int bad = fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return tide_errorf(TIDE_ERR_IO, "cannot write --endpoint-file %s: %s", path,
                           strerror(errno));
    }
    return TIDE_OK;
}

/* The ZAP handler's REP socket, when cfg asks for keys. */
static tide_status open_zap(tide_server_t *s)
{
    tide__core *c = s->core;
    TIDE_CHECK(tide__auth_load(&c->auth, s->cfg.auth_dir));
    c->zap = zmq_socket(c->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger);
    if (c->zap == NULL || zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
        return tide_errorf(TIDE_ERR_IO, "cannot start the ZAP handler: %s", zmq_strerror(errno));
    s->auth_on = 1;
    return TIDE_OK;
}

/* The ROUTER socket with its limits (and CURVE when auth is on), not bound yet. */
static tide_status open_router(tide_server_t *s)
{
    tide__core *c = s->core;
    c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (c->router == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_socket: %s", zmq_strerror(errno));
    int linger = 0, hwm = HWM;
    int64_t maxmsg = (int64_t)TIDE_PROTO_MAX_MSG_BYTES + 1024;
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    int mandatory = 1; /* a full queue says EAGAIN instead of dropping: see outbox.c */
    zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    c->ob.router = c->router;
    if (!s->auth_on)
        return TIDE_OK;
    int one = 1;
    zmq_setsockopt(c->router, ZMQ_ZAP_DOMAIN, "tide", 4);
    zmq_setsockopt(c->router, ZMQ_CURVE_SERVER, &one, sizeof one);
    if (zmq_setsockopt(c->router, ZMQ_CURVE_SECRETKEY, c->auth.server_secret, 41) != 0)
        return tide_errorf(TIDE_ERR_INVALID, "server.key in %s holds an invalid secret key: %s",
                           s->cfg.auth_dir, zmq_strerror(errno));
    return TIDE_OK;
}

tide_status tide__core_bind(tide_server_t *s)
{
    tide__core *c = s->core;
    const tide_server_config *cfg = &s->cfg;
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL)
        return tide_errorf(TIDE_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
    if (cfg->auth_dir != NULL && cfg->auth_dir[0] != '\0')
        TIDE_CHECK(open_zap(s));
    TIDE_CHECK(open_router(s));
    if (zmq_bind(c->router, cfg->endpoint) != 0)
        return tide_errorf(TIDE_ERR_IO,
                           "cannot bind %s: %s (is another tided running? pick another --endpoint)",
                           cfg->endpoint, zmq_strerror(errno));
    /* before the endpoint file says where to connect: every connection is watched */
    TIDE_CHECK(tide__intake_new(&c->intake, c->zctx, c->router,
                                (uint64_t)(cfg->max_client_mb > 0 ? cfg->max_client_mb : 0) << 20));
    size_t eplen = sizeof c->endpoint;
    if (zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, c->endpoint, &eplen) != 0)
        snprintf(c->endpoint, sizeof c->endpoint, "%s", cfg->endpoint);
    return TIDE_OK;
}

tide_status tide__core_announce(tide_server_t *s)
{
    const char *path = s->cfg.endpoint_file;
    if (path == NULL || path[0] == '\0')
        return TIDE_OK;
    return write_endpoint_file(path, s->core->endpoint);
}

const char *tide__core_endpoint(const tide_server_t *s)
{
    return s->core->endpoint;
}
