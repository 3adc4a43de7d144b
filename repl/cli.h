/* cli.h — the subcommands of the kvsieve binary; each returns the process exit status. */
#ifndef KS_CLI_H
#define KS_CLI_H
int ks_cli_generate(int argc, char **argv);
int ks_cli_bench(int argc, char **argv);
int ks_cli_tokenize(int argc, char **argv);
int ks_cli_repl(int argc, char **argv);
int ks_cli_run(int argc, char **argv);
int ks_cli_eval(int argc, char **argv);
/* print "kvsieve: <last error>" and return 1 */
int ks_cli_fail(const char *what);
#endif
