/*
 * coordinator/auth: CURVE keys for tided --auth DIR (format in
 * /work/notes/auth-format.md: "key = value" lines; server.key holds tided's
 * pair, each <name>.pub an allowed client key and its role) and the ZAP
 * handler that admits only those keys. ZAP requests arrive on an inproc REP
 * socket served from the main event loop; the role travels to every message
 * as its User-Id ("admin:NAME" / "worker:NAME").
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "coordinator/server_int.h"

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

tide_status tide__auth_read_file(const char *path, char *pub, char *secret, tide__role *role)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot read key file %s: %s", path, strerror(errno));
    char line[512];
    int have_pub = 0, have_secret = 0, have_role = 0, lineno = 0;
    tide_status rc = TIDE_OK;
    while (rc == TIDE_OK && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *l = trim(line);
        if (*l == '\0' || *l == '#')
            continue;
        char *eq = strchr(l, '=');
        if (eq == NULL) {
            rc = tide_errorf(TIDE_ERR_INVALID, "%s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = '\0';
        char *key = trim(l), *val = trim(eq + 1);
        if (strcmp(key, "public") == 0 || strcmp(key, "secret") == 0) {
            uint8_t bin[32];
            if (strlen(val) != 40 || zmq_z85_decode(bin, val) == NULL) {
                rc = tide_errorf(TIDE_ERR_INVALID, "%s:%d: %s key must be 40 Z85 characters", path,
                                 lineno, key);
                break;
            }
            if (key[0] == 'p') {
                memcpy(pub, val, 41);
                have_pub = 1;
            } else if (secret != NULL) {
                memcpy(secret, val, 41);
                have_secret = 1;
            }
        } else if (strcmp(key, "role") == 0) {
            if (strcmp(val, "admin") == 0 && role)
                *role = TIDE__ROLE_ADMIN;
            else if (strcmp(val, "worker") == 0 && role)
                *role = TIDE__ROLE_WORKER;
            else if (role) {
                rc = tide_errorf(TIDE_ERR_INVALID, "%s:%d: role must be admin or worker, not '%s'",
                                 path, lineno, val);
                break;
            }
            have_role = 1;
        }
        /* other keys: ignored, so the format can grow */
    }
    fclose(f);
    if (rc != TIDE_OK)
        return rc;
    if (!have_pub)
        return tide_errorf(TIDE_ERR_INVALID, "%s: no 'public = ...' line", path);
    if (secret != NULL && !have_secret)
        return tide_errorf(TIDE_ERR_INVALID, "%s: no 'secret = ...' line", path);
    if (role != NULL && !have_role)
        return tide_errorf(TIDE_ERR_INVALID, "%s: no 'role = admin|worker' line", path);
    return TIDE_OK;
}

tide_status tide__auth_load(tide__auth *a, const char *dir)
{
    memset(a, 0, sizeof *a);
    char path[1024];
    snprintf(path, sizeof path, "%s/server.key", dir);
    TIDE_CHECK(tide__auth_read_file(path, a->server_public, a->server_secret, NULL));
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
        char z85[41];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = tide__auth_read_file(path, z85, NULL, &k->role);
        if (rc != TIDE_OK)
            break;
        zmq_z85_decode(k->pub, z85);
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
    return TIDE__ROLE_NONE;
}

/* Answers one ZAP request (RFC 27): frames version, id, domain, address, identity,
 * mechanism, credentials. */
void tide__auth_zap(tide_server_t *s)
{
    for (;;) {
        zmq_msg_t f[8];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t tmp;
            zmq_msg_init(&tmp);
            if (zmq_msg_recv(&tmp, s->zap, nf == 0 ? ZMQ_DONTWAIT : 0) < 0) {
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
            for (size_t i = 0; i < s->auth.n_keys; i++) {
                if (memcmp(s->auth.keys[i].pub, zmq_msg_data(&f[6]), 32) == 0) {
                    status = "200";
                    text = "OK";
                    snprintf(user, sizeof user, "%s:%s",
                             s->auth.keys[i].role == TIDE__ROLE_ADMIN ? "admin" : "worker",
                             s->auth.keys[i].name);
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
            s->st->counters.denied++;
            TIDE_WARN("auth", "refused a connection from %s: %s (public key %s)", addr, text, z85);
        }
        /* reply: version, request id, status code, status text, user id, metadata */
        zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
        if (nf >= 2)
            zmq_send(s->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        else
            zmq_send(s->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(s->zap, status, 3, ZMQ_SNDMORE);
        zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(s->zap, user, strlen(user), ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, 0);
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
}
