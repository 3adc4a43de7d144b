/* cli.h — the subcommands of the kvsieve binary; each returns the process exit status. */
#ifndef KS_CLI_H
#define KS_CLI_H
#include <stddef.h>
#include <stdint.h>

int ks_cli_generate(int argc, char **argv);
int ks_cli_bench(int argc, char **argv);
int ks_cli_tokenize(int argc, char **argv);
int ks_cli_repl(int argc, char **argv);
int ks_cli_run(int argc, char **argv);
int ks_cli_eval(int argc, char **argv);
int ks_cli_serve(int argc, char **argv);   /* repl/serve.c */
/* print "kvsieve: WHAT: <last error>" (its first line only, unless -v: a Lua traceback follows
 * it) and return 1 */
int ks_cli_fail(const char *what);

/* The version printed by `kvsieve --version`: the library's ks_version() where include/kvsieve.h
 * declares it (KS_VERSION_MAJOR), else this one (the only other place it is written). */
#define KS_CLI_VERSION "0.12.0"
const char *ks_cli_version(void);
/* -v / --verbose given: Lua tracebacks and the library's secondary messages are printed */
extern int ks_cli_verbose;
void ks_cli_set_verbose(void);        /* -v seen: sets ks_cli_verbose, un-quiets the library */
int ks_cli_is_help(const char *a);    /* "-h" or "--help" */
int ks_cli_is_verbose(const char *a); /* "-v" or "--verbose" */
/* print CMD's help (options, defaults, an example) on stdout; -1 if CMD is unknown */
int ks_cli_help(const char *cmd);

/* repl/args.c: the whole of FILE ("-" = stdin) as a NUL-terminated string, without one
 * trailing "\n" (or "\r\n"). A NUL byte inside, an unreadable file or no memory: prints one
 * line "kvsieve: ..." and returns -1. *out is malloc'd. */
int ks_cli_read_text(const char *path, char **out, size_t *n);

typedef struct ks_model ks_model;
typedef struct ks_policy ks_policy;
/* Check a loaded policy's parameters against the model before any work: runs the policy's
 * begin (where policies/NAME.lua validate, ks.config.n_layers included) on a scratch session.
 * Prints "kvsieve: WHAT: ..." and returns -1 when it refuses. */
int ks_cli_check_policy(ks_model *m, ks_policy *p, const char *what);
/* Apply "[NAME.]key=value" settings to policy NAME: a scoped key goes to NAME only; an unscoped
 * one to every policy, where an unknown key is an error only when `strict` (one policy). Prints
 * the error and returns -1 (2 is the exit status for it). */
/* Can PATH be written (before any work)? An existing file must be writable; a new one is created
 * and removed again. Prints "kvsieve: WHAT PATH: cannot write: why" and returns -1. */
int ks_cli_check_writable(const char *what, const char *path);
int ks_cli_apply_sets(ks_policy *p, const char *name, const char *const *sets, int n_sets, int strict);

/* Monotonic seconds, and this process's peak resident memory in bytes (0 if unknown). */
double ks_cli_now(void);
size_t ks_cli_peak_rss(void);

/* Strict number parsing for every option (repl/args.c). Each takes the option's name (for the
 * message) and its text; it accepts the whole text only when it is a number of the right kind
 * inside the range, else prints "kvsieve: OPT expects ... in RANGE, got "TEXT"" and returns -1
 * (0 on success, *out untouched on failure). */
int ks_arg_int(const char *opt, const char *v, int lo, int hi, int *out);
/* decimal or 0x-hex, 0 .. 2^64 - 1 ("-1" is refused, not wrapped) */
int ks_arg_u64(const char *opt, const char *v, uint64_t *out);
/* a finite number in [lo, hi] ((lo, hi] when lo_open); hi = INFINITY means no upper bound */
int ks_arg_double(const char *opt, const char *v, double lo, double hi, int lo_open, double *out);
int ks_arg_float(const char *opt, const char *v, double lo, double hi, int lo_open, float *out);
/* "512,1K,4096": at most max integers in [lo, hi], with a K (x1024) suffix when allow_k */
int ks_arg_int_list(const char *opt, const char *v, int lo, int hi, int allow_k, int *out, int max, int *n);
/* token ids in 0..INT32_MAX separated by commas and/or spaces; *ids is malloc'd (at least one) */
int ks_arg_ids(const char *opt, const char *v, int32_t **ids, int *n);
#endif
