/* test_install.c — `make install` gives a library that a stranger's program can use: install
 * into a temporary PREFIX, build examples/host.c exactly as the header says,
 *     cc examples/host.c $(pkg-config --cflags --libs kvsieve)
 * with PKG_CONFIG_PATH pointing into it, run it on the bundled model (the Lua policy and the same
 * policy written in C keep the same rows), check the soname, that the .so exports only ks_*
 * names, DESTDIR staging, and `make uninstall`.
 *
 * It builds its own library: make runs in a clean environment (no MAKEFLAGS, SANITIZE off) with
 * BUILD = the folder of $KS_BIN, whose pic/ subfolder holds the PIC objects, so under
 * `make test SANITIZE=1` too it checks the plain library (the sanitizers are not its subject). */
#include "kvsieve.h"
#include "ktest.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROMPT "The grass is green. The sky is blue. The sun is bright. The grass is"

static int exists(const char *dir, const char *rel) {
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s%s", dir, rel);
    return lstat(p, &st) == 0;
}

/* The "layer L, KV head 0: ..." lines of a host run, joined. */
static void kept_lines(const char *out, char *dst, size_t cap) {
    dst[0] = 0;
    for (const char *l = strstr(out, "layer "); l; l = strstr(l + 1, "\nlayer ")) {
        if (*l == '\n') l++;
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l + 1) : strlen(l), len = strlen(dst);
        if (len + n + 1 > cap) break;
        memcpy(dst + len, l, n);
        dst[len + n] = 0;
    }
}

KT_SLOW_TEST(install_then_build_example_host_with_pkg_config) {
    const char *bin = getenv("KS_BIN");
    if (!bin || !*bin) KT_SKIP("KS_BIN not set (run through make test)");
    char out[32768], cmd[4096], build[512], tmp[256];
    if (kt_sh("command -v make && command -v cc && command -v pkg-config && command -v nm && command -v readelf", out,
              sizeof out))
        KT_SKIP("make, cc, pkg-config, nm or readelf missing");
    if (access("Makefile", R_OK) || access("examples/host.c", R_OK) || access("models/kvsieve-tiny/config.json", R_OK))
        KT_SKIP("not run from the repository root");
    snprintf(build, sizeof build, "%s", bin);
    char *slash = strrchr(build, '/');
    if (slash) *slash = 0;
    else snprintf(build, sizeof build, ".");
    KT_CHECK(kt_tmpdir(tmp, sizeof tmp) == 0, "tmpdir");
    const char *make = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES make --no-print-directory -s -j2 "
                       "CUDA=0 SANITIZE=";

    /* 1. install into PREFIX = tmp/usr */
    snprintf(cmd, sizeof cmd, "%s BUILD=%s PREFIX=%s/usr install 2>&1", make, build, tmp);
    int rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "make install: exit %d: %s", rc, out);
    char real[64], soname[64];
    snprintf(real, sizeof real, "/usr/lib/libkvsieve.so.%d.%d.%d", KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH);
    if (KS_VERSION_MAJOR == 0) snprintf(soname, sizeof soname, "libkvsieve.so.0.%d", KS_VERSION_MINOR);
    else snprintf(soname, sizeof soname, "libkvsieve.so.%d", KS_VERSION_MAJOR);
    const char *want[] = {real, "/usr/lib/libkvsieve.so", "/usr/lib/libkvsieve.a", "/usr/include/kvsieve.h",
                          "/usr/lib/pkgconfig/kvsieve.pc"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) KT_CHECK(exists(tmp, want[i]), "%s not installed", want[i]);
    char rel[128];
    snprintf(rel, sizeof rel, "/usr/lib/%s", soname);
    KT_CHECK(exists(tmp, rel), "no %s link", soname);

    /* 2. the .so: its soname, and nothing exported but the API (no Lua, PCRE2 or helpers) */
    snprintf(cmd, sizeof cmd, "readelf -d %s%s", tmp, real);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && strstr(out, soname), "soname is not %s: %s", soname, out);
    snprintf(cmd, sizeof cmd, "nm -D --defined-only %s%s | awk '{print $3}' | grep -v '^ks_'", tmp, real);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 1 && !out[0], "exported beyond ks_*: %s", out);
    /* every function kvsieve.h declares (its KS_API lines) is exported: the names the header
     * declares, less those nm lists, is empty */
    snprintf(cmd, sizeof cmd,
             "grep '^KS_API' include/kvsieve.h | sed 's/(.*//' | awk '{print $NF}' | tr -d '*' | sort -u > %s/api.txt && "
             "test $(wc -l < %s/api.txt) -gt 100 && nm -D --defined-only %s%s | awk '{print $3}' | sort -u > %s/nm.txt && "
             "comm -23 %s/api.txt %s/nm.txt | tr '\\n' ' '",
             tmp, tmp, tmp, real, tmp, tmp, tmp);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && !out[0], "API functions not exported: %s", out);

    /* 3. a host program built the documented way, run against the installed library */
    snprintf(cmd, sizeof cmd,
             "export PKG_CONFIG_PATH=%s/usr/lib/pkgconfig && cc examples/host.c $(pkg-config --cflags --libs kvsieve) "
             "-o %s/host 2>&1",
             tmp, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "cc with pkg-config: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH=%s/usr/lib ldd %s/host", tmp, tmp);
    KT_CHECK(kt_sh(cmd, out, sizeof out) == 0 && strstr(out, soname) && strstr(out, tmp), "not linked to the installed .so: %s",
             out);
    char lua_kept[2048], c_kept[2048];
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH=%s/usr/lib %s/host models/kvsieve-tiny '" PROMPT "'", tmp, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "host: exit %d: %s", rc, out);
    char ver[96];
    snprintf(ver, sizeof ver, "kvsieve %d.%d.%d (header %d.%d.%d)", KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH,
             KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH);
    KT_CHECK(strstr(out, ver), "no \"%s\": %s", ver, out);
    KT_CHECK(strstr(out, "policy host_sinks: 19 prompt tokens, 32 generated"), "no policy line: %s", out);
    /* 4 sinks + 12 recent rows after prefill, then one row per decode step (31) */
    KT_CHECK(strstr(out, "layer 7, KV head 0: 47 rows resident (positions 0 .. 49)"), "kept rows: %s", out);
    KT_CHECK(strstr(out, "report kept = 16") && strstr(out, "last step's top 3: "), "report / logprobs: %s", out);
    kept_lines(out, lua_kept, sizeof lua_kept);
    strcat(cmd, " c");
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "host c: exit %d: %s", rc, out);
    kept_lines(out, c_kept, sizeof c_kept);
    KT_CHECK(lua_kept[0] && !strcmp(lua_kept, c_kept), "the C policy kept other rows:\n%s\nLua:\n%s", c_kept, lua_kept);

    /* 4. DESTDIR stages under another root; .pc names the final PREFIX; uninstall removes all */
    snprintf(cmd, sizeof cmd, "%s BUILD=%s PREFIX=/opt/ks DESTDIR=%s/stage install 2>&1 && cat %s/stage/opt/ks/lib/pkgconfig/kvsieve.pc",
             make, build, tmp, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0 && strstr(out, "prefix=/opt/ks\n") && strstr(out, "Libs: -L${libdir} -lkvsieve"), "DESTDIR: %d: %s", rc, out);
    char stage[320];
    snprintf(stage, sizeof stage, "%s/stage/opt/ks", tmp);
    KT_CHECK(exists(stage, "/lib/libkvsieve.so") && exists(stage, "/include/kvsieve.h"), "DESTDIR install incomplete");
    snprintf(cmd, sizeof cmd, "%s BUILD=%s PREFIX=/opt/ks DESTDIR=%s/stage uninstall 2>&1 && %s BUILD=%s PREFIX=%s/usr uninstall 2>&1",
             make, build, tmp, make, build, tmp);
    rc = kt_sh(cmd, out, sizeof out);
    KT_CHECK(rc == 0, "uninstall: %d: %s", rc, out);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        KT_CHECK(!exists(tmp, want[i]), "%s left after uninstall", want[i]);
        KT_CHECK(!exists(stage, want[i] + 4), "%s left in DESTDIR after uninstall", want[i] + 4);
    }
    KT_CHECK(!exists(tmp, rel), "%s left after uninstall", rel);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    kt_sh(cmd, out, sizeof out);
}
