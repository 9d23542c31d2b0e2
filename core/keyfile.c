/*
 * core/keyfile: CURVE key files, one reader and one writer for every program
 * (format in keyfile.h and docs/operator.md). Three hand-written parsers of this file
 * once drifted apart and broke every multi-host job; keep it the only one.
 * Files are tiny: read whole, parsed line by line, written through a temporary
 * file renamed into place.
 */
#include "core/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

#define KEYFILE_MAX_BYTES 65536

static const char z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                ".-:+=^!/*?&<>()[]{}@%$#";

int tide_key_z85_valid(const char *s)
{
    if (s == NULL || strlen(s) != TIDE_KEY_Z85_LEN)
        return 0;
    for (int i = 0; i < TIDE_KEY_Z85_LEN; i += 5) {
        unsigned long long v = 0;
        for (int j = 0; j < 5; j++) {
            const char *p = s[i + j] ? strchr(z85_chars, s[i + j]) : NULL;
            if (p == NULL)
                return 0;
            v = v * 85 + (unsigned long long)(p - z85_chars);
        }
        if (v > 0xffffffffull) /* five characters encode one 32-bit word */
            return 0;
    }
    return 1;
}

const char *tide_key_role_name(tide_key_role role)
{
    switch (role) {
    case TIDE_KEY_ROLE_ADMIN:
        return "admin";
    case TIDE_KEY_ROLE_WORKER:
        return "worker";
    case TIDE_KEY_ROLE_READER:
        return "reader";
    default:
        return "none";
    }
}

tide_status tide_key_role_parse(const char *name, tide_key_role *out)
{
    static const tide_key_role roles[] = {TIDE_KEY_ROLE_ADMIN, TIDE_KEY_ROLE_WORKER,
                                          TIDE_KEY_ROLE_READER};
    for (size_t i = 0; name != NULL && i < sizeof roles / sizeof roles[0]; i++) {
        if (strcmp(name, tide_key_role_name(roles[i])) == 0) {
            *out = roles[i];
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_INVALID, "role must be admin, worker or reader, not '%s'",
                       name ? name : "(none)");
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

tide_status tide_keyfile_parse(const char *text, const char *origin, tide_keyfile *out)
{
    memset(out, 0, sizeof *out);
    int have_pub = 0, have_sec = 0, have_role = 0, lineno = 0;
    const char *p = text;
    while (*p != '\0') {
        lineno++;
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char line[256];
        if (n >= sizeof line)
            return tide_errorf(TIDE_ERR_INVALID, "%s:%d: line too long", origin, lineno);
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (end ? 1 : 0);
        char *l = line;
        while (is_blank(*l))
            l++;
        size_t len = strlen(l);
        while (len > 0 && is_blank(l[len - 1]))
            l[--len] = '\0';
        if (*l == '\0' || *l == '#')
            continue;
        char *eq = strchr(l, '=');
        if (eq == NULL)
            return tide_errorf(TIDE_ERR_INVALID, "%s:%d: expected 'name = value', got '%s'", origin,
                               lineno, l);
        char *v = eq + 1;
        while (eq > l && is_blank(eq[-1]))
            eq--;
        *eq = '\0';
        while (is_blank(*v))
            v++;
        int *seen = NULL;
        if (strcmp(l, "public") == 0 || strcmp(l, "secret") == 0) {
            int pub = l[0] == 'p';
            seen = pub ? &have_pub : &have_sec;
            if (!tide_key_z85_valid(v))
                return tide_errorf(TIDE_ERR_INVALID,
                                   "%s:%d: the %s key must be 40 Z85 characters (as tidectl "
                                   "keygen writes)",
                                   origin, lineno, l);
            memcpy(pub ? out->public_key : out->secret_key, v, TIDE_KEY_Z85_LEN + 1);
        } else if (strcmp(l, "role") == 0) {
            seen = &have_role;
            if (tide_key_role_parse(v, &out->role) != TIDE_OK)
                return tide_errorf(TIDE_ERR_INVALID, "%s:%d: %s", origin, lineno,
                                   tide_last_error());
        } else {
            continue; /* unknown names: ignored so the format can grow */
        }
        if (*seen)
            return tide_errorf(TIDE_ERR_INVALID, "%s:%d: '%s' given twice", origin, lineno, l);
        *seen = 1;
    }
    if (!have_pub)
        return tide_errorf(TIDE_ERR_INVALID, "%s: no 'public = ...' line", origin);
    return TIDE_OK;
}

tide_status tide_keyfile_read(const char *path, tide_keyfile *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return tide_errorf(TIDE_ERR_IO, "cannot read key file %s: %s", path, strerror(errno));
    char *text = tide_malloc(KEYFILE_MAX_BYTES + 1);
    if (text == NULL) {
        fclose(f);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t n = fread(text, 1, KEYFILE_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    tide_status rc;
    if (bad)
        rc = tide_errorf(TIDE_ERR_IO, "cannot read key file %s", path);
    else if (n > KEYFILE_MAX_BYTES)
        rc = tide_errorf(TIDE_ERR_INVALID, "%s: larger than %d bytes: not a key file", path,
                         KEYFILE_MAX_BYTES);
    else if (memchr(text, '\0', n) != NULL)
        rc = tide_errorf(TIDE_ERR_INVALID, "%s: holds a NUL byte: not a key file", path);
    else {
        text[n] = '\0';
        rc = tide_keyfile_parse(text, path, out);
    }
    tide_free(text);
    return rc;
}

tide_status tide_keyfile_read_pair(const char *path, tide_keyfile *out)
{
    TIDE_CHECK(tide_keyfile_read(path, out));
    if (out->secret_key[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s: no 'secret = ...' line (a client needs its key pair file "
                           "NAME.key, not NAME.pub)",
                           path);
    return TIDE_OK;
}

tide_status tide_keyfile_server_key(const char *path_or_z85, char *out)
{
    if (path_or_z85 == NULL || path_or_z85[0] == '\0')
        return tide_errorf(TIDE_ERR_INVALID,
                           "no server key: give tided's server.pub or its 40-character Z85 text");
    if (tide_key_z85_valid(path_or_z85) && access(path_or_z85, F_OK) != 0) {
        memcpy(out, path_or_z85, TIDE_KEY_Z85_LEN + 1);
        return TIDE_OK;
    }
    tide_keyfile k;
    TIDE_CHECK(tide_keyfile_read(path_or_z85, &k));
    memcpy(out, k.public_key, TIDE_KEY_Z85_LEN + 1);
    return TIDE_OK;
}

tide_status tide_keyfile_format(const tide_keyfile *k, int include_secret, const char *comment,
                                char *buf, size_t cap)
{
    if (!tide_key_z85_valid(k->public_key))
        return tide_errorf(TIDE_ERR_INVALID, "not a Z85 public key");
    if (include_secret && !tide_key_z85_valid(k->secret_key))
        return tide_errorf(TIDE_ERR_INVALID, "not a Z85 secret key");
    if (k->role != TIDE_KEY_ROLE_NONE && k->role != TIDE_KEY_ROLE_ADMIN &&
        k->role != TIDE_KEY_ROLE_WORKER && k->role != TIDE_KEY_ROLE_READER)
        return tide_errorf(TIDE_ERR_INVALID, "unknown key role %d", (int)k->role);
    size_t used = 0;
    int n;
#define EMIT(...)                                                                                  \
    do {                                                                                           \
        n = snprintf(buf + used, cap - used, __VA_ARGS__);                                         \
        if (n < 0 || (size_t)n >= cap - used)                                                      \
            return tide_errorf(TIDE_ERR_NOMEM, "key file text longer than %zu bytes", cap);        \
        used += (size_t)n;                                                                         \
    } while (0)
    if (cap == 0)
        return tide_errorf(TIDE_ERR_NOMEM, "no room for the key file text");
    buf[0] = '\0';
    for (const char *c = comment; c != NULL && *c != '\0';) {
        const char *e = strchr(c, '\n');
        int len = e ? (int)(e - c) : (int)strlen(c);
        EMIT("# %.*s\n", len, c);
        c += len + (e ? 1 : 0);
    }
    EMIT("public = %s\n", k->public_key);
    if (include_secret)
        EMIT("secret = %s\n", k->secret_key);
    if (k->role != TIDE_KEY_ROLE_NONE)
        EMIT("role = %s\n", tide_key_role_name(k->role));
#undef EMIT
    return TIDE_OK;
}

tide_status tide_keyfile_write(const char *path, const tide_keyfile *k, int include_secret,
                               const char *comment, unsigned mode, int replace)
{
    char text[1024];
    TIDE_CHECK(tide_keyfile_format(k, include_secret, comment, text, sizeof text));
    struct stat sb;
    if (!replace && lstat(path, &sb) == 0)
        return tide_errorf(TIDE_ERR_EXISTS, "%s exists", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return tide_errorf(TIDE_ERR_INVALID, "path too long: %s", path);
    /* O_EXCL|O_NOFOLLOW: never write through a link someone placed at the temporary name */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        return tide_errorf(TIDE_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    ok = ok && fchmod(fd, (mode_t)mode) == 0; /* the umask may have narrowed it */
    ok = ok && fsync(fd) == 0;
    int saved = errno;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(tmp);
        return tide_errorf(TIDE_ERR_IO, "cannot write %s: %s", tmp, strerror(saved));
    }
    if (replace) {
        if (rename(tmp, path) != 0) { /* replaces a symlink at path, never its target */
            saved = errno;
            unlink(tmp);
            return tide_errorf(TIDE_ERR_IO, "cannot replace %s: %s", path, strerror(saved));
        }
    } else {
        /* link() fails if path appeared meanwhile: no check-then-write race */
        if (link(tmp, path) != 0) {
            saved = errno;
            unlink(tmp);
            if (saved == EEXIST)
                return tide_errorf(TIDE_ERR_EXISTS, "%s exists", path);
            return tide_errorf(TIDE_ERR_IO, "cannot write %s: %s", path, strerror(saved));
        }
        unlink(tmp);
    }
    return TIDE_OK;
}
