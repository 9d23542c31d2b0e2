/*
 * tidectl's commands that change something: resize, submit, cancel, drain and checkpoint
 * ask tided; keygen writes CURVE key files locally (core/keyfile.h) and sends nothing.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/tidectl_int.h"
#include "core/clock.h"
#include "core/keyfile.h"

/* Fills the degrees of r left at 0 with the job's current ones (asks tided for its jobs). */
static int keep_degrees(settings_t *s, tide_proto_resize_t *r, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_JOBS);
    int rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_JOBS_REPLY, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    const tide_proto_jobs_reply_t *jr = &rep.u.jobs_reply;
    const tide_proto_job_row_t *row = NULL;
    for (uint32_t i = 0; i < jr->n_rows && row == NULL; i++)
        if (jr->rows[i].kind == TIDE_JOB_ONLINE && strcmp(jr->rows[i].name, r->job) == 0)
            row = &jr->rows[i];
    if (row == NULL || row->dp == 0) {
        fprintf(err,
                "tidectl resize: no running online job '%s' to take the degrees not given "
                "from (tidectl jobs lists them); give --dp, --tp and --pp\n",
                r->job);
        tide_msg_clear(&rep);
        return TIDECTL_EXIT_REFUSED;
    }
    r->dp = r->dp ? r->dp : row->dp;
    r->tp = r->tp ? r->tp : row->tp;
    r->pp = r->pp ? r->pp : row->pp;
    tide_msg_clear(&rep);
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_resize(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_RESIZE);
    tide_proto_resize_t *r = &req.u.resize;
    int rc = tidectl__copy_job(err, "resize", "JOB", argv[0], r->job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->dp == 0 && s->tp == 0 && s->pp == 0 && s->stages == NULL && s->micro == 0)
        return tidectl__usage_error(
            err, "resize",
            "give the new layout with --dp, --tp, --pp and/or --micro-batches "
            "(what is not given stays as it is)");
    r->micro_batches = (int)s->micro;
    r->dp = (int)s->dp;
    r->tp = (int)s->tp;
    r->pp = (int)s->pp;
    if (r->dp == 0 || r->tp == 0 || r->pp == 0) {
        rc = keep_degrees(s, r, err);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    }
    uint64_t n = (uint64_t)r->dp * (uint64_t)r->tp * (uint64_t)r->pp;
    if (n > TIDE_PROTO_WORKERS_MAX)
        return tidectl__usage_error(err, "resize", "dp*tp*pp = %llu is more than %u workers",
                                    (unsigned long long)n, TIDE_PROTO_WORKERS_MAX);
    r->dry_run = s->dry_run;
    r->tp_across_hosts = s->allow_tp_across_hosts;
    if (tide_proto_placement_parse(s->placement, &r->placement) != TIDE_OK)
        return tidectl__usage_error(err, "resize", "--placement %s", tide_last_error());
    if (s->stages) {
        if (tidectl_parse_stages(s->stages, &r->stage_start, &r->n_stages) != TIDE_OK)
            return tidectl__usage_error(err, "resize", "%s", tide_last_error());
        if (r->n_stages != (uint32_t)r->pp + 1) {
            rc = tidectl__usage_error(err, "resize", "--stages gives %u stages but --pp is %d",
                                      r->n_stages - 1, r->pp);
            tide_msg_clear(&req);
            return rc;
        }
    }
    rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_RESIZE_REPLY, err);
    tide_msg_clear(&req);
    if (rc == TIDECTL_EXIT_OK) {
        tidectl_print_resize(out, &rep.u.resize_reply, s->json);
        if (s->wait && !rep.u.resize_reply.dry_run) {
            fflush(out);
            rc = tidectl__wait_switch(s, rep.u.resize_reply.job, rep.u.resize_reply.layout.gen, out,
                                      err);
        }
        tide_msg_clear(&rep);
    }
    return rc;
}

/* Default offline job name: the command's base name plus time and pid, in the name charset. */
static void default_name(const char *cmd, char *dst, size_t len)
{
    const char *base = strrchr(cmd, '/');
    base = base ? base + 1 : cmd;
    char clean[48];
    size_t k = 0;
    for (const char *p = base; *p && k + 1 < sizeof clean; p++)
        clean[k++] = (isalnum((unsigned char)*p) || strchr("._-", *p)) ? *p : '_';
    clean[k] = '\0';
    snprintf(dst, len, "%s-%lld-%d", k ? clean : "job", (long long)(tide_wall_ms() / 1000),
             (int)getpid());
}

int tidectl__cmd_submit(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    if (!s->offline)
        return tidectl__usage_error(
            err, "submit",
            "only offline jobs are submitted: add --offline (online jobs start "
            "with mpirun and join tided themselves)");
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_SUBMIT);
    tide_proto_submit_t *m = &req.u.submit;
    if (s->plugin) {
        m->kind = TIDE_JOB_PLUGIN;
        int rc = tidectl__copy_job(err, "submit", "--plugin", s->plugin, m->plugin);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    } else {
        m->kind = TIDE_JOB_COMMAND;
        if (argc == 0)
            return tidectl__usage_error(
                err, "submit",
                "give the command after '--': tidectl submit --offline -- CMD ARGS...");
    }
    if ((uint32_t)argc > TIDE_PROTO_ARGV_MAX)
        return tidectl__usage_error(err, "submit", "%d arguments; at most %d", argc,
                                    TIDE_PROTO_ARGV_MAX);
    for (int i = 0; i < argc; i++)
        if (strlen(argv[i]) > TIDE_PROTO_ARG_MAX)
            return tidectl__usage_error(err, "submit", "argument %d is longer than %d bytes", i,
                                        TIDE_PROTO_ARG_MAX);
    if (s->name) {
        int rc = tidectl__copy_job(err, "submit", "--name", s->name, m->name);
        if (rc != TIDECTL_EXIT_OK)
            return rc;
    } else {
        default_name(argc ? argv[0] : s->plugin, m->name, sizeof m->name);
    }
    m->argv = argv; /* borrowed: req is not cleared */
    m->argc = (uint32_t)argc;
    m->priority = (int)s->priority;
    m->bubbles = s->bubbles;
    if (s->mem_cap && tidectl_parse_bytes(s->mem_cap, &m->mem_cap) != TIDE_OK)
        return tidectl__usage_error(err, "submit", "--mem-cap %s", tide_last_error());
    if (s->max_memory && tidectl_parse_bytes(s->max_memory, &m->max_memory) != TIDE_OK)
        return tidectl__usage_error(err, "submit", "--max-memory %s", tide_last_error());
    if (s->max_memory && m->max_memory < (1ull << 20))
        return tidectl__usage_error(err, "submit",
                                    "--max-memory %s is under 1 MiB: no program starts in that",
                                    s->max_memory);
    m->max_procs = (uint32_t)s->max_procs;
    if (s->plugin && (m->max_memory != 0 || m->max_procs != 0))
        return tidectl__usage_error(err, "submit",
                                    "--max-memory and --max-procs limit a command; a plugin runs "
                                    "inside the worker's own process");
    int rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_OK, err);
    if (rc == TIDECTL_EXIT_OK) {
        const char *name = rep.u.ok.job[0] ? rep.u.ok.job : m->name;
        if (s->json) {
            fputs("{\"job\":", out);
            tidectl_json_str(out, name);
            fputs(",\"message\":", out);
            tidectl_json_str(out, rep.u.ok.message);
            fputs("}\n", out);
        } else {
            char msg[TIDE_PROTO_TEXT_MAX + 2];
            fprintf(out, "submitted offline job %s%s%s\n", name, rep.u.ok.message[0] ? ": " : "",
                    tidectl__term_str(rep.u.ok.message, sizeof msg - 1, msg, sizeof msg));
        }
        tide_msg_clear(&rep);
    }
    return rc;
}

static int print_ok(settings_t *s, tide_msg_t *rep, FILE *out, const char *what)
{
    if (s->json) {
        fputs("{\"job\":", out);
        tidectl__json_str_or_null(out, rep->u.ok.job);
        fputs(",\"message\":", out);
        tidectl_json_str(out, rep->u.ok.message);
        fputs("}\n", out);
    } else {
        char msg[TIDE_PROTO_TEXT_MAX + 2];
        fprintf(out, "%s\n",
                rep->u.ok.message[0]
                    ? tidectl__term_str(rep->u.ok.message, sizeof msg - 1, msg, sizeof msg)
                    : what);
    }
    tide_msg_clear(rep);
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_cancel(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_CANCEL);
    int rc = tidectl__copy_job(err, "cancel", "JOB", argv[0], req.u.cancel.job);
    if (rc == TIDECTL_EXIT_OK)
        rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_OK, err);
    return rc == TIDECTL_EXIT_OK ? print_ok(s, &rep, out, "cancelled") : rc;
}

int tidectl__cmd_drain(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    char *end;
    errno = 0;
    long long w = strtoll(argv[0], &end, 10);
    if (*argv[0] == '\0' || *end != '\0' || errno != 0 || w < 0 || w > INT32_MAX)
        return tidectl__usage_error(
            err, "drain",
            "WORKER must be a worker id (the WORKER column of tidectl status), "
            "not '%s'",
            argv[0]);
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_DRAIN);
    req.u.drain.worker = (int32_t)w;
    int rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_OK, err);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    char job[TIDE_PROTO_NAME_MAX + 1];
    uint64_t gen = rep.u.ok.gen;
    snprintf(job, sizeof job, "%s", rep.u.ok.job);
    rc = print_ok(s, &rep, out, "draining");
    return rc == TIDECTL_EXIT_OK ? tidectl__wait_started(s, job, gen, out, err) : rc;
}

int tidectl__cmd_grow(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_GROW);
    int rc = tidectl__copy_job(err, "grow", "JOB", argv[0], req.u.grow.job);
    req.u.grow.nodes = (int)s->nodes;
    uint64_t since_id = 0; /* --wait: what happens after the request, not an earlier grow's end */
    if (rc == TIDECTL_EXIT_OK && s->wait)
        rc = tidectl__newest_event(s, &since_id, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_OK, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = print_ok(s, &rep, out, "growing");
    return rc == TIDECTL_EXIT_OK && s->wait
               ? tidectl__wait_grow(s, req.u.grow.job, since_id, out, err)
               : rc;
}

int tidectl__cmd_checkpoint(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    (void)argc;
    tide_msg_t req, rep;
    tide_msg_init(&req, TIDE_MSG_CHECKPOINT);
    int rc = tidectl__copy_job(err, "checkpoint", "JOB", argv[0], req.u.checkpoint.job);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->dir != NULL) {
        /* the workers resolve nothing: a relative root is this shell's, made absolute */
        char cwd[TIDE_PROTO_TEXT_MAX + 1] = "";
        if (s->dir[0] != '/' && getcwd(cwd, sizeof cwd) == NULL)
            return tidectl__usage_error(err, "checkpoint", "cannot make --dir %s absolute: %s",
                                        s->dir, strerror(errno));
        int len = snprintf(req.u.checkpoint.dir, sizeof req.u.checkpoint.dir, "%s%s%s", cwd,
                           cwd[0] ? "/" : "", s->dir);
        if (s->dir[0] == '\0' || len < 0 || (size_t)len >= sizeof req.u.checkpoint.dir)
            return tidectl__usage_error(err, "checkpoint", "--dir must be a path of 1 to %zu bytes",
                                        sizeof req.u.checkpoint.dir - 1);
    }
    rc = tidectl__call_once(s, &req, &rep, TIDE_MSG_OK, err);
    return rc == TIDECTL_EXIT_OK ? print_ok(s, &rep, out, "checkpoint requested") : rc;
}

/* Writes one key file through core/keyfile; returns an exit code with the reason on err. */
static int write_key(const char *path, const tide_keyfile *k, int secret, const char *comment,
                     int force, FILE *err)
{
    tide_status rc = tide_keyfile_write(path, k, secret, comment, secret ? 0600 : 0644, force);
    if (rc == TIDE_ERR_EXISTS) {
        fprintf(err, "tidectl keygen: %s exists; pass --force to replace it\n", path);
        return TIDECTL_EXIT_USAGE;
    }
    if (rc != TIDE_OK) {
        fprintf(err, "tidectl keygen: %s\n", tide_last_error());
        return TIDECTL_EXIT_LOCAL;
    }
    return TIDECTL_EXIT_OK;
}

int tidectl__cmd_keygen(settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    const char *dir = argv[0];
    const char *role = s->role;
    int is_server = strcmp(role, "server") == 0;
    tide_keyfile k;
    memset(&k, 0, sizeof k);
    if (!is_server && tide_key_role_parse(role, &k.role) != TIDE_OK)
        return tidectl__usage_error(
            err, "keygen", "--role must be admin, worker, reader or server, not '%s'", role);
    const char *name = is_server ? "server" : (s->name ? s->name : role);
    if (!is_server && strcmp(name, "server") == 0)
        return tidectl__usage_error(err, "keygen",
                                    "the name 'server' is reserved for --role server");
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-", *p))
            return tidectl__usage_error(
                err, "keygen", "--name '%s' may hold only letters, digits and . _ -", name);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(err, "tidectl keygen: cannot create %s: %s\n", dir, strerror(errno));
        return TIDECTL_EXIT_LOCAL;
    }
    if (zmq_curve_keypair(k.public_key, k.secret_key) != 0) {
        fprintf(err, "tidectl keygen: this libzmq cannot make CURVE keys: %s\n",
                zmq_strerror(zmq_errno()));
        return TIDECTL_EXIT_LOCAL;
    }
    char key_path[4096], pub_path[4096], key_note[256], pub_note[256];
    snprintf(key_path, sizeof key_path, "%s/%s.key", dir, name);
    snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name);
    if (is_server) {
        snprintf(key_note, sizeof key_note,
                 "tided's CURVE key pair: keep secret; tided --auth %s reads it", dir);
        snprintf(pub_note, sizeof pub_note,
                 "tided's public key: give it to clients (tidectl --server-key, TIDE_SERVER_KEY)");
    } else {
        snprintf(key_note, sizeof key_note,
                 "tide CURVE key pair '%s': keep secret (tidectl --key, TIDE_KEY)", name);
        snprintf(pub_note, sizeof pub_note,
                 "allowed key '%s' for tided --auth: copy into its directory", name);
    }
    struct stat sb;
    if (!s->force && (lstat(key_path, &sb) == 0 || lstat(pub_path, &sb) == 0)) {
        fprintf(err, "tidectl keygen: %s or %s exists; pass --force to replace them\n", key_path,
                pub_path);
        return TIDECTL_EXIT_USAGE;
    }
    int rc = write_key(key_path, &k, 1, key_note, s->force, err);
    if (rc == TIDECTL_EXIT_OK)
        rc = write_key(pub_path, &k, 0, pub_note, s->force, err);
    char pub[41];
    memcpy(pub, k.public_key, sizeof pub);
    memset(&k, 0, sizeof k);
    if (rc != TIDECTL_EXIT_OK)
        return rc;
    if (s->json) {
        fprintf(out, "{\"role\":\"%s\",\"name\":", role);
        tidectl_json_str(out, name);
        fputs(",\"key_file\":", out);
        tidectl_json_str(out, key_path);
        fputs(",\"pub_file\":", out);
        tidectl_json_str(out, pub_path);
        fprintf(out, ",\"public\":\"%s\"}\n", pub);
    } else {
        fprintf(out, "wrote %s (secret, mode 0600) and %s\npublic key %s\n", key_path, pub_path,
                pub);
        if (is_server)
            fprintf(out, "start tided --auth %s; clients pass --server-key %s\n", dir, pub_path);
        else
            fprintf(out, "%s.pub must be in tided's --auth directory; clients pass --key %s\n",
                    name, key_path);
    }
    return TIDECTL_EXIT_OK;
}
