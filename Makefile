# Tessera: every target wraps CMake with the Ninja generator (docs/building.md).
# Targets are phony and re-entrant: running one again is an incremental build.
#
#   make demo                        install missing deps, build, run examples/tensor_demo,
#                                    examples/mesh_demo, examples/dtensor_demo, the main example
#                                    examples/train_lm and examples/heat_domain (4 in-process ranks),
#                                    examples/train_pipeline (8 ranks: pp2 x dp2 x tp2, 1F1B),
#                                    examples/controller_demo (a single controller, 4 workers)
#   make demo-xla                    install missing deps, build, run the torch_xla / JAX translations
#                                    over tessera/spec: examples/xla_mlp (8 in-process ranks) and
#                                    examples/jax_shard_map (4 ranks)
#   make test                        install missing deps, build everything, run every test
#   make bench                       Release build, run the benchmark binaries (and, when built
#                                    with MPI, tessera_comm_bench under mpirun -np 2 and -np 4)
#   make test-multihost              build, run the comm, runtime, mesh, dtensor and nn tests under mpirun on
#                                    simulated hosts (network namespaces, TCP only: scripts/multihost.sh),
#                                    2 hosts x 2 ranks and 3 hosts x 2 ranks; skipped (exit 0) where
#                                    it cannot run (needs root and iproute2)
#   make bench-multihost             Release build, tessera_comm_bench on 2 hosts x 2 ranks over TCP
#   make bench-peers                 Release build, then the training step of tessera_train_bench next to
#                                    the same model in PyTorch (eager, DTensor, FSDP2) and JAX (jit), installed
#                                    from PyPI into build/peers-venv for this target only (bench/peers), op
#                                    dispatch against DTensor's, and tessera_plan_scale_bench's plans against
#                                    DTensor's planner on the same pairs (bench/peers/plan_pairs.json)
#   make sanitize                    ASan+UBSan build in build-sanitize, run every test
#   make sanitize TESSERA_SANITIZE=thread   TSan build in build-tsan, run every test
#   make install PREFIX=/opt/tessera install headers, library and the CMake package
#   make consumer                    install into a temporary prefix, build examples/consumer
#                                    against it with find_package(Tessera), run it
#   make clean                       remove build/, build-release/, build-sanitize/, build-tsan/
#
# Variables: BUILD_DIR (build), BUILD_TYPE (Release), JOBS (nproc), CTEST_JOBS (2),
# CMAKE_ARGS (extra -D options, e.g. CMAKE_ARGS=-DTESSERA_WITH_MPI=OFF), PREFIX (/usr/local),
# TESSERA_SANITIZE ("address;undefined" or "thread"), BENCH_ARGS (passed to the bench binaries),
# MULTIHOST_LAYOUTS (HOSTSxRANKS per host, "2x2 3x2"), MULTIHOST_TESTS (layers, "comm runtime mesh dtensor nn spec domain mpmd"),
# MULTIHOST_SWEEPS_LAYOUT (the layout that runs the op sweeps across hosts too, "2x2").

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CTEST_JOBS ?= 2
CTEST_ARGS ?= --timeout 600
CMAKE_ARGS ?=
PREFIX     ?= /usr/local
BENCH_ARGS ?=
MULTIHOST_LAYOUTS ?= 2x2 3x2
MULTIHOST_TESTS   ?= comm runtime mesh dtensor nn spec domain mpmd
# The op sweeps (hundreds of value-parameterised cases, most of the dtensor and autograd tests'
# time) run across hosts on this layout only; the others run every other test.
MULTIHOST_SWEEPS_LAYOUT ?= 2x2
# Build only these targets in `make sanitize` (default: everything), e.g. the threads-backend tests.
SANITIZE_TARGETS ?=

TESSERA_SANITIZE ?= address;undefined
ifeq ($(strip $(TESSERA_SANITIZE)),)
override TESSERA_SANITIZE := address;undefined
endif
SANITIZE_DIR ?= $(if $(findstring thread,$(TESSERA_SANITIZE)),build-tsan,build-sanitize)
# Optimised with debug info: fast enough to run every test, readable stack traces.
SANITIZE_BUILD_TYPE ?= RelWithDebInfo
# -Og with line tables only (-g1): the optimisations of -O1 (what the ASan and TSan docs advise)
# that keep code debuggable, so reports name every frame's file and line; under ASan+UBSan a
# library file compiles in 55-65% of the time of -O1 (dtensor.cpp 12.5 -> 6.9 s, elementwise.cpp
# 120 -> 77 s), in a quarter of -O2 -g.
SANITIZE_CXX_FLAGS ?= -Og -g1 -DNDEBUG
# Under ASan+UBSan the tests' own files are compiled plain (instrumented, a test file took five
# times as long: 14 s -> 67-80 s for dtensor_api_test.cpp) and linked with the runtimes: the library they call is instrumented, so every
# access it makes is checked. TSan instruments them too: a test's rank lambdas run on the
# threads whose races it looks for.
SANITIZE_TESTS ?= $(if $(findstring thread,$(TESSERA_SANITIZE)),ON,OFF)
# Benchmarks are always measured on a Release build.
BENCH_DIR ?= $(if $(filter Release,$(BUILD_TYPE)),$(BUILD_DIR),build-release)

CONSUMER_DIR := $(abspath $(BUILD_DIR))/consumer

# Sanitizer runtime options (the user's environment wins).
export ASAN_OPTIONS  ?= detect_leaks=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS  ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

# $(call configure,dir,build type,extra cmake args): configures dir once. It runs CMake again
# only when dir has no build.ninja or the arguments differ from the last configure (recorded
# in dir/.make-configure); otherwise Ninja re-runs CMake itself when a CMakeLists.txt changes.
define configure
	@args='-G Ninja -DCMAKE_BUILD_TYPE=$(2) $(3)'; \
	if [ ! -f $(1)/build.ninja ] || [ "$$(cat $(1)/.make-configure 2>/dev/null)" != "$$args" ]; then \
	  echo "cmake -S . -B $(1) $$args"; \
	  eval cmake -S . -B $(1) $$args && echo "$$args" > $(1)/.make-configure; \
	fi
endef

.PHONY: all help deps configure build demo demo-xla test test-multihost bench bench-multihost bench-peers sanitize install consumer clean

all: build

help:
	@sed -n '1,/^$$/p' $(firstword $(MAKEFILE_LIST)) | sed 's/^# \{0,1\}//'

deps:
	@scripts/install-deps.sh

configure: deps
	$(call configure,$(BUILD_DIR),$(BUILD_TYPE),$(CMAKE_ARGS))

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target tensor_demo mesh_demo dtensor_demo train_lm heat_domain train_pipeline controller_demo
	$(BUILD_DIR)/examples/tensor_demo
	$(BUILD_DIR)/examples/mesh_demo --ranks 4
	$(BUILD_DIR)/examples/dtensor_demo --ranks 4
	$(BUILD_DIR)/examples/train_lm --ranks 4
	$(BUILD_DIR)/examples/heat_domain --ranks 4
	$(BUILD_DIR)/examples/train_pipeline --ranks 8
	$(BUILD_DIR)/examples/controller_demo

demo-xla: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target xla_mlp jax_shard_map
	$(BUILD_DIR)/examples/xla_mlp --ranks 8
	$(BUILD_DIR)/examples/jax_shard_map --ranks 4

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(CTEST_JOBS) $(CTEST_ARGS)

# $(call multihost_or_skip,target,build dir): ends the recipe with exit 0 and the reason when
# scripts/multihost.sh cannot run here or the build has no MPI.
define multihost_or_skip
	if ! reason=$$(scripts/multihost.sh check); then echo "$(1): skipped: $${reason#multihost: cannot run: }"; exit 0; fi; \
	if ! grep -Eqi '^TESSERA_WITH_MPI:[A-Z]*=(ON|1|TRUE|YES)$$' $(2)/CMakeCache.txt; then \
	  echo "$(1): skipped: $(2) has no MPI (TESSERA_WITH_MPI is off)"; exit 0; fi
endef

# Every layout and layer runs; the failures are listed at the end.
test-multihost: build
	@$(call multihost_or_skip,test-multihost,$(BUILD_DIR)); \
	failed=; for layout in $(MULTIHOST_LAYOUTS); do for layer in $(MULTIHOST_TESTS); do \
	  echo "== $${layout%x*} hosts x $${layout#*x} ranks: $(BUILD_DIR)/tests/tessera_$${layer}_tests"; \
	  filter=; [ "$$layout" = "$(MULTIHOST_SWEEPS_LAYOUT)" ] || filter='--gtest_filter=-*/ShardedOp.*:*/DTensorGradOf.*'; \
	  TESSERA_TIMEOUT_S=60 TESSERA_EXPECT_HOSTS=$${layout%x*} scripts/multihost.sh run --hosts $${layout%x*} --ranks-per-host $${layout#*x} \
	    --timeout 600 -- $(BUILD_DIR)/tests/tessera_$${layer}_tests $$filter || failed="$$failed $$layer($$layout)"; \
	done; done; \
	if [ -n "$$failed" ]; then echo "test-multihost: FAILED:$$failed"; exit 1; fi; \
	echo "test-multihost: passed ($(MULTIHOST_TESTS) on $(MULTIHOST_LAYOUTS))"

bench: deps
	$(call configure,$(BENCH_DIR),Release,$(CMAKE_ARGS))
	cmake --build $(BENCH_DIR) -j $(JOBS) --target tessera_benchmarks
	@set -e; for bench in $(BENCH_DIR)/bench/tessera_*_bench; do \
	  echo "== $$bench"; $$bench $(BENCH_ARGS); done
	@set -e; if grep -Eqi '^TESSERA_WITH_MPI:[A-Z]*=(ON|1|TRUE|YES)$$' $(BENCH_DIR)/CMakeCache.txt; then \
	  for np in 2 4; do \
	    echo "== mpirun -np $$np --oversubscribe $(BENCH_DIR)/bench/tessera_comm_bench"; \
	    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	      mpirun -np $$np --oversubscribe $(BENCH_DIR)/bench/tessera_comm_bench $(BENCH_ARGS); done; \
	  echo "== mpirun -np 4 --oversubscribe $(BENCH_DIR)/bench/tessera_redistribute_bench"; \
	  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	    mpirun -np 4 --oversubscribe $(BENCH_DIR)/bench/tessera_redistribute_bench $(BENCH_ARGS); fi

# PyTorch and JAX are never Tessera dependencies: a venv of their own, made on first use.
PEERS_VENV ?= build/peers-venv
PEERS_ROUNDS ?= 3
bench-peers: deps
	$(call configure,$(BENCH_DIR),Release,$(CMAKE_ARGS))
	cmake --build $(BENCH_DIR) -j $(JOBS) --target tessera_train_bench tessera_dispatch_bench tessera_plan_scale_bench
	@python3 -c 'import ensurepip, venv' 2>/dev/null || scripts/install-deps.sh --peers
	@test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	@$(PEERS_VENV)/bin/python -c 'import torch, jax' 2>/dev/null || \
	  $(PEERS_VENV)/bin/pip install -q -r bench/peers/requirements.txt
	$(PEERS_VENV)/bin/python bench/peers/run_peers.py --tessera $(BENCH_DIR)/bench/tessera_train_bench \
	  --python $(PEERS_VENV)/bin/python --rounds $(PEERS_ROUNDS) --dispatch $(BENCH_DIR)/bench/tessera_dispatch_bench \
	  --plan-scale $(BENCH_DIR)/bench/tessera_plan_scale_bench

bench-multihost: deps
	$(call configure,$(BENCH_DIR),Release,$(CMAKE_ARGS))
	cmake --build $(BENCH_DIR) -j $(JOBS) --target tessera_comm_bench
	@$(call multihost_or_skip,bench-multihost,$(BENCH_DIR)); \
	echo "== 2 hosts x 2 ranks: $(BENCH_DIR)/bench/tessera_comm_bench"; \
	scripts/multihost.sh run --hosts 2 --ranks-per-host 2 -- $(BENCH_DIR)/bench/tessera_comm_bench $(BENCH_ARGS)

# TSan needs a fixed address-space layout on kernels with many ASLR bits: run without ASLR
# where the machine allows it.
sanitize: deps
	$(call configure,$(SANITIZE_DIR),$(SANITIZE_BUILD_TYPE),-DTESSERA_SANITIZE="$(TESSERA_SANITIZE)" -DCMAKE_CXX_FLAGS_$(shell echo $(SANITIZE_BUILD_TYPE) | tr a-z A-Z)="$(SANITIZE_CXX_FLAGS)" -DTESSERA_SANITIZE_TESTS=$(SANITIZE_TESTS) -DTESSERA_BUILD_BENCH=OFF -DTESSERA_BUILD_EXAMPLES=OFF $(CMAKE_ARGS))
	cmake --build $(SANITIZE_DIR) -j $(JOBS) $(if $(SANITIZE_TARGETS),--target $(SANITIZE_TARGETS))
	@norandom=; \
	if [ "$(findstring thread,$(TESSERA_SANITIZE))" = thread ] && setarch "$$(uname -m)" -R true 2>/dev/null; then \
	  norandom="setarch $$(uname -m) -R"; fi; \
	echo "TESSERA_TEST_SAMPLE=8 TESSERA_TEST_MAX_WORLD=4 $$norandom ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j$(CTEST_JOBS) $(CTEST_ARGS)"; \
	TESSERA_TEST_SAMPLE=8 TESSERA_TEST_MAX_WORLD=4 $$norandom ctest --test-dir $(SANITIZE_DIR) --output-on-failure -j$(CTEST_JOBS) $(CTEST_ARGS)

install: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target tessera
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# A fresh prefix and a fresh consumer build every time, so nothing stale can hide a broken package.
consumer: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target tessera
	rm -rf $(CONSUMER_DIR)
	cmake --install $(BUILD_DIR) --prefix $(CONSUMER_DIR)/prefix > /dev/null
	cmake -S examples/consumer -B $(CONSUMER_DIR)/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_PREFIX_PATH=$(CONSUMER_DIR)/prefix
	cmake --build $(CONSUMER_DIR)/build -j $(JOBS)
	$(CONSUMER_DIR)/build/tessera_consumer

clean:
	rm -rf $(BUILD_DIR) build-release build-sanitize build-tsan
