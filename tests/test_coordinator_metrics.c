/*
 * tided's Prometheus metrics (tests/tided_fixture.h): the text served over HTTP on
 * --metrics, scraped as a monitoring system would while workers register, offline work
 * runs and a resize preempts it.
 */
#include "tests/tided_fixture.h"

Test(tided, metrics_are_served_as_prometheus_text, .init = setup, .fini = teardown)
{
    int port = start_with_metrics();
    fake w[3];
    tide_msg_t m, r;
    launch_train(w, 3, 2);
    void *admin = coord_connect(ctx, proc.endpoint, NULL, NULL, NULL, 3000);
    submit_sleep(admin, "eval", 0);
    expect_type(w[2].sock, TIDE_MSG_OFFLINE_ASSIGN, &r);
    tide_msg_clear(&r);
    static char text[1 << 16];
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_gpus{state=\"online\"}"), 2);
    cr_assert_eq(sample(text, "tide_gpus{state=\"offline\"}"), 1);
    cr_assert_eq(sample(text, "tide_gpus{state=\"idle\"}"), 0);
    cr_assert_eq(sample(text, "tide_preemptions_total"), 0);
    /* grow onto the worker running offline work: one preemption, one committed switch */
    mk_resize(&m, 3, 0);
    admin_call(admin, &m, &r, TIDE_MSG_RESIZE_REPLY);
    tide_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        ack_prepare(&w[i], 2, 4);
    for (int i = 0; i < 3; i++)
        commit_done(&w[i], 2, 1000 * (uint64_t)(i + 1));
    cr_assert_eq(wait_job(admin, is_gen2_running).gen, 2);
    scrape(port, text, sizeof text);
    cr_assert_eq(sample(text, "tide_gpus{state=\"online\"}"), 3);
    cr_assert_eq(sample(text, "tide_gpus{state=\"offline\"}"), 0);
    cr_assert_eq(sample(text, "tide_gpus{state=\"failed\"}"), 0);
    cr_assert_eq(sample(text, "tide_jobs{kind=\"online\",state=\"running\"}"), 1);
    cr_assert_eq(sample(text, "tide_jobs{kind=\"offline\",state=\"queued\"}"), 1);
    cr_assert_eq(sample(text, "tide_job_generation{job=\"train\"}"), 2);
    cr_assert_eq(sample(text, "tide_resizes_total{result=\"committed\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_count"), 1);
    double dur = sample(text, "tide_resize_duration_seconds_sum");
    cr_assert(dur > 0 && dur < 10, "resize duration %f s", dur);
    cr_assert_eq(sample(text, "tide_resharded_bytes_total"), 6000, "bytes the workers moved");
    /* the duration is a histogram: cumulative buckets up to +Inf, which is the count */
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"+Inf\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"300\"}"), 1);
    cr_assert_eq(sample(text, "tide_resize_duration_seconds_bucket{le=\"10\"}"), 1,
                 "a resize of %f s", dur);
    double prev = 0;
    int buckets = 0;
    for (const char *p = strstr(text, "tide_resize_duration_seconds_bucket{"); p != NULL;
         p = strstr(p + 1, "tide_resize_duration_seconds_bucket{")) {
        double v = strtod(strchr(p, ' ') + 1, NULL);
        cr_assert_geq(v, prev, "buckets are cumulative: %.40s", p);
        prev = v;
        buckets++;
    }
    cr_assert_geq(buckets, 5);
    cr_assert_eq(sample(text, "tide_preemptions_total"), 1);
    cr_assert_geq(sample(text, "tide_heartbeats_total"), 0);
    /* the exposition format: every sample's family was declared by # TYPE before it */
    char fam[128][96];
    int nfam = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            cr_assert_lt(nfam, 128);
            char type[32] = "";
            sscanf(line + 7, "%95s %31s", fam[nfam], type);
            /* Prometheus naming: a counter ends in _total, a unit is the name's suffix
               (before _total), never in its middle */
            const char *f = fam[nfam++];
            size_t fl = strlen(f);
            if (strcmp(type, "counter") == 0)
                cr_assert(fl > 6 && strcmp(f + fl - 6, "_total") == 0, "counter %s", f);
            for (const char *unit = "_seconds"; unit; unit = unit[1] == 's' ? "_bytes" : NULL) {
                const char *at = strstr(f, unit);
                size_t ul = strlen(unit);
                cr_assert(at == NULL || at[ul] == '\0' || strcmp(at + ul, "_total") == 0,
                          "%s: the unit %s is not the name's suffix", f, unit);
            }
            continue;
        }
        if (line[0] == '#')
            continue;
        char name[160];
        double v;
        cr_assert_eq(sscanf(line, "%159s %lf", name, &v), 2, "bad sample line '%s'", line);
        name[strcspn(name, "{")] = '\0';
        int declared = 0;
        for (int f = 0; f < nfam; f++) {
            size_t k = strlen(fam[f]);
            declared |= strncmp(name, fam[f], k) == 0 &&
                        (name[k] == '\0' || strcmp(name + k, "_sum") == 0 ||
                         strcmp(name + k, "_count") == 0 || strcmp(name + k, "_bucket") == 0);
        }
        cr_assert(declared, "sample %s has no # TYPE line", name);
    }
    cr_assert_gt(nfam, 8);
    for (int i = 0; i < 3; i++)
        zmq_close(w[i].sock);
    zmq_close(admin);
}

/* Workers of a freshly launched job register first and join a moment later; offline
   work queued meanwhile must not go to them: the job would have to preempt it to start.
   Once the first layout is placed, the ranks it left spare get the work. */

/* The endpoint file says tided serves, so it appears only once every listener is open: a
   metrics address another process listens on makes tided exit with the reason and leave
   no endpoint file. (Written before the metrics listener, it let a scraper connect too
   early under load, and named a tided that then exited.) */
Test(tided, the_endpoint_file_appears_only_once_metrics_listen, .init = setup, .fini = teardown)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 1), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    const char *extra[] = {"--metrics", addr, NULL};
    int st = 0;
    cr_assert_neq(coord_start(&proc, TIDED_PATH, extra, &st), 0,
                  "tided announced itself with its metrics address held by another process");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "tided's status %d", st);
    cr_assert_neq(access(proc.epfile, F_OK), 0, "tided left an endpoint file behind");
    close(fd);
}
