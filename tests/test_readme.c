/* test_readme.c — README.md tells the truth about its commands (issue 15).
 *
 * The command lines are those of README.md's ```sh code blocks: continuation lines ending in a
 * backslash are joined, trailing comments (a # outside quotes, at the start or after a blank)
 * are stripped, comment-only lines dropped.
 *
 *   readme_first_lines_are_demo_and_test  the README opens (after its title) with one sh block
 *                                         whose commands are exactly `make demo` and `make test`.
 *   readme_options_exist                  every `build/kvsieve SUBCOMMAND ...` (also build-cuda/,
 *                                         and inline `kvsieve ...` code spans of the prose) names a
 *                                         subcommand of `kvsieve --help` and only options that the
 *                                         subcommand's `--help` lists (--help itself always; before
 *                                         the subcommand, the global ones); every `make TARGET` names
 *                                         a target of the Makefile or kernels/cuda.mk. Lines that are
 *                                         not run are checked too: a cheap way to catch a lie.
 *   readme_commands_run (slow tier)       runs, from the repository root and in README order, every
 *                                         line that uses build/kvsieve or build/host on the bundled
 *                                         models (models/kvsieve-tiny, models/kvsieve-tiny-base,
 *                                         ../shared/models/...), and the shell lines that make their
 *                                         input files; each must exit 0 and write the files it names.
 *
 * Rewrites, so that a run changes nothing in the checkout: build/kvsieve becomes $KS_BIN and
 * build/host $KS_HOST; a file the README's lines write (a `> FILE` target, the value of --out,
 * --png or --json) becomes that name in a temporary folder, in every line that names it (so
 * `-f prompt.txt` and `--resume r.json` read what the earlier lines wrote); ../shared/ becomes
 * $KS_SHARED/ when that is set. Each line runs as `sh` with stdin from /dev/null, under a
 * 300 s timeout.
 *
 * Not run, counted and printed with the reason: lines with a placeholder (an upper-case word
 * such as MODEL_DIR: a model that is not bundled), make targets (make demo / test / install /
 * cuda ...: jobs of their own, tested elsewhere), scripts (bash bench/...: GPU or long jobs),
 * the CUDA build (build-cuda/, --backend cuda), lines that need `make install` (cc, export,
 * ./host), and lines whose model or data is absent here (kvsieve-tiny-base's weights before
 * `make base-model`, ../shared, the NIAH corpora). Needs KS_BIN (and KS_HOST for build/host
 * lines); run from the repository root, as `make test` does. */
#include "ktest.h"
#include "testutil.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ README parsing -------- */

typedef struct {
    char *text; /* the joined command line, comment stripped */
    int line;   /* its first line in README.md (1-based) */
    int block;  /* which sh block (0-based) */
} rd_cmd;

typedef struct {
    rd_cmd *v;
    int n, cap;
    int n_blocks;         /* sh blocks */
    int first_fence_line; /* line of the first ``` fence, 0 when none */
    int first_fence_sh;   /* that fence opens an sh block */
    int prose_before;     /* a line before the first fence that is neither a heading nor blank */
    char *prose;          /* the text outside code blocks (for inline code spans) */
} rd_doc;

static char *rd_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)sz + 1);
    if (s && fread(s, 1, (size_t)sz, f) != (size_t)sz) { free(s); s = NULL; }
    if (s) s[sz] = 0;
    fclose(f);
    return s;
}

/* A line without its trailing comment and blanks: a # outside quotes that starts the line or
 * follows a blank begins a comment. In place. */
static void rd_strip_comment(char *s) {
    char q = 0;
    for (char *p = s; *p; p++) {
        if (q) {
            if (*p == '\\' && q == '"' && p[1]) p++;
            else if (*p == q) q = 0;
        } else if (*p == '\\' && p[1]) {
            p++;
        } else if (*p == '\'' || *p == '"') {
            q = *p;
        } else if (*p == '#' && (p == s || isspace((unsigned char)p[-1]))) {
            *p = 0;
            break;
        }
    }
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
}

static void rd_push(rd_doc *d, const char *text, int line, int block) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->v = realloc(d->v, (size_t)d->cap * sizeof *d->v);
    }
    const char *t = text;
    while (isspace((unsigned char)*t)) t++;
    d->v[d->n++] = (rd_cmd){strdup(t), line, block};
}

static void rd_free(rd_doc *d) {
    for (int i = 0; i < d->n; i++) free(d->v[i].text);
    free(d->v);
    free(d->prose);
    memset(d, 0, sizeof *d);
}

/* Parses README.md's text: the commands of its sh blocks, the prose outside blocks. */
static int rd_parse(const char *text, rd_doc *d) {
    memset(d, 0, sizeof *d);
    size_t tn = strlen(text);
    d->prose = calloc(tn + 1, 1);
    char *acc = calloc(tn + 1, 1); /* a command being joined */
    if (!d->prose || !acc) { free(acc); return -1; }
    size_t pn = 0;
    int in_block = 0, is_sh = 0, acc_line = 0, lineno = 0;
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *line = strndup(p, len);
        lineno++;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = 0;
        if (!strncmp(line, "```", 3)) {
            if (!in_block) {
                const char *lang = line + 3;
                is_sh = !strcmp(lang, "sh") || !strcmp(lang, "sh ") || !strcmp(lang, "bash");
                in_block = 1;
                if (!d->first_fence_line) { d->first_fence_line = lineno; d->first_fence_sh = is_sh; }
            } else {
                if (is_sh && acc[0]) { /* a continuation left open at the block's end */
                    rd_strip_comment(acc);
                    if (acc[0]) rd_push(d, acc, acc_line, d->n_blocks);
                    acc[0] = 0;
                }
                if (is_sh) d->n_blocks++;
                in_block = is_sh = 0;
            }
        } else if (in_block && is_sh) {
            int cont = ll && line[ll - 1] == '\\';
            if (cont) line[--ll] = 0;
            if (!acc[0]) acc_line = lineno;
            strcat(acc, acc[0] ? " " : "");
            strcat(acc, line);
            if (!cont) {
                rd_strip_comment(acc);
                if (acc[0]) rd_push(d, acc, acc_line, d->n_blocks);
                acc[0] = 0;
            }
        } else if (!in_block) {
            if (!d->first_fence_line && ll && line[0] != '#') d->prose_before = 1;
            memcpy(d->prose + pn, line, ll);
            pn += ll;
            d->prose[pn++] = '\n';
        }
        free(line);
        p = e ? e + 1 : p + len;
    }
    free(acc);
    return 0;
}

/* ------------------------------------------------------------------ words of a command ----- */

/* A shell word: its value without quotes; op != 0 for an operator (| ; & ( ) < > { }). */
typedef struct {
    char *val;
    char op;
    int quoted; /* some part of it was quoted */
} rd_word;

typedef struct {
    rd_word *w;
    int n;
} rd_words;

static void rd_words_free(rd_words *ws) {
    for (int i = 0; i < ws->n; i++) free(ws->w[i].val);
    free(ws->w);
    ws->w = NULL;
    ws->n = 0;
}

/* Splits a command line into words and operators, shell-style (quotes, backslashes; no
 * expansion: $HOME stays as written). */
static void rd_split(const char *s, rd_words *ws) {
    size_t n = strlen(s);
    ws->w = calloc(n + 1, sizeof *ws->w);
    ws->n = 0;
    char *buf = malloc(n + 1);
    const char *p = s;
    while (*p) {
        while (isspace((unsigned char)*p)) p++;
        if (!*p) break;
        if (strchr("|;&()<>{}", *p)) {
            ws->w[ws->n++] = (rd_word){strdup((char[]){*p, 0}), *p, 0};
            p++;
            continue;
        }
        size_t k = 0;
        int quoted = 0;
        while (*p && !isspace((unsigned char)*p) && !strchr("|;&()<>", *p)) {
            if (*p == '\'' || *p == '"') {
                char q = *p++;
                quoted = 1;
                while (*p && *p != q) {
                    if (q == '"' && *p == '\\' && p[1]) p++;
                    buf[k++] = *p++;
                }
                if (*p) p++;
            } else if (*p == '\\' && p[1]) {
                buf[k++] = p[1];
                p += 2;
            } else {
                buf[k++] = *p++;
            }
        }
        buf[k] = 0;
        ws->w[ws->n++] = (rd_word){strdup(buf), 0, quoted};
    }
    free(buf);
}

/* A placeholder: an unquoted upper-case word of 3 characters or more (MODEL_DIR, MODEL, DIR, ...);
 * an argument of PREFIX=DIR counts, an environment assignment such as KS_CUDA_GRAPH=0 does not. */
static const char *rd_placeholder(const rd_words *ws) {
    for (int i = 0; i < ws->n; i++) {
        const rd_word *w = &ws->w[i];
        if (w->op || w->quoted) continue;
        const char *v = strchr(w->val, '=');
        v = v ? v + 1 : w->val;
        size_t len = strlen(v), up = 0;
        for (size_t j = 0; j < len; j++) up += isupper((unsigned char)v[j]) || v[j] == '_' || isdigit((unsigned char)v[j]);
        if (len >= 3 && up == len && isupper((unsigned char)v[0])) return v;
    }
    return NULL;
}

static int rd_has_word(const rd_words *ws, const char *val) {
    for (int i = 0; i < ws->n; i++)
        if (!ws->w[i].op && !strcmp(ws->w[i].val, val)) return 1;
    return 0;
}

static int rd_has_prefix(const rd_words *ws, const char *prefix) {
    for (int i = 0; i < ws->n; i++)
        if (!ws->w[i].op && !strncmp(ws->w[i].val, prefix, strlen(prefix))) return 1;
    return 0;
}

/* ------------------------------------------------------------------ help texts ------------- */

static const char *rd_bin(void) {
    const char *b = getenv("KS_BIN");
    return b && *b ? b : NULL;
}

static int rd_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The README and the Makefile in the working directory: the repository root. */
static int rd_at_root(void) { return rd_exists("README.md") && rd_exists("Makefile") && rd_exists("models"); }

/* Does help text `h` list option `opt`? An option is listed where it stands at the start of a
 * word: after a blank, a comma, "(", "[", "|" or a quote. */
static int rd_help_lists(const char *h, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = strstr(h, opt); p; p = strstr(p + 1, opt)) {
        char before = p == h ? ' ' : p[-1];
        char after = p[n];
        if (!(isspace((unsigned char)before) || strchr(",([|\"'", before))) continue;
        if (isalnum((unsigned char)after) || after == '-' || after == '_') continue;
        return 1;
    }
    return 0;
}

/* `kvsieve SUB --help` (SUB NULL: `kvsieve --help`), cached. */
static const char *rd_help(const char *sub) {
    static struct { char sub[32]; char *text; } cache[16];
    static int nc;
    const char *key = sub ? sub : "";
    for (int i = 0; i < nc; i++)
        if (!strcmp(cache[i].sub, key)) return cache[i].text;
    if (nc == 16 || strlen(key) >= sizeof cache[0].sub) return NULL;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s --help", rd_bin(), key);
    char *out = malloc(32768);
    int rc = kt_sh(cmd, out, 32768);
    if (rc != 0) { free(out); out = NULL; }
    snprintf(cache[nc].sub, sizeof cache[nc].sub, "%s", key);
    cache[nc++].text = out;
    return out;
}

/* Is `sub` a command of `kvsieve --help`: a line "  sub ..." of its command list? */
static int rd_is_command(const char *main_help, const char *sub) {
    size_t n = strlen(sub);
    for (const char *p = main_help; p && *p;) {
        const char *e = strchr(p, '\n');
        if (!strncmp(p, "  ", 2) && !strncmp(p + 2, sub, n) && (p[2 + n] == ' ' || p[2 + n] == '\n' || !p[2 + n])) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* Checks one kvsieve invocation: words [from, to) of ws, from the word after the binary. Appends
 * the problems found to err (one line each). Returns the number of problems. */
static int rd_check_invocation(const rd_words *ws, int from, int to, const char *where, char *err, size_t cap) {
    const char *main_help = rd_help(NULL);
    int bad = 0;
    size_t el = strlen(err);
#define RD_BAD(...)                                                                            \
    do {                                                                                       \
        if (el < cap) el += (size_t)snprintf(err + el, cap - el, __VA_ARGS__);                 \
        bad++;                                                                                 \
    } while (0)
    if (!main_help) { RD_BAD("%s: `kvsieve --help` failed\n", where); return bad; }
    int i = from;
    for (; i < to && ws->w[i].val[0] == '-'; i++) { /* global options before the command */
        const char *o = ws->w[i].val;
        if (!strcmp(o, "--help") || !strcmp(o, "--version")) return bad; /* kvsieve --help / --version */
        if (!rd_help_lists(main_help, o)) RD_BAD("%s: global option %s is not in `kvsieve --help`\n", where, o);
    }
    if (i >= to) return bad; /* kvsieve alone: the REPL */
    const char *sub = ws->w[i].val;
    int upper = 1;
    for (const char *c = sub; *c; c++) upper &= isupper((unsigned char)*c) || *c == '_';
    if (upper) return bad; /* `kvsieve CMD --help`: a placeholder */
    if (!rd_is_command(main_help, sub)) { RD_BAD("%s: '%s' is not a command of `kvsieve --help`\n", where, sub); return bad; }
    const char *h = rd_help(sub);
    if (!h) { RD_BAD("%s: `kvsieve %s --help` failed\n", where, sub); return bad; }
    for (i++; i < to; i++) {
        const char *o = ws->w[i].val;
        if (!strcmp(sub, "run") && o[0] != '-') break; /* the script: what follows is its own */
        if (o[0] != '-' || !o[1] || isdigit((unsigned char)o[1]) || o[1] == '.') continue; /* a value, "-" or -3 */
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(o, "="), o);
        if (!strcmp(name, "--help")) continue;
        if (!rd_help_lists(h, name)) RD_BAD("%s: `kvsieve %s --help` does not list %s\n", where, sub, name);
    }
    return bad;
#undef RD_BAD
}

/* Is `target` a make target (a line "target:" of the Makefile or kernels/cuda.mk, or one of
 * the CUDA goals the Makefile forwards)? */
static int rd_is_make_target(const char *mk, const char *cuda_mk, const char *target) {
    const char *texts[2] = {mk, cuda_mk};
    size_t n = strlen(target);
    for (int t = 0; t < 2; t++) {
        for (const char *p = texts[t]; p && *p;) {
            const char *e = strchr(p, '\n');
            if (!strncmp(p, target, n) && (p[n] == ':' || p[n] == ' ')) {
                const char *c = p + n;
                while (*c == ' ') c++;
                if (*c == ':' && c[1] != '=') return 1;
            }
            p = e ? e + 1 : NULL;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ the tests -------------- */

static int rd_load(rd_doc *d) {
    char *text = rd_slurp("README.md");
    if (!text) return -1;
    int rc = rd_parse(text, d);
    free(text);
    return rc;
}

KT_TEST(readme_first_lines_are_demo_and_test) {
    if (!rd_at_root()) KT_SKIP("not run from the repository root (README.md, Makefile, models/)");
    rd_doc d;
    KT_CHECK(rd_load(&d) == 0, "README.md unreadable");
    int ok_fence = d.first_fence_line > 0 && d.first_fence_sh, prose = d.prose_before;
    int n0 = 0;
    const char *c[3] = {0};
    for (int i = 0; i < d.n && d.v[i].block == 0; i++) {
        if (n0 < 3) c[n0] = d.v[i].text;
        n0++;
    }
    int good = n0 == 2 && !strcmp(c[0], "make demo") && !strcmp(c[1], "make test");
    char first[256];
    snprintf(first, sizeof first, "%s | %s | %s", c[0] ? c[0] : "-", c[1] ? c[1] : "-", c[2] ? c[2] : "-");
    rd_free(&d);
    KT_CHECK(ok_fence, "the README's first code block is not an sh block");
    KT_CHECK(!prose, "the README has prose before its first sh block (only the title may come first)");
    KT_CHECK(good, "the first sh block's commands are not exactly `make demo` and `make test`: %d commands: %s", n0, first);
}

KT_TEST(readme_options_exist) {
    if (!rd_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    if (!rd_at_root()) KT_SKIP("not run from the repository root (README.md, Makefile, models/)");
    rd_doc d;
    KT_CHECK(rd_load(&d) == 0, "README.md unreadable");
    char *mk = rd_slurp("Makefile"), *cuda_mk = rd_slurp("kernels/cuda.mk");
    size_t cap = 16384;
    char *err = calloc(cap, 1);
    int bad = 0, n_inv = 0, n_make = 0;
    char where[64];
    for (int i = 0; i < d.n; i++) {
        rd_words ws;
        rd_split(d.v[i].text, &ws);
        snprintf(where, sizeof where, "README.md:%d", d.v[i].line);
        for (int s = 0; s < ws.n;) { /* each simple command of the line */
            int e = s;
            while (e < ws.n && !ws.w[e].op) e++;
            int b = s;
            while (b < e && strchr(ws.w[b].val, '=') && ws.w[b].val[0] != '-') b++; /* VAR=value prefixes */
            if (b < e) {
                const char *prog = ws.w[b].val;
                if (!strcmp(prog, "build/kvsieve") || !strcmp(prog, "build-cuda/kvsieve")) {
                    n_inv++;
                    bad += rd_check_invocation(&ws, b + 1, e, where, err, cap);
                } else if (!strcmp(prog, "make")) {
                    for (int k = b + 1; k < e; k++) {
                        const char *t = ws.w[k].val;
                        if (t[0] == '-' || strchr(t, '=')) continue;
                        n_make++;
                        if (!rd_is_make_target(mk, cuda_mk, t)) {
                            size_t el = strlen(err);
                            snprintf(err + el, cap - el, "%s: make %s: no such target in Makefile or kernels/cuda.mk\n", where, t);
                            bad++;
                        }
                    }
                }
            }
            s = e < ws.n ? e + 1 : e;
        }
        rd_words_free(&ws);
    }
    /* inline code spans of the prose that show a kvsieve command */
    int n_inline = 0;
    for (char *p = strchr(d.prose, '`'); p;) {
        char *q = strchr(p + 1, '`');
        if (!q) break;
        if (q == p + 1) { p = strchr(q + 1, '`'); continue; } /* `` */
        char *span = strndup(p + 1, (size_t)(q - p - 1));
        for (char *c = span; *c; c++)
            if (*c == '\n') *c = ' ';
        const char *cmd = NULL;
        if (!strncmp(span, "build/kvsieve ", 14)) cmd = span;
        else if (!strncmp(span, "kvsieve ", 8)) cmd = span;
        if (cmd) {
            rd_words ws;
            rd_split(cmd, &ws);
            snprintf(where, sizeof where, "README.md prose `%.40s`", span);
            int e = 0;
            while (e < ws.n && !ws.w[e].op) e++;
            n_inline++;
            bad += rd_check_invocation(&ws, 1, e, where, err, cap);
            rd_words_free(&ws);
        }
        free(span);
        p = strchr(q + 1, '`');
    }
    printf("    README: %d kvsieve command lines, %d inline kvsieve commands, %d make targets checked\n", n_inv, n_inline, n_make);
    rd_free(&d);
    free(mk);
    free(cuda_mk);
    if (bad) {
        fprintf(stderr, "%s", err);
        char first[512];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(err, "\n"), err);
        free(err);
        KT_CHECK(0, "%d options, commands or targets in README.md that do not exist; the first: %s", bad, first);
    }
    free(err);
    KT_CHECK(n_inv >= 5, "only %d build/kvsieve lines found in README.md's sh blocks (a parsing problem?)", n_inv);
}

/* The reason a line is not run, or NULL to run it. */
static const char *rd_why_not(const rd_words *ws, char *buf, size_t cap, const char *host) {
    const char *ph = rd_placeholder(ws);
    if (ph) { snprintf(buf, cap, "needs %.40s (a model or folder that is not bundled)", ph); return buf; }
    if (ws->n == 0) return "empty";
    const char *first = ws->w[0].val;
    if (!strcmp(first, "make")) return "a make target (a job of its own)";
    if (!strcmp(first, "bash") || !strcmp(first, "sh") || !strcmp(first, "python3")) return "a script (GPU or long job)";
    if (rd_has_prefix(ws, "build-cuda/") || rd_has_word(ws, "cuda")) return "needs the CUDA build and a GPU";
    if (rd_has_prefix(ws, "build/ks_tests")) return "the test runner itself";
    int kv = rd_has_word(ws, "build/kvsieve"), ho = rd_has_word(ws, "build/host");
    int redirect = 0;
    for (int i = 0; i < ws->n; i++) redirect |= ws->w[i].op == '>';
    if (!kv && !ho && !redirect) {
        if (!strcmp(first, "cc") || !strcmp(first, "export") || !strncmp(first, "./", 2) || !strcmp(first, "pkg-config"))
            return "needs `make install` (tests/test_install.c builds examples/host.c that way)";
        snprintf(buf, cap, "not a build/ binary (%.60s)", first);
        return buf;
    }
    if (ho && !host) return "KS_HOST not set";
    if (rd_has_prefix(ws, "models/kvsieve-tiny-base") && !rd_exists("models/kvsieve-tiny-base/model.safetensors"))
        return "models/kvsieve-tiny-base has no weights (make base-model)";
    for (int i = 0; i < ws->n; i++) {
        if (strncmp(ws->w[i].val, "../shared/", 10)) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", kt_shared_dir(), ws->w[i].val + 10);
        if (!rd_exists(p)) { snprintf(buf, cap, "%.120s absent", p); return buf; }
    }
    /* eval's default haystack folder, as it looks for it (from the working directory) */
    if ((rd_has_word(ws, "niah") || rd_has_word(ws, "multikey")) && !rd_has_word(ws, "--corpora") &&
        !rd_exists("../shared/corpora") && !rd_exists(".data/corpora"))
        return "needs ../shared/corpora (the NIAH haystack)";
    return NULL;
}

/* Appends `s` to the script, single-quoted for sh unless it is plain. */
static void rd_emit(FILE *f, const char *s) {
    int plain = *s != 0;
    for (const char *c = s; *c; c++) plain &= isalnum((unsigned char)*c) || strchr("/._-=,:+@%", *c) != NULL;
    if (plain) { fputs(s, f); return; }
    fputc('\'', f);
    for (const char *c = s; *c; c++) {
        if (*c == '\'') fputs("'\\''", f);
        else fputc(*c, f);
    }
    fputc('\'', f);
}

typedef struct {
    char name[16][128];
    int n;
} rd_files;

static int rd_is_scratch(const rd_files *sf, const char *v) {
    for (int i = 0; i < sf->n; i++)
        if (!strcmp(sf->name[i], v)) return 1;
    return 0;
}

KT_SLOW_TEST(readme_commands_run) {
    if (!rd_bin()) KT_SKIP("KS_BIN not set (run through make test)");
    if (!rd_at_root()) KT_SKIP("not run from the repository root (README.md, Makefile, models/)");
    if (!rd_exists("models/kvsieve-tiny/model.safetensors")) KT_SKIP("models/kvsieve-tiny absent");
    const char *host = getenv("KS_HOST");
    if (host && !*host) host = NULL;
    rd_doc d;
    KT_CHECK(rd_load(&d) == 0, "README.md unreadable");
    char tmp[256];
    KT_CHECK(kt_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    const char *shared = getenv("KS_SHARED");

    /* the files the README's lines write: > targets and the values of --out, --png, --json */
    rd_files sf = {0};
    for (int i = 0; i < d.n; i++) {
        rd_words ws;
        rd_split(d.v[i].text, &ws);
        for (int k = 0; k + 1 < ws.n; k++) {
            const rd_word *w = &ws.w[k], *nx = &ws.w[k + 1];
            int names = (w->op == '>' && !nx->op) ||
                        (!w->op && (!strcmp(w->val, "--out") || !strcmp(w->val, "--png") || !strcmp(w->val, "--json")));
            if (!names || nx->op || rd_is_scratch(&sf, nx->val) || sf.n == 16 || strlen(nx->val) >= 128) continue;
            if (rd_placeholder(&(rd_words){(rd_word *)nx, 1})) continue;
            snprintf(sf.name[sf.n++], sizeof sf.name[0], "%s", nx->val);
        }
        rd_words_free(&ws);
    }

    /* why lines were not run, with counts */
    struct { char why[160]; int n; } nots[24];
    memset(nots, 0, sizeof nots);
    int n_nots = 0, n_run = 0, n_fail = 0;
    size_t cap = 32768;
    char *fails = calloc(cap, 1), script[512], log[512], cmd[2048], why_buf[160], out[512];
    snprintf(script, sizeof script, "%s/readme-cmd.sh", tmp);
    snprintf(log, sizeof log, "%s/readme-cmd.log", tmp);
    for (int i = 0; i < d.n; i++) {
        rd_words ws;
        rd_split(d.v[i].text, &ws);
        const char *why = rd_why_not(&ws, why_buf, sizeof why_buf, host);
        if (why) {
            int j = 0;
            while (j < n_nots && strcmp(nots[j].why, why)) j++;
            if (j == n_nots && n_nots < 24) snprintf(nots[n_nots++].why, sizeof nots[0].why, "%s", why);
            if (j < 24) nots[j].n++;
            printf("    not run: README.md:%d: %s\n", d.v[i].line, why);
            rd_words_free(&ws);
            continue;
        }
        /* the rewritten line, as an sh script */
        FILE *f = fopen(script, "w");
        if (!f) {
            size_t el = strlen(fails);
            snprintf(fails + el, cap - el, "README.md:%d: cannot write %s\n", d.v[i].line, script);
            n_fail++;
            rd_words_free(&ws);
            continue;
        }
        int n_out = 0;
        char outs[8][700], outs_name[8][128];
        for (int k = 0; k < ws.n; k++) {
            const rd_word *w = &ws.w[k];
            if (k) fputc(' ', f);
            if (w->op) { fputc(w->op, f); continue; }
            char buf[1024];
            const char *v = w->val;
            if (!strcmp(v, "build/kvsieve")) v = rd_bin();
            else if (!strcmp(v, "build/host")) v = host;
            else if (rd_is_scratch(&sf, v)) {
                snprintf(buf, sizeof buf, "%s/%s", tmp, v);
                for (char *c = buf + strlen(tmp) + 1; *c; c++)
                    if (*c == '/') *c = '_';
                int writes = k > 0 && (ws.w[k - 1].op == '>' || (!ws.w[k - 1].op && (!strcmp(ws.w[k - 1].val, "--out") ||
                                                                                        !strcmp(ws.w[k - 1].val, "--png") ||
                                                                                        !strcmp(ws.w[k - 1].val, "--json"))));
                if (writes && n_out < 8) {
                    snprintf(outs_name[n_out], sizeof outs_name[0], "%s", v);
                    snprintf(outs[n_out++], sizeof outs[0], "%.699s", buf);
                }
                v = buf;
            } else if (shared && !strncmp(v, "../shared/", 10)) {
                snprintf(buf, sizeof buf, "%s/%s", shared, v + 10);
                v = buf;
            }
            rd_emit(f, v);
        }
        fputc('\n', f);
        fclose(f);
        /* a file this line writes must exist afterwards: remove an earlier one first, unless the
         * line also reads it (--resume r.json ... --out r.json) */
        for (int k = 0; k < n_out; k++) {
            int reads = 0;
            const char *base = outs_name[k];
            for (int j = 1; j < ws.n; j++) {
                const rd_word *w = &ws.w[j], *pv = &ws.w[j - 1];
                int wpos = pv->op == '>' || (!pv->op && (!strcmp(pv->val, "--out") || !strcmp(pv->val, "--png") ||
                                                         !strcmp(pv->val, "--json")));
                reads |= !w->op && !wpos && !strcmp(w->val, base);
            }
            if (!reads) unlink(outs[k]);
        }
        snprintf(cmd, sizeof cmd, "timeout 300 sh %s > %s 2>&1 < /dev/null", script, log);
        n_run++;
        int rc = kt_sh(cmd, out, sizeof out);
        char missing[700] = "";
        for (int k = 0; k < n_out && !missing[0]; k++)
            if (!rd_exists(outs[k])) snprintf(missing, sizeof missing, "%.699s", outs[k]);
        printf("    ran: README.md:%d: exit %d%s%s\n", d.v[i].line, rc, missing[0] ? ", did not write " : "", missing);
        if (rc != 0 || missing[0]) {
            n_fail++;
            char *lt = rd_slurp(log);
            const char *tail = lt ? lt : "";
            size_t tl = strlen(tail);
            if (tl > 600) tail += tl - 600;
            size_t el = strlen(fails);
            if (el < cap)
                snprintf(fails + el, cap - el, "README.md:%d: exit %d%s%s: %s\n  output: %s\n", d.v[i].line, rc,
                         missing[0] ? ", did not write " : "", missing, d.v[i].text, tail);
            free(lt);
        }
        rd_words_free(&ws);
    }
    printf("    README: %d command lines: %d run (%d failed), %d not run\n", d.n, n_run, n_fail, d.n - n_run);
    for (int j = 0; j < n_nots; j++) printf("      not run %2d x: %s\n", nots[j].n, nots[j].why);
    rd_free(&d);
    kt_rmdir(tmp);
    if (n_fail) {
        fprintf(stderr, "%s", fails);
        char first[600];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(fails, "\n"), fails);
        free(fails);
        KT_CHECK(0, "%d of %d README command lines failed; the first: %s", n_fail, n_run, first);
    }
    free(fails);
    KT_CHECK(n_run >= 10, "only %d README command lines ran (a parsing problem?)", n_run);
}
