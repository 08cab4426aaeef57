"""Teams bound to their producers' keys, end to end on the real broker with a real daemon in fleet mode (issue 61):
each team's key pair made by `adapterd keys --team`, one team's request sent by `adapterd submit --key`. Team
alpha's producer naming team beta is rejected naming `team`; alpha naming a class it is not granted is rejected
naming `priority_class`; alpha at its cap renaming itself to get a slot again is rejected naming `team`; the
honest requests of both teams train (beta's moved to its class's topic and claimed, its signature carried)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Accepted, Progress, Rejected, Succeeded
from schemas.signing import EventSigner, producer_headers
from testbed.client import produce, terminal_events
from testbed.fleet_keys import shared_fleet_keys
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.daemon.cli.test_queue_cli_fleet import adapterd
from tests.daemon.fleet.test_fleet_queue import CLASSES, fleet, hosts, of, request

pytestmark = pytest.mark.slow


async def signed(settings: Settings, by: EventSigner, body: dict[str, Any]) -> None:
    """What a team's producer sends: the request's bytes and its key's signature over exactly them."""
    value = json.dumps(body).encode()
    await produce(settings, value, body["request_id"].encode(), headers=producer_headers(by, value))


async def test_a_team_cannot_write_as_another_nor_use_a_class_it_is_not_granted_nor_rename_itself_past_its_cap(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    for team in ("alpha", "beta"):
        code, said = await adapterd(settings, "keys", str(keys), "--team", team)
        assert code == 0 and f"[teams.{team}]" in said, said
    teams = Settings(
        priority_classes=CLASSES,
        **shared_fleet_keys(),
        teams={
            "alpha": {
                "producer_keys_file": keys / "alpha-producer-key.pub",
                "classes": ["default", "batch"],
                "max_slots": 1,
            },
            "beta": {"producer_keys_file": keys / "beta-producer-key.pub"},
        },
    ).teams
    (host,) = hosts(await fleet(settings, job_slots=2, teams=teams), tmp_path, "host-a")
    alpha = EventSigner.from_file(keys / "alpha-producer-key.pem")
    daemon = DaemonProcess(host, tmp_path / "host-a.log").start()
    try:
        async with EventStream(host) as stream:
            await signed(host, alpha, request("alpha-1", 30, team="alpha", priority_class="batch"))
            async for event in stream.events("alpha-1"):
                if isinstance(event, Progress):
                    break  # alpha holds its one slot (max_slots 1)
        await signed(host, alpha, request("forged-1", 4, team="beta"))  # alpha's producer, writing as beta
        await signed(host, alpha, request("greedy-1", 4, team="alpha", priority_class="urgent"))
        await signed(host, alpha, request("renamed-1", 4, team="alpha-b"))  # at its cap: a new name for a new slot
        (tmp_path / "beta-1.json").write_text(json.dumps(request("beta-1", 4, team="beta", priority_class="urgent")))
        code, said = await adapterd(
            host, "submit", str(tmp_path / "beta-1.json"), "--key", str(keys / "beta-producer-key.pem")
        )
        assert code == 0, said
        events = await terminal_events(host, {"alpha-1", "beta-1", "forged-1", "greedy-1", "renamed-1"})
    finally:
        daemon.stop()
    rejected = {rid: of(events[rid], Rejected) for rid in ("forged-1", "greedy-1", "renamed-1")}
    assert all(len(found) == 1 and not of(events[rid], Accepted) for rid, found in rejected.items()), {
        rid: [e.type for e in events[rid]] for rid in rejected
    }
    [forged], [greedy], [renamed] = rejected.values()
    assert forged.errors[0].path == "team" and "not signed by a key of team 'beta'" in forged.errors[0].message
    assert "a key of team 'alpha'" in forged.errors[0].message
    assert (
        greedy.errors[0].path == "priority_class"
        and "team 'alpha' may not use class 'urgent'" in greedy.errors[0].message
    )
    assert renamed.errors[0].path == "team" and "unknown team 'alpha-b'" in renamed.errors[0].message
    assert renamed.time < of(events["alpha-1"], Succeeded)[0].time  # refused while alpha held its cap, not given a slot
    assert of(events["alpha-1"], Succeeded) and of(events["beta-1"], Succeeded)
