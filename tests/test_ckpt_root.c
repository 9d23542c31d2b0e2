/*
 * A checkpoint root as a shared cluster file system has it, where others may write: under
 * a root nothing follows a link (planted links to a step directory, a shard or a manifest
 * leave their targets untouched), special files are refused without blocking, pruning
 * leaves what tide did not write, a root other users can write to is named in a warning,
 * and a checkpoint's step comes from its manifest, never from its directory's name.
 * Over tests/ckpt_fixture.h (a small GPT collection, a fresh root per test).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_int.h"
#include "core/clock.h"
#include "core/log.h"
#include "tests/ckpt_fixture.h"

/* Writes text to path (a victim file a planted link points to). */
static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* Whether path holds exactly text. */
static int holds(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

static int open_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    cr_assert_geq(fd, 0, "%s", path);
    return fd;
}

Test(ckpt, fs_helpers_follow_no_link_and_open_no_special_file)
{
    char victim[300], vdir[300], p[400];
    snprintf(victim, sizeof victim, "%s/victim", g_root);
    snprintf(vdir, sizeof vdir, "%s/vdir", g_root);
    put_file(victim, "precious");
    cr_assert_eq(mkdir(vdir, 0755), 0);
    int root = open_dir(g_root), fd = -1;
    /* a link named like a directory: neither opened nor created through */
    cr_assert_eq(symlinkat(vdir, root, "step-000000000001"), 0);
    cr_assert_eq(tide__ckpt_open_sub(root, g_root, "step-000000000001", 1, 1, &fd),
                 TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "step-000000000001 is a symbolic link") != NULL, "%s",
              tide_last_error());
    cr_assert_eq(fd, -1);
    /* a link where a file is read: refused, and so are a directory and a FIFO, at once */
    cr_assert_eq(symlinkat(victim, root, "MANIFEST"), 0);
    cr_assert_eq(tide__ckpt_open_read(root, g_root, "MANIFEST", &fd), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "is a symbolic link, not a regular file") != NULL, "%s",
              tide_last_error());
    cr_assert_eq(tide__ckpt_open_read(root, g_root, "vdir", &fd), TIDE_ERR_INVALID);
    cr_assert_eq(mkfifoat(root, "fifo", 0644), 0);
    uint64_t t0 = tide_now_ns();
    cr_assert_eq(tide__ckpt_open_read(root, g_root, "fifo", &fd), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "fifo is a FIFO, not a regular file") != NULL, "%s",
              tide_last_error());
    cr_assert_lt(tide_now_ns() - t0, 5000000000ull, "refusing a FIFO must not block");
    cr_assert_eq(tide__ckpt_open_read(root, g_root, "none", &fd), TIDE_ERR_NOT_FOUND);
    /* creating over a link replaces the link, never writes its target */
    cr_assert_eq(tide__ckpt_create(root, g_root, "MANIFEST", &fd), TIDE_OK, "%s",
                 tide_last_error());
    cr_assert_eq(write(fd, "new", 3), 3);
    close(fd);
    struct stat st;
    cr_assert_eq(fstatat(root, "MANIFEST", &st, AT_SYMLINK_NOFOLLOW), 0);
    cr_assert(S_ISREG(st.st_mode));
    cr_assert(holds(victim, "precious"));
    /* removing a link removes the link; a directory where a file belongs is refused */
    cr_assert_eq(symlinkat(victim, root, "shard-p0-d0-t0.bin"), 0);
    cr_assert_eq(tide__ckpt_remove(root, g_root, "shard-p0-d0-t0.bin"), TIDE_OK);
    cr_assert(holds(victim, "precious"));
    cr_assert_eq(tide__ckpt_remove(root, g_root, "vdir"), TIDE_ERR_INVALID);
    /* a directory of another user is not written into */
    cr_assert_eq(mkdirat(root, "step-000000000002", 0755), 0);
    snprintf(p, sizeof p, "%s/step-000000000002", g_root);
    if (geteuid() == 0) {
        cr_assert_eq(chown(p, 4242, 4242), 0);
        cr_assert_eq(tide__ckpt_open_sub(root, g_root, "step-000000000002", 1, 1, &fd),
                     TIDE_ERR_DENIED);
        cr_assert(strstr(tide_last_error(), "belongs to uid 4242") != NULL, "%s",
                  tide_last_error());
        cr_assert_eq(tide__ckpt_open_sub(root, g_root, "step-000000000002", 0, 0, &fd), TIDE_OK);
        close(fd);
    }
    /* names */
    int64_t step = 0;
    cr_assert(tide__ckpt_step_name("step-000000000042", &step) && step == 42);
    cr_assert(!tide__ckpt_step_name("step-", &step) && !tide__ckpt_step_name("step-4x", &step) &&
              !tide__ckpt_step_name("step-99999999999999999999", &step));
    cr_assert(tide__ckpt_known_name("MANIFEST") && tide__ckpt_known_name("shard-p1-d0-t3.bin") &&
              tide__ckpt_known_name("shard-p1-d0-t3.sum.tmp") &&
              tide__ckpt_known_name("shard-p0-d0-t0.failed"));
    cr_assert(!tide__ckpt_known_name("shard-p1-d0-t3.bin.bak") &&
              !tide__ckpt_known_name("notes.txt") && !tide__ckpt_known_name("shard-p-1-d0-t0.bin"));
    close(root);
}

/* The warnings a test's sink received, one line after another. */
typedef struct warned {
    char text[4096];
    size_t len;
} warned;

static void keep_warning(void *ctx, tide_log_level level, const char *line)
{
    warned *w = ctx;
    if (level == TIDE_LOG_WARN)
        w->len += (size_t)snprintf(w->text + w->len, sizeof w->text - w->len, "%s\n", line);
}

/* Opens the checkpoint root under g_root named name with mode (chmod'ed, umask aside) and
   returns what the logger warned meanwhile, in w. */
static void open_root_with_mode(const char *name, mode_t mode, warned *w)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", g_root, name);
    cr_assert_eq(mkdir(p, 0700), 0);
    cr_assert_eq(chmod(p, mode), 0);
    memset(w, 0, sizeof *w);
    tide_log_set_sink(keep_warning, w);
    int fd = -1;
    tide_status rc = tide__ckpt_open_root(p, 0, &fd);
    tide_log_set_sink(NULL, NULL);
    cr_assert_eq(rc, TIDE_OK, "%s", tide_last_error());
    close(fd);
}

Test(ckpt, a_root_other_users_can_write_is_named_in_a_warning)
{
    warned w;
    tide_log_set_level(TIDE_LOG_WARN);
    open_root_with_mode("mine", 0755, &w);
    cr_expect_eq(w.len, 0, "a root only this user writes to was warned about: %s", w.text);
    open_root_with_mode("shared", 0777, &w);
    cr_expect(strstr(w.text, "/shared is writable by other users (mode 0777") != NULL,
              "no warning naming the shared root: '%s'", w.text);
    open_root_with_mode("group", 0775, &w);
    cr_expect(strstr(w.text, "/group is writable by other users (mode 0775") != NULL,
              "no warning naming the group-writable root: '%s'", w.text);
    /* the sticky bit (as /tmp has) keeps others from removing what this user wrote */
    open_root_with_mode("sticky", 01777, &w);
    cr_expect_eq(w.len, 0, "a sticky root was warned about: %s", w.text);
    /* once per root: a job opens its root at every save */
    char p[400];
    snprintf(p, sizeof p, "%s/shared", g_root);
    memset(&w, 0, sizeof w);
    tide_log_set_sink(keep_warning, &w);
    int fd = -1;
    cr_assert_eq(tide__ckpt_open_root(p, 0, &fd), TIDE_OK, "%s", tide_last_error());
    tide_log_set_sink(NULL, NULL);
    close(fd);
    cr_expect_eq(w.len, 0, "the shared root was warned about twice: %s", w.text);
}

Test(ckpt, saves_follow_no_planted_link)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 7);
    tide_layout_t *l = layout(c, 1, 2, 1, NULL);
    char victim[300], vdir[300], dir[4096], p[4200];
    snprintf(victim, sizeof victim, "%s/victim", g_root);
    snprintf(vdir, sizeof vdir, "%s/vdir", g_root);
    put_file(victim, "precious");
    cr_assert_eq(mkdir(vdir, 0755), 0);
    /* a linked step directory: the save is refused, nothing lands in the target */
    tide_ckpt_step_dir(g_root, 3, dir, sizeof dir);
    cr_assert_eq(symlink(vdir, dir), 0);
    void **b = locals(l, c, g, 0, 0, 0);
    cr_assert_eq(tide_ckpt_write_shard(dir, l, c, 0, 0, 0, (const void *const *)b, 3),
                 TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "is a symbolic link") != NULL, "%s", tide_last_error());
    cr_assert_eq(rmdir(vdir), 0, "the save wrote into the linked directory");
    /* a shard link inside a real step directory: replaced by the shard, the target intact */
    tide_ckpt_step_dir(g_root, 4, dir, sizeof dir);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/shard-p0-d0-t1.bin", dir);
    cr_assert_eq(symlink(victim, p), 0);
    free_bufs(c, b);
    save(g_root, l, c, g, 4);
    cr_assert(holds(victim, "precious"));
    struct stat st;
    cr_assert_eq(lstat(p, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    tide_layout_t *one = layout(c, 1, 1, 1, NULL);
    expect_loads(dir, one, c, g);
    /* a linked shard in a complete checkpoint is refused when read, naming it */
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(symlink(victim, p), 0);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(tide_ckpt_verify(ck), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "shard-p0-d0-t1.bin is a symbolic link") != NULL, "%s",
              tide_last_error());
    tide_ckpt_close(&ck);
    tide_layout_destroy(&one);
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

Test(ckpt, pruning_removes_only_what_tide_wrote)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 8);
    tide_layout_t *l = layout(c, 1, 1, 1, NULL);
    char vdir[300], p[4300], dir[4096];
    snprintf(vdir, sizeof vdir, "%s/vdir", g_root);
    cr_assert_eq(mkdir(vdir, 0755), 0);
    snprintf(p, sizeof p, "%s/MANIFEST", vdir);
    put_file(p, "theirs");
    snprintf(p, sizeof p, "%s/shard-p0-d0-t0.bin", vdir);
    put_file(p, "theirs");
    /* old entries: a link to a foreign directory, a directory holding someone's notes, and
       one of another user; then three real checkpoints */
    tide_ckpt_step_dir(g_root, 1, dir, sizeof dir);
    cr_assert_eq(symlink(vdir, dir), 0);
    save(g_root, l, c, g, 2);
    tide_ckpt_step_dir(g_root, 2, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    put_file(p, "mine");
    save(g_root, l, c, g, 3);
    if (geteuid() == 0) {
        tide_ckpt_step_dir(g_root, 3, dir, sizeof dir);
        cr_assert_eq(chown(dir, 4242, 4242), 0);
    }
    for (int64_t s = 4; s <= 6; s++)
        save(g_root, l, c, g, s);
    cr_assert_eq(tide_ckpt_prune(g_root, 1), TIDE_OK, "%s", tide_last_error());
    struct stat st;
    snprintf(p, sizeof p, "%s/MANIFEST", vdir);
    cr_assert(holds(p, "theirs"), "pruning emptied the directory a planted link points to");
    snprintf(p, sizeof p, "%s/shard-p0-d0-t0.bin", vdir);
    cr_assert(holds(p, "theirs"));
    tide_ckpt_step_dir(g_root, 1, dir, sizeof dir);
    cr_assert_eq(lstat(dir, &st), 0, "the planted link itself is left alone");
    tide_ckpt_step_dir(g_root, 2, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    cr_assert(holds(p, "mine"), "pruning removed a file tide did not write");
    snprintf(p, sizeof p, "%s/MANIFEST", dir);
    cr_assert_eq(stat(p, &st), 0, "a directory left alone is left whole");
    tide_ckpt_step_dir(g_root, 3, dir, sizeof dir);
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert(geteuid() != 0 || st.st_uid == 4242);
    for (int64_t s = 4; s <= 6; s++) {
        tide_ckpt_step_dir(g_root, s, dir, sizeof dir);
        cr_assert_eq(stat(dir, &st) == 0, s == 6, "step %lld", (long long)s);
    }
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}

Test(ckpt, find_takes_the_step_from_the_manifest)
{
    tide_collection_t *c = model(0);
    void **g = globals(c, 9);
    tide_layout_t *l = layout(c, 1, 1, 1, NULL);
    save(g_root, l, c, g, 10);
    save(g_root, l, c, g, 20);
    /* step 20's directory restored under the name of step 30 */
    char from[4096], to[4096], dir[4096], p[4200];
    tide_ckpt_step_dir(g_root, 20, from, sizeof from);
    tide_ckpt_step_dir(g_root, 30, to, sizeof to);
    cr_assert_eq(rename(from, to), 0);
    int64_t step = 0;
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_str_eq(dir, to);
    cr_assert_eq(step, 20, "resumed at step %lld, the name's, not the manifest's", (long long)step);
    cr_assert_eq(tide_ckpt_find(g_root, 20, dir, sizeof dir, &step), TIDE_OK);
    cr_assert_eq(step, 10);
    /* a link named like a newer step is not followed */
    tide_ckpt_step_dir(g_root, 40, dir, sizeof dir);
    cr_assert_eq(symlink(to, dir), 0);
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, p, sizeof p, &step), TIDE_OK);
    cr_assert_str_eq(p, to);
    tide_ckpt_t *ck = NULL;
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "is a symbolic link") != NULL, "%s", tide_last_error());
    /* a FIFO for a manifest: refused at once, never read; find skips it and says so */
    cr_assert_eq(unlink(dir), 0);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/MANIFEST", dir);
    cr_assert_eq(mkfifo(p, 0644), 0);
    uint64_t t0 = tide_now_ns();
    cr_assert_eq(tide_ckpt_open(&ck, dir), TIDE_ERR_INVALID);
    cr_assert(strstr(tide_last_error(), "MANIFEST is a FIFO, not a regular file") != NULL, "%s",
              tide_last_error());
    cr_assert_eq(tide_ckpt_find(dir, INT64_MAX, p, sizeof p, &step), TIDE_ERR_INVALID);
    cr_assert_eq(tide_ckpt_find(g_root, INT64_MAX, p, sizeof p, &step), TIDE_OK);
    cr_assert_eq(step, 20);
    cr_assert_eq(tide_ckpt_find(g_root, 10, p, sizeof p, &step), TIDE_ERR_NOT_FOUND);
    cr_assert(strstr(tide_last_error(), "MANIFEST is a FIFO") != NULL, "%s", tide_last_error());
    cr_assert_lt(tide_now_ns() - t0, 10000000000ull, "a FIFO manifest must not block");
    tide_layout_destroy(&l);
    free_bufs(c, g);
    tide_collection_destroy(&c);
}
