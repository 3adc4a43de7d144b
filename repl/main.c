/* main.c — the kvsieve command line: generate, bench, eval, tokenize, and repl / run (Lua).
 * Every error prints "kvsieve: <message>" on stderr and exits non-zero. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve <command> [options]\n"
            "  generate -m DIR -p TEXT [-n N] [--temp T] [--top-p P] [--seed S] [--ids] [--chat FMT]\n"
            "           [--policy NAME|FILE] [--set key=value]... [--threads T] [--backend cpu|cuda]\n"
            "  bench    -m DIR | --random-weights CONFIG [--lengths 512,2048] [--gen N] [--backend B]\n"
            "  tokenize -m DIR -p TEXT        print token ids\n"
            "  repl     [-m DIR]              interactive Lua REPL\n"
            "  run      SCRIPT.lua [args]     run a Lua program with the kvsieve module\n"
            "  eval     --model DIR --task passkey|niah|multikey|kv [--lengths 1K,4K] [--depths 0,0.5,1|11]\n"
            "           [--cases N] [--policy P | --compare a,b] [--set [p.]k=v] [--out F.json] [--png F.png] [--show]\n"
            "  help\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        if (isatty(0)) return ks_cli_repl(argc, argv);
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "generate")) return ks_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return ks_cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return ks_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "repl")) return ks_cli_repl(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return ks_cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return ks_cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { usage(stdout); return 0; }
    fprintf(stderr, "kvsieve: unknown command \"%s\"\n", cmd);
    usage(stderr);
    return 2;
}
