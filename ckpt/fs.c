/*
 * ckpt/fs: how the checkpoint module reaches files. A checkpoint root is often shared (a
 * cluster's scratch space), so anyone who can write into it could plant a link named like
 * a step directory or a shard and make the job's user write, read or delete elsewhere.
 * Hence: the root is the only path resolved by name (the caller chose it, links and all);
 * everything under it is reached from a directory descriptor with no link followed
 * (openat with O_NOFOLLOW, O_DIRECTORY, unlinkat, renameat), files are created exclusively
 * after whatever held their name was unlinked (a link itself, never its target), and a
 * file that is read must be a regular file: a FIFO or device would block a reader or act
 * on open, so it is refused naming it. Directories tide writes into must belong to this
 * user. Workload: a few dozen calls per save or load; errors name the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"

#define SUBSYS "ckpt"

const char *tide__ckpt_strerror(int e)
{
    static _Thread_local char buf[160];
    const char *name = strerrorname_np(e);
    if (name != NULL)
        snprintf(buf, sizeof buf, "%s (%s)", strerror(e), name);
    else
        snprintf(buf, sizeof buf, "%s (errno %d)", strerror(e), e);
    return buf;
}

static const char *kind_of(mode_t m)
{
    return S_ISLNK(m)    ? "a symbolic link"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISDIR(m)  ? "a directory"
           : S_ISREG(m)  ? "a regular file"
                         : "a special file";
}

int tide__ckpt_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0 || name[5] == '\0')
        return 0;
    int64_t s = 0;
    for (const char *q = name + 5; *q != '\0'; q++) {
        if (*q < '0' || *q > '9' || s > (INT64_MAX - 9) / 10)
            return 0;
        s = s * 10 + (*q - '0');
    }
    *step = s;
    return 1;
}

int tide__ckpt_known_name(const char *name)
{
    static const char *const exts[] = {"bin", "sum", "sum.tmp", "failed", "failed.tmp"};
    if (strcmp(name, "MANIFEST") == 0 || strcmp(name, "MANIFEST.tmp") == 0)
        return 1;
    int p = 0, d = 0, t = 0, n = 0;
    if (strncmp(name, "shard-p", 7) != 0 || name[7] < '0' || name[7] > '9' ||
        sscanf(name, "shard-p%d-d%d-t%d.%n", &p, &d, &t, &n) != 3 || n == 0)
        return 0;
    char canon[64];
    for (size_t k = 0; k < sizeof exts / sizeof exts[0]; k++) {
        tide__ckpt_shard_name(p, d, t, exts[k], canon, sizeof canon);
        if (strcmp(canon, name) == 0)
            return 1;
    }
    return 0;
}

/* Warns once per directory (by device and inode) that users other than this one may change
   its entries: they can make saves fail or, without the sticky bit, remove checkpoints. */
static void warn_shared(const char *path, const struct stat *st)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        dev_t dev;
        ino_t ino;
    } seen[32];
    static size_t n_seen;
    int others = (st->st_mode & (S_IWGRP | S_IWOTH)) != 0 || st->st_uid != geteuid();
    if (!others || (st->st_mode & S_ISVTX) != 0)
        return;
    pthread_mutex_lock(&mu);
    int warned = 0;
    for (size_t k = 0; k < n_seen && !warned; k++)
        warned = seen[k].dev == st->st_dev && seen[k].ino == st->st_ino;
    if (!warned && n_seen < sizeof seen / sizeof seen[0]) {
        seen[n_seen].dev = st->st_dev;
        seen[n_seen].ino = st->st_ino;
        n_seen++;
    }
    pthread_mutex_unlock(&mu);
    if (!warned)
        TIDE_WARN(SUBSYS,
                  "checkpoint root %s is writable by other users (mode %04o, owner uid %u, no "
                  "sticky bit): they can remove or replace its checkpoints; tide follows no "
                  "link there, but a root only this user can write to is safer",
                  path, (unsigned)(st->st_mode & 07777), (unsigned)st->st_uid);
}

static tide_status mkdir_p(const char *dir)
{
    char tmp[TIDE_CKPT_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof tmp)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint directory '%s': bad length", dir);
    memcpy(tmp, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != '\0')
            continue;
        char c = tmp[i];
        tmp[i] = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return tide_errorf(TIDE_ERR_IO, "cannot create directory %s: %s", tmp,
                               tide__ckpt_strerror(errno));
        tmp[i] = c;
    }
    return TIDE_OK;
}

tide_status tide__ckpt_open_root(const char *path, int create, int *fd)
{
    *fd = -1;
    if (create)
        TIDE_CHECK(mkdir_p(path));
    int f = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f < 0) {
        int err = errno;
        return tide_errorf(err == ENOENT ? TIDE_ERR_NOT_FOUND : TIDE_ERR_IO,
                           "cannot open checkpoint root %s: %s", path, tide__ckpt_strerror(err));
    }
    struct stat st;
    if (fstat(f, &st) == 0)
        warn_shared(path, &st);
    *fd = f;
    return TIDE_OK;
}

/* The error of a failed openat of name in dir that refused to follow a link or to open
   something else than it wanted (want: "a directory", "a regular file"). */
static tide_status refused(int dir, const char *path, const char *name, int err, const char *want)
{
    struct stat st;
    if (err == ENOENT)
        return tide_errorf(TIDE_ERR_NOT_FOUND, "cannot open %s/%s: %s", path, name,
                           tide__ckpt_strerror(err));
    if ((err == ELOOP || err == ENOTDIR) && fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s/%s is %s, not %s: refused (tide follows no link and opens no "
                           "special file under a checkpoint root)",
                           path, name, kind_of(st.st_mode), want);
    return tide_errorf(TIDE_ERR_IO, "cannot open %s/%s: %s", path, name, tide__ckpt_strerror(err));
}

tide_status tide__ckpt_open_sub(int parent, const char *path, const char *name, int create,
                                int mine, int *fd)
{
    *fd = -1;
    if (create && mkdirat(parent, name, 0755) != 0 && errno != EEXIST)
        return tide_errorf(TIDE_ERR_IO, "cannot create directory %s/%s: %s", path, name,
                           tide__ckpt_strerror(errno));
    int f = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0)
        return refused(parent, path, name, errno, "a directory");
    struct stat st;
    if (mine && fstat(f, &st) != 0) {
        int err = errno;
        close(f);
        return tide_errorf(TIDE_ERR_IO, "stat of %s/%s: %s", path, name, tide__ckpt_strerror(err));
    }
    if (mine && st.st_uid != geteuid()) {
        close(f);
        return tide_errorf(TIDE_ERR_DENIED,
                           "%s/%s belongs to uid %u, not to this job's user (uid %u): tide "
                           "writes and removes only in directories of its own",
                           path, name, (unsigned)st.st_uid, (unsigned)geteuid());
    }
    *fd = f;
    return TIDE_OK;
}

tide_status tide__ckpt_open_ckdir(const char *dir, int create, int *fd)
{
    *fd = -1;
    char parent[TIDE_CKPT_PATH_MAX];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof parent)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint directory '%s': bad length", dir);
    memcpy(parent, dir, n);
    parent[n] = '\0';
    char *slash = strrchr(parent, '/');
    const char *name = slash != NULL ? slash + 1 : parent;
    int64_t step = 0;
    if (!create && !tide__ckpt_step_name(name, &step)) /* the caller's: links and all */
        return tide__ckpt_open_root(parent, 0, fd);
    if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint directory '%s': name a directory", dir);
    char last[TIDE_CKPT_PATH_MAX];
    snprintf(last, sizeof last, "%s", name);
    if (slash == NULL)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        slash[1] = '\0';
    else
        *slash = '\0';
    int root = -1;
    TIDE_CHECK(tide__ckpt_open_root(parent, create, &root));
    tide_status rc = tide__ckpt_open_sub(root, parent, last, create, create, fd);
    close(root);
    return rc;
}

tide_status tide__ckpt_open_read(int dir, const char *path, const char *name, int *fd)
{
    *fd = -1;
    struct stat st, st2;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return refused(dir, path, name, errno, "a regular file");
    if (!S_ISREG(st.st_mode))
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s/%s is %s, not a regular file: refused (tide follows no link and "
                           "opens no special file under a checkpoint root)",
                           path, name, kind_of(st.st_mode));
    /* O_NONBLOCK: should a FIFO take the name between the two calls, open returns at once */
    int f = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (f < 0)
        return refused(dir, path, name, errno, "a regular file");
    if (fstat(f, &st2) != 0 || !S_ISREG(st2.st_mode) || st2.st_ino != st.st_ino ||
        st2.st_dev != st.st_dev) {
        close(f);
        return tide_errorf(TIDE_ERR_INVALID, "%s/%s changed while it was being opened: refused",
                           path, name);
    }
    *fd = f;
    return TIDE_OK;
}

tide_status tide__ckpt_remove(int dir, const char *path, const char *name)
{
    if (unlinkat(dir, name, 0) == 0 || errno == ENOENT)
        return TIDE_OK;
    if (errno == EISDIR)
        return tide_errorf(TIDE_ERR_INVALID,
                           "%s/%s is a directory where tide keeps a file: "
                           "refused",
                           path, name);
    return tide_errorf(TIDE_ERR_IO, "cannot remove %s/%s: %s", path, name,
                       tide__ckpt_strerror(errno));
}

tide_status tide__ckpt_create(int dir, const char *path, const char *name, int *fd)
{
    *fd = -1;
    TIDE_CHECK(tide__ckpt_remove(dir, path, name));
    int f = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f < 0) {
        int err = errno;
        return tide_errorf(err == EEXIST ? TIDE_ERR_EXISTS : TIDE_ERR_IO,
                           "cannot create %s/%s: %s%s", path, name, tide__ckpt_strerror(err),
                           err == EEXIST ? " (something else took the name meanwhile)" : "");
    }
    *fd = f;
    return TIDE_OK;
}

tide_status tide__ckpt_fsync_dir(int dir, const char *path)
{
    if (fsync(dir) != 0)
        return tide_errorf(TIDE_ERR_IO, "fsync of directory %s: %s", path,
                           tide__ckpt_strerror(errno));
    return TIDE_OK;
}

tide_status tide__ckpt_read_whole(int dir, const char *path, const char *name, size_t max,
                                  uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_read(dir, path, name, &fd));
    char full[TIDE_CKPT_PATH_MAX + 128];
    snprintf(full, sizeof full, "%s/%s", path, name);
    struct stat st;
    tide_status rc = TIDE_OK;
    uint8_t *b = NULL;
    if (fstat(fd, &st) != 0)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_IO, "stat of %s: %s", full, tide__ckpt_strerror(errno));
    if ((uint64_t)st.st_size > max)
        TIDE_FAIL_GOTO(rc, out, TIDE_ERR_INVALID, "%s has %lld bytes: too large to be one", full,
                       (long long)st.st_size);
    b = tide_malloc((size_t)st.st_size + 1);
    TIDE_CHECK_ALLOC_GOTO(b, rc, out);
    TIDE_CHECK_GOTO(tide__ckpt_read_at(fd, b, (uint64_t)st.st_size, 0, full), rc, out);
    *out = b;
    *len = (size_t)st.st_size;
    b = NULL;
out:
    tide_free(b);
    close(fd);
    return rc;
}

tide_status tide__ckpt_write_atomic(int dir, const char *path, const char *name, const void *buf,
                                    size_t n, const char *fault)
{
    char tmp[256], full[TIDE_CKPT_PATH_MAX + 256];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    snprintf(full, sizeof full, "%s/%s", path, tmp);
    int fd = -1;
    TIDE_CHECK(tide__ckpt_create(dir, path, tmp, &fd));
    tide_status rc = tide__ckpt_write_all(fd, buf, n, full);
    if (rc == TIDE_OK && fsync(fd) != 0)
        rc = tide_errorf(TIDE_ERR_IO, "fsync of %s: %s", full, tide__ckpt_strerror(errno));
    if (close(fd) != 0 && rc == TIDE_OK)
        rc = tide_errorf(TIDE_ERR_IO, "closing %s: %s", full, tide__ckpt_strerror(errno));
    if (rc != TIDE_OK) {
        (void)unlinkat(dir, tmp, 0);
        return rc;
    }
    if (fault != NULL)
        tide__ckpt_fault(fault);
    /* renameat replaces the entry named name, whatever it is, never what a link points to */
    if (renameat(dir, tmp, dir, name) != 0) {
        rc = tide_errorf(TIDE_ERR_IO, "renaming %s to %s/%s: %s", full, path, name,
                         tide__ckpt_strerror(errno));
        (void)unlinkat(dir, tmp, 0);
        return rc;
    }
    return tide__ckpt_fsync_dir(dir, path);
}

/* ---- raw reads and writes -------------------------------------------------------------- */

tide_status tide__ckpt_write_all(int fd, const void *buf, uint64_t n, const char *path)
{
    const char *q = buf;
    while (n > 0) {
        ssize_t k = write(fd, q, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return tide_errorf(TIDE_ERR_IO, "writing %s: %s", path,
                               k == 0 ? "no progress" : tide__ckpt_strerror(errno));
        q += k;
        n -= (uint64_t)k;
    }
    return TIDE_OK;
}

tide_status tide__ckpt_read_at(int fd, void *buf, uint64_t n, uint64_t off, const char *path)
{
    char *q = buf;
    while (n > 0) {
        ssize_t k = pread(fd, q, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return tide_errorf(TIDE_ERR_IO, "reading %s: %s", path, tide__ckpt_strerror(errno));
        if (k == 0)
            return tide_errorf(TIDE_ERR_INVALID,
                               "%s is truncated: it ends at byte %" PRIu64
                               " where the manifest needs %" PRIu64 " more",
                               path, off, n);
        q += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return TIDE_OK;
}

void tide__ckpt_fault(const char *point)
{
    tide__fault_point("ckpt", point, 0);
}
