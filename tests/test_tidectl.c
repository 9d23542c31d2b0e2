/*
 * Unit tests for tidectl (coordinator/tidectl.c built with TIDECTL_NO_MAIN), the pure
 * pieces: argument parsing (stages, --since, byte sizes) and table/JSON formatting, called
 * directly. The whole CLI is tested in test_tidectl_cli.c (usage errors and a fake tided)
 * and test_tidectl_keys.c (keys and CURVE); the three are one executable, test_tidectl,
 * sharing tidectl_fixture.h.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tidectl.h"
#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tidectl_fixture.h"

/* ---- pure pieces
 * ---------------------------------------------------------------------------------------- */

Test(tidectl_parse, stages)
{
    int *s;
    uint32_t n;
    cr_assert_eq(tidectl_parse_stages("0-11,12-23", &s, &n), TIDE_OK, "%s", tide_last_error());
    cr_expect_eq(n, 3u);
    cr_expect(s[0] == 0 && s[1] == 12 && s[2] == 24);
    tide_free(s);
    cr_assert_eq(tidectl_parse_stages("0-3,4,5-9", &s, &n), TIDE_OK);
    cr_expect(n == 4 && s[1] == 4 && s[2] == 5 && s[3] == 10);
    tide_free(s);
    cr_expect_eq(tidectl_parse_stages("1-5", &s, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 0 starts at layer 1 but must start at 0"));
    cr_expect_eq(tidectl_parse_stages("0-5,7-9", &s, &n), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "stage 1 starts at layer 7 but must start at 6"));
    cr_expect_eq(tidectl_parse_stages("0-5,", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("0-x", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("", &s, &n), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_stages("0-5,6-3", &s, &n), TIDE_ERR_INVALID);
    cr_expect_null(s);
}

Test(tidectl_parse, since)
{
    int64_t now = 1700000000000, v;
    cr_assert_eq(tidectl_parse_since("10m", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 600000);
    cr_assert_eq(tidectl_parse_since("90s", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 90000);
    cr_assert_eq(tidectl_parse_since("1d", now, &v), TIDE_OK);
    cr_expect_eq(v, now - 86400000);
    cr_assert_eq(tidectl_parse_since("2024-05-01T12:00:00Z", now, &v), TIDE_OK);
    cr_expect_eq(v, 1714564800000);
    cr_assert_eq(tidectl_parse_since("2024-05-01 12:00Z", now, &v), TIDE_OK);
    cr_expect_eq(v, 1714564800000);
    cr_assert_eq(tidectl_parse_since("1699999999000", now, &v), TIDE_OK);
    cr_expect_eq(v, 1699999999000);
    cr_expect_eq(tidectl_parse_since("yesterday", now, &v), TIDE_ERR_INVALID);
    cr_expect(strstr(tide_last_error(), "--since 'yesterday'"));
    cr_expect_eq(tidectl_parse_since("2024-13-01", now, &v), TIDE_ERR_INVALID);
}

Test(tidectl_parse, bytes_and_formatting)
{
    uint64_t b;
    cr_assert_eq(tidectl_parse_bytes("16G", &b), TIDE_OK);
    cr_expect_eq(b, 16ull << 30);
    cr_assert_eq(tidectl_parse_bytes("512MiB", &b), TIDE_OK);
    cr_expect_eq(b, 512ull << 20);
    cr_assert_eq(tidectl_parse_bytes("1.5K", &b), TIDE_OK);
    cr_expect_eq(b, 1536u);
    cr_assert_eq(tidectl_parse_bytes("1000", &b), TIDE_OK);
    cr_expect_eq(b, 1000u);
    cr_expect_eq(tidectl_parse_bytes("16Q", &b), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_bytes("-1G", &b), TIDE_ERR_INVALID);
    cr_expect_eq(tidectl_parse_bytes("lots", &b), TIDE_ERR_INVALID);
    char buf[32];
    cr_expect_str_eq(tidectl_fmt_bytes(512, buf, sizeof buf), "512 B");
    cr_expect_str_eq(tidectl_fmt_bytes(3ull << 30, buf, sizeof buf), "3.00 GiB");
    cr_expect_str_eq(tidectl_fmt_bytes(1536, buf, sizeof buf), "1.50 KiB");
}

Test(tidectl_format, json_strings_are_escaped_and_valid_utf8)
{
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_json_str(f, "a\"b\\c\nd\te\x01 caf\xc3\xa9 bad\xff end");
    fclose(f);
    cr_expect_str_eq(s, "\"a\\\"b\\\\c\\nd\\te\\u0001 caf\xc3\xa9 bad\\ufffd end\"");
    free(s);
}

Test(tidectl_format, status_table_is_aligned)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, 0);
    fclose(f);
    cr_expect(strstr(s, "2 GPUs: 1 online, 0 offline work, 1 idle, 0 draining, 0 failed"), "%s", s);
    /* left-aligned columns start where their header starts */
    cr_expect_eq(col_of(s, "STATE"), col_of(s, "online  "), "%s", s);
    cr_expect_eq(col_of(s, "STATE"), col_of(s, "idle  "), "%s", s);
    cr_expect_eq(col_of(s, "HOST"), col_of(s, "node-a"), "%s", s);
    cr_expect_eq(col_of(s, "ROLE"), col_of(s, "pp1/dp0/tp0"), "%s", s);
    cr_expect_eq(col_of(s, "OFFLINE"), col_of(s, "sweep"), "%s", s);
    cr_expect(strstr(s, "80.00 GiB"), "%s", s);
    cr_expect(strstr(s, "400 ms ago"), "%s", s);
    cr_expect(strstr(s, "12.5"), "%s", s);
    /* no line ends in blanks */
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "{\"time_ms\":1700000001000,\"ompi_server\":\"\",\"gpus\":[{\"worker\":0,"
                        "\"host\":\"node-a\""),
              "%s", s);
    cr_expect(strstr(s, "\"job\":null"), "%s", s);
    cr_expect(strstr(s, "\"offline\":\"sweep\""), "%s", s);
    cr_expect_eq(s[len - 1], '\n');
    free(s);
    tide_msg_clear(&rep);
}

/* -o wide: the columns that say which process a row is (pool, rank in it, pid on HOST),
   after the usual ones, aligned like them; the plain table stays as it was. JSON always
   carries them. */
Test(tidectl_format, status_wide_maps_rows_to_processes)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_WIDE);
    fclose(f);
    cr_expect_eq(col_of(s, "HOST"), col_of(s, "node-a"), "%s", s);
    cr_expect_eq(col_of(s, "POOL"), col_of(s, "launch-7"), "%s", s);
    cr_expect_gt(col_of(s, "POOL"), col_of(s, "SEEN"), "after the usual columns: %s", s);
    cr_expect_eq(col_of(s, "PID") + (long)strlen("PID"), col_of(s, "4242") + 4,
                 "numbers right-aligned under their header:\n%s", s);
    /* the second row: rank 3 of no known pool, no known pid */
    const char *row2 = strstr(s, "a-much-longer-host-name.example");
    cr_assert_not_null(row2, "%s", s);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(row2, "\n"), row2);
    const char *last[3] = {"", "", ""}; /* its POOL, RANK and PID cells */
    for (char *tok = strtok(line, " "); tok != NULL; tok = strtok(NULL, " ")) {
        last[0] = last[1];
        last[1] = last[2];
        last[2] = tok;
    }
    cr_expect(strcmp(last[0], "-") == 0 && strcmp(last[1], "3") == 0 && strcmp(last[2], "-") == 0,
              "POOL RANK PID of the second row: '%s' '%s' '%s'", last[0], last[1], last[2]);
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_TABLE);
    fclose(f);
    cr_expect_null(strstr(s, "PID"), "the plain table has no PID column: %s", s);
    cr_expect_null(strstr(s, "launch-7"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_JSON);
    fclose(f);
    /* the keys that came first stay first, in their order (scripts grep for them) */
    cr_expect(strstr(s, "{\"worker\":0,\"host\":\"node-a\",\"device\":0,"), "%s", s);
    cr_expect(strstr(s, "\"pid\":4242,\"pool\":\"launch-7\",\"pool_rank\":1,\"alloc\":null}"), "%s",
              s);
    cr_expect(strstr(s, "\"pid\":0,\"pool\":null,\"pool_rank\":3,\"alloc\":null}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}

Test(tidectl_format, allocations_get_a_column_only_when_there_are_some)
{
    tide_msg_t rep, req;
    tide_msg_init(&req, TIDE_MSG_STATUS);
    answer_status(&req, &rep, NULL);
    strcpy(rep.u.status_reply.rows[0].alloc, "slurm 12");
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_TABLE);
    fclose(f);
    cr_expect_eq(col_of(s, "ALLOC"), col_of(s, "slurm 12"), "%s", s);
    cr_expect_null(strstr(s, " \n"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_status(f, &rep.u.status_reply, TIDECTL_JSON);
    fclose(f);
    cr_expect(strstr(s, "\"alloc\":\"slurm 12\"}") && strstr(s, "\"alloc\":null}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
    tide_msg_init(&req, TIDE_MSG_JOBS);
    answer_status(&req, &rep, NULL);
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 0);
    fclose(f);
    cr_expect_null(strstr(s, "ALLOCATIONS"), "a column for nothing: %s", s);
    free(s);
    strcpy(rep.u.jobs_reply.rows[0].allocs, "slurm 12 h[1-2]; slurm 14 pending (Resources)");
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 0);
    fclose(f);
    cr_expect_eq(col_of(s, "ALLOCATIONS"), col_of(s, "slurm 12 h[1-2]; slurm 14 pending"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_jobs(f, &rep.u.jobs_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "\"allocs\":\"slurm 12 h[1-2]; slurm 14 pending (Resources)\"}"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}

Test(tidectl_format, events_keep_details_on_one_line)
{
    tide_msg_t rep;
    answer_events(NULL, &rep, NULL);
    char *s;
    size_t len;
    FILE *f = open_memstream(&s, &len);
    tidectl_print_events(f, &rep.u.events_reply, 0);
    fclose(f);
    cr_expect(strstr(s, "worker 3 missed 3 heartbeats?line2"), "%s", s);
    cr_expect_eq(col_of(s, "KIND"), col_of(s, "worker_failed"), "%s", s);
    cr_expect_eq(col_of(s, "KIND"), col_of(s, "resize"), "%s", s);
    free(s);
    f = open_memstream(&s, &len);
    tidectl_print_events(f, &rep.u.events_reply, 1);
    fclose(f);
    cr_expect(strstr(s, "\"detail\":\"dp 2 -> 4 \\\"fast\\\"\""), "%s", s);
    cr_expect(strstr(s, "\"job\":null"), "%s", s);
    free(s);
    tide_msg_clear(&rep);
}
