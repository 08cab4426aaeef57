"""The table keeper's loop without a broker (daemon/table/keeper.py): whatever Kafka does to it, it never raises into
the daemon: the brokers away are logged and tried again, a state topic short of partitions keeps no table and is
said once, and a stop ends it wherever it waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka.errors import KafkaConnectionError
from structlog.testing import capture_logs

from daemon.settings import Settings
from daemon.table.keeper import Keeper
from testbed.memory_kafka import NoTable


class Counted(NoTable):
    """Kafka whose topics are as `counts` says, or whose brokers are away (`away`); each look is counted."""

    def __init__(self, counts: tuple[int, int] = (0, 0), away: bool = False) -> None:
        self.counts, self.away = counts, away
        self.looks = 0
        self.looked = asyncio.Event()

    async def partition_counts(self) -> tuple[int, int]:
        self.looks += 1
        self.looked.set()
        if self.away:
            raise KafkaConnectionError("no broker answers")
        return self.counts


async def looked_then_stopped(keeper: Keeper, kafka: Counted) -> None:
    task = asyncio.create_task(keeper.run())
    await kafka.looked.wait()
    keeper.stop()
    await asyncio.wait_for(task, 5)  # ends at the stop, from its wait, without raising


async def test_the_brokers_away_are_logged_and_never_raised(tmp_path: Path) -> None:
    kafka = Counted(away=True)
    with capture_logs() as logs:
        await looked_then_stopped(Keeper(Settings(work_dir=tmp_path, hub_token=None), kafka), kafka)  # type: ignore[arg-type]
    [failed] = [line for line in logs if line["event"] == "table.keeper_failed"]
    assert failed["error"] == "KafkaConnectionError" and failed["retry_in_s"] == 1.0


async def test_a_state_topic_short_of_the_events_topics_partitions_keeps_no_table_and_is_said(tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path, hub_token=None)  # type: ignore[arg-type]
    kafka = Counted(counts=(4, 2))
    with capture_logs() as logs:
        await looked_then_stopped(Keeper(settings, kafka), kafka)
    [short] = [line for line in logs if line["event"] == "table.state_topic_short"]
    assert (short["state_partitions"], short["events_partitions"], short["log_level"]) == (2, 4, "error")
    assert "adapterd topics --grow" in short["fix"] and kafka.looks == 1  # and nothing of the group was asked


async def test_a_fleet_hosts_keeper_restores_once_its_view_is_whole(tmp_path: Path) -> None:
    """The keeper of a host with a fleet's view begins (its first look at the topics) only once the view is whole."""
    kafka = Counted(counts=(4, 2))
    whole = asyncio.Event()
    keeper = Keeper(Settings(work_dir=tmp_path, hub_token=None), kafka, view_whole=whole)  # type: ignore[arg-type]
    task = asyncio.create_task(keeper.run())
    for _ in range(20):  # the keeper's task has run to its wait, and on: it looked at nothing
        await asyncio.sleep(0)
    assert kafka.looks == 0 and not task.done()
    whole.set()
    await kafka.looked.wait()
    keeper.stop()
    await asyncio.wait_for(task, 5)


async def test_a_view_that_is_never_whole_delays_the_keeper_only_so_long(tmp_path: Path) -> None:
    kafka = Counted(counts=(4, 2))
    keeper = Keeper(
        Settings(work_dir=tmp_path, hub_token=None),  # type: ignore[arg-type]
        kafka,
        view_whole=asyncio.Event(),  # never set
        view_wait_s=0.0,
    )
    with capture_logs() as logs:
        await looked_then_stopped(keeper, kafka)
    assert [line["waited_s"] for line in logs if line["event"] == "table.view_late"] == [0.0]


async def test_a_stop_ends_the_keeper_waiting_for_its_view(tmp_path: Path) -> None:
    kafka = Counted(counts=(4, 2))
    keeper = Keeper(Settings(work_dir=tmp_path, hub_token=None), kafka, view_whole=asyncio.Event())  # type: ignore[arg-type]
    task = asyncio.create_task(keeper.run())
    await asyncio.sleep(0)
    keeper.stop()
    await asyncio.wait_for(task, 5)
    assert kafka.looks == 0
