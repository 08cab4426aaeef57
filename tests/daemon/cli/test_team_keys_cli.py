"""A team's producer keys on the command line (issue 61): `adapterd keys --team` makes the pair and prints the
operator's setting, `adapterd submit` signs with `--key` or `producer_key_file` (a key it cannot read ends it,
named), and `adapterd doctor` says whether teams are bound or claims. In process, no broker."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from daemon.admission.grants import Grants
from daemon.cli.app import app
from daemon.cli.checks.doctor import _teams
from daemon.cli.commands.requests import producer_signed
from daemon.settings import Settings
from schemas.signing import PRODUCER_SIGNATURE_HEADER, EventKeys
from tests.helpers import sft_request

runner = CliRunner()


def test_keys_for_a_team_writes_its_pair_and_prints_the_teams_setting(tmp_path: Path) -> None:
    result = runner.invoke(app, ["keys", str(tmp_path), "--team", "alpha"])
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "alpha-producer-key.pem", tmp_path / "alpha-producer-key.pub"
    assert private.stat().st_mode & 0o777 == 0o600 and public.read_text().startswith(
        "# adapterd team alpha producer key"
    )
    setting = tomllib.loads(result.output.split("\n", 1)[1])  # the lines after the first: TOML the operator pastes
    settings = Settings(teams=setting["teams"])
    assert len(Grants.from_settings(settings.teams).keys["alpha"]) == 1
    again = runner.invoke(app, ["keys", str(tmp_path), "--team", "alpha"])
    assert again.exit_code == 2 and "never overwritten" in again.output


def test_keys_refuses_a_team_name_that_is_not_one(tmp_path: Path) -> None:
    result = runner.invoke(app, ["keys", str(tmp_path), "--team", "Vision B"])
    assert result.exit_code == 2 and "--team: 'Vision B' is not a team name" in result.output
    assert not list(tmp_path.iterdir())


def test_submit_signs_exactly_the_bytes_it_sends_with_the_flag_or_the_setting(tmp_path: Path) -> None:
    assert runner.invoke(app, ["keys", str(tmp_path), "--team", "beta"]).exit_code == 0
    keys = EventKeys.from_file(tmp_path / "beta-producer-key.pub")
    value = json.dumps(sft_request("signed-1", team="beta")).encode()
    for flag, setting in ((tmp_path / "beta-producer-key.pem", None), (None, tmp_path / "beta-producer-key.pem")):
        headers = producer_signed(value, flag, setting)
        assert [name for name, _ in headers] == [PRODUCER_SIGNATURE_HEADER]
        keys.verify(
            value, headers, PRODUCER_SIGNATURE_HEADER
        )  # raises if it were not beta's signature over these bytes
    assert producer_signed(value, None, None) == []  # an open fleet's producer: unsigned, as before


def test_submit_with_a_key_it_cannot_read_ends_naming_the_flag_before_sending(tmp_path: Path) -> None:
    (tmp_path / "request.json").write_text(json.dumps(sft_request("signed-2")))
    result = runner.invoke(app, ["submit", str(tmp_path / "request.json"), "--key", str(tmp_path / "missing.pem")])
    assert result.exit_code == 2 and "--key:" in result.output and "missing.pem" in result.output
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(typer.Exit):
        producer_signed(b"{}", None, tmp_path / "junk.pem")


def test_doctor_warns_that_open_teams_are_claims_and_says_who_is_bound(tmp_path: Path) -> None:
    open_check = _teams(Settings())
    assert open_check.warn and "claims" in open_check.detail
    assert runner.invoke(app, ["keys", str(tmp_path), "--team", "alpha"]).exit_code == 0
    bound = _teams(Settings(teams={"alpha": {"producer_keys_file": tmp_path / "alpha-producer-key.pub"}}))
    assert (
        bound.ok
        and not bound.warn
        and bound.detail.startswith("bound:")
        and "alpha (1 key(s), classes all)" in bound.detail
    )
