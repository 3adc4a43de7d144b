# kvsieve — plain Makefile. `make` builds the CPU engine (`make cuda`: the CUDA one, in build-cuda/);
# `make test` is the single test entry point; `make test SANITIZE=1` runs the CPU
# suite under ASan + UBSan.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2 -march=x86-64-v2
# -ffp-contract=off: no fused multiply-add anywhere, so a float result is the same bits on every
# x86-64 CPU (core/cpu_gemm.h: the CPU backend's determinism rests on it)
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(OPT) -g -pthread -ffp-contract=off \
           -Iinclude -Icore -Ilua -Irepl -Itests -I/usr/include/lua5.4
LDLIBS  += -lm -lpthread
# Static third-party libraries so the binary runs on the GPU machine (no package manager).
STATIC_LIBS = /usr/lib/x86_64-linux-gnu/libpcre2-8.a \
              /usr/lib/x86_64-linux-gnu/libutf8proc.a /usr/lib/x86_64-linux-gnu/liblua5.4.a
# the REPL's line editing: GNU readline, statically
CFLAGS  += -DKS_HAVE_READLINE
STATIC_LIBS += /usr/lib/x86_64-linux-gnu/libreadline.a /usr/lib/x86_64-linux-gnu/libtinfo.a
# `kvsieve serve`'s HTTP (repl/serve_http.c): libevent's evhttp, statically (the GPU machine has no libevent)
STATIC_LIBS += /usr/lib/x86_64-linux-gnu/libevent_extra.a /usr/lib/x86_64-linux-gnu/libevent_core.a
LDLIBS  += $(STATIC_LIBS) -lm -ldl

ifeq ($(SANITIZE),1)
  BUILD  := build-san
  OPT    := -O1
  CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif
# The fixed-order products (core/cpu_gemm.c) are the CPU suite's inner loop. Under SANITIZE=1 they
# stay optimised and uninstrumented, as the prebuilt OpenBLAS they replace was: the plain build's
# tests check them element by element, and they touch only the ranges their callers pass.
ifeq ($(SANITIZE),1)
$(BUILD)/core/cpu_gemm.o: CFLAGS += -O2 -fno-sanitize=all
endif

CORE_SRC  := $(wildcard core/*.c)
LUA_SRC   := $(wildcard lua/*.c)
REPL_SRC  := $(wildcard repl/*.c)
TEST_SRC  := $(wildcard tests/*.c)
LIB_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(CORE_SRC) $(LUA_SRC))

# CUDA backend: only with CUDA=1 (nvcc from PATH or /usr/local/cuda), never guessed, so that
# `make`, `make test` and `make build/kvsieve` mean the CPU build on every machine, nvcc or not.
# CUDA builds go to build-cuda/ so CPU and CUDA objects never mix; the CUDA targets below
# (cuda, cuda-tests, test-cuda, ...) turn CUDA=1 on by themselves.
CUDA_GOALS := cuda cuda-tests test-cuda test-cuda-sanitize bench-kernels
ifneq ($(CUDA),1)
$(CUDA_GOALS):                                                  # the CUDA targets: run again with CUDA=1
	@$(MAKE) --no-print-directory CUDA=1 $@
.PHONY: $(CUDA_GOALS)
else
  ifeq ($(shell command -v nvcc 2>/dev/null),)
    NVCC := /usr/local/cuda/bin/nvcc
  endif
  ifneq ($(SANITIZE),1)
    BUILD := build-cuda
  endif
  LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(CORE_SRC) $(LUA_SRC))
  include kernels/cuda.mk
endif

.DEFAULT_GOAL := all
all: $(BUILD)/kvsieve $(BUILD)/ks_tests $(BUILD)/host                         # build everything (CPU)

$(BUILD)/%.o: %.c                                               # compile one C file
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libkvsieve.a: $(LIB_OBJ)                               # the engine as a static library
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kvsieve: $(patsubst %.c,$(BUILD)/%.o,$(REPL_SRC)) $(BUILD)/libkvsieve.a   # the CLI
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/host: $(BUILD)/examples/host.o $(BUILD)/libkvsieve.a                # examples/host.c, the embedding example
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/ks_tests: $(patsubst %.c,$(BUILD)/%.o,$(TEST_SRC)) $(BUILD)/libkvsieve.a  # the C test runner
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

deps:                                                           # install missing Debian packages (as root)
	@bash tools/deps.sh

test: deps                                                      # the whole CPU suite (the README's test command)
	@$(MAKE) --no-print-directory $(BUILD)/kvsieve $(BUILD)/ks_tests $(BUILD)/host
	@bash tests/tokenizer/setup.sh
	@bash tools/base_model.sh || echo "make test: models/kvsieve-tiny-base has no weights: its tests are skipped" >&2
	KS_BIN=$(BUILD)/kvsieve KS_HOST=$(BUILD)/host $(BUILD)/ks_tests

check:                                                          # the fast tier for the edit-compile loop: the suite less its slow tests (ks_tests --quick)
	@$(MAKE) --no-print-directory $(BUILD)/kvsieve $(BUILD)/ks_tests $(BUILD)/host
	@bash tests/tokenizer/setup.sh
	KS_BIN=$(BUILD)/kvsieve KS_HOST=$(BUILD)/host $(BUILD)/ks_tests --quick

demo: deps                                                      # the main job on the embedded default (CPU)
	@$(MAKE) --no-print-directory $(BUILD)/kvsieve
	@bash tools/base_model.sh
	bash tools/demo.sh $(BUILD)/kvsieve

base-model:                                                     # models/kvsieve-tiny-base's weights, from git history (tools/base_model.sh)
	@bash tools/base_model.sh

$(BUILD)/lua/prelude_blob.o: lua/prelude.lua                    # the prelude is embedded with .incbin

clean:                                                          # remove build outputs
	rm -rf build build-san build-cuda

.PHONY: all deps test check demo clean base-model
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------- the library, installed --------
# `make install [PREFIX=/usr/local] [DESTDIR=]` installs lib/libkvsieve.so.X.Y.Z (soname
# libkvsieve.so.0.MINOR while the major version is 0, else .so.MAJOR, with the usual links),
# lib/libkvsieve.a, include/kvsieve.h and lib/pkgconfig/kvsieve.pc; `make uninstall` removes
# them. The version comes from include/kvsieve.h (KS_VERSION_*). Both libraries are built from
# a PIC copy of the objects in $(BUILD)/pic/, so the non-PIC build of the CLI and the tests
# (its code, its timings) does not change. The .so links the static PCRE2 and utf8proc into
# itself with their symbols hidden (--exclude-libs) and Lua 5.4 as the system's liblua5.4.so.0
# (SO_LUA: Debian's liblua5.4.a is not PIC, R_X86_64_PC32 against stderr; point SO_LUA at a
# PIC liblua.a to carry it inside too); it exports only the KS_API functions of kvsieve.h
# (-fvisibility=hidden) and -z defs checks that nothing is left unresolved. The .a leaves the
# third-party libraries to the linker (Libs.private: pkg-config --static).
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
KS_VER_    = $(shell sed -n 's/^\#define KS_VERSION_$(1) *\([0-9]*\).*/\1/p' include/kvsieve.h)
VERSION    := $(call KS_VER_,MAJOR).$(call KS_VER_,MINOR).$(call KS_VER_,PATCH)
SOVERSION  := $(if $(filter 0,$(call KS_VER_,MAJOR)),0.$(call KS_VER_,MINOR),$(call KS_VER_,MAJOR))
SO_REAL    := libkvsieve.so.$(VERSION)
SO_NAME    := libkvsieve.so.$(SOVERSION)
PIC_OBJ    := $(patsubst %.c,$(BUILD)/pic/%.o,$(CORE_SRC) $(LUA_SRC))
SO_STATIC  := $(filter-out %readline.a %tinfo.a %liblua5.4.a,$(STATIC_LIBS))
SO_LUA     ?= -llua5.4
PC_LIBS_PRIVATE := -llua5.4 -lpcre2-8 -lutf8proc -lm -ldl -pthread

$(BUILD)/pic/%.o: %.c                                           # one C file, position-independent
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@

$(BUILD)/pic/lua/prelude_blob.o: lua/prelude.lua

$(BUILD)/pic/libkvsieve.a: $(PIC_OBJ)                           # the installed static library (PIC)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/pic/$(SO_REAL): $(PIC_OBJ)                             # the shared library
	$(CC) $(LDFLAGS) -shared -Wl,-soname,$(SO_NAME) -Wl,--exclude-libs,ALL -Wl,-z,defs -Wl,--as-needed \
	    -o $@ $^ $(SO_STATIC) $(SO_LUA) -lm -ldl -pthread

lib: $(BUILD)/pic/$(SO_REAL) $(BUILD)/pic/libkvsieve.a         # build the shared and the static library

install: lib                                                    # install the library, header and kvsieve.pc
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 755 $(BUILD)/pic/$(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_REAL)
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_NAME)
	ln -sf $(SO_NAME) $(DESTDIR)$(LIBDIR)/libkvsieve.so
	install -m 644 $(BUILD)/pic/libkvsieve.a $(DESTDIR)$(LIBDIR)/libkvsieve.a
	install -m 644 include/kvsieve.h $(DESTDIR)$(INCLUDEDIR)/kvsieve.h
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|; s|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|' kvsieve.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/kvsieve.pc

uninstall:                                                      # remove what install installed
	rm -f $(DESTDIR)$(LIBDIR)/$(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_NAME) $(DESTDIR)$(LIBDIR)/libkvsieve.so \
	      $(DESTDIR)$(LIBDIR)/libkvsieve.a $(DESTDIR)$(INCLUDEDIR)/kvsieve.h $(DESTDIR)$(LIBDIR)/pkgconfig/kvsieve.pc

.PHONY: lib install uninstall
# ---------------------------------------------------------------- end of the library, installed --

# ---------------------------------------------------------------- fuzzing (tests/fuzz/) --------
# libFuzzer harnesses, one per tests/fuzz/fuzz_NAME.c, built with clang under ASan + UBSan into
# build-fuzz/ (never mixed with the gcc builds). `make fuzz-build` builds them; `make fuzz
# FUZZ_SECONDS=N` (default 30) runs each for N seconds on its seed corpus tests/fuzz/corpus/NAME
# (new units go to build-fuzz/corpus/NAME), prints each harness's executions and fails when any
# finds a crash, a leak, a timeout or a sanitizer report (tests/fuzz/run.sh).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -O1 -g -pthread -Wall -Wno-unused-parameter -Wno-psabi $(FUZZ_SAN) \
                -Iinclude -Icore -Ilua -Irepl -Itests -Itests/fuzz -I/usr/include/lua5.4
FUZZ_LIBS    := -lpcre2-8 -lutf8proc -llua5.4 -lm -ldl
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS    := $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_NAMES))

$(FUZZ_BUILD)/lib/%.o: %.c                                      # library objects, fuzzer coverage
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/lib/lua/prelude_blob.o: lua/prelude.lua

$(FUZZ_BUILD)/libkvsieve.a: $(patsubst %.c,$(FUZZ_BUILD)/lib/%.o,$(CORE_SRC) $(LUA_SRC))
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) $(FUZZ_BUILD)/libkvsieve.a   # one harness
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libkvsieve.a $(FUZZ_LIBS)

fuzz-build: $(FUZZ_BINS)                                        # build every fuzz harness (clang)

fuzz: fuzz-build                                                # run each harness FUZZ_SECONDS s
	@FUZZ_ARGS='$(FUZZ_ARGS)' bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_NAMES)

.PHONY: fuzz fuzz-build
-include $(shell find $(FUZZ_BUILD)/lib -name '*.d' 2>/dev/null)
# ---------------------------------------------------------------- end of fuzzing ---------------
