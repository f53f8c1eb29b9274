"""Input locations (reassembler/formats/locations.py): NeMo Gym's own night folders read
where Gym writes them (`--layout gym`), custom templates, and the errors a user sees when a
location names nothing, on local disk and on the S3 server."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from gym_nights import DATA, LOCAL_DS, STAGED_DS, gym_folder, tables

from commands import cli
from reassembler.build import build_night
from reassembler.errors import InputError
from reassembler.formats.locations import Inputs, Location, fill
from reassembler.formats.night import find_night, still_written


@pytest.mark.parametrize(("fixture", "ds"), [("gym-0.7.0", STAGED_DS), ("gym-0.7.0-local", LOCAL_DS)])
def test_gym_layout_builds_the_night_the_contract_layout_builds(tmp_path, fixture, ds):
    gym_folder(tmp_path / "lab" / "gym", fixture, ds)
    inputs = Inputs(str(tmp_path / "lab" / "gym" / "{ds}"), "gym")
    night = find_night(inputs, ds)
    assert night.rollouts == ["rollouts.jsonl"] and night.sidecars == ["rollouts_materialized_inputs.jsonl"]
    assert night.tokens == (["part-000.parquet"] if fixture == "gym-0.7.0" else [])
    assert night.locations == {
        "rollouts": str(tmp_path / "lab" / "gym" / ds),
        "ledger": str(tmp_path / "lab" / "gym" / ds / "token_id_capture"),
        "tokens": str(tmp_path / "lab" / "gym" / ds / "staged"),
    }
    via_gym = build_night(inputs, tmp_path / "gym-out", ds)
    via_contract = build_night(DATA / fixture, tmp_path / "contract-out", ds)
    assert tables(tmp_path / "gym-out", ds) == tables(tmp_path / "contract-out", ds)
    assert via_gym.numbers.ok_rollouts == via_contract.numbers.ok_rollouts > 0
    manifest = json.loads((tmp_path / "gym-out" / "_published" / f"ds={ds}.json").read_text())
    assert manifest["run_info"]["inputs"] == night.locations
    assert Inputs.of(manifest["run_info"]["input_dir"]) == inputs  # explain reads the night again from it


def test_the_gym_layout_on_the_s3_server_with_no_copy_into_the_contract_layout(tmp_path, s3):
    local = gym_folder(tmp_path / "lab", "gym-0.7.0", STAGED_DS)
    root = f"s3://{s3.bucket('lab')}/gym"
    s3.upload(local, f"{root}/{STAGED_DS}")
    out = tmp_path / "out"
    res = cli("build", "--layout", "gym", "--input", root + "/{ds}", "--output", out, "--ds", STAGED_DS)
    assert res.returncode == 0, res.stderr
    build_night(DATA / "gym-0.7.0", tmp_path / "contract-out", STAGED_DS)
    assert tables(out, STAGED_DS) == tables(tmp_path / "contract-out", STAGED_DS)
    explained = cli("explain", "--output", out, "--ds", STAGED_DS, "1-0")
    assert explained.returncode == 0 and "capture: staged" in explained.stdout, explained.stderr
    assert cli("report", "--output", out, "--html", "--ds", STAGED_DS).returncode == 0
    page = (out / "reports" / f"ds={STAGED_DS}" / "index.html").read_text()
    assert f"{root}/{STAGED_DS}/token_id_capture" in page  # the report's run line names what was read


def test_custom_templates_with_date_pieces_and_a_results_glob(tmp_path):
    """A team's own folders: results under yyyy/mm/dd by a glob, the capture folder and the
    staged dump elsewhere, each template its own flag."""
    day = tmp_path / "results" / "2026" / "11" / "29"
    day.mkdir(parents=True)
    src = DATA / "gym-0.7.0"
    shutil.copy(src / "rollouts" / f"ds={STAGED_DS}" / "part-000.jsonl", day / "collect-a.jsonl")
    (day / "collect-a_failures.jsonl").write_text("")  # a sidecar the glob need not name
    (day / "notes.txt").write_text("not a results file\n")
    shutil.copytree(src / "ledger" / f"ds={STAGED_DS}", tmp_path / "capture" / f"date={STAGED_DS}")
    shutil.copytree(src / "tokens" / f"ds={STAGED_DS}", tmp_path / "dump" / "20261129")
    flags = {
        "rollouts": str(tmp_path / "results" / "{yyyy}" / "{mm}" / "{dd}" / "collect-*.jsonl"),
        "ledger": str(tmp_path / "capture" / "date={ds}"),
        "tokens": str(tmp_path / "dump" / "{yyyy}{mm}{dd}"),
    }
    night = find_night(Inputs(**flags), STAGED_DS)
    assert night.rollouts == ["collect-a.jsonl"] and night.failures == ["collect-a_failures.jsonl"]
    res = cli("build", *(x for k, v in flags.items() for x in (f"--{k}", v)), "--output", tmp_path / "out",
              "--ds", STAGED_DS)  # fmt: skip
    assert res.returncode == 0, res.stderr
    build_night(src, tmp_path / "contract-out", STAGED_DS)
    assert tables(tmp_path / "out", STAGED_DS) == tables(tmp_path / "contract-out", STAGED_DS)


def test_the_same_settings_from_the_environment(tmp_path):
    gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    env = {"REASSEMBLER_INPUT": str(tmp_path / "gym" / "{ds}"), "REASSEMBLER_LAYOUT": "gym"}
    res = cli("build", "--output", tmp_path / "out", "--ds", STAGED_DS, env=env)
    assert res.returncode == 0, res.stderr
    assert "4 rollouts, 4 ok" in res.stdout


def test_a_location_that_names_nothing_is_one_line_naming_it(tmp_path):
    gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    base = ["--output", tmp_path / "out", "--ds", STAGED_DS, "--layout", "gym", "--input", tmp_path / "gym" / "{ds}"]
    pattern = str(tmp_path / "gym" / "{ds}" / "results-*.jsonl")
    res = cli("build", *base, "--rollouts", pattern)
    want = f"{tmp_path}/gym/{STAGED_DS}/results-*.jsonl: the rollouts location of night {STAGED_DS} matches no file"
    assert res.returncode == 2 and res.stderr.strip() == f"reassembler: error: {want} (from {pattern})", res.stderr
    res = cli("build", *base[:4], "--layout", "gym", "--input", tmp_path / "gym" / "{ds}", "--ds", "2026-11-30")
    assert res.returncode == 2 and f"{tmp_path}/gym/2026-11-30: the rollouts location" in res.stderr, res.stderr
    assert "is missing (from {input}, layout gym)" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = cli("build", *base, "--ledger", str(tmp_path / "gym" / "{day}"))
    assert res.returncode == 2 and "unknown placeholder {day}" in res.stderr, res.stderr
    res = cli("build", "--output", tmp_path / "out", "--ds", STAGED_DS, "--ledger", str(tmp_path))
    assert res.returncode == 2 and "no input root" in res.stderr, res.stderr


def test_a_file_two_locations_would_read_is_refused(tmp_path):
    """Nothing is read twice: a results folder named as the ledger too would read its lines as
    both; a folder two templates name is listed once and its files split by kind."""
    night = gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    with pytest.raises(InputError, match=r"rollouts.jsonl: both the rollouts location .* and the ledger location"):
        find_night(Inputs(str(tmp_path / "gym" / "{ds}"), "gym", ledger="{input}"), STAGED_DS)
    shutil.copytree(night / "staged", night / "token_id_capture", dirs_exist_ok=True)  # dump beside the ledger
    same = find_night(Inputs(str(tmp_path / "gym" / "{ds}"), "gym", tokens="{input}/token_id_capture"), STAGED_DS)
    assert same.tokens == ["part-000.parquet"] and len(same.ledger) == 4
    assert same.folders["ledger"] == same.folders["tokens"]


def test_templates_fill_from_the_night_and_parse_into_folders_files_and_globs(tmp_path):
    assert fill("s3://lab/{yyyy}/{mm}/{dd}/x-{ds}", "2026-02-03", None) == "s3://lab/2026/02/03/x-2026-02-03"
    assert (
        fill("{input}/token_id_capture", "2026-02-03", "s3://lab/gym/{ds}")
        == "s3://lab/gym/2026-02-03/token_id_capture"
    )
    with pytest.raises(InputError, match=r"unknown placeholder \{date\} \(known: \{ds\}, \{yyyy\}"):
        fill("/x/{date}", "2026-02-03", None)
    assert Location.parse("s3://lab/gym/2026/*/r-?.jsonl", "rollouts") == Location(
        "rollouts", "s3://lab/gym/2026", "*/r-?.jsonl"
    )
    with pytest.raises(InputError, match="plain folder before its first wildcard"):
        Location.parse("s3://lab-*/x", "rollouts")
    (tmp_path / "r.jsonl").write_text("")
    assert Location.parse(str(tmp_path / "r.jsonl"), "rollouts") == Location("rollouts", str(tmp_path), "r.jsonl")
    assert Location.parse(str(tmp_path) + "/", "ledger") == Location("ledger", str(tmp_path))
    loc = Location("rollouts", "/x", "*/r-*.jsonl")
    assert loc.matches("a/r-1.jsonl") and not loc.matches("r-1.jsonl") and not loc.matches("a/b/r-1.jsonl")
    assert Inputs.of(Inputs("/in", "gym").text()) == Inputs("/in", "gym")
    assert Inputs.of("/in").text() == "/in" and Inputs.of("/in").is_plain()


def test_the_results_file_is_whole_only_once_gym_has_finished_it(tmp_path):
    """The sensor's rule for the gym layout (formats/night.py: still_written)."""
    night_dir = gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    inputs = Inputs(str(tmp_path / "gym" / "{ds}"), "gym")
    results = night_dir / "rollouts.jsonl"
    whole = results.read_bytes()
    assert "changed in the last 30 s" in still_written(find_night(inputs, STAGED_DS))
    old = time.time() - 60
    os.utime(results, (old, old))
    assert still_written(find_night(inputs, STAGED_DS)) is None
    results.write_bytes(whole[:-20])  # torn: Gym is writing it
    os.utime(results, (old, old))
    assert "last line is not complete" in still_written(find_night(inputs, STAGED_DS))
    results.write_bytes(b"")
    os.utime(results, (old, old))
    assert "results file is empty" in still_written(find_night(inputs, STAGED_DS))
    results.unlink()
    assert still_written(find_night(inputs, STAGED_DS)) == f"{night_dir}: no results file yet"
    assert still_written(find_night(DATA / "gym-0.7.0", STAGED_DS)) is None  # the contract's layout: its own rule


def test_a_file_two_locations_reach_through_a_link_is_refused(tmp_path):
    """Two locations that resolve to one real file, a symbolic link on the way: exit 2."""
    night = gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    linked = tmp_path / "linked-ledger"
    linked.mkdir()
    results = next(night.glob("*.jsonl"))
    (linked / "also.jsonl").symlink_to(results)
    with pytest.raises(InputError, match=r"also.jsonl: both the rollouts location .* \(it is .*\.jsonl\)"):
        find_night(Inputs(str(tmp_path / "gym" / "{ds}"), "gym", ledger=str(linked)), STAGED_DS)


def test_double_star_means_any_depth_and_only_as_a_whole_segment(tmp_path):
    """Runs kept one and two folders deep under the night are all read by `**`."""
    fixture = DATA / "verifiers-0.4.0" / "rollouts" / "ds=2026-12-01" / "traces.jsonl"
    episodes = fixture.read_bytes().splitlines(keepends=True)
    for k, where in enumerate(("runs/2026-12-01", "runs/2026-12-01/a", "runs/2026-12-01/a/b")):
        (tmp_path / where).mkdir(parents=True, exist_ok=True)
        (tmp_path / where / "traces.jsonl").write_bytes(b"".join(episodes[2 * k : 2 * k + 2]))
    night = find_night(Inputs(rollouts=str(tmp_path / "runs" / "{ds}" / "**" / "traces.jsonl")), "2026-12-01")
    assert night.rollouts == ["a/b/traces.jsonl", "a/traces.jsonl", "traces.jsonl"]
    assert Location.parse(str(tmp_path / "runs" / "*" / "traces.jsonl"), "rollouts").matches("a/traces.jsonl")
    assert not Location.parse(str(tmp_path / "runs" / "*" / "traces.jsonl"), "rollouts").matches("a/b/traces.jsonl")
    with pytest.raises(InputError, match=r"'\*\*' stands for any number of folders only as a whole segment"):
        Location.parse(str(tmp_path / "runs" / "a**" / "traces.jsonl"), "rollouts")


def test_locations_chosen_for_a_run_are_confined_to_the_allowed_roots(tmp_path):
    """What the DAG's trigger form may name: folders at or under the deployment's input roots;
    `..` and links do not lead out; a root may hold {ds}."""
    from reassembler.formats.locations import confine

    root = tmp_path / "input"
    (root / "rollouts" / "ds=2026-11-28").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "out-link").symlink_to(tmp_path / "elsewhere")
    inside = Inputs(str(root), "contract", rollouts="{input}/rollouts/ds={ds}")
    confine(inside, "2026-11-28", ["rollouts"], [str(root)])
    confine(inside, "2026-11-28", ["rollouts"], [str(root / "rollouts" / "ds={ds}")])  # a root of one night
    for where in ("/etc/passwd", f"{root}/../elsewhere/x.jsonl", f"{root}/out-link/*.jsonl"):
        with pytest.raises(InputError, match=r"lies outside the allowed input roots .*REASSEMBLER_ALLOWED_INPUT_ROOTS"):
            confine(Inputs(str(root), "contract", rollouts=where), "2026-11-28", ["rollouts"], [str(root)])
    confine(Inputs(str(root), "contract", rollouts="/etc/passwd"), "2026-11-28", ["rollouts"], [str(root), "/etc"])


def test_rollouts_naming_one_results_file_read_its_failures_sidecar_beside_it(tmp_path):
    """`--rollouts` naming Gym's results file itself (not a glob that also matches the
    sidecar) reads `<stem>_failures.jsonl` beside it: a given-up sample becomes its audit row."""
    night = gym_folder(tmp_path / "gym", "gym-0.7.0", STAGED_DS)
    failed = {"_ng_task_index": 9, "_ng_rollout_index": 0, "_ng_failure_class": "timeout", "_ng_failure_terminal": True}
    (night / "rollouts_failures.jsonl").write_text(json.dumps(failed) + "\n")
    inputs = Inputs(str(tmp_path / "gym" / "{ds}"), "gym", rollouts="{input}/rollouts.jsonl")
    found = find_night(inputs, STAGED_DS)
    assert found.failures == ["rollouts_failures.jsonl"] and found.rollouts == ["rollouts.jsonl"]
    summary = build_night(inputs, tmp_path / "out", STAGED_DS)
    assert summary.load.gym.given_up == 1


def test_a_verifiers_night_with_another_jsonl_beside_its_traces_needs_no_ledger(tmp_path):
    """Any other .jsonl beside traces.jsonl is read as rollout lines; the night still needs no
    ledger or tokens folder (it holds a traces file)."""
    runs = tmp_path / "runs" / "2026-12-01"
    runs.mkdir(parents=True)
    shutil.copy(DATA / "verifiers-0.4.0" / "rollouts" / "ds=2026-12-01" / "traces.jsonl", runs / "traces.jsonl")
    (runs / "notes.jsonl").write_text('{"reward": 1.0}\n')  # not a rollout: a reject row
    summary = build_night(Inputs(rollouts=str(tmp_path / "runs" / "{ds}")), tmp_path / "out", "2026-12-01")
    assert summary.load.traces[0] == 6 and summary.load.rollouts.rejected == 2  # the torn line and the note


def _rows_and_audit(out, ds: str) -> tuple[dict, dict]:
    import pyarrow.parquet as pq

    audit = {
        a["rollout_id"]: (a["status"], a["reason"], a["capture"])
        for a in pq.read_table(out / "audit" / f"ds={ds}").to_pylist()
    }
    rows = {}
    for r in pq.read_table(out / "rows" / f"ds={ds}").to_pylist():
        rows[(r["rollout_id"], r["segment_index"])] = (r["input_ids"], r["loss_mask"], r["advantage"])
    return rows, audit


def test_several_rollouts_locations_build_one_night_as_each_builds_alone(tmp_path):
    """NeMo Gym's compaction-agent results in one folder and verifiers traces in another (each
    a producer's own sample night, moved to one ds): one night, each rollout as its own night
    gives it (advantages are per group, and the two share no group)."""
    ds = "2026-12-02"
    gym = tmp_path / "gym" / ds
    shutil.copytree(DATA / "gym-0.7.0-compaction" / "rollouts" / f"ds={ds}", gym)
    runs = tmp_path / "runs" / ds / "run-a"
    runs.mkdir(parents=True)
    shutil.copy(DATA / "verifiers-0.4.0" / "rollouts" / "ds=2026-12-01" / "traces.jsonl", runs / "traces.jsonl")
    both = (
        "--rollouts",
        str(tmp_path / "gym" / "{ds}"),
        "--rollouts",
        str(tmp_path / "runs" / "{ds}" / "*" / "traces.jsonl"),
    )
    res = cli("build", *both, "--output", tmp_path / "both", "--ds", ds)
    assert res.returncode == 0, res.stderr
    assert "12 rollouts" in res.stdout and "rollouts 14 read = 12 loaded + 2 rejected" in res.stdout
    for name, one in (("gym", both[:2]), ("verifiers", both[2:])):
        alone = cli("build", *one, "--output", tmp_path / name, "--ds", ds)
        assert alone.returncode == 0, alone.stderr
    rows, audit = _rows_and_audit(tmp_path / "both", ds)
    gym_rows, gym_audit = _rows_and_audit(tmp_path / "gym", ds)
    ver_rows, ver_audit = _rows_and_audit(tmp_path / "verifiers", ds)
    assert audit == gym_audit | ver_audit and len(audit) == len(gym_audit) + len(ver_audit) == 12
    assert rows == gym_rows | ver_rows
    manifest = json.loads((tmp_path / "both" / "_published" / f"ds={ds}.json").read_text())
    assert manifest["run_info"]["inputs"]["rollouts"] == [str(gym), str(runs.parent / "*" / "traces.jsonl")]
    # the rejects name their files under the folder the locations share
    import pyarrow.parquet as pq

    files = sorted(pq.read_table(tmp_path / "both" / "tables" / "rejects.parquet").column("file").to_pylist())
    assert files == [f"gym/{ds}/rollouts.jsonl", f"runs/{ds}/run-a/traces.jsonl"]
    # REASSEMBLER_ROLLOUTS takes the same as a JSON list; a file two locations name is refused
    env = {"REASSEMBLER_ROLLOUTS": json.dumps([both[1], both[3]])}
    res = cli("build", "--output", tmp_path / "env", "--ds", ds, env=env)
    assert res.returncode == 0 and _rows_and_audit(tmp_path / "env", ds) == (rows, audit), res.stderr
    twice = cli("build", *both, "--rollouts", str(runs / "traces.jsonl"), "--output", tmp_path / "x", "--ds", ds)
    assert twice.returncode == 2 and f"{runs / 'traces.jsonl'}: both rollouts locations" in twice.stderr
    missing = cli(
        "build", *both, "--rollouts", str(tmp_path / "nowhere" / "{ds}"), "--output", tmp_path / "y", "--ds", ds
    )
    assert missing.returncode == 2
    assert f"{tmp_path / 'nowhere' / ds}: the rollouts location of night {ds} is missing" in missing.stderr


def test_a_folder_whose_name_only_begins_with_an_allowed_roots_name_is_not_under_it(tmp_path):
    """`/x/input-evil` is not under the allowed root `/x/input`: a location there is refused,
    as is a tokens location chosen there; `/x/input/sub` is under it."""
    from reassembler.formats.locations import confine, inside

    root = str(tmp_path / "input")
    assert inside(root + "/sub", [root]) and inside(root, [root])
    assert not inside(root + "-evil", [root]) and not inside(root + "-evil/x", [root])
    (tmp_path / "input" / "tokens").mkdir(parents=True)
    (tmp_path / "input-evil" / "tokens").mkdir(parents=True)
    for kind in ("rollouts", "ledger", "tokens"):
        evil = Inputs(root, "contract", **{kind: str(tmp_path / "input-evil" / kind)})
        with pytest.raises(InputError, match=r"lies outside the allowed input roots"):
            confine(evil, "2026-11-28", [kind], [root])
    confine(Inputs(root, "contract", tokens=f"{root}/tokens"), "2026-11-28", ["tokens"], [root])


def test_a_token_file_chosen_in_the_trigger_form_is_confined_with_its_links_followed(tmp_path):
    """A token file in a chosen tokens folder that is a link to a file outside the allowed
    roots is refused naming it (confine_files checks the tokens location like the others)."""
    from nights import DS, Night, worked_example
    from reassembler.formats.night import confine_files

    n = Night(tmp_path / "root" / "input")
    worked_example(n, "a_g0")
    inp = n.write()
    folder = inp / "tokens" / f"ds={DS}"
    [real_file] = list(folder.glob("*.parquet"))
    outside = tmp_path / "outside.parquet"
    real_file.rename(outside)
    real_file.symlink_to(outside)
    night = find_night(Inputs(str(inp), "contract"), DS)
    confine_files(night, ["rollouts", "ledger"], [str(tmp_path / "root")])  # the tokens not chosen: not checked
    with pytest.raises(InputError) as e:
        confine_files(night, ["tokens"], [str(tmp_path / "root")])
    assert str(e.value) == (
        f"{real_file}: a file of the tokens location given for this run resolves to {outside}, outside the "
        f"allowed input roots ({tmp_path / 'root'})"
    )
