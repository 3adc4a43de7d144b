/* fuzz_safetensors.c — libFuzzer harness for safetensors checkpoints (core/safetensors.c):
 * single files, sharded folders with model.safetensors.index.json, and folders of loose
 * *.safetensors files.
 *
 * Input: byte 0 chooses the mode, the rest is cut at the separator line "\n--ks-file--\n":
 *   mode 0  one file: everything is x.safetensors, opened with ks_st_open_file;
 *   mode 1  a sharded folder: part 0 is model.safetensors.index.json, parts 1..N are the shards
 *           model-0000i-of-0000N.safetensors (the names the index of a real checkpoint uses),
 *           opened with ks_st_open_dir;
 *   mode 2  a folder without index: the parts are a.safetensors, b.safetensors, ...
 * The files are written to a private temp folder (the library maps files; it has no in-memory
 * entry). On success every tensor is looked up by name and its bytes are all read (a tensor
 * reaching past its file's mapping faults), and the dtype, shape and size must agree. Seeds:
 * tests/fuzz/corpus/safetensors (tiny checkpoints written by tests/fuzz/make_corpus.py with the
 * tensor names and index layout of the real fixtures in tests/fixtures/hf). */
#include "fuzz_util.h"
#include "safetensors.h"

#define SEP "\n--ks-file--\n"

static volatile unsigned g_sink;

static void check(const ks_safetensors *st) {
    size_t n = ks_st_count(st);
    for (size_t i = 0; i < n; i++) {
        const ks_st_tensor *t = ks_st_at(st, i);
        if (!t || !t->name || ks_st_find(st, t->name) == NULL) __builtin_trap();
        if (t->ndim < 0 || t->ndim > KS_ST_MAXDIM) __builtin_trap();
        size_t es = ks_dtype_size(t->dtype);
        if (es) { /* a known dtype: the size is the shape's product */
            unsigned __int128 want = es;
            for (int d = 0; d < t->ndim; d++) want *= (unsigned __int128)(t->shape[d] < 0 ? 0 : t->shape[d]);
            if (want != t->nbytes) __builtin_trap();
        }
        const unsigned char *p = t->data;
        for (size_t b = 0; b < t->nbytes; b++) g_sink += p[b];
        g_sink += (unsigned)strlen(ks_dtype_name(t->dtype)) + (unsigned)strlen(t->file);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *dir = fz_workdir();
    fz_clear(dir);
    int mode = data[0] % 3;
    const uint8_t *part[9];
    size_t len[9];
    int np = mode == 0 ? 1 : fz_split(data + 1, size - 1, SEP, part, len, 9);
    if (mode == 0) { part[0] = data + 1; len[0] = size - 1; }
    char name[128];
    ks_safetensors *st = NULL;
    ks_status rc;
    if (mode == 0) {
        fz_write(dir, "x.safetensors", part[0], len[0]);
        char path[700];
        snprintf(path, sizeof path, "%s/x.safetensors", dir);
        rc = ks_st_open_file(path, &st);
    } else {
        for (int i = 0; i < np; i++) {
            if (mode == 1 && i == 0) snprintf(name, sizeof name, "model.safetensors.index.json");
            else if (mode == 1) snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i, np - 1);
            else snprintf(name, sizeof name, "%c.safetensors", 'a' + i);
            fz_write(dir, name, part[i], len[i]);
        }
        rc = ks_st_open_dir(dir, &st);
    }
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "open: %s\n", rc ? ks_last_error() : "ok");
    if (rc == KS_OK) {
        if (!st) __builtin_trap();
        check(st);
        ks_st_close(st);
    } else if (st) __builtin_trap(); /* no half-open result on failure */
    ks_clear_error();
    return 0;
}
