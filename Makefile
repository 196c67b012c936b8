# graphcap: `make` builds the library, the program and the Lua module;
# `make test` runs every suite on every backend present.
#   CUDA=auto (default) builds the cuda backend when nvcc is found, CUDA=0 never, CUDA=1 always.

CUDA ?= auto
B := build
CC ?= gcc
NVCC ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))

ifeq ($(CUDA),auto)
  WITH_CUDA := $(if $(CUDA_HOME),1,0)
else
  WITH_CUDA := $(CUDA)
endif

LUA_INC := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUA_A := $(firstword $(wildcard /usr/lib/$(shell gcc -print-multiarch)/liblua5.4.a /usr/lib/liblua5.4.a))

# Lua's own warning set, plus -Wextra.
WARN := -Wall -Wextra -Wshadow -Wsign-compare -Wundef -Wwrite-strings -Wredundant-decls \
        -Wdisabled-optimization -Wdouble-promotion -Wmissing-prototypes -Wstrict-prototypes \
        -Wold-style-definition -Wmissing-declarations
OPT ?= -O2 -g
CFLAGS := -std=c11 $(OPT) -fPIC $(WARN) -D_POSIX_C_SOURCE=200809L -Iengine/include -Iengine/src -MMD -MP
NVFLAGS := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
           -Xcompiler -fPIC,-Wall,-Wextra -Iengine/include -Iengine/src -MMD -MP
LDLIBS := -lm -ldl -lpthread

CORE_SRC := $(wildcard engine/src/*.c) $(wildcard engine/src/host/*.c)
OBJ := $(CORE_SRC:%.c=$(B)/%.o)
ifeq ($(WITH_CUDA),1)
  OBJ += $(patsubst %.cu,$(B)/%.o,$(wildcard engine/src/cuda/*.cu))
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static -lrt -lstdc++ \
            -Wl,-rpath,$(CUDA_HOME)/lib64
else
  OBJ += $(B)/engine/src/cuda/none.o
endif

LUA_FACADE := $(wildcard lua/graphcap/*.lua)
TEST_C := $(patsubst tests/c/%.c,$(B)/tests/%,$(wildcard tests/c/test_*.c))
# cuda runs too where the backend is built and a GPU answers.
BACKENDS := host $(if $(filter 1,$(WITH_CUDA)),$(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda))

.PHONY: all setup test test-c test-lua run examples bench asan fuzz soak lint clean
all: setup $(B)/libgraphcap.a $(B)/graphcap $(B)/lua/graphcap/core.so $(TEST_C) $(B)/embed

setup:
	@scripts/setup.sh

$(B)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/engine/src/cuda/%.o: engine/src/cuda/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(B)/lua/%.o: lua/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LUA_INC) -c $< -o $@

# The configuration the objects were built for: switching CUDA= rebuilds the archive.
STAMP := $(B)/.cuda-$(WITH_CUDA)
$(STAMP):
	@mkdir -p $(B)
	@rm -f $(B)/.cuda-*
	@touch $@

$(B)/libgraphcap.a: $(OBJ) $(STAMP)
	@rm -f $@
	ar rcs $@ $(OBJ)

$(B)/lua_embed.c: scripts/embed.lua $(LUA_FACADE) | setup
	@mkdir -p $(@D)
	lua5.4 scripts/embed.lua $@ $(LUA_FACADE)

$(B)/lua_embed.o: $(B)/lua_embed.c
	$(CC) $(CFLAGS) -c $< -o $@

# The program links Lua statically, so it runs where no Lua is installed.
$(B)/graphcap: $(B)/lua/main.o $(B)/lua/lgraphcap.o $(B)/lua_embed.o $(B)/libgraphcap.a
	$(CC) -o $@ $^ $(LUA_A) $(LDLIBS) -Wl,-E

# For a stock lua5.4: require "graphcap.core" with LUA_CPATH='build/lua/?.so'.
$(B)/lua/graphcap/core.so: $(B)/lua/lgraphcap.o $(B)/libgraphcap.a
	@mkdir -p $(@D)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(B)/tests/%: tests/c/%.c tests/c/t.h $(B)/libgraphcap.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(B)/libgraphcap.a $(LDLIBS)

$(B)/embed: $(wildcard examples/embed/*.c) $(B)/libgraphcap.a
	@if [ -n "$(wildcard examples/embed/*.c)" ]; then \
	  echo "$(CC) -o $@ examples/embed/*.c"; \
	  $(CC) $(CFLAGS) -o $@ $(wildcard examples/embed/*.c) $(B)/libgraphcap.a $(LDLIBS); fi

run: all
	$(B)/graphcap examples/train_mlp.lua

examples: all
	@for f in examples/*.lua; do echo "== $$f"; $(B)/graphcap $$f || exit 1; done

test: all
	@scripts/run-tests.sh $(B) $(BACKENDS)

test-c: all
	@TEST_ONLY=c scripts/run-tests.sh $(B) host

test-lua: all
	@TEST_ONLY=lua scripts/run-tests.sh $(B) host

# Host suites under AddressSanitizer, LeakSanitizer and UBSan (with float-to-integer overflow),
# in a build tree of their own.
SAN := -fsanitize=address,undefined,float-cast-overflow
asan:
	$(MAKE) B=build/asan CUDA=0 OPT="-O1 -g $(SAN) -fno-omit-frame-pointer" \
	  LDLIBS="-lm -ldl -lpthread $(SAN)" all
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  scripts/run-tests.sh build/asan host

# The fuzzers with a new seed (printed; FUZZ_SEED=s repeats a run) and a long budget, and
# the soak tests at 5x (15,000 graph/free cycles, 100,000 replays, 1,500 graphings).
FUZZ_SEED ?= $(shell date +%s)
fuzz: all
	GRAPHCAP_FUZZ_SEED=$(FUZZ_SEED) GRAPHCAP_FUZZ_ITERS=200000 $(B)/graphcap tests/lua/test_fuzz_api.lua
	GRAPHCAP_FUZZ_SEED=$(FUZZ_SEED) GRAPHCAP_FUZZ_ITERS=5000 $(B)/graphcap tests/lua/test_fuzz_diff.lua

soak: all
	GRAPHCAP_SOAK=5 $(B)/tests/test_soak
	GRAPHCAP_SOAK=5 $(B)/graphcap tests/lua/test_soak.lua

lint:
	@scripts/lint.sh

# The scaling runs in a process of its own, as PyTorch's torch_scaling.py does.
bench: all
	$(B)/graphcap scripts/bench.lua configs
	$(B)/graphcap scripts/bench.lua scaling

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
