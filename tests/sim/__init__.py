"""A deterministic simulation of many workers, after FoundationDB's and TigerBeetle's.

Two to four engines (and a web process, and a game server reporting late resources)
share one database and one fake clock in one asyncio loop. Every store call and every
touch of the world waits at a gate; a `random.Random(seed)` scheduler picks, step by
step, which gate opens next, or what happens instead: a tick begins, staff click
"clean up" (under a worker's own id, too), a run is started or cancelled, a summon is
reported late, time jumps past claims and leases, an engine crashes at a named write
point, is killed between writes, or stops while holding steps and is restarted under
the same worker id or a new one. And at the edge where the database's fence stops and
the world begins (issue 37): a worker is cut off from the database while its calls to
the world go on and land late, staff forget a row (also while it is being given back),
two runs borrow equal values, staff set a setting by hand while borrows and layers are
in force, the world restarts and loses what was made and set since it last saved, a
worker looks at running runs' borrows and puts back what the world lost, and some steps
may take longer than a claim lasts. The invariants of DESIGN §10 (and of §12 and §13:
fences, hand values, forgotten rows) are checked after every step, and at the end of
each seed, once every run has cleaned up, the world must equal its start but where a
hand edit stands or staff forgot a row. `--no-fences` makes the world take calls under
stale fences, to count what the fences hold back.

- `world.py`: the world module and what it records.
- `scheduler.py`: actors, gates, the gated store, crashes.
- `simulation.py`: one seed; the invariants; the choices and their weights.
- `databases.py`: an empty database per seed on each backend.
- `__main__.py`: `python -m tests.sim --seeds N --backend sqlite|postgresql|mariadb`,
  `--seed S --trace` to replay one seed, `--no-fences` to switch the world's refusal off.
"""
