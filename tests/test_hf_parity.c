/* test_hf_parity.c — logits parity with HF transformers on committed fixtures.
 *
 * tests/fixtures/hf/<case>/ holds a random-initialised model saved by transformers and
 * logits.json (last-position logits, greedy continuations with their top logits, all positions
 * of one prompt), made by tools/hf_fixtures.py on the GPU machine (regenerate with
 * `python3 tools/hf_fixtures.py --out DIR --tar-only`, then untar into tests/fixtures/hf).
 * Every case runs twice: with the transformers-5 config.json and the transformers-4 layout
 * (config.v4.json). Tolerance: max |ours - HF| / max |HF| <= 1e-4 (float32 compute). */
#include "engine.h"
#include "json.h"
#include "ktest.h"
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FIXDIR "tests/fixtures/hf"

static double rel_err(const float *ours, const ks_json *ref, int n) {
    double md = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        double r = ref->items[i].num;
        md = fmax(md, fabs(ours[i] - r));
        mr = fmax(mr, fabs(r));
    }
    return mr > 0 ? md / mr : md;
}

static int load_ids(const ks_json *arr, int32_t *ids, int cap) {
    int n = (int)arr->len;
    if (n > cap) return -1;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)arr->items[i].inum;
    return n;
}

/* Run one case from model folder dir against ref; returns 0 or fills msg. */
static int check_case(const char *dir, const ks_json *ref, char *msg, size_t msz) {
    ks_model *m;
    if (ks_model_open(dir, "cpu", &m)) { snprintf(msg, msz, "load: %s", ks_last_error()); return -1; }
    ks_session *s;
    ks_session_create(m, &s);
    int V = m->cfg.vocab, rc = 0;
    const ks_json *prompts = ks_json_get(ref, "prompts"), *last = ks_json_get(ref, "last_logits");
    const ks_json *greedy = ks_json_get(ref, "greedy"), *gtop = ks_json_get(ref, "greedy_top");
    const ks_json *checks = ks_json_get(ref, "checks");
    int greedy_after_switch = ks_json_bool(checks, "greedy_past_longrope_switch_comparable", 1);
    int orig = m->cfg.rope.type == KS_ROPE_LONGROPE ? m->cfg.rope.orig_max_pos : 1 << 30;
    int32_t ids[512];
    double worst = 0;
    for (size_t p = 0; p < prompts->len && !rc; p++) {
        int n = load_ids(&prompts->items[p], ids, 512);
        ks_session_reset(s);
        if (ks_session_prefill(s, ids, n)) { snprintf(msg, msz, "prompt %zu: %s", p, ks_last_error()); rc = -1; break; }
        double e = rel_err(s->logits, &last->items[p], V);
        worst = fmax(worst, e);
        if (e > 1e-4) { snprintf(msg, msz, "prompt %zu (len %d): last logits rel err %.3g > 1e-4", p, n, e); rc = -1; break; }
        /* greedy continuation: ids and the top logits at every step */
        const ks_json *g = &greedy->items[p];
        for (size_t t = 0; t < g->len; t++) {
            if (!greedy_after_switch && n + (int)t + 1 > orig) break;
            int32_t best = 0;
            for (int i = 1; i < V; i++) if (s->logits[i] > s->logits[best]) best = i;
            const ks_json *top = &gtop->items[p].items[t];
            for (size_t k = 0; k < top->len; k++) {
                int id = (int)top->items[k].items[0].inum;
                double want = top->items[k].items[1].num;
                if (fabs(s->logits[id] - want) > 1e-4 * fmax(1.0, fabs(want)) * 10) {
                    snprintf(msg, msz, "prompt %zu step %zu: logit[%d] %.6g vs HF %.6g", p, t, id, s->logits[id], want);
                    rc = -1;
                }
            }
            if (rc) break;
            if (best != g->items[t].inum) {
                snprintf(msg, msz, "prompt %zu step %zu: greedy id %d vs HF %lld", p, t, best, (long long)g->items[t].inum);
                rc = -1;
                break;
            }
            if (t + 1 < g->len && ks_session_decode(s, best)) { snprintf(msg, msz, "decode: %s", ks_last_error()); rc = -1; break; }
        }
    }
    /* every prefix of one prompt */
    const ks_json *all = ks_json_get(ref, "all_logits");
    if (!rc && all) {
        int n = load_ids(&prompts->items[ks_json_int(ref, "all_logits_prompt", 0)], ids, 512);
        for (int i = 0; i < n && i < (int)all->len && !rc; i++) {
            ks_session_reset(s);
            if (ks_session_prefill(s, ids, i + 1)) { snprintf(msg, msz, "prefix: %s", ks_last_error()); rc = -1; break; }
            double e = rel_err(s->logits, &all->items[i], V);
            worst = fmax(worst, e);
            if (e > 1e-4) { snprintf(msg, msz, "prefix %d: rel err %.3g", i + 1, e); rc = -1; }
        }
    }
    if (!rc) snprintf(msg, msz, "worst rel err %.2g", worst);
    ks_session_free(s);
    ks_model_close(m);
    return rc;
}

/* A folder mirroring `src` with config.v4.json as config.json (symlinks). */
static int v4_mirror(const char *src, char *out, size_t n) {
    if (kt_tmpdir(out, n)) return -1;
    DIR *d = opendir(src);
    if (!d) return -1;
    struct dirent *e;
    char a[2048], b[2048], cwd[512];
    if (!getcwd(cwd, sizeof cwd)) { closedir(d); return -1; }
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "config.json")) continue;
        snprintf(a, sizeof a, "%s/%s/%s", cwd, src, e->d_name);
        snprintf(b, sizeof b, "%s/%s", out, !strcmp(e->d_name, "config.v4.json") ? "config.json" : e->d_name);
        if (symlink(a, b)) { closedir(d); return -1; }
    }
    closedir(d);
    return 0;
}

KT_TEST(hf_logits_parity_all_cases) {
    DIR *d = opendir(FIXDIR);
    KT_CHECK(d, "fixtures folder %s is missing", FIXDIR);
    struct dirent *e;
    int cases = 0, failed = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512], path[600];
        snprintf(dir, sizeof dir, FIXDIR "/%s", e->d_name);
        snprintf(path, sizeof path, "%s/logits.json", dir);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        char *text;
        size_t len;
        KT_CHECK(ks_read_file(path, &text, &len) == KS_OK, "%s", ks_last_error());
        ks_json *ref = ks_json_parse(text, len);
        free(text);
        KT_CHECK(ref, "%s: %s", path, ks_last_error());
        KT_CHECK(ks_json_int(ref, "version", 0) == 1, "%s: unknown fixture version", path);
        char msg[512], msg4[512] = "", v4[256] = "";
        int r = check_case(dir, ref, msg, sizeof msg), r4 = 0;
        snprintf(path, sizeof path, "%s/config.v4.json", dir);
        if (stat(path, &st) == 0 && v4_mirror(dir, v4, sizeof v4) == 0) {
            r4 = check_case(v4, ref, msg4, sizeof msg4);
            kt_rmdir(v4);
        }
        fprintf(stderr, "\n    %-20s %s %s | v4 config: %s", e->d_name, r ? "FAIL" : "ok", msg, r4 ? msg4 : (msg4[0] ? "ok" : "-"));
        failed += (r != 0) + (r4 != 0);
        cases++;
        ks_json_free(ref);
    }
    closedir(d);
    fprintf(stderr, "\n  ");
    KT_CHECK(cases >= 9, "only %d fixture cases found", cases);
    KT_CHECK(failed == 0, "%d of %d cases differ from HF transformers", failed, cases);
}
