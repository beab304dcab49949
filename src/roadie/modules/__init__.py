"""The modules that ship with Roadie: core's own, and the sandbox world."""
