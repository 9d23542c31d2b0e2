/*
 * Writes the fuzzer's seed corpus: N valid encoded messages of every type
 * (tide_proto_sample), one file each, plus a libFuzzer dictionary of every map
 * key and enum string seen in them (msgpack-encoded, so mutations splice whole
 * keys). Usage: proto_corpus DIR [N] [DICT]. Built with -DTIDE_FUZZ=ON (scripts/fuzz.sh).
 */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "tests/support/proto_sample.h"

/* Appends every string inside o to dict once (a linear scan: the dictionary is small). */
static void collect(FILE *dict, char (*seen)[64], int *n_seen, const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_STR && o->via.str.size > 0 && o->via.str.size < 32) {
        char s[64];
        memcpy(s, o->via.str.ptr, o->via.str.size);
        s[o->via.str.size] = '\0';
        for (size_t i = 0; i < o->via.str.size; i++)
            if (s[i] < 'a' || s[i] > 'z')
                if (s[i] != '_')
                    return; /* keys and enum names only, not random text */
        for (int i = 0; i < *n_seen; i++)
            if (strcmp(seen[i], s) == 0)
                return;
        if (*n_seen >= 512)
            return;
        strcpy(seen[(*n_seen)++], s);
        fprintf(dict, "\"\\x%02x%s\"\n", 0xa0 | (unsigned)o->via.str.size, s);
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            collect(dict, seen, n_seen, &o->via.map.ptr[i].key);
            collect(dict, seen, n_seen, &o->via.map.ptr[i].val);
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++)
            collect(dict, seen, n_seen, &o->via.array.ptr[i]);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: proto_corpus DIR [N per type] [DICT]\n");
        return 2;
    }
    int per_type = argc > 2 ? atoi(argv[2]) : 10;
    FILE *dict = argc > 3 ? fopen(argv[3], "w") : NULL;
    static char seen[512][64];
    int n_seen = 0;
    uint64_t rng = 0x5eed;
    tide_proto_buf_t b;
    tide_proto_buf_init(&b);
    int written = 0;
    for (int t = TIDE_MSG_NONE + 1; t < TIDE_MSG__COUNT; t++) {
        for (int i = 0; i < per_type; i++) {
            tide_msg_t m;
            if (tide_proto_sample(&m, (tide_msg_type_t)t, &rng) != TIDE_OK ||
                tide_proto_encode(&m, &b) != TIDE_OK) {
                fprintf(stderr, "proto_corpus: %s: %s\n", tide_msg_type_name(t), tide_last_error());
                return 1;
            }
            tide_msg_clear(&m);
            char path[4096];
            snprintf(path, sizeof path, "%s/%s-%03d.msgpack", argv[1], tide_msg_type_name(t), i);
            FILE *f = fopen(path, "wb");
            if (f == NULL || fwrite(b.data, 1, b.len, f) != b.len || fclose(f) != 0) {
                perror(path);
                return 1;
            }
            written++;
            if (dict) {
                msgpack_unpacked u;
                msgpack_unpacked_init(&u);
                size_t off = 0;
                if (msgpack_unpack_next(&u, (const char *)b.data, b.len, &off) ==
                    MSGPACK_UNPACK_SUCCESS)
                    collect(dict, seen, &n_seen, &u.data);
                msgpack_unpacked_destroy(&u);
            }
        }
    }
    tide_proto_buf_destroy(&b);
    if (dict)
        fclose(dict);
    printf("proto_corpus: %d seed messages in %s, %d dictionary entries\n", written, argv[1],
           n_seen);
    return 0;
}
