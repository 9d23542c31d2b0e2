/*
 * mlp_state_diff: compares two whole-state files of train_mlp (--state-out), tensor by
 * tensor: the same tensors, integer ones (step, data cursor) equal, float ones within a
 * relative L2 tolerance. Prints one summary line; exit 0 when they match, 1 when not,
 * 2 on bad usage. For checking that a resized or recovered run ended where a run that
 * was never resized ends.
 *   mlp_state_diff A B [--rtol 1e-4]
 */
#include <stdio.h>

#include "core/error.h"
#include "core/opts.h"
#include "core/version.h"
#include "examples/mlp_statefile.h"

int main(int argc, char **argv)
{
    double rtol = 0.0;
    const tide_opt opts[] = {
        {"rtol", "TIDE_STATE_RTOL", TIDE_OPT_DOUBLE, &rtol, "0",
         "largest relative L2 difference of a float tensor (0: bit-identical)", 0, 0},
        {NULL, NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int help = 0, npos = 0;
    tide_status rc = tide_opts_parse(opts, argc, argv, &npos, &help);
    if (rc == TIDE_OK && !help && npos != 2)
        rc = tide_errorf(TIDE_ERR_INVALID, "expected two state files, got %d arguments", npos);
    if (rc == TIDE_OK && rtol < 0.0)
        rc = tide_errorf(TIDE_ERR_INVALID, "--rtol must be >= 0");
    if (rc == TIDE_OK && help == TIDE_OPTS_VERSION) {
        tide_version_print(stdout, "mlp_state_diff");
        return 0;
    }
    if (rc != TIDE_OK || help) {
        if (rc != TIDE_OK)
            fprintf(stderr, "mlp_state_diff: %s\n", tide_last_error());
        tide_opts_usage(rc != TIDE_OK ? stderr : stdout, "mlp_state_diff", "A B [--rtol X]", opts);
        return rc != TIDE_OK ? 2 : 0;
    }
    tide_mlp_state_diff d;
    rc = tide_mlp_state_compare(argv[1], argv[2], rtol, &d);
    if (rc != TIDE_OK && d.tensors == 0) {
        fprintf(stderr, "mlp_state_diff: %s\n", tide_last_error());
        return 1;
    }
    printf("state: %zu tensors, %zu bit-identical; worst relative L2 difference %.3g%s%s, "
           "largest element difference %.3g\n",
           d.tensors, d.identical, d.worst_rel, d.worst[0] ? " in " : "", d.worst, d.worst_abs);
    if (rc != TIDE_OK) {
        fprintf(stderr, "mlp_state_diff: %s\n", tide_last_error());
        return 1;
    }
    return 0;
}
