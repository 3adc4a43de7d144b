# kernels/cuda.mk — the CUDA backend. Include from the main Makefile (when CUDA=1) right after
# LIB_OBJ is defined and before the $(BUILD)/libkvsieve.a rule:
#     include kernels/cuda.mk
# It appends the kernel objects to LIB_OBJ, defines KS_HAVE_CUDA for core/api.c, adds the
# CUDA libraries to LDLIBS and provides the targets below. cuBLAS is linked dynamically
# (this toolkit ships no libcublas_static.a), with an rpath to $(CUDA_HOME)/lib64; the CUDA
# runtime statically (libcudart_static.a). On the GPU machine the toolkit's lib64 (or
# LD_LIBRARY_PATH) must provide libcublas.so.13 and libcublasLt.so.13. NCCL (kernels/tp_nccl.cu:
# the collectives of tensor parallelism over GPUs) likewise dynamically from the toolkit's lib64
# (no libnccl_static.a there): libnccl.so.2.

NVCC        ?= nvcc
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# Hopper only: sm_90a machine code (wgmma / setmaxnreg need the "a" target; HOPPER.md)
CUDA_ARCH   ?= -gencode=arch=compute_90a,code=sm_90a
NVCCFLAGS   ?= -O3 -std=c++17 $(CUDA_ARCH) -lineinfo -Xcompiler -Wall,-Wno-unused-parameter,-Wno-unused-function
CUDA_INC    := -Iinclude -Icore -Ikernels
CUDA_SRC    := $(wildcard kernels/*.cu)
CUDA_OBJ    := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
CUDA_HDR    := $(wildcard kernels/*.cuh kernels/*.h)
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lnccl \
               $(CUDA_HOME)/lib64/libcudart_static.a -lrt -ldl -lpthread -lstdc++

CFLAGS  += -DKS_HAVE_CUDA
LIB_OBJ += $(CUDA_OBJ)
LDLIBS  += $(CUDA_LDLIBS)

# -MMD -MP: a .d file beside each object lists the headers it read (core/*.h too: a struct that
# changes there, ks_backend's, must rebuild every kernel file that uses it); the Makefile
# includes every .d under $(BUILD)
$(BUILD)/kernels/%.o: kernels/%.cu $(CUDA_HDR)                  # compile one CUDA file
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_INC) -MMD -MP -c $< -o $@

# The dev harness (test_wgmma, bench_kernels, bench_decode) links these files built again with
# KS_KERNEL_DEV: the attention variants measured on the way to the shipped kernels (validated
# by test_wgmma) and the gemv prefetch sweep. libkvsieve and kvsieve never contain them.
CUDA_DEV_SRC  := kernels/attn_prefill.cu kernels/attn_prefill_wgmma.cu kernels/gemv.cu
CUDA_DEV_OBJ  := $(patsubst kernels/%.cu,$(BUILD)/kernels-dev/%.o,$(CUDA_DEV_SRC))
CUDA_DEV_LINK := $(filter-out $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_DEV_SRC)),$(CUDA_OBJ)) $(CUDA_DEV_OBJ)
CUDA_DEV_PROGS := test_wgmma bench_kernels bench_decode

$(BUILD)/kernels-dev/%.o: kernels/%.cu $(CUDA_HDR)              # compile one CUDA file for the dev harness
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DKS_KERNEL_DEV $(CUDA_INC) -MMD -MP -c $< -o $@

$(patsubst %,$(BUILD)/tests/cuda/%.o,$(CUDA_DEV_PROGS)): NVCCFLAGS += -DKS_KERNEL_DEV

$(BUILD)/tests/cuda/%.o: CFLAGS += -Ikernels -I$(CUDA_HOME)/include
$(BUILD)/tests/cuda/%.o: tests/cuda/%.c $(CUDA_HDR)              # compile a CUDA test (C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/tests/cuda/%.o: tests/cuda/%.cu $(CUDA_HDR)             # compile a CUDA test (CUDA)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_INC) -Itests -MMD -MP -c $< -o $@

# the parity test: every backend op vs the CPU backend, end to end on tiny models + stories260K
$(BUILD)/test_cuda: $(BUILD)/tests/cuda/test_cuda.o $(BUILD)/tests/testutil.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# per-kernel benchmark: TFLOP/s and GB/s next to a cuBLAS GEMM and a device copy
$(BUILD)/bench_kernels: $(BUILD)/tests/cuda/bench_kernels.o $(CUDA_DEV_LINK) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the decode step's kernels at the Llama-3.1-8B shape: gemv variants, attention splits, the
# 32-layer sequence with and without programmatic dependent launch (GPU machine)
$(BUILD)/bench_decode: $(BUILD)/tests/cuda/bench_decode.o $(CUDA_DEV_LINK) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# device primitives vs core/prims.c
$(BUILD)/test_cuda_prims: $(BUILD)/tests/cuda/test_cuda_prims.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# every policy with its primitives on the GPU (device tensors) vs on the CPU, and vs the CPU backend
$(BUILD)/test_cuda_policies: $(BUILD)/tests/cuda/test_cuda_policies.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# tensor parallelism on GPU ranks: one rank with NCCL vs the plain backend, two ranks vs one GPU
$(BUILD)/test_tp_cuda: $(BUILD)/tests/cuda/test_tp_cuda.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# every prefill attention kernel (the shipped ones and the dev variants) vs a naive reference,
# and their speed (GPU machine): $(BUILD)/test_wgmma [--quick]
$(BUILD)/test_wgmma: $(BUILD)/tests/cuda/test_wgmma.o $(CUDA_DEV_LINK) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the batched decode attention (kernels/attn_decode_batch.cu) vs its CPU twin, and its time at the
# Llama-3.1-8B decode shape beside the per-session path (GPU machine): $(BUILD)/test_attn_decode_batch [--quick]
$(BUILD)/test_attn_decode_batch: $(BUILD)/tests/cuda/test_attn_decode_batch.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# one decode row over device index lists with pre-RoPE keys rotated in the tensor-core kernel vs
# the CPU and the gather path it replaced, and its time (GPU machine): $(BUILD)/test_attn_list [--quick] [--bench]
$(BUILD)/test_attn_list: $(BUILD)/tests/cuda/test_attn_list.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the skinny GEMM (kernels/gemm_rows.cu) vs the CPU backend's matmul; --bench: the 8B decode shapes (GPU machine)
$(BUILD)/test_gemm_rows: $(BUILD)/tests/cuda/test_gemm_rows.o $(CUDA_OBJ) $(BUILD)/libkvsieve.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

cuda: $(BUILD)/kvsieve $(BUILD)/host cuda-tests                # the CUDA engine and its tests (build-cuda/)

cuda-tests: $(BUILD)/test_cuda $(BUILD)/test_cuda_prims $(BUILD)/test_cuda_policies $(BUILD)/test_tp_cuda $(BUILD)/nccl_allreduce $(BUILD)/test_attn_decode_batch $(BUILD)/test_attn_list $(BUILD)/test_gemm_rows $(BUILD)/test_wgmma $(BUILD)/bench_kernels $(BUILD)/bench_decode  # build the CUDA test programs

test-cuda: cuda-tests                                           # run the CUDA parity tests (GPU machine)
	$(BUILD)/test_cuda
	$(BUILD)/test_cuda --quick --pdl
	$(BUILD)/test_cuda --quick --no-graphs
	$(BUILD)/test_cuda --mma-prefill
	$(BUILD)/test_cuda_prims
	$(BUILD)/test_cuda_policies
	$(BUILD)/test_attn_decode_batch
	$(BUILD)/test_attn_list
	$(BUILD)/test_gemm_rows
	$(BUILD)/test_tp_cuda
	$(BUILD)/test_wgmma

test-cuda-sanitize: cuda-tests                                  # the same under compute-sanitizer (memcheck)
	compute-sanitizer --tool memcheck --error-exitcode 1 $(BUILD)/test_cuda --quick
	compute-sanitizer --tool memcheck --error-exitcode 1 $(BUILD)/test_cuda_prims --quick
	compute-sanitizer --tool memcheck --error-exitcode 1 $(BUILD)/test_wgmma --quick

bench-kernels: $(BUILD)/bench_kernels                           # per-kernel benchmark (GPU machine)
	$(BUILD)/bench_kernels

# all-reduce bandwidth through NCCL, nccl-tests style (bench/nccl_allreduce.cu; GPU machine)
$(BUILD)/nccl_allreduce: bench/nccl_allreduce.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lnccl

.PHONY: cuda-tests test-cuda test-cuda-sanitize bench-kernels
