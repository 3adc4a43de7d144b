/* test_safetensors.c — core/safetensors.c: files written here into a temporary folder
 * (valid, sharded, and every kind of corruption), plus the stories260K checkpoint. */
#include "ktest.h"
#include "common.h"
#include "safetensors.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

static int mk_tmpdir(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/ks_st_test_XXXXXX");
    return mkdtemp(buf) ? 0 : -1;
}

/* Remove a flat folder of files made by a test. */
static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[1024];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    rmdir(dir);
}

static int write_raw(const char *dir, const char *name, const void *data, size_t len) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* A safetensors file: 8-byte LE header length, the header text (padded with `pad` spaces),
 * then `dlen` data bytes (0, 1, 2, ... mod 251 when data is NULL). The header length field
 * is `hlen_override` when non-zero. */
static int write_st(const char *dir, const char *name, const char *header, int pad, const void *data, size_t dlen,
                    uint64_t hlen_override) {
    size_t h = strlen(header) + (size_t)pad, total = 8 + h + dlen;
    unsigned char *buf = malloc(total);
    if (!buf) return -1;
    uint64_t n = hlen_override ? hlen_override : h;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, strlen(header));
    memset(buf + 8 + strlen(header), ' ', (size_t)pad);
    for (size_t i = 0; i < dlen; i++) buf[8 + h + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)(i % 251);
    int rc = write_raw(dir, name, buf, total);
    free(buf);
    return rc;
}

static ks_status open_in(const char *dir, const char *name, ks_safetensors **st) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return ks_st_open_file(p, st);
}

/* -------------------------------------------------------------- valid */

KT_TEST(st_valid_file) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    float f32[6] = {1.0f, -2.0f, 3.5f, 0.25f, 1e-3f, 42.0f};
    uint16_t bf[4] = {0x3f80, 0xc000, 0x4040, 0x0000};
    int64_t i64 = -123456789012345LL;
    unsigned char data[24 + 8 + 8 + 3 + 1];
    memcpy(data, f32, 24);
    memcpy(data + 24, bf, 8);
    memcpy(data + 32, &i64, 8);
    memcpy(data + 40, "\x01\x02\x03\x04", 4);
    const char *hdr = "{\"__metadata__\": {\"format\": \"pt\"},"
                      " \"w.f32\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
                      " \"w.bf16\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]},"
                      " \"scalar\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [32, 40]},"
                      " \"bytes\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [40, 43]},"
                      " \"fp4\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [43, 44]},"
                      " \"empty\": {\"dtype\": \"F16\", \"shape\": [0, 5], \"data_offsets\": [44, 44]}}";
    KT_CHECK(write_st(dir, "model.safetensors", hdr, 5, data, sizeof data, 0) == 0, "write");
    for (int how = 0; how < 2; how++) {
        ks_safetensors *st = NULL;
        ks_status rc = how ? ks_st_open_dir(dir, &st) : open_in(dir, "model.safetensors", &st);
        KT_CHECK(rc == KS_OK && st, "open (%s): %s", how ? "dir" : "file", ks_last_error());
        KT_CHECK(ks_st_count(st) == 6, "count %zu", ks_st_count(st));
        KT_CHECK(ks_st_find(st, "__metadata__") == NULL, "__metadata__ is skipped");
        const ks_st_tensor *t = ks_st_find(st, "w.f32");
        KT_CHECK(t && t->dtype == KS_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24,
                 "w.f32 metadata");
        float back[6];
        memcpy(back, t->data, 24);
        KT_CHECK(memcmp(back, f32, 24) == 0 && strstr(t->file, "model.safetensors") && !strcmp(t->name, "w.f32"),
                 "w.f32 data");
        t = ks_st_find(st, "w.bf16");
        uint16_t bb[4];
        KT_CHECK(t && t->dtype == KS_DT_BF16 && t->nbytes == 8, "bf16");
        memcpy(bb, t->data, 8);
        KT_CHECK(ks_bf16_to_f32(bb[1]) == -2.0f, "bf16 value");
        t = ks_st_find(st, "scalar");
        int64_t v;
        KT_CHECK(t && t->dtype == KS_DT_I64 && t->ndim == 0 && t->nbytes == 8, "scalar");
        memcpy(&v, t->data, 8);
        KT_CHECK(v == i64, "scalar value");
        t = ks_st_find(st, "bytes");
        KT_CHECK(t && t->dtype == KS_DT_OTHER && t->nbytes == 3 && ((const unsigned char *)t->data)[2] == 3, "U8 -> OTHER");
        t = ks_st_find(st, "fp4");
        KT_CHECK(t && t->dtype == KS_DT_OTHER && t->nbytes == 1, "unknown dtype accepted as OTHER");
        t = ks_st_find(st, "empty");
        KT_CHECK(t && t->dtype == KS_DT_F16 && t->nbytes == 0 && t->shape[0] == 0, "empty tensor");
        KT_CHECK(ks_st_find(st, "nope") == NULL && ks_st_find(st, "w.f3") == NULL, "absent names");
        KT_CHECK(ks_st_at(st, 0) && !strcmp(ks_st_at(st, 0)->name, "w.f32") && ks_st_at(st, 6) == NULL, "ks_st_at");
        ks_st_close(st);
    }
    KT_CHECK(!strcmp(ks_dtype_name(KS_DT_BF16), "BF16") && ks_dtype_size(KS_DT_BF16) == 2 &&
                 ks_dtype_size(KS_DT_I64) == 8 && ks_dtype_size(KS_DT_OTHER) == 0 &&
                 !strcmp(ks_dtype_name(KS_DT_OTHER), "OTHER"),
             "dtype helpers");
    ks_st_close(NULL);
    KT_CHECK(ks_st_find(NULL, "x") == NULL && ks_st_count(NULL) == 0, "NULL handle");
    rm_dir(dir);
}

KT_TEST(st_many_tensors) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    int n = 5000;
    char *hdr = malloc((size_t)n * 96 + 16);
    size_t o = 0;
    hdr[o++] = '{';
    for (int i = 0; i < n; i++)
        o += (size_t)sprintf(hdr + o, "%s\"layers.%d.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", i, 4 * i, 4 * i + 4);
    hdr[o++] = '}';
    hdr[o] = 0;
    int wrc = write_st(dir, "model.safetensors", hdr, 0, NULL, (size_t)n * 4, 0);
    free(hdr);
    KT_CHECK(wrc == 0, "write");
    ks_safetensors *st;
    KT_CHECK(ks_st_open_dir(dir, &st) == KS_OK, "%s", ks_last_error());
    int ok = ks_st_count(st) == (size_t)n;
    for (int i = 0; i < n && ok; i++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.w", i);
        const ks_st_tensor *t = ks_st_find(st, name);
        ok = t && !strcmp(t->name, name) && t == ks_st_at(st, (size_t)i);
    }
    ks_st_close(st);
    rm_dir(dir);
    KT_CHECK(ok, "every tensor found by name");
}

static const char *SHARD1 = "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                            " \"b\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [8, 12]}}";
static const char *SHARD2 = "{\"__metadata__\": {}, \"c\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]},"
                            " \"d\": {\"dtype\": \"F16\", \"shape\": [1, 1], \"data_offsets\": [6, 8]}}";
static const char *INDEX = "{\"metadata\": {\"total_size\": 20}, \"weight_map\": {\"a\": \"m-1.safetensors\","
                           " \"b\": \"m-1.safetensors\", \"c\": \"m-2.safetensors\", \"d\": \"m-2.safetensors\"}}";

static int write_sharded(const char *dir, const char *index) {
    return write_st(dir, "m-1.safetensors", SHARD1, 0, NULL, 12, 0) ||
           write_st(dir, "m-2.safetensors", SHARD2, 3, NULL, 8, 0) ||
           write_raw(dir, "model.safetensors.index.json", index, strlen(index));
}

KT_TEST(st_sharded) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    KT_CHECK(write_sharded(dir, INDEX) == 0, "write");
    /* an unrelated single file: the index takes precedence over it */
    KT_CHECK(write_st(dir, "model.safetensors", "{\"zz\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}",
                      0, NULL, 4, 0) == 0, "write");
    ks_safetensors *st;
    KT_CHECK(ks_st_open_dir(dir, &st) == KS_OK, "%s", ks_last_error());
    int ok = ks_st_count(st) == 4 && !ks_st_find(st, "zz");
    const char *names[] = {"a", "b", "c", "d"}, *files[] = {"m-1", "m-1", "m-2", "m-2"};
    for (int i = 0; i < 4 && ok; i++) {
        const ks_st_tensor *t = ks_st_find(st, names[i]);
        ok = t && strstr(t->file, files[i]) != NULL;
    }
    const ks_st_tensor *c = ks_st_find(st, "c");
    ok = ok && c && c->dtype == KS_DT_BF16 && c->nbytes == 6 && ((const unsigned char *)c->data)[5] == 5;
    ks_st_close(st);
    rm_dir(dir);
    KT_CHECK(ok, "sharded tensors");
}

KT_TEST(st_dir_fallbacks) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    ks_safetensors *st = (ks_safetensors *)1;
    ks_status rc = ks_st_open_dir(dir, &st);
    KT_CHECK(rc == KS_ERR_IO && st == NULL && strstr(ks_last_error(), "no model.safetensors.index.json"),
             "empty folder: %d %s", rc, ks_last_error());
    KT_CHECK(write_st(dir, "m-1.safetensors", SHARD1, 0, NULL, 12, 0) == 0 &&
                 write_st(dir, "m-2.safetensors", SHARD2, 0, NULL, 8, 0) == 0 && write_raw(dir, "notes.txt", "x", 1) == 0,
             "write");
    rc = ks_st_open_dir(dir, &st);
    KT_CHECK(rc == KS_OK, "glob: %s", ks_last_error());
    int ok = ks_st_count(st) == 4 && ks_st_find(st, "a") && ks_st_find(st, "d") &&
             strstr(ks_st_at(st, 0)->file, "m-1.safetensors");
    ks_st_close(st);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/missing", dir);
    rc = ks_st_open_dir(sub, &st);
    int missing_ok = rc == KS_ERR_IO && strstr(ks_last_error(), "cannot open directory");
    rm_dir(dir);
    KT_CHECK(ok, "all *.safetensors files loaded");
    KT_CHECK(missing_ok, "missing folder: %s", ks_last_error());
}

/* --------------------------------------------------------------- bad files */

KT_TEST(st_bad_files) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    const char *ok_entry = "\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}";
    char hdr[512];
    struct { const char *hdr; size_t dlen; uint64_t hlen; ks_status st; const char *msg; } cases[] = {
        {"{[}", 8, 0, KS_ERR_FORMAT, "JSON header: line 1, column 2"},
        {"{\"t\": 1", 8, 0, KS_ERR_FORMAT, "JSON header"},
        {"[1, 2]", 8, 0, KS_ERR_FORMAT, "header is not an object"},
        {"{\"t\": [1]}", 8, 0, KS_ERR_FORMAT, "tensor t: entry is not a JSON object"},
        {"{\"t\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT, "tensor t: missing or non-string \"dtype\""},
        {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT, "missing or non-array \"shape\""},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, 0, KS_ERR_FORMAT, "missing or non-array \"data_offsets\""},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT,
         "shape entry 0 is not a non-negative integer"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT,
         "shape entry 0 is not a non-negative integer"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,2], \"data_offsets\": [0, 8]}}", 8, 0,
         KS_ERR_FORMAT, "9 dimensions"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, 0, KS_ERR_FORMAT,
         "tensor t: data_offsets [8, 0] has begin after end"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 9]}}", 8, 0, KS_ERR_FORMAT,
         "data_offsets must be two non-negative integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-1, 7]}}", 8, 0, KS_ERR_FORMAT,
         "data_offsets must be two non-negative integers"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, 0, KS_ERR_FORMAT,
         "tensor t: data ends at byte 96 past the end of the file (size 88; truncated?)"},
        {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", 24, 0, KS_ERR_FORMAT,
         "tensor t: shape [2, 3] dtype BF16 needs 12 bytes but data_offsets give 24"},
        {"{\"t\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 4]}}", 8, 0, KS_ERR_FORMAT,
         "shape [3] dtype U8 needs 3 bytes but data_offsets give 4"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 8]}}", 8, 0,
         KS_ERR_FORMAT, "is too large"},
        {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT,
         "tensor t appears twice in the header"},
        {"{\"t\\u0000x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, 0, KS_ERR_FORMAT,
         "contains a NUL byte"},
        {NULL, 8, 1000, KS_ERR_FORMAT, "header length 1000 larger than the file (size 88)"},
        {NULL, 8, 0xFFFFFFFFFFFFFFFFull, KS_ERR_FORMAT, "header length 18446744073709551615 larger than the file"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].hdr) snprintf(hdr, sizeof hdr, "%s", cases[k].hdr);
        else snprintf(hdr, sizeof hdr, "{%s}", ok_entry);
        /* pad headers to a fixed 72 bytes so byte positions in messages are predictable */
        int pad = strlen(hdr) < 72 ? 72 - (int)strlen(hdr) : 0;
        KT_CHECK(write_st(dir, "bad.safetensors", hdr, pad, NULL, cases[k].dlen, cases[k].hlen) == 0, "write");
        ks_safetensors *st = (ks_safetensors *)1;
        ks_status rc = open_in(dir, "bad.safetensors", &st);
        KT_CHECK(rc == cases[k].st && st == NULL, "case %zu: status %d (%s)", k, rc, ks_last_error());
        KT_CHECK(strstr(ks_last_error(), cases[k].msg) && strstr(ks_last_error(), "bad.safetensors"),
                 "case %zu: error \"%s\" lacks \"%s\" or the file name", k, ks_last_error(), cases[k].msg);
    }
    /* files too short to hold the length field */
    for (size_t len = 0; len < 8; len++) {
        KT_CHECK(write_raw(dir, "short.safetensors", "\x10\0\0\0\0\0\0", len) == 0, "write");
        ks_safetensors *st;
        ks_status rc = open_in(dir, "short.safetensors", &st);
        KT_CHECK(rc == KS_ERR_FORMAT && strstr(ks_last_error(), "too short"), "%zu-byte file: %s", len, ks_last_error());
    }
    /* a valid file truncated in its data */
    snprintf(hdr, sizeof hdr, "{%s}", ok_entry);
    KT_CHECK(write_st(dir, "trunc.safetensors", hdr, 0, NULL, 5, 0) == 0, "write");
    ks_safetensors *st;
    ks_status rc = open_in(dir, "trunc.safetensors", &st);
    KT_CHECK(rc == KS_ERR_FORMAT && strstr(ks_last_error(), "past the end of the file") &&
                 strstr(ks_last_error(), "truncated?"),
             "truncated data: %s", ks_last_error());
    /* not there, not a file */
    rc = open_in(dir, "absent.safetensors", &st);
    KT_CHECK(rc == KS_ERR_IO && strstr(ks_last_error(), "cannot open") && strstr(ks_last_error(), "absent.safetensors"),
             "absent file: %s", ks_last_error());
    rc = ks_st_open_file(dir, &st);
    KT_CHECK(rc == KS_ERR_IO && strstr(ks_last_error(), "not a regular file"), "folder: %s", ks_last_error());
    KT_CHECK(ks_st_open_file(NULL, &st) == KS_ERR_ARG && ks_st_open_file("x", NULL) == KS_ERR_ARG, "NULL args");
    rm_dir(dir);
}

KT_TEST(st_bad_shards) {
    struct { const char *index; int drop_shard2; const char *extra_shard; ks_status st; const char *msg; } cases[] = {
        /* the index names a shard that is not there */
        {"{\"weight_map\": {\"a\": \"m-1.safetensors\", \"c\": \"m-3.safetensors\"}}", 0, NULL, KS_ERR_IO,
         "shard m-3.safetensors named in"},
        {NULL, 1, NULL, KS_ERR_IO, "cannot open"},
        /* a tensor in the index that its shard lacks */
        {"{\"weight_map\": {\"a\": \"m-1.safetensors\", \"zz\": \"m-2.safetensors\"}}", 0, NULL, KS_ERR_FORMAT,
         "tensor zz is mapped to m-2.safetensors, which does not contain it"},
        /* a tensor mapped to the wrong shard */
        {"{\"weight_map\": {\"a\": \"m-2.safetensors\", \"c\": \"m-1.safetensors\"}}", 0, NULL, KS_ERR_FORMAT,
         "tensor a is mapped to m-2.safetensors but found in"},
        /* the same tensor in two shards */
        {"{\"weight_map\": {\"a\": \"m-1.safetensors\", \"c\": \"m-2.safetensors\", \"x\": \"m-3.safetensors\"}}", 0,
         "{\"x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [4, 8]}}",
         KS_ERR_FORMAT, "tensor b appears in two files"},
        {"{\"weight_map\": [\"a\"]}", 0, NULL, KS_ERR_FORMAT, "no \"weight_map\" object"},
        {"{\"weight_map\": {}}", 0, NULL, KS_ERR_FORMAT, "\"weight_map\" is empty"},
        {"{\"weight_map\": {\"a\": 3}}", 0, NULL, KS_ERR_FORMAT, "weight_map entry for a is not a file name"},
        {"{\"weight_map\": {\"a\": \"m-1.safetensors\",}}", 0, NULL, KS_ERR_FORMAT,
         "model.safetensors.index.json: line 1, column 40: trailing comma"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[64];
        KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
        KT_CHECK(write_sharded(dir, cases[k].index ? cases[k].index : INDEX) == 0, "write");
        if (cases[k].drop_shard2) {
            char p[128];
            snprintf(p, sizeof p, "%s/m-2.safetensors", dir);
            unlink(p);
        }
        if (cases[k].extra_shard)
            KT_CHECK(write_st(dir, "m-3.safetensors", cases[k].extra_shard, 0, NULL, 8, 0) == 0, "write");
        ks_safetensors *st = (ks_safetensors *)1;
        ks_status rc = ks_st_open_dir(dir, &st);
        char err[2048];
        snprintf(err, sizeof err, "%s", ks_last_error());
        rm_dir(dir);
        KT_CHECK(rc == cases[k].st && st == NULL, "case %zu: status %d (%s)", k, rc, err);
        KT_CHECK(strstr(err, cases[k].msg), "case %zu: error \"%s\" lacks \"%s\"", k, err, cases[k].msg);
    }
}

/* Random corruption of a valid file: open must either succeed with in-bounds tensors or fail
 * with a message, never crash. */
KT_TEST(st_fuzz_headers) {
    char dir[64];
    KT_CHECK(mk_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    size_t hl = strlen(hdr), total = 8 + hl + 32;
    unsigned char *good = malloc(total), *buf = malloc(total);
    for (int i = 0; i < 8; i++) good[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(good + 8, hdr, hl);
    for (size_t i = 0; i < 32; i++) good[8 + hl + i] = (unsigned char)i;
    uint64_t rng = 12345;
    int opened = 0, failed = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(buf, good, total);
        size_t len = total;
        for (int m = 0; m < 3; m++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            size_t pos = (size_t)(rng >> 16) % len;
            if (rng % 7 == 0) len = pos < 1 ? 1 : pos;                       /* truncate */
            else if (rng % 3 == 0) buf[pos] = "0123456789[]{},\"-"[rng % 17];  /* JSON-ish */
            else buf[pos] = (unsigned char)(rng >> 40);
        }
        KT_CHECK(write_raw(dir, "f.safetensors", buf, len) == 0, "write");
        ks_safetensors *st;
        ks_clear_error();
        if (open_in(dir, "f.safetensors", &st) == KS_OK) {
            for (size_t i = 0; i < ks_st_count(st); i++) {
                const ks_st_tensor *t = ks_st_at(st, i);
                /* touch every byte: ASan/segfault would catch an out-of-bounds pointer */
                volatile unsigned s = 0;
                for (size_t b = 0; b < t->nbytes; b++) s += ((const unsigned char *)t->data)[b];
                (void)s;
            }
            ks_st_close(st);
            opened++;
        } else {
            KT_CHECK(ks_last_error()[0], "iteration %d: failure without a message", it);
            failed++;
        }
    }
    free(good);
    free(buf);
    rm_dir(dir);
    KT_CHECK(opened > 0 && failed > 0, "both outcomes expected (opened %d, failed %d)", opened, failed);
}

/* ------------------------------------------------------------ real model */

KT_TEST(st_stories260K) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/models/stories260K", kt_shared_dir());
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, R_OK) != 0) KT_SKIP("%s absent", path);
    ks_safetensors *st;
    KT_CHECK(ks_st_open_dir(dir, &st) == KS_OK, "%s", ks_last_error());
    const ks_st_tensor *t = ks_st_find(st, "model.embed_tokens.weight");
    int ok = t && t->dtype == KS_DT_F32 && t->ndim == 2 && t->shape[0] == 512 && t->shape[1] == 64 &&
             t->nbytes == 512 * 64 * 4;
    int finite = ok;
    for (size_t i = 0; ok && i < 512 * 64; i++) {
        float f;
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        if (!isfinite(f)) finite = 0;
    }
    const ks_st_tensor *n = ks_st_find(st, "model.layers.4.mlp.down_proj.weight");
    int down_ok = n && n->ndim == 2 && n->shape[0] == 64 && n->shape[1] == 172;
    size_t count = ks_st_count(st);
    ks_st_close(st);
    KT_CHECK(ok, "model.embed_tokens.weight must be F32 [512, 64]");
    KT_CHECK(finite, "embedding values are finite");
    KT_CHECK(down_ok, "layer 4 down_proj [64, 172]");
    KT_CHECK(count == 47, "47 tensors, found %zu", count);
}
