/* prims_int.h — internal to the CPU primitives (core/prims.c, core/prims_scores.c): the argument
 * checks every primitive starts with. Each macro returns from the calling primitive with
 * KS_ERR_ARG and a message naming the primitive and the argument. */
#ifndef KS_PRIMS_INT_H
#define KS_PRIMS_INT_H

#include "prims.h"
#include "common.h"

#include <stdint.h>

#define IDX_MAX ((int64_t)INT32_MAX)

/* Argument checks; each returns from the calling primitive with KS_ERR_ARG. */
#define NEED_NONNEG(prim, name, v)                                                                  \
    do {                                                                                            \
        if ((v) < 0) return ks_errorf(KS_ERR_ARG, "%s: %s = %lld is negative", prim, name, (long long)(v)); \
    } while (0)
#define NEED_PTR(prim, name, p, count)                                                              \
    do {                                                                                            \
        if (!(p) && (count) > 0) return ks_errorf(KS_ERR_ARG, "%s: %s is NULL", prim, name);        \
    } while (0)
#define NEED_IDX_RANGE(prim, name, v)                                                               \
    do {                                                                                            \
        if ((v) > IDX_MAX)                                                                          \
            return ks_errorf(KS_ERR_ARG, "%s: %s = %lld exceeds the int32 index range", prim, name, (long long)(v)); \
    } while (0)

/* a * b without overflow, or KS_ERR_ARG naming the primitive. */
static inline ks_status mul_size(const char *prim, int64_t a, int64_t b, int64_t *out) {
    if (__builtin_mul_overflow(a, b, out) || *out > (int64_t)(SIZE_MAX / 8))
        return ks_errorf(KS_ERR_ARG, "%s: size %lld x %lld is too large", prim, (long long)a, (long long)b);
    return KS_OK;
}

#endif
