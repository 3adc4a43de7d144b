/* safetensors.c — memory-mapped safetensors files (single or sharded) with full validation.
 *
 * Each file is opened read-only and mapped whole (MAP_PRIVATE, PROT_READ); the fd and the
 * mapping live in the handle until ks_st_close. The parsed JSON header of every file is kept
 * too: tensor names point into it. Tensors of all files go into one array plus an open-
 * addressing hash table of indices (FNV-1a), so ks_st_find is O(1) on average.
 *
 * Alignment: a tensor's data pointer is map + 8 + N + begin, and nothing in the format
 * forces it to be aligned for the dtype (writers usually pad to 8, but need not). Consumers
 * must memcpy the data or check ((uintptr_t)data % ks_dtype_size(dtype)) before casting.
 *
 * Dtypes other than F32/F16/BF16/I32/I64 are accepted as KS_DT_OTHER. Those whose element
 * size is known (BOOL, U8, I8, F8_*, I16, U16, U32, F64, U64) still get the shape/size
 * check; for unknown ones only the offsets are checked. */
#include "safetensors.h"
#include "json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_file {
    char *path;        /* as opened (for messages) */
    int fd;
    void *map;         /* the whole file, read-only */
    size_t size;
    ks_json *hdr;      /* parsed header; tensor names point into it */
} st_file;

struct ks_safetensors {
    st_file *files;
    size_t nfiles, fcap;
    ks_st_tensor *t;   /* all tensors of all files, in header order per file */
    size_t n, tcap;
    uint32_t *slots;   /* hash table: 0 = empty, else tensor index + 1; scap is a power of 2 */
    size_t scap;
};

/* ------------------------------------------------------------------ dtypes */

const char *ks_dtype_name(ks_dtype dt) {
    switch (dt) {
    case KS_DT_F32: return "F32";
    case KS_DT_F16: return "F16";
    case KS_DT_BF16: return "BF16";
    case KS_DT_I32: return "I32";
    case KS_DT_I64: return "I64";
    default: return "OTHER";
    }
}

size_t ks_dtype_size(ks_dtype dt) {
    switch (dt) {
    case KS_DT_F32: case KS_DT_I32: return 4;
    case KS_DT_F16: case KS_DT_BF16: return 2;
    case KS_DT_I64: return 8;
    default: return 0;
    }
}

/* Map a header dtype string; *esize = element size in bytes, 0 if unknown. */
static ks_dtype parse_dtype(const char *s, size_t *esize) {
    static const struct { const char *name; ks_dtype dt; size_t size; } tab[] = {
        {"F32", KS_DT_F32, 4}, {"F16", KS_DT_F16, 2}, {"BF16", KS_DT_BF16, 2},
        {"I32", KS_DT_I32, 4}, {"I64", KS_DT_I64, 8},
        {"BOOL", KS_DT_OTHER, 1}, {"U8", KS_DT_OTHER, 1}, {"I8", KS_DT_OTHER, 1},
        {"F8_E5M2", KS_DT_OTHER, 1}, {"F8_E4M3", KS_DT_OTHER, 1}, {"F8_E8M0", KS_DT_OTHER, 1},
        {"I16", KS_DT_OTHER, 2}, {"U16", KS_DT_OTHER, 2}, {"U32", KS_DT_OTHER, 4},
        {"F64", KS_DT_OTHER, 8}, {"U64", KS_DT_OTHER, 8},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(s, tab[i].name) == 0) { *esize = tab[i].size; return tab[i].dt; }
    *esize = 0;
    return KS_DT_OTHER;
}

/* -------------------------------------------------------------- hash table */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

/* Slot holding `name`, or the empty slot where it would go. */
static size_t find_slot(const ks_safetensors *st, const char *name) {
    size_t mask = st->scap - 1, i = (size_t)hash_name(name) & mask;
    while (st->slots[i] && strcmp(st->t[st->slots[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static ks_status grow_table(ks_safetensors *st) {
    size_t nc = st->scap ? st->scap * 2 : 64;
    uint32_t *old = st->slots;
    size_t oldcap = st->scap;
    st->slots = ks_calloc(nc, sizeof *st->slots);
    if (!st->slots) { st->slots = old; return KS_ERR_OOM; }
    st->scap = nc;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i]) st->slots[find_slot(st, st->t[old[i] - 1].name)] = old[i];
    free(old);
    return KS_OK;
}

/* Append *t and index it; a name already present is an error naming both files. */
static ks_status add_tensor(ks_safetensors *st, const ks_st_tensor *t) {
    if (st->n >= UINT32_MAX - 1) return ks_errorf(KS_ERR_FORMAT, "%s: too many tensors", t->file);
    if ((st->n + 1) * 2 > st->scap && grow_table(st)) return KS_ERR_OOM;
    size_t s = find_slot(st, t->name);
    if (st->slots[s]) {
        const ks_st_tensor *o = &st->t[st->slots[s] - 1];
        if (o->file == t->file) return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s appears twice in the header", t->file, t->name);
        return ks_errorf(KS_ERR_FORMAT, "tensor %s appears in two files: %s and %s", t->name, o->file, t->file);
    }
    if (st->n == st->tcap) {
        size_t nc = st->tcap ? st->tcap * 2 : 64;
        ks_st_tensor *a = ks_realloc(st->t, nc * sizeof *a);
        if (!a) return KS_ERR_OOM;
        st->t = a;
        st->tcap = nc;
    }
    st->t[st->n++] = *t;
    st->slots[s] = (uint32_t)st->n;
    return KS_OK;
}

/* ------------------------------------------------------------- one file */

/* Format a shape as "[a, b, c]" for messages. */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static int get_uint(const ks_json *v, int64_t *out) {
    if (!v || v->type != KS_JSON_NUMBER || !v->is_int || v->inum < 0) return -1;
    *out = v->inum;
    return 0;
}

/* Validate one header entry and build the tensor. */
static ks_status parse_entry(const st_file *f, const char *name, const ks_json *e, uint64_t hdr_len,
                             const unsigned char *base, uint64_t data_size, ks_st_tensor *t) {
    const char *path = f->path;
    if (e->type != KS_JSON_OBJECT)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: entry is not a JSON object", path, name);
    const ks_json *dt = ks_json_get(e, "dtype"), *sh = ks_json_get(e, "shape"), *off = ks_json_get(e, "data_offsets");
    if (!dt || dt->type != KS_JSON_STRING)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: missing or non-string \"dtype\"", path, name);
    if (!sh || sh->type != KS_JSON_ARRAY)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: missing or non-array \"shape\"", path, name);
    if (!off || off->type != KS_JSON_ARRAY)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: missing or non-array \"data_offsets\"", path, name);
    memset(t, 0, sizeof *t);
    t->name = name;
    t->file = path;
    size_t esize;
    t->dtype = parse_dtype(dt->str, &esize);
    if (sh->len > KS_ST_MAXDIM)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: shape has %zu dimensions (at most %d supported)", path, name,
                         sh->len, KS_ST_MAXDIM);
    t->ndim = (int)sh->len;
    uint64_t elems = 1;
    int overflow = 0;
    for (size_t i = 0; i < sh->len; i++) {
        if (get_uint(&sh->items[i], &t->shape[i]))
            return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: shape entry %zu is not a non-negative integer", path, name, i);
        if (__builtin_mul_overflow(elems, (uint64_t)t->shape[i], &elems)) overflow = 1;
    }
    int64_t b, en;
    if (off->len != 2 || get_uint(&off->items[0], &b) || get_uint(&off->items[1], &en))
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: data_offsets must be two non-negative integers [begin, end]",
                         path, name);
    if (b > en)
        return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: data_offsets [%lld, %lld] has begin after end", path, name,
                         (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return ks_errorf(KS_ERR_FORMAT,
                         "%s: tensor %s: data ends at byte %llu past the end of the file (size %zu; truncated?)", path,
                         name, (unsigned long long)(8 + hdr_len + (uint64_t)en), f->size);
    uint64_t have = (uint64_t)(en - b), need;
    if (esize) {
        char sbuf[256];
        if (overflow || __builtin_mul_overflow(elems, (uint64_t)esize, &need))
            return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: shape %s is too large (more than 2^64 bytes)", path, name,
                             shape_str(t->shape, t->ndim, sbuf, sizeof sbuf));
        if (need != have)
            return ks_errorf(KS_ERR_FORMAT, "%s: tensor %s: shape %s dtype %s needs %llu bytes but data_offsets give %llu",
                             path, name, shape_str(t->shape, t->ndim, sbuf, sizeof sbuf), dt->str,
                             (unsigned long long)need, (unsigned long long)have);
    }
    t->data = base + b;
    t->nbytes = (size_t)have;
    return KS_OK;
}

/* Map one file, validate its header and add its tensors to st. On failure st keeps what it
 * has (the caller closes it). */
static ks_status add_file(ks_safetensors *st, const char *path) {
    if (st->nfiles == st->fcap) {
        size_t nc = st->fcap ? st->fcap * 2 : 4;
        st_file *a = ks_realloc(st->files, nc * sizeof *a);
        if (!a) return KS_ERR_OOM;
        st->files = a;
        st->fcap = nc;
    }
    st_file *f = &st->files[st->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = ks_strdup(path);
    if (!f->path) return KS_ERR_OOM;
    st->nfiles++;

    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return ks_errorf(KS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return ks_errorf(KS_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return ks_errorf(KS_ERR_IO, "%s is not a regular file", path);
    f->size = (size_t)sb.st_size;
    if (f->size < 8)
        return ks_errorf(KS_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header (truncated?)", path,
                         f->size);
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (m == MAP_FAILED) return ks_errorf(KS_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    f->map = m;

    const unsigned char *p = m;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | p[i];
    if (n > f->size - 8)
        return ks_errorf(KS_ERR_FORMAT, "%s: header length %llu larger than the file (size %zu)", path,
                         (unsigned long long)n, f->size);
    f->hdr = ks_json_parse((const char *)p + 8, (size_t)n);
    if (!f->hdr) return ks_error_prefix(KS_ERR_FORMAT, "%s: JSON header", path);
    if (f->hdr->type != KS_JSON_OBJECT) return ks_errorf(KS_ERR_FORMAT, "%s: JSON header is not an object", path);

    const unsigned char *base = p + 8 + n;
    uint64_t data_size = f->size - 8 - n;
    const ks_json *h = f->hdr;
    for (size_t i = 0; i < h->len; i++) {
        const char *name = h->keys[i];
        if (h->key_lens[i] == 12 && memcmp(name, "__metadata__", 12) == 0) continue;
        if (strlen(name) != h->key_lens[i])
            return ks_errorf(KS_ERR_FORMAT, "%s: tensor name \"%s...\" contains a NUL byte", path, name);
        ks_st_tensor t;
        ks_status rc = parse_entry(f, name, &h->items[i], n, base, data_size, &t);
        if (rc) return rc;
        if ((rc = add_tensor(st, &t))) return rc;
    }
    return KS_OK;
}

/* -------------------------------------------------------------- open/close */

void ks_st_close(ks_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->nfiles; i++) {
        st_file *f = &st->files[i];
        if (f->map) munmap(f->map, f->size);
        if (f->fd >= 0) close(f->fd);
        ks_json_free(f->hdr);
        free(f->path);
    }
    free(st->files);
    free(st->t);
    free(st->slots);
    free(st);
}

ks_status ks_st_open_file(const char *path, ks_safetensors **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_st_open_file: NULL out");
    *out = NULL;
    if (!path) return ks_errorf(KS_ERR_ARG, "ks_st_open_file: NULL path");
    ks_safetensors *st = ks_calloc(1, sizeof *st);
    if (!st) return KS_ERR_OOM;
    ks_status rc = add_file(st, path);
    if (rc) { ks_st_close(st); return rc; }
    *out = st;
    return KS_OK;
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = ks_malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') s[o++] = '/';
    memcpy(s + o, name, b + 1);
    return s;
}

/* Open every shard an index names (each once) and check the weight_map against them. */
static ks_status open_index(ks_safetensors *st, const char *dir, const char *ipath) {
    char *text;
    size_t len;
    ks_status rc = ks_read_file(ipath, &text, &len);
    if (rc) return rc;
    ks_json *idx = ks_json_parse(text, len);
    free(text);
    if (!idx) return ks_error_prefix(KS_ERR_FORMAT, "%s", ipath);
    const char **shards = NULL;     /* distinct shard names (pointers into idx) */
    const char **shard_path = NULL; /* the path string of each opened shard (owned by st) */
    size_t ns = 0;
    const ks_json *wm = ks_json_get(idx, "weight_map");
    if (!wm || wm->type != KS_JSON_OBJECT) {
        rc = ks_errorf(KS_ERR_FORMAT, "%s: no \"weight_map\" object", ipath);
        goto done;
    }
    if (wm->len == 0) {
        rc = ks_errorf(KS_ERR_FORMAT, "%s: \"weight_map\" is empty", ipath);
        goto done;
    }
    shards = ks_malloc((wm->len + 1) * sizeof *shards);
    shard_path = ks_malloc((wm->len + 1) * sizeof *shard_path);
    if (!shards || !shard_path) { rc = KS_ERR_OOM; goto done; }
    size_t last = 0;
    for (size_t i = 0; i < wm->len; i++) {
        const ks_json *v = &wm->items[i];
        if (v->type != KS_JSON_STRING || v->len == 0 || strlen(v->str) != v->len) {
            rc = ks_errorf(KS_ERR_FORMAT, "%s: weight_map entry for %s is not a file name", ipath, wm->keys[i]);
            goto done;
        }
        if (ns && strcmp(shards[last], v->str) == 0) continue; /* usual case: same as previous */
        size_t j = 0;
        while (j < ns && strcmp(shards[j], v->str) != 0) j++;
        if (j == ns) shards[ns++] = v->str;
        last = j;
    }
    for (size_t j = 0; j < ns; j++) {
        char *sp = join(dir, shards[j]);
        if (!sp) { rc = KS_ERR_OOM; goto done; }
        rc = add_file(st, sp);
        free(sp);
        if (rc) { ks_error_prefix(rc, "shard %s named in %s", shards[j], ipath); goto done; }
        shard_path[j] = st->files[st->nfiles - 1].path;
    }
    for (size_t i = 0; i < wm->len; i++) {
        const char *name = wm->keys[i], *shard = wm->items[i].str;
        size_t j = 0;
        while (strcmp(shards[j], shard) != 0) j++;
        const ks_st_tensor *t = strlen(name) == wm->key_lens[i] ? ks_st_find(st, name) : NULL;
        if (!t) {
            rc = ks_errorf(KS_ERR_FORMAT, "%s: tensor %s is mapped to %s, which does not contain it", ipath, name, shard);
            goto done;
        }
        if (t->file != shard_path[j]) {
            rc = ks_errorf(KS_ERR_FORMAT, "%s: tensor %s is mapped to %s but found in %s", ipath, name, shard, t->file);
            goto done;
        }
    }
    rc = KS_OK;
done:
    free(shards);
    free(shard_path);
    ks_json_free(idx);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every *.safetensors file of dir, in name order. */
static ks_status open_all(ks_safetensors *st, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return ks_errorf(KS_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    ks_status rc = KS_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            char **a = ks_realloc(names, nc * sizeof *a);
            if (!a) { rc = KS_ERR_OOM; break; }
            names = a;
            cap = nc;
        }
        if (!(names[n] = ks_strdup(de->d_name))) { rc = KS_ERR_OOM; break; }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = ks_errorf(KS_ERR_IO, "%s: no model.safetensors.index.json, model.safetensors or *.safetensors file", dir);
    if (!rc) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++) {
        char *p = join(dir, names[i]);
        if (!p) { rc = KS_ERR_OOM; break; }
        rc = add_file(st, p);
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

ks_status ks_st_open_dir(const char *dir, ks_safetensors **out) {
    if (!out) return ks_errorf(KS_ERR_ARG, "ks_st_open_dir: NULL out");
    *out = NULL;
    if (!dir) return ks_errorf(KS_ERR_ARG, "ks_st_open_dir: NULL dir");
    ks_safetensors *st = ks_calloc(1, sizeof *st);
    if (!st) return KS_ERR_OOM;
    char *ipath = join(dir, "model.safetensors.index.json"), *single = join(dir, "model.safetensors");
    ks_status rc;
    if (!ipath || !single) rc = KS_ERR_OOM;
    else if (access(ipath, F_OK) == 0) rc = open_index(st, dir, ipath);
    else if (access(single, F_OK) == 0) rc = add_file(st, single);
    else rc = open_all(st, dir);
    free(ipath);
    free(single);
    if (rc) { ks_st_close(st); return rc; }
    *out = st;
    return KS_OK;
}

/* ------------------------------------------------------------------ lookup */

const ks_st_tensor *ks_st_find(const ks_safetensors *st, const char *name) {
    if (!st || !name || !st->scap) return NULL;
    size_t s = find_slot(st, name);
    return st->slots[s] ? &st->t[st->slots[s] - 1] : NULL;
}

size_t ks_st_count(const ks_safetensors *st) { return st ? st->n : 0; }

const ks_st_tensor *ks_st_at(const ks_safetensors *st, size_t i) {
    return st && i < st->n ? &st->t[i] : NULL;
}
