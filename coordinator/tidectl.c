/*
 * tidectl: the operator CLI for tided. One command per run: it connects a
 * ZeroMQ DEALER socket to tided (CURVE when --key is given), sends one proto
 * request, waits up to --timeout-ms for the reply and prints it as an aligned
 * table or, with --json, as one JSON document (events: one object per line).
 * `top` repeats status + jobs every --interval ms; `timeline` draws a job's
 * history; `keygen` writes CURVE key files locally (format in core/keyfile.h and
 * docs/operator.md, read by tided --auth).
 *
 * Exit codes (scripts rely on them): 0 ok; 1 refused by tided (its message
 * printed) or CURVE rejected; 2 bad usage, nothing sent; 3 cannot reach tided;
 * 4 timed out waiting for the reply; 5 keygen could not write its files.
 *
 * Workload: interactive use and scripts; a reply of a few thousand rows at most.
 * This file holds the command table and tidectl_main; the commands live in
 * tidectl_queries.c (read) and tidectl_actions.c (change), the socket in
 * tidectl_conn.c, text in tidectl_print.c and tidectl_parse.c (tidectl_int.h).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tidectl_int.h"
#include "core/log.h"
#include "core/opts.h"
#include "core/version.h"

#define OPT_END                                                                                    \
    {                                                                                              \
        NULL, NULL, 0, NULL, NULL, NULL, 0, 0                                                      \
    }

/* --wait and --wait-ms of a verb that starts a switch (what: which one) */
#define WAIT_OPTS(what)                                                                            \
    {"wait", NULL, TIDE_OPT_BOOL, V(wait), "0",                                                    \
     "block until " what " commits (print its downtime and bytes moved) or aborts (exit 6 with "  \
     "the reason)",                                                                                \
     0, 0},                                                                                        \
    {                                                                                              \
        "wait-ms", NULL, TIDE_OPT_INT, V(wait_ms), "600000", "give up waiting after this long", 1, \
            86400000                                                                               \
    }

typedef struct command {
    const char *name;
    const char *synopsis;
    const char *summary;
    tidectl__cmd_fn *run;
    int nargs_min, nargs_max; /* positional arguments after the command name */
    tide_opt opts[12];        /* command flags (value pointers patched per run) */
} command_t;

/* ---- command table and main ------------------------------------------------------------------ */

/* Flag value pointers are filled in per run (settings live on tidectl_main's stack). */
#define V(field) ((void *)offsetof(settings_t, field))

static const command_t commands[] = {
    {"status",
     "status [--all] [--job JOB] [-o wide] [--watch [--interval MS] [--count N]] [--json]",
     "table of GPUs: host, device, state, job, role, step, bubble %; -o wide adds each "
     "worker's pool, rank in it and process id",
     tidectl__cmd_status,
     0,
     0,
     {{"all", NULL, TIDE_OPT_BOOL, V(all), "0",
       "also list the workers that left (bye), until tided forgets them (--retention-ms)", 0, 0},
      {"job", NULL, TIDE_OPT_STRING, V(job), NULL,
       "only this job's workers: the ranks of its launches (online), the worker running it "
       "(offline)",
       0, 0},
      {"output", NULL, TIDE_OPT_STRING, V(output), NULL,
       "wide: also POOL, RANK (MPI rank in the pool) and PID, the process on HOST (-o wide)", 0,
       0},
      {"watch", NULL, TIDE_OPT_BOOL, V(watch), "0",
       "redraw every --interval ms until Ctrl-C (--json: one line per refresh)", 0, 0},
      {"interval", NULL, TIDE_OPT_INT, V(interval_ms), "1000", "with --watch: refresh period in ms",
       50, 3600000},
      {"count", NULL, TIDE_OPT_INT, V(count), "0",
       "with --watch: stop after N refreshes (0: until Ctrl-C)", 0, 1000000000},
      OPT_END}},
    {"jobs",
     "jobs [--json]",
     "table of online and offline jobs",
     tidectl__cmd_jobs,
     0,
     0,
     {OPT_END}},
    {"resize",
     "resize JOB [--dp N] [--tp N] [--pp N] [--micro-batches N] [--stages 0-11,12-23] "
     "[--dry-run] [--placement P] [--allow-tp-across-hosts] [--wait [--wait-ms MS]] (what is "
     "not given stays as it is)",
     "switch a running job to a new layout (or, with --dry-run, show the reshard plan)",
     tidectl__cmd_resize,
     1,
     1,
     {{"dp", NULL, TIDE_OPT_INT, V(dp), NULL, "data-parallel degree", 1, TIDE_PROTO_DEGREE_MAX},
      {"tp", NULL, TIDE_OPT_INT, V(tp), NULL, "tensor-parallel degree", 1, TIDE_PROTO_DEGREE_MAX},
      {"pp", NULL, TIDE_OPT_INT, V(pp), NULL, "pipeline stages", 1, TIDE_PROTO_DEGREE_MAX},
      {"micro-batches", NULL, TIDE_OPT_INT, V(micro), NULL,
       "micro-batches per step of each dp rank (a pipeline's schedule)", 1, TIDE_PROTO_MICRO_MAX},
      {"stages", NULL, TIDE_OPT_STRING, V(stages), NULL,
       "inclusive layer ranges per stage, e.g. 0-11,12-23 (default: the job's when pp stays, "
       "else an even split)",
       0, 0},
      {"dry-run", NULL, TIDE_OPT_BOOL, V(dry_run), "0",
       "plan only: print bytes to move, largest send, estimated time", 0, 0},
      {"placement", NULL, TIDE_OPT_STRING, V(placement), "optimal",
       "optimal (fewest bytes, TP groups inside a host) or default (plain rank order)", 0, 0},
      {"allow-tp-across-hosts", NULL, TIDE_OPT_BOOL, V(allow_tp_across_hosts), "0",
       "let a TP group span hosts (its collectives then cross the network); without it a "
       "layout whose TP groups do not fit inside hosts is refused",
       0, 0},
      WAIT_OPTS("the switch"),
      OPT_END}},
    {"bounds",
     "bounds JOB MIN MAX [--steps N] [--wait [--wait-ms MS]]",
     "let tided resize a running job by itself between MIN and MAX GPUs (its elastic policy: "
     "grows onto idle or joining GPUs, yields to higher priorities, regrows after failures); "
     "hands back a job an operator's resize held",
     tidectl__cmd_bounds,
     3,
     3,
     {{"steps", NULL, TIDE_OPT_INT, V(steps), "-1",
       "steps the job runs in all: a grow must save more than its downtime over the steps left "
       "(-1: as before, 0: unknown, no such check)",
       -1, 9223372036854775807LL},
      WAIT_OPTS("the switch the policy starts at once (none: nothing to wait for)"),
      OPT_END}},
    {"priority",
     "priority JOB P [--wait [--wait-ms MS]]",
     "a job's priority for the elastic policy, 0-100 (higher takes GPUs from lower)",
     tidectl__cmd_priority,
     2,
     2,
     {WAIT_OPTS("the switch the policy starts at once (none: nothing to wait for)"), OPT_END}},
    {"pin", "pin JOB", "the elastic policy never resizes the job", tidectl__cmd_pin, 1, 1,
     {OPT_END}},
    {"unpin", "unpin JOB [--wait [--wait-ms MS]]", "the elastic policy may resize the job again",
     tidectl__cmd_unpin, 1, 1,
     {WAIT_OPTS("the switch the policy starts at once (none: nothing to wait for)"), OPT_END}},
    {"submit",
     "submit --offline [--name N] [--priority P] [--mem-cap 16G] [--max-memory 4G] "
     "[--max-procs N] [--bubbles] [--plugin NAME] -- CMD ARGS...",
     "queue offline work for idle GPUs (a command, or a task plugin)",
     tidectl__cmd_submit,
     0,
     TIDE_PROTO_ARGV_MAX + 1,
     {{"offline", NULL, TIDE_OPT_BOOL, V(offline), "0", "required: the job is offline work", 0, 0},
      {"name", NULL, TIDE_OPT_STRING, V(name), NULL, "job name (default: CMD-TIME-PID)", 0, 0},
      {"priority", NULL, TIDE_OPT_INT, V(priority), "0", "higher runs first", -1000, 1000},
      {"mem-cap", NULL, TIDE_OPT_STRING, V(mem_cap), NULL, "device memory cap, e.g. 16G", 0, 0},
      {"max-memory", NULL, TIDE_OPT_STRING, V(max_memory), NULL,
       "host memory each attempt of the command may use, e.g. 512M, 4G (default: tided's "
       "--offline-max-memory)",
       0, 0},
      {"max-procs", NULL, TIDE_OPT_INT, V(max_procs), "0",
       "processes each attempt of the command may run (default: tided's --offline-max-procs)",
       0, TIDE_PROTO_PROCS_MAX},
      {"plugin", NULL, TIDE_OPT_STRING, V(plugin), NULL,
       "run the named task plugin instead of a command", 0, 0},
      {"bubbles", NULL, TIDE_OPT_BOOL, V(bubbles), "0",
       "may also run inside pipeline bubbles (plugins)", 0, 0},
      OPT_END}},
    {"cancel", "cancel JOB", "cancel a job", tidectl__cmd_cancel, 1, 1, {OPT_END}},
    {"drain",
     "drain WORKER [--wait [--wait-ms MS]]",
     "move work off a worker and give it no more",
     tidectl__cmd_drain,
     1,
     1,
     {WAIT_OPTS("the job's switch off the worker (none: nothing to wait for)"), OPT_END}},
    {"grow",
     "grow JOB --nodes N [--wait [--wait-ms MS]]",
     "ask tided's provider of nodes (tided --provider slurm) for N more nodes: the job's batch "
     "script is submitted again, and its pools join the job when Slurm starts them; tidectl "
     "events says when they are pending, start or are refused",
     tidectl__cmd_grow,
     1,
     1,
     {{"nodes", NULL, TIDE_OPT_INT, V(nodes), "1", "nodes to add", 1, 4096},
      WAIT_OPTS("the switch onto the new nodes (or the refusal or end of the allocation asked "
                "for)"),
      OPT_END}},
    {"checkpoint",
     "checkpoint JOB [--dir ROOT] [--json]",
     "have a running job save a checkpoint (asynchronously, at a step its ranks have not "
     "reached yet); tidectl events says checkpoint_saved when it is complete",
     tidectl__cmd_checkpoint,
     1,
     1,
     {{"dir", NULL, TIDE_OPT_STRING, V(dir), NULL,
       "root to save under, on the workers' file system (default: where the job's last "
       "checkpoint went)",
       0, 0},
      OPT_END}},
    {"events",
     "events [--job J] [--type KIND] [--since 10m] [--until T] [--tail N] [--follow] [--json]",
     "the event history, newest first (--json: one object per line, oldest first)",
     tidectl__cmd_events,
     0,
     0,
     {{"job", NULL, TIDE_OPT_STRING, V(job), NULL, "only this job's events", 0, 0},
      {"type", NULL, TIDE_OPT_STRING, V(type), NULL,
       "only events of this kind; * and ? match any text or character: 'resize*'", 0, 0},
      {"since", NULL, TIDE_OPT_STRING, V(since), NULL,
       "only events from then on: 10m, 2h, 1d, 2024-05-01 12:00, or epoch ms", 0, 0},
      {"until", NULL, TIDE_OPT_STRING, V(until), NULL,
       "only events before then (same forms as --since)", 0, 0},
      {"after", NULL, TIDE_OPT_INT, V(after), "0", "only events with a larger id", 0,
       9223372036854775807LL},
      {"tail", NULL, TIDE_OPT_INT, V(tail), "0", "the newest N events (default 100)", 0,
       TIDE_PROTO_EVENTS_MAX},
      {"limit", NULL, TIDE_OPT_INT, V(limit), "100", "the same as --tail", 1,
       TIDE_PROTO_EVENTS_MAX},
      {"follow", NULL, TIDE_OPT_BOOL, V(follow), "0",
       "then print new events as they come, oldest first, until interrupted", 0, 0},
      OPT_END}},
    {"timeline",
     "timeline JOB [-o FILE.svg|FILE.json] [--since T]",
     "a picture of a job's history: a row per GPU, its layouts, resizes, failures, "
     "checkpoints and the offline work on its GPUs (SVG)",
     tidectl__cmd_timeline,
     1,
     1,
     {{"output", NULL, TIDE_OPT_STRING, V(output), NULL,
       "write the SVG to this file (-o FILE; default: standard output); FILE.json: a "
       "Chrome trace of the same (Perfetto, chrome://tracing)",
       0, 0},
      {"since", NULL, TIDE_OPT_STRING, V(since), NULL,
       "only from then on: 10m, 2h, 1d, 2024-05-01 12:00, or epoch ms (default: all)", 0, 0},
      OPT_END}},
    {"logs",
     "logs JOB [--attempt N | --all] [--json]",
     "an offline command's output (stdout and stderr), by attempt: the latest by default",
     tidectl__cmd_logs,
     1,
     1,
     {{"attempt", NULL, TIDE_OPT_INT, V(attempt), "0", "this attempt (1 is the first run)", 0,
       UINT32_MAX},
      {"all", NULL, TIDE_OPT_BOOL, V(all), "0", "every attempt tided recorded (its last 100)", 0,
       0},
      OPT_END}},
    {"top",
     "top [--interval MS] [--count N] [--json]",
     "refreshing status and jobs view",
     tidectl__cmd_top,
     0,
     0,
     {{"interval", NULL, TIDE_OPT_INT, V(interval_ms), "1000", "refresh period in ms", 50, 3600000},
      {"count", NULL, TIDE_OPT_INT, V(count), "0", "stop after N refreshes (0: until Ctrl-C)", 0,
       1000000000},
      OPT_END}},
    {"keygen",
     "keygen DIR [--role admin|worker|reader|server] [--name NAME] [--force]",
     "write a CURVE key pair: DIR/NAME.key (secret) and DIR/NAME.pub",
     tidectl__cmd_keygen,
     1,
     1,
     {{"role", NULL, TIDE_OPT_STRING, V(role), "admin", "admin, worker or server", 0, 0},
      {"name", NULL, TIDE_OPT_STRING, V(name), NULL, "file name (default: the role)", 0, 0},
      {"force", NULL, TIDE_OPT_BOOL, V(force), "0", "replace existing files", 0, 0},
      OPT_END}},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const tide_opt global_opts[] = {
    {"endpoint", "TIDE_ENDPOINT", TIDE_OPT_STRING, V(endpoint), "tcp://127.0.0.1:5555",
     "tided's ZeroMQ endpoint", 0, 0},
    {"timeout-ms", "TIDE_TIMEOUT_MS", TIDE_OPT_INT, V(timeout_ms), "5000",
     "how long to wait for tided's reply", 1, 3600000},
    {"key", "TIDE_KEY", TIDE_OPT_STRING, V(key), NULL, "your CURVE key pair file (NAME.key)", 0, 0},
    {"server-key", "TIDE_SERVER_KEY", TIDE_OPT_STRING, V(server_key), NULL,
     "tided's public key: server.pub or its 40-character Z85 text", 0, 0},
    {"json", NULL, TIDE_OPT_BOOL, V(json), "0", "machine-readable output", 0, 0},
    {"log", "TIDE_LOG", TIDE_OPT_STRING, V(log), "warn", "log level: error, warn, info, debug", 0,
     0},
};
#define N_GLOBAL (sizeof global_opts / sizeof global_opts[0])

static void print_usage(FILE *f)
{
    fprintf(f, "usage: tidectl [--endpoint E] [--timeout-ms MS] [--key F --server-key F] [--json] "
               "COMMAND ...\n\ncommands:\n");
    int width = 0; /* names and summaries apart by two spaces at least (help2man reads them) */
    for (size_t i = 0; i < N_COMMANDS; i++)
        if ((int)strlen(commands[i].name) > width)
            width = (int)strlen(commands[i].name);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-*s  %s\n", width, commands[i].name, commands[i].summary);
    fprintf(f, "\nglobal options:\n");
    for (size_t i = 0; i < N_GLOBAL; i++) {
        char flag[40];
        snprintf(flag, sizeof flag, "--%s%s", global_opts[i].name,
                 global_opts[i].type == TIDE_OPT_BOOL ? "" : " V");
        fprintf(f, "  %-18s %s", flag, global_opts[i].help);
        if (global_opts[i].def)
            fprintf(f, " [default %s]", global_opts[i].def);
        if (global_opts[i].env)
            fprintf(f, " [env %s]", global_opts[i].env);
        fputc('\n', f);
    }
    fprintf(f, "\nexit codes: 0 ok; 1 refused by tided (message printed); 2 bad usage; "
               "3 cannot reach tided;\n            4 timed out waiting for the reply (or --wait for "
               "the switch); 5 keygen could not write its files;\n            6 --wait: the "
               "switch was aborted (reason printed)\n"
               "'tidectl COMMAND --help' shows a command's options; --version the version.\n");
}

/* Index of the command word: the first argument that is neither a flag nor a flag's value. */
static int find_command(int argc, char **argv, int *help)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = TIDE_OPTS_HELP;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            if (*help != TIDE_OPTS_HELP)
                *help = TIDE_OPTS_VERSION;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return i;
        if (strchr(a, '=') != NULL)
            continue;
        for (size_t g = 0; g < N_GLOBAL; g++)
            if (strcmp(a + 2, global_opts[g].name) == 0 && global_opts[g].type != TIDE_OPT_BOOL)
                i++; /* skip the value */
    }
    return -1;
}

int tidectl_main(int argc, char **argv, FILE *out, FILE *err)
{
    int help = 0;
    int ci = find_command(argc, argv, &help);
    if (ci < 0 && help == TIDE_OPTS_VERSION) {
        tide_version_print(out, "tidectl");
        return TIDECTL_EXIT_OK;
    }
    if (ci < 0) {
        print_usage(help ? out : err);
        return help ? TIDECTL_EXIT_OK : TIDECTL_EXIT_USAGE;
    }
    const command_t *cmd = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[ci], commands[i].name) == 0)
            cmd = &commands[i];
    if (cmd == NULL) {
        fprintf(err, "tidectl: unknown command '%s'; commands:", argv[ci]);
        for (size_t i = 0; i < N_COMMANDS; i++)
            fprintf(err, " %s", commands[i].name);
        fprintf(err, " (tidectl --help explains them)\n");
        return TIDECTL_EXIT_USAGE;
    }
    /* -o is --output's short form (the one short flag tidectl takes) */
    for (int i = ci + 1; i < argc; i++)
        if (strcmp(argv[i], "-o") == 0)
            argv[i] = (char *)"--output";
    /* one option table: global flags + this command's, value pointers into s */
    settings_t s;
    memset(&s, 0, sizeof s);
    tide_opt table[N_GLOBAL + 11 + 1];
    size_t n = 0;
    for (size_t i = 0; i < N_GLOBAL; i++)
        table[n++] = global_opts[i];
    for (size_t i = 0; i < 11 && cmd->opts[i].name; i++)
        table[n++] = cmd->opts[i];
    table[n] = (tide_opt)OPT_END;
    for (size_t i = 0; i < n; i++)
        table[i].value = (char *)&s + (size_t)table[i].value;
    int npos = 0;
    if (tide_opts_parse(table, argc, argv, &npos, &help) != TIDE_OK) {
        fprintf(err, "tidectl %s: %s\n", cmd->name, tide_last_error());
        return TIDECTL_EXIT_USAGE;
    }
    if (help == TIDE_OPTS_VERSION) {
        tide_version_print(out, "tidectl");
        return TIDECTL_EXIT_OK;
    }
    if (help) {
        char syn[256];
        snprintf(syn, sizeof syn, "%s", cmd->synopsis);
        fprintf(out, "%s\n\n", cmd->summary);
        tide_opts_usage(out, "tidectl", syn, table);
        return TIDECTL_EXIT_OK;
    }
    tide_log_level lvl;
    if (tide_log_parse_level(s.log, &lvl) != TIDE_OK) {
        fprintf(err, "tidectl: --log %s\n", tide_last_error());
        return TIDECTL_EXIT_USAGE;
    }
    tide_log_set_level(lvl);
    tide_opts_log("tidectl", table);
    /* positional: argv[1] is the command word, then its arguments */
    int nargs = npos - 1;
    char **args = argv + 2;
    if (nargs < cmd->nargs_min || nargs > cmd->nargs_max) {
        if (cmd->nargs_min == cmd->nargs_max && cmd->nargs_min == 0)
            return tidectl__usage_error(err, cmd->name, "takes no arguments, got '%s'", args[0]);
        return tidectl__usage_error(err, cmd->name, "usage: tidectl %s", cmd->synopsis);
    }
    int rc = cmd->run(&s, nargs, args, out, err);
    fflush(out);
    return rc;
}

#ifndef TIDECTL_NO_MAIN
int main(int argc, char **argv)
{
    return tidectl_main(argc, argv, stdout, stderr);
}
#endif
