/* eval.h — the inside of a ks_eval (kvsieve.h's eval grids), shared by core/eval.c (options,
 * the grid loop, records and cells) and core/eval_json.c (the JSON file: written, resumed).
 * Internal. */
#ifndef KS_EVAL_H
#define KS_EVAL_H

#include "kvsieve.h"
#include "tasks.h"

/* One run's record as kept: the public view plus what it owns. */
typedef struct ks_eval_rec {
    ks_eval_record r;            /* r.answer / r.output point at the strings below */
    int done;
    char *answer, *output;       /* owned */
} ks_eval_rec;

struct ks_eval {
    ks_model *m;
    ks_task_kind kind;
    int nL, nD, nC, nP;
    int *lengths;                /* (nL) */
    double *depths;              /* (nD) */
    uint64_t seed;
    ks_policy **pols;            /* (nP) borrowed; NULL = full attention */
    char **pnames;               /* (nP) owned */
    char *model_label;           /* owned */
    const char *backend;         /* the backend's name (static) */
    ks_haystack *hs;             /* niah / multikey */
    volatile sig_atomic_t *interrupt;
    ks_eval_run_fn on_run;
    void *user;
    ks_eval_rec *rec;            /* (nL * nD * nC * nP) */
    long done_here;              /* runs finished by this ks_eval (not resumed) */
};

/* The index of run (li, di, ci, p): ((li * nD + di) * nC + ci) * nP + p. */
static inline long ks_eval_index(const ks_eval *e, int li, int di, int ci, int p) {
    return (((long)li * e->nD + di) * e->nC + ci) * e->nP + p;
}

/* The last path component of a model folder ("models/x/" -> "x"), into buf. */
void ks_eval_basename(const char *path, char *buf, size_t n);

/* eval_json.c: read an earlier file of this grid (ks_eval_opts.resume) and mark its runs done. */
ks_status ks_eval_resume(ks_eval *e, const char *path);

#endif
