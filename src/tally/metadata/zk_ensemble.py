"""A local 3-member ZooKeeper ensemble on loopback, for the chaos suite (issue 19).

The chaos harness pauses and kills the metadata store's leader, which a standalone server
does not have: each member here is a `ZooKeeperServer` with a `myid` and the quorum's
`server.N` lines, on ports chosen once so that a restarted member finds its peers again.
Members are numbered from 0; ZooKeeper's own ids (`myid`) are those plus one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tally.metadata.zk_server import START_DEADLINE, ZooKeeperServer
from tally.ports import free_ports


@dataclass
class EnsembleMember(ZooKeeperServer):
    """A `ZooKeeperServer` that serves only within a quorum of its `servers`."""

    myid: int = 1
    servers: tuple[str, ...] = ()

    def _write_config(self, port: int) -> Path:
        config = super()._write_config(port)
        (self.workdir / "data" / "myid").write_text(f"{self.myid}\n")
        return config

    def _config_lines(self, port: int) -> list[str]:
        return [*super()._config_lines(port), *self.servers]


@dataclass
class ZooKeeperEnsemble:
    """`size` ZooKeeper members on loopback, each with its directory under `workdir`."""

    workdir: Path
    size: int = 3
    force_sync: bool = False
    members: list[EnsembleMember] = field(init=False)

    def __post_init__(self) -> None:
        ports = free_ports(3 * self.size)
        clients, peers, elections = (ports[i::3] for i in range(3))
        servers = tuple(
            f"server.{n + 1}=127.0.0.1:{peer}:{election}"
            for n, (peer, election) in enumerate(zip(peers, elections, strict=True))
        )
        self.members = [
            EnsembleMember(
                self.workdir / f"member-{n}",
                client,
                self.force_sync,
                myid=n + 1,
                servers=servers,
            )
            for n, client in enumerate(clients)
        ]

    @property
    def hosts(self) -> str:
        return ",".join(member.hosts for member in self.members)

    def uri(self, chroot: str) -> str:
        return f"zk://{self.hosts}{chroot}"

    def start(self) -> None:
        """Start every member, then wait until each serves: JVMs starting side by side
        take about as long as one, and a member serves only once a quorum has formed."""
        try:
            for member in self.members:
                member.launch()
            deadline = time.monotonic() + START_DEADLINE
            for member in self.members:
                member.wait_serving(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def kill(self, n: int) -> None:
        self.members[n].kill()

    def pause(self, n: int) -> None:
        self.members[n].pause()

    def resume(self, n: int) -> None:
        self.members[n].resume()

    def restart(self, n: int) -> None:
        """Start member `n` again on its config and data; back once it follows or leads."""
        self.members[n].restart()

    def leader(self) -> int | None:
        """The member that says it leads now; None during an election or without quorum."""
        return next((n for n, member in enumerate(self.members) if member.mode() == "leader"), None)
