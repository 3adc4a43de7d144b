/* module_impl.h — what the files of the `kvsieve` Lua module share (internal to them):
 *   lua/module.c          the module table, models, option and buffer helpers, host states
 *   lua/module_policy.c   policy objects ("kvsieve.policy")
 *   lua/module_session.c  sessions, generate and its results ("kvsieve.session")
 * Objects are boxes (full userdata with __gc and :close()) over C resources; see module.c. */
#ifndef KS_MODULE_IMPL_H
#define KS_MODULE_IMPL_H

#include "ks_lua.h"
#include "policy_lua.h"

#define MODEL_MT "kvsieve.model"
#define SESSION_MT "kvsieve.session"
#define POLICY_MT "kvsieve.policy"
#define CBUF_MT "kvsieve.cbuf"
#define KEPT_MT "kvsieve.kept"

/* ---------------------------------------------------------------- boxes */

/* A model shared by its box and its sessions: freed when the last reference goes. */
typedef struct lmodel {
    ks_model *m;
    int refs;       /* the model box + each session */
} lmodel;
typedef struct model_box { lmodel *lm; } model_box;
typedef struct session_box {
    ks_session *s;
    lmodel *lm;
    int busy;       /* a generate runs */
} session_box;
typedef struct policy_box {
    ks_policy *p;
    int busy;       /* a generate runs with it */
} policy_box;
/* A malloc'd pointer freed by the collector (push it before calling the allocating API). */
typedef struct cbuf { void *p; } cbuf;

/* ---------------------------------------------------------------- lua/module.c */

/* Make sure L (and its main thread) point at the state's ks_lctx, creating it once. */
ks_lctx *ks_lm_ensure_ctx(lua_State *L);
cbuf *ks_lm_push_cbuf(lua_State *L);
/* Raise unless every key of the options table at idx (nil: none) is one of `allowed`. */
void ks_lm_check_keys(lua_State *L, int idx, const char *fn, const char *const *allowed);
/* Option k of the table at idx (def when absent or no table); raise on a wrong type. */
lua_Integer ks_lm_opt_int(lua_State *L, int idx, const char *k, lua_Integer def);
lua_Number ks_lm_opt_num(lua_State *L, int idx, const char *k, lua_Number def);
int ks_lm_opt_bool(lua_State *L, int idx, const char *k, int def);
/* Drop one reference to lm (NULL: nothing); the last one closes the model. */
void ks_lm_model_release(lmodel *lm);
/* The open model box at arg (raises when closed). */
model_box *ks_lm_check_model(lua_State *L, int arg);
/* Register metatable mt with methods (and __index / __gc = __close / __tostring when given). */
void ks_lm_new_class(lua_State *L, const char *mt, const luaL_Reg *methods, lua_CFunction index, lua_CFunction gc,
                     lua_CFunction tostring);

/* ---------------------------------------------------------------- lua/module_policy.c */

void ks_lm_policy_open(lua_State *L);   /* the policy metatable */
int ks_lm_policy(lua_State *L);         /* ks.policy */
int ks_lm_model_policy(lua_State *L);   /* m:policy */
/* A policy argument (name / path string, policy object, inline table) as a box pushed on the
 * stack; m may be NULL. */
policy_box *ks_lm_resolve_policy(lua_State *L, int arg, ks_model *m);
/* Apply the overrides table at idx to p; on an error restore the saved values (table at saved:
 * name -> text, 0 = none) first. */
void ks_lm_apply_sets_restoring(lua_State *L, ks_policy *p, int idx, int saved);
void ks_lm_restore_params(lua_State *L, ks_policy *p, int saved);

/* ---------------------------------------------------------------- lua/module_session.c */

void ks_lm_session_open(lua_State *L);  /* the session, kept and result metatables */
int ks_lm_model_session(lua_State *L);  /* m:session */

#endif
