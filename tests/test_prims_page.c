/* test_prims_page.c — the page primitives of core/prims_page.h: hand-computed cases, a naive
 * reference on random shapes (strided and bf16 rows, partial last pages, page ranges), the
 * NaN / signed-zero rules, and every argument error with its message. */
#include "ktest.h"

#include "common.h"
#include "prims_page.h"
#include "ks_lua.h"

#include <lauxlib.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rs = 0x5eed5eed1234ull;
static float frnd(void) { /* (-2, 2), a few exact repeats */
    g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(g_rs >> 40);
    if ((u & 15) == 0) return 0.5f;
    return ((float)u / 16777216.0f) * 4.0f - 2.0f;
}

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

KT_TEST(prims_page_reduce_hand) {
    /* 5 rows, 1 head, 2 channels, pages of 2: pages {0,1} {2,3} {4} */
    const float x[5][2] = {{1, -1}, {3, 0}, {-2, 5}, {-2, 4}, {7, 7}};
    float mn[3][2], mx[3][2], me[3][2];
    KT_CHECK(ks_cpu_page_reduce(x, 0, 5, 1, 2, 2, 0, 2, 0, 3, &mn[0][0], &mx[0][0], &me[0][0]) == KS_OK, "%s",
             ks_last_error());
    const float emn[3][2] = {{1, -1}, {-2, 4}, {7, 7}}, emx[3][2] = {{3, 0}, {-2, 5}, {7, 7}},
                eme[3][2] = {{2, -0.5f}, {-2, 4.5f}, {7, 7}};
    KT_CHECK(!memcmp(mn, emn, sizeof mn) && !memcmp(mx, emx, sizeof mx) && !memcmp(me, eme, sizeof me),
             "page 0: min (%g, %g) max (%g, %g) mean (%g, %g)", mn[0][0], mn[0][1], mx[0][0], mx[0][1], me[0][0], me[0][1]);
    /* only pages [1, 3): the same values as rows 1.. of the full call; only the max asked for */
    float mx2[2][2];
    KT_CHECK(ks_cpu_page_reduce(x, 0, 5, 1, 2, 2, 0, 2, 1, 3, NULL, &mx2[0][0], NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(!memcmp(mx2, &emx[1][0], sizeof mx2), "page range [1, 3) differs from the full call");
    /* an empty range writes nothing and is fine */
    KT_CHECK(ks_cpu_page_reduce(x, 0, 5, 1, 2, 2, 0, 2, 3, 3, mn[0], NULL, NULL) == KS_OK, "%s", ks_last_error());
}

KT_TEST(prims_page_reduce_vs_naive) {
    /* token-major views of a (h, capacity, d) cache, f32 and bf16, several pages and ranges */
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {37, 2, 8, 16}, {64, 3, 5, 16}, {100, 2, 4, 7}, {9, 1, 3, 20}};
    for (int s = 0; s < 5; s++) {
        int64_t n = shapes[s][0], h = shapes[s][1], d = shapes[s][2], page = shapes[s][3], cap = n + 3;
        float *cache = malloc(sizeof(float) * h * cap * d);
        uint16_t *cb = malloc(2 * h * cap * d);
        for (int64_t i = 0; i < h * cap * d; i++) {
            cb[i] = ks_f32_to_bf16(frnd());
            cache[i] = ks_bf16_to_f32(cb[i]);
        }
        int64_t np = ks_page_count(n, page), p0 = np / 3, p1 = np;
        size_t on = (size_t)(p1 - p0) * h * d + 1;
        float *mn = malloc(4 * on), *mx = malloc(4 * on), *me = malloc(4 * on), *bm = malloc(4 * on), *bx = malloc(4 * on),
              *be = malloc(4 * on);
        KT_CHECK(ks_cpu_page_reduce(cache, 0, n, h, d, d, cap * d, page, p0, p1, mn, mx, me) == KS_OK, "%s", ks_last_error());
        KT_CHECK(ks_cpu_page_reduce(cb, 1, n, h, d, d, cap * d, page, p0, p1, bm, bx, be) == KS_OK, "%s", ks_last_error());
        for (int64_t p = p0; p < p1; p++)
            for (int64_t j = 0; j < h; j++)
                for (int64_t c = 0; c < d; c++) {
                    float a = INFINITY, b = -INFINITY;
                    double sum = 0;
                    int64_t cnt = 0;
                    for (int64_t r = p * page; r < n && r < (p + 1) * page; r++, cnt++) {
                        float v = cache[j * cap * d + r * d + c];
                        a = v < a ? v : a;
                        b = v > b ? v : b;
                        sum += v;
                    }
                    int64_t o = ((p - p0) * h + j) * d + c;
                    float m = (float)(sum / cnt);
                    KT_CHECK(mn[o] == a && mx[o] == b && me[o] == m, "shape %d page %lld head %lld chan %lld: min %g/%g max %g/%g mean %g/%g",
                             s, (long long)p, (long long)j, (long long)c, mn[o], a, mx[o], b, me[o], m);
                    KT_CHECK(bm[o] == mn[o] && bx[o] == mx[o] && be[o] == me[o], "bf16 input differs from its f32 copy");
                }
        free(cache); free(cb); free(mn); free(mx); free(me); free(bm); free(bx); free(be);
    }
}

KT_TEST(prims_page_reduce_nan_zero) {
    const float x[4] = {-0.0f, 0.0f, NAN, 1.0f}; /* pages of 2: {-0, +0}, {NaN, 1} */
    float mn[2], mx[2];
    KT_CHECK(ks_cpu_page_reduce(x, 0, 4, 1, 1, 1, 0, 2, 0, 2, mn, mx, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(signbit(mn[0]) && signbit(mx[0]), "equal zeros: the first seen (-0) stays, got %g %g", mn[0], mx[0]);
    KT_CHECK(isnan(mn[1]) && isnan(mx[1]), "a NaN row makes min and max NaN");
    const float y[3] = {2.0f, NAN, -1.0f};
    KT_CHECK(ks_cpu_page_reduce(y, 0, 3, 1, 1, 1, 0, 3, 0, 1, mn, mx, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(isnan(mn[0]) && isnan(mx[0]), "NaN in the middle of a page stays NaN");
}

KT_TEST(prims_page_reduce_errors) {
    float x[8] = {0}, o[8];
    struct { ks_status st; const char *part; } c[] = {
        {ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 0, 0, 1, o, NULL, NULL), "page = 0 must be >= 1"},
        {ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 3, 0, 4, o, NULL, NULL), "pages [0, 4) not within [0, 3]"},
        {ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 3, 2, 1, o, NULL, NULL), "pages [2, 1)"},
        {ks_cpu_page_reduce(x, 0, -1, 1, 1, 1, 0, 3, 0, 0, o, NULL, NULL), "negative size"},
        {ks_cpu_page_reduce(x, 0, 8, 1, 1, -1, 0, 3, 0, 1, o, NULL, NULL), "negative stride"},
        {ks_cpu_page_reduce(x, 2, 8, 1, 1, 1, 0, 3, 0, 1, o, NULL, NULL), "x_bf16 = 2"},
        {ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 3, 0, 1, NULL, NULL, NULL), "no output"},
        {ks_cpu_page_reduce(NULL, 0, 8, 1, 1, 1, 0, 3, 0, 1, o, NULL, NULL), "x is NULL"},
        {ks_cpu_page_reduce(x, 0, 8, INT64_MAX / 2, 4, 1, 0, 1, 0, 8, o, NULL, NULL), "too large"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        KT_CHECK(c[i].st == KS_ERR_ARG, "case %zu: status %d", i, (int)c[i].st);
    }
    /* the message of the last call is the last error: check each one by calling again */
    KT_CHECK(ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 0, 0, 1, o, NULL, NULL) && has(ks_last_error(), c[0].part), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 3, 0, 4, o, NULL, NULL) && has(ks_last_error(), c[1].part), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_reduce(x, 0, 8, 1, 1, 1, 0, 3, 0, 1, NULL, NULL, NULL) && has(ks_last_error(), c[6].part), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_reduce(x, 0, 8, INT64_MAX / 2, 4, 1, 0, 1, 0, 8, o, NULL, NULL) && has(ks_last_error(), c[8].part), "%s", ks_last_error());
}

KT_TEST(prims_bound_scores_hand) {
    /* 2 query heads, 1 KV head, d = 2; boxes: page A lo (0, 0) hi (1, 1); page B lo (-1, 2) hi (3, 2)
     * q0 = (1, -1): A: max(0, 1) + max(0, -1) = 1          B: max(-1, 3) + max(-2, -2) = 1
     * q1 = (-2, 0.5): A: max(0, -2) + max(0, 0.5) = 0.5     B: max(2, -6) + max(1, 1) = 3 */
    const float q[2][2] = {{1, -1}, {-2, 0.5f}};
    const float lo[2][2] = {{0, 0}, {-1, 2}}, hi[2][2] = {{1, 1}, {3, 2}};
    float out[4];
    KT_CHECK(ks_cpu_bound_scores(&q[0][0], 2, &lo[0][0], &hi[0][0], 2, 1, 2, KS_BOUND_NONE, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 1 && out[1] == 1 && out[2] == 0.5f && out[3] == 3, "none: %g %g %g %g", out[0], out[1], out[2], out[3]);
    KT_CHECK(ks_cpu_bound_scores(&q[0][0], 2, &lo[0][0], &hi[0][0], 2, 1, 2, KS_BOUND_GROUP_MAX, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 1 && out[1] == 3, "group_max: %g %g", out[0], out[1]);
    KT_CHECK(ks_cpu_bound_scores(&q[0][0], 2, &lo[0][0], &hi[0][0], 2, 1, 2, KS_BOUND_GROUP_SUM, out) == KS_OK, "%s", ks_last_error());
    KT_CHECK(out[0] == 1.5f && out[1] == 4, "group_sum: %g %g", out[0], out[1]);
    /* two KV heads, one query head each (g = 1): head 1 reads the boxes' second head */
    const float lo2[1][2][2] = {{{0, 0}, {5, 5}}}, hi2[1][2][2] = {{{0, 0}, {6, 6}}};
    KT_CHECK(ks_cpu_bound_scores(&q[0][0], 2, &lo2[0][0][0], &hi2[0][0][0], 1, 2, 2, KS_BOUND_NONE, out) == KS_OK, "%s", ks_last_error());
    /* q1 . box [5,6]^2: max(-10, -12) + max(2.5, 3) = -7 */
    KT_CHECK(out[0] == 0 && out[1] == -7, "gqa mapping: %g %g", out[0], out[1]);
}

KT_TEST(prims_bound_scores_is_upper_bound) {
    /* random boxes from page_reduce of random keys: the bound is >= every key's q.k and equals
     * the max when the page is one row */
    int64_t H = 4, Hkv = 2, d = 16, n = 64, page = 8, np = n / page;
    float *k = malloc(4 * n * Hkv * d), *q = malloc(4 * H * d), *lo = malloc(4 * np * Hkv * d), *hi = malloc(4 * np * Hkv * d);
    float *s = malloc(4 * H * np), *s1 = malloc(4 * H * n);
    for (int64_t i = 0; i < n * Hkv * d; i++) k[i] = frnd();
    for (int64_t i = 0; i < H * d; i++) q[i] = frnd();
    KT_CHECK(ks_cpu_page_reduce(k, 0, n, Hkv, d, Hkv * d, d, page, 0, np, lo, hi, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, H, lo, hi, np, Hkv, d, KS_BOUND_NONE, s) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, H, k, k, n, Hkv, d, KS_BOUND_NONE, s1) == KS_OK, "%s", ks_last_error());
    for (int64_t h = 0; h < H; h++)
        for (int64_t r = 0; r < n; r++) {
            const float *kr = k + (r * Hkv + h / (H / Hkv)) * d;
            double dot = 0;
            for (int64_t i = 0; i < d; i++) dot += (double)q[h * d + i] * kr[i];
            KT_CHECK(s[h * np + r / page] >= (float)dot - 1e-5f, "head %lld row %lld: bound %g < q.k %g", (long long)h,
                     (long long)r, s[h * np + r / page], dot);
            KT_CHECK(s1[h * n + r] == (float)dot, "a one-row box gives q.k exactly: %g vs %g", s1[h * n + r], dot);
        }
    free(k); free(q); free(lo); free(hi); free(s); free(s1);
}

KT_TEST(prims_bound_scores_errors) {
    float q[4] = {0}, b[4] = {0}, o[4];
    KT_CHECK(ks_cpu_bound_scores(q, 3, b, b, 1, 2, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "not a multiple"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, 0, b, b, 1, 1, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), ">= 1"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, 1, b, b, 1, 1, 0, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "d = 0"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, 1, b, b, -1, 1, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "negative"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(q, 1, b, b, 1, 1, 1, (ks_bound_reduce)7, o) == KS_ERR_ARG && has(ks_last_error(), "unknown reduce"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(NULL, 1, b, b, 1, 1, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "NULL"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores(NULL, 1, NULL, NULL, 0, 1, 1, KS_BOUND_NONE, NULL) == KS_OK, "no boxes: nothing to do");
    /* 0 * inf is NaN, and NaN wins a group max */
    float qi[2] = {0, 1}, li[2] = {-INFINITY, 0}, hi[2] = {INFINITY, 0};
    KT_CHECK(ks_cpu_bound_scores(qi, 2, li, hi, 1, 1, 1, KS_BOUND_GROUP_MAX, o) == KS_OK && isnan(o[0]), "NaN propagates: %g", o[0]);
}

/* ---------------------------------------------------------------- packed boxes */

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float lo_of(uint32_t b) { return bits_f(b << 16); }
static float hi_of(uint32_t b) { return bits_f(b & 0xffff0000u); }

KT_TEST(prims_page_box_rounding) {
    /* bf16 values are exact both ways; others go to the nearest bf16 below (down) / above (up) */
    KT_CHECK(ks_bf16_dir(1.5f, 1) == 0x3fc0 && ks_bf16_dir(1.5f, 0) == 0x3fc0, "1.5 is a bf16");
    float a = bits_f(0x3f800001u); /* 1 + 2^-23 */
    KT_CHECK(ks_bf16_dir(a, 1) == 0x3f80 && ks_bf16_dir(a, 0) == 0x3f81, "1 + ulp: down 1, up the next bf16");
    KT_CHECK(ks_bf16_dir(-a, 1) == 0xbf81 && ks_bf16_dir(-a, 0) == 0xbf80, "-(1 + ulp): down away from 0, up toward");
    KT_CHECK(ks_bf16_dir(3.4e38f, 0) == 0x7f80 && ks_bf16_dir(-3.4e38f, 1) == 0xff80, "past the largest bf16: +-inf");
    KT_CHECK(ks_bf16_dir(3.4e38f, 1) == 0x7f7f, "the largest finite bf16 below 3.4e38");
    KT_CHECK(ks_bf16_dir(INFINITY, 1) == 0x7f80 && ks_bf16_dir(-INFINITY, 0) == 0xff80, "infinities are exact");
    KT_CHECK(ks_bf16_dir(-0.0f, 1) == 0x8000 && ks_bf16_dir(0.0f, 0) == 0x0000, "zeros keep their sign");
    KT_CHECK(isnan(bits_f((uint32_t)ks_bf16_dir(bits_f(0x7f800001u), 1) << 16)), "a NaN whose payload is in the low half stays NaN");
    float tiny = bits_f(0x00000001u); /* the smallest subnormal */
    KT_CHECK(ks_bf16_dir(tiny, 1) == 0x0000 && ks_bf16_dir(tiny, 0) == 0x0001, "subnormals round outward too");
}

KT_TEST(prims_page_box_vs_minmax) {
    /* f32 rows: each box is the tightest bf16 interval around the exact min / max; bf16 rows
     * (strided, a cache laid out (h, capacity, d)): the box is the min / max exactly; bounds over
     * packed boxes equal those over their unpacked ends bit for bit, every reduce */
    int64_t H = 8, Hkv = 2, d = 24, n = 77, page = 8, np = ks_page_count(n, page), cap = 96;
    size_t nb = (size_t)np * Hkv * d;
    float *k = malloc(4 * n * Hkv * d), *q = malloc(4 * H * d), *lo = malloc(4 * nb), *hi = malloc(4 * nb);
    float *ul = malloc(4 * nb), *uh = malloc(4 * nb), *s0 = malloc(4 * H * np), *s1 = malloc(4 * H * np);
    uint32_t *box = malloc(4 * nb);
    uint16_t *kb = malloc(2 * (size_t)Hkv * cap * d);
    for (int64_t i = 0; i < n * Hkv * d; i++) k[i] = frnd();
    for (int64_t i = 0; i < H * d; i++) q[i] = frnd();
    KT_CHECK(ks_cpu_page_reduce(k, 0, n, Hkv, d, Hkv * d, d, page, 0, np, lo, hi, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_box(k, 0, n, Hkv, d, Hkv * d, d, page, 0, np, box) == KS_OK, "%s", ks_last_error());
    int tight = 1, inexact = 0;
    for (size_t i = 0; i < nb; i++) {
        float l = lo_of(box[i]), u = hi_of(box[i]);
        /* the next bf16 inward from each end is past the float end */
        float l_in = bits_f(((uint32_t)ks_bf16_dir(l, 0) + (l >= 0 ? 1u : (uint32_t)-1)) << 16);
        float u_in = bits_f(((uint32_t)ks_bf16_dir(u, 0) + (u > 0 ? (uint32_t)-1 : 1u)) << 16);
        if (!(l <= lo[i] && u >= hi[i]) || (l != lo[i] && !(l_in > lo[i])) || (u != hi[i] && !(u_in < hi[i]))) tight = 0;
        inexact += l != lo[i] || u != hi[i];
    }
    KT_CHECK(tight, "every f32 box holds the min / max and is the tightest bf16 box");
    KT_CHECK(inexact > (int)nb / 2, "random f32 keys round (%d of %zu boxes inexact): the rounding is exercised", inexact, nb);
    /* the same keys as a bf16 cache (h, capacity, d), read token-major */
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < Hkv; j++)
            for (int64_t c = 0; c < d; c++) kb[(j * cap + r) * d + c] = ks_bf16_dir(k[(r * Hkv + j) * d + c], 1);
    KT_CHECK(ks_cpu_page_reduce(kb, 1, n, Hkv, d, d, cap * d, page, 0, np, lo, hi, NULL) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_box(kb, 1, n, Hkv, d, d, cap * d, page, 0, np, box) == KS_OK, "%s", ks_last_error());
    int exact = 1;
    for (size_t i = 0; i < nb; i++) {
        ul[i] = lo_of(box[i]);
        uh[i] = hi_of(box[i]);
        exact = exact && f_bits(ul[i]) == f_bits(lo[i]) && f_bits(uh[i]) == f_bits(hi[i]);
    }
    KT_CHECK(exact, "bf16 rows: the packed box is the exact min / max");
    /* a NaN and infinities in some boxes: the packed bound keeps the float rule */
    box[3] = 0x7fc07fc0u;
    box[5] = 0x7f80ff80u;
    ul[3] = uh[3] = NAN;
    ul[5] = -INFINITY, uh[5] = INFINITY;
    const ks_bound_reduce reds[3] = {KS_BOUND_NONE, KS_BOUND_GROUP_MAX, KS_BOUND_GROUP_SUM};
    for (int r = 0; r < 3; r++) {
        int64_t rows = reds[r] == KS_BOUND_NONE ? H : Hkv;
        KT_CHECK(ks_cpu_bound_scores(q, H, ul, uh, np, Hkv, d, reds[r], s0) == KS_OK, "%s", ks_last_error());
        KT_CHECK(ks_cpu_bound_scores_box(q, H, box, np, Hkv, d, reds[r], s1) == KS_OK, "%s", ks_last_error());
        KT_CHECK(!memcmp(s0, s1, 4 * (size_t)(rows * np)), "reduce %d: packed bounds differ from their ends' bounds", r);
    }
    free(k); free(q); free(lo); free(hi); free(ul); free(uh); free(s0); free(s1); free(box); free(kb);
}

KT_TEST(prims_page_box_errors) {
    float x[8] = {0}, o[4], q[2] = {0};
    uint32_t b[8];
    KT_CHECK(ks_cpu_page_box(x, 0, 8, 1, 1, 1, 0, 2, 0, 4, NULL) == KS_ERR_ARG && has(ks_last_error(), "no output"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_box(x, 0, 8, 1, 1, 1, 0, 2, 0, 5, b) == KS_ERR_ARG && has(ks_last_error(), "pages [0, 5)"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores_box(q, 1, NULL, 1, 1, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "NULL"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores_box(q, 3, b, 1, 2, 1, KS_BOUND_NONE, o) == KS_ERR_ARG && has(ks_last_error(), "not a multiple"), "%s", ks_last_error());
    /* the table entries take one kind of box at a time */
    KT_CHECK(ks_cpu_page_reduce_entry(NULL, x, 0, 8, 1, 1, 1, 0, 2, 0, 4, o, NULL, NULL, b) == KS_ERR_ARG &&
                 has(ks_last_error(), "alone"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_bound_scores_entry(NULL, q, 1, x, x, b, 1, 1, 1, KS_BOUND_NONE, o) == KS_ERR_ARG &&
                 has(ks_last_error(), "not both"), "%s", ks_last_error());
}

KT_TEST(prims_page_rows_hand) {
    /* two lists of pages of 4 over 32 rows, with rows [0, 2) before and [28, 31) after */
    const int32_t pages[2][2] = {{1, 5}, {2, 3}};
    int32_t out[2][13];
    KT_CHECK(ks_cpu_page_rows(&pages[0][0], 2, 2, 4, 32, 0, 2, 28, 31, &out[0][0]) == KS_OK, "%s", ks_last_error());
    const int32_t want[2][13] = {{0, 1, 4, 5, 6, 7, 20, 21, 22, 23, 28, 29, 30}, {0, 1, 8, 9, 10, 11, 12, 13, 14, 15, 28, 29, 30}};
    KT_CHECK(!memcmp(out, want, sizeof out), "list 0: %d %d %d .. %d", out[0][0], out[0][1], out[0][2], out[0][12]);
    /* no ranges, k = 0 with a range only */
    int32_t o1[8];
    KT_CHECK(ks_cpu_page_rows(&pages[1][0], 1, 2, 4, 16, 0, 0, 0, 0, o1) == KS_OK && o1[0] == 8 && o1[7] == 15, "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(NULL, 1, 0, 4, 16, 0, 0, 12, 16, o1) == KS_OK && o1[0] == 12 && o1[3] == 15, "%s", ks_last_error());
}

KT_TEST(prims_page_rows_errors) {
    int32_t out[64];
    const int32_t bad_range[2] = {1, 4}, unsorted[2] = {3, 1}, neg[1] = {-1}, dup[2] = {2, 2};
    KT_CHECK(ks_cpu_page_rows(bad_range, 1, 2, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG &&
                 has(ks_last_error(), "page 4 at (list 0, position 1) out of range"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(unsorted, 1, 2, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "follows 3 (not ascending)"),
             "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(dup, 1, 2, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "follows 2"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(neg, 1, 1, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "page -1"), "%s", ks_last_error());
    /* a page overlapping the ranges: page 0 under before = [0, 2), page 3 over after = [12, 16) */
    const int32_t p0[1] = {0}, p3[1] = {3};
    KT_CHECK(ks_cpu_page_rows(p0, 1, 1, 4, 16, 0, 2, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "must lie in [2, 16)"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 4, 16, 0, 0, 12, 16, out) == KS_ERR_ARG && has(ks_last_error(), "must lie in [0, 12)"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 0, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "page = 0"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 4, 16, 0, 17, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "before = [0, 17)"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 4, 16, 0, 0, 9, 8, out) == KS_ERR_ARG && has(ks_last_error(), "after = [9, 8)"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 4, 16, 4, 8, 0, 2, out) == KS_ERR_ARG && has(ks_last_error(), "starts before the end"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 5, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "exceed the 16 rows"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, -1, 1, 4, 16, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "negative size"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, 4, (int64_t)INT32_MAX + 2, 0, 0, 0, 0, out) == KS_ERR_ARG && has(ks_last_error(), "int32"), "%s", ks_last_error());
    KT_CHECK(ks_cpu_page_rows(p3, 1, 1, INT64_MAX / 2, 16, 0, 0, 0, 0, out) == KS_ERR_ARG, "a huge page is refused: %s", ks_last_error());
}

KT_TEST(prims_page_rows_cpu_table_error_word) {
    /* the CPU table's entry (core/cpu_prims.c) reports a bad entry through the error word like a
     * device, and keeps argument errors as errors */
    const int32_t pages[2][2] = {{0, 2}, {3, 3}};
    int32_t out[16];
    int64_t err = -1;
    KT_CHECK(ks_cpu_page_rows_entry(NULL, &pages[0][0], 2, 2, 2, 8, 0, 0, 0, 0, out, &err) == KS_OK && err == 3,
             "error word %lld (expected 3: list 1, position 1)", (long long)err);
    err = -1;
    KT_CHECK(ks_cpu_page_rows_entry(NULL, &pages[0][0], 1, 2, 2, 8, 0, 0, 0, 0, out, &err) == KS_OK && err == -1 &&
                 out[0] == 0 && out[3] == 5, "a good list: error word %lld", (long long)err);
    KT_CHECK(ks_cpu_page_rows_entry(NULL, &pages[0][0], 1, 2, 0, 8, 0, 0, 0, 0, out, &err) == KS_ERR_ARG, "page = 0 is an error");
    KT_CHECK(ks_cpu_page_rows_entry(NULL, &pages[0][0], 2, 2, 2, 8, 0, 0, 0, 0, out, NULL) == KS_ERR_ARG &&
                 has(ks_last_error(), "page 3 at (list 1, position 1) follows 3"), "%s", ks_last_error());
}

/* ================================================================ the Lua bindings (lua/prims_page.c) */

/* Results and every argument error of ks.page_reduce / ks.bound_scores / ks.page_rows, in a host
 * state (the device paths run in policies/quest.test.lua, emulated, and tests/cuda). */
KT_TEST(prims_page_lua_bindings) {
    static const char *code =
        "local ks = require 'kvsieve'\n"
        "local function err(want, f, ...)\n"
        "  local ok, e = pcall(f, ...)\n"
        "  assert(not ok, 'no error, expected: ' .. want)\n"
        "  assert(tostring(e):find(want, 1, true), 'error \"' .. tostring(e) .. '\" lacks \"' .. want .. '\"')\n"
        "end\n"
        "local x = ks.tensor({{1, 2}, {3, -4}, {5, 6}}, 'f32')       -- (n = 3, d = 2)\n"
        "local lo, hi = ks.page_reduce(x, 2, 'minmax')\n"
        "assert(lo.shape[1] == 2 and lo.shape[2] == 2 and lo:item(0, 1) == -4 and hi:item(1, 0) == 5)\n"
        "assert(ks.page_reduce(x, 2, 'mean'):item(0, 0) == 2 and ks.page_reduce(x, 2, 'max', {pages = {-1, 2}}):item(0, 1) == 6)\n"
        "assert(ks.page_reduce(x:slice(1, 1, 2), 2, 'min'):item(0, 0) == -4)  -- a strided view, read in place\n"
        "err('page_reduce: x must be an f32 tensor', ks.page_reduce, ks.tensor({{1}}), 2, 'min')\n"
        "err('page_reduce: x must be (n, d) or (n, heads, d), got 1 dimensions', ks.page_reduce, ks.tensor({1.5}), 2, 'min')\n"
        "err('page_reduce: page = 0 must be >= 1', ks.page_reduce, x, 0, 'min')\n"
        "err('page_reduce: op must be', ks.page_reduce, x, 2, 'median')\n"
        "err(\"page_reduce: unknown option 'from' (options: pages)\", ks.page_reduce, x, 2, 'min', {from = 1})\n"
        "err('page_reduce: option pages = {0, 3} is not within [0, 2]', ks.page_reduce, x, 2, 'min', {pages = {0, 3}})\n"
        "local q = ks.tensor({{1, 0}, {0, 1}}, 'f32')\n"
        "local b = ks.tensor({{{0, 0}}, {{1, 1}}}, 'f32')\n"
        "assert(ks.bound_scores(q, b, b).shape[1] == 2 and ks.bound_scores(q:reshape(1, 2, 2), b, b, {reduce = 'group_sum'}):item(0, 1) == 2)\n"
        "err('bound_scores: q must be (n_heads, head_dim) or (1, n_heads, head_dim)', ks.bound_scores, ks.tensor({1.5}), b, b)\n"
        "err('bound_scores: lo and hi must be (n, n_kv_heads, head_dim)', ks.bound_scores, q, x, x)\n"
        "err('differ in shape', ks.bound_scores, q, b, ks.tensor({{{0, 0}}}, 'f32'))\n"
        "err('bound_scores: head_dim of q (2) and of the boxes (1) differ', ks.bound_scores, q, ks.tensor({{{0}}}, 'f32'), ks.tensor({{{0}}}, 'f32'))\n"
        "err('not a multiple of n_kv_heads', ks.bound_scores, ks.tensor({{1, 0}, {0, 1}, {1, 1}}, 'f32'), ks.tensor({{{0, 0}, {0, 0}}}, 'f32'), ks.tensor({{{0, 0}, {0, 0}}}, 'f32'))\n"
        "err('option reduce: \"none\", \"group_max\" or \"group_sum\", got max', ks.bound_scores, q, b, b, {reduce = 'max'})\n"
        "err('bound_scores: q, lo and hi must be f32 tensors', ks.bound_scores, ks.tensor({{1, 0}}), b, b)\n"
        "local y = ks.tensor({{{1, -0.5}}, {{3, 0}}, {{-2, 5}}, {{1.00001, 4}}}, 'f32')  -- (n = 4, h = 1, d = 2)\n"
        "local bx = ks.page_reduce(y, 2, 'box')\n"
        "assert(bx.dtype == 'i32' and bx.shape[1] == 2 and bx.shape[3] == 2 and y.storage == 'f32' and bx.storage == 'i32')\n"
        "assert(bx:item(0, 0, 0) == 0x40400000 | 0x3f80 and bx:item(0, 0, 1) == 0xbf00)  -- box (1, 3) and (-0.5, 0)\n"
        "assert(bx:item(1, 0, 0) & 0xffff == 0xc000 and bx:item(1, 0, 0) >> 16 == 0x3f81)  -- 1.00001 rounds up to 1.0078125\n"
        "local qb = ks.tensor({{1, 0}, {0, 1}}, 'f32')\n"
        "local sb = ks.bound_scores(qb, bx, {reduce = 'group_max'})\n"
        "assert(sb.shape[1] == 1 and sb:item(0, 0) == 3 and sb:item(0, 1) == 5)\n"
        "assert(ks.bound_scores(qb, bx):item(0, 1) == 1.0078125)\n"
        "err('page_reduce: op must be \"min\", \"max\", \"mean\", \"minmax\" or \"box\"', ks.page_reduce, y, 2, 'boxes')\n"
        "err('bound_scores: packed boxes take (q, box [, opts])', ks.bound_scores, qb, bx, bx)\n"
        "err('bound_scores: box must be (n, n_kv_heads, head_dim)', ks.bound_scores, qb, ks.tensor({{1, 2}}))\n"
        "err(\"bound_scores: unknown option 'reduse'\", ks.bound_scores, qb, bx, {reduse = 'none'})\n"
        "local r = ks.page_rows({{0, 2}, {1, 2}}, 2, 8, {after = {6, 8}})\n"
        "assert(table.concat(r:tolist()[2], ',') == '2,3,4,5,6,7' and ks.page_rows({1}, 3, 6).dtype == 'i32')\n"
        "err('page_rows: page 2 at (list 0, position 1) follows 2', ks.page_rows, {2, 2}, 2, 8)\n"
        "err('page_rows: page 3 at (list 0, position 0) out of range', ks.page_rows, {3}, 2, 8, {after = {6, 8}})\n"
        "err('page_rows: pages must be (k) or (lists, k)', ks.page_rows, ks.zeros({1, 1, 1}, 'i32'), 2, 8)\n"
        "err('page_rows: page = 0 must be >= 1', ks.page_rows, {1}, 0, 8)\n"
        "err('page_rows: n = -1 is negative', ks.page_rows, {1}, 2, -1)\n"
        "err('page_rows: option before = {0, 9} is not within [0, 8]', ks.page_rows, {1}, 2, 8, {before = {0, 9}})\n"
        "err('page_rows: option check must be a boolean', ks.page_rows, {1}, 2, 8, {check = 1})\n"
        "err(\"page_rows: unknown option 'tail'\", ks.page_rows, {1}, 2, 8, {tail = {6, 8}})\n";
    lua_State *L = ks_lua_host_state();
    KT_CHECK(L, "no Lua state");
    int rc = luaL_dostring(L, code);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc ? lua_tostring(L, -1) : "");
    ks_lua_host_close(L);
    KT_CHECK(rc == LUA_OK, "%s", msg);
}
