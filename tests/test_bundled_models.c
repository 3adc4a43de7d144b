/* test_bundled_models.c — the two bundled models (models/kvsieve-tiny, fine-tuned for GemFilter,
 * and models/kvsieve-tiny-base, its natural pre-trained checkpoint) against what their READMEs
 * say. Each README has a "| property | value |" table (parameters, model.safetensors bytes,
 * layers, hidden size, heads, head dim, FFN, vocabulary, context, RoPE theta); every row is read
 * from the README and compared with the loaded model, so a README that drifts from the files
 * fails here. Also: any "N M parameters" in the prose, each folder <= 50 MB, and the base being
 * the same config and tokenizer with other weights. Run from the repository root. */
#include "common.h"
#include "engine.h"
#include "ktest.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TINY "models/kvsieve-tiny"
#define BASE "models/kvsieve-tiny-base"
#define FOLDER_MAX_BYTES 50000000LL /* 50 MB, the bound per model folder */

static int have(const char *dir) {
    char p[512];
    struct stat s;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return stat(p, &s) == 0 && s.st_size > 1000;
}

static long long file_size(const char *dir, const char *name) {
    char p[512];
    struct stat s;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &s) == 0 ? (long long)s.st_size : -1;
}

static char *readme(const char *dir) {
    char p[512], *d = NULL;
    size_t n;
    snprintf(p, sizeof p, "%s/README.md", dir);
    return ks_read_file(p, &d, &n) == KS_OK ? d : NULL;
}

/* The value of table row `key` ("| key | value |", key matched exactly, case-sensitive): the
 * first number in the value cell, thousands commas allowed ("19,931,648"). 0 and *out set when
 * found, -1 when the row is missing, -2 when its cell has no number. */
static int table_value(const char *text, const char *key, double *out) {
    size_t kl = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *p = line;
        if (*p != '|') continue;
        p++;
        while (*p == ' ') p++;
        if (strncmp(p, key, kl)) continue;
        p += kl;
        while (*p == ' ') p++;
        if (*p != '|') continue;
        p++;
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        while (p < eol && !isdigit((unsigned char)*p)) p++;
        if (p == eol) return -2;
        char num[64];
        size_t n = 0;
        for (; p < eol && n + 1 < sizeof num && (isdigit((unsigned char)*p) || *p == ',' || *p == '.'); p++)
            if (*p != ',') num[n++] = *p;
        num[n] = 0;
        *out = strtod(num, NULL);
        return 0;
    }
    return -1;
}

/* Every "N M parameters" in the text (N a whole or decimal number): the first N that differs
 * from `want` (rounded to the precision written), or NAN when all agree; *count how many. */
static double prose_millions(const char *text, double params, int *count) {
    *count = 0;
    for (const char *p = strstr(text, " M parameters"); p; p = strstr(p + 1, " M parameters")) {
        const char *b = p;
        while (b > text && (isdigit((unsigned char)b[-1]) || b[-1] == '.')) b--;
        if (b == p) continue;
        double v = strtod(b, NULL);
        const char *dot = memchr(b, '.', p - b);
        double step = dot ? pow(10, -(double)(p - dot - 1)) : 1;
        (*count)++;
        if (fabs(params / 1e6 - v) > step / 2 + 1e-9) return v;
    }
    return NAN;
}

/* The README's table rows that state the config, each against the loaded model. */
static void check_config(kt_ctx *kt_, const char *dir) {
    if (!have(dir)) KT_SKIP("%s/model.safetensors absent", dir);
    char *text = readme(dir);
    KT_CHECK(text, "%s/README.md: %s", dir, ks_last_error());
    ks_model *m;
    ks_status st = ks_model_open(dir, "cpu", &m);
    if (st) free(text);
    KT_CHECK(st == KS_OK, "%s: %s", dir, ks_last_error());
    const struct { const char *key; double have; } rows[] = {
        {"layers", m->cfg.n_layers},
        {"hidden size", m->cfg.dim},
        {"query heads", m->cfg.n_heads},
        {"KV heads", m->cfg.n_kv_heads},
        {"head dim", m->cfg.head_dim},
        {"FFN", m->cfg.ffn},
        {"vocabulary", m->cfg.vocab},
        {"context (max positions)", m->cfg.max_pos},
        {"RoPE theta", m->cfg.rope.theta},
    };
    int bad = 0, tok_vocab = m->tok ? ks_tokenizer_vocab_size(m->tok) : -1;
    char why[512] = "";
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !bad; i++) {
        double v;
        int r = table_value(text, rows[i].key, &v);
        if (r) {
            snprintf(why, sizeof why, "README.md has %s \"| %s | ... |\" row", r == -1 ? "no" : "a numberless", rows[i].key);
            bad = 1;
        } else if (v != rows[i].have) {
            snprintf(why, sizeof why, "README.md says %s %g, config.json gives %g", rows[i].key, v, rows[i].have);
            bad = 1;
        }
    }
    ks_model_close(m);
    free(text);
    KT_CHECK(!bad, "%s: %s", dir, why);
    KT_CHECK(tok_vocab == (int)rows[6].have, "%s: tokenizer.json has %d tokens, config.json vocab_size %g", dir, tok_vocab,
             rows[6].have);
}

/* The stated sizes: the parameter count (table, exact; prose "N M parameters", rounded) and the
 * weight file's bytes. */
static void check_sizes(kt_ctx *kt_, const char *dir) {
    if (!have(dir)) KT_SKIP("%s/model.safetensors absent", dir);
    char *text = readme(dir);
    KT_CHECK(text, "%s/README.md: %s", dir, ks_last_error());
    ks_model *m;
    ks_status st = ks_model_open(dir, "cpu", &m);
    if (st) free(text);
    KT_CHECK(st == KS_OK, "%s: %s", dir, ks_last_error());
    double params = (double)m->n_params, stated = -1, bytes = -1;
    ks_model_close(m);
    int rp = table_value(text, "parameters", &stated), rb = table_value(text, "model.safetensors", &bytes), n_prose;
    double prose = prose_millions(text, params, &n_prose);
    free(text);
    KT_CHECK(rp == 0, "%s/README.md: no \"| parameters | N |\" row", dir);
    KT_CHECK(stated == params, "%s/README.md says %.0f parameters, the weights hold %.0f", dir, stated, params);
    KT_CHECK(n_prose > 0, "%s/README.md: no \"N M parameters\" in the text", dir);
    KT_CHECK(isnan(prose), "%s/README.md says %g M parameters, the weights hold %.3f M", dir, prose, params / 1e6);
    KT_CHECK(rb == 0, "%s/README.md: no \"| model.safetensors | N bytes |\" row", dir);
    long long sz = file_size(dir, "model.safetensors");
    KT_CHECK(bytes == (double)sz, "%s/README.md says model.safetensors is %.0f bytes, the file has %lld", dir, bytes, sz);
}

KT_TEST(bundled_tiny_readme_config) { check_config(kt_, TINY); }
KT_TEST(bundled_tiny_readme_sizes) { check_sizes(kt_, TINY); }
KT_TEST(bundled_base_readme_config) { check_config(kt_, BASE); }
KT_TEST(bundled_base_readme_sizes) { check_sizes(kt_, BASE); }

/* Each model folder, every file in it, at most 50 MB (what both READMEs promise). */
KT_TEST(bundled_folders_at_most_50mb) {
    const char *dirs[] = {TINY, BASE};
    for (int i = 0; i < 2; i++) {
        if (!have(dirs[i])) KT_SKIP("%s/model.safetensors absent", dirs[i]);
        DIR *d = opendir(dirs[i]);
        KT_CHECK(d, "%s: cannot list", dirs[i]);
        long long total = 0;
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                long long s = file_size(dirs[i], e->d_name);
                if (s > 0) total += s;
            }
        closedir(d);
        KT_CHECK(total <= FOLDER_MAX_BYTES, "%s holds %lld bytes, more than 50 MB", dirs[i], total);
    }
}

static int same_bytes(const char *a, const char *b, const char *name) {
    char pa[512], pb[512], *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    int r = ks_read_file(pa, &da, &na) == KS_OK && ks_read_file(pb, &db, &nb) == KS_OK && na == nb && !memcmp(da, db, na);
    free(da);
    free(db);
    return r;
}

/* The base README's claim: identical config and tokenizer files, other weights (and the same
 * tensors, so every policy runs on both unchanged). */
KT_TEST(bundled_base_same_config_other_weights) {
    if (!have(TINY) || !have(BASE)) KT_SKIP("a bundled model is absent");
    const char *same[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 4; i++) KT_CHECK(same_bytes(TINY, BASE, same[i]), "%s differs between %s and %s", same[i], TINY, BASE);
    KT_CHECK(!same_bytes(TINY, BASE, "model.safetensors"), "%s and %s have the same weights", TINY, BASE);
    ks_model *a, *b;
    KT_CHECK(ks_model_open(TINY, "cpu", &a) == KS_OK, "%s", ks_last_error());
    ks_status st = ks_model_open(BASE, "cpu", &b);
    if (st) ks_model_close(a);
    KT_CHECK(st == KS_OK, "%s", ks_last_error());
    size_t pa = a->n_params, pb = b->n_params;
    ks_model_close(a);
    ks_model_close(b);
    KT_CHECK(pa == pb, "parameter counts differ: %zu vs %zu", pa, pb);
}

/* Each README says how its model was made: the base names its commit and the absence of the
 * GemFilter objective, the fine-tuned one its objective and where the base is. */
KT_TEST(bundled_readmes_say_how_made) {
    char *t = readme(TINY), *b = readme(BASE);
    int ok_t = t && strstr(t, "--gemfilter-ft") && strstr(t, "kvsieve-tiny-base") && strstr(t, "1d70f22");
    int ok_b = b && strstr(b, "1d70f22") && strstr(b, "No GemFilter objective") && strstr(b, "tools/train/train.py");
    free(t);
    free(b);
    KT_CHECK(ok_t, TINY "/README.md: must name the fine-tuning (--gemfilter-ft), its base (1d70f22, kvsieve-tiny-base)");
    KT_CHECK(ok_b, BASE "/README.md: must name its commit (1d70f22), its recipe (tools/train/train.py) and \"No GemFilter objective\"");
}
