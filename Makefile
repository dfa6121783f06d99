# The two commands of the README: `make run` (the main job) and `make test` (the tests).
# Each prepares its own environment first.
.PHONY: run test lint bench chaos env

UV = $(shell scripts/bootstrap.sh)

run:
	$(UV) run --frozen tally demo

test:
	@scripts/ensure-zookeeper.sh
	@uv=$$(scripts/bootstrap.sh) && \
	$$uv run --frozen ruff check src tests bench examples && \
	$$uv run --frozen ruff format --check src tests bench examples && \
	$$uv run --frozen mypy && \
	$$uv run --frozen lint-imports --no-logo --no-cache && \
	$$uv run --frozen pytest -q -n 2 --dist loadfile

lint:
	@uv=$$(scripts/bootstrap.sh) && \
	$$uv run --frozen ruff check src tests bench examples && \
	$$uv run --frozen ruff format --check src tests bench examples && \
	$$uv run --frozen mypy && \
	$$uv run --frozen lint-imports --no-logo --no-cache

bench:
	$(UV) run --frozen tally bench

# The long chaos runs of issue 19 (docs/durability.md): 10 minutes of faults each, on the
# embedded store and on a ZooKeeper ensemble. SEED=N picks another seed.
SEED ?= 1
chaos:
	@scripts/ensure-zookeeper.sh
	@uv=$$(scripts/bootstrap.sh) && \
	$$uv run --frozen tally chaos --duration 10m --seed $(SEED) --metadata sqlite --out chaos-runs/sqlite-$(SEED) && \
	$$uv run --frozen tally chaos --duration 10m --seed $(SEED) --metadata zk --out chaos-runs/zk-$(SEED)
