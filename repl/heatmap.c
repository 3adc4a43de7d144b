/* heatmap.c — PNG writer, NIAH heatmap renderer with a built-in bitmap font, terminal table.
 * See heatmap.h. */
#include "heatmap.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- errors and allocation
 * The message of this file's last failure on this thread (ks_heatmap_last_error): the CLI
 * layer keeps its own, as it uses only the library's public API. */
static _Thread_local char hm_err[1024];

const char *ks_heatmap_last_error(void) { return hm_err; }

static ks_status hm_errorf(ks_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ks_status hm_errorf(ks_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hm_err, sizeof hm_err, fmt, ap);
    va_end(ap);
    return st;
}

/* "PREFIX: the previous message" */
static ks_status hm_error_prefix(ks_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ks_status hm_error_prefix(ks_status st, const char *fmt, ...) {
    char old[sizeof hm_err], pre[512];
    memcpy(old, hm_err, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(hm_err, sizeof hm_err, "%s: %s", pre, old);
    return st;
}

static void *hm_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) hm_errorf(KS_ERR_OOM, "out of host memory (asked for %zu bytes)", n);
    return p;
}

static void *hm_realloc(void *q, size_t n) {
    void *p = realloc(q, n ? n : 1);
    if (!p) hm_errorf(KS_ERR_OOM, "out of host memory (asked for %zu bytes)", n);
    return p;
}

/* ===================================================================== checksums */

/* CRC-32 four bits at a time: table[n] = n shifted through the reflected polynomial 0xEDB88320. */
static const uint32_t crc_nib[16] = {
    0x00000000, 0x1DB71064, 0x3B6E20C8, 0x26D930AC, 0x76DC4190, 0x6B6B51F4, 0x4DB26158, 0x5005713C,
    0xEDB88320, 0xF00F9344, 0xD6D6A3E8, 0xCB61B38C, 0x9B64C2B0, 0x86D3D2D4, 0xA00AE278, 0xBDBDF21C,
};

uint32_t ks_crc32(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ crc_nib[crc & 15];
        crc = (crc >> 4) ^ crc_nib[crc & 15];
    }
    return ~crc;
}

uint32_t ks_adler32(uint32_t adler, const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t a = adler & 0xFFFF, b = adler >> 16;
    while (n) {
        size_t k = n < 5552 ? n : 5552; /* largest run before b can overflow 32 bits */
        n -= k;
        while (k--) { a += *p++; b += a; }
        a %= 65521;
        b %= 65521;
    }
    return (b << 16) | a;
}

/* ===================================================================== byte / bit output */

typedef struct obuf { uint8_t *p; size_t len, cap; int oom; } obuf;

static int ob_reserve(obuf *o, size_t extra) {
    if (o->oom) return -1;
    if (o->len + extra <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + extra) cap *= 2;
    uint8_t *p = hm_realloc(o->p, cap);
    if (!p) { o->oom = 1; return -1; }
    o->p = p;
    o->cap = cap;
    return 0;
}
static void ob_bytes(obuf *o, const void *src, size_t n) {
    if (ob_reserve(o, n)) return;
    memcpy(o->p + o->len, src, n);
    o->len += n;
}
static void ob_byte(obuf *o, uint8_t v) { ob_bytes(o, &v, 1); }
static void ob_be32(obuf *o, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    ob_bytes(o, b, 4);
}

/* deflate packs bits least-significant first */
typedef struct bitw { obuf o; uint64_t acc; int n; } bitw;

static void bw_bits(bitw *b, uint32_t v, int n) {
    b->acc |= (uint64_t)v << b->n;
    b->n += n;
    while (b->n >= 8) { ob_byte(&b->o, (uint8_t)b->acc); b->acc >>= 8; b->n -= 8; }
}
/* Huffman codes are defined most-significant bit first: reverse before packing. */
static void bw_code(bitw *b, uint32_t code, int n) {
    uint32_t r = 0;
    for (int i = 0; i < n; i++) r |= ((code >> i) & 1u) << (n - 1 - i);
    bw_bits(b, r, n);
}
static void bw_align(bitw *b) {
    if (b->n) { ob_byte(&b->o, (uint8_t)b->acc); b->acc = 0; b->n = 0; }
}

/* ===================================================================== deflate (fixed Huffman) */

static const uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                       193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* The fixed literal/length code of RFC 1951 3.2.6. */
static void fixed_code(int sym, uint32_t *code, int *len) {
    if (sym < 144) { *code = 0x30 + (uint32_t)sym; *len = 8; }
    else if (sym < 256) { *code = 0x190 + (uint32_t)(sym - 144); *len = 9; }
    else if (sym < 280) { *code = (uint32_t)(sym - 256); *len = 7; }
    else { *code = 0xC0 + (uint32_t)(sym - 280); *len = 8; }
}
static int len_index(int len) { int i = 28; while (len_base[i] > len) i--; return i; }
static int dist_index(int d) { int i = 29; while (dist_base[i] > d) i--; return i; }
static int lit_bits(uint8_t v) { return v < 144 ? 8 : 9; }
static int match_bits(int len, int dist) {
    int li = len_index(len), di = dist_index(dist);
    return (li + 257 < 280 ? 7 : 8) + len_extra[li] + 5 + dist_extra[di];
}

typedef struct tok { uint16_t len, val; } tok; /* len 0: literal byte val; else a match of len at distance val */

#define DEFL_BLOCK 65535 /* input bytes per block: one stored block's worth */
#define DEFL_WINDOW 32768
#define HASH_BITS 15
#define CHAIN_DEPTH 48 /* earlier positions with the same hash tried per match search */

static uint32_t hash3(const uint8_t *p) {
    uint32_t x = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
    return (x * 2654435761u) >> (32 - HASH_BITS);
}

/* The match finder: head[hash] is the latest position with that 3-byte hash, prev[pos % window]
 * the one before it (a chain of earlier occurrences). */
typedef struct lz { const uint8_t *d; size_t n; int32_t *head, *prev; size_t bpp, stride; } lz;

static void lz_insert(lz *z, size_t i) {
    if (i + 2 >= z->n) return;
    uint32_t h = hash3(z->d + i);
    z->prev[i & (DEFL_WINDOW - 1)] = z->head[h];
    z->head[h] = (int32_t)i;
}

static void lz_try(const lz *z, size_t i, size_t dist, size_t maxlen, int *best, int *bd) {
    if (dist == 0 || dist > i || dist > DEFL_WINDOW || (size_t)*best >= maxlen) return;
    const uint8_t *a = z->d + i, *r = a - dist;
    if (*best && a[*best] != r[*best]) return; /* cannot beat the best so far */
    size_t L = 0;
    while (L < maxlen && a[L] == r[L]) L++;
    if ((int)L > *best || ((int)L == *best && (int)dist < *bd)) { *best = (int)L; *bd = (int)dist; }
}

/* Longest match at i (not yet inserted) within [i, end): the previous byte, pixel and row first
 * (flat colour, repeated rows), then the hash chain. Returns its length (0 if < 3), *dist its distance. */
static int lz_match(const lz *z, size_t i, size_t end, int *dist) {
    size_t maxlen = end - i < 258 ? end - i : 258;
    int best = 0, bd = 0;
    if (maxlen < 3) return 0;
    lz_try(z, i, 1, maxlen, &best, &bd);
    lz_try(z, i, z->bpp, maxlen, &best, &bd);
    lz_try(z, i, z->stride, maxlen, &best, &bd);
    if (i + 2 < z->n) {
        int32_t p = z->head[hash3(z->d + i)];
        for (int depth = 0; p >= 0 && depth < CHAIN_DEPTH && (size_t)best < maxlen; depth++) {
            size_t dst = i - (size_t)p;
            if (dst > DEFL_WINDOW) break;
            lz_try(z, i, dst, maxlen, &best, &bd);
            int32_t q = z->prev[(size_t)p & (DEFL_WINDOW - 1)];
            if (q >= p) break; /* a slot reused by a newer position: the chain ends */
            p = q;
        }
    }
    *dist = bd;
    return best >= 3 ? best : 0;
}

/* Deflate d[0..n) into b: LZ77 with one-step lazy matching, each block written with the fixed
 * Huffman codes, or stored when that is smaller (noise). bpp/stride: bytes per pixel and per
 * filtered row, tried first as match distances. */
static ks_status deflate_fixed(bitw *b, const uint8_t *d, size_t n, int bpp, int stride) {
    lz z = {d, n, hm_malloc(sizeof(int32_t) << HASH_BITS), hm_malloc(sizeof(int32_t) * DEFL_WINDOW),
            (size_t)bpp, (size_t)stride};
    tok *t = hm_malloc(sizeof(tok) * DEFL_BLOCK);
    if (!z.head || !z.prev || !t) { free(z.head); free(z.prev); free(t); return KS_ERR_OOM; }
    for (size_t i = 0; i < (size_t)1 << HASH_BITS; i++) z.head[i] = -1;
    for (size_t i = 0; i < DEFL_WINDOW; i++) z.prev[i] = -1;
    size_t start = 0;
    do {
        size_t end = n - start < DEFL_BLOCK ? n : start + DEFL_BLOCK;
        int final = end == n;
        size_t nt = 0, bits = 3 + 7; /* block header + end-of-block */
        size_t i = start;
        while (i < end) {
            int bd = 0, best = lz_match(&z, i, end, &bd);
            lz_insert(&z, i);
            if (best && best < 64 && i + 1 < end) {
                int d2;
                if (lz_match(&z, i + 1, end, &d2) > best) best = 0; /* a longer one starts next: literal now */
            }
            if (best) {
                int lb = 0;
                for (int k = 0; k < best; k++) lb += lit_bits(d[i + k]);
                int mb = match_bits(best, bd);
                if (mb < lb) {
                    t[nt].len = (uint16_t)best;
                    t[nt++].val = (uint16_t)bd;
                    bits += (size_t)mb;
                    for (int k = 1; k < best; k++) lz_insert(&z, i + k);
                    i += (size_t)best;
                    continue;
                }
            }
            t[nt].len = 0;
            t[nt++].val = d[i];
            bits += (size_t)lit_bits(d[i]);
            i++;
        }
        size_t pad = (size_t)((8 - (b->n + 3) % 8) % 8);
        size_t stored_bits = 3 + pad + 32 + 8 * (end - start);
        if (bits <= stored_bits) {
            bw_bits(b, (uint32_t)final, 1);
            bw_bits(b, 1, 2); /* BTYPE 01: fixed Huffman */
            for (size_t k = 0; k < nt; k++) {
                uint32_t code;
                int cl;
                if (!t[k].len) { fixed_code(t[k].val, &code, &cl); bw_code(b, code, cl); continue; }
                int li = len_index(t[k].len), di = dist_index(t[k].val);
                fixed_code(257 + li, &code, &cl);
                bw_code(b, code, cl);
                bw_bits(b, (uint32_t)(t[k].len - len_base[li]), len_extra[li]);
                bw_code(b, (uint32_t)di, 5);
                bw_bits(b, (uint32_t)(t[k].val - dist_base[di]), dist_extra[di]);
            }
            uint32_t code;
            int cl;
            fixed_code(256, &code, &cl);
            bw_code(b, code, cl);
        } else {
            bw_bits(b, (uint32_t)final, 1);
            bw_bits(b, 0, 2); /* BTYPE 00: stored */
            bw_align(b);
            uint16_t len = (uint16_t)(end - start);
            uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)~len, (uint8_t)(~len >> 8)};
            ob_bytes(&b->o, hdr, 4);
            ob_bytes(&b->o, d + start, end - start);
        }
        start = end;
    } while (start < n);
    free(z.head);
    free(z.prev);
    free(t);
    return b->o.oom ? KS_ERR_OOM : KS_OK;
}

/* ===================================================================== PNG */

static void png_chunk(obuf *o, const char *type, const uint8_t *data, size_t n) {
    ob_be32(o, (uint32_t)n);
    ob_bytes(o, type, 4);
    if (n) ob_bytes(o, data, n);
    uint32_t crc = ks_crc32(0, type, 4);
    crc = ks_crc32(crc, data, n);
    ob_be32(o, crc);
}

/* |v| of a filtered byte read as signed: the usual "which filter compresses better" estimate */
static unsigned sabs(uint8_t v) { return v < 128 ? v : 256u - v; }

ks_status ks_png_encode_rgb(int w, int h, const uint8_t *rgb, uint8_t **out, size_t *out_len) {
    if (!rgb || !out || !out_len) return hm_errorf(KS_ERR_ARG, "png: NULL pixel or output pointer");
    *out = NULL;
    *out_len = 0;
    if (w <= 0 || h <= 0) return hm_errorf(KS_ERR_ARG, "png: image size %dx%d: width and height must be positive", w, h);
    if (w > KS_PNG_MAX_DIM || h > KS_PNG_MAX_DIM || (int64_t)w * h > KS_PNG_MAX_PIXELS)
        return hm_errorf(KS_ERR_ARG, "png: image size %dx%d is too large (at most %d per side, %d pixels)", w, h,
                         KS_PNG_MAX_DIM, KS_PNG_MAX_PIXELS);
    size_t row = (size_t)w * 3, stride = row + 1;
    uint8_t *raw = hm_malloc(stride * (size_t)h);
    if (!raw) return hm_error_prefix(KS_ERR_OOM, "png: %dx%d image", w, h);
    for (int y = 0; y < h; y++) {
        const uint8_t *cur = rgb + (size_t)y * row, *up = y ? cur - row : NULL;
        uint8_t *o = raw + (size_t)y * stride;
        unsigned long c0 = 0, c2 = 0;
        for (size_t x = 0; x < row; x++) {
            c0 += sabs(cur[x]);
            if (up) c2 += sabs((uint8_t)(cur[x] - up[x]));
        }
        if (up && c2 < c0) {
            o[0] = 2; /* Up */
            for (size_t x = 0; x < row; x++) o[1 + x] = (uint8_t)(cur[x] - up[x]);
        } else {
            o[0] = 0; /* None */
            memcpy(o + 1, cur, row);
        }
    }
    /* zlib stream: CMF 0x78 (deflate, 32K window), FLG 0x01 (check bits; no dictionary) */
    bitw b = {{0}, 0, 0};
    ob_byte(&b.o, 0x78);
    ob_byte(&b.o, 0x01);
    ks_status st = deflate_fixed(&b, raw, stride * (size_t)h, 3, (int)stride);
    bw_align(&b);
    ob_be32(&b.o, ks_adler32(1, raw, stride * (size_t)h));
    free(raw);
    if (st || b.o.oom) { free(b.o.p); return hm_error_prefix(KS_ERR_OOM, "png: %dx%d image", w, h); }

    obuf o = {0};
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    ob_bytes(&o, sig, 8);
    uint8_t ihdr[13] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w,
                        (uint8_t)(h >> 24), (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h,
                        8 /* bit depth */, 2 /* RGB */, 0, 0, 0 /* deflate, adaptive filters, no interlace */};
    png_chunk(&o, "IHDR", ihdr, sizeof ihdr);
    const size_t part = 1 << 18; /* IDAT chunks of 256 KiB */
    for (size_t at = 0; at < b.o.len; at += part)
        png_chunk(&o, "IDAT", b.o.p + at, b.o.len - at < part ? b.o.len - at : part);
    png_chunk(&o, "IEND", NULL, 0);
    free(b.o.p);
    if (o.oom) { free(o.p); return hm_error_prefix(KS_ERR_OOM, "png: %dx%d image", w, h); }
    *out = o.p;
    *out_len = o.len;
    return KS_OK;
}

ks_status ks_png_write_rgb(const char *path, int w, int h, const uint8_t *rgb) {
    if (!path || !*path) return hm_errorf(KS_ERR_ARG, "png: no output path");
    uint8_t *png;
    size_t n;
    ks_status st = ks_png_encode_rgb(w, h, rgb, &png, &n);
    if (st) return hm_error_prefix(st, "%s", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        int e = errno;
        free(png);
        return hm_errorf(KS_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    size_t wr = fwrite(png, 1, n, f);
    int e = errno;
    free(png);
    if (wr != n) { fclose(f); return hm_errorf(KS_ERR_IO, "cannot write %s: %s", path, strerror(e)); }
    if (fclose(f)) return hm_errorf(KS_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return KS_OK;
}

/* ===================================================================== the bitmap font */

/* Our own 5x7 font with two descender rows: each glyph is up to 9 rows of 5 columns ('#' ink),
 * rows separated by spaces, top row first; the baseline is under row 7 (index 6). Digits advance a
 * fixed 5 columns (numbers line up); everything else is as wide as its ink, plus one column of space. */
static const char *const font[128] = {
    ['0'] = ".###. #...# #..## #.#.# ##..# #...# .###.",
    ['1'] = "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    ['2'] = ".###. #...# ....# ...#. ..#.. .#... #####",
    ['3'] = ".###. #...# ....# ..##. ....# #...# .###.",
    ['4'] = "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    ['5'] = "##### #.... ####. ....# ....# #...# .###.",
    ['6'] = "..##. .#... #.... ####. #...# #...# .###.",
    ['7'] = "##### ....# ...#. ..#.. .#... .#... .#...",
    ['8'] = ".###. #...# #...# .###. #...# #...# .###.",
    ['9'] = ".###. #...# #...# .#### ....# ...#. .##..",
    ['A'] = ".###. #...# #...# ##### #...# #...# #...#",
    ['B'] = "####. #...# #...# ####. #...# #...# ####.",
    ['C'] = ".###. #...# #.... #.... #.... #...# .###.",
    ['D'] = "####. #...# #...# #...# #...# #...# ####.",
    ['E'] = "##### #.... #.... ####. #.... #.... #####",
    ['F'] = "##### #.... #.... ####. #.... #.... #....",
    ['G'] = ".###. #...# #.... #.### #...# #...# .####",
    ['H'] = "#...# #...# #...# ##### #...# #...# #...#",
    ['I'] = ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    ['J'] = "..### ...#. ...#. ...#. ...#. #..#. .##..",
    ['K'] = "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    ['L'] = "#.... #.... #.... #.... #.... #.... #####",
    ['M'] = "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    ['N'] = "#...# #...# ##..# #.#.# #..## #...# #...#",
    ['O'] = ".###. #...# #...# #...# #...# #...# .###.",
    ['P'] = "####. #...# #...# ####. #.... #.... #....",
    ['Q'] = ".###. #...# #...# #...# #.#.# #..#. .##.#",
    ['R'] = "####. #...# #...# ####. #.#.. #..#. #...#",
    ['S'] = ".###. #...# #.... .###. ....# #...# .###.",
    ['T'] = "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    ['U'] = "#...# #...# #...# #...# #...# #...# .###.",
    ['V'] = "#...# #...# #...# #...# #...# .#.#. ..#..",
    ['W'] = "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    ['X'] = "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    ['Y'] = "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    ['Z'] = "##### ....# ...#. ..#.. .#... #.... #####",
    ['a'] = "..... ..... .###. ....# .#### #...# .####",
    ['b'] = "#.... #.... ####. #...# #...# #...# ####.",
    ['c'] = "..... ..... .###. #.... #.... #...# .###.",
    ['d'] = "....# ....# .#### #...# #...# #...# .####",
    ['e'] = "..... ..... .###. #...# ##### #.... .###.",
    ['f'] = "..##. .#..# .#... ###.. .#... .#... .#...",
    ['g'] = "..... ..... .#### #...# #...# #...# .#### ....# .###.",
    ['h'] = "#.... #.... #.##. ##..# #...# #...# #...#",
    ['i'] = "..#.. ..... .##.. ..#.. ..#.. ..#.. .###.",
    ['j'] = "...#. ..... ..##. ...#. ...#. ...#. ...#. #..#. .##..",
    ['k'] = "#.... #.... #..#. #.#.. ##... #.#.. #..#.",
    ['l'] = ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    ['m'] = "..... ..... ##.#. #.#.# #.#.# #.#.# #.#.#",
    ['n'] = "..... ..... #.##. ##..# #...# #...# #...#",
    ['o'] = "..... ..... .###. #...# #...# #...# .###.",
    ['p'] = "..... ..... ####. #...# #...# #...# ####. #.... #....",
    ['q'] = "..... ..... .#### #...# #...# #...# .#### ....# ....#",
    ['r'] = "..... ..... #.##. ##..# #.... #.... #....",
    ['s'] = "..... ..... .#### #.... .###. ....# ####.",
    ['t'] = ".#... .#... ###.. .#... .#... .#..# ..##.",
    ['u'] = "..... ..... #...# #...# #...# #..## .##.#",
    ['v'] = "..... ..... #...# #...# #...# .#.#. ..#..",
    ['w'] = "..... ..... #...# #...# #.#.# #.#.# .#.#.",
    ['x'] = "..... ..... #...# .#.#. ..#.. .#.#. #...#",
    ['y'] = "..... ..... #...# #...# #...# #...# .#### ....# .###.",
    ['z'] = "..... ..... ##### ...#. ..#.. .#... #####",
    ['.'] = "..... ..... ..... ..... ..... .##.. .##..",
    [','] = "..... ..... ..... ..... ..... .##.. .##.. ..#..",
    [':'] = "..... .##.. .##.. ..... ..... .##.. .##..",
    [';'] = "..... .##.. .##.. ..... ..... .##.. .##.. ..#..",
    ['%'] = "##... ##..# ...#. ..#.. .#... #..## ...##",
    ['-'] = "..... ..... ..... #### ..... ..... .....",
    ['+'] = "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    ['='] = "..... ..... ##### ..... ##### ..... .....",
    ['/'] = "....# ....# ...#. ..#.. .#... #.... #....",
    ['('] = "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    [')'] = ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    ['['] = ".###. .#... .#... .#... .#... .#... .###.",
    [']'] = ".###. ...#. ...#. ...#. ...#. ...#. .###.",
    ['<'] = "...#. ..#.. .#... #.... .#... ..#.. ...#.",
    ['>'] = ".#... ..#.. ...#. ....# ...#. ..#.. .#...",
    ['_'] = "..... ..... ..... ..... ..... ..... ..... #####",
    ['?'] = ".###. #...# ....# ...#. ..#.. ..... ..#..",
    ['!'] = "..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#..",
    ['*'] = "..... #.#.# .###. ##### .###. #.#.# .....",
    ['#'] = ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#.",
    ['\''] = "..#.. ..#.. .#... ..... ..... ..... .....",
    ['"'] = ".#.#. .#.#. ..... ..... ..... ..... .....",
    ['|'] = "..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    ['&'] = ".##.. #..#. #.#.. .#... #.#.# #..#. .##.#",
    ['@'] = ".###. #...# #.### #.#.# #.##. #.... .###.",
    ['~'] = "..... ..... .#... #.#.# ...#. ..... .....",
    ['^'] = "..#.. .#.#. #...# ..... ..... ..... .....",
    ['\\'] = "#.... #.... .#... ..#.. ...#. ....# ....#",
    ['{'] = "...## ..#.. ..#.. ##... ..#.. ..#.. ...##",
    ['}'] = "##... ..#.. ..#.. ...## ..#.. ..#.. ##...",
    ['$'] = "..#.. .#### #.#.. .###. ..#.# ####. ..#..",
    ['`'] = ".#... ..#.. ..... ..... ..... ..... .....",
};

#define GLYPH_ROWS 9
#define FONT_BODY 7 /* rows above the baseline */

/* One glyph as row bit masks (bit 4 = leftmost column); unknown characters are '?'. */
static void glyph(int ch, uint8_t rows[GLYPH_ROWS], int *x0, int *w) {
    const char *s = ch > 32 && ch < 127 && font[ch] ? font[ch] : NULL;
    if (ch != ' ' && !s) s = font['?'];
    memset(rows, 0, GLYPH_ROWS);
    for (int r = 0; s && *s && r < GLYPH_ROWS; r++) {
        for (int c = 0; c < 5 && *s && *s != ' '; c++, s++)
            if (*s == '#') rows[r] |= (uint8_t)(0x10 >> c);
        while (*s && *s != ' ') s++;
        while (*s == ' ') s++;
    }
    if (ch >= '0' && ch <= '9') { *x0 = 0; *w = 5; return; }
    uint8_t all = 0;
    for (int r = 0; r < GLYPH_ROWS; r++) all |= rows[r];
    if (!all) { *x0 = 0; *w = 3; return; } /* space */
    int lo = 0, hi = 4;
    while (!(all & (0x10 >> lo))) lo++;
    while (!(all & (0x10 >> hi))) hi--;
    *x0 = lo;
    *w = hi - lo + 1;
}

/* Next character of a UTF-8 string as one font code (multi-byte sequences become '?'). */
static int next_ch(const char **p) {
    const unsigned char *s = (const unsigned char *)*p;
    if (*s < 0x80) { (*p)++; return *s; }
    s++;
    while (*s >= 0x80 && *s < 0xC0) s++;
    *p = (const char *)s;
    return '?';
}

static int text_width(const char *s, int scale) {
    if (!s || !*s) return 0;
    int w = 0;
    while (*s) {
        uint8_t rows[GLYPH_ROWS];
        int x0, gw;
        glyph(next_ch(&s), rows, &x0, &gw);
        w += gw + 1;
    }
    return (w - 1) * scale;
}

/* ===================================================================== drawing */

/* functions, not KS_MIN/KS_MAX: their arguments are often calls */
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

typedef struct rgb8 { uint8_t r, g, b; } rgb8;
typedef struct canvas { int w, h; uint8_t *p; } canvas;

static void fill(canvas *c, int x, int y, int w, int h, rgb8 col) {
    int x1 = imin(x + w, c->w), y1 = imin(y + h, c->h);
    x = imax(x, 0);
    y = imax(y, 0);
    for (int yy = y; yy < y1; yy++)
        for (int xx = x; xx < x1; xx++) {
            uint8_t *q = c->p + ((size_t)yy * c->w + xx) * 3;
            q[0] = col.r; q[1] = col.g; q[2] = col.b;
        }
}

/* Draw text with its top-left at (x, y) (top of the capitals); bold repeats it one pixel right.
 * up != 0 rotates it a quarter turn counter-clockwise (reads bottom to top) with (x, y) then the
 * bottom-left corner of the run. Returns the advance in pixels. */
static int draw_text(canvas *c, int x, int y, const char *s, int scale, rgb8 col, int bold, int up) {
    int pen = 0;
    while (s && *s) {
        uint8_t rows[GLYPH_ROWS];
        int x0, gw;
        glyph(next_ch(&s), rows, &x0, &gw);
        for (int r = 0; r < GLYPH_ROWS; r++)
            for (int k = 0; k < gw; k++) {
                if (!(rows[r] & (0x10 >> (x0 + k)))) continue;
                int tx = pen + k * scale, ty = r * scale; /* in the text's own frame */
                if (up) fill(c, x + ty, y - tx - scale - bold, scale, scale + bold, col);
                else fill(c, x + tx, y + ty, scale + bold, scale, col);
            }
        pen += (gw + 1) * scale;
    }
    return pen ? pen - scale : 0;
}

/* red (0) -> orange -> yellow (0.5) -> yellow-green -> green (1) */
static rgb8 score_color(double v) {
    static const rgb8 stop[5] = {{214, 47, 39}, {244, 130, 64}, {250, 214, 72}, {150, 200, 80}, {34, 150, 76}};
    if (v != v) return (rgb8){196, 196, 196};
    if (v < 0) v = 0;
    if (v > 1) v = 1;
    double f = v * 4;
    int i = (int)f;
    if (i > 3) i = 3;
    f -= i;
    rgb8 a = stop[i], b = stop[i + 1];
    return (rgb8){(uint8_t)lround(a.r + f * (b.r - a.r)), (uint8_t)lround(a.g + f * (b.g - a.g)),
                  (uint8_t)lround(a.b + f * (b.b - a.b))};
}
static int is_light(rgb8 c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b > 150; }

static void fmt_score(double v, char *buf, size_t n) {
    if (v != v) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.2f", v);
}

/* ===================================================================== the heatmap */

static const char *check_args(int n_rows, int n_cols, const ks_heat_panel *panels, int n_panels, char *buf, size_t n) {
    if (n_rows < 1 || n_rows > KS_HEAT_MAX_AXIS)
        snprintf(buf, n, "%d rows (depths): need 1..%d", n_rows, KS_HEAT_MAX_AXIS);
    else if (n_cols < 1 || n_cols > KS_HEAT_MAX_AXIS)
        snprintf(buf, n, "%d columns (lengths): need 1..%d", n_cols, KS_HEAT_MAX_AXIS);
    else if (n_panels < 1 || n_panels > KS_HEAT_MAX_PANELS)
        snprintf(buf, n, "%d panels: need 1..%d", n_panels, KS_HEAT_MAX_PANELS);
    else if (!panels)
        snprintf(buf, n, "no panels (NULL)");
    else {
        for (int p = 0; p < n_panels; p++)
            if (!panels[p].score) {
                snprintf(buf, n, "panel %d (%s) has no scores (NULL)", p, panels[p].title ? panels[p].title : "untitled");
                return buf;
            }
        return NULL;
    }
    return buf;
}

/* label i of an axis, or its index when the caller gave none */
static const char *axis_label(const char *const *labels, int i, char *buf, size_t n) {
    if (labels && labels[i]) return labels[i];
    snprintf(buf, n, "%d", i);
    return buf;
}

/* Greedy word wrap of s into lines no wider than width px (a word is never parted from a number
 * that follows it after one space); returns the line count, and when lines
 * is non-NULL fills lines[k] with ks_malloc'd copies (up to max). */
static int wrap_text(const char *s, int width, int scale, char **lines, int max) {
    if (!s || !*s) return 0;
    int nl = 0;
    size_t len = strlen(s);
    char *buf = hm_malloc(len + 1);
    if (!buf) return 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        /* take words while they fit (always at least one) */
        size_t take = 0, best = 0;
        for (;;) {
            size_t e = take;
            while (p[e] == ' ') e++;
            if (!p[e]) break;
            while (p[e] && p[e] != ' ') e++;
            while (p[e] == ' ' && p[e + 1] >= '0' && p[e + 1] <= '9') /* keep "EM 0.63" together */
                for (e++; p[e] && p[e] != ' '; e++) {}
            memcpy(buf, p, e);
            buf[e] = 0;
            if (best && text_width(buf, scale) > width) break;
            best = take = e;
        }
        if (lines && nl < max) {
            lines[nl] = hm_malloc(best + 1);
            if (lines[nl]) { memcpy(lines[nl], p, best); lines[nl][best] = 0; }
        }
        nl++;
        p += best;
    }
    free(buf);
    return nl;
}

#define TS 2            /* text scale */
#define LINE (9 * TS)   /* a line of text, descenders included */
#define CAP (7 * TS)    /* capital height */
#define MARGIN 18
#define PANEL_GAP 34
#define BAR_W 18
#define MAX_LINES 8
#define HEAD_W 440    /* panel titles wrap at this width (or the grid's, if wider) */

static const rgb8 C_BG = {255, 255, 255}, C_TEXT = {34, 34, 34}, C_SOFT = {90, 90, 90}, C_FRAME = {150, 150, 150};
static const char *const X_TITLE = "context length (tokens)";
static const char *const Y_TITLE = "needle depth";

ks_status ks_heatmap_render(const char *title, int n_rows, const char *const *row_labels, int n_cols,
                            const char *const *col_labels, const ks_heat_panel *panels, int n_panels,
                            uint8_t **rgb, ks_heat_geom *g) {
    char ebuf[200], lb[16];
    if (!rgb) return hm_errorf(KS_ERR_ARG, "heatmap: NULL output pointer");
    *rgb = NULL;
    if (check_args(n_rows, n_cols, panels, n_panels, ebuf, sizeof ebuf)) return hm_errorf(KS_ERR_ARG, "heatmap: %s", ebuf);

    /* cell size: room for "0.00" and the column labels, shrunk for very large grids */
    int colw = 0, roww = 0;
    for (int c = 0; c < n_cols; c++) colw = imax(colw, text_width(axis_label(col_labels, c, lb, sizeof lb), TS));
    for (int r = 0; r < n_rows; r++) roww = imax(roww, text_width(axis_label(row_labels, r, lb, sizeof lb), TS));
    int cw = imax(imax(60, imin(320 / n_cols, 110)), imin(colw + 12, 110)); /* small grids get bigger cells */
    int ch = imax(30, imin(200 / n_rows, 44));
    if ((long)cw * n_cols * n_panels > 3600) cw = imax(6, 3600 / (n_cols * n_panels));
    if ((long)ch * n_rows > 1400) ch = imax(5, 1400 / n_rows);
    int num_scale = 0;
    if (text_width("0.00", 2) + 8 <= cw - 1 && CAP + 8 <= ch - 1) num_scale = 2;
    else if (text_width("0.00", 1) + 4 <= cw - 1 && 7 + 4 <= ch - 1) num_scale = 1;
    int grid_w = cw * n_cols, grid_h = ch * n_rows;

    /* panel headers wrap to the grid's width (at least HEAD_W px); the pitch grows to the widest line */
    int head_lines = 0, pitch_w = imax(grid_w, text_width(X_TITLE, TS));
    for (int p = 0; p < n_panels; p++) {
        int wrapw = imax(grid_w, HEAD_W);
        char *lines[MAX_LINES] = {0};
        int nl = imin(wrap_text(panels[p].title, wrapw, TS, lines, MAX_LINES), MAX_LINES);
        head_lines = imax(head_lines, nl);
        for (int k = 0; k < nl; k++) {
            if (lines[k]) pitch_w = imax(pitch_w, text_width(lines[k], TS));
            free(lines[k]);
        }
    }
    int any_nan = 0;
    for (int p = 0; p < n_panels; p++)
        for (int i = 0; i < n_rows * n_cols; i++) any_nan |= panels[p].score[i] != panels[p].score[i];

    /* vertical layout */
    int title_y = MARGIN;
    int head_y = title && *title ? title_y + LINE + 14 : MARGIN;
    int grid_y = head_y + head_lines * LINE + (head_lines ? 6 : 0);
    int collab_y = grid_y + grid_h + 8;
    int xtitle_y = collab_y + LINE + 6;
    int height = xtitle_y + LINE + MARGIN;
    if (any_nan) height = imax(height, grid_y + grid_h + 10 + 16 + MARGIN);
    /* horizontal layout: y-axis title, row labels, panels, colour bar */
    int ytitle_x = MARGIN;
    int rowlab_right = ytitle_x + LINE + 10 + roww;
    int gx0 = rowlab_right + 10;
    int gx[KS_HEAT_MAX_PANELS] = {0};
    for (int p = 0; p < n_panels; p++) gx[p] = gx0 + p * (pitch_w + PANEL_GAP);
    int bar_x = gx[n_panels - 1] + grid_w + 28;
    int tick_w = imax(text_width("0.5", TS), any_nan ? text_width("n/a", TS) : 0);
    int width = imax(bar_x + BAR_W + 8 + tick_w, bar_x + text_width("score", TS));
    width = imax(width, gx[n_panels - 1] + pitch_w) + MARGIN;
    if (title) width = imax(width, 2 * MARGIN + text_width(title, TS) + 1);
    if (width > KS_PNG_MAX_DIM || height > KS_PNG_MAX_DIM)
        return hm_errorf(KS_ERR_ARG, "heatmap: image would be %dx%d pixels (too large; shorten the title?)", width, height);

    canvas cv = {width, height, hm_malloc((size_t)width * height * 3)};
    if (!cv.p) return hm_error_prefix(KS_ERR_OOM, "heatmap %dx%d", width, height);
    fill(&cv, 0, 0, width, height, C_BG);

    if (title && *title) draw_text(&cv, MARGIN, title_y, title, TS, C_TEXT, 1, 0);
    /* y axis title, rotated, centred on the grid */
    const char *yt = text_width(Y_TITLE, TS) <= grid_h + 2 * LINE ? Y_TITLE : "depth";
    if (text_width(yt, TS) <= grid_h + 2 * LINE)
        draw_text(&cv, ytitle_x, grid_y + grid_h / 2 + text_width(yt, TS) / 2, yt, TS, C_SOFT, 0, 1);
    /* row labels (every k-th when rows are thin) */
    int rstep = 1;
    while (ch * rstep < CAP + 4) rstep++;
    for (int r = 0; r < n_rows; r += rstep) {
        const char *s = axis_label(row_labels, r, lb, sizeof lb);
        draw_text(&cv, rowlab_right - text_width(s, TS), grid_y + r * ch + (ch - 1 - CAP) / 2, s, TS, C_TEXT, 0, 0);
    }
    int cstep = 1;
    while (cw * cstep < colw + 8) cstep++;

    for (int p = 0; p < n_panels; p++) {
        const double *sc = panels[p].score;
        char *lines[MAX_LINES] = {0};
        int nl = imin(wrap_text(panels[p].title, imax(grid_w, HEAD_W), TS, lines, MAX_LINES), MAX_LINES);
        for (int k = 0; k < nl; k++) {
            if (lines[k]) draw_text(&cv, gx[p], head_y + k * LINE, lines[k], TS, C_TEXT, 0, 0);
            free(lines[k]);
        }
        for (int r = 0; r < n_rows; r++)
            for (int c = 0; c < n_cols; c++) {
                double v = sc[(size_t)r * n_cols + c];
                rgb8 col = score_color(v);
                int x = gx[p] + c * cw, y = grid_y + r * ch;
                fill(&cv, x, y, cw - 1, ch - 1, col);
                if (!num_scale) continue;
                char num[32];
                fmt_score(v, num, sizeof num);
                int s = num_scale, tw = text_width(num, s);
                if (tw + 4 > cw - 1 && s == 2) { s = 1; tw = text_width(num, 1); }
                if (tw + 2 > cw - 1) continue;
                rgb8 tc = is_light(col) ? (rgb8){40, 40, 40} : (rgb8){255, 255, 255};
                draw_text(&cv, x + (cw - 1 - tw) / 2, y + (ch - 1 - 7 * s) / 2, num, s, tc, 0, 0);
            }
        for (int c = 0; c < n_cols; c += cstep) {
            const char *s = axis_label(col_labels, c, lb, sizeof lb);
            int tw = text_width(s, TS);
            draw_text(&cv, gx[p] + c * cw + (cw - 1 - tw) / 2, collab_y, s, TS, C_TEXT, 0, 0);
        }
        int tw = text_width(X_TITLE, TS);
        draw_text(&cv, gx[p] + imax(0, (grid_w - tw) / 2), xtitle_y, X_TITLE, TS, C_SOFT, 0, 0);
    }

    /* colour bar: 1 at the top, 0 at the bottom, ticks at 0, 0.5, 1; titled "score" when tall enough */
    int bar_y = grid_y, bh = grid_h - 1;
    if (grid_h >= 120) {
        draw_text(&cv, bar_x, grid_y, "score", TS, C_SOFT, 0, 0);
        bar_y = grid_y + LINE + 10;
        bh = grid_h - 1 - (LINE + 10) - (CAP / 2 + 2);
    }
    fill(&cv, bar_x - 1, bar_y - 1, BAR_W + 2, bh + 2, C_FRAME);
    for (int y = 0; y < bh; y++) fill(&cv, bar_x, bar_y + y, BAR_W, 1, score_color(bh > 1 ? 1.0 - (double)y / (bh - 1) : 1.0));
    static const char *const tick[3] = {"1.0", "0.5", "0.0"};
    for (int k = 0; k < 3; k++) {
        int ty = bar_y + (bh - 1) * k / 2;
        fill(&cv, bar_x + BAR_W + 1, ty, 4, 1, C_FRAME);
        draw_text(&cv, bar_x + BAR_W + 8, ty - CAP / 2, tick[k], TS, C_TEXT, 0, 0);
    }
    if (any_nan) {
        int sy = grid_y + grid_h + 10;
        fill(&cv, bar_x - 1, sy - 1, BAR_W + 2, 18, C_FRAME);
        fill(&cv, bar_x, sy, BAR_W, 16, score_color(NAN));
        draw_text(&cv, bar_x + BAR_W + 8, sy + 1, "n/a", TS, C_TEXT, 0, 0);
    }

    if (g) {
        memset(g, 0, sizeof *g);
        g->width = width;
        g->height = height;
        g->cell_w = cw;
        g->cell_h = ch;
        for (int p = 0; p < n_panels; p++) g->grid_x[p] = gx[p];
        g->grid_y = grid_y;
        g->cell_text_scale = num_scale;
    }
    *rgb = cv.p;
    return KS_OK;
}

ks_status ks_heatmap_png(const char *path, const char *title, int n_rows, const char *const *row_labels,
                         int n_cols, const char *const *col_labels, const ks_heat_panel *panels, int n_panels) {
    if (!path || !*path) return hm_errorf(KS_ERR_ARG, "heatmap: no output path");
    uint8_t *rgb;
    ks_heat_geom g;
    ks_status st = ks_heatmap_render(title, n_rows, row_labels, n_cols, col_labels, panels, n_panels, &rgb, &g);
    if (st) return hm_error_prefix(st, "%s", path);
    st = ks_png_write_rgb(path, g.width, g.height, rgb);
    free(rgb);
    return st;
}

/* ===================================================================== terminal table */

/* nearest entry of xterm's 6x6x6 colour cube (levels 0, 95, 135, 175, 215, 255) */
static int cube_level(int v) {
    static const int lv[6] = {0, 95, 135, 175, 215, 255};
    int best = 0;
    for (int i = 1; i < 6; i++)
        if (abs(lv[i] - v) < abs(lv[best] - v)) best = i;
    return best;
}

static void print_cell(FILE *f, double v, int width, int color) {
    char num[32];
    fmt_score(v, num, sizeof num);
    if (!color) { fprintf(f, " %*s", width, num); return; }
    rgb8 c = score_color(v);
    int bg = v != v ? 250 : 16 + 36 * cube_level(c.r) + 6 * cube_level(c.g) + cube_level(c.b);
    fprintf(f, " \x1b[48;5;%dm\x1b[38;5;%dm%*s\x1b[0m", bg, is_light(c) || v != v ? 16 : 231, width, num);
}

void ks_heatmap_print(FILE *f, const char *title, int n_rows, const char *const *row_labels, int n_cols,
                      const char *const *col_labels, const ks_heat_panel *panels, int n_panels, int color) {
    if (!f) return;
    char ebuf[200], lb[16];
    if (check_args(n_rows, n_cols, panels, n_panels, ebuf, sizeof ebuf)) { fprintf(f, "heatmap: %s\n", ebuf); return; }
    int lw = 5 /* "depth" */, cwid = 5;
    for (int r = 0; r < n_rows; r++) lw = imax(lw, (int)strlen(axis_label(row_labels, r, lb, sizeof lb)));
    for (int c = 0; c < n_cols; c++) cwid = imax(cwid, (int)strlen(axis_label(col_labels, c, lb, sizeof lb)));
    for (int p = 0; p < n_panels; p++)
        for (int i = 0; i < n_rows * n_cols; i++) {
            char num[32];
            fmt_score(panels[p].score[i], num, sizeof num);
            cwid = imax(cwid, (int)strlen(num));
        }
    if (title && *title) fprintf(f, "%s\n", title);
    for (int p = 0; p < n_panels; p++) {
        const double *sc = panels[p].score;
        fprintf(f, "\n%s\n", panels[p].title && *panels[p].title ? panels[p].title : "(untitled)");
        fprintf(f, "%*s", lw, "depth");
        for (int c = 0; c < n_cols; c++) fprintf(f, " %*s", cwid, axis_label(col_labels, c, lb, sizeof lb));
        fprintf(f, "  %*s\n", cwid, "avg");
        double tot = 0;
        int nt = 0;
        for (int r = 0; r < n_rows; r++) {
            fprintf(f, "%*s", lw, axis_label(row_labels, r, lb, sizeof lb));
            double s = 0;
            int n = 0;
            for (int c = 0; c < n_cols; c++) {
                double v = sc[(size_t)r * n_cols + c];
                print_cell(f, v, cwid, color);
                if (v == v) { s += v; n++; }
            }
            fprintf(f, " ");
            print_cell(f, n ? s / n : NAN, cwid, color);
            fprintf(f, "\n");
            tot += s;
            nt += n;
        }
        fprintf(f, "%*s", lw, "avg");
        for (int c = 0; c < n_cols; c++) {
            double s = 0;
            int n = 0;
            for (int r = 0; r < n_rows; r++) {
                double v = sc[(size_t)r * n_cols + c];
                if (v == v) { s += v; n++; }
            }
            print_cell(f, n ? s / n : NAN, cwid, color);
        }
        fprintf(f, " ");
        print_cell(f, nt ? tot / nt : NAN, cwid, color);
        fprintf(f, "\n");
    }
}
