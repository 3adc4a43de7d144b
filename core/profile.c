/* profile.c — the per-phase profiler (engine.h: ks_profile): marks booked to phases, on the
 * backend's timestamps where it has them, else on the host clock after a sync; and its table. */
#include "forward.h"

#include <string.h>

const char *ks_phase_name(ks_phase p) {
    static const char *n[] = {"embed",   "qkv",     "kv_append", "attention",     "o_proj", "mlp",
                              "policy",  "kv_edit", "lm_head",   "sync/download", "alloc",  "other"};
    return (unsigned)p < KS_PH_COUNT ? n[p] : "?";
}

/* Timed on the backend's clock (its timestamps), not the host's. */
static int use_stamps(const ks_session *s) { return s->be->prof_mark && s->be->prof_collect && !s->prof.host_clock; }

void ks_prof_mark(ks_session *s, ks_phase ph) {
    ks_profile *p = &s->prof;
    p->calls[p->stage][ph]++;
    if (use_stamps(s)) {
        s->be->prof_mark(s->be, p->stage * KS_PH_COUNT + (int)ph);
        return;
    }
    s->be->sync(s->be); /* errors surface in the next real call */
    double t = ks_now();
    p->sec[p->stage][ph] += t - p->t_last;
    p->t_last = t;
}
void ks_prof_begin(ks_session *s, int stage) {
    ks_profile *p = &s->prof;
    if (!p->on) return;
    p->stage = stage;
    p->stamps = use_stamps(s);
    if (use_stamps(s)) s->be->prof_mark(s->be, -1);
    else s->be->sync(s->be);
    p->t_begin = p->t_last = ks_now();
}

void ks_prof_end(ks_session *s) {
    ks_profile *p = &s->prof;
    if (!p->on) return;
    ks_prof_mark(s, KS_PH_OTHER);
    if (use_stamps(s)) {
        s->be->sync(s->be);
        p->wall[p->stage] += ks_now() - p->t_begin;
        double sec[2 * KS_PH_COUNT] = {0};
        if (s->be->prof_collect(s->be, sec, 2 * KS_PH_COUNT) == KS_OK)
            for (int i = 0; i < KS_PH_COUNT; i++) {
                p->sec[0][i] += sec[i];
                p->sec[1][i] += sec[KS_PH_COUNT + i];
            }
    } else {
        p->wall[p->stage] += p->t_last - p->t_begin;
    }
}

void ks_profile_reset(ks_session *s) {
    ks_profile *p = &s->prof;
    int on = p->on, hc = p->host_clock;
    if (s->be->prof_collect) { /* drop marks still pending */
        double sec[KS_PROF_TAGS] = {0};
        s->be->prof_collect(s->be, sec, KS_PROF_TAGS);
    }
    memset(p, 0, sizeof *p);
    p->on = on;
    p->host_clock = hc;
}

void ks_profile_enable(ks_session *s, int on) {
    ks_profile_reset(s);
    s->prof.on = on != 0;
    s->prof.host_clock = on == 2;
}

void ks_profile_print(const ks_profile *p, FILE *f, const char *title) {
    if (!p->forwards[0] && !p->forwards[1]) return;
    double tot[2] = {0, 0};
    for (int st = 0; st < 2; st++)
        for (int i = 0; i < KS_PH_COUNT; i++) tot[st] += p->sec[st][i];
    double np = p->forwards[0] ? (double)p->forwards[0] : 1, nd = p->forwards[1] ? (double)p->forwards[1] : 1;
    fprintf(f, "profile: %s (%s; per prefill of %ld, per decode step of %ld)\n", title ? title : "",
            p->stamps ? "backend timestamps" : "sync + host clock", p->forwards[0], p->forwards[1]);
    fprintf(f, "  %-14s %11s %7s %9s   %12s %7s %9s\n", "phase", "prefill_s", "%", "calls", "decode_ms", "%", "calls");
    for (int i = 0; i < KS_PH_COUNT; i++) {
        if (!p->calls[0][i] && !p->calls[1][i]) continue;
        fprintf(f, "  %-14s %11.4f %6.1f%% %9.0f   %12.3f %6.1f%% %9.1f\n", ks_phase_name((ks_phase)i), p->sec[0][i] / np,
                tot[0] > 0 ? 100 * p->sec[0][i] / tot[0] : 0.0, p->calls[0][i] / np, 1e3 * p->sec[1][i] / nd,
                tot[1] > 0 ? 100 * p->sec[1][i] / tot[1] : 0.0, p->calls[1][i] / nd);
    }
    fprintf(f, "  %-14s %11.4f %7s %9s   %12.3f\n", "sum", tot[0] / np, "", "", 1e3 * tot[1] / nd);
    fprintf(f, "  %-14s %11.4f %7s %9s   %12.3f   (host clock: first mark to the device done)\n", "wall",
            p->wall[0] / np, "", "", 1e3 * p->wall[1] / nd);
}
