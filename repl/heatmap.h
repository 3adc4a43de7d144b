/* heatmap.h — pictures and tables of the evaluation harness (`kvsieve eval`):
 *
 *   - a self-contained PNG writer (no zlib/libpng): 8-bit RGB, one zlib stream deflated with fixed
 *     Huffman codes and back-references (previous byte, previous pixel, previous row, then a hash
 *     chain of earlier 3-byte strings; one-step lazy matching), falling back to stored blocks where that is smaller; each row
 *     is filtered with type 0 (None) or 2 (Up), whichever has the smaller sum of |signed bytes|;
 *   - a NIAH heatmap renderer in the style of the long-context papers: x = context length (columns),
 *     y = needle depth (rows, first row at the top), cells coloured red (0) -> yellow (0.5) -> green (1)
 *     with the score printed in the cell, grey "-" for missing cells, a title, axis titles and a colour
 *     bar; several panels (one per policy) side by side with the same axes; text in a built-in 5x7
 *     bitmap font (with descenders) drawn at 2x;
 *   - the same grids as a terminal table, optionally with ANSI 256-colour backgrounds.
 *
 * Scores are doubles, nominally in [0,1]; values outside are clamped for colour (the printed number
 * is the real value); NaN means "no data" for that cell. Nothing here keeps state between calls, and
 * every function is safe to call from several threads at once.
 */
#ifndef KS_HEATMAP_H
#define KS_HEATMAP_H

#include "kvsieve.h"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The message of the last failure of a function below on this thread ("" if none); every
 * function that returns a failing ks_status sets it. */
const char *ks_heatmap_last_error(void);

/* Largest image side the PNG writer accepts, and the largest pixel count (w*h). */
#define KS_PNG_MAX_DIM 16384
#define KS_PNG_MAX_PIXELS (64 * 1024 * 1024)

/* Grid limits of the heatmap functions (per axis, and panels per image). */
#define KS_HEAT_MAX_AXIS 512
#define KS_HEAT_MAX_PANELS 32

/* CRC-32 (ISO-HDLC: the one of PNG, zlib, gzip). Pass 0 to start; pass the previous result to
 * continue over more data. ks_crc32(0, "123456789", 9) == 0xCBF43926. */
uint32_t ks_crc32(uint32_t crc, const void *data, size_t n);
/* Adler-32 (zlib's checksum). Pass 1 to start; the previous result to continue.
 * ks_adler32(1, "Wikipedia", 9) == 0x11E60398. */
uint32_t ks_adler32(uint32_t adler, const void *data, size_t n);

/* Encode an image as PNG in memory. rgb: (h, w, 3) bytes, row-major, top row first.
 * On success *out (malloc'd, caller frees) holds *out_len bytes.
 * Errors: KS_ERR_ARG for NULL pointers or w/h <= 0 or beyond KS_PNG_MAX_DIM / KS_PNG_MAX_PIXELS;
 * KS_ERR_OOM. */
ks_status ks_png_encode_rgb(int w, int h, const uint8_t *rgb, uint8_t **out, size_t *out_len);
/* ks_png_encode_rgb, then write the bytes to path (created or truncated).
 * Errors: as above, and KS_ERR_IO "cannot write PATH: <reason>" (nothing is left half-written
 * silently: a failed write or close is reported). */
ks_status ks_png_write_rgb(const char *path, int w, int h, const uint8_t *rgb);

/* One panel of a heatmap: a policy's grid of scores. */
typedef struct ks_heat_panel {
    const char *title;    /* drawn above the panel (may be NULL); e.g. "gemfilter layer=2 k=256  EM 0.83" */
    const double *score;  /* (n_rows, n_cols) row-major; row = needle depth, column = context length; NaN = missing */
} ks_heat_panel;

/* Where things landed in a rendered heatmap (pixels, origin top-left), for hosts that annotate the
 * image and for tests. Cell (p, r, c) covers x in [grid_x[p] + c*cell_w, + cell_w - 1) and
 * y in [grid_y + r*cell_h, + cell_h - 1) (the last pixel column/row of each cell is the white grid line). */
typedef struct ks_heat_geom {
    int width, height;               /* the image */
    int cell_w, cell_h;              /* one cell, grid line included */
    int grid_x[KS_HEAT_MAX_PANELS];  /* left edge of each panel's grid */
    int grid_y;                      /* top edge of every grid */
    int cell_text_scale;             /* 2 or 1: font scale of the numbers in cells; 0: cells too small for text */
} ks_heat_geom;

/* Render the heatmap as an RGB image. title: figure title (may be NULL), drawn bold on one line.
 * Panel titles wrap at word boundaries onto up to 8 lines. The axis titles are fixed: "context
 * length (tokens)" under each panel and "needle depth" up the left side. row_labels (n_rows) and
 * col_labels (n_cols) may be NULL (then "0", "1", ... are used); characters the font lacks show as '?'.
 * On success *rgb (ks_malloc'd, caller frees) is (g->height, g->width, 3) and *g is filled (g may be NULL).
 * Cells shrink (and lose their printed numbers) when the grid would be very large.
 * Errors: KS_ERR_ARG (n_rows/n_cols not in 1..KS_HEAT_MAX_AXIS, n_panels not in 1..KS_HEAT_MAX_PANELS,
 * NULL panels or panel scores, naming the bad panel), KS_ERR_OOM. */
ks_status ks_heatmap_render(const char *title, int n_rows, const char *const *row_labels, int n_cols,
                            const char *const *col_labels, const ks_heat_panel *panels, int n_panels,
                            uint8_t **rgb, ks_heat_geom *g);

/* ks_heatmap_render, then ks_png_write_rgb to path. Errors: those of both. */
ks_status ks_heatmap_png(const char *path, const char *title, int n_rows, const char *const *row_labels,
                         int n_cols, const char *const *col_labels, const ks_heat_panel *panels, int n_panels);

/* Print the grids as text tables to f, one per panel, below the title: a header row of column labels,
 * one line per row label with each cell as "%.2f" ("-" when NaN), an "avg" column (mean of the row's
 * non-NaN cells) and an "avg" row (per column; its last cell is the panel's mean). color != 0 paints
 * each cell with an ANSI 256-colour background on the red -> yellow -> green scale (pass isatty()).
 * Bad arguments print one line "heatmap: <problem>" instead of a table. */
void ks_heatmap_print(FILE *f, const char *title, int n_rows, const char *const *row_labels, int n_cols,
                      const char *const *col_labels, const ks_heat_panel *panels, int n_panels, int color);

#endif
