/*
 * The version of this build, for --version and logs: PROJECT_VERSION from CMake, with
 * `git describe` of the source tree appended when it was built from a checkout
 * (cmake/TideVersion.cmake writes it at every build).
 */
#ifndef TIDE_CORE_VERSION_H
#define TIDE_CORE_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version text, e.g. "0.1.0" or "0.1.0+gcb24d61-dirty": static storage, any thread. */
const char *tide_build_version(void);

/* Prints the line "prog (tide) VERSION" to out, as --version does (help2man reads it).
   Any thread; out is not closed. */
void tide_version_print(FILE *out, const char *prog);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_CORE_VERSION_H */
