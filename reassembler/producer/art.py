"""Synthetic OpenPipe ART model folders (CONTRACT.md 13.1), for the benchmark and tests:
`.art/{project}/models/{name}/` with `trajectories/train/{step:04d}.parquet` (format version
2: one row per trajectory, its `trajectory_json` holding chat-completion exchanges with
their exact prompt and output token ids and log probabilities, as ART's vLLM capture logs
them) and a `history.jsonl` line per step. Every trajectory is a chain of calls, each
extending the one before (its prompt: the previous prompt and output, then a tool result),
so each trains as one row; groups of `group_size` trajectories, rewards drawn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = {"role": "system", "content": "you are a helpful agent"}


def _exchange(k: int, messages: list, prompt: list[int], out: list[int], logprobs: list[float], model: str) -> dict:
    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(out, logprobs)]
    return {
        "start_time": f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}Z",
        "end_time": f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}.5Z",
        "request": {"model": model, "messages": messages, "temperature": 1.0, "logprobs": True},
        "response": {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "token_ids": out,
                    "logprobs": {"content": content},
                    "message": {"role": "assistant", "content": f"answer {k}"},
                }
            ],
            "prompt_token_ids": prompt,
        },
    }


def trajectory(rng: np.random.Generator, calls: int, tokens_per_call: int, model: str, reward: float) -> dict:
    """One trajectory: `calls` chained exchanges of about `tokens_per_call` new tokens each."""
    messages = [SYSTEM, {"role": "user", "content": "task"}]
    prompt = rng.integers(10, 50_000, max(8, tokens_per_call // 2)).tolist()
    exchanges = []
    for k in range(calls):
        out = rng.integers(10, 50_000, max(1, tokens_per_call // 2)).tolist()
        logprobs = np.round(-rng.random(len(out)) * 3, 4).tolist()
        exchanges.append(_exchange(k, list(messages), list(prompt), out, logprobs, model))
        messages = [*messages, {"role": "assistant", "content": f"answer {k}"}, {"role": "tool", "content": f"t{k}"}]
        prompt = [*prompt, *out, *rng.integers(10, 50_000, max(1, tokens_per_call // 2)).tolist()]
    return {"exchanges": {"chat_completions": exchanges}, "reward": reward, "initial_policy_version": 0,
            "final_policy_version": 0, "metadata": {}}  # fmt: skip


def art_model_folder(
    root: Path,
    ds: str,
    trajectories: int,
    calls: int = 8,
    tokens_per_call: int = 600,
    group_size: int = 4,
    steps: int = 2,
    seed: int = 0,
    name: str = "bench-run",
) -> tuple[Path, int]:
    """Write the model folder under `root`; returns it and the tokens its rows will hold."""
    rng = np.random.default_rng(seed)
    model = root / ".art" / "bench" / "models" / name
    train = model / "trajectories" / "train"
    train.mkdir(parents=True, exist_ok=True)
    history, tokens = [], 0
    per_step = max(1, trajectories // steps)
    for step in range(1, steps + 1):
        rows: dict[str, list] = {k: [] for k in ("format_version", "group_index", "trajectory_index",
                                                   "trajectory_json", "reward", "metadata")}  # fmt: skip
        for t in range(per_step):
            reward = float(rng.integers(0, 3)) / 2
            value = trajectory(rng, calls, tokens_per_call, f"{name}@{step - 1}", reward)
            last = value["exchanges"]["chat_completions"][-1]
            tokens += len(last["response"]["prompt_token_ids"]) + len(last["response"]["choices"][0]["token_ids"])
            rows["format_version"].append(2)
            rows["group_index"].append(t // group_size)
            rows["trajectory_index"].append(t % group_size)
            rows["trajectory_json"].append(json.dumps(value))
            rows["reward"].append(reward)
            rows["metadata"].append("{}")
        table = pa.table(
            {
                "format_version": pa.array(rows["format_version"], pa.int16()),
                "group_index": pa.array(rows["group_index"], pa.int64()),
                "trajectory_index": pa.array(rows["trajectory_index"], pa.int64()),
                "trajectory_json": pa.array(rows["trajectory_json"], pa.large_string()),
                "reward": pa.array(rows["reward"], pa.float64()),
                "metadata": pa.array(rows["metadata"], pa.string()),
            }
        ).replace_schema_metadata({"art.trajectory_parquet.version": "2"})
        pq.write_table(table, train / f"{step:04d}.parquet", compression="zstd")
        history.append({"train/reward": 0.5, "step": step, "recorded_at": f"{ds}T01:00:{step:02d}"})
    (model / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    return model, tokens
