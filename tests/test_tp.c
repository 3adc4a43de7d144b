/* test_tp.c — tensor parallelism on simulated CPU ranks (core/tp_backend.h, issue 17): every
 * policy keeps the same KV rows and generates the same ids as the unsplit model, logits within
 * a stated tolerance, for N = 2 on the bundled model and N = 4 on a random model whose KV heads
 * divide by 4 (the bundled one has 2: refused); the KV cache split by heads and the bytes per
 * rank; the refusals; the CLI's --tp.
 *
 * The tolerance. The split reorders float32 sums in two places per layer only: the o-projection
 * and the down projection become N partial dot products summed in rank order (plus the residual)
 * instead of one dot product; embedding, the head's logits (one whole dot product per vocab row,
 * on one rank) and attention (per head, on one rank) compute the same operations on the same
 * inputs. A reordered sum of k float32 terms differs by at most about k * 2^-24 * sum|terms|; with
 * O(1) activations that is ~1e-5 per element at dim 512 / ffn 1024, carried through 8 layers and
 * the final norm. The logits are compared with |a - b| <= 1e-4 * (1 + max|logit|) (about 1e-3 at
 * the bundled model's logits, |logit| <= 20). Measured (printed by the tests): 6.2e-6 on the
 * bundled model at N = 2 and 7.2e-7 on the random model at N = 4 (over 100x inside the bound);
 * 2.7e-4 on the float32 checkpoint of kt_write_tiny_model at N = 4 (8x inside: its weights are
 * not scaled by fan-in, so its sums have large terms and their reordering moves more bits);
 * 7.6e-6 on the random model with biases at N = 2. The greedy ids must be identical.
 *
 * The device ranks' code path (core/tp_device.c, what GPU ranks run) is tested here on CPU ranks
 * with the host services (ks_tp_host_ops): the same bound against the unsplit model for every
 * policy at N = 2 (measured 5.3e-6), the same bits at N = 1, and its refusals.
 * tests/cuda/test_tp_cuda.c runs it on GPUs with NCCL. */
#include "ktest.h"
#include "testutil.h"
#include "engine.h"
#include "model.h"
#include "tp_backend.h"
#include "ks_lua.h"

#include <stdlib.h>
#include <string.h>

#define TP_TOL 1e-4f

typedef struct tp_run {
    ks_status st;
    char err[1024];
    int32_t ids[64];
    int n_ids;
    float *logits;
    int vocab, n_layers, n_kv;
    int kept_n[16][8];
    int32_t *kept[16][8];
} tp_run;

static void tp_run_free(tp_run *r) {
    free(r->logits);
    for (int l = 0; l < 16; l++)
        for (int h = 0; h < 8; h++) free(r->kept[l][h]);
}

/* One greedy request of policy `name` with params "k=v,k=v" on m; s_out (optional) keeps the session. */
static void tp_run_policy(ks_model *m, const char *name, const char *params, const int32_t *prompt, int n, int max_new,
                          tp_run *r, ks_session **s_out) {
    memset(r, 0, sizeof *r);
    ks_policy *p = NULL;
    ks_session *s = NULL;
    r->st = ks_policy_load(m, name, &p);
    char kv[512];
    snprintf(kv, sizeof kv, "%s", params);
    for (char *save = NULL, *tok = strtok_r(kv, ",", &save); !r->st && tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        r->st = ks_policy_set(p, tok, eq + 1);
    }
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
        const int32_t *ids = ks_result_ids(s, &r->n_ids);
        if (r->n_ids > 64) r->n_ids = 64;
        memcpy(r->ids, ids, sizeof(int32_t) * r->n_ids);
        const float *lg;
        ks_session_logits(s, &lg, &r->vocab);
        r->logits = malloc(sizeof(float) * r->vocab);
        memcpy(r->logits, lg, sizeof(float) * r->vocab);
        r->n_layers = KS_MIN(m->cfg.n_layers, 16);
        r->n_kv = KS_MIN(m->cfg.n_kv_heads, 8);
        for (int l = 0; l < r->n_layers; l++)
            for (int h = 0; h < r->n_kv; h++) {
                const int32_t *pos;
                int k = ks_result_kept(s, l, h, &pos);
                r->kept_n[l][h] = k;
                r->kept[l][h] = malloc(sizeof(int32_t) * (k + 1));
                if (k) memcpy(r->kept[l][h], pos, sizeof(int32_t) * k);
            }
    }
    if (s_out && !r->st) *s_out = s;
    else ks_session_free(s);
    ks_policy_free(p);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* "" when a and b agree (ids equal, kept sets equal as sets, logits within the tolerance), else
 * what differs; *maxd receives the largest logit difference. */
static const char *tp_diff(const tp_run *a, const tp_run *b, float *maxd, float *maxl) {
    static char why[256];
    *maxd = 0;
    if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, sizeof(int32_t) * a->n_ids)) return "generated ids";
    float big = 0;
    for (int i = 0; i < a->vocab; i++) {
        big = KS_MAX(big, fabsf(a->logits[i]));
        *maxd = KS_MAX(*maxd, fabsf(a->logits[i] - b->logits[i]));
    }
    *maxl = big;
    if (!(*maxd <= TP_TOL * (1 + big))) {
        snprintf(why, sizeof why, "logits (max difference %.3g, bound %.3g)", *maxd, TP_TOL * (1 + big));
        return why;
    }
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv; h++) {
            int k = a->kept_n[l][h];
            if (k != b->kept_n[l][h]) {
                snprintf(why, sizeof why, "kept count at layer %d head %d (%d vs %d)", l, h, k, b->kept_n[l][h]);
                return why;
            }
            int32_t *x = malloc(sizeof(int32_t) * (k + 1)), *y = malloc(sizeof(int32_t) * (k + 1));
            memcpy(x, a->kept[l][h], sizeof(int32_t) * k);
            memcpy(y, b->kept[l][h], sizeof(int32_t) * k);
            qsort(x, k, sizeof *x, cmp_i32);
            qsort(y, k, sizeof *y, cmp_i32);
            int same = !memcmp(x, y, sizeof(int32_t) * k);
            free(x);
            free(y);
            if (!same) {
                snprintf(why, sizeof why, "kept set at layer %d head %d", l, h);
                return why;
            }
        }
    return "";
}

/* every policy with budgets that bite at these lengths (8 layers) */
static const struct { const char *name, *params; int n; } tp_cases[] = {
    {"full", "", 300},
    {"streamingllm", "budget=64,sinks=4,rolling=true", 300},
    {"snapkv", "budget=64,window=8,kernel=7,pool=max", 300},
    {"snapkv", "budget=48,window=8,kernel=5,pool=avg,per_query_head=true", 300},
    {"gemfilter", "layer=2,k=100", 300},
    {"fastkv", "tsp_layer=3,tsp_rate=0.3,retain_rate=0.2", 300},
    {"fastkv", "mode=absolute,tsp_layer=2,tsp_len=128,capacity=64,w=8", 300},
    {"asl", "L_min=3,L_obs=3,tau=0.9,k=100,w=8,kv_budget=64", 300},
    {"asl", "L_min=2,L_obs=3,tau=0.5,k=80,w=8,two_pass=true,fallback_layer=5", 300},
    {"tokenselect", "n_init=16,n_local=480,k=64,cache_theta=0.9", 1100},
    {"tokenselect", "n_init=8,n_local=500,k=40,pool_kernel=3,gqa=mod", 1100},
};

static void tp_prompt(int32_t *prompt, int n, int bos, int vocab) {
    uint64_t x = 88172645463325252ull;
    prompt[0] = bos;
    for (int i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = 3 + (int32_t)(x % (uint64_t)(vocab - 3));
    }
}

/* Every case on `one` (unsplit) and `split` (N ranks): the same ids, kept sets and logits. */
static void tp_every_policy(kt_ctx *kt_, ks_model *one, ks_model *split, int N) {
    int32_t prompt[1100];
    tp_prompt(prompt, 1100, one->cfg.bos, one->cfg.vocab);
    float worst = 0;
    int pruned = 0;
    for (size_t c = 0; c < sizeof tp_cases / sizeof tp_cases[0]; c++) {
        tp_run a, b;
        double t0 = ks_now();
        tp_run_policy(one, tp_cases[c].name, tp_cases[c].params, prompt, tp_cases[c].n, 6, &a, NULL);
        double t1 = ks_now();
        tp_run_policy(split, tp_cases[c].name, tp_cases[c].params, prompt, tp_cases[c].n, 6, &b, NULL);
        double t2 = ks_now();
        KT_CHECK(a.st == KS_OK, "%s unsplit: %s", tp_cases[c].name, a.err);
        KT_CHECK(b.st == KS_OK, "%s on %d ranks: %s", tp_cases[c].name, N, b.err);
        float maxd, maxl;
        const char *d = tp_diff(&a, &b, &maxd, &maxl);
        KT_CHECK(!*d, "%s (%s): %d ranks differ from the unsplit model in %s", tp_cases[c].name, tp_cases[c].params, N, d);
        int kept = 0;
        for (int l = 0; l < a.n_layers; l++) kept += a.kept_n[l][0];
        pruned += kept < a.n_layers * (tp_cases[c].n + 6);
        worst = KS_MAX(worst, maxd);
        fprintf(stderr, "\n    %-12s %-58s unsplit %.2f s, %d ranks %.2f s, max |dlogit| %.2g (max |logit| %.1f)",
                tp_cases[c].name, tp_cases[c].params, t1 - t0, N, t2 - t1, maxd, maxl);
        tp_run_free(&a);
        tp_run_free(&b);
    }
    fprintf(stderr, "\n    worst max |dlogit| %.3g; %d of %zu cases pruned\n  ", worst, pruned,
            sizeof tp_cases / sizeof tp_cases[0]);
    KT_CHECK(pruned >= 9, "only %d cases pruned any KV row: the budgets do not bite", pruned);
}

static ks_status tp_open(const char *dir, int tp, ks_model **m) {
    ks_model_opts o;
    ks_model_opts_default(&o);
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    t.tp = tp;
    return ks_model_open_tuned(dir, &o, &t, m);
}

KT_SLOW_TEST(tp_bundled_2_ranks_every_policy_equals_unsplit) {
    ks_lua_quiet = 1;
    ks_model *one = NULL, *two = NULL;
    KT_CHECK(tp_open("models/kvsieve-tiny", 0, &one) == KS_OK, "%s", ks_last_error());
    KT_CHECK(tp_open("models/kvsieve-tiny", 2, &two) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_tp_ranks(two->be) == 2 && ks_tp_ranks(one->be) == 0, "rank counts");
    tp_every_policy(kt_, one, two, 2);
    ks_model_close(one);
    ks_model_close(two);
}

/* The device ranks' code path (tp_device.c: rank buffers behind each engine pointer, the policy
 * views gathered onto rank 0, the KV bookkeeping, the collectives) over CPU ranks with the host
 * services (ks_tp_host_ops): what GPU ranks run, minus the GPU. */
static ks_status tp_open_dev(const char *dir, int N, ks_model **m) {
    ks_backend *be = NULL;
    *m = NULL;
    ks_status st = ks_tp_backend_create_dev(N, NULL, ks_tp_host_ops(), &be);
    if (!st) st = ks_model_load(dir, be, 0, m);
    if (!st && (st = ks_tp_shard_model(be, *m))) { ks_model_free(*m); *m = NULL; }
    if (st) ks_backend_free(be);
    return st;
}

KT_SLOW_TEST(tp_device_path_on_cpu_ranks_every_policy_equals_unsplit) {
    ks_lua_quiet = 1;
    ks_model *one = NULL, *two = NULL;
    KT_CHECK(tp_open("models/kvsieve-tiny", 0, &one) == KS_OK, "%s", ks_last_error());
    KT_CHECK(tp_open_dev("models/kvsieve-tiny", 2, &two) == KS_OK, "%s", ks_last_error());
    KT_CHECK(ks_tp_ranks(two->be) == 2, "a device composite of 2 ranks");
    tp_every_policy(kt_, one, two, 2);
    ks_model_close(one);
    ks_model_close(two);
}

/* One rank on the device path runs the rank backend's own ops on the same inputs: full
 * attention's logits are the same bits as the plain backend's, and every policy's ids and sets
 * are the same. A batched decode step (per-row views into the step's buffers) is refused on
 * two ranks with a message, not computed wrong; so is a policy set on a session whose KV cache
 * was built before the model kept the policy views, until the session is reset. */
KT_TEST(tp_device_path_one_rank_same_bits_batch_refused) {
    ks_lua_quiet = 1;
    ks_model *plain = NULL, *one = NULL, *two = NULL;
    KT_CHECK(tp_open("models/kvsieve-tiny", 0, &plain) == KS_OK, "%s", ks_last_error());
    KT_CHECK(tp_open_dev("models/kvsieve-tiny", 1, &one) == KS_OK, "%s", ks_last_error());
    int32_t prompt[300];
    tp_prompt(prompt, 300, plain->cfg.bos, plain->cfg.vocab);
    const char *cases[][2] = {{"full", ""}, {"snapkv", "budget=64,window=8,kernel=7,pool=max"}, {"gemfilter", "layer=2,k=100"}};
    for (int c = 0; c < 3; c++) {
        tp_run a, b;
        tp_run_policy(plain, cases[c][0], cases[c][1], prompt, 300, 6, &a, NULL);
        tp_run_policy(one, cases[c][0], cases[c][1], prompt, 300, 6, &b, NULL);
        KT_CHECK(a.st == KS_OK && b.st == KS_OK, "%s: %s | %s", cases[c][0], a.err, b.err);
        float maxd, maxl;
        const char *d = tp_diff(&a, &b, &maxd, &maxl);
        KT_CHECK(!*d && maxd == 0, "%s: one device rank differs from the plain backend: %s (max |dlogit| %g)", cases[c][0], d,
                 maxd);
        tp_run_free(&a);
        tp_run_free(&b);
    }
    KT_CHECK(tp_open_dev("models/kvsieve-tiny", 2, &two) == KS_OK, "%s", ks_last_error());
    ks_session *s[2] = {NULL, NULL};
    KT_CHECK(!ks_session_create(two, &s[0]) && !ks_session_create(two, &s[1]), "%s", ks_last_error());
    for (int i = 0; i < 2; i++) KT_CHECK(ks_session_prefill(s[i], prompt, 40 + i) == KS_OK, "%s", ks_last_error());
    int32_t next[2] = {5, 6};
    ks_status sst[2] = {KS_OK, KS_OK};
    char *msg[2] = {NULL, NULL};
    KT_CHECK(ks_sessions_decode(s, next, 2, sst, msg) == KS_OK, "%s", ks_last_error());
    /* row 0's views start at their buffers (it is served); row 1's do not */
    KT_CHECK(sst[0] == KS_OK, "batched decode, row 0: status %d: %s", (int)sst[0], msg[0] ? msg[0] : "");
    KT_CHECK(sst[1] == KS_ERR_UNSUPPORTED && msg[1] && strstr(msg[1], "batched decode step"),
             "batched decode on 2 device ranks, row 1: status %d: %s", (int)sst[1], msg[1] ? msg[1] : "");
    free(msg[0]);
    free(msg[1]);
    /* a policy set on a session whose KV was built without the views: refused until a reset */
    ks_policy *pol = NULL;
    KT_CHECK(ks_policy_load(two, "snapkv", &pol) == KS_OK, "%s", ks_last_error());
    ks_status st = ks_session_set_policy(s[0], pol);
    KT_CHECK(st == KS_ERR_UNSUPPORTED && strstr(ks_last_error(), "reset the session"), "policy after an unviewed KV: %d %s",
             (int)st, ks_last_error());
    ks_session_reset(s[0]);
    KT_CHECK(ks_session_set_policy(s[0], pol) == KS_OK, "after a reset: %s", ks_last_error());
    KT_CHECK(ks_session_prefill(s[0], prompt, 200) == KS_OK, "with the policy: %s", ks_last_error());
    for (int i = 0; i < 2; i++) ks_session_free(s[i]);
    ks_policy_free(pol);
    ks_model_close(plain);
    ks_model_close(one);
    ks_model_close(two);
}

/* A random model in a shape N = 4 splits: 4 KV heads, and ffn and vocab that do not divide by 4
 * (uneven ranges). */
static const char *tp_cfg4 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"head_dim\": 32, \"hidden_size\": 256,"
    " \"intermediate_size\": 1030, \"max_position_embeddings\": 16384, \"num_attention_heads\": 8,"
    " \"num_hidden_layers\": 8, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
    " \"tie_word_embeddings\": false, \"vocab_size\": 4099, \"bos_token_id\": 0, \"eos_token_id\": 1}";

KT_SLOW_TEST(tp_random_4_ranks_every_policy_equals_unsplit) {
    ks_lua_quiet = 1;
    char dir[256], path[300];
    KT_CHECK(!kt_tmpdir(dir, sizeof dir) && !kt_write_file(dir, "config.json", tp_cfg4), "temp config");
    snprintf(path, sizeof path, "%s/config.json", dir);
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    ks_model *one = NULL, *four = NULL;
    ks_status s1 = ks_model_open_random(path, NULL, &t, 7, &one);
    t.tp = 4;
    ks_status s4 = s1 ? s1 : ks_model_open_random(path, NULL, &t, 7, &four);
    t.tp = 3; /* 4 KV heads do not divide among 3 */
    ks_model *three = NULL;
    ks_status s3 = ks_model_open_random(path, NULL, &t, 7, &three);
    kt_rmdir(dir);
    KT_CHECK(s1 == KS_OK && s4 == KS_OK, "%s", ks_last_error());
    KT_CHECK(s3 == KS_ERR_UNSUPPORTED && !three, "3 ranks over 4 KV heads: status %d", (int)s3);
    tp_every_policy(kt_, one, four, 4);
    ks_model_close(one);
    ks_model_close(four);
}

KT_TEST(tp_refuses_what_it_cannot_split) {
    ks_model *m = NULL;
    ks_status st = tp_open("models/kvsieve-tiny", 4, &m);
    KT_CHECK(st == KS_ERR_UNSUPPORTED && !m, "bundled model (2 KV heads) on 4 ranks: status %d", (int)st);
    KT_CHECK(strstr(ks_last_error(), "2 KV heads do not divide among 4 ranks"), "message: %s", ks_last_error());
    st = tp_open("models/kvsieve-tiny", 9, &m);
    KT_CHECK(st == KS_ERR_ARG && strstr(ks_last_error(), "tp must be 0..8"), "tp 9: %d %s", (int)st, ks_last_error());
    st = tp_open("models/kvsieve-tiny", -1, &m);
    KT_CHECK(st == KS_ERR_ARG, "tp -1: %d", (int)st);
    ks_model_opts o;
    ks_model_opts_default(&o);
    o.backend = "cuda";
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    t.tp = 2;
#ifndef KS_HAVE_CUDA /* GPU ranks need NCCL, which only CUDA=1 builds link (tests/cuda/test_tp_cuda.c runs them) */
    st = ks_model_open_tuned("models/kvsieve-tiny", &o, &t, &m);
    KT_CHECK(st == KS_ERR_UNSUPPORTED && !m && strstr(ks_last_error(), "this build has no NCCL"), "cuda with tp 2: %d %s",
             (int)st, ks_last_error());
#endif
    o.backend = "vulkan";
    st = ks_model_open_tuned("models/kvsieve-tiny", &o, &t, &m);
    KT_CHECK(st == KS_ERR_UNSUPPORTED && !m && strstr(ks_last_error(), "not on the vulkan backend"), "vulkan with tp 2: %d %s",
             (int)st, ks_last_error());
    ks_backend *b = NULL;
    KT_CHECK(ks_tp_backend_create_dev(2, NULL, NULL, &b) == KS_ERR_UNSUPPORTED && !b, "GPU ranks without NCCL");
    static const ks_tp_dev_ops unused = {0}; /* the rank count is checked before anything is called */
    KT_CHECK(ks_tp_backend_create_dev(0, NULL, &unused, &b) == KS_ERR_ARG && !b, "zero GPU ranks: %s", ks_last_error());
    KT_CHECK(ks_tp_backend_create_dev(9, NULL, &unused, &b) == KS_ERR_ARG && !b, "nine GPU ranks: %s", ks_last_error());
    KT_CHECK(ks_tp_backend_create(1, NULL, &b) == KS_ERR_ARG && !b, "one rank is no composite");
    /* --tp 1 is exactly today's backend */
    KT_CHECK(tp_open("models/kvsieve-tiny", 1, &m) == KS_OK && ks_tp_ranks(m->be) == 0 && !strcmp(m->be->name, "cpu"),
             "tp 1: %s", ks_last_error());
    ks_model_close(m);
}

/* The KV cache split by heads, and each rank's bytes: half the weights and half the KV rows. */
KT_TEST(tp_memory_per_rank_and_kv_split_by_heads) {
    ks_lua_quiet = 1;
    ks_model *one = NULL, *two = NULL;
    KT_CHECK(tp_open("models/kvsieve-tiny", 0, &one) == KS_OK, "%s", ks_last_error());
    KT_CHECK(tp_open("models/kvsieve-tiny", 2, &two) == KS_OK, "%s", ks_last_error());
    int32_t prompt[300];
    tp_prompt(prompt, 300, one->cfg.bos, one->cfg.vocab);
    tp_run a, b;
    ks_session *sa = NULL, *sb = NULL;
    tp_run_policy(one, "snapkv", "budget=64,window=8,kernel=7,pool=max", prompt, 300, 6, &a, &sa);
    tp_run_policy(two, "snapkv", "budget=64,window=8,kernel=7,pool=max", prompt, 300, 6, &b, &sb);
    KT_CHECK(a.st == KS_OK && b.st == KS_OK, "%s %s", a.err, b.err);
    /* rank r's KV layer holds exactly the rows of its KV head (1 of 2) */
    for (int l = 0; l < two->cfg.n_layers; l++)
        for (int r = 0; r < 2; r++) {
            int nh = 0;
            const int *rows = ks_tp_kv_rank_rows(&sb->kv[l], r, &nh);
            KT_CHECK(rows && nh == 1, "layer %d rank %d: %d heads", l, r, nh);
            KT_CHECK(rows[0] == sb->kv[l].n[r] && rows[0] == sa->kv[l].n[r], "layer %d rank %d: %d rows, view %d, unsplit %d",
                     l, r, rows[0], sb->kv[l].n[r], sa->kv[l].n[r]);
        }
    ks_mem_stats m1, r0, r1, view;
    one->be->mem_stats(one->be, &m1, 0);
    KT_CHECK(!ks_tp_rank_mem_stats(two->be, 0, &r0, 0) && !ks_tp_rank_mem_stats(two->be, 1, &r1, 0) &&
             !ks_tp_view_mem_stats(two->be, &view, 0), "%s", ks_last_error());
    ks_mem_stats none;
    KT_CHECK(ks_tp_rank_mem_stats(two->be, 2, &none, 0) == KS_ERR_ARG, "rank 2 of 2");
    fprintf(stderr, "\n    unsplit fixed %.2f MiB; rank 0 fixed %.2f MiB, rank 1 fixed %.2f MiB (peaks %.2f, %.2f MiB); "
            "whole host view %.2f MiB\n  ", m1.fixed / 1048576.0, r0.fixed / 1048576.0, r1.fixed / 1048576.0,
            r0.peak / 1048576.0, r1.peak / 1048576.0, view.fixed / 1048576.0);
    /* weights (float32) and KV split in two; the replicated norms add a little to each rank */
    size_t norms = sizeof(float) * (size_t)one->cfg.dim * (2 * one->cfg.n_layers + 1);
    KT_CHECK(r0.fixed + r1.fixed >= m1.fixed && r0.fixed + r1.fixed <= m1.fixed + norms + 4096,
             "ranks %zu + %zu vs unsplit %zu", r0.fixed, r1.fixed, m1.fixed);
    KT_CHECK(r0.fixed == r1.fixed, "ranks differ: %zu vs %zu", r0.fixed, r1.fixed);
    /* the same through the public API */
    ks_model_memory q;
    KT_CHECK(ks_model_tp_ranks(two) == 2 && ks_model_tp_ranks(one) == 0, "ks_model_tp_ranks");
    KT_CHECK(ks_model_rank_memory_stats(two, 1, 0, &q) == KS_OK && q.cur == r1.cur, "rank 1: %zu vs %zu", q.cur, r1.cur);
    KT_CHECK(ks_model_rank_memory_stats(two, 2, 0, &q) == KS_ERR_ARG && ks_model_rank_memory_stats(one, 0, 0, &q) == KS_ERR_ARG,
             "a rank the model does not have");
    tp_run_free(&a);
    tp_run_free(&b);
    ks_session_free(sa);
    ks_session_free(sb);
    ks_model_close(one);
    ks_model_close(two);
}

KT_TEST(tp_cli_generate_tp2_same_text) {
    const char *bin = kt_bin();
    if (!bin) KT_SKIP("KS_BIN is not set");
    char cmd[1024], out1[8192], out2[8192], out4[8192];
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p 'Once upon a time' -n 24 --threads 2", bin);
    int rc1 = kt_sh(cmd, out1, sizeof out1);
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p 'Once upon a time' -n 24 --threads 2 --tp 2", bin);
    int rc2 = kt_sh(cmd, out2, sizeof out2);
    KT_CHECK(rc1 == 0 && rc2 == 0, "exit %d / %d: %s", rc1, rc2, out2);
    char *t1 = strstr(out1, "[kvsieve]"), *t2 = strstr(out2, "[kvsieve]"); /* the timing line differs */
    KT_CHECK(t1 && t2, "no timing line");
    *t1 = *t2 = 0;
    KT_CHECK(!strcmp(out1, out2), "--tp 2 text differs:\n%s\nvs\n%s", out1, out2);
    KT_CHECK(strlen(out1) > 20, "too little text: %s", out1);
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p hi -n 2 --tp 4", bin);
    int rc4 = kt_sh(cmd, out4, sizeof out4);
    KT_CHECK(rc4 != 0 && strstr(out4, "do not divide among 4 ranks"), "--tp 4: exit %d: %s", rc4, out4);
    snprintf(cmd, sizeof cmd, "%s bench -m models/kvsieve-tiny --lengths 64 --gen 2 --repeat 1 --tp 2", bin);
    rc4 = kt_sh(cmd, out4, sizeof out4);
    KT_CHECK(rc4 == 0 && strstr(out4, "memory rank 0 (last row)") && strstr(out4, "memory rank 1 (last row)"),
             "bench --tp 2: exit %d: %s", rc4, out4);
    snprintf(cmd, sizeof cmd, "%s generate -m models/kvsieve-tiny -p hi -n 2 --tp x", bin);
    rc4 = kt_sh(cmd, out4, sizeof out4);
    KT_CHECK(rc4 == 2 && strstr(out4, "--tp"), "--tp x: exit %d: %s", rc4, out4);
}

/* The host all-reduce sums in rank order and every rank op is the CPU backend's fixed-order
 * arithmetic: the same bits on any thread count. */
KT_TEST(tp_same_bits_on_any_thread_count) {
    ks_lua_quiet = 1;
    int32_t prompt[200];
    float *lg[2] = {NULL, NULL};
    int32_t ids[2][64];
    int nid[2] = {0, 0}, vocab = 0;
    for (int i = 0; i < 2; i++) {
        ks_model_opts o;
        ks_model_opts_default(&o);
        o.threads = i ? 3 : 1;
        ks_model_tuning t;
        ks_model_tuning_default(&t);
        t.tp = 2;
        ks_model *m = NULL;
        KT_CHECK(ks_model_open_tuned("models/kvsieve-tiny", &o, &t, &m) == KS_OK, "%s", ks_last_error());
        tp_prompt(prompt, 200, m->cfg.bos, m->cfg.vocab);
        tp_run r;
        tp_run_policy(m, "snapkv", "budget=64,window=8,kernel=7,pool=max", prompt, 200, 8, &r, NULL);
        KT_CHECK(r.st == KS_OK, "%s", r.err);
        lg[i] = r.logits;
        r.logits = NULL;
        vocab = r.vocab;
        nid[i] = r.n_ids;
        memcpy(ids[i], r.ids, sizeof(int32_t) * r.n_ids);
        tp_run_free(&r);
        ks_model_close(m);
    }
    int same = nid[0] == nid[1] && !memcmp(ids[0], ids[1], sizeof(int32_t) * nid[0]) && !memcmp(lg[0], lg[1], sizeof(float) * vocab);
    free(lg[0]);
    free(lg[1]);
    KT_CHECK(same, "1 and 3 threads per rank give different bits");
}

/* A float32 checkpoint (the rank reads its row shards in place; 6 layers, the most
 * kt_write_tiny_model writes), tied embeddings, uneven ffn and
 * vocab ranges, at N = 4; and a random model with biases on q/k/v and o (attention_bias) at N = 2. */
KT_SLOW_TEST(tp_f32_checkpoint_and_biases_equal_unsplit) {
    ks_lua_quiet = 1;
    char dir[256], path[300];
    KT_CHECK(!kt_tmpdir(dir, sizeof dir), "temp dir");
    kt_tiny_cfg tc = kt_tiny_default();
    tc.dim = 128, tc.n_layers = 6, tc.n_heads = 8, tc.n_kv_heads = 4, tc.ffn = 202, tc.vocab = 1001, tc.max_pos = 2048;
    tc.tied = 1;
    KT_CHECK(!kt_write_tiny_model(dir, &tc), "tiny model");
    ks_model *one = NULL, *four = NULL;
    ks_status s1 = tp_open(dir, 0, &one), s4 = s1 ? s1 : tp_open(dir, 4, &four);
    kt_rmdir(dir);
    KT_CHECK(s1 == KS_OK && s4 == KS_OK, "%s", ks_last_error());
    tp_every_policy(kt_, one, four, 4);
    ks_model_close(one);
    ks_model_close(four);

    static const char *cfg =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"head_dim\": 32, \"hidden_size\": 128,"
        " \"intermediate_size\": 256, \"max_position_embeddings\": 2048, \"num_attention_heads\": 4,"
        " \"num_hidden_layers\": 8, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
        " \"attention_bias\": true, \"tie_word_embeddings\": true, \"vocab_size\": 1000, \"bos_token_id\": 0,"
        " \"eos_token_id\": 1}";
    KT_CHECK(!kt_tmpdir(dir, sizeof dir) && !kt_write_file(dir, "config.json", cfg), "temp config");
    snprintf(path, sizeof path, "%s/config.json", dir);
    ks_model_tuning t;
    ks_model_tuning_default(&t);
    ks_model *two = NULL;
    s1 = ks_model_open_random(path, NULL, &t, 3, &one);
    t.tp = 2;
    ks_status s2 = s1 ? s1 : ks_model_open_random(path, NULL, &t, 3, &two);
    kt_rmdir(dir);
    KT_CHECK(s1 == KS_OK && s2 == KS_OK, "%s", ks_last_error());
    KT_CHECK(one->cfg.qkv_bias && one->cfg.o_bias, "the config has no biases");
    tp_every_policy(kt_, one, two, 2);
    ks_model_close(one);
    ks_model_close(two);
}
