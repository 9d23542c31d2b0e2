/*
 * tided's CURVE authentication (tests/tided_fixture.h): the roles a key file grants
 * (worker, admin, reader), keys tided does not know, worker ids bound to the key that
 * registered them, and a bind beyond loopback refused without authentication.
 */
#include "tests/tided_fixture.h"

static void write_key(const char *dir, const char *name, const char *pub, const char *sec,
                      const char *role)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "# test key\npublic = %s\n", pub);
    if (sec)
        fprintf(f, "secret = %s\n", sec);
    if (role)
        fprintf(f, "role = %s\n", role);
    fclose(f);
}

Test(tided, curve_roles_and_unknown_keys, .init = setup, .fini = teardown)
{
    char sp[41], ss[41], ap[41], as[41], wp[41], ws[41], xp[41], xs[41], vp[41], vs[41];
    char rp[41], rs[41];
    cr_assert_eq(zmq_curve_keypair(sp, ss), 0);
    zmq_curve_keypair(rp, rs);
    write_key(proc.dir, "r.pub", rp, NULL, "reader");
    zmq_curve_keypair(ap, as);
    zmq_curve_keypair(wp, ws);
    zmq_curve_keypair(xp, xs);
    zmq_curve_keypair(vp, vs);
    write_key(proc.dir, "w2.pub", vp, NULL, "worker");
    write_key(proc.dir, "server.key", sp, ss, NULL);
    write_key(proc.dir, "admin.pub", ap, NULL, "admin");
    write_key(proc.dir, "w.pub", wp, NULL, "worker");
    write_key(proc.dir, "stranger.key", xp, xs, "admin"); /* a .key, not allowed */
    const char *extra[] = {"--auth", proc.dir, NULL};
    start(extra);
    tide_msg_t m, r;
    void *admin = coord_connect(ctx, proc.endpoint, ap, as, sp, 3000);
    void *worker = coord_connect(ctx, proc.endpoint, wp, ws, sp, 3000);
    void *stranger = coord_connect(ctx, proc.endpoint, xp, xs, sp, 700);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    tide_msg_clear(&r);
    coord_mk_register(&m, POOL, 0, 1, "host0", 0, 42);
    admin_call(worker, &m, &r, TIDE_MSG_REGISTER_OK);
    int32_t id0 = r.u.register_ok.worker;
    tide_msg_clear(&r);
    /* another worker key may not speak for that worker id, nor take its (pool, rank) over */
    void *other = coord_connect(ctx, proc.endpoint, vp, vs, sp, 3000);
    coord_mk_heartbeat(&m, id0, 5, 1);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_BYE);
    m.u.bye.worker = id0;
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    coord_mk_register(&m, POOL, 0, 1, "host9", 0, 43);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    /* ... nor add ranks to the pool that key registered */
    coord_mk_register(&m, POOL, 1, 2, "host9", 0, 44);
    admin_call(other, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "registered with another key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    /* a reader key reads status and jobs, and may neither register nor act */
    void *reader = coord_connect(ctx, proc.endpoint, rp, rs, sp, 3000);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(reader, &m, &r, TIDE_MSG_JOBS_REPLY);
    tide_msg_clear(&r);
    coord_mk_register(&m, "reader-pool", 0, 1, "host8", 0, 45);
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "needs a worker or admin key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    coord_mk_heartbeat(&m, id0, 7, 1);
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = id0;
    admin_call(reader, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    cr_assert(strstr(r.u.error.message, "needs an admin key"), "%s", r.u.error.message);
    tide_msg_clear(&r);
    zmq_close(reader);
    /* every key may read status and jobs (libtide learns failed peers from status) ... */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(other, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.n_rows, 1);
    cr_assert_eq(r.u.status_reply.rows[0].state, TIDE_WORKER_IDLE, "the bye was not acted on");
    cr_assert_eq(r.u.status_reply.rows[0].step, 0, "the heartbeat was not acted on");
    cr_assert_str_eq(r.u.status_reply.rows[0].host, "host0", "the register was not acted on");
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_JOBS);
    admin_call(worker, &m, &r, TIDE_MSG_JOBS_REPLY);
    tide_msg_clear(&r);
    /* ... but the event history is for admins */
    tide_msg_init(&m, TIDE_MSG_EVENTS);
    m.u.events.limit = 10;
    admin_call(worker, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    /* the owner's own heartbeat counts */
    coord_mk_heartbeat(&m, id0, 9, 1);
    cr_assert_eq(coord_send(worker, &m), 0);
    for (int tries = 0; tries < 100; tries++) {
        tide_msg_init(&m, TIDE_MSG_STATUS);
        admin_call(worker, &m, &r, TIDE_MSG_STATUS_REPLY);
        uint64_t step = r.u.status_reply.rows[0].step;
        tide_msg_clear(&r);
        if (step == 9)
            break;
        cr_assert_lt(tries, 99, "the owner's heartbeat was not taken");
        tide_sleep_ms(10);
    }
    zmq_close(other);
    /* a worker key may not resize or submit: refused, nothing done */
    tide_msg_init(&m, TIDE_MSG_DRAIN);
    m.u.drain.worker = 0;
    admin_call(worker, &m, &r, TIDE_MSG_ERROR);
    cr_assert_eq(r.u.error.code, TIDE_ERR_DENIED);
    tide_msg_clear(&r);
    tide_msg_init(&m, TIDE_MSG_STATUS);
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    cr_assert_eq(r.u.status_reply.n_rows, 1);
    cr_assert_eq(r.u.status_reply.rows[0].state, TIDE_WORKER_IDLE, "the drain was not acted on");
    tide_msg_clear(&r);
    /* a key that is not in the directory never gets an answer */
    tide_msg_init(&m, TIDE_MSG_STATUS);
    coord_send(stranger, &m);
    cr_assert_neq(coord_recv(stranger, &r), 0, "an unknown key was served");
    /* plain (non-CURVE) clients are refused too */
    void *plain = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 700);
    coord_send(plain, &m);
    cr_assert_neq(coord_recv(plain, &r), 0, "a plain client was served");
    admin_call(admin, &m, &r, TIDE_MSG_STATUS_REPLY);
    tide_msg_clear(&r);
    zmq_close(admin);
    zmq_close(worker);
    zmq_close(stranger);
    zmq_close(plain);
}

Test(tided, non_loopback_bind_without_auth_is_refused, .init = setup, .fini = teardown)
{
    const char *extra[] = {"--endpoint", "tcp://0.0.0.0:*", NULL};
    int st = 0;
    cr_assert_neq(coord_start(&proc, TIDED_PATH, extra, &st), 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
}
