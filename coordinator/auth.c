/*
 * coordinator/auth: CURVE keys for tided --auth DIR (files read by
 * core/keyfile, format in docs/operator.md: server.key holds tided's pair, each
 * <name>.pub an allowed client key and its role) and the ZAP
 * handler that admits only those keys. ZAP requests arrive on an inproc REP
 * socket served from the main event loop; the role travels to every message
 * as its User-Id ("admin:NAME" / "worker:NAME" / "reader:NAME").
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/keyfile.h"
#include "core/log.h"
#include "coordinator/auth.h"
#include "proto/proto.h"

tide_status tide__auth_load(tide__auth *a, const char *dir)
{
    memset(a, 0, sizeof *a);
    char path[1024];
    snprintf(path, sizeof path, "%s/server.key", dir);
    tide_keyfile server;
    TIDE_CHECK(tide_keyfile_read_pair(path, &server));
    memcpy(a->server_public, server.public_key, sizeof a->server_public);
    memcpy(a->server_secret, server.secret_key, sizeof a->server_secret);
    memset(&server, 0, sizeof server);
    DIR *d = opendir(dir);
    if (d == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot list --auth directory %s: %s", dir,
                           strerror(errno));
    tide_status rc = TIDE_OK;
    size_t cap = 0;
    struct dirent *e;
    while (rc == TIDE_OK && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n <= 4 || strcmp(e->d_name + n - 4, ".pub") != 0 ||
            strcmp(e->d_name, "server.pub") == 0)
            continue;
        if (a->n_keys == cap) {
            cap = cap ? cap * 2 : 16;
            tide__key *k = tide_reallocarray(a->keys, cap, sizeof *k);
            if (k == NULL) {
                rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory loading keys");
                break;
            }
            a->keys = k;
        }
        tide__key *k = &a->keys[a->n_keys];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        tide_keyfile kf;
        rc = tide_keyfile_read(path, &kf);
        if (rc == TIDE_OK && kf.role == TIDE_KEY_ROLE_NONE)
            rc = tide_errorf(TIDE_ERR_INVALID, "%s: no 'role = admin|worker|reader' line", path);
        if (rc != TIDE_OK)
            break;
        k->role = (tide__role)kf.role;
        zmq_z85_decode(k->pub, kf.public_key);
        snprintf(k->name, sizeof k->name, "%.*s", (int)(n - 4 > 64 ? 64 : n - 4), e->d_name);
        a->n_keys++;
    }
    closedir(d);
    if (rc != TIDE_OK) {
        tide__auth_free(a);
        return rc;
    }
    if (a->n_keys == 0)
        TIDE_WARN("auth", "no client keys (*.pub) in %s: every client will be refused", dir);
    TIDE_INFO("auth", "CURVE on: %zu client keys from %s", a->n_keys, dir);
    return TIDE_OK;
}

void tide__auth_free(tide__auth *a)
{
    tide_free(a->keys);
    memset(a, 0, sizeof *a);
}

tide__role tide__auth_role(const char *user_id)
{
    if (user_id == NULL)
        return TIDE__ROLE_NONE;
    if (strncmp(user_id, "admin:", 6) == 0)
        return TIDE__ROLE_ADMIN;
    if (strncmp(user_id, "worker:", 7) == 0)
        return TIDE__ROLE_WORKER;
    if (strncmp(user_id, "reader:", 7) == 0)
        return TIDE__ROLE_READER;
    return TIDE__ROLE_NONE;
}

int tide__auth_allows(tide__role role, int need)
{
    switch (role) {
    case TIDE__ROLE_ADMIN:
        return need == TIDE_ROLE_ADMIN || need == TIDE_ROLE_WORKER || need == TIDE_ROLE_READER;
    case TIDE__ROLE_WORKER:
        return need == TIDE_ROLE_WORKER || need == TIDE_ROLE_READER;
    case TIDE__ROLE_READER:
        return need == TIDE_ROLE_READER;
    default:
        return 0;
    }
}

/* Answers one ZAP request (RFC 27): frames version, id, domain, address, identity,
 * mechanism, credentials. */
void tide__auth_zap(void *zap, const tide__auth *a, uint64_t *denied)
{
    for (;;) {
        zmq_msg_t f[8];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t tmp;
            zmq_msg_init(&tmp);
            if (zmq_msg_recv(&tmp, zap, nf == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&tmp);
                for (int i = 0; i < nf; i++)
                    zmq_msg_close(&f[i]);
                return;
            }
            more = zmq_msg_more(&tmp);
            if (nf < 8)
                f[nf++] = tmp;
            else
                zmq_msg_close(&tmp);
        }
        const char *status = "400", *text = "unknown key";
        char user[96] = "";
        char addr[64] = "?";
        if (nf >= 4)
            snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&f[3]),
                     (const char *)zmq_msg_data(&f[3]));
        if (nf >= 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&f[6]) == 32) {
            for (size_t i = 0; i < a->n_keys; i++) {
                if (memcmp(a->keys[i].pub, zmq_msg_data(&f[6]), 32) == 0) {
                    status = "200";
                    text = "OK";
                    snprintf(user, sizeof user, "%s:%s",
                             tide_key_role_name((tide_key_role)a->keys[i].role), a->keys[i].name);
                    break;
                }
            }
        } else {
            text = "CURVE required";
        }
        if (status[0] != '2') {
            char z85[41] = "?";
            if (nf >= 7 && zmq_msg_size(&f[6]) == 32)
                zmq_z85_encode(z85, zmq_msg_data(&f[6]), 32);
            (*denied)++;
            TIDE_WARN("auth", "refused a connection from %s: %s (public key %s)", addr, text, z85);
        }
        /* reply: version, request id, status code, status text, user id, metadata */
        zmq_send(zap, "1.0", 3, ZMQ_SNDMORE);
        if (nf >= 2)
            zmq_send(zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        else
            zmq_send(zap, "", 0, ZMQ_SNDMORE);
        zmq_send(zap, status, 3, ZMQ_SNDMORE);
        zmq_send(zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(zap, user, strlen(user), ZMQ_SNDMORE);
        zmq_send(zap, "", 0, 0);
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
}
