/*
 * coordinator/auth: CURVE keys for tided --auth DIR and the ZAP handler that admits
 * only those keys (auth.c). The core loads the keys (loop_bind.c), serves ZAP requests
 * on its inproc REP socket (loop.c) and reads each message's role from its User-Id
 * (loop_serve.c). Event-loop thread only.
 */
#ifndef TIDE_COORD_AUTH_H
#define TIDE_COORD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>

typedef enum tide__role {
    TIDE__ROLE_NONE = 0,
    TIDE__ROLE_WORKER = 1,
    TIDE__ROLE_ADMIN = 2,
    TIDE__ROLE_READER = 3, /* status and jobs only; values match core/keyfile.h's tide_key_role */
} tide__role;

/* An allowed client key (from DIR/<name>.pub). */
typedef struct tide__key {
    uint8_t pub[32];
    char name[72];
    tide__role role;
} tide__key;

typedef struct tide__auth {
    char server_public[41];
    char server_secret[41];
    tide__key *keys;
    size_t n_keys;
} tide__auth;

/* Loads DIR/server.key and every DIR/<name>.pub into *a (caller frees with tide__auth_free). */
tide_status tide__auth_load(tide__auth *a, const char *dir);

/* Frees the key table; *a is zeroed. */
void tide__auth_free(tide__auth *a);

/* Answers every ZAP request waiting on REP socket zap, admitting a's keys; each refusal
 * adds one to *denied. Does not block. */
void tide__auth_zap(void *zap, const tide__auth *a, uint64_t *denied);

/* Role from a message's User-Id metadata ("admin:NAME" / "worker:NAME" / "reader:NAME"). */
tide__role tide__auth_role(const char *user_id);

/* 1 when a key of role may send a message that needs `need` (proto.h's role table). */
int tide__auth_allows(tide__role role, int need);

#endif /* TIDE_COORD_AUTH_H */
