/*
 * worker/sched: the launch's scheduler allocation and its leave signal (see sched.h).
 * The handler only counts the arrival (and chains to the program's own handler): the
 * control thread sends the message, so nothing in the handler allocates, locks or talks.
 */
#include "worker/sched.h"

#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

/* One process-wide catch, shared by the process's runtimes (a scheduler signals the
 * process): counted, so the last runtime to go puts the program's disposition back. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int caught;                /* the signal caught, 0: none (under lock) */
static int refs;                  /* runtimes catching it (under lock) */
static struct sigaction previous; /* the program's disposition before ours */
static atomic_uint arrivals;      /* times it arrived: each runtime compares with its own count */

/* Copies env var name into dst (size len) when set, printable and without spaces: 1. */
static int env_word(const char *name, char *dst, size_t len)
{
    const char *v = getenv(name);
    dst[0] = '\0';
    if (v == NULL || v[0] == '\0')
        return 0;
    size_t n = strlen(v);
    for (size_t i = 0; i < n; i++) {
        if (v[i] <= 0x20 || v[i] >= 0x7f) {
            TIDE_WARN("sched", "%s='%.40s' holds a space or an unprintable byte: not reported", name,
                      v);
            return 0;
        }
    }
    if (n >= len) {
        /* a hostlist of thousands of nodes: what fits, marked as cut */
        TIDE_WARN("sched", "%s is %zu bytes: reported cut to %zu", name, n, len - 1);
        memcpy(dst, v, len - 4);
        memcpy(dst + len - 4, "...", 4);
        return 1;
    }
    memcpy(dst, v, n + 1);
    return 1;
}

void tide__sched_alloc(tide_proto_alloc_t *out)
{
    memset(out, 0, sizeof *out);
    const char *id = getenv("SLURM_JOB_ID");
    if (id == NULL || id[0] == '\0')
        id = getenv("SLURM_JOBID");
    if (id == NULL || id[0] == '\0')
        return;
    size_t n = strlen(id);
    int ok = n <= TIDE_PROTO_ALLOC_ID_MAX && id[0] != '_';
    for (size_t i = 0; ok && i < n; i++)
        ok = (id[i] >= '0' && id[i] <= '9') || id[i] == '_';
    if (!ok) {
        TIDE_WARN("sched", "SLURM_JOB_ID='%.40s' is no Slurm job id: the launch is registered "
                           "without its allocation", id);
        return;
    }
    snprintf(out->sched, sizeof out->sched, "slurm");
    memcpy(out->id, id, n + 1);
    if (!env_word("SLURM_JOB_NODELIST", out->nodes, sizeof out->nodes))
        env_word("SLURM_NODELIST", out->nodes, sizeof out->nodes);
    if (!env_word("SLURMD_NODENAME", out->node, sizeof out->node) &&
        gethostname(out->node, sizeof out->node) != 0)
        out->node[0] = '\0';
    out->node[sizeof out->node - 1] = '\0';
    if (!env_word("SLURM_STEP_GPUS", out->gpus, sizeof out->gpus))
        env_word("SLURM_JOB_GPUS", out->gpus, sizeof out->gpus);
    env_word("SLURM_JOB_PARTITION", out->partition, sizeof out->partition);
    const char *r = getenv("SLURM_RESTART_COUNT");
    if (r != NULL && r[0] != '\0') {
        char *end;
        errno = 0;
        long v = strtol(r, &end, 10);
        if (*end == '\0' && errno == 0 && v >= 0 && v <= 0x7fffffffL)
            out->restarts = (int)v;
    }
}

tide_status tide__sched_signal_parse(const char *text, int *signo)
{
    static const struct {
        const char *name;
        int no;
    } ok[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}, {"URG", SIGURG}};
    *signo = 0;
    if (text == NULL || text[0] == '\0')
        return TIDE_OK;
    const char *name = strncasecmp(text, "SIG", 3) == 0 ? text + 3 : text;
    char *end;
    long no = strtol(text, &end, 10);
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (strcasecmp(name, ok[i].name) == 0 || (*end == '\0' && end != text && no == ok[i].no)) {
            *signo = ok[i].no;
            return TIDE_OK;
        }
    }
    return tide_errorf(TIDE_ERR_INVALID,
                       "TIDE_LEAVE_SIGNAL '%.40s': one of USR1, USR2, HUP, URG (the signal the "
                       "scheduler sends before it takes the node back; TERM and INT still end "
                       "the program)",
                       text);
}

static void on_signal(int signo, siginfo_t *info, void *uctx)
{
    int saved = errno;
    atomic_fetch_add(&arrivals, 1);
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != NULL)
        previous.sa_sigaction(signo, info, uctx);
    else if (!(previous.sa_flags & SA_SIGINFO) && previous.sa_handler != SIG_DFL &&
             previous.sa_handler != SIG_IGN && previous.sa_handler != NULL)
        previous.sa_handler(signo);
    errno = saved;
}

tide_status tide__sched_signal_catch(int signo, unsigned *seen)
{
    *seen = atomic_load(&arrivals);
    if (signo == 0)
        return TIDE_OK;
    tide_status rc = TIDE_OK;
    pthread_mutex_lock(&lock);
    if (refs > 0 && caught != signo) {
        rc = tide_errorf(TIDE_ERR_BUSY, "TIDE_LEAVE_SIGNAL %d: signal %d is caught already by "
                                        "another runtime of this process", signo, caught);
    } else if (refs > 0) {
        refs++;
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(signo, &sa, &previous) != 0) {
            rc = tide_errorf(TIDE_ERR_IO, "cannot catch signal %d: %s", signo, strerror(errno));
        } else {
            caught = signo;
            refs = 1;
            TIDE_INFO("sched", "signal %d asks this launch to leave its job", signo);
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int tide__sched_signal_take(unsigned *seen)
{
    unsigned a = atomic_load(&arrivals);
    if (a == *seen)
        return 0;
    *seen = a;
    return 1;
}

void tide__sched_signal_release(int signo)
{
    if (signo == 0)
        return;
    pthread_mutex_lock(&lock);
    if (refs > 0 && caught == signo && --refs == 0) {
        (void)sigaction(signo, &previous, NULL);
        caught = 0;
    }
    pthread_mutex_unlock(&lock);
}
