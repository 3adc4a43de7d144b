/* test_args.c — every number and file the kvsieve command line takes is checked (issue 12,
 * "Arguments and files are checked"). Each reproducer is one test: the binary must exit
 * non-zero (1..127: not killed by a signal), print its one-line "kvsieve: ..." error naming
 * the option or the file, and leave no sanitizer report (under `make SANITIZE=1` an ASan or
 * UBSan finding would show in the output). Needs KS_BIN (set by `make test`). */
#include "common.h"
#include "ktest.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Run `kvsieve ARGS` (stderr joined); the exit status. */
static int run(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", kt_bin(), args);
    return kt_sh(cmd, out, cap);
}

static int sanitizer_report(const char *out) {
    return strstr(out, "Sanitizer") || strstr(out, "runtime error:") || strstr(out, "LeakSanitizer");
}

/* The command must fail cleanly with `want` in its message. */
#define EXPECT_FAIL(args, want)                                                                          \
    do {                                                                                                 \
        char out_[8192];                                                                                 \
        int rc_ = run(args, out_, sizeof out_);                                                          \
        KT_CHECK(rc_ >= 1 && rc_ < 128, "`kvsieve %s`: exit %d (success or a signal): %s", args, rc_, out_); \
        KT_CHECK(strstr(out_, want), "`kvsieve %s`: message lacks \"%s\": %s", args, want, out_);      \
        KT_CHECK(strstr(out_, "kvsieve: "), "`kvsieve %s`: not a kvsieve: error: %s", args, out_);     \
        KT_CHECK(!sanitizer_report(out_), "`kvsieve %s`: sanitizer report: %s", args, out_);          \
    } while (0)

/* The tiny model's config.json with eos_token_id 2 replaced by an id outside its vocabulary:
 * greedy decoding then never stops early, and a run goes on to the end of the context. */
static int drop_eos(const char *dir) {
    char path[512], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ks_read_file(path, &text, &len)) return -1;
    char *e = strstr(text, "\"eos_token_id\": 2}");
    int rc = -1;
    if (e) {
        *e = 0;
        char out[2048];
        snprintf(out, sizeof out, "%s\"eos_token_id\": 1000000}", text);
        rc = kt_write_file(dir, "config.json", out);
    }
    free(text);
    return rc;
}

/* A tiny model (no tokenizer: prompts are --ids; no EOS) in a fresh temp folder. */
static int tiny_model(char *dir, size_t n, int max_pos) {
    if (kt_tmpdir(dir, n)) return -1;
    kt_tiny_cfg c = kt_tiny_default();
    c.max_pos = max_pos;
    return kt_write_tiny_model(dir, &c) || drop_eos(dir) ? -1 : 0;
}

#define NEED_BIN() do { if (!kt_bin()) KT_SKIP("KS_BIN not set (run through make test)"); } while (0)

/* ---------------------------------------------------------------- numbers */

KT_TEST(cli_n_text_is_refused_not_taken_as_zero) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n abc", dir);
    EXPECT_FAIL(a, "-n expects an integer in 0..2147483647, got \"abc\"");
    kt_rmdir(dir);
}

KT_TEST(cli_n_beyond_int_is_refused_not_wrapped) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 99999999999", dir);
    EXPECT_FAIL(a, "-n expects an integer in 0..2147483647, got \"99999999999\"");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 4294967297", dir); /* 2^32 + 1 wrapped to 1 */
    EXPECT_FAIL(a, "got \"4294967297\"");
    kt_rmdir(dir);
}

/* -n INT_MAX is a valid request ("until EOS or the end of the context"): the engine's id
 * buffer once overflowed at max_new + 1; now the run ends at the context with its error */
KT_TEST(cli_n_int_max_runs_to_the_context_without_overflow) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 24) == 0, "tiny model");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2,3 -n 2147483647 -q", dir);
    EXPECT_FAIL(a, "exceeds the model's context of 24 tokens");
    kt_rmdir(dir);
}

KT_TEST(cli_temp_text_negative_nan_inf_are_refused) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    const char *bad[] = {"abc", "-1", "nan", "inf", "1e999", "0.5x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 1 --temp '%s'", dir, bad[i]);
        EXPECT_FAIL(a, "--temp expects a finite number >= 0, got");
    }
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 2 --temp 0.7 --seed 3 -q", dir); /* a good value passes */
    char out[8192];
    int rc = run(a, out, sizeof out);
    KT_CHECK(rc == 0 && strstr(out, "generated 2 tokens"), "--temp 0.7: exit %d: %s", rc, out);
    kt_rmdir(dir);
}

KT_TEST(cli_top_p_outside_0_1_and_nan_are_refused) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    const char *bad[] = {"5", "nan", "0", "-0.5", "1.0001", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 1 --top-p %s", dir, bad[i]);
        EXPECT_FAIL(a, "--top-p expects a number in (0, 1], got");
    }
    kt_rmdir(dir);
}

KT_TEST(cli_seed_text_and_negative_are_refused) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    const char *bad[] = {"xyz", "-1", "12abc", "0x", "18446744073709551616", " 5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 1 --seed '%s'", dir, bad[i]);
        EXPECT_FAIL(a, "--seed expects an integer in 0..18446744073709551615");
    }
    kt_rmdir(dir);
}

KT_TEST(cli_ids_beyond_int32_are_refused_not_wrapped) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,4294967297 -n 1", dir); /* wrapped to id 1 before */
    EXPECT_FAIL(a, "expects token ids in 0..2147483647");
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,x -n 1", dir);
    EXPECT_FAIL(a, "got \"x\"");
    kt_rmdir(dir);
}

/* --gen INT_MAX: length + gen overflowed int and passed the context check */
KT_TEST(cli_bench_gen_int_max_is_a_context_error) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(a, sizeof a, "bench -m %s --lengths 4 --gen 2147483647", dir);
    EXPECT_FAIL(a, "length 4 (+2147483647 generated) exceeds the model's context 64");
    snprintf(a, sizeof a, "bench -m %s --lengths 4 --gen abc", dir);
    EXPECT_FAIL(a, "--gen expects an integer in 0..2147483647, got \"abc\"");
    kt_rmdir(dir);
}

/* 9223372036854775807K: the K multiplication overflowed a long */
KT_TEST(cli_eval_lengths_overflowing_k_is_refused) {
    NEED_BIN();
    EXPECT_FAIL("eval --model /nonexistent --task passkey --lengths 9223372036854775807K",
                "eval --lengths expects a comma-separated list of integers in 1..1073741824");
    EXPECT_FAIL("eval --model /nonexistent --task passkey --lengths 512,8388608K", "got \"8388608K\"");
}

/* the other numbers of every subcommand, one bad value each */
KT_TEST(cli_every_subcommand_parses_numbers_strictly) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    static const struct { const char *args, *want; } cases[] = {
        {"bench -m %s --repeat 0", "--repeat expects an integer in 1..1000000, got \"0\""},
        {"bench -m %s --repeat 3x", "--repeat expects an integer"},
        {"bench -m %s --lengths 12,,4", "--lengths expects a comma-separated list"},
        {"bench -m %s --lengths 0", "--lengths expects a comma-separated list of integers in 1..2147483647"},
        {"bench -m %s --lengths 2097152K", "got \"2097152K\""},
        {"eval --model %s --task passkey --cases 0", "eval --cases expects an integer in 1..100000, got \"0\""},
        {"eval --model %s --task passkey --cases 1e3", "eval --cases expects an integer"},
        {"eval --model %s --task passkey --depths 0,nan", "eval --depths expects a number in [0, 1], got \"nan\""},
        {"eval --model %s --task passkey --depths 0,1.5", "got \"1.5\""},
        {"eval --model %s --task passkey --depths 65", "eval --depths expects an integer in 0..64"},
        {"eval --model %s --task passkey --seed -5", "eval --seed expects an integer in 0..18446744073709551615"},
        {"generate -m %s --ids -p 1 --threads many", "--threads expects an integer in 0..4096, got \"many\""},
        {"tokenize -m %s --ids -p 1 -n 1e3", "-n expects an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(a, sizeof a, cases[i].args, dir);
        EXPECT_FAIL(a, cases[i].want);
    }
    kt_rmdir(dir);
}

/* ---------------------------------------------------------------- files */

/* a directory given as a file: ftell said LLONG_MAX and the loader asked for 9.2e18 bytes */
KT_TEST(cli_policy_directory_says_is_a_directory) {
    NEED_BIN();
    char dir[256], a[768];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    char pdir[300];
    snprintf(pdir, sizeof pdir, "%s/pol.lua", dir);
    KT_CHECK(mkdir(pdir, 0700) == 0, "mkdir %s", pdir);
    snprintf(a, sizeof a, "generate -m %s --ids -p 1,2 -n 1 --policy %s", dir, pdir);
    EXPECT_FAIL(a, "is a directory");
    rmdir(pdir);
    kt_rmdir(dir);
}

KT_TEST(cli_config_json_directory_says_is_a_directory) {
    NEED_BIN();
    char dir[256], a[512], sub[300];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(sub, sizeof sub, "%s/config.json", dir);
    KT_CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    snprintf(a, sizeof a, "generate -m %s --ids -p 1 -n 1", dir);
    EXPECT_FAIL(a, "config.json is a directory");
    snprintf(a, sizeof a, "bench --random-weights %s", dir); /* a folder: its config.json */
    EXPECT_FAIL(a, "config.json is a directory");
    rmdir(sub);
    kt_rmdir(dir);
}

KT_TEST(cli_tokenizer_json_directory_says_is_a_directory) {
    NEED_BIN();
    char dir[256], a[512], sub[300];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(sub, sizeof sub, "%s/tokenizer.json", dir);
    KT_CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    snprintf(a, sizeof a, "generate -m %s -p hello -n 1", dir);
    EXPECT_FAIL(a, "tokenizer.json is a directory");
    rmdir(sub);
    kt_rmdir(dir);
}

/* the other file openers: safetensors (mmap after fstat), a sharded index (read whole), a
 * Lua script for `kvsieve run` */
KT_TEST(cli_weights_and_script_directories_are_named) {
    NEED_BIN();
    char dir[256], a[768], sub[300];
    KT_CHECK(tiny_model(dir, sizeof dir, 64) == 0, "tiny model");
    snprintf(sub, sizeof sub, "%s/model.safetensors", dir);
    KT_CHECK(unlink(sub) == 0 && mkdir(sub, 0700) == 0, "mkdir %s", sub);
    snprintf(a, sizeof a, "generate -m %s --ids -p 1 -n 1", dir);
    EXPECT_FAIL(a, "model.safetensors is not a regular file");
    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/model.safetensors.index.json", dir);
    KT_CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    EXPECT_FAIL(a, "model.safetensors.index.json is a directory");
    rmdir(sub);
    snprintf(a, sizeof a, "run %s", dir);
    EXPECT_FAIL(a, "Is a directory");
    kt_rmdir(dir);
}

/* ---------------------------------------------------------------- sizes */

/* dimensions that pass "positive integer" but that no machine holds: the CPU allocator
 * aborted (ASan) or the process was killed, halfway through allocating */
KT_TEST(cli_bench_random_weights_beyond_memory_is_refused) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    /* 2^20 wide, 2^16 layers: within config.c's bounds, ~5e17 parameters */
    kt_write_file(dir, "big.json",
                  "{\"model_type\": \"llama\", \"hidden_size\": 1048576, \"num_hidden_layers\": 65536, "
                  "\"num_attention_heads\": 16384, \"intermediate_size\": 1048576, \"vocab_size\": 67108864}");
    snprintf(a, sizeof a, "bench --random-weights %s/big.json --lengths 4 --gen 1", dir);
    EXPECT_FAIL(a, "GiB of memory");
    kt_rmdir(dir);
}

KT_TEST(cli_bench_random_weights_dimension_out_of_range_is_refused) {
    NEED_BIN();
    char dir[256], a[512];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    kt_write_file(dir, "huge.json",
                  "{\"model_type\": \"llama\", \"hidden_size\": 1073741824, \"num_hidden_layers\": 1073741824, "
                  "\"num_attention_heads\": 1, \"intermediate_size\": 1073741824, \"vocab_size\": 1073741824, "
                  "\"head_dim\": 64}");
    snprintf(a, sizeof a, "bench --random-weights %s/huge.json --lengths 4 --gen 1", dir);
    EXPECT_FAIL(a, "hidden_size 1073741824 is out of range (at most 1048576)");
    kt_rmdir(dir);
}
