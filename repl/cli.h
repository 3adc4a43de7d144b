/* cli.h — the subcommands of the kvsieve binary; each returns the process exit status. */
#ifndef KS_CLI_H
#define KS_CLI_H
#include <stdint.h>

int ks_cli_generate(int argc, char **argv);
int ks_cli_bench(int argc, char **argv);
int ks_cli_tokenize(int argc, char **argv);
int ks_cli_repl(int argc, char **argv);
int ks_cli_run(int argc, char **argv);
int ks_cli_eval(int argc, char **argv);
/* print "kvsieve: <last error>" and return 1 */
int ks_cli_fail(const char *what);

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
