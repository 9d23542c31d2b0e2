/*
 * Random valid control-plane messages and records (tests/support/proto_sample.c), for the
 * proto property tests, the fuzzer's seed corpus (proto_corpus) and load generators. Test
 * support only: never linked into a library or program that ships.
 */
#ifndef TIDE_TESTS_SUPPORT_PROTO_SAMPLE_H
#define TIDE_TESTS_SUPPORT_PROTO_SAMPLE_H

#include <stdint.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Fills *out with a random valid message of `type` (every field set, arrays small,
 * values often at their limits), drawing from the xorshift state *rng (any nonzero
 * value; advanced). The message owns its arrays: tide_msg_clear it. TIDE_ERR_NOMEM on
 * allocation failure (out cleared); TIDE_ERR_INVALID for TIDE_MSG_NONE or an unknown
 * type. Any thread.
 */
tide_status tide_proto_sample(tide_msg_t *out, tide_msg_type_t type, uint64_t *rng);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TESTS_SUPPORT_PROTO_SAMPLE_H */
