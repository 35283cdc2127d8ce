"""Covers kubevol.node.runtime and kubevol.node.host: their turn-taking hooks.

The node layer installs turn-taking (:mod:`kubevol.util.turns`) into the layers below it:
its CSI clients (:class:`kubevol.node.runtime.NodeRuntime`'s registry) and its mounter
(:class:`kubevol.node.host.NodeVolumeHost`) give an operation's turn away while they wait on
another process, so another operation runs meanwhile. Neither the CSI client nor the mount
layer imports the scheduler."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubevol.mount import LinuxMounter
from kubevol.node.host import NodeVolumeHost
from kubevol.node.runtime import NodeRuntime
from kubevol.util.turns import Turns
from tests.csi.support import Served

#: How long the outside process takes to answer; the other operation must get the turn
#: well before it has.
WAIT = 0.6


def other_gets_the_turn_during(wait_outside: Callable[[], object]) -> float:
    """Run ``wait_outside`` in one thread's turn while a second thread asks for the turn:
    how many seconds after the first thread began the second one got it. Patience is long,
    so the second thread gets the turn early only when the first one gives it up."""
    turns = Turns(patience=10)
    began = threading.Event()
    started = time.monotonic()

    def first() -> None:
        with turns.take():
            began.set()
            wait_outside()

    def second() -> None:
        began.wait(5)
        time.sleep(0.05)  # the first thread is inside its wait by now
        with turns.take():
            got.append(time.monotonic() - started)

    got: list[float] = []
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert got, "the second operation never got a turn"
    return got[0]


@pytest.mark.slow
def test_the_node_hosts_mounter_gives_the_turn_up_while_a_mount_helper_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_helper(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        time.sleep(WAIT)  # a network mount's helper taking its time
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr("kubevol.mount.linux.subprocess.run", slow_helper)
    mounter = NodeVolumeHost(root_dir=str(tmp_path), node_name="n1").get_mounter()
    got = other_gets_the_turn_during(
        lambda: mounter.mount("server:/export", str(tmp_path), "nfs", ["ro"])
    )
    assert got < WAIT / 2, f"the other operation waited {got:.2f} s for the mount helper"
    # The counter-check: a mounter made outside the node layer keeps the turn.
    plain = LinuxMounter()
    got = other_gets_the_turn_during(
        lambda: plain.mount("server:/export", str(tmp_path), "nfs", ["ro"])
    )
    assert got >= WAIT, f"the other operation got the turn after {got:.2f} s"


@pytest.mark.slow
def test_the_node_runtimes_csi_clients_give_the_turn_up_while_the_driver_works(
    tmp_path: Path, served: Served
) -> None:
    served.driver.sleep["NodeGetInfo"] = WAIT
    endpoint = served.handle.address
    with NodeRuntime(str(tmp_path / "root"), node_name="n1", entry_points=False) as runtime:
        client = runtime.registry._client_factory(endpoint)
        try:
            got = other_gets_the_turn_during(client.node_get_info)
        finally:
            client.close()
    assert got < WAIT / 2, f"the other operation waited {got:.2f} s for the driver"


@pytest.mark.slow
def test_a_client_made_outside_the_node_layer_keeps_its_turn(served: Served) -> None:
    """The counter-check: the same wait through a plain CSIClient holds the turn, so the
    tests above see the node layer's hook and not an accident of timing."""
    served.driver.sleep["NodeGetInfo"] = WAIT
    got = other_gets_the_turn_during(served.client.node_get_info)
    assert got >= WAIT, f"the other operation got the turn after {got:.2f} s"
