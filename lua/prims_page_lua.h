/* prims_page_lua.h — the page primitives of the `kvsieve` module (lua/prims_page.c): ks.page_reduce,
 * ks.bound_scores, ks.page_rows over core/prims_page.h, or a backend's ks_backend_prims entries
 * for device tensors. */
#ifndef KS_PRIMS_PAGE_LUA_H
#define KS_PRIMS_PAGE_LUA_H

#include <lua.h>

/* The primitives, for the module's primitive registry (lua/prims_lua.c): one line each. */
int ks_lp_page_reduce(lua_State *L);
int ks_lp_bound_scores(lua_State *L);
int ks_lp_page_rows(lua_State *L);
/* Or all three at once: add them to the module table on top of L. */
void ks_prims_page_open(lua_State *L);

#endif
