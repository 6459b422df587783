# advmon: two commands on a fresh machine.
#   make demo   run advmon's main job (simulated GRPO runs) with nothing else to start
#   make test   install what the tests need, start the real services they use, run the suite
#   make test-quick   the tests that need no service, framework or subprocess: the inner loop
# Both create and reuse .venv/ and are idempotent.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# --no-compile: pip's own byte-compiling, one file at a time, was two thirds of its time. Python compiles a
# module when it is first imported, but writes nothing where PYTHONDONTWRITEBYTECODE is set (these machines
# set it): every process would compile torch and the frameworks again, 1.7 s more for `import torch` alone.
# So the test environment is compiled once, on every core, after its installs (BYTE_COMPILE).
PIP := $(PY) -m pip --disable-pip-version-check
PIP_INSTALL := $(PIP) install --quiet --no-compile
# Errors are files that are not this Python's syntax (torch's Python 3.12 test helpers), never imported.
BYTE_COMPILE := $(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	>/dev/null || true
# The CPU build of torch lies on these machines' disk; any other request
# downloads a multi-GB CUDA build. The package itself accepts a range.
TORCH_PIN := torch==2.13.0
# verl's declared requirements pull GPU stacks: it goes in alone, its import needs come from advmon[verl].
VERL_PIN := verl==0.9.1
# So do SkyRL's (vllm, flash-attn, jax), AReaL's (sglang stacks, torch<2.11) and OpenRLHF's (flash-attn, a
# CUDA torch through vllm): each goes in alone, its import needs come from advmon[skyrl], advmon[areal] and
# advmon[openrlhf]. deepspeed installs and imports on the CPU (OpenRLHF imports it at load time).
FRAMEWORK_PINS := skyrl==0.3.0 skyrl-gym==0.4.0 areal==1.0.4 openrlhf==0.11.2 deepspeed==0.19.6
CORE_STAMP := $(VENV)/.advmon-core
DEV_STAMP := $(VENV)/.advmon-dev
# chromium: the report tests render HTML as a person sees it (headless).
SERVICE_PACKAGES := prometheus prometheus-pushgateway prometheus-alertmanager chromium
SERVICE_BINARIES := prometheus promtool prometheus-pushgateway prometheus-alertmanager amtool chromium

.PHONY: demo test test-quick bench bench-gpu reliability services install clean

demo: $(CORE_STAMP)
	$(VENV)/bin/advmon demo

# The whole suite on TEST_WORKERS pytest-xdist workers, each with one intra-op thread (tests/conftest.py);
# more workers than cores, since many tests wait on a real service or a subprocess (on 2 cores: 4 workers
# 586 s, 6 workers 693 s, each worker's collection and the contention costing more than the waits they fill). loadgroup keeps the
# tests of a shared set-up (a Ray cluster, a module's Prometheus) on one worker. It ends with the ten
# slowest tests and the total time; docs/performance.md ("The test suite's time") keeps the per-file times.
# First the checkout's own modules are byte-compiled (a second), as BYTE_COMPILE does the venv: the suite's few
# hundred subprocesses (docs snippets, the CLI, fresh interpreters, Ray's workers) import advmon and the test
# helpers, and with PYTHONDONTWRITEBYTECODE set each would compile them again.
TEST_WORKERS ?= 4
test: $(DEV_STAMP) services
	$(PY) -m compileall -q -j 0 advmon tests benchmarks >/dev/null
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=10

# The inner loop (at most 90 s): the tests that need no service, no framework and no subprocess (the engine,
# the record, the monitor, the catalog, the CLI's parsing), less the few of their files' tests that do and
# the three large-batch checks, a minute of CPU between them (make test runs every one). Without the zygote
# (tests/zygote.py): loading the frameworks first would take longer than these tests.
QUICK_TESTS := tests/test_stats.py tests/test_groups.py tests/test_normalization.py tests/test_prefix_sketch.py \
	tests/test_histograms.py tests/test_exemplars.py tests/test_slices.py tests/test_hooks.py tests/test_monitor.py \
	tests/test_settings_once.py tests/test_parameter_names.py tests/test_rerun.py tests/test_runbooks.py \
	tests/test_structure.py tests/test_cli.py tests/test_alerts_inprocess.py \
	tests/test_rule_specifications.py::test_every_rule_over_records_has_a_hand_written_case \
	tests/test_rule_specifications.py::test_in_process_evaluator_fires_where_the_definition_says \
	advmon/stats advmon/record.py advmon/rules.py
QUICK_DESELECT := tests/test_cli.py::test_version \
	tests/test_alerts_inprocess.py::test_wandb_alert_lands_in_the_offline_run_file \
	tests/test_groups.py::test_group_means_stay_exact_in_a_large_batch \
	tests/test_prefix_sketch.py::test_prefix_path_matches_numpy_and_the_general_sketch
test-quick: $(DEV_STAMP)
	TESTS_ZYGOTE=off $(PY) -m pytest -n 2 --durations=5 $(QUICK_TESTS) $(addprefix --deselect ,$(QUICK_DESELECT))

# The never-raise / never-lose / never-leak tests (docs/reliability.md); make test runs them too.
reliability: $(DEV_STAMP) services
	$(PY) -m pytest tests/test_hardening.py tests/test_secrets.py tests/test_emitter.py tests/test_jsonl_cli_demo.py
	$(PY) benchmarks/reliability.py --calls 5000

bench: $(DEV_STAMP)
	$(PY) benchmarks/bench_stats.py
	$(PY) benchmarks/bench_emit.py
	$(PY) benchmarks/bench_busy.py --calls 24
	$(PY) benchmarks/bench_handover.py
	$(PY) benchmarks/bench_scaling.py
	$(PY) benchmarks/bench_device_ops.py
	$(PY) benchmarks/bench_drilldown.py
	$(PY) benchmarks/bench_histograms.py
	$(PY) benchmarks/bench_report.py --repeat 1
	$(PY) benchmarks/alert_corpus.py

# The one GPU check (docs/performance.md, "GPU"): every figure with its kernel and sync
# counts, then the CUDA tests. It runs where CUDA is, with that machine's own python3 (torch,
# triton, numpy, pytest and hypothesis; a device machine has nothing to download), not .venv.
GPU_PYTHON ?= python3
bench-gpu:
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/bench_gpu.py
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/profile_gpu.py
	PYTHONPATH=. $(GPU_PYTHON) -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_triton_kernels.py \
		tests/test_percentiles.py tests/test_transfer_protocol.py tests/test_monitor.py::test_cuda_tensors

install: $(DEV_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# The demo draws its report and comparison with matplotlib (advmon[dashboards]); what the
# docs say to run after it, `advmon demo --serve`, needs prometheus_client (advmon[prometheus]).
# A changed Makefile reinstalls: a .venv made before an extra was added gets it.
$(CORE_STAMP): pyproject.toml Makefile | $(PY)
	$(PIP_INSTALL) $(TORCH_PIN)
	$(PIP_INSTALL) $(TORCH_PIN) -e '.[dashboards,prometheus]'
	touch $@

$(DEV_STAMP): pyproject.toml $(CORE_STAMP)
	$(PIP_INSTALL) $(TORCH_PIN) -e '.[dev]'
	$(PIP_INSTALL) --no-deps $(VERL_PIN)
	$(PIP_INSTALL) --no-deps $(TORCH_PIN) $(FRAMEWORK_PINS)
	$(BYTE_COMPILE)
	touch $@

# Prometheus, Pushgateway, Alertmanager (and Chromium) from Debian; the tests start
# them themselves on 127.0.0.1 with free ports and temporary directories.
services:
	@missing=""; for b in $(SERVICE_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing from Debian packages"; \
		if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(SERVICE_PACKAGES) >/dev/null; \
	fi

clean:
	rm -rf $(VENV) advmon-runs .pytest_cache .hypothesis
