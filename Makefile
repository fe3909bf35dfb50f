# One command to set up and run the main job, one to set up and run the tests.
#   make run    - create .venv, install, sweep the strategies over the embedded `digits` set
#   make test   - create .venv, install, run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUNS ?= runs/main-$(shell date +%Y%m%d-%H%M%S)
STRATEGIES ?= local fedavg fedavg-ft fedprox ditto pfedgt
# The main job: every method on scikit-learn's digits, Dirichlet(0.1) over 10 clients, 20
# rounds, full participation (pflarena/presets/digits-main.toml; `pflarena presets digits-main`).
MAIN_JOB := --preset digits-main
comma := ,
space := $(subst ,, )

.PHONY: setup run test test-containers test-edge lint generated clean-runs images binfmt

setup: $(VENV)/.installed

# torch and torchvision are pinned here, not in pyproject.toml: these releases are the
# ones available offline on the reference machine, and a looser pin would download a
# multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# One sweep: every strategy on one simulation start-up, then the leaderboard
# ($(RUNS)/leaderboard.{md,csv,png}); `make run RUNS=<the same dir>` continues an interrupted one.
run: setup
	$(VENV)/bin/pflarena sweep $(MAIN_JOB) --strategies $(subst $(space),$(comma),$(strip $(STRATEGIES))) --out $(RUNS) --quiet

# Three workers (pytest-xdist) on two cores, one test module at a time each (a module's
# fixtures, such as its deployment, start once): most of the suite's time is waiting (Flower's
# processes starting and polling, round timeouts), which the other workers overlap; the
# suite's time, with its commit and date: benchmarks/results/test_time.md. tests/conftest.py
# puts the longest modules first. pytest also reads PYTEST_ADDOPTS: .ci/run adds its junit XML
# report and the skip reasons (-rfEs) there, and counts the tests each step ran.
TEST_WORKERS ?= 3
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The container scenarios (tests/test_containers.py): images built (on a local Debian base where
# nothing can be pulled; root and debootstrap) or reused by the digest of their inputs, then
# `docker-compose up` federations: plain, faults, TLS, an edge node behind a degraded link, an
# edge node that loses its network and comes back, then loses its power (40 rounds: 3-8
# minutes), several hosts from their bundles (each its own network). Opted in here, so nothing is skipped: a missing Docker Engine, Compose, root or
# network tool (nsenter, tc, iptables) fails the scenarios that need it, saying which. A step
# of its own in .ci/run: a cold image build takes minutes.
test-containers: setup
	PFLARENA_CONTAINER_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_containers.py

# The emulated arm64 edge node in the compose federation (as root), outside .ci/run: a cold
# arm64 base and edge image take 17-59 minutes to build under qemu-user emulation.
test-edge: setup binfmt
	PFLARENA_CONTAINER_TESTS=1 PFLARENA_ARM64_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider \
	    tests/test_containers.py -k arm64

lint: setup
	$(VENV)/bin/ruff check pflarena tests benchmarks
	$(VENV)/bin/ruff format --check pflarena tests benchmarks

# After changing a method's declaration or a run-config key: regenerate the
# [tool.flwr.app.config] tables of pyproject.toml, docs/methods.md and the generated block of
# every method's page docs/methods/<name>.md, a stub page for a new method, the catalog
# `pflarena methods` lists (pflarena/methods/catalog.json) and the models' layouts a run
# config is checked against (pflarena/core/model_layouts.json) (tests check all).
generated: setup
	$(PY) -m pflarena.cli.methods

# The container images pflarena-{superlink,supernode,edge,app}:latest (docker/Dockerfile), built
# from a wheelhouse made here, so that `docker build` needs no network. LOCAL_BASE=1 where no
# image can be pulled: the base is made here from Debian bookworm (debootstrap; needs root).
# PLATFORM=linux/arm64: the edge device's images (superlink, supernode, edge; tagged
# latest-arm64), under qemu-user emulation on an x86-64 host (`make binfmt` first, as root).
# docs/deployment.md, "Containers: images" and "Edge devices".
LOCAL_BASE ?=
PLATFORM ?=
images: setup
	$(PY) -m pflarena.deploy.images $(if $(LOCAL_BASE),--local-base) $(if $(PLATFORM),--platform $(PLATFORM))

# Run arm64 containers on an x86-64 host (as root): qemu-user-static and its binfmt_misc
# handler (the F flag: it works inside containers). Says why and does nothing where it cannot.
binfmt:
	@if [ "$$(id -u)" != 0 ]; then echo "make binfmt: needs root" >&2; exit 1; fi
	@command -v qemu-aarch64-static >/dev/null \
	    || { apt-get install -y -q qemu-user-static >/dev/null \
	         || { apt-get update -q >/dev/null && apt-get install -y -q qemu-user-static >/dev/null; }; }
	@[ -e /proc/sys/fs/binfmt_misc/register ] \
	    || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	@[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] \
	    || cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
	@head -1 /proc/sys/fs/binfmt_misc/qemu-aarch64
