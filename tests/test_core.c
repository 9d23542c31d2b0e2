/*
 * Unit tests for core/: status messages, error details, the check macros, the
 * logger, the allocation failure hook, option parsing, bulk copies and the
 * CURVE key file format.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/keyfile.h"
#include "core/log.h"
#include "core/opts.h"
#include "core/sort.h"
#include "core/version.h"

/* ---- status ---------------------------------------------------------------- */

Test(core_status, every_code_has_a_message_and_a_name)
{
#define CHECK_ONE(name, value, msg)                                                                \
    cr_expect_str_eq(tide_strerror(TIDE_##name), msg);                                             \
    cr_expect_str_eq(tide_status_name(TIDE_##name), "TIDE_" #name);                                \
    cr_expect(value <= 0);
    TIDE_STATUS_MAP(CHECK_ONE)
#undef CHECK_ONE
    cr_expect_str_eq(tide_strerror((tide_status)-9999), "unknown tide status");
}

Test(core_status, error_detail_is_per_thread_and_clearable)
{
    tide_status rc = tide_errorf(TIDE_ERR_RANGE, "tp=%d does not divide %d", 3, 4096);
    cr_expect_eq(rc, TIDE_ERR_RANGE);
    cr_expect_str_eq(tide_last_error(), "tp=3 does not divide 4096");
    tide_error_clear();
    cr_expect_str_eq(tide_last_error(), "");
}

/* ---- check macros ------------------------------------------------------------ */

struct captured {
    int n;
    char lines[16][1024];
};

static void capture(void *ctx, tide_log_level level, const char *line)
{
    struct captured *c = ctx;
    (void)level;
    if (c->n < 16)
        snprintf(c->lines[c->n++], sizeof c->lines[0], "%s", line);
}

static int calls_after_failure;

static tide_status innermost(int fail)
{
    if (fail)
        return tide_errorf(TIDE_ERR_IO, "disk full writing state");
    return TIDE_OK;
}

static tide_status never_reached(void)
{
    calls_after_failure++;
    return TIDE_ERR_INTERNAL;
}

static tide_status middle(int fail)
{
    TIDE_CHECK(innermost(fail));
    TIDE_CHECK(never_reached());
    return TIDE_OK;
}

static int cleaned_up;

static tide_status outer(int fail)
{
    tide_status rc = TIDE_OK;
    char *scratch = tide_malloc(64);
    TIDE_CHECK_ALLOC_GOTO(scratch, rc, out);
    TIDE_CHECK_GOTO(middle(fail), rc, out);
    TIDE_CHECK_GOTO(never_reached(), rc, out);
out:
    tide_free(scratch);
    cleaned_up++;
    return rc;
}

Test(core_check, macros_propagate_the_first_error_and_log_each_hop)
{
    struct captured cap = {0};
    tide_log_set_level(TIDE_LOG_DEBUG);
    tide_log_set_sink(capture, &cap);
    calls_after_failure = 0;
    cleaned_up = 0;

    tide_status rc = outer(1);

    tide_log_set_sink(NULL, NULL);
    tide_log_set_level(TIDE_LOG_WARN);
    cr_expect_eq(rc, TIDE_ERR_IO, "got %s", tide_status_name(rc));
    cr_expect_eq(calls_after_failure, 0, "code after the failing call ran");
    cr_expect_eq(cleaned_up, 1, "cleanup path not taken exactly once");
    cr_expect_str_eq(tide_last_error(), "disk full writing state");
    cr_assert_eq(cap.n, 2, "expected one log line per hop, got %d", cap.n);
    cr_expect(strstr(cap.lines[0], "innermost(fail) failed") != NULL, "%s", cap.lines[0]);
    cr_expect(strstr(cap.lines[0], "test_core.c:") != NULL, "%s", cap.lines[0]);
    cr_expect(strstr(cap.lines[1], "middle(fail) failed") != NULL, "%s", cap.lines[1]);
    cr_expect(strstr(cap.lines[1], "disk full writing state") != NULL, "%s", cap.lines[1]);
}

Test(core_check, success_path_logs_nothing)
{
    struct captured cap = {0};
    tide_log_set_level(TIDE_LOG_DEBUG);
    tide_log_set_sink(capture, &cap);
    calls_after_failure = 0;
    tide_status rc = middle(0);
    tide_log_set_sink(NULL, NULL);
    tide_log_set_level(TIDE_LOG_WARN);
    /* middle() goes on to never_reached(), which fails with ERR_INTERNAL. */
    cr_expect_eq(rc, TIDE_ERR_INTERNAL);
    cr_expect_eq(calls_after_failure, 1);
    cr_expect_eq(cap.n, 1);
}

/* ---- allocation hook ----------------------------------------------------- */

Test(core_alloc, nth_allocation_fails_once)
{
    tide_alloc_fail_at(3, 0);
    void *a = tide_malloc(8);
    void *b = tide_calloc(2, 8);
    void *c = tide_malloc(8);
    void *d = tide_strdup("x");
    cr_expect_not_null(a);
    cr_expect_not_null(b);
    cr_expect_null(c);
    cr_expect_not_null(d);
    cr_expect_eq(tide_alloc_failures(), 1);
    tide_free(a);
    tide_free(b);
    tide_free(d);
}

Test(core_alloc, sticky_failure_keeps_failing_until_disabled)
{
    tide_alloc_fail_at(1, 1);
    cr_expect_null(tide_malloc(1));
    cr_expect_null(tide_strdup("abc"));
    void *p = tide_malloc(1);
    cr_expect_null(p);
    void *orig = malloc(4);
    cr_expect_null(tide_realloc(orig, 64), "realloc must fail and leave orig alone");
    free(orig);
    cr_expect_eq(tide_alloc_failures(), 4);
    tide_alloc_fail_at(0, 0);
    p = tide_malloc(1);
    cr_expect_not_null(p);
    tide_free(p);
}

Test(core_alloc, overflowing_array_sizes_fail_cleanly)
{
    cr_expect_null(tide_calloc(SIZE_MAX / 2, 4));
    cr_expect_null(tide_reallocarray(NULL, SIZE_MAX / 2, 4));
}

/* A function that makes several allocations and must give all back on failure. */
static tide_status build_names(int n, char ***out)
{
    tide_status rc = TIDE_OK;
    char **names = tide_calloc((size_t)n, sizeof *names);
    TIDE_CHECK_ALLOC_GOTO(names, rc, fail);
    for (int i = 0; i < n; i++) {
        names[i] = tide_strdup("layer.weight");
        TIDE_CHECK_ALLOC_GOTO(names[i], rc, fail);
    }
    *out = names;
    return TIDE_OK;
fail:
    if (names != NULL)
        for (int i = 0; i < n; i++)
            tide_free(names[i]);
    tide_free(names);
    return rc;
}

Test(core_alloc, every_failure_point_reports_nomem_without_leaking)
{
    /* Fail the 1st, 2nd, ... allocation in turn until the call succeeds;
     * LeakSanitizer (TIDE_SANITIZE=ON) catches anything not given back. */
    int failures_seen = 0;
    for (long n = 1;; n++) {
        char **names = NULL;
        tide_alloc_fail_at(n, 0);
        tide_status rc = build_names(5, &names);
        tide_alloc_fail_at(0, 0);
        if (rc == TIDE_OK) {
            for (int i = 0; i < 5; i++)
                tide_free(names[i]);
            tide_free(names);
            break;
        }
        cr_assert_eq(rc, TIDE_ERR_NOMEM, "failure point %ld gave %s", n, tide_status_name(rc));
        failures_seen++;
    }
    cr_expect_eq(failures_seen, 6, "one failure point per allocation");
}

/* ---- logger -------------------------------------------------------------------- */

Test(core_log, levels_parse_and_filter)
{
    tide_log_level l;
    cr_expect_eq(tide_log_parse_level("DEBUG", &l), TIDE_OK);
    cr_expect_eq(l, TIDE_LOG_DEBUG);
    cr_expect_eq(tide_log_parse_level("warning", &l), TIDE_OK);
    cr_expect_eq(l, TIDE_LOG_WARN);
    cr_expect_eq(tide_log_parse_level("verbose", &l), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "verbose") != NULL);

    struct captured cap = {0};
    tide_log_set_sink(capture, &cap);
    tide_log_set_level(TIDE_LOG_WARN);
    TIDE_INFO("test", "hidden %d", 1);
    TIDE_WARN("test", "shown %d", 2);
    TIDE_ERROR("reshard", "also shown");
    tide_log_set_sink(NULL, NULL);
    cr_assert_eq(cap.n, 2);
    cr_expect(strstr(cap.lines[0], " W [test] shown 2") != NULL, "%s", cap.lines[0]);
    cr_expect(strstr(cap.lines[1], " E [reshard] also shown") != NULL, "%s", cap.lines[1]);
}

Test(core_log, level_comes_from_environment)
{
    /* Criterion runs each test in its own process, so the level is unread here. */
    setenv("TIDE_LOG", "info", 1);
    cr_expect_eq(tide_log_get_level(), TIDE_LOG_INFO);
}

/* ---- clock --------------------------------------------------------------------- */

Test(core_clock, monotonic_clock_advances)
{
    uint64_t a = tide_now_ns();
    tide_sleep_ms(2);
    uint64_t b = tide_now_ns();
    cr_expect_geq(b - a, 2000000ull);
    cr_expect_gt(tide_wall_ms(), 1700000000000ll);
}

/* ---- options ------------------------------------------------------------------- */

struct settings {
    const char *endpoint;
    long long port;
    double ratio;
    int verbose;
};

static void opts_for(struct settings *s, tide_opt *opts)
{
    tide_opt table[] = {
        {"endpoint", "TIDE_TEST_ENDPOINT", TIDE_OPT_STRING, &s->endpoint, "tcp://127.0.0.1:5555",
         "coordinator endpoint", 0, 0},
        {"port", NULL, TIDE_OPT_INT, &s->port, "10", "a port", 1, 65535},
        {"ratio", NULL, TIDE_OPT_DOUBLE, &s->ratio, "0.5", "a ratio", 0, 0},
        {"verbose", "TIDE_TEST_VERBOSE", TIDE_OPT_BOOL, &s->verbose, "0", "chatty", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    memcpy(opts, table, sizeof table);
}

Test(core_opts, defaults_env_then_flags_and_positionals)
{
    struct settings s = {0};
    tide_opt opts[5];
    opts_for(&s, opts);
    setenv("TIDE_TEST_ENDPOINT", "tcp://127.0.0.1:7000", 1);
    setenv("TIDE_TEST_VERBOSE", "true", 1);
    char *argv[] = {"prog", "resize", "--port=99", "job1", "--ratio", "0.25", "--no-verbose", NULL};
    int npos = 0, help = 0;
    cr_assert_eq(tide_opts_parse(opts, 7, argv, &npos, &help), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(s.endpoint, "tcp://127.0.0.1:7000");
    cr_expect_eq(s.port, 99);
    cr_expect_float_eq(s.ratio, 0.25, 1e-12);
    cr_expect_eq(s.verbose, 0);
    cr_expect_eq(npos, 2);
    cr_expect_str_eq(argv[1], "resize");
    cr_expect_str_eq(argv[2], "job1");
    cr_expect_eq(help, 0);
}

Test(core_opts, bad_flags_are_refused_with_the_flag_named)
{
    struct settings s = {0};
    tide_opt opts[5];
    opts_for(&s, opts);
    char *unknown[] = {"prog", "--prot", "5", NULL};
    cr_expect_eq(tide_opts_parse(opts, 3, unknown, NULL, NULL), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "--prot") != NULL, "%s", tide_last_error());
    char *range[] = {"prog", "--port", "70000", NULL};
    cr_expect_eq(tide_opts_parse(opts, 3, range, NULL, NULL), TIDE_ERR_RANGE);
    cr_expect(strstr(tide_last_error(), "70000") != NULL, "%s", tide_last_error());
    char *notint[] = {"prog", "--port", "12x", NULL};
    cr_expect_eq(tide_opts_parse(opts, 3, notint, NULL, NULL), TIDE_ERR_INVALID);
    char *missing[] = {"prog", "--ratio", NULL};
    cr_expect_eq(tide_opts_parse(opts, 2, missing, NULL, NULL), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "needs a value") != NULL, "%s", tide_last_error());
    int help = 0;
    char *h[] = {"prog", "--help", NULL};
    cr_expect_eq(tide_opts_parse(opts, 2, h, NULL, &help), TIDE_OK);
    cr_expect_eq(help, TIDE_OPTS_HELP);
    /* --version anywhere, and --help over it whatever the order */
    char *v[] = {"prog", "--port", "7", "--version", NULL};
    cr_expect_eq(tide_opts_parse(opts, 4, v, NULL, &help), TIDE_OK);
    cr_expect_eq(help, TIDE_OPTS_VERSION);
    char *hv[] = {"prog", "--help", "--version", NULL};
    cr_expect_eq(tide_opts_parse(opts, 3, hv, NULL, &help), TIDE_OK);
    cr_expect_eq(help, TIDE_OPTS_HELP);
    char *vh[] = {"prog", "--version", "-h", NULL};
    cr_expect_eq(tide_opts_parse(opts, 3, vh, NULL, &help), TIDE_OK);
    cr_expect_eq(help, TIDE_OPTS_HELP);
}

/* The version names the project's version first (help2man and users read it so). */
Test(core_opts, version_prints_the_program_and_the_build_version)
{
    const char *ver = tide_build_version();
    cr_assert(strncmp(ver, TIDE_TEST_PROJECT_VERSION, strlen(TIDE_TEST_PROJECT_VERSION)) == 0,
              "version '%s' does not start with %s", ver, TIDE_TEST_PROJECT_VERSION);
    char buf[256];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cr_assert_not_null(f);
    tide_version_print(f, "prog");
    fclose(f);
    char want[256];
    snprintf(want, sizeof want, "prog (tide) %s\n", ver);
    cr_expect_str_eq(buf, want);
}

/* A program without positional arguments: go on, --help (exit 0), or a refusal (exit 2)
   for a bad flag or a stray argument, which tide_opts_parse alone would only move. */
Test(core_opts, a_program_goes_on_or_exits_with_the_right_status, .init = cr_redirect_stdout)
{
    struct settings s = {0};
    tide_opt opts[5];
    opts_for(&s, opts);
    char *fine[] = {"prog", "--port", "7", NULL};
    cr_expect_eq(tide_opts_main(opts, 3, fine, "prog"), -1);
    cr_expect_eq(s.port, 7);
    char *h[] = {"prog", "--help", NULL};
    cr_expect_eq(tide_opts_main(opts, 2, h, "prog"), 0);
    char *bad[] = {"prog", "--prot", "5", NULL};
    cr_expect_eq(tide_opts_main(opts, 3, bad, "prog"), 2);
    char *stray[] = {"prog", "--port", "7", "extra", NULL};
    cr_expect_eq(tide_opts_main(opts, 4, stray, "prog"), 2);
    cr_expect(strstr(tide_last_error(), "extra") != NULL, "%s", tide_last_error());
    char *v[] = {"prog", "--version", NULL};
    cr_expect_eq(tide_opts_main(opts, 2, v, "prog"), 0);
}

/* Wrapping the previous detail in a new one is the usual way to add context. */
Test(core_status, a_detail_may_wrap_the_previous_one)
{
    tide_errorf(TIDE_ERR_NO_HOLDER, "no live worker holds %s", "layer.2.fc1.weight.exp_avg");
    tide_status rc =
        tide_errorf(TIDE_ERR_NO_HOLDER, "cannot recover: %s; restart it", tide_last_error());
    cr_expect_eq(rc, TIDE_ERR_NO_HOLDER);
    cr_expect_str_eq(tide_last_error(),
                     "cannot recover: no live worker holds layer.2.fc1.weight.exp_avg; restart it");
}

/* ---- key files ------------------------------------------------------------- */

/* Two real CURVE keys (libzmq's test vectors) so the format is checked without libzmq. */
#define PUB_A "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
#define SEC_A "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"

Test(core_keyfile, every_role_and_half_round_trips)
{
    tide_key_role roles[] = {TIDE_KEY_ROLE_NONE, TIDE_KEY_ROLE_WORKER, TIDE_KEY_ROLE_ADMIN,
                             TIDE_KEY_ROLE_READER};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        for (int secret = 0; secret <= 1; secret++) {
            tide_keyfile k = {.public_key = PUB_A, .secret_key = SEC_A, .role = roles[i]};
            char text[512];
            cr_assert_eq(tide_keyfile_format(&k, secret, "a note\nsecond line", text, sizeof text),
                         TIDE_OK, "%s", tide_last_error());
            const char *head = "# a note\n# second line\npublic = ";
            cr_expect(strncmp(text, head, strlen(head)) == 0, "%s", text);
            tide_keyfile back;
            cr_assert_eq(tide_keyfile_parse(text, "t", &back), TIDE_OK, "%s", tide_last_error());
            cr_expect_str_eq(back.public_key, PUB_A);
            cr_expect_str_eq(back.secret_key, secret ? SEC_A : "");
            cr_expect_eq(back.role, roles[i]);
        }
    }
}

Test(core_keyfile, spacing_comments_and_unknown_names_are_accepted)
{
    tide_keyfile k;
    cr_assert_eq(tide_keyfile_parse("\n  # c\npublic=" PUB_A "\r\n\tsecret   =  " SEC_A
                                    "  \nrole = reader\nexpires = never\n",
                                    "t", &k),
                 TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(k.public_key, PUB_A);
    cr_expect_str_eq(k.secret_key, SEC_A);
    cr_expect_eq(k.role, TIDE_KEY_ROLE_READER);
}

Test(core_keyfile, bad_files_are_refused_with_the_line_named)
{
    struct {
        const char *text, *detail;
    } bad[] = {
        {"public " PUB_A "\n", "t:1: expected 'name = value'"},
        {"# only a comment\n", "t: no 'public = ...' line"},
        {"public = short\n", "t:1: the public key must be 40 Z85 characters"},
        {"public = " PUB_A "\nsecret = " PUB_A "x\n", "t:2: the secret key must be"},
        {"public = " PUB_A "\nrole = root\n", "t:2: role must be admin, worker or reader"},
        {"public = " PUB_A "\npublic = " PUB_A "\n", "t:2: 'public' given twice"},
        /* '~' is not a Z85 character; "#####" overflows a 32-bit word */
        {"public = ~ne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID\n", "must be 40 Z85"},
        {"public = #####w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID\n", "must be 40 Z85"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_keyfile k;
        cr_expect_eq(tide_keyfile_parse(bad[i].text, "t", &k), TIDE_ERR_INVALID, "%s", bad[i].text);
        cr_expect(strstr(tide_last_error(), bad[i].detail), "%s: %s", bad[i].text,
                  tide_last_error());
    }
    cr_expect(tide_key_z85_valid(PUB_A));
    cr_expect(!tide_key_z85_valid(PUB_A "0"));
}

Test(core_keyfile, files_are_written_privately_and_never_through_a_symlink)
{
    char dir[64], path[128], victim[128], server[128];
    snprintf(dir, sizeof dir, "/tmp/tide-keyfile-%d", (int)getpid());
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/a.key", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(server, sizeof server, "%s/server.pub", dir);
    tide_keyfile k = {.public_key = PUB_A, .secret_key = SEC_A, .role = TIDE_KEY_ROLE_WORKER};
    cr_assert_eq(tide_keyfile_write(path, &k, 1, NULL, 0600, 0), TIDE_OK, "%s", tide_last_error());
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777, 0600u);
    tide_keyfile back;
    cr_assert_eq(tide_keyfile_read_pair(path, &back), TIDE_OK, "%s", tide_last_error());
    cr_expect_str_eq(back.secret_key, SEC_A);
    cr_expect_eq(tide_keyfile_write(path, &k, 1, NULL, 0600, 0), TIDE_ERR_EXISTS);

    /* a symlink planted at the path: refused without replace, replaced (not followed) with it */
    FILE *f = fopen(victim, "w");
    fputs("precious\n", f);
    fclose(f);
    unlink(path);
    cr_assert_eq(symlink(victim, path), 0);
    cr_expect_eq(tide_keyfile_write(path, &k, 1, NULL, 0600, 0), TIDE_ERR_EXISTS);
    cr_assert_eq(tide_keyfile_write(path, &k, 1, NULL, 0600, 1), TIDE_OK, "%s", tide_last_error());
    cr_assert_eq(lstat(path, &sb), 0);
    cr_expect(S_ISREG(sb.st_mode), "the link itself was replaced");
    char text[32] = "";
    f = fopen(victim, "r");
    cr_assert(fgets(text, sizeof text, f) != NULL);
    fclose(f);
    cr_expect_str_eq(text, "precious\n", "the link's target is untouched");

    /* a .pub file is not a key pair; the server key may be a file or its Z85 text */
    cr_assert_eq(tide_keyfile_write(server, &k, 0, "tided", 0644, 0), TIDE_OK);
    cr_expect_eq(tide_keyfile_read_pair(server, &back), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "not NAME.pub"), "%s", tide_last_error());
    char z85[41];
    cr_assert_eq(tide_keyfile_server_key(server, z85), TIDE_OK);
    cr_expect_str_eq(z85, PUB_A);
    cr_assert_eq(tide_keyfile_server_key(PUB_A, z85), TIDE_OK);
    cr_expect_str_eq(z85, PUB_A);
    char none[128];
    snprintf(none, sizeof none, "%s/none", dir);
    cr_expect_eq(tide_keyfile_read(none, &back), TIDE_ERR_IO);
    cr_expect(strstr(tide_last_error(), "cannot read key file"));
    unlink(path);
    unlink(victim);
    unlink(server);
    cr_expect_eq(rmdir(dir), 0, "no temporary file left behind");
}

static int cmp_i32_ref(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The radix sort against qsort: every size around its small-array cut-off and its digit
 * width, narrow and full ranges, negative values, and the qsort fallback when its scratch
 * cannot be allocated. */
Test(core_sort, radix_sort_agrees_with_qsort)
{
    uint64_t x = 88172645463325252ull;
    size_t sizes[] = {0, 1, 2, 47, 48, 49, 100, 2047, 2048, 2049, 10000, 70000};
    int32_t *a = malloc(70000 * sizeof *a), *b = malloc(70000 * sizeof *b);
    cr_assert(a != NULL && b != NULL);
    for (int fail = 0; fail < 2; fail++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int range = 0; range < 3; range++) {
                size_t n = sizes[si];
                for (size_t i = 0; i < n; i++) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    a[i] = range == 0   ? (int32_t)(x % 64)            /* one digit varies */
                           : range == 1 ? (int32_t)(x % 20000) - 10000 /* negative too */
                                        : (int32_t)(uint32_t)x;        /* every bit */
                    b[i] = a[i];
                }
                if (fail)
                    tide_alloc_fail_at(1, 0);
                tide_sort_i32(a, n);
                tide_alloc_fail_at(0, 0);
                qsort(b, n, sizeof *b, cmp_i32_ref);
                cr_assert(n == 0 || memcmp(a, b, n * sizeof *a) == 0,
                          "size %zu, range %d, scratch %s: differs from qsort", n, range,
                          fail ? "failed" : "allocated");
            }
    uint32_t u[] = {0xffffffffu, 0, 0x80000000u, 7, 0x7fffffffu};
    tide_sort_u32(u, 5);
    cr_assert(u[0] == 0 && u[1] == 7 && u[2] == 0x7fffffffu && u[3] == 0x80000000u &&
              u[4] == 0xffffffffu);
    free(a);
    free(b);
}
