# graphcap: `make` builds the library, the program and the Lua module;
# `make test` runs every suite on every backend present.
#   CUDA=auto (default) builds the cuda backend when nvcc is found, CUDA=0 never, CUDA=1 always.
#   CUDA_ARCH="80 89 90": the GPU architectures it is built for (default: those of the GPUs
#     nvidia-smi sees, else these three).
#   CUDNN=auto (default) runs the cuda backend's attention through cuDNN when the headers of
#     cuDNN's frontend are in .deps/cudnn-frontend (scripts/setup.sh fetches them), CUDNN=0 never,
#     CUDNN=1 always (the build fails without them). libcudnn itself is loaded at run time.
#   MPI=auto (default) builds the distributed layer on MPI when mpicc is found, MPI=0 never.
#   V=1 prints whole command lines; SETUP=0 leaves the system's packages alone.
#   make examples EXAMPLES_FULL=1 runs train_gpt.lua in its full setting (minutes), not its small.
#   make install PREFIX=... (default /usr/local) DESTDIR=...; make uninstall.

# Parallel by default; a -j given on the command line wins.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)

CUDA ?= auto
SETUP ?= 1
B := build
CC ?= gcc
NVCC ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))

ifeq ($(CUDA),auto)
  WITH_CUDA := $(if $(CUDA_HOME),1,0)
else
  WITH_CUDA := $(CUDA)
endif

VERSION := $(shell sed -n 's/^\#define GCAP_VERSION "\(.*\)"/\1/p' engine/include/graphcap.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))

# Where Lua's headers and static library are: deferred ('='), so that they are
# looked up when a recipe runs, after `setup` has installed liblua5.4-dev.
LUA_INCDIR ?=
LUA_INC = $(if $(LUA_INCDIR),-I$(LUA_INCDIR),$(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4))
LUA_A = $(shell $(CC) -print-file-name=liblua5.4.a)

# Lua's own warning set, plus -Wextra.
WARN := -Wall -Wextra -Wshadow -Wsign-compare -Wundef -Wwrite-strings -Wredundant-decls \
        -Wdisabled-optimization -Wdouble-promotion -Wmissing-prototypes -Wstrict-prototypes \
        -Wold-style-definition -Wmissing-declarations
OPT ?= -O2 -g
# CFLAGS given to make (or in the environment) come last, after the flags the build needs;
# a recursive make (asan) makes its own from its command line, not from this one's.
override CFLAGS := -std=c11 $(OPT) -fPIC $(WARN) -D_POSIX_C_SOURCE=200809L -Iengine/include \
                   -Iengine/src -MMD -MP $(CFLAGS)
unexport CFLAGS
# The GPU architectures the cuda backend is built for, as compute capabilities without the dot
# (CUDA_ARCH="80 89 90"): by default those of the GPUs nvidia-smi sees, else Ampere's, Ada's and
# Hopper's. Machine code for each, and PTX of the highest, which newer GPUs compile at load time.
ifeq ($(origin CUDA_ARCH),undefined)
  ifeq ($(WITH_CUDA),1)
    CUDA_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | \
                   tr -d . | grep -x '[0-9][0-9]*' | sort -nu)
  endif
  CUDA_ARCH := $(or $(CUDA_ARCH),80 89 90)
endif
ifeq ($(WITH_CUDA),1)
  ifneq ($(words $(CUDA_ARCH)),$(words $(shell printf '%s\n' $(CUDA_ARCH) | grep -x '[1-9][0-9]*')))
    $(error CUDA_ARCH="$(CUDA_ARCH)": compute capabilities without the dot, as in CUDA_ARCH="80 89 90")
  endif
endif
CUDA_PTX := $(shell printf '%s\n' $(CUDA_ARCH) | sort -n | tail -n 1)
NVFLAGS := -O3 -std=c++17 $(foreach a,$(sort $(CUDA_ARCH)),-gencode arch=compute_$(a),code=sm_$(a)) \
           -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX) \
           -Xcompiler -fPIC,-Wall,-Wextra -Iengine/include -Iengine/src -MMD -MP
# The architectures the device code was built for: a change rebuilds it.
ARCH_STAMP := $(B)/.arch-$(subst $() ,-,$(sort $(CUDA_ARCH)))
LDLIBS := -lm -ldl -lpthread
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl -lcudart_static -lrt -lstdc++

# cuDNN's frontend, for the cuda backend's attention (engine/src/cuda/attn_cudnn.cpp, plain C++:
# no device code, so g++ builds it, far faster than nvcc would): deferred ('='), as Lua's paths
# are, so that headers `setup` fetches during this make are found by the recipe. The frontend
# opens libcudnn itself (dlopen), so nothing links it.
CUDNN ?= auto
CUDNN_FE ?= .deps/cudnn-frontend/include
CUDNN_ON = $(if $(filter 0,$(CUDNN)),,$(if $(filter 1,$(CUDNN)),1,$(CUDNN_FOUND)))
CUDNN_FOUND = $(shell test -f $(CUDNN_FE)/cudnn_frontend.h && echo 1)
CUDNN_CFLAGS = $(if $(CUDNN_ON),-DGC_WITH_CUDNN -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
               -DCUDNN_FRONTEND_SKIP_JSON_LIB -isystem $(CUDNN_FE))
# The setting and whether the headers were there when this make started: a change rebuilds
# attn_cudnn.o (once more, too, on the make after the one that fetched them).
CUDNN_STAMP := $(B)/.cudnn-$(CUDNN)-$(if $(wildcard $(CUDNN_FE)/cudnn_frontend.h),1,0)
CXXFLAGS_CU := -std=c++17 $(OPT) -fPIC -Wall -Wextra -Iengine/include -Iengine/src \
               -I$(CUDA_HOME)/include -MMD -MP

# MPI, for the distributed layer (engine/src/dist): deferred ('='), as Lua's paths are, so that
# an OpenMPI that `setup` installs during this make is found by the recipes that need it.
MPI ?= auto
MPICC ?= mpicc
MPI_FOUND = $(if $(filter 0,$(MPI)),,$(shell command -v $(MPICC) 2>/dev/null))
MPI_CFLAGS = $(if $(MPI_FOUND),$(shell $(MPICC) --showme:compile) -DGC_WITH_MPI)
MPI_LIBS = $(if $(MPI_FOUND),$(shell $(MPICC) --showme:link))

# The layers (runtime <- tensor <- train, with its folder graphed/) and the host backend; the
# cuda backend below.
CORE_SRC := $(wildcard $(patsubst %,engine/src/%/*.c,runtime tensor train train/graphed dist host))
OBJ := $(CORE_SRC:%.c=$(B)/%.o)
ifeq ($(WITH_CUDA),1)
  OBJ += $(patsubst %.cu,$(B)/%.o,$(wildcard engine/src/cuda/*.cu))
  OBJ += $(patsubst %.cpp,$(B)/%.o,$(wildcard engine/src/cuda/*.cpp))
  LDLIBS += $(CUDA_LIBS) -Wl,-rpath,$(CUDA_HOME)/lib64
else
  OBJ += $(B)/engine/src/cuda/none.o
endif

LUA_FACADE := $(wildcard lua/graphcap/*.lua)
BINDING_OBJ := $(patsubst %.c,$(B)/%.o,$(wildcard lua/binding/*.c))
TEST_C := $(patsubst tests/c/%.c,$(B)/tests/%,$(wildcard tests/c/test_*.c))
SHLIB := $(B)/libgraphcap.so.$(VERSION)
# The backends built, and those run: cuda where the backend is built and a GPU answers.
BUILT := host $(if $(filter 1,$(WITH_CUDA)),cuda)
BACKENDS := host $(if $(filter 1,$(WITH_CUDA)),$(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda))

# Short lines ("CC file"); V=1 shows the commands themselves.
ifeq ($(V),1)
  Q :=
  say := @:
else
  Q := @
  say := @printf '  %-5s %s\n'
endif

.PHONY: all setup lua-module test test-c test-lua run examples bench bench-torch asan fuzz soak lint clean \
        install install-lib install-lua install-bin uninstall
all: setup $(B)/libgraphcap.a $(SHLIB) $(B)/graphcap $(B)/lua/graphcap/core.so $(TEST_C) $(B)/embed \
     $(B)/embed_custom $(B)/embed_dist

# Everything that needs Lua's headers, library or interpreter waits for this.
setup:
ifeq ($(SETUP),1)
	@scripts/setup.sh
endif

$(B)/%.o: %.c
	$(say) CC $<
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(B)/engine/src/cuda/%.o: engine/src/cuda/%.cu $(ARCH_STAMP)
	$(say) NVCC $<
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@

$(B)/engine/src/cuda/%.o: engine/src/cuda/%.cpp $(CUDNN_STAMP) | setup
	$(say) CXX $<
	@mkdir -p $(@D)
	$(Q)$(CXX) $(CXXFLAGS_CU) $(CUDNN_CFLAGS) -c $< -o $@

$(B)/lua/%.o: lua/%.c | setup
	$(say) CC $<
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(LUA_INC) -c $< -o $@

# The configuration the objects were built for: switching CUDA= rebuilds the archive.
STAMP := $(B)/.cuda-$(WITH_CUDA)
$(STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.cuda-*
	@touch $@

# Likewise for cuDNN (CUDNN_STAMP, above).
$(CUDNN_STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.cudnn-*
	@touch $@

# Likewise for the GPU architectures (ARCH_STAMP, above).
$(ARCH_STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.arch-*
	@touch $@

# Likewise for MPI, as this make found it when it started.
MPI_STAMP := $(B)/.mpi-$(if $(MPI_FOUND),1,0)
$(MPI_STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.mpi-*
	@touch $@

# The distributed layer sees MPI's headers; built after `setup`, which installs them.
$(B)/engine/src/dist/%.o: engine/src/dist/%.c $(MPI_STAMP) | setup
	$(say) CC $<
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) $(MPI_CFLAGS) -c $< -o $@

$(B)/libgraphcap.a: $(OBJ) $(STAMP)
	$(say) AR $@
	@rm -f $@
	$(Q)ar rcs $@ $(OBJ)

# The shared library exports the API (gcap_*) and nothing else.
$(SHLIB): $(OBJ) $(STAMP) engine/libgraphcap.map
	$(say) LD $@
	$(Q)$(CC) -shared -o $@ -Wl,-soname,libgraphcap.so.$(SOMAJOR) \
	  -Wl,--version-script,engine/libgraphcap.map $(OBJ) $(LDLIBS) $(MPI_LIBS)

$(B)/lua_embed.c: scripts/embed.lua $(LUA_FACADE) | setup
	$(say) GEN $@
	@mkdir -p $(@D)
	$(Q)lua5.4 scripts/embed.lua $@ $(LUA_FACADE)

$(B)/lua_embed.o: $(B)/lua_embed.c
	$(say) CC $<
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

# Where nvrtc.c looks for NVRTC when the loader's path has none: the toolkit found here.
$(B)/engine/src/tensor/nvrtc.o: override CFLAGS += $(if $(CUDA_HOME),-DGC_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"')

# The program links Lua statically, so it runs where no Lua is installed.
$(B)/graphcap: $(B)/lua/main.o $(BINDING_OBJ) $(B)/lua_embed.o $(B)/libgraphcap.a | setup
	$(say) LD $@
	$(Q)$(CC) -o $@ $^ $(LUA_A) $(LDLIBS) $(MPI_LIBS) -Wl,-E

# For a stock lua5.4: require "graphcap.core" with LUA_CPATH='build/lua/?.so'.
$(B)/lua/graphcap/core.so: $(BINDING_OBJ) $(B)/libgraphcap.a
	$(say) LD $@
	@mkdir -p $(@D)
	$(Q)$(CC) -shared -o $@ $^ $(LDLIBS) $(MPI_LIBS)

lua-module: $(B)/lua/graphcap/core.so

$(B)/tests/%: tests/c/%.c tests/c/t.h $(B)/libgraphcap.a
	$(say) CC $<
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(B)/libgraphcap.a $(LDLIBS) $(MPI_LIBS)

$(B)/embed: $(wildcard examples/embed/*.c) $(B)/libgraphcap.a
	$(say) CC examples/embed
	$(Q)$(CC) $(CFLAGS) -o $@ $(wildcard examples/embed/*.c) $(B)/libgraphcap.a $(LDLIBS) $(MPI_LIBS)

# A C host's own kernel as a custom op: its .cu built by nvcc with the cuda backend, its host
# twin in C always.
EC_DIR := examples/embed_custom
EC_OBJ := $(if $(filter 1,$(WITH_CUDA)),$(B)/$(EC_DIR)/sqplus.o)
EC_DEF := $(if $(filter 1,$(WITH_CUDA)),-DSQPLUS_CUDA)
$(B)/$(EC_DIR)/sqplus.o: $(EC_DIR)/sqplus.cu $(EC_DIR)/sqplus.h $(ARCH_STAMP)
	$(say) NVCC $<
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVFLAGS) $(EC_DEF) -c $< -o $@

$(B)/embed_custom: $(wildcard $(EC_DIR)/*.c) $(EC_DIR)/sqplus.h $(EC_OBJ) $(B)/libgraphcap.a
	$(say) CC $(EC_DIR)
	$(Q)$(CC) $(CFLAGS) $(EC_DEF) -o $@ $(wildcard $(EC_DIR)/*.c) $(EC_OBJ) $(B)/libgraphcap.a \
	  $(LDLIBS)

# The distributed C host (run under mpirun by tests/lua/test_dist_training.lua).
$(B)/embed_dist: $(wildcard examples/embed_dist/*.c) $(B)/libgraphcap.a
	$(say) CC examples/embed_dist
	$(Q)$(CC) $(CFLAGS) -o $@ $(wildcard examples/embed_dist/*.c) $(B)/libgraphcap.a $(LDLIBS) \
	  $(MPI_LIBS)

run: all
	$(B)/graphcap examples/train_mlp.lua
	@echo "run: examples/train_mlp.lua ran on the" \
	  "$$($(B)/graphcap -e 'io.write(require("graphcap").device())') backend"

# Every example, train_gpt.lua in its small setting (EXAMPLES_FULL=1: its full one, minutes
# long), each run from $(EX_DIR), so that what it writes stays out of the source tree.
# gc.cuda.kernel compiles with NVRTC, on every backend: where NVRTC is not available, the
# examples that call it are skipped, with the reason.
EXAMPLES_FULL ?= 0
EX_DIR := $(B)/examples
EX_GPT := $(if $(filter 1,$(EXAMPLES_FULL)),full,small) $(abspath $(EX_DIR))/train_gpt_loss.svg
NVRTC_PROBE := local ok, e = pcall(require("graphcap").cuda.kernel, \
                 [[extern "C" __global__ void k() {}]], "k") \
               io.write(not ok and tostring(e):match("NVRTC is not available (%b())") or "")
examples: all
	@mkdir -p $(EX_DIR)
	@nvrtc=$$($(B)/graphcap --device host -e '$(NVRTC_PROBE)'); \
	for f in examples/*.lua; do \
	  if [ -n "$$nvrtc" ] && grep -q 'gc\.cuda\.kernel' $$f; then \
	    echo "== $$f: skipped, gc.cuda.kernel needs NVRTC $$nvrtc"; continue; \
	  fi; \
	  a=; case $$f in examples/train_gpt.lua) a="$(EX_GPT)" ;; esac; \
	  echo "== $$f$${a:+ $$a}"; \
	  (cd $(EX_DIR) && $(abspath $(B))/graphcap $(CURDIR)/$$f $$a) || exit 1; \
	done

# TEST_NOT_RUN: the backends built but not run here, for the summary.
test: all
	@TEST_NOT_RUN="$(filter-out $(BACKENDS),$(BUILT))" tests/run.sh $(B) $(BACKENDS)

test-c: all
	@TEST_ONLY=c tests/run.sh $(B) host

test-lua: all
	@TEST_ONLY=lua tests/run.sh $(B) host

# Host suites under AddressSanitizer, LeakSanitizer and UBSan (with float-to-integer overflow),
# in a build tree of their own. OpenMPI keeps memory from MPI_Init to the end of the process:
# tests/lsan-mpi.supp leaves it out, by the MPI frames of full stacks.
SAN := -fsanitize=address,undefined,float-cast-overflow
asan:
	$(MAKE) B=build/asan CUDA=0 OPT="-O1 -g $(SAN) -fno-omit-frame-pointer" \
	  LDLIBS="-lm -ldl -lpthread $(SAN)" all
	ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan-mpi.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 tests/run.sh build/asan host

# The fuzzers with a new seed (printed; FUZZ_SEED=s repeats a run) and a long budget (the
# hazard fuzzer: 20,000 cases of 6 moves, about a minute on the host), and
# the soak tests at 5x (15,000 graph/free cycles, 100,000 replays, 1,500 graphings).
# A Lua suite requires its helpers from tests/lua, as tests/run.sh runs it.
FUZZ_SEED ?= $(shell date +%s)
SUITE_PATH := LUA_PATH='$(CURDIR)/tests/lua/?.lua;;'
fuzz: all
	GRAPHCAP_FUZZ_SEED=$(FUZZ_SEED) GRAPHCAP_FUZZ_ITERS=200000 $(SUITE_PATH) \
	  $(B)/graphcap tests/lua/test_fuzz_api.lua
	GRAPHCAP_FUZZ_SEED=$(FUZZ_SEED) GRAPHCAP_FUZZ_ITERS=5000 $(SUITE_PATH) \
	  $(B)/graphcap tests/lua/test_fuzz_diff.lua
	GRAPHCAP_FUZZ_SEED=$(FUZZ_SEED) GRAPHCAP_FUZZ_ITERS=20000 $(SUITE_PATH) \
	  $(B)/graphcap tests/lua/test_fuzz_hazard.lua

soak: all
	GRAPHCAP_SOAK=5 $(B)/tests/test_soak
	GRAPHCAP_SOAK=5 $(SUITE_PATH) $(B)/graphcap tests/lua/test_soak.lua

lint:
	@scripts/lint.sh

# bench.lua's sections (those `all` runs, in its order), each in a process of its own, as
# PyTorch's scripts run; on a GPU without FP8 the fp8 section says so and prints no line.
ifeq ($(filter cuda,$(BACKENDS)),cuda)
bench: all
	$(B)/graphcap --device cuda bench/bench.lua configs
	$(B)/graphcap --device cuda bench/bench.lua scaling
	$(B)/graphcap --device cuda bench/bench.lua transformer
	$(B)/graphcap --device cuda bench/bench.lua fp8
	@$(MAKE) --no-print-directory bench-torch
else
bench:
	@echo "bench: the benchmark measures the cuda backend on a GPU, and" \
	  "$(if $(filter cuda,$(BUILT)),no GPU is visible here (nvidia-smi -L lists none),this build has no cuda backend (nvcc not found, or CUDA=0))" >&2
	@exit 1
endif

# PyTorch's side of the benchmark, where python3 has torch.
bench-torch:
	@if python3 -c 'import torch' 2>/dev/null; then \
	  python3 bench/torch_graphed.py && python3 bench/torch_scaling.py && \
	  python3 bench/torch_transformer.py && python3 bench/torch_fp8.py; \
	else echo "bench: python3 has no torch; PyTorch's side (bench/torch_*.py) not run" >&2; fi

# Install: the headers, the static and the shared library, graphcap.pc (which links the shared
# one) and graphcap-static.pc (the static one), the Lua module in Lua 5.4's default paths under
# PREFIX, and the program.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
LUA_SHAREDIR ?= $(PREFIX)/share/lua/5.4
LUA_LIBDIR ?= $(PREFIX)/lib/lua/5.4
D := $(DESTDIR)
# The public headers: graphcap.h and the types it includes.
HEADERS := engine/include/graphcap.h engine/include/graphcap_types.h
# The dynamic linker's cache learns of the library when installed for this system.
LDCONFIG := if [ -z "$(D)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

install: install-lib install-lua install-bin

# A directory under PREFIX as graphcap.pc writes it, relative to ${prefix}.
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
# The pkg-config files' fields, filled in from their templates.
PC_SED = -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(call under_prefix,$(LIBDIR))|' \
  -e 's|@INCLUDEDIR@|$(call under_prefix,$(INCLUDEDIR))|' \
  -e 's|@VERSION@|$(VERSION)|; s|@LIBS_PRIVATE@|$(strip $(filter-out -Wl%,$(LDLIBS) $(MPI_LIBS)))|'

install-lib: $(B)/libgraphcap.a $(SHLIB) engine/graphcap.pc.in engine/graphcap-static.pc.in
	install -d $(D)$(INCLUDEDIR) $(D)$(LIBDIR) $(D)$(PKGCONFIGDIR)
	install -m 644 $(HEADERS) $(D)$(INCLUDEDIR)/
	install -m 644 $(B)/libgraphcap.a $(D)$(LIBDIR)/
	install -m 755 $(SHLIB) $(D)$(LIBDIR)/
	ln -sf libgraphcap.so.$(VERSION) $(D)$(LIBDIR)/libgraphcap.so.$(SOMAJOR)
	ln -sf libgraphcap.so.$(SOMAJOR) $(D)$(LIBDIR)/libgraphcap.so
	sed $(PC_SED) engine/graphcap.pc.in >$(D)$(PKGCONFIGDIR)/graphcap.pc
	sed $(PC_SED) engine/graphcap-static.pc.in >$(D)$(PKGCONFIGDIR)/graphcap-static.pc
	@$(LDCONFIG)

install-lua: $(B)/lua/graphcap/core.so
	install -d $(D)$(LUA_SHAREDIR)/graphcap $(D)$(LUA_LIBDIR)/graphcap
	install -m 644 $(LUA_FACADE) $(D)$(LUA_SHAREDIR)/graphcap/
	install -m 755 $(B)/lua/graphcap/core.so $(D)$(LUA_LIBDIR)/graphcap/

install-bin: $(B)/graphcap
	install -d $(D)$(BINDIR)
	install -m 755 $(B)/graphcap $(D)$(BINDIR)/

uninstall:
	rm -f $(patsubst engine/include/%,$(D)$(INCLUDEDIR)/%,$(HEADERS)) $(D)$(LIBDIR)/libgraphcap.a \
	  $(D)$(LIBDIR)/libgraphcap.so $(D)$(LIBDIR)/libgraphcap.so.$(SOMAJOR) \
	  $(D)$(LIBDIR)/libgraphcap.so.$(VERSION) $(D)$(PKGCONFIGDIR)/graphcap.pc \
	  $(D)$(PKGCONFIGDIR)/graphcap-static.pc \
	  $(D)$(LUA_LIBDIR)/graphcap/core.so $(D)$(BINDIR)/graphcap \
	  $(patsubst lua/graphcap/%,$(D)$(LUA_SHAREDIR)/graphcap/%,$(LUA_FACADE))
	@rmdir $(D)$(LUA_SHAREDIR)/graphcap $(D)$(LUA_LIBDIR)/graphcap 2>/dev/null || true
	@$(LDCONFIG)

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
