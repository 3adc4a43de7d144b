/* prelude_blob.c — embeds lua/prelude.lua into the binary (NUL-terminated) with the
 * assembler's .incbin, so the plain Makefile needs no generated file. The path is relative
 * to the directory the compiler runs in: the repository root (as the Makefile does).
 * Makefile dependency so edits rebuild it:  $(BUILD)/lua/prelude_blob.o: lua/prelude.lua */
__asm__(".section .rodata\n"
        ".global ks_prelude_lua\n"
        ".type ks_prelude_lua, @object\n"
        ".balign 16\n"
        "ks_prelude_lua:\n"
        ".incbin \"lua/prelude.lua\"\n"
        ".byte 0\n"
        ".size ks_prelude_lua, . - ks_prelude_lua\n"
        ".previous\n");
