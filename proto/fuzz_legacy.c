/*
 * libFuzzer target for the readers of tided's state schema 1 (proto_legacy.h), the text
 * codecs tided used before its records: the first byte picks the reader (layout, pool
 * list, fit rules, checkpoint list, command line), the rest is its input. Any bytes in,
 * never a crash, leak or sanitizer report out; a text a reader refuses leaves nothing, and
 * one it takes yields a record the record codec writes and reads back unchanged. Built
 * only with -DTIDE_FUZZ=ON and clang; run by scripts/fuzz.sh.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto_legacy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    char *text = malloc(size); /* the input after the selector, as the C string a column is */
    if (text == NULL)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    tide_msg_t m;
    tide_status rc;
    switch (data[0] % 5) {
    case 0:
        rc = tide_proto_legacy_layout(text, data[0], &m);
        break;
    case 1:
        rc = tide_proto_legacy_pools(text, (int32_t)(data[0] >> 3), &m);
        break;
    case 2:
        rc = tide_proto_legacy_fit(text, &m);
        break;
    case 3:
        rc = tide_proto_legacy_ckpts(text, &m);
        break;
    default:
        rc = tide_proto_legacy_argv(data + 1, size - 1, &m);
        break;
    }
    free(text);
    if (rc != TIDE_OK) {
        if ((rc != TIDE_ERR_PROTOCOL && rc != TIDE_ERR_NOMEM) || m.type != TIDE_MSG_NONE)
            abort(); /* bad stored text is a protocol error that leaves nothing */
        return 0;
    }
    tide_proto_buf_t b1, b2;
    tide_proto_buf_init(&b1);
    tide_proto_buf_init(&b2);
    tide_msg_t d;
    if (tide_proto_encode_record(&m, &b1) != TIDE_OK)
        abort(); /* a reader took what the record codec refuses */
    if (tide_proto_decode_record(b1.data, b1.len, m.type, &d) != TIDE_OK)
        abort();
    if (tide_proto_encode_record(&d, &b2) != TIDE_OK || b1.len != b2.len ||
        memcmp(b1.data, b2.data, b1.len) != 0)
        abort(); /* a field changed on the way through */
    tide_msg_clear(&m);
    tide_msg_clear(&d);
    tide_proto_buf_destroy(&b1);
    tide_proto_buf_destroy(&b2);
    return 0;
}
