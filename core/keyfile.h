/*
 * core/keyfile: the one reader and writer of tide's CURVE key files, shared by
 * tided (--auth DIR), tidectl (--key, --server-key, keygen) and libtide
 * (TIDE_KEY, TIDE_SERVER_KEY). Format (docs/operator.md, "Key files"): UTF-8 text lines
 * "name = value"; blank lines and lines starting with '#' are ignored; names
 * are public, secret (40-character Z85 keys) and role (admin, worker, reader;
 * absent in server files); unknown names are ignored so the format can grow,
 * a name given twice is an error. Pure C, no ZeroMQ: Z85 is checked here.
 */
#ifndef TIDE_CORE_KEYFILE_H
#define TIDE_CORE_KEYFILE_H

#include <stddef.h>

#include <tide/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_KEY_Z85_LEN 40 /* characters of a Z85-encoded 32-byte CURVE key */

typedef enum tide_key_role {
    TIDE_KEY_ROLE_NONE = 0,   /* no role line (tided's own server.key / server.pub) */
    TIDE_KEY_ROLE_WORKER = 1, /* registers ranks and reports; reads status and jobs */
    TIDE_KEY_ROLE_ADMIN = 2,  /* everything a worker may, plus resize, submit, cancel, drain */
    TIDE_KEY_ROLE_READER = 3, /* reads status and jobs only */
} tide_key_role;

/* Caller-owned key file contents. */
typedef struct tide_keyfile {
    char public_key[TIDE_KEY_Z85_LEN + 1]; /* always set after a successful read */
    char secret_key[TIDE_KEY_Z85_LEN + 1]; /* "" when the file holds no secret */
    tide_key_role role;                    /* NONE when the file has no role line */
} tide_keyfile;

/* Returns 1 when s is exactly 40 valid Z85 characters that decode to a 32-byte key. */
int tide_key_z85_valid(const char *s);

/* Returns "admin", "worker", "reader" or "none"; never NULL. */
const char *tide_key_role_name(tide_key_role role);

/* Parses a role name ("admin", "worker", "reader") into *out; INVALID otherwise. */
tide_status tide_key_role_parse(const char *name, tide_key_role *out);

/*
 * Parses key file text into *out (zeroed first). origin names the text in error
 * details ("path:line: ..."). Fails INVALID on a malformed line, a bad key, an
 * unknown role, a repeated name or no public line. Any thread.
 */
tide_status tide_keyfile_parse(const char *text, const char *origin, tide_keyfile *out);

/* Reads and parses the file at path (at most 64 KiB); IO when it cannot be read. Any thread. */
tide_status tide_keyfile_read(const char *path, tide_keyfile *out);

/*
 * Reads a key pair file (public and secret both required) for a client: fails with
 * a detail that says NAME.pub is not enough when the secret is missing.
 */
tide_status tide_keyfile_read_pair(const char *path, tide_keyfile *out);

/*
 * Resolves a server key given either as its 40-character Z85 text or as a path to
 * server.pub / server.key; copies the public key into out (41 bytes). A string that
 * is both a valid key and an existing file is read as the file.
 */
tide_status tide_keyfile_server_key(const char *path_or_z85, char *out);

/*
 * Formats k as key file text into buf (cap bytes), with comment (may be NULL) as
 * '#' lines first; include_secret 0 writes the public half only (a .pub file).
 * Fails INVALID on a bad key or role, NOMEM when cap is too small. Any thread.
 */
tide_status tide_keyfile_format(const tide_keyfile *k, int include_secret, const char *comment,
                                char *buf, size_t cap);

/*
 * Writes k to path with mode (0600 for secrets). Without replace, fails EXISTS when
 * path exists (a dangling symlink too). With replace, writes a new file beside it and
 * renames it over path, so a symlink at path is replaced, never followed. Blocking.
 */
tide_status tide_keyfile_write(const char *path, const tide_keyfile *k, int include_secret,
                               const char *comment, unsigned mode, int replace);

#ifdef __cplusplus
}
#endif

#endif
