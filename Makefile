# Every target bootstraps the virtual environment it needs; humans and CI call the same ones.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test chaos lint bench clean chromium pgbouncer netns luanti consoles constraints sdk editor-bundle

# The versions in constraints.txt are those the suite last passed with.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# After a deliberate upgrade (pip install -U in .venv, then make test): pin what passed.
constraints: $(STAMP)
	{ head -n 2 constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^roadie'; } > constraints.new
	mv constraints.new constraints.txt

demo: $(STAMP)
	rm -rf .demo && mkdir -p .demo
	cd .demo && ../$(BIN)/roadie demo

# Two test processes, a file each at a time (pytest-xdist): most of the suite waits on
# servers, subprocesses and installs, and one process left a core idle most of the time.
TEST_WORKERS ?= 2
test: $(STAMP) chromium pgbouncer netns luanti consoles
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The dashboard's browser test drives Debian's Chromium (Playwright downloads no browser).
chromium:
	@[ -x /usr/bin/chromium ] || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || echo "chromium missing: apt-get install -y chromium (as root) for tests/web/test_browser.py"

# The suite runs its PostgreSQL tests again through PgBouncer (transaction pooling), which
# it starts itself (tests/databases.py). Debian 12's PgBouncer, 1.18, exits under the
# suite's load with "disconnect_client(): bad client state: 0" (a cancel request's client
# freed twice, fixed in 1.19), so the suite's is built from a later release's source in
# Debian's archive (the machine's own apt mirror), once, into .cache/.
# systemd-analyze checks deploy/.
PGBOUNCER_VERSION := 1.24.1
PGBOUNCER_SHA256 := da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0
PGBOUNCER_HOME := .cache/pgbouncer-$(PGBOUNCER_VERSION)
PGBOUNCER_BUILD_DEPS := gcc make pkg-config libevent-dev libssl-dev

pgbouncer:
	@$(MAKE) --no-print-directory $(PGBOUNCER_HOME)/bin/pgbouncer || echo "PgBouncer not built (see above) for the pgbouncer backend"
	@command -v systemd-analyze >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd; } || echo "systemd-analyze missing: apt-get install -y systemd (as root) for tests/deploy"

$(PGBOUNCER_HOME)/bin/pgbouncer:
	@dpkg -s $(PGBOUNCER_BUILD_DEPS) >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PGBOUNCER_BUILD_DEPS); } || { echo "to build PgBouncer: apt-get install -y $(PGBOUNCER_BUILD_DEPS) (as root)"; exit 1; }
	rm -rf .cache/pgbouncer-src && mkdir -p .cache/pgbouncer-src
	mirror=$$(sed -n -e 's/^URIs: *\([^ ]*\).*/\1/p' -e 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' \
		/etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | grep -E '/debian/?$$' | head -n 1); \
	$(PYTHON) -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
		"$${mirror%/}/pool/main/p/pgbouncer/pgbouncer_$(PGBOUNCER_VERSION).orig.tar.gz" .cache/pgbouncer-src/src.tar.gz
	echo "$(PGBOUNCER_SHA256)  .cache/pgbouncer-src/src.tar.gz" | sha256sum --check --quiet
	tar -xzf .cache/pgbouncer-src/src.tar.gz -C .cache/pgbouncer-src --strip-components=1
	cd .cache/pgbouncer-src && ./configure --quiet --prefix=$(abspath $(PGBOUNCER_HOME)) \
		--without-cares --without-systemd --without-pam --without-ldap && $(MAKE) --quiet -j2 && $(MAKE) --quiet install
	rm -rf .cache/pgbouncer-src

# The Luanti integration is tested against a real Luanti server (Debian's minetest-server,
# with Minetest Game from minetest-data), and its Lua SDK under Lua 5.1 and LuaJIT.
luanti:
	@{ [ -x /usr/games/minetestserver ] && [ -d /usr/share/games/minetest/games/minetest_game ] && command -v lua5.1 && command -v luajit; } >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq minetest-server minetest-data lua5.1 luajit; } || echo "minetest-server, lua5.1 or luajit missing: apt-get install -y minetest-server minetest-data lua5.1 luajit (as root) for tests/luanti"

# Console worlds are tested against real servers reached only by their remote consoles:
# OpenArena (ioquake3, rcon over UDP) and Teeworlds (econ over TCP), from Debian. The
# packages would start a system-wide OpenArena service that announces itself to public
# master servers: they are installed with service starts refused (policy-rc.d), and the
# tests start servers of their own, on loopback, announcing nothing.
consoles:
	@{ [ -x /usr/lib/ioquake3/ioq3ded ] && [ -d /usr/lib/openarena-server/baseoa ] && [ -x /usr/games/teeworlds-server ]; } || \
	{ [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  ours=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && ours=1; fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openarena-server teeworlds-server; status=$$?; \
	  if [ -n "$$ours" ]; then rm -f /usr/sbin/policy-rc.d; fi; [ $$status = 0 ]; } || \
	echo "openarena-server or teeworlds-server missing: apt-get install -y openarena-server teeworlds-server (as root) for tests/consoles"

# tests/chaos/test_network.py puts workers on hosts of their own (network namespaces, made
# with iproute2) and cuts their links with nftables; it needs root, as CI has.
netns:
	@{ command -v ip && command -v tc && command -v nft; } >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables; } || echo "ip, tc or nft missing: apt-get install -y iproute2 nftables (as root) for tests/chaos/test_network.py"

# The crash-and-fault suite (killed worker processes included) and the property tests at
# the size docs/reliability.md reports, on every database (an hour or more on 2 cores; it
# stops and starts a PostgreSQL server of its own, and fails over clusters and cuts
# network links of its own), then the many-worker simulation (tests/sim: 10,000 seeds on
# SQLite as two processes of 5,000 side by side, then 500 on each server side by side; about
# an hour and three quarters on 2 cores; failing seeds with their traces go to
# .sim-failures.txt);
# `make test` runs it at CI size.
chaos: $(STAMP) netns
	rm -f .chaos.jsonl
	ROADIE_CHAOS_REPORT=.chaos.jsonl ROADIE_NETWORK_RUNS=200 ROADIE_NETWORK_SECONDS=120 \
		ROADIE_FAILOVERS=3 ROADIE_FAILOVER_RUNS=40 ROADIE_CHAOS_RUNS=100 $(BIN)/python -m pytest tests/chaos \
		-m "chaos or slow" --chaos-trials 30 --chaos-trials-mariadb 30 --soak-runs 2000
	ROADIE_PROPERTY_EXAMPLES=500 ROADIE_VERDICT_EXAMPLES=200 $(BIN)/python -m pytest tests/property
	ROADIE_REMOTE_TRIALS=5 ROADIE_CHAOS_REPORT=.chaos.jsonl $(BIN)/python -m pytest tests/remote -k exact_through
	status=0; \
	$(BIN)/python -m tests.sim --seeds 5000 --backend sqlite --report .chaos.jsonl 2>.sim-failures.1 & one=$$!; \
	$(BIN)/python -m tests.sim --seeds 5000 --first 5000 --backend sqlite --report .chaos.jsonl 2>.sim-failures.2 & two=$$!; \
	wait $$one || status=1; wait $$two || status=1; \
	$(BIN)/python -m tests.sim --seeds 500 --backend postgresql --report .chaos.jsonl 2>.sim-failures.3 & one=$$!; \
	$(BIN)/python -m tests.sim --seeds 500 --backend mariadb --report .chaos.jsonl 2>.sim-failures.4 & two=$$!; \
	wait $$one || status=1; wait $$two || status=1; \
	cat .sim-failures.[1-4] > .sim-failures.txt; rm -f .sim-failures.[1-4]; \
	$(BIN)/python -m tests.chaos.figures .chaos.jsonl; exit $$status

# The plugin SDK alone, as the wheel dist/roadie_plugin-*.whl (sdk/build.py): for a game
# server's module server, without the engine's libraries.
sdk: $(STAMP)
	$(BIN)/python sdk/build.py --out dist

# The event editor's CodeMirror 6, one file served by Roadie itself (nothing from a CDN):
# src/roadie/web/static/vendor/codemirror.min.js and the licences of what it holds, built
# by esbuild at the versions of editor/package-lock.json. The built file is committed, so
# running Roadie needs no Node.js; only rebuilding it (after changing editor/) does.
editor-bundle:
	cd editor && npm ci --no-audit --no-fund && node build.mjs

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks sdk
	$(BIN)/ruff format --check src tests benchmarks sdk
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/workers.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/cleanup_scaling.py --postgresql postgresql://postgres@127.0.0.1:5432/test --write docs/benchmarks.md
	$(BIN)/python benchmarks/commit_limit.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/web_latency.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/cli_startup.py --write docs/benchmarks.md
	$(BIN)/python benchmarks/remote.py --write docs/benchmarks.md
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[bench]' && $(BIN)/python benchmarks/dbos_compare.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache .chaos.jsonl .sim-failures.txt
