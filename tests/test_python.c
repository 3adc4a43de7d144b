/* test_python.c — the Python package (python/, issue 16) installed the documented way and its
 * tests (tests/python/test_*.py) run with pytest.
 *
 *   python_package_pytest (slow tier)
 *     1. builds libkvsieve.so (`make lib` in the folder of $KS_BIN, clean environment, SANITIZE
 *        off: the sanitizers are not its subject; test_install does the same);
 *     2. writes the C API's reference for tests/python/test_kept.py: for three pruning policies
 *        (snapkv: kept rows chosen by attention scores, gemfilter: a restart, streamingllm: a
 *        window) the generated ids, ks_result_restart and ks_result_kept of every layer and KV
 *        head, through the engine linked into this runner (the static library, not the .so);
 *     3. installs the package as README.md says: a venv of the system python3 with its site
 *        packages (numpy), `pip install --no-build-isolation` of a copy of python/ (so the build
 *        leaves nothing in the checkout), bundling the .so of step 1;
 *     4. runs `python -m pytest tests/python` with that venv's python; every test must pass and
 *        none may be skipped (the reference and the venv are given: KS_PY_REFERENCE, KS_PY_VENV;
 *        KS_BIN lets test_eval.py compare kvsieve.eval with `kvsieve eval`);
 *     5. runs examples/python_demo.py with it.
 *   Skipped, with the reason, when no python3 imports numpy (`python3` on PATH may be a pyenv
 *   interpreter without it: /usr/bin/python3 is tried first; $KS_PYTHON, when set, is the only
 *   one tried), or when that python lacks pytest, venv/ensurepip, setuptools or wheel
 *   (tools/deps.sh installs them all). */
#include "kvsieve.h"
#include "ktest.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the prompt and length of tests/python/conftest.py's PROMPT and test_kept.py */
#define PY_PROMPT "The grass is green. The sky is blue. The sun is bright. The grass is"
#define PY_NEW 12

typedef struct { const char *name, *params[8]; } py_ref_policy; /* params: key, value pairs, NULL-ended */
static const py_ref_policy py_ref_policies[] = {
    {"snapkv", {"budget", "12", "window", "4", "kernel", "3", NULL}},
    {"gemfilter", {"layer", "3", "k", "8", NULL}},
    {"streamingllm", {"budget", "16", "sinks", "4", NULL}},
};

/* The reference file of tests/python/test_kept.py; 0 or a message in err. */
static int py_write_reference(const char *path, char *err, size_t cap) {
    ks_model *m = NULL;
    ks_model_opts mo;
    ks_model_opts_default(&mo);
    mo.threads = 2;
    FILE *f = fopen(path, "w");
    if (!f) { snprintf(err, cap, "cannot write %s", path); return -1; }
    int rc = -1;
    if (ks_model_open_ex("models/kvsieve-tiny", &mo, &m)) { snprintf(err, cap, "open: %s", ks_last_error()); goto out; }
    for (size_t i = 0; i < sizeof py_ref_policies / sizeof *py_ref_policies; i++) {
        const py_ref_policy *rp = &py_ref_policies[i];
        ks_policy *p = NULL;
        ks_session *s = NULL;
        ks_generate_opts o;
        ks_generate_opts_default(&o);
        o.max_new_tokens = PY_NEW;
        int bad = ks_policy_load_path(m, rp->name, "policies", &p);
        for (int k = 0; !bad && rp->params[k]; k += 2) bad = ks_policy_set(p, rp->params[k], rp->params[k + 1]);
        if (!bad) bad = ks_session_create(m, &s);
        if (!bad) bad = ks_session_set_policy(s, p);
        if (!bad) bad = ks_generate(s, PY_PROMPT, &o, NULL, NULL);
        if (bad) {
            snprintf(err, cap, "%s: %s", rp->name, ks_last_error());
            ks_session_free(s);
            ks_policy_free(p);
            goto out;
        }
        fprintf(f, "policy %s", rp->name);
        for (int k = 0; rp->params[k]; k += 2) fprintf(f, " %s=%s", rp->params[k], rp->params[k + 1]);
        int n;
        const int32_t *ids = ks_result_ids(s, &n);
        fprintf(f, "\nids");
        for (int k = 0; k < n; k++) fprintf(f, " %d", ids[k]);
        fprintf(f, "\nrestart");
        n = ks_result_restart(s, &ids);
        for (int k = 0; k < n; k++) fprintf(f, " %d", ids[k]);
        fprintf(f, "\n");
        for (int l = 0; l < ks_model_n_layers(m); l++)
            for (int h = 0; h < ks_model_n_kv_heads(m); h++) {
                n = ks_result_kept(s, l, h, &ids);
                fprintf(f, "kept %d %d", l, h);
                for (int k = 0; k < n; k++) fprintf(f, " %d", ids[k]);
                fprintf(f, "\n");
            }
        fprintf(f, "end\n");
        ks_session_free(s);
        ks_policy_free(p);
    }
    rc = 0;
out:
    ks_model_close(m);
    if (fclose(f) && !rc) { snprintf(err, cap, "writing %s failed", path); rc = -1; }
    return rc;
}

KT_SLOW_TEST(python_package_pytest) {
    const char *bin = kt_bin();
    if (!bin) KT_SKIP("KS_BIN not set (run through make test)");
    if (access("Makefile", R_OK) || access("python/pyproject.toml", R_OK) || access("tests/python/conftest.py", R_OK) ||
        access("models/kvsieve-tiny/config.json", R_OK))
        KT_SKIP("not run from the repository root");
    static char out[65536];
    char cmd[8192], py[64] = "", build[512], tmp[256], err[1024];

    /* the interpreter: $KS_PYTHON if set, else the first that imports numpy */
    const char *env_py = getenv("KS_PYTHON");
    const char *cands[] = {env_py && *env_py ? env_py : "/usr/bin/python3", "python3"};
    for (size_t i = 0; i < (env_py && *env_py ? 1u : 2u) && !py[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy' </dev/null", cands[i]);
        if (kt_sh(cmd, out, sizeof out) == 0) snprintf(py, sizeof py, "%s", cands[i]);
    }
    if (!py[0])
        KT_SKIP("no python3 that imports numpy (tried %s; Debian: python3-numpy)",
                env_py && *env_py ? env_py : "/usr/bin/python3 and python3 on PATH");
    snprintf(cmd, sizeof cmd, "%s -c 'import pytest, venv, ensurepip, setuptools, wheel' </dev/null", py);
    if (kt_sh(cmd, out, sizeof out))
        KT_SKIP("%s lacks a package the test needs (Debian: python3-pytest python3-venv python3-setuptools "
                "python3-wheel): %.200s", py, out);

    snprintf(build, sizeof build, "%s", bin);
    char *slash = strrchr(build, '/');
    if (slash) *slash = 0;
    else snprintf(build, sizeof build, ".");
    KT_CHECK(kt_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");

    /* 1. the shared library */
    snprintf(cmd, sizeof cmd,
             "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES make --no-print-directory -s -j2 CUDA=0 "
             "SANITIZE= BUILD=%s lib </dev/null",
             build);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "make lib: exit %d: %s", rc, out);
    char so[768];
    snprintf(so, sizeof so, "%s/pic/libkvsieve.so.%d.%d.%d", build, KS_VERSION_MAJOR, KS_VERSION_MINOR,
             KS_VERSION_PATCH);
    KT_CHECK(access(so, R_OK) == 0, "%s not built", so);
    char *so_abs = realpath(so, NULL); /* pip runs setup.py in the package's folder */
    KT_CHECK(so_abs, "realpath %s", so);
    snprintf(so, sizeof so, "%s", so_abs);
    free(so_abs);

    /* 2. the C API's reference */
    char ref[320];
    snprintf(ref, sizeof ref, "%s/reference.txt", tmp);
    KT_CHECK(py_write_reference(ref, err, sizeof err) == 0, "reference: %s", err);

    /* 3. pip install into a venv, from a copy of python/, as README.md says (its lines checked) */
    char *readme = kt_slurp("README.md", NULL);
    KT_CHECK(readme, "README.md unreadable");
    int documented = strstr(readme, "\n/usr/bin/python3 -m venv --system-site-packages build/venv\n") &&
                     strstr(readme, "\nbuild/venv/bin/pip install --no-build-isolation ./python\n");
    free(readme);
    KT_CHECK(documented, "README.md no longer installs the package as this test does (venv --system-site-packages, "
                         "pip install --no-build-isolation): change both together");
    snprintf(cmd, sizeof cmd,
             "cp -r python '%s/python' && %s -m venv --system-site-packages '%s/venv' </dev/null && "
             "KVSIEVE_ROOT=\"$PWD\" KVSIEVE_LIBRARY='%s' '%s/venv/bin/pip' install -q --disable-pip-version-check "
             "--no-build-isolation '%s/python' </dev/null",
             tmp, py, tmp, so, tmp, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "pip install: exit %d: %s", rc, out);

    /* 4. pytest with the venv's python; the log in a file, its end in the failure message */
    snprintf(cmd, sizeof cmd,
             "KS_PY_REFERENCE='%s' KS_PY_VENV='%s/venv' PYTHONDONTWRITEBYTECODE=1 timeout 900 '%s/venv/bin/python' -m pytest "
             "-q -rs -p no:cacheprovider tests/python >'%s/pytest.log' 2>&1 </dev/null; rc=$?; tail -c 12000 '%s/pytest.log'; "
             "exit $rc",
             ref, tmp, tmp, tmp, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    const char *last = out + strlen(out);
    while (last > out && (last[-1] == '\n' || last[-1] == ' ')) last--;
    const char *sum = last;
    while (sum > out && sum[-1] != '\n') sum--;
    fprintf(stderr, "\n    pytest (%s venv): %.*s\n%47s", py, (int)(last - sum), sum, ""); /* the runner's column */
    KT_CHECK(rc == 0, "pytest: exit %d:\n%s", rc, out);
    KT_CHECK(strstr(sum, " passed") && !strstr(sum, "skipped") && !strstr(sum, "failed"),
             "pytest did not pass everything unskipped: %s", sum);

    /* 5. the example runs with the installed package */
    snprintf(cmd, sizeof cmd, "PYTHONDONTWRITEBYTECODE=1 timeout 300 '%s/venv/bin/python' examples/python_demo.py </dev/null", tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "examples/python_demo.py: exit %d: %s", rc, out);
    KT_CHECK(strstr(out, "greedy picked the argmax: True") && strstr(out, "PolicyError (policy)"),
             "examples/python_demo.py said: %s", out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    kt_sh(cmd, out, sizeof out);
}
