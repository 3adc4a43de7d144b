/* common.h — internal helpers shared by every layer: error recording, checked
 * allocation, timing. Internal (not installed); the public API is include/kvsieve.h. */
#ifndef KS_COMMON_H
#define KS_COMMON_H

#include "kvsieve.h"
#include <stddef.h>
#include <stdint.h>

/* Record an error message for this thread and return `st` (so callers can write
 * `return ks_errorf(KS_ERR_IO, "cannot open %s: %s", path, strerror(errno));`). */
ks_status ks_errorf(ks_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current error message: "<prefix>: <old message>". Returns st. */
ks_status ks_error_prefix(ks_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ks_clear_error(void);

/* The library's only output (core/api.c): a message to the host's ks_set_log callback, dropped
 * (not even formatted) when none is set. No trailing newline needed. ks_log_on: one is set. */
void ks_logf(ks_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ks_log_on(void);

/* malloc/calloc/realloc that never abort; on failure they record KS_ERR_OOM and return NULL. */
void *ks_malloc(size_t n);
void *ks_calloc(size_t n, size_t size);
void *ks_realloc(void *p, size_t n);
char *ks_strdup(const char *s);

/* Read a whole regular file into a NUL-terminated buffer (*len excludes the NUL). A
 * directory is KS_ERR_IO "PATH is a directory, not a file"; a pipe or device KS_ERR_IO too. */
ks_status ks_read_file(const char *path, char **data, size_t *len);

/* The most host memory this process can hope to use, in bytes: physical memory, or the
 * address-space limit (RLIMIT_AS) when lower; 0 if unknown. For refusing absurd sizes up
 * front with a named error, before an allocator aborts (ASan) or the OOM killer strikes. */
size_t ks_mem_limit(void);

/* Monotonic time in seconds. */
double ks_now(void);
/* Peak resident set size of this process, in bytes (0 if unknown). */
size_t ks_peak_rss(void);

/* bf16 / f16 to f32 conversion. */
static inline float ks_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
float ks_f16_to_f32(uint16_t h);
uint16_t ks_f32_to_bf16(float f); /* round to nearest even */

#define KS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KS_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
