"""Hosts on one machine: each a Linux network namespace of its own with an address of its
own, on one bridge in this (the root) namespace, which holds the LAN's `gateway` address:
servers the hosts are to reach (a database, a world) listen there, and nowhere else the
hosts can see. What a host sends crosses a real network stack, so its link can be cut,
made lossy or slow, and healed, while the processes on both ends carry on.

- `cut`: every packet to and from the host is dropped, silently, as a switch that died
  or a firewall would; connections are not reset, they stall.
- `cut(port=P)`: only traffic with the root side's port P (the database, say), so the
  host still reaches the rest (the world's server).
- `lossy(percent)`: each packet dropped with that probability, both ways.
- `slow(rate)`: the link shaped to `rate` (tc's token bucket: a queue that delays, then
  drops); this kernel has no netem, so delay comes from the queue.
- `heal`: all of it undone.

Rules are nftables rules inside the host's own namespace, and shaping is on its end of
its veth pair: nothing of the machine's own network is touched, and `close()` (and
process exit) removes every namespace and link this made. Needs root, `ip` (iproute2),
`tc` and `nft` (nftables), which `make test` installs.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

TOOLS = ("ip", "tc", "nft")


def missing() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} missing: apt-get install iproute2 nftables (`make test` installs them)"
    return None


def _run(*argv: str, input: str | None = None) -> None:
    done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")


@dataclass
class Host:
    """One namespace: `address` is its own, `gateway` the bridge's address, where it
    reaches the servers of the test."""

    name: str
    link: str  # the veth end in the root namespace
    address: str
    gateway: str
    state: str = "healthy"

    @property
    def prefix(self) -> list[str]:
        """Run a command on this host: `[*host.prefix, argv...]`."""
        return ["ip", "netns", "exec", self.name]

    def _drop(self, outgoing: str, incoming: str) -> None:
        """Replace this host's rules with: drop what matches `outgoing` as it leaves, and
        what matches `incoming` as it arrives."""
        hook = "{{ type filter hook {} priority 0; policy accept; {} drop; }}"
        table = f"table inet partition {{\n chain out {hook.format('output', outgoing)}\n"
        table += f" chain in {hook.format('input', incoming)}\n}}\n"
        _run(*self.prefix, "nft", "-f", "-", input=f"flush ruleset\n{table}")

    def cut(self, *, port: int | None = None) -> None:
        match = f"tcp dport {port}" if port else ""
        back = f"tcp sport {port}" if port else ""
        self._drop(f"ip daddr {self.gateway} {match}", f"ip saddr {self.gateway} {back}")
        self.state = f"cut from port {port}" if port else "cut"

    def lossy(self, percent: int) -> None:
        dice = f"numgen random mod 100 < {percent}"
        self._drop(dice, dice)
        self.state = f"lossy {percent}%"

    def slow(self, rate: str = "256kbit") -> None:
        _run(*self.prefix, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
             "burst", "4kb", "latency", "300ms")  # fmt: skip
        self.state = f"slow {rate}"

    def heal(self) -> None:
        _run(*self.prefix, "nft", "flush", "ruleset")
        subprocess.run([*self.prefix, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True, check=False)
        self.state = "healthy"


@dataclass
class Network:
    """One LAN: a bridge holding `gateway`, and the hosts a test made on it; `close()`
    takes them all down."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        # 10.X.Y.0/24, X and Y picked by the tag, so two test processes on one machine do
        # not share a subnet.
        number = int(self.tag, 16)
        self._subnet = ipaddress.ip_network(f"10.{200 + number % 50}.{number % 250}.0/24")
        self.gateway = str(self._subnet[1])
        self.bridge = f"rdbr{self.tag}"
        atexit.register(self.close)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def add(self) -> Host:
        index = len(self.hosts)
        address = str(self._subnet[index + 2])
        name, link = f"roadie-{self.tag}-{index}", f"rd{self.tag}{index}"
        _run("ip", "netns", "add", name)
        host = Host(name=name, link=link, address=address, gateway=self.gateway)
        self.hosts.append(host)
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
        _run("ip", "link", "set", link, "master", self.bridge)
        _run("ip", "link", "set", link, "up")
        for argv in (
            ["ip", "addr", "add", f"{address}/24", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _run(*host.prefix, *argv)
        return host

    def close(self) -> None:
        for host in self.hosts:
            # A process the test left inside would hold the namespace: it is the test's own.
            inside = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True, check=False)
            for pid in inside.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True, check=False)
        self.hosts.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
