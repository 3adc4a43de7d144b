/* cmd_lua.c — `kvsieve run SCRIPT.lua [args]` and `kvsieve repl [-m DIR]`.
 *
 * Both run an unsandboxed host Lua state with the kvsieve module (global `ks`, also
 * require "kvsieve"). The REPL works like lua.c: each input is first tried as an
 * expression ("return " .. line) whose values are printed; an incomplete chunk continues
 * on the next line (">> "); Ctrl-C stops the running chunk or request (the engine checks
 * the flag between layers and tokens, policy states in their instruction hook) and not the
 * REPL. With readline (built with -DKS_HAVE_READLINE) there is line editing, history
 * (~/.kvsieve_history) and tab completion; without a terminal on stdin there are no prompts,
 * banner or streaming, and the exit status is 1 if any input failed.
 * For people at the terminal: values print through a pretty-printer (tables expanded with
 * indentation up to a depth and a count, tensors by shape and first values, results with
 * their summary line); generate streams its text and ends with a timing line; `help` or
 * /help; /chat on|off|reset (a conversation kept across turns, kvsieve.h's chat formats);
 * /stream on|off. The Lua side of these lives in repl_lua below. */
#include "cli.h"
#include "env_opts.h"
#include "kvsieve.h"
#include "ks_lua.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KS_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

static volatile sig_atomic_t g_sigint;
static lua_State *g_L; /* the state whose running chunk Ctrl-C stops */
static int g_tty;      /* the REPL reads a terminal */

/* ================================================================ signals */

static void l_stop_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted");
}

/* SIGINT while Lua runs: set the flag (the engine and policy hooks poll it) and make the
 * host state stop at its next instruction (setting a hook is signal-safe, as in lua.c). */
static void on_sigint_running(int sig) {
    (void)sig;
    g_sigint = 1;
    if (g_L) lua_sethook(g_L, l_stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* SIGINT while reading input: cancel the line. */
static void on_sigint_input(int sig) {
    (void)sig;
    g_sigint = 1;
}

static void set_sigint(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocked read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

/* ================================================================ running chunks */

static int l_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Call the function below narg arguments with a traceback handler, Ctrl-C enabled. */
static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, l_msgh);
    lua_insert(L, base);
    g_sigint = 0;
    g_L = L;
    set_sigint(on_sigint_running);
    int r = lua_pcall(L, narg, nres, base);
    set_sigint(SIG_DFL);
    g_L = NULL;
    lua_sethook(L, NULL, 0, 0);
    g_sigint = 0;
    lua_remove(L, base);
    return r;
}

static void report_error(lua_State *L, const char *prefix) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s%s\n", prefix, msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
}

static lua_State *new_state(void) {
    lua_State *L = ks_lua_host_state();
    if (!L) {
        fprintf(stderr, "kvsieve: cannot create a Lua state (out of memory)\n");
        return NULL;
    }
    ks_lua_set_interrupt(&g_sigint);
    /* global ks = require "kvsieve" */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "kvsieve");
    if (docall(L, 1, 1) != LUA_OK) {
        report_error(L, "kvsieve: ");
        lua_close(L);
        return NULL;
    }
    ks_cli_lua_env(L, -1); /* ks.policy_path from $KVSIEVE_POLICY_PATH */
    lua_setglobal(L, "ks");
    return L;
}

/* ================================================================ kvsieve run */

int ks_cli_run(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: kvsieve run SCRIPT.lua [args...]   (SCRIPT '-' reads stdin)\n");
        return 2;
    }
    const char *script = argv[1];
    lua_State *L = new_state();
    if (!L) return 1;
    /* arg table as lua.c builds it: arg[0] = script, arg[1..] = its arguments */
    lua_createtable(L, argc - 2, 2);
    lua_pushliteral(L, "kvsieve run");
    lua_rawseti(L, -2, -1);
    for (int i = 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - 1);
    }
    lua_setglobal(L, "arg");
    int rc = 0;
    int r = luaL_loadfilex(L, strcmp(script, "-") ? script : NULL, "bt");
    if (r != LUA_OK) {
        report_error(L, "kvsieve: ");
        rc = 1;
    } else {
        for (int i = 2; i < argc; i++) lua_pushstring(L, argv[i]);
        if (docall(L, argc - 2, 0) != LUA_OK) {
            report_error(L, "kvsieve: ");
            rc = 1;
        }
    }
    lua_close(L);
    return rc;
}

/* ================================================================ the REPL's Lua side
 *
 * The pretty-printer, the completion candidates, streaming generate and chat mode are Lua
 * (below, run once per REPL state; its table R is kept in the registry under REPL_KEY). It
 * wraps the session method generate of this state: with streaming on (the default on a
 * terminal, /stream on|off) a generate without stream= of its own writes its text as it
 * comes, then a timing line. Chat mode (/chat on) keeps the conversation and a session of its
 * own across turns: each turn renders the whole conversation through the engine's chat
 * template (kvsieve.h's ks_chat_format) and generates the reply in that session (the
 * module's generate starts from a fresh state, so every turn prefills the conversation again);
 * a model whose vocabulary lacks the template's markers gets plain "User: / Assistant:"
 * turns, and says so. The Lua source is kept here as C string literals: edit it in place. */
static const char repl_lua[] =
    "-- the REPL's Lua side: pretty-printer, completion candidates, streaming generate, chat mode\n"
    "local ks, chat_format, policy_names, chat_detect = ...\n"
    "local R = { stream = false, chat = nil, chat_opts = { n = 128 } }\n"
    "local fmt, concat = string.format, table.concat\n"
    "\n"
    "-- ---------------------------------------------------------------- pretty-printer\n"
    "local MAX_DEPTH, MAX_ITEMS, MAX_INLINE = 4, 24, 72\n"
    "local session_mt = debug.getregistry()['kvsieve.session']\n"
    "local result_mt = debug.getregistry()['kvsieve.result']\n"
    "\n"
    "local function is_ident(k) return type(k) == 'string' and k:match('^[%a_][%w_]*$') ~= nil end\n"
    "\n"
    "local function scalar(v, top)\n"
    "  local t = type(v)\n"
    "  if t == 'string' then\n"
    "    if top then return v end\n"
    "    if #v > 60 then return fmt('%q', v:sub(1, 57)):sub(1, -2) .. '...\"' end\n"
    "    return (fmt('%q', v):gsub('\\\\\\n', '\\\\n'))\n"
    "  elseif t == 'function' then\n"
    "    local d = debug.getinfo(v, 'S')\n"
    "    if d.what == 'C' then return 'function (builtin)' end\n"
    "    return fmt('function (%s:%d)', d.short_src, d.linedefined)\n"
    "  elseif t == 'table' or t == 'userdata' then\n"
    "    local mt = debug.getmetatable(v)\n"
    "    if mt and rawget(mt, '__tostring') and mt ~= result_mt then return tostring(v) end\n"
    "    if t == 'userdata' then return tostring(v) end\n"
    "    return nil -- a table to expand\n"
    "  end\n"
    "  if math.type(v) == 'float' and not top then return fmt('%.6g', v) end\n"
    "  return tostring(v)\n"
    "end\n"
    "\n"
    "-- keys in display order: 1..n first, then the others sorted (numbers, then names)\n"
    "local function sorted_keys(t)\n"
    "  local n, keys = #t, {}\n"
    "  for k in next, t do\n"
    "    if not (math.type(k) == 'integer' and k >= 1 and k <= n) then keys[#keys + 1] = k end\n"
    "  end\n"
    "  table.sort(keys, function(a, b)\n"
    "    local ta, tb = type(a), type(b)\n"
    "    if ta ~= tb then return ta < tb end\n"
    "    if ta == 'number' or ta == 'string' then return a < b end\n"
    "    return tostring(a) < tostring(b)\n"
    "  end)\n"
    "  return n, keys\n"
    "end\n"
    "\n"
    "local pretty\n"
    "local function key_text(k)\n"
    "  if is_ident(k) then return k end\n"
    "  return '[' .. (scalar(k) or tostring(k)) .. ']'\n"
    "end\n"
    "\n"
    "-- one line when every value is a scalar and it fits, else nil\n"
    "local function inline(t, n, keys)\n"
    "  local parts = {}\n"
    "  local shown = 0\n"
    "  for i = 1, n do\n"
    "    local s = scalar(t[i])\n"
    "    if not s then return nil end\n"
    "    shown = shown + 1\n"
    "    if shown > 16 then parts[#parts + 1] = fmt('... (%d items)', n); break end\n"
    "    parts[#parts + 1] = s\n"
    "  end\n"
    "  for _, k in ipairs(keys) do\n"
    "    local s = scalar(t[k])\n"
    "    if not s then return nil end\n"
    "    parts[#parts + 1] = key_text(k) .. ' = ' .. s\n"
    "  end\n"
    "  local line = '{' .. concat(parts, ', ') .. '}'\n"
    "  if #line > MAX_INLINE and #keys > 0 then return nil end\n"
    "  return line\n"
    "end\n"
    "\n"
    "pretty = function(v, indent, depth, seen, out)\n"
    "  local s = scalar(v)\n"
    "  if s then out[#out + 1] = s; return end\n"
    "  if seen[v] then out[#out + 1] = '{<cycle>}'; return end\n"
    "  local n, keys = sorted_keys(v)\n"
    "  local line = inline(v, n, keys)\n"
    "  if line then out[#out + 1] = line; return end\n"
    "  if depth >= MAX_DEPTH then out[#out + 1] = fmt('{... %d items}', n + #keys); return end\n"
    "  seen[v] = true\n"
    "  local pad = indent .. '  '\n"
    "  local lines = { (getmetatable(v) == result_mt and (tostring(v) .. ' ') or '') .. '{' }\n"
    "  local count = 0\n"
    "  local function item(prefix, x)\n"
    "    count = count + 1\n"
    "    if count > MAX_ITEMS then return false end\n"
    "    local sub = {}\n"
    "    pretty(x, pad, depth + 1, seen, sub)\n"
    "    lines[#lines + 1] = pad .. prefix .. concat(sub, '\\n') .. ','\n"
    "    return true\n"
    "  end\n"
    "  local cut = false\n"
    "  for i = 1, n do if not item('', v[i]) then cut = true; break end end\n"
    "  if not cut then for _, k in ipairs(keys) do if not item(key_text(k) .. ' = ', v[k]) then cut = true; break end end end\n"
    "  if cut then lines[#lines + 1] = fmt('%s... (%d items in all)', pad, n + #keys) end\n"
    "  lines[#lines + 1] = indent .. '}'\n"
    "  seen[v] = nil\n"
    "  out[#out + 1] = concat(lines, '\\n')\n"
    "end\n"
    "\n"
    "function R.pretty(v)\n"
    "  local out = {}\n"
    "  local s = scalar(v, true)\n"
    "  if s then return s end\n"
    "  pretty(v, '', 0, {}, out)\n"
    "  return concat(out, '\\n')\n"
    "end\n"
    "\n"
    "-- print the values of an expression: scalars on one line (tab-separated, as print does),\n"
    "-- tables and results expanded\n"
    "function R.show(...)\n"
    "  local n = select('#', ...)\n"
    "  local parts = {}\n"
    "  for i = 1, n do parts[i] = R.pretty((select(i, ...))) end\n"
    "  io.stdout:write(concat(parts, '\\t'), '\\n')\n"
    "end\n"
    "\n"
    "-- ---------------------------------------------------------------- completion\n"
    "local keywords = { 'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function', 'goto', 'if', 'in',\n"
    "  'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true', 'until', 'while' }\n"
    "-- fields served by the __index functions of the binding's objects (not in a table)\n"
    "local fields = {\n"
    "  ['kvsieve.model'] = { 'config', 'dir', 'has_tokenizer' },\n"
    "  ['kvsieve.policy'] = { 'name', 'params', 'report', 'failures' },\n"
    "  ['kvsieve.tensor'] = { 'shape', 'dtype', 'device', 'ndim', 'is_view' },\n"
    "  ['kvsieve.event'] = { 'event', 'layer', 'pass', 'n', 'n_prompt', 'n_heads', 'n_kv_heads', 'head_dim', 'dim',\n"
    "    'n_layers', 'q', 'k', 'v', 'k_pre', 'hidden', 'pos', 'ids', 'orig', 'kv_rows', 'token' },\n"
    "}\n"
    "\n"
    "-- names reachable from v with '.' (all) or ':' (functions only), read without running code:\n"
    "-- raw table keys, the metatable's __index table (or the method table a C __index closes over)\n"
    "local function members(v, methods_only)\n"
    "  local out = {}\n"
    "  local function add(t)\n"
    "    for k, x in next, t do\n"
    "      if is_ident(k) and (not methods_only or type(x) == 'function') then out[k] = true end\n"
    "    end\n"
    "  end\n"
    "  if type(v) == 'table' then add(v) end\n"
    "  if type(v) == 'string' then add(string) end\n"
    "  local mt = debug.getmetatable(v)\n"
    "  if type(mt) == 'table' then\n"
    "    local idx = rawget(mt, '__index')\n"
    "    if type(idx) == 'table' then add(idx)\n"
    "    elseif type(idx) == 'function' then\n"
    "      local _, up = debug.getupvalue(idx, 1)\n"
    "      if type(up) == 'table' then add(up) end\n"
    "    end\n"
    "    local extra = fields[rawget(mt, '__name')]\n"
    "    if extra and not methods_only then for _, k in ipairs(extra) do out[k] = true end end\n"
    "  end\n"
    "  return out\n"
    "end\n"
    "\n"
    "-- candidates for the word being typed: 'ks.sc', 's:gen', 'pri'; quote: inside a string (policy names)\n"
    "function R.complete(word, quote)\n"
    "  local c, seen = {}, {}\n"
    "  local function add(s) if not seen[s] then seen[s] = true; c[#c + 1] = s end end\n"
    "  if quote then\n"
    "    for _, name in ipairs(policy_names()) do\n"
    "      if name:sub(1, #word) == word then add(name) end\n"
    "    end\n"
    "  else\n"
    "    local head, sep, tail = word:match('^(.-)([.:])([%w_]*)$')\n"
    "    if head then\n"
    "      -- only a chain of names is followed, through plain tables (rawget: no code runs)\n"
    "      if not head:match('^[%a_][%w_]*$') and not head:match('^[%a_][%w_]*[%w_.]*[%w_]$') then return c end\n"
    "      local v = _G\n"
    "      for part in head:gmatch('[^.]+') do\n"
    "        if type(v) ~= 'table' or not is_ident(part) then return c end\n"
    "        v = rawget(v, part)\n"
    "      end\n"
    "      if v == nil then return c end\n"
    "      for k in pairs(members(v, sep == ':')) do\n"
    "        if k:sub(1, #tail) == tail then add(head .. sep .. k) end\n"
    "      end\n"
    "    elseif word:match('^[%a_]?[%w_]*$') then\n"
    "      for k in next, _G do if is_ident(k) and k:sub(1, #word) == word then add(k) end end\n"
    "      for _, k in ipairs(keywords) do if k:sub(1, #word) == word then add(k) end end\n"
    "    end\n"
    "  end\n"
    "  table.sort(c)\n"
    "  return c\n"
    "end\n"
    "\n"
    "-- ---------------------------------------------------------------- streaming generate\n"
    "local function timing(r)\n"
    "  return fmt('-- %d prompt tokens in %.3f s (%.0f tok/s) | %d generated in %.3f s (%.1f tok/s)%s',\n"
    "    r.prompt_tokens, r.prefill_s, r.prefill_tps, r.n_generated, r.decode_s, r.tps,\n"
    "    r.policy and (', policy ' .. r.policy) or '')\n"
    "end\n"
    "R.timing = timing\n"
    "\n"
    "local raw_generate = session_mt.__index.generate\n"
    "-- s:generate in the REPL: with streaming on and no stream= of its own, the text is written\n"
    "-- as it comes and a timing line follows\n"
    "session_mt.__index.generate = function(self, prompt, opts)\n"
    "  if not R.stream or (opts ~= nil and type(opts) ~= 'table') or (opts and opts.stream ~= nil) then\n"
    "    local r = raw_generate(self, prompt, opts)\n"
    "    if R.stream and type(r) == 'table' then print(timing(r)) end\n"
    "    return r\n"
    "  end\n"
    "  local o = {}\n"
    "  for k, x in pairs(opts or {}) do o[k] = x end\n"
    "  o.stream = function(piece) io.stdout:write(piece); io.stdout:flush() end\n"
    "  local r = raw_generate(self, prompt, o)\n"
    "  io.stdout:write('\\n')\n"
    "  print(timing(r))\n"
    "  return r\n"
    "end\n"
    "\n"
    "-- ---------------------------------------------------------------- chat mode\n"
    "local known = { 'llama3', 'chatml', 'mistral', 'phi3' }\n"
    "local ends = { ['<|eot_id|>'] = true, ['<|im_end|>'] = true, ['<|end|>'] = true, ['</s>'] = true,\n"
    "  ['<|end_of_text|>'] = true, ['<|endoftext|>'] = true }\n"
    "\n"
    "-- a template fits the model when each of its markers (<|...|>, [INST], <s>, ...) is one token\n"
    "local function fits(m, name)\n"
    "  local text = chat_format(name, { { role = 'user', content = 'x' } })\n"
    "  if not text then return false, 'unknown' end\n"
    "  local n = 0\n"
    "  for marker in text:gmatch('<[^<>%s]+>') do\n"
    "    n = n + 1\n"
    "    if #m:encode(marker, { special = false }) ~= 1 then return false, marker end\n"
    "  end\n"
    "  for marker in text:gmatch('%[/?INST%]') do\n"
    "    n = n + 1\n"
    "    if #m:encode(marker, { special = false }) ~= 1 then return false, marker end\n"
    "  end\n"
    "  return n > 0, nil\n"
    "end\n"
    "\n"
    "local function render_plain(msgs)\n"
    "  local out = {}\n"
    "  for _, x in ipairs(msgs) do\n"
    "    out[#out + 1] = (x.role == 'user' and 'User: ' or x.role == 'system' and 'System: ' or 'Assistant: ') .. x.content\n"
    "  end\n"
    "  out[#out + 1] = 'Assistant:'\n"
    "  return concat(out, '\\n')\n"
    "end\n"
    "\n"
    "local function model_of_globals()\n"
    "  local m = rawget(_G, 'm')\n"
    "  local mt = debug.getmetatable(m)\n"
    "  if not (mt and rawget(mt, '__name') == 'kvsieve.model') then\n"
    "    error('chat needs a model in the global m: m = ks.load(\"models/kvsieve-tiny\") (or start with kvsieve repl -m DIR)', 0)\n"
    "  end\n"
    "  return m\n"
    "end\n"
    "\n"
    "function R.chat_on(name)\n"
    "  local m = model_of_globals()\n"
    "  local note = ''\n"
    "  if name and name ~= 'plain' then\n"
    "    if not chat_format(name, { { role = 'user', content = 'x' } }) then\n"
    "      error(fmt('unknown chat template \"%s\" (%s, plain)', name, concat(known, ', ')), 0)\n"
    "    end\n"
    "    local ok, marker = fits(m, name)\n"
    "    if not ok then error(fmt('the model has no token %s of the %s template (try /chat on plain)', tostring(marker), name), 0) end\n"
    "  elseif not name then\n"
    "    -- the model's own template (tokenizer_config.json), when its tokens are there; else the\n"
    "    -- first known template whose markers the vocabulary has\n"
    "    local own = m.dir and chat_detect(m.dir)\n"
    "    if own and fits(m, own) then name = own end\n"
    "    for _, k in ipairs(name and {} or known) do\n"
    "      if fits(m, k) then name = k; break end\n"
    "    end\n"
    "    if not name then\n"
    "      name = 'plain'\n"
    "      note = ' (no chat template fits this model: turns are plain \"User: ...\" / \"Assistant: ...\" lines)'\n"
    "    end\n"
    "  end\n"
    "  R.chat = { name = name, m = m, s = m:session(), msgs = {} }\n"
    "  print(fmt('-- chat on, template %s%s; /chat off leaves, /chat reset forgets the conversation', name, note))\n"
    "end\n"
    "\n"
    "function R.chat_off()\n"
    "  if R.chat then R.chat.s:close() end\n"
    "  R.chat = nil\n"
    "  print('-- chat off')\n"
    "end\n"
    "\n"
    "function R.chat_reset()\n"
    "  if not R.chat then error('chat is off (/chat on)', 0) end\n"
    "  R.chat.msgs = {}\n"
    "  print('-- chat: the conversation is forgotten')\n"
    "end\n"
    "\n"
    "function R.chat_status()\n"
    "  if not R.chat then print('-- chat off (/chat on [template])') return end\n"
    "  print(fmt('-- chat on, template %s, %d messages, options %s', R.chat.name, #R.chat.msgs, R.pretty(R.chat_opts)))\n"
    "end\n"
    "\n"
    "-- one user turn: the whole conversation goes through the chat template into the chat's own\n"
    "-- session; the reply streams (plain turns stop where the model starts the next \"User:\")\n"
    "function R.chat_turn(text)\n"
    "  local c = R.chat\n"
    "  local m, msgs = c.m, c.msgs\n"
    "  msgs[#msgs + 1] = { role = 'user', content = text }\n"
    "  local prompt, err\n"
    "  if c.name == 'plain' then prompt = render_plain(msgs) else prompt, err = chat_format(c.name, msgs) end\n"
    "  if not prompt then table.remove(msgs); error(err, 0) end\n"
    "  local o = {}\n"
    "  for k, x in pairs(R.chat_opts) do o[k] = x end\n"
    "  o.special = c.name == 'plain' -- templates carry their own BOS\n"
    "  local reply, held = {}, ''\n"
    "  local function emit(s) if R.stream then io.stdout:write(s); io.stdout:flush() end end\n"
    "  o.stream = function(piece, id)\n"
    "    if ends[m:token_str(id) or ''] then return true end\n"
    "    if c.name ~= 'plain' then reply[#reply + 1] = piece; emit(piece); return end\n"
    "    held = held .. piece\n"
    "    local cut = held:find('\\nUser:', 1, true)\n"
    "    if cut then\n"
    "      reply[#reply + 1] = held:sub(1, cut - 1); emit(held:sub(1, cut - 1)); held = ''\n"
    "      return true\n"
    "    end\n"
    "    -- hold back a tail that could be the start of \"\\nUser:\"\n"
    "    local keep = 0\n"
    "    for k = math.min(#held, 6), 1, -1 do\n"
    "      if ('\\nUser:'):sub(1, k) == held:sub(-k) then keep = k; break end\n"
    "    end\n"
    "    local out = held:sub(1, #held - keep)\n"
    "    reply[#reply + 1] = out; emit(out); held = held:sub(#held - keep + 1)\n"
    "  end\n"
    "  local ok, r = pcall(raw_generate, c.s, prompt, o)\n"
    "  if not ok then table.remove(msgs); error(r, 0) end\n"
    "  local answer = (concat(reply) .. ((held ~= '' and not held:find('^\\n')) and held or '')):gsub('^%s+', ''):gsub('%s+$', '')\n"
    "  if not R.stream then io.stdout:write(answer) end\n"
    "  io.stdout:write('\\n')\n"
    "  msgs[#msgs + 1] = { role = 'assistant', content = answer }\n"
    "  print(fmt('-- turn %d: %s', #msgs // 2, timing(r):sub(4)))\n"
    "end\n"
    "\n"
    "-- /chat [on [TEMPLATE] | off | reset | opts {...}]\n"
    "function R.chat_cmd(args)\n"
    "  local verb, rest = args:match('^%s*(%S*)%s*(.-)%s*$')\n"
    "  if verb == '' then return R.chat_status() end\n"
    "  if verb == 'on' then return R.chat_on(rest ~= '' and rest or nil) end\n"
    "  if verb == 'off' then return R.chat_off() end\n"
    "  if verb == 'reset' then return R.chat_reset() end\n"
    "  if verb == 'opts' then\n"
    "    local f, err = load('return ' .. rest, '=/chat opts', 't')\n"
    "    if not f then error(err, 0) end\n"
    "    local o = f()\n"
    "    if type(o) ~= 'table' then error('/chat opts takes a table of generate options, e.g. {n = 64, temp = 0.7}', 0) end\n"
    "    o.stream, o.special = nil, nil\n"
    "    R.chat_opts = o\n"
    "    print('-- chat options ' .. R.pretty(o))\n"
    "    return\n"
    "  end\n"
    "  error('/chat: on [' .. concat(known, '|') .. '|plain], off, reset or opts {...}', 0)\n"
    "end\n"
    "\n"
    "-- /stream [on | off]\n"
    "function R.stream_cmd(args)\n"
    "  local v = args:match('^%s*(%S*)%s*$')\n"
    "  if v == 'on' then R.stream = true elseif v == 'off' then R.stream = false\n"
    "  elseif v ~= '' then error('/stream on or /stream off', 0) end\n"
    "  print('-- streaming ' .. (R.stream and 'on: generate writes its text as it comes, then a timing line' or 'off'))\n"
    "end\n"
    "\n"
    "function R.chatting() return R.chat ~= nil end\n"
    "\n"
    "return R\n";


#define REPL_KEY "kvsieve.repl"

static int l_push_text(lua_State *L) {
    lua_pushstring(L, lua_touserdata(L, 1));
    return 1;
}

/* chat_format(name, {{role =, content =}, ...}) -> text, or nil and the engine's message. */
static int l_chat_format(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 2);
    if (n < 0 || n > 1000000) return luaL_error(L, "chat: %I messages", n);
    /* the strings stay alive in the messages table (argument 2) while the engine reads them */
    ks_chat_msg *msgs = lua_newuserdatauv(L, sizeof *msgs * (size_t)(n ? n : 1), 0);
    for (lua_Integer i = 0; i < n; i++) {
        lua_geti(L, 2, i + 1);
        luaL_checktype(L, -1, LUA_TTABLE);
        lua_getfield(L, -1, "role");
        lua_getfield(L, -2, "content");
        msgs[i].role = lua_tostring(L, -2);
        msgs[i].content = lua_tostring(L, -1);
        if (!msgs[i].role || !msgs[i].content) return luaL_error(L, "chat: message %I needs a role and a content", i + 1);
        lua_pop(L, 3);
    }
    char *text = NULL;
    if (ks_chat_format(name, msgs, (int)n, &text) != KS_OK) {
        lua_pushnil(L);
        lua_pushstring(L, ks_last_error());
        return 2;
    }
    /* pushed under a protected call, so that a memory error cannot leak the C string */
    lua_pushcfunction(L, l_push_text);
    lua_pushlightuserdata(L, text);
    int r = lua_pcall(L, 1, 1, 0);
    free(text);
    return r == LUA_OK ? 1 : lua_error(L);
}

/* chat_detect(dir) -> the chat format named by the model's tokenizer_config.json, or nil. */
static int l_chat_detect(lua_State *L) {
    const char *fmt = NULL;
    if (ks_chat_from_model_dir(luaL_checkstring(L, 1), &fmt) != KS_OK || !fmt) return 0;
    lua_pushstring(L, fmt);
    return 1;
}

/* Add NAME for each NAME.lua (not NAME.test.lua) of folder dir to the set at index set. The
 * names are copied into a local array before anything that could raise runs. */
static void scan_policies(lua_State *L, int set, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char names[256][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t l = strlen(e->d_name);
        if (l <= 4 || l - 4 >= sizeof names[0] || strcmp(e->d_name + l - 4, ".lua")) continue;
        if (l > 9 && !strcmp(e->d_name + l - 9, ".test.lua")) continue;
        memcpy(names[n], e->d_name, l - 4);
        names[n++][l - 4] = 0;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        lua_pushboolean(L, 1);
        lua_setfield(L, set, names[i]);
    }
}

/* policy_names() -> {names}: the policies a name would find (lua/policy_lua.h's search
 * path: $KVSIEVE_POLICY_PATH, ./policies, <folder of the executable>/../policies). */
static int l_policy_names(lua_State *L) {
    lua_newtable(L);
    int set = lua_gettop(L);
    const char *env = getenv("KVSIEVE_POLICY_PATH");
    char dir[4096];
    while (env && *env) {
        size_t l = strcspn(env, ":");
        if (l > 0 && l < sizeof dir) {
            memcpy(dir, env, l);
            dir[l] = 0;
            scan_policies(L, set, dir);
        }
        env += l + (env[l] == ':');
    }
    scan_policies(L, set, "policies");
    ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 32);
    if (k > 0) {
        dir[k] = 0;
        char *slash = strrchr(dir, '/');
        if (slash) {
            strcpy(slash, "/../policies");
            scan_policies(L, set, dir);
        }
    }
    lua_newtable(L);
    lua_Integer i = 0;
    lua_pushnil(L);
    while (lua_next(L, set)) {
        lua_pop(L, 1);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, ++i);
    }
    return 1;
}

static const char help_text[] =
    "kvsieve REPL: Lua 5.4 with the kvsieve module as `ks` (the reference: docs/lua.md)\n"
    "  m = ks.load(\"models/kvsieve-tiny\"); s = m:session()\n"
    "  r = s:generate(\"Once upon a time\", {n = 32, policy = \"snapkv\", set = {budget = 64}})\n"
    "      generate options: n temp top_p seed special policy set fallback stream\n"
    "      stream = function(piece, id) io.write(piece) end  is called with each token as it\n"
    "      comes (return true from it to stop); here text streams by itself (/stream off)\n"
    "  r.text  r.ids  r.report  r.kept(layer, head)  ks.show_kept(r, m, {layer = 3})\n"
    "  ks.kept_table(r)  ks.occupancy(r)  ks.timings(r)  ks.pieces(m, r.ids)\n"
    "  a sparkline of numbers (a table or a 1-d tensor):  print(ks.sparkline(r.kv_rows [, width]))\n"
    "  inline policy: s:generate(p, {policy = {prefill_qkv = function(ev, p) ... end}})\n"
    "Commands: help or /help, /quit (or Ctrl-D), /stream on|off,\n"
    "  /chat on [llama3|chatml|mistral|phi3|plain]  a conversation with m, kept across turns\n"
    "  /chat off  /chat reset  /chat opts {n = 64, temp = 0.7}  /chat (status)\n"
    "Tab completes ks.NAME, fields and methods (s:gen<Tab>) and policy names inside quotes.\n"
    "Ctrl-C stops a running request.\n";

static void help(void) {
    fputs(help_text, stdout);
    fflush(stdout);
}

static int l_help(lua_State *L) {
    (void)L;
    help();
    return 0;
}

/* Load the Lua side into the registry. */
static int repl_setup(lua_State *L) {
    if (luaL_loadbufferx(L, repl_lua, sizeof repl_lua - 1, "=[kvsieve repl]", "t") != LUA_OK) return 1;
    lua_getglobal(L, "ks");
    lua_pushcfunction(L, l_chat_format);
    lua_pushcfunction(L, l_policy_names);
    lua_pushcfunction(L, l_chat_detect);
    if (docall(L, 4, 1) != LUA_OK) return 1;
    lua_pushboolean(L, g_tty);
    lua_setfield(L, -2, "stream");
    lua_setfield(L, LUA_REGISTRYINDEX, REPL_KEY);
    lua_register(L, "help", l_help);
    return 0;
}

/* Call R[fn] with the nargs values on top (popped); an error is reported as its message
 * alone (these are the REPL's own commands: a traceback into its Lua side helps nobody).
 * 0 on success. */
static int repl_call(lua_State *L, const char *fn, int nargs, int nres) {
    lua_getfield(L, LUA_REGISTRYINDEX, REPL_KEY);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_insert(L, -(nargs + 1));
    if (docall(L, nargs, nres) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        const char *tb = msg ? strstr(msg, "\nstack traceback:") : NULL;
        if (tb) {
            lua_pushlstring(L, msg, (size_t)(tb - msg));
            lua_remove(L, -2);
        }
        report_error(L, "kvsieve: ");
        return 1;
    }
    return 0;
}

static int chatting(lua_State *L) {
    if (repl_call(L, "chatting", 0, 1)) return 0;
    int on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return on;
}

/* ================================================================ kvsieve repl */

static int g_cancel_chunk; /* readline: Ctrl-C at a prompt since the line began */

#ifdef KS_HAVE_READLINE
/* Ctrl-C at the prompt: drop the line being edited and start a fresh prompt (readline keeps
 * running; called from readline's read loop after the signal interrupted it). */
static int rl_check_cancel(void) {
    if (g_sigint) {
        g_sigint = 0;
        g_cancel_chunk = 1; /* a pending multi-line chunk is abandoned too */
        rl_set_prompt("> ");
        rl_free_line_state();
        rl_replace_line("", 0);
        rl_point = rl_end = rl_mark = 0;
        fputc('\n', rl_outstream ? rl_outstream : stdout);
        rl_on_new_line();
        rl_redisplay();
    }
    return 0;
}

/* ---------------------------------------------------------------- tab completion
 * The word under the cursor (readline splits at the characters of word_breaks, not at '.'
 * or ':') is completed from: the slash commands at the start of a line; policy names when
 * it follows a quote; else Lua names: globals and keywords, or the members of the value
 * before the last '.' / ':' (R.complete: only a chain of names through plain tables is
 * followed, so completion never runs code of the user). Never file names. */
static lua_State *g_rl_L;
static char **g_cands;
static int g_ncands, g_next;
static char word_breaks[] = " \t\n\"'`@$><=;|&{}()[],+-*/%^#~";

static void cands_clear(void) {
    for (int i = 0; i < g_ncands; i++) free(g_cands[i]);
    free(g_cands);
    g_cands = NULL;
    g_ncands = 0;
}

static void cand_add(const char *s) {
    char **c = realloc(g_cands, sizeof *c * (size_t)(g_ncands + 1));
    if (!c) return;
    g_cands = c;
    if ((g_cands[g_ncands] = strdup(s))) g_ncands++;
}

static char *cand_gen(const char *text, int state) {
    (void)text;
    if (!state) g_next = 0;
    return g_next < g_ncands ? strdup(g_cands[g_next++]) : NULL;
}

static void cands_from(const char *const *list, const char *text) {
    for (int i = 0; list[i]; i++)
        if (!strncmp(list[i], text, strlen(text))) cand_add(list[i]);
}

/* Under pcall: the list R.complete(word, quote) into the candidates. */
static int l_complete(lua_State *L) {
    const char *word = lua_tostring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REPL_KEY);
    lua_getfield(L, -1, "complete");
    lua_pushstring(L, word);
    lua_pushvalue(L, 2);
    lua_call(L, 2, 1);
    lua_Integer n = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, -1, i);
        if (lua_type(L, -1) == LUA_TSTRING) cand_add(lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    return 0;
}

static char **repl_complete(const char *text, int start, int end) {
    (void)end;
    rl_attempted_completion_over = 1; /* no file names */
    rl_completion_append_character = '\0';
    cands_clear();
    const char *line = rl_line_buffer, *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '/' && p < line + start) {
        static const char *const cmds[] = {"help", "quit", "chat", "stream", NULL};
        static const char *const chat_sub[] = {"on", "off", "reset", "opts", NULL};
        static const char *const onoff[] = {"on", "off", NULL};
        static const char *const templates[] = {"llama3", "chatml", "mistral", "phi3", "plain", NULL};
        char w[3][16] = {"", "", ""};
        int nw = 0;
        const char *q = p + 1;
        while (q < line + start && nw < 3) { /* the complete words before the cursor's word */
            while (q < line + start && *q == ' ') q++;
            size_t l = 0;
            while (q + l < line + start && q[l] != ' ') l++;
            if (!l || q + l >= line + start) break;
            snprintf(w[nw++], sizeof w[0], "%.*s", (int)l, q);
            q += l;
        }
        if (nw == 0) cands_from(cmds, text);
        else if (nw == 1 && !strcmp(w[0], "chat")) cands_from(chat_sub, text);
        else if (nw == 1 && !strcmp(w[0], "stream")) cands_from(onoff, text);
        else if (nw == 2 && !strcmp(w[0], "chat") && !strcmp(w[1], "on")) cands_from(templates, text);
    } else if (g_rl_L) {
        lua_State *L = g_rl_L;
        int quote = start > 0 && (line[start - 1] == '\'' || line[start - 1] == '"');
        int top = lua_gettop(L);
        lua_pushcfunction(L, l_complete);
        lua_pushstring(L, text);
        lua_pushboolean(L, quote);
        if (lua_pcall(L, 2, 0, 0) != LUA_OK) cands_clear();
        lua_settop(L, top);
    }
    if (!g_ncands) return NULL;
    return rl_completion_matches(text, cand_gen);
}
#endif

/* One line of input without its newline (malloc'd), or NULL at end of input. *cancelled is
 * set when Ctrl-C abandoned input: without readline the line comes back empty; with readline
 * the prompt starts afresh and the line typed after it comes back (a new chunk). */
static char *read_line(const char *prompt, int *cancelled) {
    *cancelled = 0;
    g_sigint = 0;
    set_sigint(on_sigint_input);
    char *line = NULL;
#ifdef KS_HAVE_READLINE
    if (g_tty) {
        g_cancel_chunk = 0;
        line = readline(prompt);
        *cancelled = g_cancel_chunk;
        set_sigint(SIG_DFL);
        return line;
    }
#endif
    if (g_tty) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    size_t cap = 0;
    ssize_t n;
    errno = 0;
    n = getline(&line, &cap, stdin);
    if (n < 0) {
        if (g_sigint) { /* interrupted read: cancel the line and go on */
            clearerr(stdin);
            *cancelled = 1;
            if (!line) line = malloc(1);
            if (line) line[0] = 0;
            fputc('\n', stdout);
        } else {
            free(line);
            line = NULL;
        }
    } else if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
    set_sigint(SIG_DFL);
    return line;
}

/* Is the load error at the top of the stack an incomplete chunk? (lua.c's rule) */
static int incomplete(lua_State *L, int status) {
    if (status != LUA_ERRSYNTAX) return 0;
    size_t l;
    const char *msg = lua_tolstring(L, -1, &l);
    static const char eof[] = "<eof>";
    if (l >= sizeof eof - 1 && !strcmp(msg + l - (sizeof eof - 1), eof)) {
        lua_pop(L, 1);
        return 1;
    }
    return 0;
}

/* The n values on top, through the pretty-printer (R.show); plain print if it fails. */
static void print_results(lua_State *L, int n) {
    if (n <= 0) return;
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getfield(L, LUA_REGISTRYINDEX, REPL_KEY);
    if (lua_istable(L, -1)) lua_getfield(L, -1, "show");
    else lua_getglobal(L, "print");
    lua_remove(L, -2);
    lua_insert(L, -(n + 1));
    if (docall(L, n, 0) != LUA_OK) report_error(L, "kvsieve: error printing the result: ");
}

/* A slash command (or `help`); returns 1 when the REPL should end. */
static int slash_command(lua_State *L, const char *t, int *failures) {
    if (!strcmp(t, "/quit") || !strcmp(t, "/q") || !strcmp(t, "/exit")) return 1;
    if (!strcmp(t, "/help") || !strcmp(t, "/h") || !strcmp(t, "help")) help();
    else if (!strncmp(t, "/chat", 5) && (!t[5] || t[5] == ' ')) {
        lua_pushstring(L, t + 5);
        *failures += repl_call(L, "chat_cmd", 1, 0);
    } else if (!strncmp(t, "/stream", 7) && (!t[7] || t[7] == ' ')) {
        lua_pushstring(L, t + 7);
        *failures += repl_call(L, "stream_cmd", 1, 0);
    } else {
        fprintf(stderr, "kvsieve: unknown command %s (/help, /chat, /stream, /quit)\n", t);
        (*failures)++;
    }
    fflush(stdout);
    return 0;
}

int ks_cli_repl(int argc, char **argv) {
    const char *model = NULL, *backend = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else {
            fprintf(stderr, "usage: kvsieve repl [-m DIR] [--backend cpu|cuda]\n");
            return 2;
        }
    }
    g_tty = isatty(0);
    lua_State *L = new_state();
    if (!L) return 1;
    if (repl_setup(L)) {
        report_error(L, "kvsieve: the REPL's Lua side: ");
        lua_close(L);
        return 1;
    }
    int failures = 0;
    if (g_tty) printf("kvsieve %s (Lua 5.4) — help or /help for help, Ctrl-D to leave\n", "0.1");
    if (model) {
        lua_getglobal(L, "ks");
        lua_getfield(L, -1, "load");
        lua_remove(L, -2);
        lua_pushstring(L, model);
        if (backend) {
            lua_createtable(L, 0, 1);
            lua_pushstring(L, backend);
            lua_setfield(L, -2, "backend");
        } else lua_pushnil(L);
        if (docall(L, 2, 1) != LUA_OK) {
            report_error(L, "kvsieve: ");
            lua_close(L);
            return 1;
        }
        lua_pushvalue(L, -1);
        lua_setglobal(L, "m");
        lua_getfield(L, -1, "session");
        lua_insert(L, -2);
        if (docall(L, 1, 1) != LUA_OK) {
            report_error(L, "kvsieve: ");
            lua_close(L);
            return 1;
        }
        lua_setglobal(L, "s");
        if (g_tty) printf("m = ks.load(\"%s\"); s = m:session()\n", model);
    }
#ifdef KS_HAVE_READLINE
    char hist[4096] = "";
    if (g_tty) {
        rl_catch_signals = 0;
        rl_signal_event_hook = rl_check_cancel;
        g_rl_L = L;
        rl_attempted_completion_function = repl_complete;
        rl_basic_word_break_characters = word_breaks;
        rl_completer_word_break_characters = word_breaks;
        const char *home = getenv("HOME");
        if (home) {
            snprintf(hist, sizeof hist, "%s/.kvsieve_history", home);
            read_history(hist);
        }
    }
#endif
    char *next = NULL; /* a line typed after Ctrl-C abandoned a multi-line chunk */
    for (;;) {
        int cancelled = 0;
        int chat = chatting(L);
        char *line = next ? next : read_line(chat ? "chat> " : "> ", &cancelled);
        next = NULL;
        if (!line) break;
        if (cancelled && !*line) { free(line); continue; }
        const char *t = line;
        while (*t == ' ' || *t == '\t') t++;
        if (!*t) { free(line); continue; }
        size_t tl = strlen(t);
        while (tl > 0 && (t[tl - 1] == ' ' || t[tl - 1] == '\t')) tl--;
        if (t[0] == '/' || (!chat && tl == 4 && !strncmp(t, "help", 4))) {
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(line);
#endif
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "%.*s", (int)tl, t);
            int quit = slash_command(L, cmd, &failures);
            free(line);
            if (quit) break;
            continue;
        }
        if (chat) { /* a user turn */
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(line);
#endif
            lua_pushstring(L, t);
            free(line);
            failures += repl_call(L, "chat_turn", 1, 0);
            fflush(stdout);
            continue;
        }
        /* first as an expression, then as statements, continuing incomplete chunks */
        int base = lua_gettop(L);
        lua_pushfstring(L, "return %s", line);
        int status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=stdin");
        lua_remove(L, -2);
        luaL_Buffer b;
        if (status != LUA_OK) {
            lua_pop(L, 1);
            lua_pushstring(L, line); /* the chunk so far, at base + 1 */
            for (;;) {
                status = luaL_loadbuffer(L, lua_tostring(L, base + 1), lua_rawlen(L, base + 1), "=stdin");
                if (!incomplete(L, status)) break;
                char *more = read_line(">> ", &cancelled);
                if (!more || cancelled) { /* end of input, or Ctrl-C: abandon the chunk */
                    if (more && *more) next = more;
                    else free(more);
                    status = -1;
                    break;
                }
                luaL_buffinit(L, &b);
                lua_pushvalue(L, base + 1);
                luaL_addvalue(&b);
                luaL_addchar(&b, '\n');
                luaL_addstring(&b, more);
                luaL_pushresult(&b);
                lua_replace(L, base + 1);
                free(more);
            }
            if (status == -1) {
                lua_settop(L, base);
                free(line);
                continue;
            }
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(lua_tostring(L, base + 1));
#endif
            lua_remove(L, base + 1);
        } else {
#ifdef KS_HAVE_READLINE
            if (g_tty) add_history(line);
#endif
        }
        free(line);
        if (status != LUA_OK) {
            report_error(L, "");
            failures++;
            lua_settop(L, base);
            continue;
        }
        if (docall(L, 0, LUA_MULTRET) != LUA_OK) {
            report_error(L, "");
            failures++;
        } else print_results(L, lua_gettop(L) - base);
        lua_settop(L, base);
        fflush(stdout);
    }
#ifdef KS_HAVE_READLINE
    if (g_tty && hist[0]) write_history(hist);
    g_rl_L = NULL;
    cands_clear();
#endif
    if (g_tty) printf("\n");
    lua_close(L);
    ks_lua_set_interrupt(NULL);
    return (!g_tty && failures) ? 1 : 0;
}
