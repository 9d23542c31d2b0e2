/*
 * TIDE_API marks the functions libtide exports. libtide.so is built with hidden
 * visibility (its own code and the static modules linked into it), so the shared
 * library's dynamic symbols are exactly the declarations of include/tide/ marked with
 * it: the public API, none of the runtime's internals. test_install checks that the
 * installed library exports every function these headers declare and nothing else.
 */
#ifndef TIDE_API_H
#define TIDE_API_H

#if defined(__GNUC__) || defined(__clang__)
#define TIDE_API __attribute__((visibility("default")))
#else
#define TIDE_API
#endif

#endif /* TIDE_API_H */
