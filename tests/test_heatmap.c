/* test_heatmap.c — repl/heatmap.c: CRC-32 / Adler-32 against known values, PNG files decoded by an
 * independent decoder (python3's zlib: every chunk CRC checked, inflate, unfilter, every pixel
 * compared), the NIAH heatmap (colours at known cells, file size) and the terminal table's text.
 *
 * The test runner links the tests/ sources with the engine library, which does not contain repl/; the
 * heatmap code is therefore compiled into this test directly (its static helpers, e.g. the font,
 * are then visible to the tests too). */
#include "../repl/heatmap.c"
#include "common.h" /* ks_read_file */

#include "ktest.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- the independent decoder */

/* Reads a PNG with nothing but the standard library: checks the signature, every chunk's CRC,
 * IHDR (8-bit RGB, no interlace), chunk order, inflates the IDAT stream (zlib checks Adler-32 and
 * completeness), undoes all five filter types and writes the raw RGB to argv[2]. Prints "ok W H". */
static const char *PY_DECODER =
    "import sys, zlib, struct\n"
    "def fail(m):\n"
    "    print('error ' + m); sys.exit(1)\n"
    "d = open(sys.argv[1], 'rb').read()\n"
    "if d[:8] != b'\\x89PNG\\r\\n\\x1a\\n': fail('signature')\n"
    "pos, idat, types, ihdr = 8, b'', [], None\n"
    "while pos < len(d):\n"
    "    if pos + 12 > len(d): fail('truncated chunk at %d' % pos)\n"
    "    n = struct.unpack('>I', d[pos:pos+4])[0]\n"
    "    typ, body = d[pos+4:pos+8], d[pos+8:pos+8+n]\n"
    "    if len(body) != n or pos + 12 + n > len(d): fail('truncated body')\n"
    "    crc = struct.unpack('>I', d[pos+8+n:pos+12+n])[0]\n"
    "    if zlib.crc32(typ + body) & 0xffffffff != crc: fail('crc of ' + typ.decode())\n"
    "    types.append(typ)\n"
    "    if typ == b'IHDR': ihdr = body\n"
    "    elif typ == b'IDAT': idat += body\n"
    "    pos += 12 + n\n"
    "if types[0] != b'IHDR' or types[-1] != b'IEND' or b'IDAT' not in types: fail('chunk order %r' % types)\n"
    "w, h, bd, ct, cm, fm, il = struct.unpack('>IIBBBBB', ihdr)\n"
    "if (bd, ct, cm, fm, il) != (8, 2, 0, 0, 0): fail('ihdr %r' % ((bd, ct, cm, fm, il),))\n"
    "z = zlib.decompressobj()\n"
    "raw = z.decompress(idat) + z.flush()\n"
    "if not z.eof or z.unused_data: fail('zlib stream incomplete or trailing bytes')\n"
    "stride = 3 * w\n"
    "if len(raw) != h * (stride + 1): fail('raw size %d, want %d' % (len(raw), h * (stride + 1)))\n"
    "out, prev = bytearray(), bytearray(stride)\n"
    "for y in range(h):\n"
    "    f = raw[y * (stride + 1)]\n"
    "    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])\n"
    "    for i in range(stride):\n"
    "        a = line[i - 3] if i >= 3 else 0\n"
    "        b = prev[i]\n"
    "        c = prev[i - 3] if i >= 3 else 0\n"
    "        if f == 0: p = 0\n"
    "        elif f == 1: p = a\n"
    "        elif f == 2: p = b\n"
    "        elif f == 3: p = (a + b) // 2\n"
    "        elif f == 4:\n"
    "            q = a + b - c; pa, pb, pc = abs(q - a), abs(q - b), abs(q - c)\n"
    "            p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)\n"
    "        else: fail('filter type %d' % f)\n"
    "        line[i] = (line[i] + p) & 255\n"
    "    out += line\n"
    "    prev = line\n"
    "open(sys.argv[2], 'wb').write(bytes(out))\n"
    "print('ok %d %d %d' % (w, h, types.count(b'IDAT')))\n";

static int have_python(void) { return system("python3 -c 'import zlib' >/dev/null 2>&1") == 0; }

/* Decode png with the python decoder into *rgb (malloc'd); 0 on success, else msg says why. */
static int py_decode(const char *dir, const char *png, int *w, int *h, uint8_t **rgb, char *msg, size_t mn) {
    char script[600], raw[600], cmd[2000], line[256] = "";
    snprintf(script, sizeof script, "%s/decode.py", dir);
    snprintf(raw, sizeof raw, "%s/decoded.rgb", dir);
    if (kt_write_file(dir, "decode.py", PY_DECODER)) { snprintf(msg, mn, "cannot write decode.py in %.200s", dir); return -1; }
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' 2>&1", script, png, raw);
    FILE *p = popen(cmd, "r");
    if (!p) { snprintf(msg, mn, "popen failed"); return -1; }
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    int rc = pclose(p);
    int nidat = 0;
    if (rc != 0 || sscanf(line, "ok %d %d %d", w, h, &nidat) != 3) { snprintf(msg, mn, "decoder: %s", line); return -1; }
    char *data;
    size_t len;
    if (ks_read_file(raw, &data, &len)) { snprintf(msg, mn, "%s", ks_last_error()); return -1; }
    if (len != (size_t)*w * *h * 3) { free(data); snprintf(msg, mn, "decoded %zu bytes for %dx%d", len, *w, *h); return -1; }
    *rgb = (uint8_t *)data;
    return 0;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

static uint32_t lcg(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* ---------------------------------------------------------------- checksums */

KT_TEST(heatmap_crc32_adler32) {
    KT_CHECK(ks_crc32(0, "123456789", 9) == 0xCBF43926u, "crc32(123456789) = %08X", ks_crc32(0, "123456789", 9));
    KT_CHECK(ks_crc32(0, "", 0) == 0, "crc32 of nothing");
    const char *fox = "The quick brown fox jumps over the lazy dog";
    KT_CHECK(ks_crc32(0, fox, strlen(fox)) == 0x414FA339u, "crc32(fox) = %08X", ks_crc32(0, fox, strlen(fox)));
    KT_CHECK(ks_crc32(ks_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u, "crc32 in two parts");
    KT_CHECK(ks_crc32(0, "IEND", 4) == 0xAE426082u, "crc32(IEND) (every PNG ends with it)");
    KT_CHECK(ks_adler32(1, "Wikipedia", 9) == 0x11E60398u, "adler32(Wikipedia) = %08X", ks_adler32(1, "Wikipedia", 9));
    KT_CHECK(ks_adler32(1, "", 0) == 1, "adler32 of nothing");
    KT_CHECK(ks_adler32(ks_adler32(1, "Wiki", 4), "pedia", 5) == 0x11E60398u, "adler32 in two parts");
    /* long input (the modulo is deferred for 5552 bytes): against the one-byte-at-a-time definition */
    size_t n = 200000;
    uint8_t *buf = malloc(n);
    KT_CHECK(buf, "malloc");
    uint32_t s = 7, a = 1, b = 0;
    for (size_t i = 0; i < n; i++) buf[i] = i % 3 ? 0xFF : (uint8_t)lcg(&s);
    for (size_t i = 0; i < n; i++) { a = (a + buf[i]) % 65521; b = (b + a) % 65521; }
    uint32_t got = ks_adler32(1, buf, n);
    free(buf);
    KT_CHECK(got == ((b << 16) | a), "adler32 of 200000 bytes: %08X, want %08X", got, (b << 16) | a);
}

/* ---------------------------------------------------------------- PNG round trips */

typedef struct img { const char *name; int w, h; uint8_t *rgb; } img;

static void make_images(img *im) {
    uint32_t s = 12345;
    im[0] = (img){"random", 97, 61, malloc(97 * 61 * 3)};                /* noise: stored blocks */
    for (int i = 0; i < 97 * 61 * 3; i++) im[0].rgb[i] = (uint8_t)lcg(&s);
    im[1] = (img){"flat", 300, 200, malloc(300 * 200 * 3)};              /* one colour: long matches */
    for (int i = 0; i < 300 * 200; i++) { im[1].rgb[3 * i] = 40; im[1].rgb[3 * i + 1] = 170; im[1].rgb[3 * i + 2] = 90; }
    im[2] = (img){"1x1", 1, 1, malloc(3)};
    im[2].rgb[0] = 200; im[2].rgb[1] = 7; im[2].rgb[2] = 255;
    im[3] = (img){"mixed", 257, 190, malloc(257 * 190 * 3)};             /* blocks, gradients, noise, > 64 KiB */
    for (int y = 0; y < 190; y++)
        for (int x = 0; x < 257; x++) {
            uint8_t *q = im[3].rgb + ((size_t)y * 257 + x) * 3;
            if (y < 60) { q[0] = (uint8_t)(x / 40 * 50); q[1] = (uint8_t)(y / 20 * 80); q[2] = 30; }
            else if (y < 120) { q[0] = (uint8_t)x; q[1] = (uint8_t)(2 * y); q[2] = (uint8_t)(x + y); }
            else { q[0] = (uint8_t)lcg(&s); q[1] = (uint8_t)(lcg(&s) & 0xF0); q[2] = 128; }
        }
    im[4] = (img){"tall", 2, 700, malloc(2 * 700 * 3)};                  /* rows of 7 bytes */
    for (int i = 0; i < 2 * 700 * 3; i++) im[4].rgb[i] = (uint8_t)(i / 37 % 5 * 60);
}

KT_TEST(heatmap_png_roundtrip) {
    if (!have_python()) KT_SKIP("python3 (with zlib) not on PATH: no independent PNG decoder");
    char dir[256];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    img im[5];
    make_images(im);
    int ok = 1;
    for (int k = 0; k < 5 && ok; k++) {
        char path[400], msg[400];
        snprintf(path, sizeof path, "%s/%s.png", dir, im[k].name);
        ks_status st = ks_png_write_rgb(path, im[k].w, im[k].h, im[k].rgb);
        if (st) { fprintf(stderr, "    %s: %s\n", im[k].name, ks_heatmap_last_error()); ok = 0; break; }
        int w = 0, h = 0;
        uint8_t *dec = NULL;
        if (py_decode(dir, path, &w, &h, &dec, msg, sizeof msg)) { fprintf(stderr, "    %s: %s\n", im[k].name, msg); ok = 0; break; }
        if (w != im[k].w || h != im[k].h) { fprintf(stderr, "    %s: decoded %dx%d\n", im[k].name, w, h); ok = 0; }
        else {
            size_t n = (size_t)w * h * 3, bad = 0;
            for (size_t i = 0; i < n; i++) bad += dec[i] != im[k].rgb[i];
            if (bad) { fprintf(stderr, "    %s: %zu bytes differ\n", im[k].name, bad); ok = 0; }
        }
        long raw = (long)im[k].w * im[k].h * 3, sz = file_size(path);
        fprintf(stderr, "    %-6s %4dx%-4d raw %7ld bytes -> png %7ld bytes\n", im[k].name, im[k].w, im[k].h, raw, sz);
        /* flat colour compresses to almost nothing; noise may grow only by stored-block overhead */
        if (k == 1 && sz > 2000) { fprintf(stderr, "    flat image too big: %ld\n", sz); ok = 0; }
        if (k == 0 && sz > raw + raw / 50 + 200) { fprintf(stderr, "    random image too big: %ld\n", sz); ok = 0; }
        free(dec);
    }
    for (int k = 0; k < 5; k++) free(im[k].rgb);
    kt_rmdir(dir);
    KT_CHECK(ok, "PNG round trip (see above)");
}

KT_TEST(heatmap_png_errors) {
    uint8_t px[12] = {0};
    uint8_t *out = NULL;
    size_t n = 0;
    KT_CHECK(ks_png_encode_rgb(0, 5, px, &out, &n) == KS_ERR_ARG && !out, "width 0");
    KT_CHECK(strstr(ks_heatmap_last_error(), "0x5"), "message names the size: %s", ks_heatmap_last_error());
    KT_CHECK(ks_png_encode_rgb(2, -1, px, &out, &n) == KS_ERR_ARG, "negative height");
    KT_CHECK(ks_png_encode_rgb(KS_PNG_MAX_DIM + 1, 1, px, &out, &n) == KS_ERR_ARG, "too wide");
    KT_CHECK(strstr(ks_heatmap_last_error(), "too large"), "%s", ks_heatmap_last_error());
    KT_CHECK(ks_png_encode_rgb(10000, 10000, px, &out, &n) == KS_ERR_ARG, "too many pixels");
    KT_CHECK(ks_png_encode_rgb(2, 2, NULL, &out, &n) == KS_ERR_ARG, "NULL pixels");
    char dir[256], path[400];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    snprintf(path, sizeof path, "%s/no_such_dir/x.png", dir);
    ks_status st = ks_png_write_rgb(path, 2, 2, px);
    int named = strstr(ks_heatmap_last_error(), "no_such_dir/x.png") != NULL;
    snprintf(path, sizeof path, "%s/bad.png", dir);
    ks_status st2 = ks_png_write_rgb(path, 0, 2, px);
    int absent = file_size(path) < 0;
    kt_rmdir(dir);
    KT_CHECK(st == KS_ERR_IO && named, "unwritable path: %d %s", st, ks_heatmap_last_error());
    KT_CHECK(st2 == KS_ERR_ARG && absent, "a bad size creates no file");
    KT_CHECK(ks_png_write_rgb(NULL, 2, 2, px) == KS_ERR_ARG, "NULL path");
    /* the smallest image, in memory: signature, IHDR, IDAT, IEND */
    KT_CHECK(ks_png_encode_rgb(1, 1, px, &out, &n) == KS_OK, "%s", ks_heatmap_last_error());
    int sig = n > 8 && !memcmp(out, "\x89PNG\r\n\x1a\n", 8) && !memcmp(out + 12, "IHDR", 4) && !memcmp(out + n - 8, "IEND", 4);
    free(out);
    KT_CHECK(sig, "PNG layout");
}

/* ---------------------------------------------------------------- the font */

KT_TEST(heatmap_font) {
    const char *need = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.%-=,:/()+_";
    for (const char *p = need; *p; p++) {
        KT_CHECK(font[(int)*p], "no glyph for '%c'", *p);
        /* each glyph: 7 or 9 rows of 5 columns, made of '#' and '.' */
        const char *s = font[(int)*p];
        int rows = 0, cols = 0, ink = 0;
        for (; *s; s++) {
            if (*s == ' ') { KT_CHECK(cols == 5 || (*p == '-' && cols == 4), "'%c' row %d has %d columns", *p, rows, cols); rows++; cols = 0; continue; }
            KT_CHECK(*s == '#' || *s == '.', "'%c': bad character", *p);
            ink += *s == '#';
            cols++;
        }
        rows++;
        KT_CHECK(rows >= 7 && rows <= 9, "'%c' has %d rows", *p, rows);
        KT_CHECK(ink > 0, "'%c' is blank", *p);
    }
    /* digits are all 5 columns wide so numbers line up; '.' is narrow */
    KT_CHECK(text_width("0.00", 1) == 5 + 1 + 2 + 1 + 5 + 1 + 5, "width of 0.00 = %d", text_width("0.00", 1));
    KT_CHECK(text_width("1.00", 2) == text_width("0.73", 2), "tabular digits");
    KT_CHECK(text_width("", 2) == 0 && text_width("a b", 1) > text_width("ab", 1), "space");
    /* unknown characters (UTF-8, control) draw as '?' rather than nothing */
    KT_CHECK(text_width("\xc3\xa9", 1) == text_width("?", 1) && text_width("\t", 1) == text_width("?", 1), "fallback");
}

/* ---------------------------------------------------------------- the heatmap picture */

static const char *const DEPTHS[11] = {"0%", "10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%", "90%", "100%"};
static const char *const LENGTHS[5] = {"512", "1K", "4K", "32K", "128K"};

/* 3 panels of 11 depths x 5 lengths: scores fall with length and with panel index; a few exact
 * values and a NaN at known places. */
static void heat_scores(double *sc) {
    for (int p = 0; p < 3; p++)
        for (int r = 0; r < 11; r++)
            for (int c = 0; c < 5; c++) {
                double v = 1.0 - 0.22 * c * (p + 1) / 2.0 - 0.03 * (r % 4);
                sc[(p * 11 + r) * 5 + c] = v < 0 ? 0 : v > 1 ? 1 : v;
            }
    sc[(0 * 11 + 0) * 5 + 0] = 1.0; /* panel 0, depth 0%, 512: perfect */
    sc[(2 * 11 + 10) * 5 + 4] = 0.0; /* panel 2, depth 100%, 128K: lost */
    sc[(1 * 11 + 5) * 5 + 2] = NAN; /* panel 1, depth 50%, 4K: missing */
}

/* What colour dominates the centre half of a cell (the printed number covers less than half). */
static void cell_colour(const uint8_t *rgb, int width, const ks_heat_geom *g, int p, int r, int c, int out[3]) {
    int x0 = g->grid_x[p] + c * g->cell_w, y0 = g->grid_y + r * g->cell_h;
    int best = 0;
    out[0] = out[1] = out[2] = -1;
    for (int y = y0 + g->cell_h / 4; y < y0 + 3 * g->cell_h / 4; y++)
        for (int x = x0 + g->cell_w / 4; x < x0 + 3 * g->cell_w / 4; x++) {
            const uint8_t *q = rgb + ((size_t)y * width + x) * 3;
            int n = 0;
            for (int yy = y0 + g->cell_h / 4; yy < y0 + 3 * g->cell_h / 4; yy++)
                for (int xx = x0 + g->cell_w / 4; xx < x0 + 3 * g->cell_w / 4; xx++)
                    n += !memcmp(rgb + ((size_t)yy * width + xx) * 3, q, 3);
            if (n > best) { best = n; out[0] = q[0]; out[1] = q[1]; out[2] = q[2]; }
        }
}

KT_TEST(heatmap_png_niah_grid) {
    double sc[3 * 11 * 5];
    heat_scores(sc);
    ks_heat_panel pan[3] = {{"full", sc}, {"gemfilter layer=2 k=256  EM 0.71", sc + 55}, {"snapkv budget=128", sc + 110}};
    const char *title = "niah  kvsieve-tiny  compare  4 cases per cell";
    uint8_t *rgb = NULL;
    ks_heat_geom g;
    KT_CHECK(ks_heatmap_render(title, 11, DEPTHS, 5, LENGTHS, pan, 3, &rgb, &g) == KS_OK, "%s", ks_heatmap_last_error());
    /* KS_HEAT_SAMPLE=FILE.png keeps a copy to look at */
    const char *keep = getenv("KS_HEAT_SAMPLE");
    if (keep && *keep && ks_heatmap_png(keep, title, 11, DEPTHS, 5, LENGTHS, pan, 3))
        fprintf(stderr, "    sample not written: %s\n", ks_heatmap_last_error());
    int ok = g.cell_text_scale == 2 && g.grid_x[1] > g.grid_x[0] + 5 * g.cell_w && g.width < 2000 && g.height < 800;
    int green[3], red[3], grey[3];
    cell_colour(rgb, g.width, &g, 0, 0, 0, green);
    cell_colour(rgb, g.width, &g, 2, 10, 4, red);
    cell_colour(rgb, g.width, &g, 1, 5, 2, grey);
    fprintf(stderr, "    %dx%d, cells %dx%d; score 1 -> (%d,%d,%d), score 0 -> (%d,%d,%d), NaN -> (%d,%d,%d)\n", g.width,
            g.height, g.cell_w, g.cell_h, green[0], green[1], green[2], red[0], red[1], red[2], grey[0], grey[1], grey[2]);
    if (!ok) { free(rgb); KT_CHECK(ok, "layout: %dx%d text scale %d", g.width, g.height, g.cell_text_scale); }
    KT_CHECK(green[1] > green[0] + 60 && green[1] > green[2] + 40, "score 1.0 is not green");
    KT_CHECK(red[0] > red[1] + 100 && red[0] > red[2] + 100, "score 0.0 is not red");
    KT_CHECK(abs(grey[0] - grey[1]) < 8 && abs(grey[1] - grey[2]) < 8 && grey[0] > 120, "NaN is not grey");

    if (!have_python()) { free(rgb); KT_SKIP("python3 (with zlib) not on PATH: PNG not decoded"); }
    char dir[256], path[400], msg[400];
    if (kt_tmpdir(dir, sizeof dir)) { free(rgb); KT_CHECK(0, "mkdtemp"); }
    snprintf(path, sizeof path, "%s/niah.png", dir);
    ks_status st = ks_heatmap_png(path, title, 11, DEPTHS, 5, LENGTHS, pan, 3);
    int w = 0, h = 0;
    uint8_t *dec = NULL;
    int drc = st ? -1 : py_decode(dir, path, &w, &h, &dec, msg, sizeof msg);
    long sz = file_size(path);
    kt_rmdir(dir);
    if (st || drc) { free(rgb); KT_CHECK(0, "%s", st ? ks_heatmap_last_error() : msg); }
    int same = w == g.width && h == g.height && !memcmp(dec, rgb, (size_t)w * h * 3);
    cell_colour(dec, w, &g, 0, 0, 0, green);
    cell_colour(dec, w, &g, 2, 10, 4, red);
    free(dec);
    free(rgb);
    fprintf(stderr, "    png %ld bytes (raw %ld)\n", sz, (long)w * h * 3);
    KT_CHECK(same, "decoded PNG differs from the rendered image");
    KT_CHECK(green[1] > green[0] + 60 && red[0] > red[1] + 100, "colours after decoding");
    KT_CHECK(sz > 0 && sz < 40000, "heatmap PNG is %ld bytes", sz);
}

KT_TEST(heatmap_bad_args) {
    double sc[4] = {1, 0, 0.5, NAN};
    ks_heat_panel ok = {"p", sc}, nos = {"broken", NULL};
    uint8_t *rgb = (uint8_t *)1;
    KT_CHECK(ks_heatmap_render("t", 0, NULL, 2, NULL, &ok, 1, &rgb, NULL) == KS_ERR_ARG && !rgb, "0 rows");
    KT_CHECK(strstr(ks_heatmap_last_error(), "0 rows"), "%s", ks_heatmap_last_error());
    KT_CHECK(ks_heatmap_render("t", 2, NULL, KS_HEAT_MAX_AXIS + 1, NULL, &ok, 1, &rgb, NULL) == KS_ERR_ARG, "too many columns");
    KT_CHECK(ks_heatmap_render("t", 2, NULL, 2, NULL, &ok, 0, &rgb, NULL) == KS_ERR_ARG, "0 panels");
    KT_CHECK(ks_heatmap_render("t", 2, NULL, 2, NULL, NULL, 1, &rgb, NULL) == KS_ERR_ARG, "NULL panels");
    ks_heat_panel two[2] = {ok, nos};
    KT_CHECK(ks_heatmap_render("t", 2, NULL, 2, NULL, two, 2, &rgb, NULL) == KS_ERR_ARG, "NULL scores");
    KT_CHECK(strstr(ks_heatmap_last_error(), "panel 1 (broken)"), "%s", ks_heatmap_last_error());
    KT_CHECK(ks_heatmap_png(NULL, "t", 2, NULL, 2, NULL, &ok, 1) == KS_ERR_ARG, "NULL path");
    char dir[256], path[400];
    KT_CHECK(kt_tmpdir(dir, sizeof dir) == 0, "mkdtemp");
    snprintf(path, sizeof path, "%s/none/h.png", dir);
    ks_status st = ks_heatmap_png(path, "t", 2, NULL, 2, NULL, &ok, 1);
    kt_rmdir(dir);
    KT_CHECK(st == KS_ERR_IO && strstr(ks_heatmap_last_error(), "none/h.png"), "unwritable: %s", ks_heatmap_last_error());
    /* odd but valid: no labels, no titles, one cell, a very long title, large grids */
    KT_CHECK(ks_heatmap_render(NULL, 1, NULL, 1, NULL, &(ks_heat_panel){NULL, sc}, 1, &rgb, NULL) == KS_OK, "1x1");
    free(rgb);
    char longt[600];
    memset(longt, 'W', sizeof longt - 1);
    longt[sizeof longt - 1] = 0;
    ks_heat_geom g;
    KT_CHECK(ks_heatmap_render(longt, 2, NULL, 2, NULL, &(ks_heat_panel){longt, sc}, 1, &rgb, &g) == KS_OK, "long title");
    free(rgb);
    double *big = calloc(200 * 300, sizeof *big);
    KT_CHECK(big, "calloc");
    for (int i = 0; i < 200 * 300; i++) big[i] = (i % 7) / 6.0;
    ks_status bs = ks_heatmap_render("big", 200, NULL, 300, NULL, &(ks_heat_panel){"big", big}, 1, &rgb, &g);
    free(big);
    free(rgb);
    KT_CHECK(bs == KS_OK && g.width <= 4000 && g.height <= 1700 && g.cell_text_scale == 0, "big grid %dx%d", g.width, g.height);
}

/* ---------------------------------------------------------------- the terminal table */

static char *print_to_string(const char *title, int nr, const char *const *rl, int nc, const char *const *cl,
                             const ks_heat_panel *p, int np, int color) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    ks_heatmap_print(f, title, nr, rl, nc, cl, p, np, color);
    fclose(f);
    return buf;
}

KT_TEST(heatmap_table) {
    static const char *const rl[3] = {"0%", "50%", "100%"};
    static const char *const cl[2] = {"512", "128K"};
    double a[6] = {1, 0.5, 0.75, NAN, 0, 0.25}, b[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    ks_heat_panel p[2] = {{"full  EM 0.50", a}, {"empty", b}};
    char *s = print_to_string("niah  tiny", 3, rl, 2, cl, p, 2, 0);
    KT_CHECK(s, "open_memstream");
    const char *want =
        "niah  tiny\n"
        "\n"
        "full  EM 0.50\n"
        "depth   512  128K    avg\n"
        "   0%  1.00  0.50   0.75\n"
        "  50%  0.75     -   0.75\n"
        " 100%  0.00  0.25   0.12\n"
        "  avg  0.58  0.38   0.50\n"
        "\n"
        "empty\n"
        "depth   512  128K    avg\n"
        "   0%     -     -      -\n"
        "  50%     -     -      -\n"
        " 100%     -     -      -\n"
        "  avg     -     -      -\n";
    int same = !strcmp(s, want);
    if (!same) fprintf(stderr, "    got:\n%s    want:\n%s", s, want);
    free(s);
    KT_CHECK(same, "plain table text");
    s = print_to_string(NULL, 3, rl, 2, cl, p, 1, 1);
    KT_CHECK(s, "open_memstream");
    /* 1.00 on the green of the cube, 0.00 on red, NaN on grey 250; every colour is reset */
    int col = strstr(s, "\x1b[48;5;") && strstr(s, "1.00\x1b[0m") && strstr(s, "\x1b[48;5;250m") && !strstr(s, "niah");
    int resets = 0, sets = 0;
    for (const char *q = s; (q = strstr(q, "\x1b[0m")); q++) resets++;
    for (const char *q = s; (q = strstr(q, "\x1b[48;5;")); q++) sets++;
    free(s);
    KT_CHECK(col && sets == resets && sets == 3 * 3 + 3, "coloured table (%d colours, %d resets)", sets, resets);
    s = print_to_string("t", 0, rl, 2, cl, p, 1, 0);
    KT_CHECK(s && !strcmp(s, "heatmap: 0 rows (depths): need 1..512\n"), "bad args: %s", s ? s : "(null)");
    free(s);
}
