/*
 * Unit tests for tidectl (coordinator/tidectl.c built with TIDECTL_NO_MAIN), keys and
 * CURVE: `tidectl keygen` and its key files, a CURVE client against a CURVE fake tided
 * (tidectl_fixture.h), a key refused by ZAP (exit 1, quickly), and a plain client or a
 * failed handshake told to use keys. Part of the test_tidectl executable (test_tidectl.c).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "coordinator/tidectl.h"
#include "coordinator/tidectl_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tidectl_fixture.h"

/* ---- keys and CURVE
 * ---------------------------------------------------------------------------------------- */

static char keydir[64];

static void make_keys(void)
{
    snprintf(keydir, sizeof keydir, "/tmp/tidectl-test-%d", (int)getpid());
    run_t r = run_cli("keygen", keydir, "--role", "server", NULL);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    run_free(&r);
    r = run_cli("keygen", keydir, "--name", "ops", NULL);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    run_free(&r);
}

static void remove_keys(void)
{
    const char *names[] = {"server.key", "server.pub", "ops.key", "ops.pub"};
    char path[128];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", keydir, names[i]);
        unlink(path);
    }
    rmdir(keydir);
}

Test(tidectl_keys, keygen_writes_the_agreed_format)
{
    make_keys();
    char path[128], pub[41], secret[41], pub2[41];
    struct stat st;
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600u, "the secret key file is private");
    cr_assert_eq(tidectl_read_key(path, pub, secret), TIDE_OK, "%s", tide_last_error());
    /* the secret really belongs to the public key */
    char derived[41];
    cr_assert_eq(zmq_curve_public(derived, secret), 0);
    cr_expect_str_eq(derived, pub);
    FILE *f = fopen(path, "r");
    char text[512] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "role = admin\n"), "%s", text);
    snprintf(path, sizeof path, "%s/ops.pub", keydir);
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0644u);
    cr_assert_eq(tidectl_read_key(path, pub2, NULL), TIDE_OK);
    cr_expect_str_eq(pub2, pub);
    /* a pub file is not a key pair */
    cr_expect_eq(tidectl_read_key(path, pub2, secret), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "no 'secret = ...' line"));
    /* the Z85 text itself works as --server-key */
    cr_assert_eq(tidectl_read_key(pub, pub2, NULL), TIDE_OK);
    cr_expect_str_eq(pub2, pub);
    /* no silent overwrite; --force replaces with a new key */
    run_t r = run_cli("keygen", keydir, "--name", "ops", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE);
    cr_expect(strstr(r.err, "pass --force"), "%s", r.err);
    run_free(&r);
    /* --force replaces a symlink planted at a key's path, never writes through it */
    char victim[128];
    snprintf(victim, sizeof victim, "%s/victim", keydir);
    FILE *vf = fopen(victim, "w");
    fputs("precious\n", vf);
    fclose(vf);
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    unlink(path);
    cr_assert_eq(symlink(victim, path), 0);
    r = run_cli("keygen", keydir, "--name", "ops", "--force", "--json", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600, "the link was replaced");
    vf = fopen(victim, "r");
    char vtext[32] = "";
    cr_assert(fgets(vtext, sizeof vtext, vf) != NULL);
    fclose(vf);
    cr_expect_str_eq(vtext, "precious\n", "keygen --force wrote through a symlink");
    unlink(victim);
    cr_expect(strstr(r.out, "\"role\":\"admin\",\"name\":\"ops\""), "%s", r.out);
    run_free(&r);
    snprintf(path, sizeof path, "%s/ops.key", keydir);
    cr_assert_eq(tidectl_read_key(path, pub2, secret), TIDE_OK);
    cr_expect_str_neq(pub2, pub);
    r = run_cli("keygen", keydir, "--role", "root", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE);
    cr_expect(strstr(r.err, "admin, worker, reader or server"), "%s", r.err);
    run_free(&r);
    remove_keys();
}

static void server_secret(char *secret)
{
    char path[128], pub[41];
    snprintf(path, sizeof path, "%s/server.key", keydir);
    cr_assert_eq(tidectl_read_key(path, pub, secret), TIDE_OK, "%s", tide_last_error());
}

Test(tidectl_keys, curve_client_talks_to_a_curve_server)
{
    make_keys();
    char secret[41], key[128], spub[128];
    server_secret(secret);
    snprintf(key, sizeof key, "%s/ops.key", keydir);
    snprintf(spub, sizeof spub, "%s/server.pub", keydir);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 1, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--key", key, "--server-key", spub, "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "node-a"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}

Test(tidectl_keys, key_refused_by_zap_exits_1_quickly)
{
    make_keys();
    char secret[41], key[128], spub[128];
    server_secret(secret);
    snprintf(key, sizeof key, "%s/ops.key", keydir);
    snprintf(spub, sizeof spub, "%s/server.pub", keydir);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 1, 1);
    uint64_t t0 = tide_now_ns();
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "3000", "--key", key,
                      "--server-key", spub, "status", NULL);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED, "%s", r.err);
    cr_expect(strstr(r.err, "CURVE handshake failed"), "%s", r.err);
    cr_expect_lt(ms, 2500.0, "a refused key is reported without waiting out the timeout");
    cr_expect_eq(f.requests, 0, "nothing reached the fake tided");
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}

/* A stand-in CURVE server that greets at once and never hangs up, so the client itself
 * finds the mechanism mismatch (ZMTP greeting: signature, version 3.0, "CURVE", server). */
typedef struct {
    int listen_fd;
    pthread_t thread;
    char endpoint[64];
} greeter_t;

static void *greeter_main(void *arg)
{
    greeter_t *g = arg;
    int fd = accept(g->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    unsigned char greeting[64] = {0xff, 0,   0,   0,   0,   0,   0, 0, 1, /* signature */
                                  0x7f, 3,   0,                          /* version 3.0 */
                                  'C',  'U', 'R', 'V', 'E'};
    greeting[32] = 1; /* as-server */
    if (write(fd, greeting, sizeof greeting) != (ssize_t)sizeof greeting) {
        close(fd);
        return NULL;
    }
    char sink[256];
    while (read(fd, sink, sizeof sink) > 0) /* until the client closes */
        ;
    close(fd);
    return NULL;
}

static void greeter_start(greeter_t *g)
{
    g->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(g->listen_fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(g->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(g->listen_fd, 1), 0);
    socklen_t len = sizeof a;
    getsockname(g->listen_fd, (struct sockaddr *)&a, &len);
    snprintf(g->endpoint, sizeof g->endpoint, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    pthread_create(&g->thread, NULL, greeter_main, g);
}

static void greeter_stop(greeter_t *g)
{
    pthread_join(g->thread, NULL);
    close(g->listen_fd);
}

/* Under load the I/O thread can run the whole failed handshake before tidectl sends: the
 * socket then has no pipe and refuses the request frame, which must still read as "use
 * keys", not as an unreachable tided (a loaded CI run printed "cannot queue the request"). */
Test(tidectl_keys, handshake_failed_before_the_send_is_still_told_to_use_keys)
{
    greeter_t g;
    greeter_start(&g);
    settings_t s = {.endpoint = g.endpoint, .timeout_ms = 3000};
    char *text = NULL;
    size_t len = 0;
    FILE *err = open_memstream(&text, &len);
    conn_t c;
    cr_assert_eq(tidectl__conn_open(&c, &s, err), TIDECTL_EXIT_OK);
    /* the handshake fails meanwhile; each ZMQ_EVENTS query lets the socket take one more
     * round of the teardown (term request, term, pipe gone), as a descheduled tidectl's
     * first zmq_send can on a loaded machine */
    for (int i = 0; i < 4; i++) {
        usleep(100 * 1000);
        int events;
        size_t elen = sizeof events;
        zmq_getsockopt(c.sock, ZMQ_EVENTS, &events, &elen);
    }
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    uint64_t t0 = tide_now_ns();
    int rc = tidectl__conn_call(&c, &req, &rep, err);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    tide_msg_clear(&req);
    tide_msg_clear(&rep);
    tidectl__conn_close(&c);
    fclose(err);
    cr_expect_eq(rc, TIDECTL_EXIT_REFUSED, "%s", text);
    cr_expect(strstr(text, "requires CURVE"), "%s", text);
    cr_expect_lt(ms, 2500.0, "the failed handshake is reported without waiting out the timeout");
    free(text);
    greeter_stop(&g);
}

Test(tidectl_keys, plain_client_to_curve_server_is_told_to_use_keys)
{
    make_keys();
    char secret[41];
    server_secret(secret);
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, secret, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "1000", "status", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED, "%s", r.err);
    cr_expect(strstr(r.err, "requires CURVE"), "%s", r.err);
    run_free(&r);
    fake_stop(&f);
    remove_keys();
}
