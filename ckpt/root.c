/*
 * ckpt/root: the step directories under a checkpoint root. Finding the newest complete
 * checkpoint takes its step from its manifest, never from the directory's name (a
 * directory restored under another step's name resumes at the step it holds). Pruning
 * removes only what tide wrote: a real directory of this user holding nothing but
 * tide's file names, each a regular file of this user; anything else (a planted link, a
 * foreign directory, an unknown file) is left where it is, with a warning. Workload: once
 * per save (pruning) or restart (finding); a root holds a few hundred entries at most.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_int.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

#define SUBSYS "ckpt"

/* One step-N entry of a root. */
typedef struct entry {
    int64_t step; /* N, from the name */
    int is_dir;   /* a real directory (no link) */
    int complete; /* it has an entry named MANIFEST */
    char name[256];
} entry;

/* Whether entry name of root is a real directory with a MANIFEST entry. */
static void look(int root, entry *e)
{
    int fd = openat(root, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    e->is_dir = fd >= 0;
    struct stat st;
    e->complete = fd >= 0 && fstatat(fd, "MANIFEST", &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (fd >= 0)
        close(fd);
}

/* The step-N entries of root (path: its path), newest (by name) first; caller frees. */
static tide_status list_steps(int root, const char *path, entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    int fd = dup(root);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    if (dp == NULL) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return tide_errorf(TIDE_ERR_IO, "cannot list checkpoint root %s: %s", path,
                           tide__ckpt_strerror(err));
    }
    rewinddir(dp); /* the offset is shared with root's descriptor */
    size_t cap = 0;
    entry *es = NULL;
    tide_status rc = TIDE_OK;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        int64_t s = 0;
        if (!tide__ckpt_step_name(de->d_name, &s) || strlen(de->d_name) >= sizeof es->name)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            entry *ne = tide_reallocarray(es, cap, sizeof *ne);
            if (ne == NULL) {
                rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory listing %s", path);
                break;
            }
            es = ne;
        }
        entry *e = &es[(*n)++];
        e->step = s;
        snprintf(e->name, sizeof e->name, "%s", de->d_name);
        look(root, e);
    }
    closedir(dp);
    if (rc != TIDE_OK) {
        tide_free(es);
        *n = 0;
        return rc;
    }
    for (size_t i = 1; i < *n; i++) /* newest first; a few hundred at most */
        for (size_t j = i; j > 0 && es[j - 1].step < es[j].step; j--) {
            entry tmp = es[j];
            es[j] = es[j - 1];
            es[j - 1] = tmp;
        }
    *out = es;
    return TIDE_OK;
}

/* The step of complete checkpoint e of root (path) from its manifest, or an error naming
   why it cannot be read. */
static tide_status manifest_step(const char *path, const entry *e, char *dir, size_t len,
                                 int64_t *step)
{
    snprintf(dir, len, "%s/%s", path, e->name);
    tide_ckpt_t *ck = NULL;
    TIDE_CHECK(tide_ckpt_open(&ck, dir));
    *step = tide_ckpt_step(ck);
    tide_ckpt_close(&ck);
    if (*step != e->step)
        TIDE_WARN(SUBSYS,
                  "%s is named for step %" PRId64 " but its manifest holds step %" PRId64
                  ": it counts as step %" PRId64,
                  dir, e->step, *step, *step);
    return TIDE_OK;
}

/* Newest first by name, the first complete checkpoint of root whose manifest's step is
   before `before`; checkpoints whose manifest cannot be read are skipped with a warning,
   the first reason kept in skipped. */
static tide_status find_in(int root, const char *path, int64_t before, char *out, size_t len,
                           int64_t *step, char *skipped, size_t skipped_len)
{
    entry *es = NULL;
    size_t n = 0;
    TIDE_CHECK(list_steps(root, path, &es, &n));
    tide_status rc = TIDE_ERR_NOT_FOUND;
    for (size_t i = 0; i < n && rc != TIDE_OK; i++) {
        if (!es[i].is_dir || !es[i].complete)
            continue;
        char dir[TIDE_CKPT_PATH_MAX + 300];
        int64_t s = 0;
        if (manifest_step(path, &es[i], dir, sizeof dir, &s) != TIDE_OK) {
            TIDE_WARN(SUBSYS, "checkpoint %s skipped: %s", dir, tide_last_error());
            if (skipped[0] == '\0')
                snprintf(skipped, skipped_len, "%s", tide_last_error());
            continue;
        }
        if (s >= before)
            continue;
        if (strlen(dir) >= len) {
            tide_free(es);
            return tide_errorf(TIDE_ERR_INVALID, "checkpoint path %s is too long", dir);
        }
        snprintf(out, len, "%s", dir);
        *step = s;
        rc = TIDE_OK;
    }
    tide_free(es);
    return rc;
}

tide_status tide_ckpt_find(const char *root, int64_t before, char *path, size_t len, int64_t *step)
{
    if (root == NULL || path == NULL || step == NULL)
        return tide_errorf(TIDE_ERR_INVALID, "tide_ckpt_find: NULL argument");
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_ckdir(root, 0, &fd));
    struct stat st;
    if (fstatat(fd, "MANIFEST", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        close(fd);
        tide_ckpt_t *ck = NULL;
        TIDE_CHECK(tide_ckpt_open(&ck, root));
        int64_t s = tide_ckpt_step(ck);
        tide_ckpt_close(&ck);
        if (s >= before)
            return tide_errorf(TIDE_ERR_NOT_FOUND, "checkpoint %s (step %lld) is the only one",
                               root, (long long)s);
        snprintf(path, len, "%s", root);
        *step = s;
        return TIDE_OK;
    }
    char skipped[512] = "";
    tide_status rc = find_in(fd, root, before, path, len, step, skipped, sizeof skipped);
    close(fd);
    if (rc == TIDE_ERR_NOT_FOUND)
        return tide_errorf(TIDE_ERR_NOT_FOUND, "no complete checkpoint%s under %s%s%s%s",
                           before == INT64_MAX ? "" : " older than the one that failed", root,
                           skipped[0] ? " (skipped: " : "", skipped, skipped[0] ? ")" : "");
    return rc;
}

/* Whether step directory dir holds only what tide writes, as files of this user; why not
   into why. */
static int only_ours(int dir, char *why, size_t len)
{
    int fd = dup(dir);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    if (dp == NULL) {
        snprintf(why, len, "cannot list it: %s", tide__ckpt_strerror(errno));
        if (fd >= 0)
            close(fd);
        return 0;
    }
    rewinddir(dp); /* the offset is shared with dir */
    int ok = 1;
    struct dirent *de;
    while (ok && (de = readdir(dp)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat st;
        if (!tide__ckpt_known_name(de->d_name)) {
            snprintf(why, len, "it holds %s, a name tide does not write", de->d_name);
            ok = 0;
        } else if (fstatat(dir, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                   !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
            snprintf(why, len, "its %s is not a regular file of this user", de->d_name);
            ok = 0;
        }
    }
    closedir(dp);
    return ok;
}

/* Removes step directory e of root (path) if it is tide's (see the file's comment);
   anything else is left with a warning. */
static tide_status remove_step(int root, const char *path, const entry *e)
{
    char dir[TIDE_CKPT_PATH_MAX + 300], why[600];
    snprintf(dir, sizeof dir, "%s/%s", path, e->name);
    int fd = -1;
    if (!e->is_dir || tide__ckpt_open_sub(root, path, e->name, 0, 1, &fd) != TIDE_OK) {
        TIDE_WARN_LIMITED(SUBSYS, "pruning left %s alone: %s", dir,
                          e->is_dir ? tide_last_error() : "not a directory tide made (a link?)");
        return TIDE_OK;
    }
    if (!only_ours(fd, why, sizeof why)) {
        close(fd);
        TIDE_WARN_LIMITED(SUBSYS, "pruning left %s alone: %s", dir, why);
        return TIDE_OK;
    }
    /* MANIFEST first: from then on the directory is incomplete, never half-deleted-complete */
    tide_status rc = tide__ckpt_remove(fd, dir, "MANIFEST");
    DIR *dp = NULL;
    int fd2 = rc == TIDE_OK ? dup(fd) : -1;
    if (fd2 >= 0 && (dp = fdopendir(fd2)) == NULL)
        close(fd2);
    if (dp != NULL)
        rewinddir(dp); /* only_ours read to its end through the same offset */
    struct dirent *de;
    while (rc == TIDE_OK && dp != NULL && (de = readdir(dp)) != NULL)
        if (tide__ckpt_known_name(de->d_name))
            rc = tide__ckpt_remove(fd, dir, de->d_name);
    if (dp != NULL)
        closedir(dp);
    close(fd);
    if (rc == TIDE_OK && unlinkat(root, e->name, AT_REMOVEDIR) != 0)
        rc = tide_errorf(TIDE_ERR_IO, "removing %s: %s", dir, tide__ckpt_strerror(errno));
    if (rc == TIDE_OK)
        TIDE_INFO(SUBSYS, "pruned %s", dir);
    return rc;
}

tide_status tide__ckpt_prune_at(int root, const char *path, int keep)
{
    if (keep < 1)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint retention must keep >= 1, got %d", keep);
    entry *es = NULL;
    size_t n = 0;
    TIDE_CHECK(list_steps(root, path, &es, &n));
    tide_status rc = TIDE_OK;
    int kept = 0, seen_complete = 0;
    for (size_t i = 0; i < n && rc == TIDE_OK; i++) {
        if (es[i].is_dir && es[i].complete && kept < keep) {
            kept++;
            seen_complete = 1;
            continue;
        }
        if (!seen_complete) /* newer than every complete one: maybe a save in progress */
            continue;
        rc = remove_step(root, path, &es[i]);
    }
    if (rc == TIDE_OK && n > 0)
        rc = tide__ckpt_fsync_dir(root, path);
    tide_free(es);
    return rc;
}

tide_status tide_ckpt_prune(const char *root, int keep)
{
    if (keep < 1)
        return tide_errorf(TIDE_ERR_INVALID, "checkpoint retention must keep >= 1, got %d", keep);
    int fd = -1;
    TIDE_CHECK(tide__ckpt_open_root(root, 0, &fd));
    tide_status rc = tide__ckpt_prune_at(fd, root, keep);
    close(fd);
    return rc;
}
