/* main.c — the kvsieve command line: generate, tokenize, bench, eval, and repl / run (Lua).
 *
 * Conventions every subcommand follows:
 *   - `kvsieve CMD --help` (or -h) prints CMD's options with their defaults and one example on
 *     stdout and exits 0; `kvsieve --help` / `kvsieve help` the overview, `kvsieve help CMD` the
 *     same as `kvsieve CMD --help`; `kvsieve --version` / `kvsieve version` the version.
 *   - every error is ONE line on stderr, "kvsieve: <what>: <why>", and a non-zero exit (2 for a
 *     bad command line, 1 for a failure while running, 130 for an interrupted eval). A policy's
 *     Lua traceback and the library's secondary messages (a policy's first failure of a kind,
 *     debug notes) are shown only with -v (--verbose: before CMD, or among generate's, tokenize's,
 *     bench's and eval's options).
 * The help texts live here, in one table, so that `--help` and the README can be checked
 * against one place (tests/test_cli_day1.c: cli_help_for_every_subcommand runs `--help` for each). */
#include "cli.h"
#include "kvsieve.h"
#include "ks_lua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ks_cli_verbose = 0;
/* The Lua subcommands (repl, run) show the library's warnings: there a person watches policies
 * being written. The others keep them for -v. */
static int g_show_warnings = 0;

const char *ks_cli_version(void) {
#ifdef KS_VERSION_MAJOR
    return ks_version(); /* the library's (include/kvsieve.h) */
#else
    return KS_CLI_VERSION; /* until the library exports ks_version (repl/cli.h) */
#endif
}

int ks_cli_is_help(const char *a) { return a && (!strcmp(a, "-h") || !strcmp(a, "--help")); }

int ks_cli_is_verbose(const char *a) { return a && (!strcmp(a, "-v") || !strcmp(a, "--verbose")); }

void ks_cli_set_verbose(void) {
    ks_cli_verbose = 1;
    ks_lua_quiet = 0; /* the library's "first failure" line (lua/ks_lua.h) */
}

int ks_cli_fail(const char *what) {
    const char *e = ks_last_error();
    /* the first line only (a Lua traceback follows it), unless -v */
    int len = (int)strlen(e);
    const char *nl = strchr(e, '\n');
    if (nl && !ks_cli_verbose) len = (int)(nl - e);
    fprintf(stderr, "kvsieve: %s%s%.*s\n", what ? what : "", what && *what ? ": " : "", len, e);
    return 1;
}

#ifdef KS_VERSION_MAJOR
/* The library's log (include/kvsieve.h, ks_set_log): a policy's print() verbatim; warnings
 * ("first failure of kind ...": secondary to the one-line error) and debug notes only with -v
 * (warnings also in repl / run). */
static void cli_log(void *user, ks_log_level level, const char *msg) {
    (void)user;
    if (level == KS_LOG_INFO) fprintf(stderr, "%s\n", msg);
    else if (level == KS_LOG_ERROR || ks_cli_verbose || (level == KS_LOG_WARN && g_show_warnings))
        fprintf(stderr, "kvsieve: %s\n", msg);
}
#endif

/* ---------------------------------------------------------------- help */

typedef struct cli_help { const char *cmd, *text; } cli_help;

static const cli_help HELP[] = {
    {"generate",
     "usage: kvsieve generate -m DIR (-p TEXT | -p - | -f FILE) [options]\n"
     "Continue a prompt (greedy by default) and print the text; a timing line goes to stderr.\n"
     "  -m, --model DIR        Hugging Face model folder (config.json, tokenizer.json, *.safetensors)\n"
     "  -p, --prompt TEXT      the prompt; \"-p -\" reads it from stdin\n"
     "  -f, --file FILE        read the prompt from FILE (\"-\": stdin); one trailing newline is dropped.\n"
     "                         Any size up to the model's context (checked before any work);\n"
     "                         a prompt read from a file or stdin is not echoed\n"
     "  -n N                   tokens to generate (default 64; stops earlier at EOS or the context)\n"
     "  --temp T               temperature, 0 = greedy (default 0)\n"
     "  --top-p P              nucleus sampling, in (0, 1] (default 1)\n"
     "  --top-k K              keep the K most likely tokens, 0 = all (default 0)\n"
     "  --min-p P              drop tokens below P x the most likely one, in [0, 1] (default 0)\n"
     "  --repeat-penalty R     > 1 discourages repeats (default 1 = off)\n"
     "  --stop TEXT            end at this text (repeatable, up to 16)\n"
     "  --seed S               sampling seed (default 0)\n"
     "  --chat FMT             wrap the prompt in a chat template: llama3, chatml, mistral, phi3, auto\n"
     "                         (auto: the model's tokenizer_config.json); --system TEXT adds a system turn\n"
     "  --ids                  the prompt is token ids (\"1,2,3\")\n"
     "  --policy NAME|FILE     token-pruning policy (policies/NAME.lua or a .lua file; default: none)\n"
     "  --set key=value        a policy parameter (repeatable); checked against the model before any work\n"
     "  --threads T            CPU threads, 0 = every CPU this process may use (default 0)\n"
     "  --tp N                 tensor parallel: each layer split across N ranks (2..8; this build: simulated\n"
     "                         CPU ranks; the model's KV heads must divide by N; 1 = unsplit, the default)\n"
     "  --backend cpu|cuda     (default cpu)\n"
     "  -q, --quiet            print no text, only the timing line\n"
     "  -v, --verbose          Lua tracebacks and the library's secondary messages\n"
     "example:\n"
     "  kvsieve generate -m models/kvsieve-tiny -p \"Once upon a time\" -n 32\n"
     "  kvsieve generate -m models/kvsieve-tiny -f prompt.txt -n 16 --policy gemfilter --set layer=2 --set k=128\n"},
    {"tokenize",
     "usage: kvsieve tokenize -m DIR (-p TEXT | -p - | -f FILE) [--chat FMT [--system TEXT]] [--ids]\n"
     "Print the prompt's token ids (BOS included, as generate feeds them), space-separated.\n"
     "  -m, --model DIR        model folder (its tokenizer.json)\n"
     "  -p, --prompt TEXT      the text; \"-p -\" reads stdin; -f FILE reads a file (one trailing newline dropped)\n"
     "  --chat FMT             format as a chat first (see kvsieve generate --help)\n"
     "example:\n"
     "  kvsieve tokenize -m models/kvsieve-tiny -p \"The grass is green.\"\n"},
    {"bench",
     "usage: kvsieve bench (-m DIR | --random-weights CONFIG) [options]\n"
     "Prefill and decode speed per prompt length on random token ids (batch 1), the linear layers'\n"
     "GFLOP/s next to the GEMM's, the backend's memory peak, and graph%: the timed decode steps that\n"
     "replayed a recorded graph (CUDA; a policy whose handler asks for more runs plain launches).\n"
     "Each row: best of --repeat runs; --json writes every figure with its spread (min / median /\n"
     "max over the repeats).\n"
     "  -m DIR                 model folder\n"
     "  --random-weights CFG   a config.json with random weights (no download needed)\n"
     "  --lengths L,L,...      prompt lengths, K = x1024 (default 128,512,1024)\n"
     "  --gen N                tokens decoded per run (default 16)\n"
     "  --repeat R             timed runs per row (default 3)\n"
     "  --policy P,P,...       policies, one row set each; \"none\" = full attention (default none)\n"
     "  --set [P.]key=value    a policy parameter (P.: only policy P)\n"
     "  --profile              a per-phase table per row (also KS_PROFILE=1)\n"
     "  --json FILE            write the results as JSON (every figure, min/median/max over repeats)\n"
     "  --tp N                 tensor parallel over N ranks (2..8; this build: simulated CPU ranks);\n"
     "                         prints each rank's memory\n"
     "  --batch B,B,...        batched decode instead: per length and B, B sessions (distinct prompts)\n"
     "                         prefilled, 2 warm-up + --gen timed steps of all B at once; aggregate\n"
     "                         decode tokens/s, step time, the multiple of B = 1's rate\n"
     "  --ttft-under-load      with --batch: the TTFT of one more prompt of the same length, prefilled\n"
     "                         in pieces, one before each batched step of the B (serve's order)\n"
     "  --prefill-chunk N      its piece size (default 256, serve's)\n"
     "  --attn-per-session     with --batch: attention session by session even where the backend\n"
     "                         has a batched decode attention (A/B)\n"
     "  --host-argmax          with --batch: greedy ids from downloaded logits on the host instead of\n"
     "                         on the backend (A/B)\n"
     "  --backend cpu|cuda     (default cpu)\n"
     "  -v, --verbose          Lua tracebacks and the library's secondary messages\n"
     "example:\n"
     "  kvsieve bench -m models/kvsieve-tiny --lengths 256,1K --gen 8 --repeat 3 --json bench.json\n"},
    {"eval",
     "usage: kvsieve eval --model DIR --task passkey|niah|multikey|kv [options]\n"
     "A grid of retrieval cases (length x depth x case) under one or several policies, scored by exact\n"
     "match; a table on stdout, optional JSON and PNG heatmap. Progress with an ETA on stderr.\n"
     "Ctrl-C writes the finished cases (JSON, table, partial heatmap) and exits 130; --resume\n"
     "continues. Every argument is checked before the first case runs.\n"
     "  -m, --model DIR        model folder\n"
     "  --task T               passkey, niah, multikey or kv\n"
     "  --lengths L,L,...      prompt lengths in tokens, K = x1024 (default 512,1024,2048,4096)\n"
     "  --depths D,D,... | N   needle depths in [0, 1], or N evenly spaced from 0 to 1 (default 0,0.25,0.5,0.75,1)\n"
     "  --cases N              cases per cell (default 1)\n"
     "  --policy P             one policy (default full)\n"
     "  --compare A,B,...      several policies side by side (instead of --policy)\n"
     "  --set [P.]key=value    a policy parameter (P.: only policy P; unscoped keys go to every policy\n"
     "                         that has them), checked against the model's layer count before any case\n"
     "  --seed S               base seed of the cases (default: the held-out base 0xf2cb78610a862fce)\n"
     "  --corpora DIR          haystack texts for niah / multikey (default ../shared/corpora if it\n"
     "                         exists, else .data/corpora)\n"
     "  --out FILE.json        every case and cell as JSON (written at the end or on Ctrl-C)\n"
     "  --png FILE.png         the heatmap as a PNG\n"
     "  --resume FILE.json     skip the cases already in FILE (an earlier --out of the same grid and seed)\n"
     "  --show                 print each case's kept text with the needle marked\n"
     "  --backend cpu|cuda     (default cpu)\n"
     "  -q, --quiet            no per-case lines and no progress\n"
     "  -v, --verbose          Lua tracebacks and the library's secondary messages\n"
     "example:\n"
     "  kvsieve eval --model models/kvsieve-tiny --task passkey --lengths 512 --depths 0,0.5,1 \\\n"
     "      --compare full,gemfilter --set gemfilter.layer=2 --set gemfilter.k=128 --out r.json --png r.png\n"},
    {"repl",
     "usage: kvsieve repl [-m DIR] [--backend cpu|cuda]\n"
     "An interactive Lua 5.4 prompt with the kvsieve module loaded as `ks` (also `kvsieve` alone on a\n"
     "terminal). /help inside lists the module; Ctrl-C stops a running request; Ctrl-D leaves.\n"
     "  -m, --model DIR        load a model as `m` and open a session `s` on it\n"
     "  --backend cpu|cuda     (default cpu)\n"
     "example:\n"
     "  kvsieve repl -m models/kvsieve-tiny\n"},
    {"run",
     "usage: kvsieve run SCRIPT.lua [args...]\n"
     "Run a Lua 5.4 program with the kvsieve module (require \"kvsieve\", also the global `ks`); its\n"
     "arguments are in `arg` and `...`. SCRIPT \"-\" reads the program from stdin. Options after\n"
     "SCRIPT belong to the script.\n"
     "example:\n"
     "  kvsieve run tools/fastkv_calibrate.lua models/kvsieve-tiny\n"},
    {"serve",
     "usage: kvsieve serve -m DIR [--backend cpu|cuda] [--host 127.0.0.1] [--port 8080] [--max-batch N] [--max-kv-tokens N]\n"
     "An OpenAI-compatible HTTP server (docs/serve.md): POST /v1/completions and /v1/chat/completions (streamed\n"
     "or not), GET /v1/models and /health; a request may choose its own policy (\"kvsieve\": {\"policy\": ...}).\n"
     "  -m, --model DIR        model folder\n"
     "  --backend cpu|cuda     (default cpu)\n"
     "  --host H, --port P     where to listen (default 127.0.0.1:8080; port 0: any free port, printed)\n"
     "  --max-batch N          sequences generated together (default 16)\n"
     "  --max-kv-tokens N      KV rows reserved (prompt + max_tokens) over the active sequences (default 65536)\n"
     "  --max-queue N          waiting requests beyond which a request gets 429 (default 64)\n"
     "  --prefill-chunk N      prompt tokens prefilled between two decode steps (default 256)\n"
     "  --timeout S            seconds a client may stall (default 60)\n"
     "  --chat FMT             chat format (llama3, chatml, mistral, phi3; default: the model's template)\n"
     "  --no-inline-policies   refuse policies given as Lua source (403)\n"
     "  --no-path-policies     refuse policies given as a file path (403)\n"
     "  --threads T            CPU threads, 0 = every CPU (default 0)\n"
     "  -v, --verbose          the library's secondary messages\n"
     "example:\n"
     "  kvsieve serve -m models/kvsieve-tiny --port 8080\n"},
    {"version", "usage: kvsieve version (or kvsieve --version)\nPrint the version.\nexample:\n  kvsieve --version\n"},
    {"help", "usage: kvsieve help [COMMAND]\nThe list of commands, or COMMAND's options.\nexample:\n  kvsieve help eval\n"},
};

static const char *help_of(const char *cmd) {
    for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++)
        if (!strcmp(HELP[i].cmd, cmd)) return HELP[i].text;
    return NULL;
}

int ks_cli_help(const char *cmd) {
    const char *t = help_of(cmd);
    if (!t) return -1;
    fputs(t, stdout);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "kvsieve %s — LLM inference with token-pruning policies in Lua\n"
            "usage: kvsieve [-v] <command> [options]     (kvsieve <command> --help for its options)\n"
            "  generate -m DIR (-p TEXT | -f FILE | -p -) [-n N] [--policy P --set k=v]...   continue a prompt\n"
            "  tokenize -m DIR -p TEXT          print token ids\n"
            "  bench    -m DIR [--lengths 512,2K] [--json F]   prefill / decode speed\n"
            "  eval     --model DIR --task passkey|niah|multikey|kv [--compare a,b] [--out F.json] [--resume F.json]\n"
            "  repl     [-m DIR]                interactive Lua REPL (also `kvsieve` alone on a terminal)\n"
            "  run      SCRIPT.lua [args]       run a Lua program with the kvsieve module\n"
            "  serve    -m DIR [--port 8080] [--max-batch N]   OpenAI-compatible HTTP server, a policy per request\n"
            "  version                          print the version (also --version)\n"
            "  help [COMMAND]                   this text, or COMMAND's options\n"
            "  -v, --verbose                    Lua tracebacks and secondary messages with errors\n"
            "example:\n"
            "  kvsieve generate -m models/kvsieve-tiny -p \"Once upon a time\" -n 32\n",
            ks_cli_version());
}

/* Does a Lua subcommand ask for help? (generate, tokenize, bench and eval see -h/--help in their
 * own option parsers, which know which arguments are values.) `run`: only right after the
 * command (the rest is the script's); `repl`: anywhere. */
static int wants_help(const char *cmd, int argc, char **argv) {
    if (!strcmp(cmd, "run")) return argc >= 2 && ks_cli_is_help(argv[1]);
    if (!strcmp(cmd, "repl"))
        for (int i = 1; i < argc; i++)
            if (ks_cli_is_help(argv[i])) return 1;
    return 0;
}

int main(int argc, char **argv) {
    /* -v before the command */
    while (argc > 1 && ks_cli_is_verbose(argv[1])) {
        ks_cli_set_verbose();
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if (argc < 2) {
        if (isatty(0)) {
            g_show_warnings = 1;
#ifdef KS_VERSION_MAJOR
            ks_set_log(cli_log, NULL);
#endif
            return ks_cli_repl(argc, argv);
        }
        fprintf(stderr, "kvsieve: no command given (kvsieve --help lists the commands)\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        if (argc > 2 && ks_cli_is_help(argv[2])) return ks_cli_help("version"), 0;
        printf("kvsieve %s\n", ks_cli_version());
        return 0;
    }
    if (!strcmp(cmd, "help") || ks_cli_is_help(cmd)) {
        if (!strcmp(cmd, "help") && argc > 2 && ks_cli_is_help(argv[2])) return ks_cli_help("help"), 0;
        if (argc > 2 && !ks_cli_is_help(argv[2])) {
            if (ks_cli_help(argv[2])) {
                fprintf(stderr, "kvsieve: help: unknown command \"%s\" (commands: generate, tokenize, bench, eval, repl, run, serve, version)\n", argv[2]);
                return 2;
            }
            return 0;
        }
        usage(stdout);
        return 0;
    }
    if (!help_of(cmd)) {
        fprintf(stderr, "kvsieve: unknown command \"%s\" (kvsieve --help lists the commands)\n", cmd);
        return 2;
    }
    if (wants_help(cmd, argc - 1, argv + 1)) return ks_cli_help(cmd), 0;
    g_show_warnings = !strcmp(cmd, "repl") || !strcmp(cmd, "run");
    /* the library's secondary messages: the log callback where the library has one, and its
     * older switch for a policy's "first failure" line (lua/ks_lua.h) */
#ifdef KS_VERSION_MAJOR
    ks_set_log(cli_log, NULL);
#endif
    ks_lua_quiet = !(ks_cli_verbose || g_show_warnings);
    if (!strcmp(cmd, "generate")) return ks_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return ks_cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return ks_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "repl")) return ks_cli_repl(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return ks_cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return ks_cli_serve(argc - 1, argv + 1);
    return ks_cli_eval(argc - 1, argv + 1); /* help_of() knows no other command */
}
