# macaron-ray: `make serve` runs the embedded default, `make test` runs every test tier.
VENV ?= .venv
PY := $(VENV)/bin/python
MACARON := $(VENV)/bin/macaron

.PHONY: install model serve image cluster-up cluster-down test test-unit test-e2e test-fault test-cluster bench-routing bench-quality bench-pd bench-hops bench-memory bench-all plan adapters clean

install:
	@scripts/install.sh

model: install
	@$(MACARON) models prepare >/dev/null

serve: install model
	$(MACARON) serve $(SERVE_ARGS)

# The CPU image macaron-ray:<version>-cpu (image/cpu.Dockerfile) on the project's own Debian base;
# installs docker.io and debootstrap and starts dockerd as needed (root). About a minute once cached.
image:
	@image/build.sh

# The chart (values-cpu.yaml) as containers of the image on this machine: five Ray pods and Redis
# on one docker network, the Serve config deployed as KubeRay deploys it; prints the URLs.
cluster-up: install model image
	$(MACARON) cluster up --containers $(CLUSTER_ARGS)

cluster-down: install
	$(MACARON) cluster down --containers

# Every tier; the e2e tier starts real vLLM CPU engines, one at a time.
test: install model
	$(PY) -m pytest tests -p no:cacheprovider

test-unit: install model
	$(PY) -m pytest tests/unit -p no:cacheprovider

test-e2e: install model
	$(PY) -m pytest tests/e2e -p no:cacheprovider

# The fault suite alone (about 8 minutes): the local topology under load, one fault at a time
test-fault: install model
	$(PY) -m pytest tests/fault -p no:cacheprovider

# The container tier alone: `make image`, then the image run as containers (a few minutes once built)
test-cluster: install model
	$(PY) -m pytest tests/cluster -p no:cacheprovider

bench-routing: install model
	$(MACARON) bench routing

# Each specialist vs the base on its own domain's held-out prompts; writes .bench/quality.json
bench-quality: install model
	$(MACARON) bench quality

# PD vs aggregated on a local Ray cluster (about 10 minutes); writes .bench/pd.json
bench-pd: install model
	$(MACARON) bench pd

# The local topology's memory, before and after it was made lean (about 15 minutes); writes .bench/memory.json
bench-memory: install model
	$(MACARON) bench memory

# The report's per-hop table and the routing overhead on the local topology (about 15 minutes)
bench-hops: install model
	$(MACARON) bench hops

# Every benchmark above, one after another (about an hour); writes .bench/NAME.json and .bench/all.json
bench-all: install model
	$(MACARON) bench all

# Rebuilds the committed adapters (minutes of CPU); `make serve` never trains.
adapters: install model
	$(MACARON) adapters train

clean:
	rm -rf $(VENV) .bench
