/*
 * worker/join: connecting a pool launched later (a separate mpirun) to the processes of
 * a running job, at the switch of the generation that first places the job on it.
 *
 * The connected side (every live rank of the job's connected pools, tided's join_old)
 * accepts on a port its first rank opens; the joining pool (join_new) connects to it,
 * the port name relayed by tided; both merge the intercommunicator into one
 * communicator, whose processes then form the job's pool, still numbered by job rank
 * (tide_coll_pool_new_ranked). Open MPI needs both launches started with --ompi-server
 * for this.
 *
 * What Open MPI 4.1's runtime (ORTE) can connect decides two things here (see
 * survey_side). A launch whose ranks run on a host other than its mpirun's can be
 * connected only when tide-mpirun started it (worker/mpirun_uris.c): the join refuses
 * any other before a port is opened. And a daemon (mpirun, or an orted on another host)
 * learns another launch only when one of its own ranks takes part in accept/connect, so
 * on each side one rank per daemon accepts or connects, not only the first.
 *
 * MPI_Comm_accept and MPI_Comm_connect never return when the other side dies before
 * connecting (Open MPI 4.1 has no timeout for them), so the whole connection runs on a
 * thread of its own while the main thread waits with the switch's deadline and abort
 * flag. A connection that does not finish in time is abandoned: the thread is left
 * blocked (it holds only its own state, freed by whichever side finishes last) and the
 * job goes on with its old layout. That is why a join needs MPI_THREAD_MULTIPLE: the
 * main thread calls MPI again while the abandoned thread waits inside it.
 *
 * Workload: once per join; the connection itself takes milliseconds.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "worker/tide_int.h"

#define SUBSYS "worker"

/* How far a connection got: the first ranks paired (accept/connect and their merge
   done), both sides met (MPI_Intercomm_create done), all merged (MPI_Intercomm_merge
   done: the pool is being made over the merged processes). */
enum { PH_START, PH_PAIRED, PH_MET, PH_MERGED };

/* Shared by the main thread and the connecting thread; freed by the last to let go. */
typedef struct jconn {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int abandoned; /* the main thread gave up: the thread cleans up after itself */
    int done;      /* the thread finished (rc says how) */
    tide_status rc;
    char why[256];
    /* in */
    MPI_Comm parent; /* the pool's communicator (borrowed while not abandoned) */
    int *granks;     /* the side's ranks in parent */
    int n_group, tag;
    int accept; /* 1: the connected side (accepts, low half); 0: the joining pool */
    int root;   /* this process opens the port (accept side) */
    int32_t jrank, id, world;
    char port[MPI_MAX_PORT_NAME];
    int port_ready; /* accept root: opened; connect side: given by the main thread */
    int phase;      /* how far the thread got (PH_*), for the reason of an abandon */
    /* out */
    tide_coll_pool_t *pool;
    MPI_Comm end_comm;
    int32_t *ids; /* [world] coordinator ids, -1 where no process holds the job rank */
} jconn;

static void jc_release(jconn *j)
{
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last)
        return;
    tide_coll_pool_destroy(&j->pool);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && j->end_comm != MPI_COMM_NULL)
        MPI_Comm_free(&j->end_comm);
    tide_free(j->ids);
    tide_free(j->granks);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    tide_free(j);
}

/* The join's fault points (core/fault.h), inert unless a test hook is installed
   (tests/support/faults.c: TIDE_JOIN_FAULT=STAGE:R makes job rank R exit there).
   "connect": the joining pool's rank before its pool's first rank connects (the job's
   side waits in accept, holding nothing); "merge": a rank of either side once both
   sides have met in MPI_Intercomm_create, so that every other process is inside
   MPI_Intercomm_merge's context-id agreement when it dies: the window that can leave
   Open MPI state behind. */
static void join_fault(const jconn *j, const char *stage)
{
    tide__fault_point("join", stage, (long)j->jrank);
}

static void set_phase(jconn *j, int phase)
{
    pthread_mutex_lock(&j->mu);
    j->phase = phase;
    pthread_mutex_unlock(&j->mu);
}

static int mpi_fail(jconn *j, int err, const char *what)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, s, &len);
    pthread_mutex_lock(&j->mu);
    j->rc = TIDE_ERR_BACKEND;
    snprintf(j->why, sizeof j->why, "%s failed: %s", what, s);
    pthread_mutex_unlock(&j->mu);
    return -1;
}

/* The side's communicator (accept side: the job's ranks taking part; connect side: the
   joining pool) over the pool's. MPI_SUCCESS or an error with its reason in j. */
static int side_comm(jconn *j, MPI_Comm *side)
{
    MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    int err = MPI_Comm_group(j->parent, &pg);
    if (err == MPI_SUCCESS)
        err = MPI_Group_incl(pg, j->n_group, j->granks, &g);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_create_group(j->parent, g, j->tag, side);
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (pg != MPI_GROUP_NULL)
        MPI_Group_free(&pg);
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, "MPI_Comm_create_group of the join's side");
    MPI_Comm_set_errhandler(*side, MPI_ERRORS_RETURN);
    return 0;
}

/* ---- launches as Open MPI 4.1 can connect them ----------------------------------------
   When a process connects to another launch, its ORTE daemon (mpirun or an orted) looks
   that launch up in ompi-server: a record its mpirun published at start with the contact
   address of each of its nodes' daemons (orte/orted/pmix/pmix_server_register_fns.c).
   Open MPI 4.1 records that address only for mpirun itself, so every orted's is NULL, and
   the daemon that looks such a launch up crashes parsing it (orte_rml_base_parse_uris:
   strdup(NULL), pmix_server_dyn.c's _cnlk). tide-mpirun (worker/mpirun_uris.c) fills
   those addresses in and marks its launch (OMPI_TIDE_DAEMON_URIS=1 in every rank): such
   a launch connects whatever hosts it spans; any other only when all of its ranks run on
   mpirun's own host. Nor does a daemon serve a launch it has not looked up: the
   addresses MPI_Intercomm_create asks it for (the direct modex) wait forever, so a rank
   under every daemon of each side takes part in the accept or the connect. */

/* 1 when this process's launch was started by tide-mpirun: its record in ompi-server
   holds every daemon's address. */
static int launch_has_daemon_uris(void)
{
    const char *m = getenv("OMPI_TIDE_DAEMON_URIS");
    return m != NULL && strcmp(m, "1") == 0;
}

/* The ORTE daemon hosting this process ("JOB.VPID" of OMPI_MCA_orte_local_daemon_uri, set
   by mpirun for each rank; vpid 0 is mpirun itself); 0.0 outside ORTE, where nothing is
   known and nothing is refused. */
static void my_daemon(uint32_t *job, uint32_t *vpid)
{
    const char *u = getenv("OMPI_MCA_orte_local_daemon_uri");
    unsigned a = 0, b = 0;
    if (u == NULL || sscanf(u, "%u.%u", &a, &b) != 2)
        a = b = 0;
    *job = a;
    *vpid = b;
}

/* The daemon leaders of the gathered side (all: [n] of {refusal, daemon job, vpid}): the
   first side rank of each daemon, into ranks; their count. */
static int daemon_leaders(const uint32_t *all, int n, int *ranks)
{
    int k = 0;
    for (int c = 0; c < n; c++) {
        int first = 1;
        for (int d = 0; d < c && first; d++)
            first = all[3 * d + 1] != all[3 * c + 1] || all[3 * d + 2] != all[3 * c + 2];
        if (first)
            ranks[k++] = c;
    }
    return k;
}

/* The communicator of the k daemon leaders (side ranks) of side, into *out. */
static int leaders_comm(jconn *j, MPI_Comm side, const int *ranks, int k, MPI_Comm *out)
{
    MPI_Group sg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    int err = MPI_Comm_group(side, &sg);
    if (err == MPI_SUCCESS)
        err = MPI_Group_incl(sg, k, ranks, &g);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_create_group(side, g, j->tag, out);
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (sg != MPI_GROUP_NULL)
        MPI_Group_free(&sg);
    if (err == MPI_SUCCESS)
        MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return err;
}

/* Every rank of the side says which daemon hosts it (a collective over side: on the
   joining side it also makes sure the pool is whole before its first rank connects). A
   side with a rank under an orted of a launch not started by tide-mpirun is refused (-1,
   TIDE_ERR_ABORTED with the reason in j) before any port is opened or connected to, so
   no daemon ever looks it up. Otherwise *leaders is the communicator of the side's daemon
   leaders (MPI_COMM_NULL on other ranks; side rank 0, the first rank, leads its daemon). */
static int survey_side(jconn *j, MPI_Comm side, MPI_Comm *leaders)
{
    *leaders = MPI_COMM_NULL;
    int n = 0, me = 0;
    MPI_Comm_size(side, &n);
    MPI_Comm_rank(side, &me);
    uint32_t mine[3];
    my_daemon(&mine[1], &mine[2]);
    /* a rank under an orted of a launch whose record lacks the orteds' addresses */
    mine[0] = mine[2] == 0 || launch_has_daemon_uris() ? UINT32_MAX : (uint32_t)j->jrank;
    uint32_t *all = tide_malloc((size_t)n * sizeof mine);
    int *ranks = tide_malloc((size_t)n * sizeof *ranks);
    int err = MPI_SUCCESS, bad = -1, k = 0, lead = 0;
    if (all == NULL || ranks == NULL) {
        tide_free(all);
        tide_free(ranks);
        pthread_mutex_lock(&j->mu);
        j->rc = TIDE_ERR_NOMEM;
        snprintf(j->why, sizeof j->why, "out of memory surveying %d ranks", n);
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    err = MPI_Allgather(mine, 3, MPI_UINT32_T, all, 3, MPI_UINT32_T, side);
    for (int c = 0; err == MPI_SUCCESS && c < n; c++)
        if (all[3 * c] != UINT32_MAX && (bad < 0 || all[3 * c] < all[3 * bad]))
            bad = c;
    if (err == MPI_SUCCESS && bad < 0) {
        k = daemon_leaders(all, n, ranks);
        for (int c = 0; c < k; c++)
            lead |= ranks[c] == me;
        if (lead)
            err = leaders_comm(j, side, ranks, k, leaders);
    }
    uint32_t bad_rank = bad >= 0 ? all[3 * bad] : 0;
    tide_free(all);
    tide_free(ranks);
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, "surveying the join's side");
    if (bad < 0)
        return 0;
    /* aborted, as any join that could not be made: nothing moved, the old layout goes on */
    pthread_mutex_lock(&j->mu);
    j->rc = TIDE_ERR_ABORTED;
    snprintf(j->why, sizeof j->why,
             "job rank %u runs on another host than its launch's mpirun: Open MPI 4.1 "
             "cannot connect such a launch (no contact address for its orted daemons); "
             "start every launch of the job with tide-mpirun, or one mpirun per host",
             (unsigned)bad_rank);
    pthread_mutex_unlock(&j->mu);
    return -1;
}

/* The job's daemon leaders (leaders: the first rank leads) accept through the port the
   first rank opens, the joining pool's daemon leaders connect to it, and they merge into
   *pair (the job's leaders first, its first rank at 0; the joining pool's after them, its
   first rank first); *i1 is their intercommunicator. 0, or -1 with the reason in j
   (nothing left to free). */
static int pair_first(jconn *j, MPI_Comm leaders, MPI_Comm *i1, MPI_Comm *pair)
{
    int err;
    if (j->accept && !j->root) { /* another launch's leader: the port matters at the root only */
        char none[1] = "";
        err = MPI_Comm_accept(none, MPI_INFO_NULL, 0, leaders, i1);
    } else if (j->accept) {
        char port[MPI_MAX_PORT_NAME];
        err = MPI_Open_port(MPI_INFO_NULL, port);
        if (err != MPI_SUCCESS)
            return mpi_fail(j, err, "MPI_Open_port");
        pthread_mutex_lock(&j->mu);
        memcpy(j->port, port, sizeof port);
        j->port_ready = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        err = MPI_Comm_accept(port, MPI_INFO_NULL, 0, leaders, i1);
    } else if (!j->root) { /* another daemon's leader of the joining pool */
        char none[1] = "";
        err = MPI_Comm_connect(none, MPI_INFO_NULL, 0, leaders, i1);
    } else {
        pthread_mutex_lock(&j->mu);
        while (!j->port_ready && !j->abandoned)
            pthread_cond_wait(&j->cv, &j->mu);
        int go = !j->abandoned;
        pthread_mutex_unlock(&j->mu);
        if (!go) /* never connected: the other side's first rank waits alone */
            return -1;
        err = MPI_Comm_connect(j->port, MPI_INFO_NULL, 0, leaders, i1);
    }
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, j->accept ? "MPI_Comm_accept" : "MPI_Comm_connect");
    MPI_Comm_set_errhandler(*i1, MPI_ERRORS_RETURN);
    err = MPI_Intercomm_merge(*i1, j->accept ? 0 : 1, pair);
    if (err != MPI_SUCCESS) {
        MPI_Comm_free(i1);
        return mpi_fail(j, err, "MPI_Intercomm_merge of the first ranks");
    }
    set_phase(j, PH_PAIRED);
    return 0;
}

/* The job's pool over the merged processes (numbered by job rank, each process's rank and
   coordinator id gathered), and its job-end communicator: into j. */
static int make_pool(jconn *j, MPI_Comm merged)
{
    int n = 0;
    MPI_Comm_size(merged, &n);
    int32_t mine[2] = {j->jrank, j->id};
    int32_t *all = tide_malloc((size_t)n * sizeof mine);
    int *prank = tide_malloc((size_t)n * sizeof *prank);
    j->ids = tide_malloc((size_t)j->world * sizeof *j->ids);
    tide_status rc = TIDE_OK;
    int err = MPI_SUCCESS;
    if (all == NULL || prank == NULL || j->ids == NULL)
        rc = tide_errorf(TIDE_ERR_NOMEM, "out of memory after connecting %d processes", n);
    if (rc == TIDE_OK)
        err = MPI_Allgather(mine, 2, MPI_INT32_T, all, 2, MPI_INT32_T, merged);
    if (rc == TIDE_OK && err == MPI_SUCCESS) {
        for (int32_t r = 0; r < j->world; r++)
            j->ids[r] = -1;
        for (int c = 0; c < n; c++) {
            prank[c] = all[2 * c];
            if (prank[c] >= 0 && prank[c] < j->world)
                j->ids[prank[c]] = all[2 * c + 1];
        }
        rc = tide_coll_pool_new_ranked(&j->pool, merged, prank, j->world);
        if (rc == TIDE_OK && MPI_Comm_dup(merged, &j->end_comm) != MPI_SUCCESS)
            rc = tide_errorf(TIDE_ERR_BACKEND, "MPI_Comm_dup of the connected processes failed");
        if (rc == TIDE_OK)
            MPI_Comm_set_errhandler(j->end_comm, MPI_ERRORS_RETURN);
    }
    tide_free(all);
    tide_free(prank);
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, "MPI_Allgather over the connected processes");
    if (rc != TIDE_OK) {
        pthread_mutex_lock(&j->mu);
        j->rc = rc;
        snprintf(j->why, sizeof j->why, "%s", tide_last_error());
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    return 0;
}

/* The connection, on its own thread. Only one rank per daemon of each side (survey_side)
   meets through the port: the fewest that make every daemon learn the other launch. The
   others wait in MPI_Intercomm_create for their first rank, which holds nothing, while a
   rank waiting inside MPI_Comm_accept or MPI_Comm_connect holds that call's state until
   it returns. Then the two sides merge, and the job's pool is made over the merged
   processes. Once started it runs to the end, abandoned or not, so that no peer is left
   inside it; an abandoned result is freed by the last to let go. */
static int connect_run(jconn *j)
{
    MPI_Comm side = MPI_COMM_NULL, pair = MPI_COMM_NULL, inter = MPI_COMM_NULL;
    /* the first ranks' intercommunicator: freed (a local release, not MPI_Comm_disconnect,
       which would wait on the launches' whole connection) once both sides met; the
       launches stay connected through the merged communicator until a release (leave.c)
       drops it on both sides */
    MPI_Comm i1 = MPI_COMM_NULL;
    MPI_Comm merged = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    if (side_comm(j, &side) != 0)
        return -1;
    /* the joining pool is whole before its first rank connects (the survey is a collective
       over it): a rank of it that dies now leaves the job's side waiting only in accept
       (its leaders) and in the side's own collectives, which hold nothing the job needs */
    if (!j->accept)
        join_fault(j, "connect");
    if (survey_side(j, side, &leaders) != 0) {
        MPI_Comm_free(&side);
        return -1;
    }
    int paired = 0, nlead = 0;
    if (leaders != MPI_COMM_NULL) {
        MPI_Comm_size(leaders, &nlead);
        paired = pair_first(j, leaders, &i1, &pair) == 0 ? 1 : -1;
        MPI_Comm_free(&leaders);
    }
    if (paired < 0) {
        MPI_Comm_free(&side);
        return -1;
    }
    /* the leaders are paired: both sides meet (the other's first rank in pair: the job's
       at 0, the joining pool's right after the job's nlead leaders) */
    int err = MPI_Intercomm_create(side, 0, j->root ? pair : MPI_COMM_NULL, j->accept ? nlead : 0,
                                   j->tag + 2, &inter);
    if (pair != MPI_COMM_NULL)
        MPI_Comm_free(&pair);
    if (i1 != MPI_COMM_NULL)
        MPI_Comm_free(&i1);
    MPI_Comm_free(&side);
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, "MPI_Intercomm_create of the join");
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    set_phase(j, PH_MET);
    join_fault(j, "merge");
    err = MPI_Intercomm_merge(inter, j->accept ? 0 : 1, &merged);
    MPI_Comm_free(&inter);
    if (err != MPI_SUCCESS)
        return mpi_fail(j, err, "MPI_Intercomm_merge");
    MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    set_phase(j, PH_MERGED);
    int r = make_pool(j, merged);
    MPI_Comm_free(&merged);
    return r;
}

static void *connect_thread(void *arg)
{
    jconn *j = arg;
    int ok = connect_run(j) == 0;
    pthread_mutex_lock(&j->mu);
    if (ok)
        j->rc = TIDE_OK;
    else if (j->rc == TIDE_OK)
        j->rc = TIDE_ERR_ABORTED;
    j->done = 1;
    int abandoned = j->abandoned;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned && j->root && j->port_ready)
        MPI_Close_port(j->port);
    jc_release(j);
    return NULL;
}

/* Where the connection stood when it was abandoned; j->mu held. */
static const char *stage(const jconn *j)
{
    if (j->phase == PH_MERGED)
        return "making the pool over the merged processes; a peer never arrived";
    if (j->phase == PH_MET)
        return "inside MPI_Intercomm_merge: both sides had met, a peer never arrived";
    if (j->phase == PH_PAIRED)
        return "inside MPI_Intercomm_create: the first ranks had connected, a peer never arrived";
    if (!j->root)
        return j->accept ? "the job's ranks waited for their first rank to accept"
                         : "the pool's ranks waited for their first rank to connect";
    if (j->accept)
        return j->port_ready ? "accepting; the joining pool never connected"
                             : "before the port was opened";
    return j->port_ready ? "connecting; the job never accepted" : "no port came from tided";
}

static int find_rank(const int32_t *a, uint32_t n, int32_t r)
{
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == r)
            return (int)i;
    return -1;
}

static void send_port(tide_t *t, uint64_t gen, const char *port)
{
    tide_msg_t m;
    tide_msg_init(&m, TIDE_MSG_JOIN_PORT);
    m.u.join_port.worker = tide__ctl_worker_id(t->ctl);
    snprintf(m.u.join_port.job, sizeof m.u.join_port.job, "%s", t->job);
    m.u.join_port.gen = gen;
    snprintf(m.u.join_port.port, sizeof m.u.join_port.port, "%s", port);
    if (tide__ctl_send(t->ctl, &m) != TIDE_OK)
        TIDE_WARN(SUBSYS, "could not send the join's port to tided: %s", tide_last_error());
}

/* The shared state of this rank's side of jr's connection (refs: the caller's and the
   thread's). */
static tide_status jconn_new(tide_t *t, const tide__join_req *jr, jconn **out)
{
    int oi = find_rank(jr->old_ranks, jr->n_old, t->rank);
    int ni = find_rank(jr->new_ranks, jr->n_new, t->rank);
    if ((oi < 0) == (ni < 0))
        return tide_errorf(TIDE_ERR_PROTOCOL, "generation %llu's join lists job rank %d on %s side",
                           (unsigned long long)jr->gen, t->rank, oi < 0 ? "neither" : "either");
    const int32_t *side = oi >= 0 ? jr->old_ranks : jr->new_ranks;
    uint32_t n_side = oi >= 0 ? jr->n_old : jr->n_new;
    jconn *j = tide_calloc(1, sizeof *j);
    if (j != NULL)
        j->granks = tide_malloc((size_t)n_side * sizeof *j->granks);
    if (j == NULL || j->granks == NULL) {
        tide_free(j);
        return tide_errorf(TIDE_ERR_NOMEM, "out of memory connecting a pool");
    }
    for (uint32_t i = 0; i < n_side; i++) {
        j->granks[i] = tide_coll_pool_comm_rank(t->pool, side[i]);
        if (j->granks[i] < 0) {
            tide_free(j->granks);
            tide_free(j);
            return tide_errorf(TIDE_ERR_PROTOCOL,
                               "generation %llu's join names job rank %d, which this rank "
                               "cannot reach",
                               (unsigned long long)jr->gen, side[i]);
        }
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->rc = TIDE_OK;
    j->parent = tide_coll_pool_comm(t->pool);
    j->n_group = (int)n_side;
    j->tag = 2 * tide__gen_tag(jr->gen, 5) + 1;
    j->accept = oi >= 0;
    j->root = oi == 0 || ni == 0; /* each side's first rank meets the other's */
    j->jrank = t->rank;
    j->id = tide__ctl_worker_id(t->ctl);
    j->world = jr->world;
    j->end_comm = MPI_COMM_NULL;
    *out = j;
    return TIDE_OK;
}

/* 1 with the MPI port of generation gen's join (relayed by tided) in port, when it came
   among the replies; other replies, stale here, are dropped. */
static int port_came(tide_t *t, uint64_t gen, char *port, size_t len)
{
    int have = 0;
    tide_msg_t m;
    while (!have && tide__ctl_reply(t->ctl, &m, 0) == TIDE_OK) {
        if (m.type == TIDE_MSG_JOIN_PORT && m.u.join_port.gen == gen &&
            m.u.join_port.port[0] != '\0') {
            snprintf(port, len, "%s", m.u.join_port.port);
            have = 1;
        }
        tide_msg_clear(&m);
    }
    return have;
}

/* The main thread's half, j->mu held: relays the port both ways through tided, and waits
   for the thread to finish within the switch timeout or until tided aborts the switch
   (*cancel_p set; then the connection is abandoned). */
static tide_status wait_connected(tide_t *t, jconn *j, const tide__join_req *jr,
                                  const int *cancel_p, uint64_t t0)
{
    uint64_t deadline = t0 + (uint64_t)t->opts.switch_timeout_ms * 1000000ull;
    int sent = 0;
    for (;;) {
        if (j->done)
            return j->rc == TIDE_OK
                       ? TIDE_OK
                       : tide_errorf(j->rc, "connecting the pools of job %s: %s", t->job, j->why);
        char port[MPI_MAX_PORT_NAME];
        if (j->accept && j->root && j->port_ready && !sent) {
            memcpy(port, j->port, sizeof port);
            pthread_mutex_unlock(&j->mu);
            send_port(t, jr->gen, port); /* tided relays it to the joining pool */
            sent = 1;
            pthread_mutex_lock(&j->mu);
            continue;
        }
        if (!j->accept && !j->port_ready) {
            pthread_mutex_unlock(&j->mu);
            int have = port_came(t, jr->gen, port, sizeof port);
            pthread_mutex_lock(&j->mu);
            if (have) {
                memcpy(j->port, port, sizeof port);
                j->port_ready = 1;
                pthread_cond_broadcast(&j->cv);
            }
        }
        uint64_t now = tide_now_ns();
        int cancel = cancel_p != NULL && __atomic_load_n(cancel_p, __ATOMIC_RELAXED);
        if (now >= deadline || cancel) {
            j->abandoned = 1;
            pthread_cond_broadcast(&j->cv);
            return tide_errorf(cancel ? TIDE_ERR_ABORTED : TIDE_ERR_TIMEOUT,
                               "connecting the pools of job %s %s after %.0f ms (%s); the "
                               "connecting thread is left waiting inside MPI",
                               t->job, cancel ? "was aborted by tided" : "timed out",
                               (double)(now - t0) / 1e6, stage(j));
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
}

tide_status tide__join_connect(tide_t *t, const tide__join_req *jr, const int *cancel,
                               tide__join_result *out)
{
    memset(out, 0, sizeof *out);
    out->end_comm = MPI_COMM_NULL;
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return tide_errorf(TIDE_ERR_UNSUPPORTED,
                           "connecting pool ranks to job %s needs MPI_THREAD_MULTIPLE (this rank "
                           "initialised MPI with a lower level: use MPI_Init_thread with "
                           "MPI_THREAD_MULTIPLE in every pool of a job that grows)",
                           t->job);
    jconn *j = NULL;
    TIDE_CHECK(jconn_new(t, jr, &j));
    pthread_t th;
    if (pthread_create(&th, NULL, connect_thread, j) != 0) {
        j->refs = 1;
        jc_release(j);
        return tide_errorf(TIDE_ERR_IO, "could not start the thread that connects the pool");
    }
    pthread_detach(th);
    uint64_t t0 = tide_now_ns();
    pthread_mutex_lock(&j->mu);
    tide_status rc = wait_connected(t, j, jr, cancel, t0);
    if (rc == TIDE_OK) {
        out->pool = j->pool;
        out->end_comm = j->end_comm;
        out->ids = j->ids;
        j->pool = NULL;
        j->end_comm = MPI_COMM_NULL;
        j->ids = NULL;
    }
    pthread_mutex_unlock(&j->mu);
    jc_release(j);
    if (rc == TIDE_OK)
        TIDE_INFO(SUBSYS, "job rank %d: pools of job %s connected (%d job ranks) in %.1f ms",
                  t->rank, t->job, jr->world, (double)(tide_now_ns() - t0) / 1e6);
    return rc;
}
