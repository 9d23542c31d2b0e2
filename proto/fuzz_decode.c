/*
 * libFuzzer target for the proto decoder: any bytes in, never a crash, leak or
 * sanitizer report out. Whatever decodes must also be valid to encode, and the
 * encoding is canonical (decode -> encode -> decode -> encode gives the same
 * bytes twice), so a decoder that accepts something its own encoder refuses, or
 * that loses a field, stops the run. Every message type and every record (what tide
 * stores: a job's layout, pools, fit rules, checkpoints, command line; a checkpoint's
 * manifest and shard checksums) goes through it; a record must also read back through
 * the record calls, as the store and the checkpoint reader use them. Built only with
 * -DTIDE_FUZZ=ON and clang; run by scripts/fuzz.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A decoded record read again as the readers of records do: the same message. */
static void record_again(const uint8_t *data, size_t size, const tide_proto_buf_t *want)
{
    tide_msg_t r;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    tide_status rc = tide_proto_decode(data, size, &r);
    if (rc != TIDE_OK)
        abort();
    tide_msg_type_t type = r.type;
    tide_msg_clear(&r);
    if (tide_proto_decode_record(data, size, type, &r) != TIDE_OK)
        abort(); /* a record the wire decoder takes and the record reader does not */
    if (tide_proto_encode_record(&r, &b) != TIDE_OK || b.len != want->len ||
        memcmp(b.data, want->data, b.len) != 0)
        abort();
    tide_msg_clear(&r);
    tide_proto_buf_destroy(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tide_msg_t m, m2;
    tide_status rc = tide_proto_decode(data, size, &m);
    if (rc != TIDE_OK) {
        if (rc != TIDE_ERR_PROTOCOL && rc != TIDE_ERR_NOMEM)
            abort(); /* bad input must be a protocol error */
        if (m.type != TIDE_MSG_NONE)
            abort(); /* a refused message holds nothing */
        return 0;
    }
    tide_proto_buf_t b1, b2;
    tide_proto_buf_init(&b1);
    tide_proto_buf_init(&b2);
    if (tide_proto_encode(&m, &b1) != TIDE_OK)
        abort(); /* decode accepted what encode refuses */
    if (tide_proto_decode(b1.data, b1.len, &m2) != TIDE_OK)
        abort();
    if (tide_proto_encode(&m2, &b2) != TIDE_OK)
        abort();
    if (b1.len != b2.len || memcmp(b1.data, b2.data, b1.len) != 0)
        abort(); /* a field changed on the way through */
    if (tide_msg_type_role(m.type) == TIDE_ROLE_RECORD)
        record_again(data, size, &b1);
    tide_msg_clear(&m);
    tide_msg_clear(&m2);
    tide_proto_buf_destroy(&b1);
    tide_proto_buf_destroy(&b2);
    return 0;
}
