# Quick start:  make demo   |   make test
SHELL := /bin/bash
.DEFAULT_GOAL := help

export LLM_RELEASE_HOME ?= $(CURDIR)/.llm-release
export PREFECT_HOME ?= $(LLM_RELEASE_HOME)/prefect
export PREFECT_LOGGING_EXTRA_LOGGERS ?= llm_release
HUB_PORT ?= 8765
PREFECT_PORT ?= 4200
ROUTER_PORT ?= 8080
# The demo's serving backend: process (vLLM from .venv-vllm) or docker (a container of the
# locally built vLLM CPU image, built first: 'make demo SERVING_BACKEND=docker').
SERVING_BACKEND ?= process
export LLM_RELEASE_ROUTER_PORT := $(ROUTER_PORT)
PROMETHEUS_PORT ?= 9090
export LLM_RELEASE_PROMETHEUS_PORT := $(PROMETHEUS_PORT)
ALERTMANAGER_PORT ?= 9093
export LLM_RELEASE_ALERTMANAGER_PORT := $(ALERTMANAGER_PORT)
PY := .venv/bin/python
CLI := .venv/bin/llm-release
PIDS := $(LLM_RELEASE_HOME)/pids
HUB_URL := http://127.0.0.1:$(HUB_PORT)
PREFECT_API := http://127.0.0.1:$(PREFECT_PORT)/api
# The Prefect API's credentials (made by flows.server at 'make prefect-up', 0600): every
# Prefect client the Makefile starts gets them in its environment, never in its argv.
PREFECT_AUTH := $(LLM_RELEASE_HOME)/prefect-api.auth
PREFECT_CLIENT = PREFECT_API_URL=$(PREFECT_API) PREFECT_API_AUTH_STRING="$$(cat $(PREFECT_AUTH))"

.PHONY: help setup wheelhouse image demo test test-fast lint hub-up prefect-up worker-up fleet fleet-join up down status bench

help:
	@echo "make demo      set up everything, release SmolLM2-135M-Instruct, then walk its next revision as a canary"
	@echo "make test      set up everything and run the whole test suite"
	@echo "make up        bring the recorded stable and canary releases back (after a reboot)"
	@echo "make down      stop every server the project started (Prometheus and Alertmanager keep their data)"
	@echo "make image     build the docker backend's vLLM CPU image (reused while its inputs hold)"
	@echo "make worker-up deploy prefect.yaml and start a process worker (what the UI's Run button needs)"
	@echo "make fleet-join HOST=NAME [GPUS=N GPU_MEMORY_GIB=X]   this host joins the fleet: its card, queue host-NAME and its worker"
	@echo "make fleet     the fleet: hosts, their GPUs, their workers (docs/fleet.md)"
	@echo "make demo SERVING_BACKEND=docker   the demo with vLLM in containers"
	@echo "make status    show the releases behind the load balancer"
	@echo "make setup [TARGET=cpu|gpu] [HOST_TORCH=1] [WHEELHOUSE=DIR]   what demo and test run first; the branch (cpu, gpu) is printed"
	@echo "make wheelhouse WHEELHOUSE=DIR [TARGET=cpu|gpu] [PYTHON_VERSION=3.12] [PLATFORM=manylinux_2_35_x86_64] [ONLY=serving|pipeline]"
	@echo "               every wheel a target's virtualenvs need, for 'make setup WHEELHOUSE=DIR' on a host"
	@echo "               with no registry (docs/gpu-host.md, 'Setup on a GPU host'; pins: scripts/setup-pins.sh)"

# setup's branch is cpu, or gpu where nvidia-smi lists a GPU; TARGET=cpu|gpu forces one,
# HOST_TORCH=1 uses the host's CUDA torch, WHEELHOUSE=DIR installs from DIR with no registry,
# ONLY=serving|pipeline makes one virtualenv (bash scripts/setup.sh --plan prints what it would do).
SETUP_ARGS = $(if $(TARGET),--target $(TARGET)) $(if $(filter 1 true yes,$(HOST_TORCH)),--host-torch) \
  $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE)) $(if $(ONLY),--only $(ONLY)) $(if $(VLLM_DEPS),--vllm-deps $(VLLM_DEPS))
setup:
	@start=$$(date +%s); bash scripts/setup.sh $(SETUP_ARGS) && echo "setup: $$(( $$(date +%s) - start )) s"
	@mkdir -p $(PREFECT_HOME)

wheelhouse:
	@start=$$(date +%s); bash scripts/wheelhouse.sh $(WHEELHOUSE) $(if $(TARGET),--target $(TARGET)) \
	  $(if $(PYTHON_VERSION),--python-version $(PYTHON_VERSION)) $(if $(PLATFORM),--platform $(PLATFORM)) \
	  $(if $(ONLY),--only $(ONLY)) $(if $(HOST_PACKAGES),--host-packages $(HOST_PACKAGES)) $(if $(VLLM_DEPS),--vllm-deps $(VLLM_DEPS)) && echo "wheelhouse: $$(( $$(date +%s) - start )) s"

image: setup
	@start=$$(date +%s); $(CLI) image build && echo "image: $$(( $$(date +%s) - start )) s"

hub-up: setup
	@mkdir -p $(PIDS)
	@$(CLI) hub publish-demo
	@if ! curl -sf $(HUB_URL)/api/models/HuggingFaceTB/SmolLM2-135M-Instruct >/dev/null; then \
	  setsid nohup $(CLI) hub serve --port $(HUB_PORT) > $(LLM_RELEASE_HOME)/hub.log 2>&1 & \
	  echo $$! > $(PIDS)/hub.pid; \
	  for i in $$(seq 50); do curl -sf $(HUB_URL)/api/models/HuggingFaceTB/SmolLM2-135M-Instruct >/dev/null && break; sleep 0.2; done; \
	fi
	@echo "hub: $(HUB_URL)"

prefect-up: setup
	@mkdir -p $(PIDS)
	@# Unless one answers on the port: a detached server (log: prefect-server.log), on
	@# PostgreSQL when LLM_RELEASE_PREFECT_DATABASE_URL is set, else on Prefect's SQLite file.
	@$(PY) -m flows.server --port $(PREFECT_PORT) \
	  --log $(LLM_RELEASE_HOME)/prefect-server.log --pid-file $(PIDS)/prefect.pid
	@# Idempotent: the project's block types, the host-slot limit, and (NOTIFY_WEBHOOK=URL)
	@# the automations that post failed runs and rollbacks to that webhook, and Alertmanager's
	@# receiver of the alerts that fire (the same URL, saved under the project home).
	@$(PREFECT_CLIENT) $(PY) -m flows.control $(if $(NOTIFY_WEBHOOK),--webhook-url $(NOTIFY_WEBHOOK))

# The work pool, every deployment of prefect.yaml, and one process worker (its log:
# .llm-release/worker.log; 'make down' stops it). What the UI's Run button needs. It polls the
# pool's default queue alone, where the deployments' runs land: a worker started with no queue
# polls every queue of its pool, and would take a measurement sent to another host's
# host-NAME queue (docs/fleet.md).
worker-up: prefect-up
	@export $(PREFECT_CLIENT) LLM_RELEASE_PROJECT=$(CURDIR); \
	.venv/bin/prefect work-pool inspect llm-release >/dev/null 2>&1 || \
	  .venv/bin/prefect work-pool create llm-release --type process >/dev/null || exit 1; \
	.venv/bin/prefect --no-prompt deploy --all > $(LLM_RELEASE_HOME)/deploy.log 2>&1 || \
	  { echo "prefect deploy --all failed; see $(LLM_RELEASE_HOME)/deploy.log"; exit 1; }; \
	if ! { [ -f $(PIDS)/worker.pid ] && kill -0 $$(cat $(PIDS)/worker.pid) 2>/dev/null; }; then \
	  PREFECT_WORKER_QUERY_SECONDS=3 setsid nohup .venv/bin/prefect worker start --pool llm-release \
	    --work-queue default >> $(LLM_RELEASE_HOME)/worker.log 2>&1 < /dev/null & \
	  echo $$! > $(PIDS)/worker.pid; \
	fi; \
	echo "worker: pool llm-release, queue default, deployments of prefect.yaml (log: $(LLM_RELEASE_HOME)/worker.log)"

# The fleet (docs/fleet.md): this host declares itself (its GPUs as nvidia-smi reports them,
# or GPUS and GPU_MEMORY_GIB as stated) and runs a worker on its own queue, host-NAME.
fleet-join: prefect-up
	@test -n "$(HOST)" || { echo "usage: make fleet-join HOST=NAME [GPUS=N GPU_MEMORY_GIB=X]"; exit 2; }
	@export $(PREFECT_CLIENT) LLM_RELEASE_PROJECT=$(CURDIR); \
	$(PY) -m flows.fleet join "$(HOST)" $(if $(GPUS),--gpus $(GPUS) --gpu-memory-gib $(GPU_MEMORY_GIB)) || exit 1; \
	if ! { [ -f $(PIDS)/worker-$(HOST).pid ] && kill -0 $$(cat $(PIDS)/worker-$(HOST).pid) 2>/dev/null; }; then \
	  LLM_RELEASE_HOST_NAME="$(HOST)" PREFECT_WORKER_QUERY_SECONDS=3 setsid nohup .venv/bin/prefect worker start \
	    --pool llm-release --work-queue "host-$(HOST)" --name "$(HOST)" >> $(LLM_RELEASE_HOME)/worker-$(HOST).log 2>&1 < /dev/null & \
	  echo $$! > $(PIDS)/worker-$(HOST).pid; \
	fi; \
	echo "worker: pool llm-release, queue host-$(HOST) (log: $(LLM_RELEASE_HOME)/worker-$(HOST).log)"

fleet:
	@$(PREFECT_CLIENT) $(PY) -m flows.fleet list

# The demo's runs go through the deployments and the worker, as a run from the UI does, so
# they are the runs a user later finds under Deployments; the worker's log is shown live.
# They pass the demo profile explicitly (configs/demo.json, configs/demo-update.json:
# approvals given by the config; on CUDA vLLM configs/demo-gpu*.json, the gpu_host sizing:
# scripts/demo-config.sh) so the demo runs unattended; the deployments' own defaults
# (profile cpu_host) ask a person.
DEMO_RUN = $(PREFECT_CLIENT) $(PY) -m
demo: hub-up worker-up $(if $(filter docker,$(SERVING_BACKEND)),image)
	@configs=$$(bash scripts/demo-config.sh) || exit 1; read -r config update_config <<< "$$configs"; \
	echo "demo: $$config, then $$update_config (scripts/demo-config.sh: the serving runtime's)"; \
	start=$$(date +%s); \
	tail -n0 -F $(LLM_RELEASE_HOME)/worker.log 2>/dev/null & tailer=$$!; \
	$(DEMO_RUN) flows.release --deployment release/release \
	  --hub-endpoint $(HUB_URL) --config $$config --serving-backend $(SERVING_BACKEND) \
	  --output $(LLM_RELEASE_HOME)/demo-result.json; \
	rc=$$?; end=$$(date +%s); kill $$tailer 2>/dev/null; \
	if [ $$rc -ne 0 ]; then echo "the release failed (exit $$rc); see the log above"; exit $$rc; fi; \
	report=$$(jq -r .report $(LLM_RELEASE_HOME)/demo-result.json); \
	echo; echo "== decision =="; grep -m1 '^- \*\*Decision' "$$report"; \
	awk '/^## /{show=($$0=="## Host" || $$0=="## Candidates" || $$0=="## Stage timings" || $$0=="## Canary rollout")} show' "$$report"; \
	echo "release wall time (after setup): $$((end - start)) s"; \
	echo "report: $$report"; \
	echo; echo "== upstream publishes the next revision; the scheduled model-update releases it as a canary =="; \
	$(CLI) hub publish-demo --update || exit $$?; \
	start=$$(date +%s); \
	tail -n0 -F $(LLM_RELEASE_HOME)/worker.log 2>/dev/null & tailer=$$!; \
	$(DEMO_RUN) flows.model_update --deployment model-update/model-update \
	  --hub-endpoint $(HUB_URL) --config $$update_config --serving-backend $(SERVING_BACKEND) \
	  --output $(LLM_RELEASE_HOME)/demo-update.json; \
	rc=$$?; end=$$(date +%s); kill $$tailer 2>/dev/null; \
	if [ $$rc -ne 0 ]; then echo "the update failed (exit $$rc); see the log above"; exit $$rc; fi; \
	echo; jq -r '"model-update: " + .status + " — " + .detail' $(LLM_RELEASE_HOME)/demo-update.json; \
	report=$$(jq -r '.release.report // empty' $(LLM_RELEASE_HOME)/demo-update.json); \
	if [ -n "$$report" ]; then \
	  awk '/^## /{show=($$0=="## Canary rollout" || $$0=="## Stage timings")} show' "$$report"; \
	  echo "report: $$report"; \
	fi; \
	echo "update wall time: $$((end - start)) s"; \
	echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)  (it asks once for the string in $(PREFECT_AUTH))"; \
	echo "load balancer: http://127.0.0.1:$(ROUTER_PORT)  (try: curl -H \"Authorization: Bearer \$$(cat $(LLM_RELEASE_HOME)/router/client.key)\" http://127.0.0.1:$(ROUTER_PORT)/v1/models)"; \
	echo "Prometheus: http://127.0.0.1:$(PROMETHEUS_PORT)  (data: $(LLM_RELEASE_HOME)/prometheus)"; \
	echo "Alertmanager: http://127.0.0.1:$(ALERTMANAGER_PORT)  (alerts to NOTIFY_WEBHOOK of make prefect-up; basic auth: user llm-release, password in $(LLM_RELEASE_HOME)/alertmanager/password)"; \
	$(CLI) canary status

status:
	@$(CLI) canary status

# The image is built before the tests (its time printed on its own); the docker tests find it.
# Two pytest workers, a test file each at a time (--dist loadfile keeps a module's servers
# and fixtures in one process): most of the suite's time is vLLM starts (single-threaded
# imports of three processes, ~25 s each) and waits on live windows and leases, which
# overlap on two cores; 30.1 min in one process on an AVX-512 host, see docs/testing.md.
# --no-loadscope-reorder: files in collection order, so the long end-to-end files start
# first (xdist's default puts files with many tests first: the e2e ran last, on one worker).
# The docker backend's image builds in the background while lint and the first tests run
# (a lock makes the Docker tests wait for it; 'make image' is the same build in the
# foreground).
test: setup
	@mkdir -p $(LLM_RELEASE_HOME)/logs
	@echo "image: building in the background (log: $(LLM_RELEASE_HOME)/logs/image-build.log)"
	@($(CLI) image build > $(LLM_RELEASE_HOME)/logs/image-build.log 2>&1 &)
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest -v -n 2 --dist loadfile --no-loadscope-reorder --durations=30

test-fast: setup
	$(PY) -m pytest -v -m "not slow"

# ruff, then the house rules (import-linter contracts in pyproject.toml: layers, no Prefect
# in the core, rooms independent where they hold).
lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && PYTHONPATH=src:. .venv/bin/lint-imports

bench: setup
	.venv/bin/python bench/eval_concurrency.py
	.venv/bin/python bench/download_verify.py
	.venv/bin/python bench/verify_throughput.py
	.venv/bin/python bench/quantize_dtype.py
	.venv/bin/python bench/canary_reliability.py
	.venv/bin/python bench/tune_goodput.py

# After a reboot (or 'make down'): the releases in the record serve again, the router too.
up: setup
	$(CLI) up

down:
	@if [ -x $(CLI) ]; then $(CLI) down; else echo "nothing to stop (no .venv)"; fi
