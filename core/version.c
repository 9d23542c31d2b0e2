/* The build's version text, generated into tide_build_version.h (cmake/TideVersion.cmake). */
#include "version.h"

#include "tide_build_version.h"

const char *tide_build_version(void)
{
    return TIDE_BUILD_VERSION;
}

void tide_version_print(FILE *out, const char *prog)
{
    fprintf(out, "%s (tide) %s\n", prog, TIDE_BUILD_VERSION);
}
