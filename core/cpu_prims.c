/* cpu_prims.c — the CPU backend's table of policy primitives (ks_backend.prims) over core/prims.c.
 * Until the table is filled in, the CPU backend has none (NULL) and lua/ calls core/prims.h
 * directly. */
#include "backend.h"

const ks_backend_prims *ks_cpu_prims(void) { return NULL; }
