# The two commands of the README: `make run` (the main job) and `make test` (the tests).
# Each prepares its own environment first.
.PHONY: run test lint bench env

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
