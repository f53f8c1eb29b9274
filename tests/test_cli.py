"""The reassembler command as a user runs it: exit codes and one-line messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nights import DS, worked_example
from reassembler.cli import main


def test_build_explain_report(tmp_path, night, capsys):
    worked_example(night, "group_g0", compaction=True, reward=1.0)
    inp = night.write()
    out = tmp_path / "out"
    assert main(["build", "--input", str(inp), "--output", str(out), "--ds", DS]) == 0
    printed = capsys.readouterr().out
    assert "1 rollouts, 1 ok, 0 masked (0.0%), 2 rows" in printed
    assert main(["explain", "--output", str(out), "--ds", DS, "group_g0"]) == 0
    text = capsys.readouterr().out
    for line in (
        "select: items 0-1 -> c1",
        "select: items 2-3 -> c2",
        "select: items 4-5 -> c3",
        "select: items 6-7 -> c5",
        "cut: c1 root -> starts chain 0",
        "cut: c2 continues chain 0",
        "cut: c3 root -> starts chain 1",
        "cut: c5 continues chain 1",
        "finalize: walk c2 -> c1",
        "finalize: walk c5 -> c3",
        "off-chain: c4 (0 faulty)",
        "row group_g0_s1: calls [c3, c5], 7 tokens, 3 generated, prompt_len 2",
        "result: ok, 2 rows",
    ):
        assert line in text, line
    assert text.count("cut:") == 4  # each step once
    assert main(["explain", "--output", str(out), "--ds", DS, "--json", "group_g0"]) == 0
    replay = json.loads(capsys.readouterr().out)
    assert [r["calls"] for r in replay["rows"]] == [["c1", "c2"], ["c3", "c5"]]
    assert replay["result"]["offchain"] == ["c4"] and "cut: c5 continues chain 1" in replay["steps"]
    assert main(["report", "--output", str(out)]) == 0
    assert "2026-11-28  1         1   0" in capsys.readouterr().out


def test_explain_names_the_reason_of_a_masked_rollout(tmp_path, night, capsys):
    worked_example(night, "group_g0", compaction=True, terminal_model_call_id="c3")
    out = tmp_path / "out"
    assert main(["build", "--input", str(night.write()), "--output", str(out), "--ds", DS]) == 0
    assert main(["explain", "--output", str(out), "--ds", DS, "group_g0"]) == 0
    text = capsys.readouterr().out
    assert "result: masked, terminal_not_last at call c5: declared terminal c3, last selected c5" in text
    assert "(terminal_not_last: the declared terminal call is not the last selected call)" in text
    assert f"the failing call's ledger row: ledger/ds={DS}/ledger.jsonl:5" in text  # c5, the fifth line


def test_missing_input_exits_2_with_one_line_naming_the_folder(tmp_path, capsys):
    assert main(["build", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o"), "--ds", DS]) == 2
    err = capsys.readouterr().err.strip()
    nope = f"{tmp_path}/nope"
    assert err == (
        f"reassembler: error: {nope}/rollouts/ds={DS}: input partition folder is missing ({nope} is not an input "
        f"root: it holds none of rollouts/, ledger/, tokens/; expected {nope}/rollouts/ds={DS}/, "
        f"{nope}/ledger/ds={DS}/ and {nope}/tokens/ds={DS}/)"
    )
    assert not (tmp_path / "o" / "rows").exists()


def _usage_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("reassembler: error: "), err  # one line, no usage block
    return err.strip()


def test_bad_usage_exits_2_with_one_line_naming_the_argument(tmp_path, capsys):
    err = _usage_error(["build", "--input", "x", "--output", "y", "--ds", "28-11-2026"], capsys)
    assert "ds must be a date written YYYY-MM-DD, got '28-11-2026'" in err and "reassembler build --help" in err
    err = _usage_error(["build", "--ouput", "o", "--input", "i", "--ds", DS], capsys)  # not "--output required"
    assert "`build` has no option --ouput: did you mean --output?" in err
    err = _usage_error(["build", "--shard", "2", "--output", "o", "--input", "i", "--ds", DS], capsys)
    assert "has no option --shard: did you mean --shards?" in err  # no prefix matching
    err = _usage_error(["build", "--output", "o", "--input", "i"], capsys)
    assert "the following arguments are required: --ds" in err
    err = _usage_error(["gate", "--output", "o", "--ds", DS, "--max-mask", "0.1"], capsys)
    assert "did you mean --max-mask-rate?" in err
    assert "invalid choice: 'buidl'" in _usage_error(["buidl"], capsys)


def test_an_output_inside_or_equal_to_an_input_location_is_refused(tmp_path, night, capsys):
    worked_example(night, "group_g0")
    inp = night.write()
    for out in (inp, inp / "out", inp / "rollouts" / f"ds={DS}"):
        assert main(["build", "--input", str(inp), "--output", str(out), "--ds", DS]) == 2
        err = capsys.readouterr().err
        assert f"reassembler: error: {out}: the output" in err and "choose an output root outside" in err
        assert not (out / "rows").exists() and not (out / "warehouse.duckdb").exists()
    link = tmp_path / "link-to-input"
    link.symlink_to(inp)
    assert main(["build", "--input", str(inp), "--output", str(link / "o"), "--ds", DS]) == 2  # links resolved
    assert "lies inside the input location" in capsys.readouterr().err


def test_an_output_beside_the_input_whose_name_starts_with_the_inputs_is_allowed(night, capsys):
    worked_example(night, "group_g0")
    inp = night.write()
    beside = inp.parent / f"{inp.name}-rows"
    assert main(["build", "--input", str(inp), "--output", str(beside), "--ds", DS]) == 0, capsys.readouterr().err
    assert (beside / "rows" / f"ds={DS}").is_dir()


def test_an_option_written_with_equals_is_the_option_and_its_value(tmp_path, night, capsys):
    worked_example(night, "group_g0")
    inp = night.write()
    assert main(["build", f"--input={inp}", f"--output={tmp_path / 'out'}", f"--ds={DS}", "--shards=2"]) == 0
    assert (tmp_path / "out" / "rows" / f"ds={DS}").is_dir()
    assert "has no option --ouput" in _usage_error(["build", "--ouput=o", "--input=i", f"--ds={DS}"], capsys)


def test_a_rerun_says_which_run_it_replaced(tmp_path, night, capsys):
    worked_example(night, "group_g0")
    inp, out = night.write(), tmp_path / "out"
    assert main(["build", "--input", str(inp), "--output", str(out), "--ds", DS]) == 0
    first = capsys.readouterr().out
    assert "replaced:" not in first
    run = first.split("(run ")[1].split(")")[0]
    assert main(["build", "--input", str(inp), "--output", str(out), "--ds", DS]) == 0
    assert f"replaced: run {run}, the night's previous publish" in capsys.readouterr().out


def test_help_shows_every_default(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["build", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in (
        "(default: 128MB)",
        "(default: 2)",
        "(default: 60.0)",
        "(default: 30)",
        "(default: select)",
        "(default: 16777216)",
    ):
        assert default in text, default


def test_verbose_logs_the_steps(tmp_path, night, capsys):
    worked_example(night, "group_g0")
    inp = str(night.write())
    for argv in (["-v", "build"], ["build", "-v"], ["build", "--input", inp, "-v"]):  # -v anywhere
        args = argv + ([] if "--input" in argv else ["--input", inp])
        assert main([*args, "--output", str(tmp_path / "o"), "--ds", DS]) == 0
        err = capsys.readouterr().err
        assert "loaded ds=2026-11-28" in err and "shard 0: 1 rollouts, 1 ok" in err and "published ds=2026-11-28" in err


def test_console_script_is_installed(tmp_path):
    exe = Path(sys.executable).parent / "reassembler"
    res = subprocess.run(
        [
            str(exe),
            "synth",
            "--output",
            str(tmp_path),
            "--ds",
            DS,
            "--rollouts",
            "8",
            "--max-calls",
            "6",
            "--token-scale",
            "0.02",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "synth ds=2026-11-28: 8 rollouts" in res.stdout


@pytest.mark.parametrize("flag", ["--warehouse", "--temp-directory"])
def test_a_warehouse_or_spill_folder_inside_an_input_location_is_refused(tmp_path, night, capsys, flag):
    worked_example(night, "group_g0")
    inp = night.write()
    before = sorted(p.relative_to(inp) for p in inp.rglob("*"))
    for inside in (inp / "w", inp / "ledger" / f"ds={DS}" / "w"):
        out = tmp_path / "out"
        assert main(["build", "--input", str(inp), "--output", str(out), "--ds", DS, flag, str(inside)]) == 2
        err = capsys.readouterr().err.strip()
        what = "warehouse" if flag == "--warehouse" else "temp directory"
        assert err.startswith(f"reassembler: error: {inside}: the {what} lies inside the ") and "\n" not in err
        assert err.endswith(f"choose a {what} outside the night's input")
    assert sorted(p.relative_to(inp) for p in inp.rglob("*")) == before  # nothing written there
    assert (
        main(["build", "--input", str(inp), "--output", str(tmp_path / "o2"), "--ds", DS, flag, str(tmp_path / "w")])
        == 0
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REASSEMBLER_GRACE_SECONDS", "abc"),
        ("REASSEMBLER_LEASE_SECONDS", "2m"),
        ("REASSEMBLER_S3_RETRY_SECONDS", "-1"),
        ("REASSEMBLER_IN_FLIGHT_SECONDS", "12h"),
    ],
)
def test_a_setting_of_the_environment_that_is_no_number_is_one_line_naming_it(tmp_path, name, value):
    from commands import cli, one_line_error

    res = cli("build", "--input", tmp_path / "in", "--output", tmp_path / "out", "--ds", DS, env={name: value})
    assert res.returncode == 2
    assert one_line_error(res).startswith(f"reassembler: error: {name}={value!r}: not a number of seconds >= 0")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
def test_a_fan_out_past_what_the_night_or_the_machine_can_use_is_lowered_saying_so(tmp_path):
    """Fan-outs have ceilings: threads and worker processes by the machine's cores, shards,
    parts and buckets by a night's most, parts by the night's files and buckets by its input,
    each lowered in one warning line; the night builds as with the defaults."""
    import os

    from commands import cli

    data = Path(__file__).resolve().parent / "data" / "gym-0.7.0"
    ds = "2026-11-29"
    plain = cli("build", "--input", data, "--output", tmp_path / "plain", "--ds", ds)
    assert plain.returncode == 0, plain.stderr
    cores = os.cpu_count() or 1
    parts = "load parts 1024 lowered to 4 (the night's input is 4 files of one kind at most)"
    buckets = "merge buckets 1024 lowered to 3 (one per 16 KiB of the night's 35 KiB of input)"
    cases = [
        (["--load-parts", "1000000"], ["load parts 1000000 lowered to 1024 (the most one night is parsed in)", parts]),
        (["--threads", "100000"], [f"threads 100000 lowered to {4 * cores} (4 a core, {cores} cores here)"]),
        (["--merge-buckets", "10000000"], ["merge buckets 10000000 lowered to 1024 (the most one night is merged in)",
                                           buckets]),
        (["--workers", "1000", "--shards", "3"], [f"workers 1000 lowered to {2 * cores} (2 a core, {cores} cores "
                                                  "here)"]),
    ]  # fmt: skip
    for k, (flags, said) in enumerate(cases):
        res = cli("build", "--input", data, "--output", tmp_path / f"o{k}", "--ds", ds, *flags, timeout=120)
        assert res.returncode == 0, res.stderr
        warnings = [line.split(" WARNING ", 1)[1] for line in res.stderr.splitlines() if " WARNING " in line]
        assert [w for w in warnings if "lowered" in w] == said, res.stderr
        assert (
            res.stdout.splitlines()[0].split(" in ")[1].split(": ", 1)[1]
            == (plain.stdout.splitlines()[0].split(" in ")[1].split(": ", 1)[1])
        )


def test_the_settings_fan_outs_are_bounded_whatever_their_source():
    from reassembler.settings import MAX_PARTS, MAX_SHARDS, DuckDBSettings, Settings

    wild = Settings(
        duckdb=DuckDBSettings(threads=10**6), workers=10**6, shards=10**6, load_parts=10**7, merge_buckets=10**7
    )
    got = wild.bounded(cores=3)
    assert (got.duckdb.threads, got.workers, got.shards, got.load_parts, got.merge_buckets) == (
        12,
        6,
        MAX_SHARDS,
        MAX_PARTS,
        MAX_PARTS,
    )
    assert Settings().bounded(cores=1) == Settings()  # within every ceiling: as it was
    params = Settings.from_params({"shards": "100000", "duckdb_threads": 10**5, "load_parts": None})
    assert params.shards == MAX_SHARDS and params.duckdb.threads <= 4 * (__import__("os").cpu_count() or 1)
