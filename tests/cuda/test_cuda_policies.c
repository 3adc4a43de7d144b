/* test_cuda_policies.c — every policy in policies/ on the CUDA backend, with its primitives on
 * the GPU (device tensors, lua/ks_lua.h), against the same policy with its primitives on the
 * CPU (_device = "host": host copies of the device buffers, the path used before device
 * tensors), and against the CPU backend.
 *
 *   A. CUDA, device primitives vs CUDA, host primitives: the same forward pass, so the same q,
 *      k and KV rows; index primitives are identical on both sides and floats agree to
 *      rounding, so the kept sets, restarts, propagated rows, reports and generated ids must be
 *      identical. A set that differs only by a few rows (>= 95% overlap: a near tie decided by
 *      a last-bit difference of a float sum) is reported as "near" and passes; anything else
 *      fails.
 *   B. CUDA (device primitives) vs the CPU backend: informational. The CUDA forward keeps
 *      weights and KV in bf16, so scores differ by ~1e-3 and near ties can go either way; the
 *      overlap of the kept sets is printed.
 * Plus the prefill time of each CUDA run (host vs device primitives) at the longer lengths.
 *
 * Models: models/kvsieve-tiny (in the repository; 8 layers, 2 KV heads, 16K positions) and
 * stories260K (.data/stories260K, ../shared/models/stories260K, or --stories DIR; skipped if
 * absent). Run from the repository root:
 *   build-cuda/test_cuda_policies [--quick] [--only NAME] [--stories DIR] [--long N]
 * --long N: the kvsieve-tiny cases at N prompt tokens too (default 4096; 0 = off; --quick: off).
 * Prints one line per case and "N passed, N failed"; exits 1 on a failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "forward.h"
#include "ks_lua.h"
#include "kvsieve.h"
#include "ks_cuda.h"
#include "policy_lua.h"
#include "seg_policies.h"

static int g_pass, g_fail;
static const char *g_only;

static void result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void result(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %-58s ", ok ? "  ok  " : "  FAIL", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

static int is_dir(const char *p) {
    struct stat st;
    return !stat(p, &st) && S_ISDIR(st.st_mode);
}

/* ================================================================ one request */

#define MAXL 32
#define MAXH 8

typedef struct run {
    ks_status st;
    char err[2048];
    int32_t ids[64];
    int n_ids;
    int n_layers, n_kv;
    int kept_n[MAXL][MAXH];
    int32_t *kept[MAXL][MAXH];
    int prop[MAXL];
    int n_restart;
    int32_t *restart;
    char reports[16384];
    double t_prefill;
    ks_lpol_devstats ds;
} run;

static void run_free(run *r) {
    for (int l = 0; l < MAXL; l++)
        for (int h = 0; h < MAXH; h++) free(r->kept[l][h]);
    free(r->restart);
}

static void run_policy(ks_model *m, const char *name, const char *params, const char *mode, const int32_t *prompt, int n,
                       int max_new, run *r) {
    memset(r, 0, sizeof *r);
    ks_policy *p = NULL;
    ks_session *s = NULL;
    r->st = ks_policy_load(m, name, &p);
    char kv[1024];
    snprintf(kv, sizeof kv, "%s", params);
    for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !r->st && tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        r->st = ks_policy_set(p, tok, eq + 1);
    }
    if (!r->st) r->st = ks_policy_set(p, "_device", mode);
    if (!r->st) r->st = ks_session_create(m, &s);
    if (!r->st) {
        ks_session_set_policy(s, p);
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = max_new;
        r->st = ks_generate_ids(s, prompt, n, &o, NULL, NULL);
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", ks_last_error());
    if (!r->st) {
        r->t_prefill = s->t_prefill;
        const int32_t *ids = ks_result_ids(s, &r->n_ids);
        if (r->n_ids > 64) r->n_ids = 64;
        memcpy(r->ids, ids, sizeof(int32_t) * r->n_ids);
        r->n_layers = m->cfg.n_layers < MAXL ? m->cfg.n_layers : MAXL;
        r->n_kv = m->cfg.n_kv_heads < MAXH ? m->cfg.n_kv_heads : MAXH;
        for (int l = 0; l < r->n_layers; l++) {
            for (int h = 0; h < r->n_kv; h++) {
                const int32_t *pos;
                r->kept_n[l][h] = ks_result_kept(s, l, h, &pos);
                r->kept[l][h] = malloc(sizeof(int32_t) * (r->kept_n[l][h] + 1));
                if (r->kept[l][h] && r->kept_n[l][h] > 0) memcpy(r->kept[l][h], pos, sizeof(int32_t) * r->kept_n[l][h]);
            }
            r->prop[l] = s->prop_layer_n ? s->prop_layer_n[l] : -1;
        }
        const int32_t *ri;
        r->n_restart = ks_result_restart(s, &ri);
        if (r->n_restart > 0) {
            r->restart = malloc(sizeof(int32_t) * r->n_restart);
            if (r->restart) memcpy(r->restart, ri, sizeof(int32_t) * r->n_restart);
        }
        for (int i = 0; i < ks_policy_n_reports(p); i++) {
            size_t at = strlen(r->reports);
            const char *k = ks_policy_report_key(p, i);
            snprintf(r->reports + at, sizeof r->reports - at, "%s=%s;", k, ks_policy_report(p, k));
        }
    }
    if (p) ks_lpol_dev_stats(p, &r->ds);
    ks_session_free(s);
    ks_policy_free(p);
}

/* |a & b| / max(|a|, |b|) of two ascending position lists (1 when both are empty) */
static double overlap(const int32_t *a, int na, const int32_t *b, int nb) {
    if (na == 0 && nb == 0) return 1;
    int i = 0, j = 0, c = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j]) { c++; i++; j++; }
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return (double)c / (na > nb ? na : nb);
}

typedef struct cmp {
    int identical;          /* everything equal */
    int ids_equal, n_ids;   /* generated ids equal up to the first difference */
    int sets, sets_equal;   /* (layer, head) kept sets compared / equal */
    double min_overlap, mean_overlap;
    int restart_equal, prop_equal, reports_equal;
} cmp;

static void compare(const run *a, const run *b, cmp *c) {
    memset(c, 0, sizeof *c);
    c->n_ids = a->n_ids;
    while (c->ids_equal < a->n_ids && c->ids_equal < b->n_ids && a->ids[c->ids_equal] == b->ids[c->ids_equal]) c->ids_equal++;
    c->min_overlap = 1;
    double sum = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv; h++) {
            c->sets++;
            int same = a->kept_n[l][h] == b->kept_n[l][h] &&
                       !memcmp(a->kept[l][h], b->kept[l][h], sizeof(int32_t) * (size_t)a->kept_n[l][h]);
            c->sets_equal += same;
            double o = same ? 1 : overlap(a->kept[l][h], a->kept_n[l][h], b->kept[l][h], b->kept_n[l][h]);
            sum += o;
            if (o < c->min_overlap) c->min_overlap = o;
        }
    c->mean_overlap = c->sets ? sum / c->sets : 1;
    c->restart_equal = a->n_restart == b->n_restart &&
                       (a->n_restart <= 0 || !memcmp(a->restart, b->restart, sizeof(int32_t) * a->n_restart));
    c->prop_equal = !memcmp(a->prop, b->prop, sizeof a->prop);
    c->reports_equal = !strcmp(a->reports, b->reports);
    c->identical = c->ids_equal == a->n_ids && a->n_ids == b->n_ids && c->sets_equal == c->sets && c->restart_equal &&
                   c->prop_equal && c->reports_equal;
}

/* ================================================================ the cases */

typedef struct pcase {
    const char *name, *params;
} pcase;

static void run_cases(const char *label, ks_model *gpu, ks_model *cpu, const pcase *cases, int n_cases, const int32_t *prompt,
                      int n, int max_new) {
    for (int c = 0; c < n_cases; c++) {
        char title[256];
        snprintf(title, sizeof title, "%s n=%d %s %s", label, n, cases[c].name, cases[c].params);
        if (g_only && !strstr(title, g_only)) continue;
        run dev, host, ref;
        run_policy(gpu, cases[c].name, cases[c].params, "auto", prompt, n, max_new, &dev);
        run_policy(gpu, cases[c].name, cases[c].params, "host", prompt, n, max_new, &host);
        run_policy(cpu, cases[c].name, cases[c].params, "host", prompt, n, max_new, &ref);
        if (dev.st || host.st || ref.st) {
            result(0, title, "cuda device: %s | cuda host: %s | cpu: %s", dev.st ? dev.err : "ok", host.st ? host.err : "ok",
                   ref.st ? ref.err : "ok");
        } else {
            cmp a, b;
            compare(&dev, &host, &a);
            compare(&dev, &ref, &b);
            int near = !a.identical && a.min_overlap >= 0.95 && a.restart_equal && a.prop_equal;
            char why[512] = "";
            if (!a.identical)
                snprintf(why, sizeof why, " [vs host prims: %s ids %d/%d, sets %d/%d equal (min overlap %.3f), restart %s, rows %s, reports %s]",
                         near ? "NEAR" : "DIFFER", a.ids_equal, a.n_ids, a.sets_equal, a.sets, a.min_overlap,
                         a.restart_equal ? "=" : "!=", a.prop_equal ? "=" : "!=", a.reports_equal ? "=" : "!=");
            result(a.identical || near, title,
                   "%s; prefill %.3f s (host prims %.3f s); %ld device tensors, %ld downloads, peak %.1f MB; vs CPU: ids %d/%d, sets %d/%d equal, overlap mean %.3f min %.3f%s",
                   a.identical ? "identical to host prims" : near ? "near" : "DIFFERENT", dev.t_prefill, host.t_prefill, dev.ds.allocs,
                   dev.ds.downloads, dev.ds.peak / 1048576.0, b.ids_equal, b.n_ids, b.sets_equal, b.sets, b.mean_overlap, b.min_overlap, why);
        }
        run_free(&dev);
        run_free(&host);
        run_free(&ref);
    }
}

static void make_prompt(int32_t *p, int n, int vocab, int bos, uint64_t seed) {
    uint64_t x = seed;
    p[0] = bos;
    for (int i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = 3 + (int32_t)(x % (uint64_t)(vocab - 3));
    }
}

/* ================================================================ the KV ring: graph vs plain launches
 * Rolling StreamingLLM declares a KV ring (core/policy.h): its decode steps overwrite each full
 * layer's oldest row after the sinks and replay as the recorded graph. Against the same request
 * on a CUDA model with graphs off (the same kernels launched one by one), teacher-forced (every
 * run decodes the plain ring run's greedy ids):
 *   - the logits bit for bit at every step: a ring layer's key count is constant, so the
 *     recorded attention has the plain launch's count and split-KV partition, and the q|k|v
 *     kernel writes the same row (recorded slot + delta against the slot by value);
 *   - the kept rows after the end identical, and the graph run (recorded anew at each wrap of
 *     the ring and when a layer fills).
 * Printed beside, informational: the same comparison for static StreamingLLM (no ring: the cache
 * grows, and a recorded step keeps the split-KV partition of its recording while a plain step
 * picks one for its own count: past 128 keys a layer the two sum in different orders), plain
 * vs plain (run to run), and the compacting path's free-running ids (the policy's decode_qkv
 * handler without the ring: attention over the rows in another order) against the ring's. */
static const char *RING_SRC =
    "local ks = require 'kvsieve'\n"
    "local function keep(rows, p) return ks.concat(ks.arange(0, p.sinks), ks.arange(rows - (p.budget - p.sinks), rows)) end\n"
    "return { name = 'compacting', params = { budget = 48, sinks = 4 },\n"
    "  prefill_qkv = function(ev, p) local rows = ev.kv_rows[1] + ev.n\n"
    "    if rows > p.budget then ev:retain(keep(rows, p)) end end,\n"
    "  decode_qkv = function(ev, p) local rows = ev.kv_rows[1]\n"
    "    if rows > p.budget then local k = keep(rows, p); ev:attend(k); ev:retain(k) end end }\n";

#define RING_STEPS 256
typedef struct ring_run {
    int32_t ids[RING_STEPS];
    int n, graph_steps;
    float *lg;       /* (n, vocab) */
    int32_t *kept;   /* (n_layers, n_kv_heads, budget) after the end */
} ring_run;

static void ring_run_free(ring_run *r) { free(r->lg); free(r->kept); }

/* prompt (n) then `steps` steps decoding force[t] (NULL: greedy); kind "ring" (streamingllm
 * rolling), "static" (streamingllm, no rolling) or "compact" (RING_SRC) */
static int ring_run_one(ks_model *m, const char *kind, int budget, int sinks, const int32_t *prompt, int n, int steps,
                        const int32_t *force, ring_run *r) {
    ks_session *s = NULL;
    ks_policy *p = NULL;
    char b[16], sk[16];
    snprintf(b, sizeof b, "%d", budget);
    snprintf(sk, sizeof sk, "%d", sinks);
    int vocab = m->cfg.vocab, nl = m->cfg.n_layers, nh = m->cfg.n_kv_heads;
    memset(r, 0, sizeof *r);
    r->lg = calloc((size_t)steps * vocab, sizeof(float));
    r->kept = calloc((size_t)nl * nh * budget, sizeof(int32_t));
    int compact = !strcmp(kind, "compact");
    ks_status st = compact ? ks_policy_load_string(m, "compacting", RING_SRC, &p) : ks_policy_load(m, "streamingllm", &p);
    if (!st) st = ks_policy_set(p, "budget", b);
    if (!st) st = ks_policy_set(p, "sinks", sk);
    if (!st && !compact) st = ks_policy_set(p, "rolling", strcmp(kind, "ring") ? "false" : "true");
    if (!st) st = ks_session_create(m, &s);
    if (!st) st = ks_session_set_policy(s, p);
    if (!st) st = ks_session_prefill(s, prompt, n);
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int t = 0; !st && t < steps && t < RING_STEPS; t++) {
        r->ids[t] = force ? force[t] : ks_sample(&g, s->logits, vocab);
        st = ks_session_decode(s, r->ids[t]);
        if (!st) memcpy(r->lg + (size_t)t * vocab, s->logits, sizeof(float) * vocab);
        r->n = t + 1;
    }
    if (!st) st = ks_ring_restore_all(s); /* a generation's end: the rows in order */
    for (int l = 0; !st && l < nl; l++)
        for (int h = 0; h < nh; h++) {
            const int32_t *pos;
            int k = ks_result_kept(s, l, h, &pos);
            memcpy(r->kept + ((size_t)l * nh + h) * budget, pos, sizeof(int32_t) * (k < budget ? k : budget));
        }
    if (s) r->graph_steps = s->graph_steps;
    if (st) printf("         %s: %s\n", kind, ks_last_error());
    ks_session_free(s);
    ks_policy_free(p);
    return st ? -1 : 0;
}

/* The largest |a - b| over both runs' logits, how many steps' argmaxes agree, and the first step
 * whose logits are not bit-equal (steps: none). */
static float ring_diff(const ring_run *a, const ring_run *b, int steps, int vocab, int *same_argmax, int *first) {
    float d = 0;
    *same_argmax = 0;
    *first = steps;
    for (int t = 0; t < steps; t++) {
        const float *x = a->lg + (size_t)t * vocab, *y = b->lg + (size_t)t * vocab;
        if (*first == steps && memcmp(x, y, sizeof(float) * vocab)) *first = t;
        int ax = 0, ay = 0;
        for (int i = 0; i < vocab; i++) {
            float e = fabsf(x[i] - y[i]);
            if (e > d || e != e) d = e != e ? INFINITY : e;
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        *same_argmax += ax == ay;
    }
    return d;
}

/* The model of dir on the CUDA backend twice: with decode graphs (the default) and without
 * (plain launches). -1 (a failed result named `name`, nothing left open) when either fails. */
static int open_graph_pair(const char *dir, const char *name, ks_model **mg, ks_model **mp) {
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.backend = "cuda";
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    t.graphs = KS_OFF;
    *mg = *mp = NULL;
    if (ks_model_open(dir, "cuda", mg) || ks_model_open_tuned(dir, &o, &t, mp)) {
        result(0, name, "open: %s", ks_last_error());
        ks_model_close(*mg);
        *mg = NULL;
        return -1;
    }
    return 0;
}

static void ring_graph_case(const char *dir, int budget, int sinks, int n, int steps) {
    char name[128];
    snprintf(name, sizeof name, "%s ring budget=%d sinks=%d prompt %d, %d steps", dir, budget, sinks, n, steps);
    if (g_only && !strstr(name, g_only)) return;
    if (steps > RING_STEPS) steps = RING_STEPS;
    ks_model *mg = NULL, *mp = NULL;
    if (open_graph_pair(dir, name, &mg, &mp)) return;
    int32_t *prompt = malloc(sizeof(int32_t) * n);
    make_prompt(prompt, n, mg->cfg.vocab, mg->cfg.bos, 0x2545F4914F6CDD1Dull);
    ring_run pl, g, p2, sg, sp, cp;
    memset(&g, 0, sizeof g); memset(&p2, 0, sizeof p2); memset(&sg, 0, sizeof sg); memset(&sp, 0, sizeof sp); memset(&cp, 0, sizeof cp);
    int e = ring_run_one(mp, "ring", budget, sinks, prompt, n, steps, NULL, &pl);
    if (!e) {
        e |= ring_run_one(mg, "ring", budget, sinks, prompt, n, steps, pl.ids, &g);
        e |= ring_run_one(mp, "ring", budget, sinks, prompt, n, steps, pl.ids, &p2);
        e |= ring_run_one(mg, "static", budget, sinks, prompt, n, steps, pl.ids, &sg);
        e |= ring_run_one(mp, "static", budget, sinks, prompt, n, steps, pl.ids, &sp);
        e |= ring_run_one(mg, "compact", budget, sinks, prompt, n, steps, NULL, &cp);
    }
    int vocab = mg->cfg.vocab;
    size_t kn = (size_t)mg->cfg.n_layers * mg->cfg.n_kv_heads * budget;
    if (e || pl.n != steps) result(0, name, "a run failed");
    else {
        float scale = 0;
        for (size_t i = 0; i < (size_t)steps * vocab; i++) scale = fmaxf(scale, fabsf(pl.lg[i]));
        int am_g, am_p2, am_s, f_g, f_p2, f_s, agree = 0;
        float d_g = ring_diff(&g, &pl, steps, vocab, &am_g, &f_g), d_p2 = ring_diff(&p2, &pl, steps, vocab, &am_p2, &f_p2);
        float d_s = ring_diff(&sg, &sp, steps, vocab, &am_s, &f_s);
        while (agree < steps && cp.ids[agree] == pl.ids[agree]) agree++;
        int same_kept = !memcmp(g.kept, pl.kept, sizeof(int32_t) * kn);
        int wraps = (steps - (budget - (n < budget ? n : budget))) / (budget - sinks); /* ring re-recordings */
        int graphs_ok = (g.graph_steps >= steps - 2 * (wraps + 2) || budget - sinks == 1) && g.graph_steps > 0 &&
                        pl.graph_steps == 0;
        result(f_g == steps && same_kept && graphs_ok && mp->be->graph_begin == NULL && !strcmp(mp->be->name, "cuda"), name,
               "graph vs plain: logits bit-equal %s (first difference at step %d of %d, max |dlogit| %.3g, argmax %d/%d); "
               "static, informational: bit-equal until step %d (max %.3g, argmax %d/%d); plain vs plain until step %d "
               "(max %.3g); max |logit| %.3g; kept %s; graph steps %d of %d (plain %d); compacting path: first %d ids agree",
               f_g == steps ? "yes" : "NO", f_g, steps, d_g, am_g, steps, f_s, d_s, am_s, steps, f_p2, d_p2, scale,
               same_kept ? "equal" : "DIFFER", g.graph_steps, steps, pl.graph_steps, agree);
    }
    ring_run_free(&pl); ring_run_free(&g); ring_run_free(&p2); ring_run_free(&sg); ring_run_free(&sp); ring_run_free(&cp);
    free(prompt);
    ks_model_close(mg);
    ks_model_close(mp);
}

/* ================================================================ a decode handler between graph segments
 * A step whose policy handles decode_qkv is recorded as segments with the handler run on the host
 * between them (core/decode.c, decode_segments). Each policy below runs twice from the same
 * prompt with the same forced ids: on the CUDA backend with graphs (segments) and without
 * (plain launches). Checked: the logits bit for bit at every step (the kernels are the same;
 * the contexts stay under the split-KV change at 128 keys), the reports equal, and how many steps
 * replayed: a handler that never acts replays every step but the first two (a plain step, then
 * the recording); one that acts at some steps replays the others. TokenSelect's default declares
 * replay (policy.h ks_action_replay): its handlers are recorded with the step once sparse and
 * replayed without Lua (their scores and top-k growing with the rows), still bit-equal. */
static const char *SEG_READER =
    "local ks = require 'kvsieve'\n"
    "local step = 0\n"
    "return { name = 'reader',\n"
    "  decode_qkv = function(ev)\n"
    "    if ev.layer == 0 then step = step + 1 end\n"
    "    if ev.layer == 1 then ev:report('q1', string.format('%.6g', ks.sum(ev.q))) end\n"
    "  end }\n";
typedef struct seg_run {
    int n, graph_steps, joined_steps;
    int prog; /* programmatic edges the backend's joins made (kernels/cuda_graph.cu graph_inline) */
    int pf;   /* of their list attentions, those given the o-projection's prefetch */
    long long replayed; /* layer steps whose recorded handler replayed (policy.h ks_action_replay) */
    float *lg;
    char rep[160];
} seg_run;

static int seg_run_one(ks_model *m, const char *name, const char *src, const char *params, const int32_t *prompt, int n,
                       int steps, const int32_t *force, int32_t *ids_out, seg_run *r) {
    ks_session *s = NULL;
    ks_policy *p = NULL;
    int vocab = m->cfg.vocab;
    memset(r, 0, sizeof *r);
    r->lg = calloc((size_t)steps * vocab, sizeof(float));
    ks_status st = src ? ks_policy_load_string(m, name, src, &p) : ks_policy_load(m, name, &p);
    if (!st && p) st = seg_set_params(p, params);
    if (!st) st = ks_session_create(m, &s);
    if (!st) st = ks_session_set_policy(s, p);
    if (!st) st = ks_session_prefill(s, prompt, n);
    ks_sampler g;
    ks_sampler_init(&g, 0, 1, 0);
    for (int t = 0; !st && t <= steps; t++) {
        int32_t id = t == steps ? 0 : force ? force[t] : ks_sample(&g, s->logits, vocab);
        st = seg_fire_token(s, id); /* as ks_generate fires it: the policy counts then */
        if (st || t == steps) break;
        if (ids_out) ids_out[t] = id;
        st = ks_session_decode(s, id);
        if (!st) memcpy(r->lg + (size_t)t * vocab, s->logits, sizeof(float) * vocab);
        r->n = t + 1;
    }
    /* the reports compared with plain launches: the reader's q1, TokenSelect's counts */
    static const char *const keys[] = {"q1", "selections", "cache_hits", "cache_misses"};
    for (int i = 0; i < 4; i++) {
        const char *rep = p ? ks_policy_report(p, keys[i]) : NULL;
        size_t at = strlen(r->rep);
        snprintf(r->rep + at, sizeof r->rep - at, "%s%s=%s", i ? " " : "", keys[i], rep ? rep : "-");
    }
    if (s) r->graph_steps = s->graph_steps;
    if (s) r->joined_steps = s->joined_steps;
    if (s) r->replayed = ks_session_replayed_steps(s);
    if (m->be->graph_begin_seg) {
        r->prog = ks_cuda_backend_prog_edges(m->be);
        r->pf = ks_cuda_backend_prefetch_nodes(m->be);
    }
    if (st) printf("         %s: %s\n", name, ks_last_error());
    ks_session_free(s);
    ks_policy_free(p);
    return st ? -1 : 0;
}

/* min_graph: the fewest replayed steps the graph run must show; min_joined: of those, run as one
 * joined graph (every layer's attend held: core/decode.c decode_joined, or every handler
 * recorded: decode_replayed); min_rep: the fewest layer steps whose recorded handler replayed
 * (0: none expected) */
static void seg_case_rep(const char *dir, const char *pname, const char *src, const char *params, int n, int steps,
                         int min_graph, int min_joined, long long min_rep) {
    char name[200];
    snprintf(name, sizeof name, "%s decode handler in segments: %s%s%s, prompt %d, %d steps", dir, pname, params ? " " : "",
             params ? params : "", n, steps);
    if (g_only && !strstr(name, g_only)) return;
    ks_model *mg = NULL, *mp = NULL;
    if (open_graph_pair(dir, name, &mg, &mp)) return;
    int32_t *prompt = malloc(sizeof(int32_t) * n), *ids = malloc(sizeof(int32_t) * steps);
    make_prompt(prompt, n, mg->cfg.vocab, mg->cfg.bos, 0x2545F4914F6CDD1Dull);
    seg_run pl, g;
    memset(&g, 0, sizeof g);
    int e = seg_run_one(mp, pname, src, params, prompt, n, steps, NULL, ids, &pl);
    if (!e) e = seg_run_one(mg, pname, src, params, prompt, n, steps, ids, NULL, &g);
    int vocab = mg->cfg.vocab;
    if (e || pl.n != steps || g.n != steps) result(0, name, "a run failed");
    else {
        int am, first;
        float d = ring_diff(&(ring_run){.lg = g.lg}, &(ring_run){.lg = pl.lg}, steps, vocab, &am, &first);
        int ok = first == steps && !strcmp(g.rep, pl.rep) && g.graph_steps >= min_graph && pl.graph_steps == 0 &&
                 mg->be->graph_begin_seg != NULL && g.joined_steps >= min_joined && (min_joined || !g.joined_steps) &&
                 g.replayed >= min_rep && (min_rep || !g.replayed) && !pl.replayed && (min_rep ? g.prog > 0 : !g.prog) && g.pf == g.prog;
        result(ok, name,
               "graph vs plain: logits bit-equal %s (first difference at step %d, max |dlogit| %.3g, argmax %d/%d); "
               "reports %s / %s; replayed steps %d of %d (at least %d; plain %d), joined %d (at least %d%s); "
               "recorded handlers replayed %lld layer steps (at least %lld%s), programmatic edges %d (%s), "
               "with the o-projection's prefetch %d (as many expected)",
               first == steps ? "yes" : "NO", first, d, am, steps, g.rep, pl.rep, g.graph_steps, steps, min_graph,
               pl.graph_steps, g.joined_steps, min_joined, min_joined ? "" : ", none expected", g.replayed, min_rep,
               min_rep ? "" : ", none expected", g.prog, min_rep ? "some expected" : "none expected", g.pf);
    }
    free(pl.lg);
    free(g.lg);
    free(prompt);
    free(ids);
    ks_model_close(mg);
    ks_model_close(mp);
}

static void seg_case(const char *dir, const char *pname, const char *src, const char *params, int n, int steps,
                     int min_graph, int min_joined) {
    seg_case_rep(dir, pname, src, params, n, steps, min_graph, min_joined, 0);
}

static int open_pair(const char *dir, ks_model **gpu, ks_model **cpu) {
    *gpu = *cpu = NULL;
    if (ks_model_open(dir, "cuda", gpu)) { result(0, dir, "cuda: %s", ks_last_error()); return -1; }
    if (ks_model_open(dir, "cpu", cpu)) { result(0, dir, "cpu: %s", ks_last_error()); ks_model_close(*gpu); return -1; }
    return 0;
}

int main(int argc, char **argv) {
    int quick = 0, nlong = 4096;
    const char *stories = getenv("KS_STORIES");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else if (!strcmp(argv[i], "--stories") && i + 1 < argc) stories = argv[++i];
        else if (!strcmp(argv[i], "--long") && i + 1 < argc) nlong = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--quick] [--only TEXT] [--stories DIR] [--long N]\n", argv[0]); return 2; }
    }
    if (quick) nlong = 0;
    if (!stories) {
        const char *cands[] = {".data/stories260K", "../shared/models/stories260K", "shared/models/stories260K"};
        for (int i = 0; i < 3; i++)
            if (is_dir(cands[i])) { stories = cands[i]; break; }
    }
    ks_lua_quiet = 1;
    ks_model *gpu, *cpu;

    /* kvsieve-tiny: 8 layers, 8 heads / 2 KV heads, head_dim 64 */
    if (!open_pair("models/kvsieve-tiny", &gpu, &cpu)) {
        static const pcase tiny[] = {
            {"full", ""},
            {"streamingllm", "budget=64,sinks=4,rolling=true"},
            {"snapkv", "budget=64,window=8,kernel=7,pool=max"},
            {"snapkv", "budget=48,window=8,kernel=5,pool=avg,per_query_head=true"},
            {"gemfilter", "layer=2,k=100"},
            {"fastkv", "tsp_layer=3,tsp_rate=0.3,retain_rate=0.2,trace=true"},
            {"fastkv", "mode=absolute,tsp_layer=2,tsp_len=128,capacity=64,w=8"},
            {"asl", "L_min=3,L_obs=3,tau=0.9,k=100,w=8,kv_budget=64,trace=true"},
            {"asl", "L_min=2,L_obs=3,tau=0.5,k=80,w=8,two_pass=true,fallback_layer=5"},
        };
        static const pcase tiny_ts[] = {
            {"tokenselect", "n_init=16,n_local=480,k=64,cache_theta=0.9,trace=true"},
            {"tokenselect", "n_init=8,n_local=500,k=40,pool_kernel=3,gqa=mod"},
            {"quest", "page=16,budget=256,trace=true"},
            {"quest", "page=8,budget=96,gqa=sum,dense_layers=0,trace=true"},
        };
        int32_t *prompt = malloc(sizeof(int32_t) * (nlong > 1100 ? nlong : 1100));
        make_prompt(prompt, nlong > 1100 ? nlong : 1100, gpu->cfg.vocab, gpu->cfg.bos, 88172645463325252ull);
        run_cases("tiny", gpu, cpu, tiny, (int)(sizeof tiny / sizeof tiny[0]), prompt, 300, 8);
        run_cases("tiny", gpu, cpu, tiny_ts, (int)(sizeof tiny_ts / sizeof tiny_ts[0]), prompt, 1100, 8);
        if (nlong > 0) {
            static const pcase big[] = {
                {"snapkv", "budget=512,window=32,kernel=7,pool=max"},
                {"gemfilter", "layer=3,k=512"},
                {"fastkv", "tsp_layer=3,trace=true"},
                {"asl", "L_min=3,L_obs=3,tau=0.9,k=512,w=32,kv_budget=512"},
                {"tokenselect", "n_init=64,n_local=512,k=512,cache_theta=0.9"},
                {"streamingllm", "budget=512,sinks=4"},
                {"quest", "page=16,budget=512,trace=true"},
            };
            run_cases("tiny", gpu, cpu, big, (int)(sizeof big / sizeof big[0]), prompt, nlong, 8);
        }
        free(prompt);
        ks_model_close(gpu);
        ks_model_close(cpu);
    }

    /* stories260K: 5 layers, 8 heads / 4 KV heads, head_dim 8, 512 positions */
    if (!stories) printf("  skip   stories260K: no folder (--stories DIR or KS_STORIES)\n");
    else if (!open_pair(stories, &gpu, &cpu)) {
        static const pcase st[] = {
            {"streamingllm", "budget=48,sinks=4,rolling=true"},
            {"snapkv", "budget=48,window=8,kernel=7,pool=max"},
            {"snapkv", "budget=40,window=8,kernel=5,pool=avg,per_query_head=true"},
            {"gemfilter", "layer=1,k=64"},
            {"fastkv", "tsp_layer=2,tsp_rate=0.3,retain_rate=0.2,trace=true"},
            {"asl", "L_min=2,L_obs=2,tau=0.9,k=64,w=8,kv_budget=48"},
            {"tokenselect", "n_init=8,n_local=350,k=32,trace=true"},
        };
        int32_t prompt[400];
        make_prompt(prompt, 400, cpu->cfg.vocab, cpu->cfg.bos, 0x9e3779b97f4a7c15ull);
        run_cases("stories260K", gpu, cpu, st, (int)(sizeof st / sizeof st[0]) - 1, prompt, 400, 8);
        run_cases("stories260K", gpu, cpu, st + 6, 1, prompt, 380, 16); /* decode goes sparse after 10 tokens */
        static const pcase st_quest[] = {{"quest", "page=8,budget=64,dense_layers=1,trace=true"}};
        run_cases("stories260K", gpu, cpu, st_quest, 1, prompt, 380, 16);
        ks_model_close(gpu);
        ks_model_close(cpu);
    }
    /* the KV ring replayed as the decode graph against plain launches */
    ring_graph_case("models/kvsieve-tiny", 48, 4, 300, 120); /* cut at the prefill; wraps twice */
    ring_graph_case("models/kvsieve-tiny", 64, 4, 20, 150);  /* grows, re-records at the budget, then rings */
    ring_graph_case("models/kvsieve-tiny", 9, 8, 30, 20);    /* one slot: re-recorded at every step */
    /* a decode handler between recorded segments against plain launches */
    seg_case("models/kvsieve-tiny", "noop", NULL, NULL, 20, 60, 58, 0);         /* never acts: all but 2 steps replay */
    seg_case("models/kvsieve-tiny", "reader", SEG_READER, NULL, 20, 60, 58, 0); /* device prims and a sync between segments */
    seg_case("models/kvsieve-tiny", "actor", SEG_ACTOR, NULL, 20, 60, 30, 0);   /* attends every 7th step, retains at step 20 */
    /* attend-only device lists at every layer, staged for the recorded attention: TokenSelect
     * (pre-RoPE keys, rotated in the kernel; the hit path and the default), Quest (pages) */
    seg_case("models/kvsieve-tiny", "tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=-1", 30, 60, 50, 45);
    /* its default declares replay: recorded with the step once sparse, then replayed without Lua */
    seg_case_rep("models/kvsieve-tiny", "tokenselect", NULL, "n_init=4,n_local=16,k=16", 30, 60, 50, 40, 40 * 8);
    seg_case_rep("models/kvsieve-tiny", "tokenselect", NULL, "n_init=4,n_local=16,k=16,trace=true", 30, 60, 50, 0, 0);
    /* its selection cache decided on the device (a mask, scores and top-k skipped, ks.where and
     * ks.add into the cached list, fingerprint and hit counter): recorded and replayed too, the
     * hits and misses counted as plain launches count them */
    seg_case_rep("models/kvsieve-tiny", "tokenselect", NULL, "n_init=4,n_local=16,k=16,cache_theta=0.5", 30, 60, 50, 40,
                 40 * 8);
    /* Quest declares replay within its current page: a plain step after each page fills, a
     * recording, then replays (the page tail followed on the device) until the page is full:
     * pages of 4 hold 2 replayed steps, pages of 8 hold 6 */
    seg_case_rep("models/kvsieve-tiny", "quest", NULL, "page=4,budget=32", 60, 60, 50, 25, 25 * 8);
    seg_case_rep("models/kvsieve-tiny", "quest", NULL, "page=8,budget=64", 60, 60, 50, 35, 35 * 8);
    seg_case_rep("models/kvsieve-tiny", "quest", NULL, "page=8,budget=64,trace=true", 60, 60, 50, 0, 0);
    /* held attends (device lists): every layer held (joined), one layer not, none */
    seg_case("models/kvsieve-tiny", "holder", SEG_HOLDER, "hold=true", 120, 60, 56, 50);
    seg_case("models/kvsieve-tiny", "holder", SEG_HOLDER, "hold=true,free_layer=2", 120, 60, 56, 0);
    seg_case("models/kvsieve-tiny", "holder", SEG_HOLDER, "hold=true,free_layer=2,release_at=40", 120, 60, 50, 0);
    seg_case("models/kvsieve-tiny", "holder", SEG_HOLDER, "hold=false", 120, 60, 56, 0);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
