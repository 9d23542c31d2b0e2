/*
 * worker/mpirun_uris: libtide-mpirun.so, loaded into Open MPI 4.1's mpirun by
 * tide-mpirun (LD_PRELOAD), so that a launch whose ranks span hosts can be connected to
 * a launch started later, and a job grows whatever its launches span.
 *
 * When mpirun starts a launch it publishes, in ompi-server, the record another launch's
 * daemon reads to connect to it: the contact address of the daemon of each node the
 * launch runs on (orte/orted/pmix/pmix_server_register_fns.c). Open MPI 4.1 takes that
 * address from the daemon object's rml_uri, which it sets for mpirun itself only: each
 * orted's is NULL although mpirun holds it (every orted reported it at start, stored
 * under PMIX_PROC_URI). The daemon of the other launch then crashes parsing the record
 * (orte_rml_base_parse_uris: strdup(NULL), pmix_server_dyn.c's _cnlk). This library
 * wraps orte_pmix_server_register_nspace, the function that builds and publishes the
 * record: in mpirun (the HNP), before the record is built, each daemon of the launch's
 * map whose rml_uri is NULL gets the address mpirun stored for it. Nothing else changes.
 *
 * It marks the launch for libtide: OMPI_TIDE_DAEMON_URIS=1 in mpirun's environment, which
 * mpirun passes to every rank (it forwards OMPI_*), so a rank under an orted knows its
 * launch can be connected (worker/join.c). It takes itself out of LD_PRELOAD, so the
 * ranks and everything else mpirun starts run without it.
 *
 * Built only against Open MPI 4.x's ORTE headers (libopenmpi-dev ships them). It
 * resolves Open MPI's symbols at run time, so a program that is not mpirun and loads it
 * anyway is not broken by it. Workload: once per launch and per connected launch.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/mca/pmix/pmix.h"
#include "orte/mca/rmaps/rmaps_types.h"
#include "orte/runtime/orte_globals.h"
#include "orte/util/proc_info.h"

#define MARK "OMPI_TIDE_DAEMON_URIS"
#define SELF "libtide-mpirun.so" /* how LD_PRELOAD names this library */

/* The wrapped function, as orte/orted/pmix/pmix_server.h declares it; exported, so that
   mpirun's calls to it (through libopen-rte's PLT) reach this one first. */
__attribute__((visibility("default"))) int orte_pmix_server_register_nspace(orte_job_t *jdata,
                                                                            bool force);

/* Removes every entry naming this library from LD_PRELOAD (a ':' or ' ' separated list),
   unsetting it when nothing is left. */
static void leave_preload(void)
{
    const char *pre = getenv("LD_PRELOAD");
    if (pre == NULL)
        return;
    char *out = malloc(strlen(pre) + 1);
    if (out == NULL)
        return;
    size_t n = 0;
    for (const char *p = pre; *p != '\0';) {
        size_t len = strcspn(p, ": ");
        if (len > 0 && memmem(p, len, SELF, strlen(SELF)) == NULL) {
            if (n > 0)
                out[n++] = ':';
            memcpy(out + n, p, len);
            n += len;
        }
        p += len;
        if (*p != '\0')
            p++;
    }
    out[n] = '\0';
    if (n == 0)
        unsetenv("LD_PRELOAD");
    else
        setenv("LD_PRELOAD", out, 1);
    free(out);
}

/* Loaded: out of LD_PRELOAD for what mpirun starts; the launch marked only where the
   function this library wraps exists (Open MPI 4.x's mpirun: its libraries are mapped
   before any constructor runs), so that libtide never takes a launch of another runtime
   for one whose record holds every daemon's address. */
__attribute__((constructor)) static void mpirun_uris_load(void)
{
    leave_preload();
    if (dlsym(RTLD_NEXT, "orte_pmix_server_register_nspace") != NULL)
        setenv(MARK, "1", 1);
}

/* Gives each daemon of jdata's map without a contact address the one mpirun stored for it.
   In mpirun only: other processes have no such store. */
static void fill_daemon_uris(orte_job_t *jdata)
{
    orte_proc_info_t *info = dlsym(RTLD_DEFAULT, "orte_process_info");
    opal_pmix_base_module_t *pmix = dlsym(RTLD_DEFAULT, "opal_pmix");
    if (info == NULL || pmix == NULL || pmix->get == NULL || !(info->proc_type & ORTE_PROC_HNP))
        return;
    if (jdata == NULL || jdata->map == NULL || jdata->map->nodes == NULL)
        return;
    opal_pointer_array_t *nodes = jdata->map->nodes;
    for (int i = 0; i < nodes->size; i++) {
        orte_node_t *node = nodes->addr[i];
        if (node == NULL || node->daemon == NULL || node->daemon->rml_uri != NULL)
            continue;
        opal_value_t *val = NULL;
        int rc = pmix->get(&node->daemon->name, OPAL_PMIX_PROC_URI, NULL, &val);
        if (rc == OPAL_SUCCESS && val != NULL && val->type == OPAL_STRING &&
            val->data.string != NULL)
            node->daemon->rml_uri = strdup(val->data.string); /* freed with the daemon */
        else
            fprintf(stderr,
                    "tide-mpirun: no contact address for the daemon of node %s: "
                    "a launch that joins this one later cannot connect to it\n",
                    node->name != NULL ? node->name : "?");
        /* val is left to mpirun's lifetime: releasing it needs Open MPI's object system,
           which this library does not link; one small value per daemon and launch */
    }
}

int orte_pmix_server_register_nspace(orte_job_t *jdata, bool force)
{
    static int (*real)(orte_job_t *, bool);
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "orte_pmix_server_register_nspace");
    if (real == NULL) {
        fprintf(stderr, "tide-mpirun: orte_pmix_server_register_nspace not found: "
                        "this library is for Open MPI 4.x's mpirun\n");
        return -1; /* ORTE_ERROR */
    }
    fill_daemon_uris(jdata);
    return real(jdata, force);
}
