/* cmd_lua.c — `kvsieve run SCRIPT.lua [args]` and `kvsieve repl [-m DIR]`.
 *
 * Both run an unsandboxed host Lua state with the kvsieve module (global `ks`, also
 * require "kvsieve"). The REPL works like lua.c: each input is first tried as an
 * expression ("return " .. line) whose values are printed; an incomplete chunk continues
 * on the next line (">> "); Ctrl-C stops the running chunk or request (the engine checks
 * the flag between layers and tokens, policy states in their instruction hook) and not the
 * REPL. With readline (built with -DKS_HAVE_READLINE) there is line editing and history
 * (~/.kvsieve_history); without a terminal on stdin there are no prompts or banner, and the
 * exit status is 1 if any input failed. */
#include "cli.h"
#include "kvsieve.h"
#include "ks_lua.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KS_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

static volatile sig_atomic_t g_sigint;
static lua_State *g_L; /* the state whose running chunk Ctrl-C stops */

/* ================================================================ signals */

static void l_stop_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted");
}

/* SIGINT while Lua runs: set the flag (the engine and policy hooks poll it) and make the
 * host state stop at its next instruction (setting a hook is signal-safe, as in lua.c). */
static void on_sigint_running(int sig) {
    (void)sig;
    g_sigint = 1;
    if (g_L) lua_sethook(g_L, l_stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* SIGINT while reading input: cancel the line. */
static void on_sigint_input(int sig) {
    (void)sig;
    g_sigint = 1;
}

static void set_sigint(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocked read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

/* ================================================================ running chunks */

static int l_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Call the function below narg arguments with a traceback handler, Ctrl-C enabled. */
static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, l_msgh);
    lua_insert(L, base);
    g_sigint = 0;
    g_L = L;
    set_sigint(on_sigint_running);
    int r = lua_pcall(L, narg, nres, base);
    set_sigint(SIG_DFL);
    g_L = NULL;
    lua_sethook(L, NULL, 0, 0);
    g_sigint = 0;
    lua_remove(L, base);
    return r;
}

static void report_error(lua_State *L, const char *prefix) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s%s\n", prefix, msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
}

static lua_State *new_state(void) {
    lua_State *L = ks_lua_host_state();
    if (!L) {
        fprintf(stderr, "kvsieve: cannot create a Lua state (out of memory)\n");
        return NULL;
    }
    ks_lua_set_interrupt(&g_sigint);
    /* global ks = require "kvsieve" */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "kvsieve");
    if (docall(L, 1, 1) != LUA_OK) {
        report_error(L, "kvsieve: ");
        lua_close(L);
        return NULL;
    }
    lua_setglobal(L, "ks");
    return L;
}

/* ================================================================ kvsieve run */

int ks_cli_run(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: kvsieve run SCRIPT.lua [args...]   (SCRIPT '-' reads stdin)\n");
        return 2;
    }
    const char *script = argv[1];
    lua_State *L = new_state();
    if (!L) return 1;
    /* arg table as lua.c builds it: arg[0] = script, arg[1..] = its arguments */
    lua_createtable(L, argc - 2, 2);
    lua_pushliteral(L, "kvsieve run");
    lua_rawseti(L, -2, -1);
    for (int i = 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - 1);
    }
    lua_setglobal(L, "arg");
    int rc = 0;
    int r = luaL_loadfilex(L, strcmp(script, "-") ? script : NULL, "bt");
    if (r != LUA_OK) {
        report_error(L, "kvsieve: ");
        rc = 1;
    } else {
        for (int i = 2; i < argc; i++) lua_pushstring(L, argv[i]);
        if (docall(L, argc - 2, 0) != LUA_OK) {
            report_error(L, "kvsieve: ");
            rc = 1;
        }
    }
    lua_close(L);
    return rc;
}

/* ================================================================ kvsieve repl */

static int g_tty;
static int g_cancel_chunk; /* readline: Ctrl-C at a prompt since the line began */

#ifdef KS_HAVE_READLINE
/* Ctrl-C at the prompt: drop the line being edited and start a fresh prompt (readline keeps
 * running; called from readline's read loop after the signal interrupted it). */
static int rl_check_cancel(void) {
    if (g_sigint) {
        g_sigint = 0;
        g_cancel_chunk = 1; /* a pending multi-line chunk is abandoned too */
        rl_set_prompt("> ");
        rl_free_line_state();
        rl_replace_line("", 0);
        rl_point = rl_end = rl_mark = 0;
        fputc('\n', rl_outstream ? rl_outstream : stdout);
        rl_on_new_line();
        rl_redisplay();
    }
    return 0;
}
#endif

/* One line of input without its newline (malloc'd), or NULL at end of input. *cancelled is
 * set when Ctrl-C abandoned input: without readline the line comes back empty; with readline
 * the prompt starts afresh and the line typed after it comes back (a new chunk). */
static char *read_line(const char *prompt, int *cancelled) {
    *cancelled = 0;
    g_sigint = 0;
    set_sigint(on_sigint_input);
    char *line = NULL;
#ifdef KS_HAVE_READLINE
    if (g_tty) {
        g_cancel_chunk = 0;
        line = readline(prompt);
        *cancelled = g_cancel_chunk;
        set_sigint(SIG_DFL);
        return line;
    }
#endif
    if (g_tty) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    size_t cap = 0;
    ssize_t n;
    errno = 0;
    n = getline(&line, &cap, stdin);
    if (n < 0) {
        if (g_sigint) { /* interrupted read: cancel the line and go on */
            clearerr(stdin);
            *cancelled = 1;
            if (!line) line = malloc(1);
            if (line) line[0] = 0;
            fputc('\n', stdout);
        } else {
            free(line);
            line = NULL;
        }
    } else if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
    set_sigint(SIG_DFL);
    return line;
}

/* Is the load error at the top of the stack an incomplete chunk? (lua.c's rule) */
static int incomplete(lua_State *L, int status) {
    if (status != LUA_ERRSYNTAX) return 0;
    size_t l;
    const char *msg = lua_tolstring(L, -1, &l);
    static const char eof[] = "<eof>";
    if (l >= sizeof eof - 1 && !strcmp(msg + l - (sizeof eof - 1), eof)) {
        lua_pop(L, 1);
        return 1;
    }
    return 0;
}

static void print_results(lua_State *L, int n) {
    if (n <= 0) return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getglobal(L, "print");
    lua_insert(L, -(n + 1));
    if (lua_pcall(L, n, 0, 0) != LUA_OK) report_error(L, "kvsieve: error calling print: ");
}

static void help(void) {
    printf("kvsieve REPL — Lua 5.4 with the kvsieve module as `ks`\n"
           "  m = ks.load(\"../shared/models/stories260K\"); s = m:session()\n"
           "  r = s:generate(\"Once upon a time\", {n = 32, policy = \"NAME\", set = {k = 64}})\n"
           "  r.text  r.ids  r.report  r.kept(layer, head)  ks.show_kept(r, m, {layer = 3})\n"
           "  ks.kept_table(r)  ks.occupancy(r)  ks.timings(r)  ks.sparkline(values)\n"
           "  inline policy: s:generate(p, {policy = {prefill_qkv = function(ev, p) ... end}})\n"
           "Ctrl-C stops a running request; /quit (or Ctrl-D) leaves; /help shows this.\n");
}

int ks_cli_repl(int argc, char **argv) {
    const char *model = NULL, *backend = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else {
            fprintf(stderr, "usage: kvsieve repl [-m DIR] [--backend cpu|cuda]\n");
            return 2;
        }
    }
    g_tty = isatty(0);
    lua_State *L = new_state();
    if (!L) return 1;
    int failures = 0;
    if (g_tty) printf("kvsieve %s (Lua 5.4) — /help for help, Ctrl-D to leave\n", "0.1");
    if (model) {
        lua_getglobal(L, "ks");
        lua_getfield(L, -1, "load");
        lua_remove(L, -2);
        lua_pushstring(L, model);
        if (backend) {
            lua_createtable(L, 0, 1);
            lua_pushstring(L, backend);
            lua_setfield(L, -2, "backend");
        } else lua_pushnil(L);
        if (docall(L, 2, 1) != LUA_OK) {
            report_error(L, "kvsieve: ");
            lua_close(L);
            return 1;
        }
        lua_pushvalue(L, -1);
        lua_setglobal(L, "m");
        lua_getfield(L, -1, "session");
        lua_insert(L, -2);
        if (docall(L, 1, 1) != LUA_OK) {
            report_error(L, "kvsieve: ");
            lua_close(L);
            return 1;
        }
        lua_setglobal(L, "s");
        if (g_tty) printf("m = ks.load(\"%s\"); s = m:session()\n", model);
    }
#ifdef KS_HAVE_READLINE
    char hist[4096] = "";
    if (g_tty) {
        rl_catch_signals = 0;
        rl_signal_event_hook = rl_check_cancel;
        const char *home = getenv("HOME");
        if (home) {
            snprintf(hist, sizeof hist, "%s/.kvsieve_history", home);
            read_history(hist);
        }
    }
#endif
    char *next = NULL; /* a line typed after Ctrl-C abandoned a multi-line chunk */
    for (;;) {
        int cancelled = 0;
        char *line = next ? next : read_line("> ", &cancelled);
        next = NULL;
        if (!line) break;
        if (cancelled && !*line) { free(line); continue; }
        const char *t = line;
        while (*t == ' ' || *t == '\t') t++;
        if (!*t) { free(line); continue; }
        if (t[0] == '/') {
            if (!strcmp(t, "/quit") || !strcmp(t, "/q") || !strcmp(t, "/exit")) { free(line); break; }
            if (!strcmp(t, "/help") || !strcmp(t, "/h")) help();
            else fprintf(stderr, "kvsieve: unknown command %s (/help, /quit)\n", t);
            free(line);
            continue;
        }
        /* first as an expression, then as statements, continuing incomplete chunks */
        int base = lua_gettop(L);
        lua_pushfstring(L, "return %s", line);
        int status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=stdin");
        lua_remove(L, -2);
        luaL_Buffer b;
        if (status != LUA_OK) {
            lua_pop(L, 1);
            lua_pushstring(L, line); /* the chunk so far, at base + 1 */
            for (;;) {
                status = luaL_loadbuffer(L, lua_tostring(L, base + 1), lua_rawlen(L, base + 1), "=stdin");
                if (!incomplete(L, status)) break;
                char *more = read_line(">> ", &cancelled);
                if (!more || cancelled) { /* end of input, or Ctrl-C: abandon the chunk */
                    if (more && *more) next = more;
                    else free(more);
                    status = -1;
                    break;
                }
                luaL_buffinit(L, &b);
                lua_pushvalue(L, base + 1);
                luaL_addvalue(&b);
                luaL_addchar(&b, '\n');
                luaL_addstring(&b, more);
                luaL_pushresult(&b);
                lua_replace(L, base + 1);
                free(more);
            }
            if (status == -1) {
                lua_settop(L, base);
                free(line);
                continue;
            }
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(lua_tostring(L, base + 1));
#endif
            lua_remove(L, base + 1);
        } else {
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(line);
#endif
        }
        free(line);
        if (status != LUA_OK) {
            report_error(L, "");
            failures++;
            lua_settop(L, base);
            continue;
        }
        if (docall(L, 0, LUA_MULTRET) != LUA_OK) {
            report_error(L, "");
            failures++;
        } else print_results(L, lua_gettop(L) - base);
        lua_settop(L, base);
        fflush(stdout);
    }
#ifdef KS_HAVE_READLINE
    if (g_tty && hist[0]) write_history(hist);
#endif
    if (g_tty) printf("\n");
    lua_close(L);
    ks_lua_set_interrupt(NULL);
    return (!g_tty && failures) ? 1 : 0;
}
