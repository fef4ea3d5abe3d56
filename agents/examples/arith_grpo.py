"""Demo RL job: teach the tiny model two-digit addition, SFT warm-up then GRPO.

Everything goes through Loom's services via the SDK: the trainer does SFT and GRPO steps,
each `save_weights()` publishes a version to modelstate, the rollout engine loads it, the
reward service scores samples. Every `eval_every` steps it measures greedy accuracy on a validation
split and moves the `best` alias to the best version so far; held-out accuracy (a third split,
used for nothing else) is reported for the SFT version and for `best`. Writes the reward curve
(CSV + PNG).

    python -m agents.examples.arith_grpo --url http://127.0.0.1:8000 --api-key loom_...
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ConfigDict, Field
from rich.table import Table

from agents.algorithms import group_advantages, has_signal, rl_datum, sft_datum
from agents.algorithms.schedules import warmup_cosine
from agents.datasets.arithmetic import Problem, Splits, make_splits
from agents.examples.console import console, progress_bar
from agents.sdk import AdamParams, JobClient, LoomClient, LossConfig, SamplingParams, ScoreItem
from services.common.schemas import StrictModel
from services.common.tiny_model import EOS


class ArithConfig(StrictModel):
    """The training knobs; also the config of the managed `arith_grpo` recipe."""

    model_config = ConfigDict(frozen=True)

    seed: int = 0
    held_out: int = 200
    validation: int = 200
    # SFT warm-up: until greedy validation accuracy reaches `sft_target_accuracy`, enough to
    # give RL a signal, not enough to solve the task. Accuracy jumps within ~150 steps from
    # under 15% to over 60%, and where the jump lands moves with library versions and with
    # the training split (seen: from ~420 to past 500 steps), so a fixed step count leaves RL
    # starting either from ~7%, where it barely moves, or past 60%. Checked every
    # `sft_check_every` steps from `sft_min_steps` on; each check publishes a version.
    sft_target_accuracy: float = 0.4
    sft_min_steps: int = 350
    sft_max_steps: int = 1200
    sft_check_every: int = 50
    sft_batch: int = 64
    sft_lr: float = 3e-3
    # A constant 3e-3 made whether the target is met a matter of luck: of three batch seeds,
    # one or two missed it within 1,000 steps, at one rank and at two (rounding decides).
    # Warmed up and decayed, five seeds of five at one rank and three of three at two reached
    # it by step 600 (bench/results/trainer_scale.md).
    sft_warmup_steps: int = Field(default=50, ge=0)
    sft_decay_steps: int = Field(default=800, ge=1)
    sft_final_lr_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    # Decoupled weight decay matters for this tiny model: without it 350 SFT steps reached 2%
    # held-out accuracy instead of 36% (measured, trainer in-process, earlier versions).
    weight_decay: float = 0.01
    # GRPO
    rl_steps: int = 80
    prompts_per_step: int = 64
    group_size: int = 8
    rl_lr: float = 1e-3
    # A fresh AdamW's first steps move every weight by about the full rate: at 1e-3 from the
    # start, validation accuracy fell from 66.5% to 29.5% in the first 10 GRPO steps (50.5%
    # warmed up); at 1e-3 to the end, it fell again after step 40.
    rl_warmup_steps: int = Field(default=10, ge=0)
    rl_final_lr_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    max_tokens: int = 5
    eval_every: int = 10

    def sft_lr_at(self, step: int) -> float:
        """The learning rate of SFT step `step` (from 1)."""
        factor = warmup_cosine(
            step, self.sft_warmup_steps, self.sft_decay_steps, self.sft_final_lr_fraction
        )
        return self.sft_lr * factor

    def rl_lr_at(self, rl_step: int) -> float:
        """The learning rate of GRPO step `rl_step` (from 1: its own count, after SFT's)."""
        factor = warmup_cosine(
            rl_step, self.rl_warmup_steps, self.rl_steps, self.rl_final_lr_fraction
        )
        return self.rl_lr * factor


class DemoConfig(ArithConfig):
    """The demo creates its job, on this base model and mode."""

    base_model: str = "loom/tiny"
    mode: str = "full"


@dataclass
class Encoded:
    problem: Problem
    prompt_ids: list[int]
    answer_ids: list[int]


@dataclass
class DemoResult:
    job_id: str
    accuracy_before: float  # held-out, the SFT version
    accuracy_after: float  # held-out, the version with the best validation accuracy
    accuracy_final: float  # held-out, the last version
    best_version: int
    wall_s: float
    curve: list[dict[str, float]] = field(default_factory=list)
    csv_path: Path | None = None
    png_path: Path | None = None


def run_demo(url: str, api_key: str, out_dir: Path, config: DemoConfig | None = None) -> DemoResult:
    config = config or DemoConfig()
    started = time.perf_counter()
    rng = random.Random(config.seed)
    with (
        LoomClient(url, api_key) as loom,
        loom.create_job(config.base_model, name="arith-grpo", mode=config.mode) as job,
    ):
        # The block's end marks the job completed (failed if it raises)
        console.print(f"[bold]Job[/bold] {job.id}: {config.base_model} ({config.mode})")
        splits = make_splits(
            held_out=config.held_out, validation=config.validation, seed=config.seed
        )
        train, validation, held_out = encode(loom, splits)

        sft = _sft(loom, job, train, validation, config, rng)
        before = evaluate(loom, job, held_out, config, sft.version)
        console.print(f"Held-out accuracy after SFT (version {sft.version}): {before:.1%}")

        best = ScoredVersion(sft.version, sft.accuracy)
        job.move_alias("best", best.version)
        job.reset_optimizer().result()  # RL is a new phase: SFT's AdamW moments stay behind
        curve, final_version = _grpo(loom, job, train, validation, best, config, rng)
        after = evaluate(loom, job, held_out, config, best.version)
        final = evaluate(loom, job, held_out, config, final_version)
        console.print(
            f"Held-out accuracy after GRPO: {after:.1%} (best version {best.version}, "
            f"chosen on validation), {final:.1%} (last version {final_version})"
        )

    result = DemoResult(
        job.id, before, after, final, best.version, time.perf_counter() - started, curve
    )
    result.csv_path, result.png_path = _write_curve(curve, sft.accuracy, out_dir)
    _print_summary(result)
    return result


@dataclass
class ScoredVersion:
    """A version and its greedy validation accuracy."""

    version: int
    accuracy: float


def encode(loom: LoomClient, splits: Splits) -> list[list[Encoded]]:
    problems = [p for split in splits for p in split]
    prompts = loom.tokenize([p.prompt for p in problems])
    answers = loom.tokenize([p.answer + EOS for p in problems])
    encoded = iter([Encoded(p, q, a) for p, q, a in zip(problems, prompts, answers, strict=True)])
    return [[next(encoded) for _ in split] for split in splits]


def _adam(lr: float, config: ArithConfig) -> AdamParams:
    # beta2 0.95 (not the default 0.999): what the demo was tuned and measured with.
    return AdamParams(lr=lr, beta2=0.95, weight_decay=config.weight_decay)


def _sft(
    loom: LoomClient,
    job: JobClient,
    train: list[Encoded],
    validation: list[Encoded],
    config: ArithConfig,
    rng: random.Random,
) -> ScoredVersion:
    """Supervised steps until validation accuracy reaches the target (or the step budget ends);
    the version it stops on gets the `sft` alias."""
    checked = ScoredVersion(0, 0.0)
    with progress_bar() as progress:
        task = progress.add_task("SFT warm-up", total=config.sft_max_steps, info="")
        for step in range(1, config.sft_max_steps + 1):
            loss = sft_step(job, rng.sample(train, config.sft_batch), config, step)
            job.log_metrics(step, {"sft/loss": loss})
            progress.update(task, advance=1, info=f"loss {loss:.3f}")
            due = step >= config.sft_min_steps and step % config.sft_check_every == 0
            if due or step == config.sft_max_steps:
                version = job.save_weights().result().number
                checked = ScoredVersion(version, evaluate(loom, job, validation, config, version))
                progress.update(task, info=f"validation {checked.accuracy:.1%}")
                if checked.accuracy >= config.sft_target_accuracy:
                    progress.update(task, total=step)
                    break
    job.move_alias("sft", checked.version)
    return checked


def sft_step(job: JobClient, batch: list[Encoded], config: ArithConfig, step: int) -> float:
    """Supervised step number `step` (from 1) on `batch`; its loss."""
    data = [sft_datum(e.prompt_ids, e.answer_ids) for e in batch]
    loss = job.forward_backward(data, LossConfig(name="cross_entropy"))
    job.optim_step(_adam(config.sft_lr_at(step), config)).result()
    return float(loss.result().loss)


@dataclass
class GrpoStep:
    """What one GRPO step did: its metrics, and one sample per prompt for the job's log."""

    metrics: dict[str, float]
    samples: list[dict[str, object]]
    groups_with_signal: int


def grpo_step(
    loom: LoomClient,
    job: JobClient,
    batch: list[Encoded],
    config: ArithConfig,
    version: int,
    step: int,
    lr: float,
) -> GrpoStep:
    """Sample `batch` on `version` (groups of `group_size`), score, train on the groups with
    signal at learning rate `lr` (not published: the caller does that)."""
    started = time.perf_counter()
    params = SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature)
    responses = job.sample_many(
        [e.prompt_ids for e in batch], n=config.group_size, params=params, version=version
    )
    if any(r.version != version for r in responses):
        raise RuntimeError(
            f"rollout served {[r.version for r in responses]}, expected version {version}"
        )
    items = [
        ScoreItem(response=s.text, reference=e.problem.answer)
        for e, r in zip(batch, responses, strict=True)
        for s in r.samples
    ]
    rewards = [s.reward for s in loom.score("exact_match", items).scores]
    data = []
    for i, response in enumerate(responses):
        group = rewards[i * config.group_size : (i + 1) * config.group_size]
        if not has_signal(group):
            continue
        for sample, advantage in zip(response.samples, group_advantages(group), strict=True):
            data.append(rl_datum(response.prompt_token_ids, sample, advantage))
    metrics = {"reward": sum(rewards) / len(rewards)}
    if data:
        loss = LossConfig(name="ppo", clip_low=config.clip_low, clip_high=config.clip_high)
        trained = job.forward_backward(data, loss)
        job.optim_step(_adam(lr, config)).result()
        metrics |= {"loss": trained.result().loss, **trained.result().metrics}
    metrics["samples_per_s"] = len(rewards) / (time.perf_counter() - started)
    samples: list[dict[str, object]] = [
        {
            "step": step,
            "version": version,
            "prompt": e.problem.prompt,
            "completion": s.text,
            "reward": reward,
        }
        for e, r, reward in zip(batch, responses, rewards[:: config.group_size], strict=True)
        for s in r.samples[:1]
    ]
    return GrpoStep(metrics, samples, len(data) // config.group_size)


def _grpo(
    loom: LoomClient,
    job: JobClient,
    train: list[Encoded],
    validation: list[Encoded],
    best: ScoredVersion,
    config: ArithConfig,
    rng: random.Random,
) -> tuple[list[dict[str, float]], int]:
    curve: list[dict[str, float]] = []
    version = job.version("latest").number
    with progress_bar() as progress:
        task = progress.add_task("GRPO", total=config.rl_steps, info="")
        for step in range(1, config.rl_steps + 1):
            batch = rng.sample(train, config.prompts_per_step)
            done = grpo_step(loom, job, batch, config, version, step, config.rl_lr_at(step))
            metrics, mean_reward = done.metrics, done.metrics["reward"]
            version = job.save_weights(metrics={"reward": mean_reward}).result().number
            point = {
                "step": step,
                "version": version,
                "reward": mean_reward,
                "groups_with_signal": done.groups_with_signal,
            }
            if step % config.eval_every == 0 or step == config.rl_steps:
                accuracy = evaluate(loom, job, validation, config, version)
                point["validation_accuracy"] = accuracy
                if accuracy > best.accuracy:
                    best.version, best.accuracy = version, accuracy
                    job.move_alias("best", version)
            curve.append(point)
            if "validation_accuracy" in point:
                metrics["validation_accuracy"] = point["validation_accuracy"]
            job.log_metrics(step, {f"rl/{name}": value for name, value in metrics.items()})
            job.log_samples(done.samples)
            progress.update(task, advance=1, info=f"reward {mean_reward:.3f} v{version}")
    return curve, version


def evaluate(
    loom: LoomClient, job: JobClient, problems: list[Encoded], config: ArithConfig, version: int
) -> float:
    """Greedy accuracy on `problems`, on one explicit version."""
    params = SamplingParams(max_tokens=config.max_tokens, temperature=0.0)
    responses = job.sample_many([e.prompt_ids for e in problems], params=params, version=version)
    items = [
        ScoreItem(response=r.samples[0].text, reference=e.problem.answer)
        for e, r in zip(problems, responses, strict=True)
    ]
    scores = loom.score("exact_match", items).scores
    return sum(s.reward for s in scores) / len(scores)


def _write_curve(
    curve: list[dict[str, float]], start_accuracy: float, out_dir: Path
) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out_dir / "reward_curve.csv", out_dir / "reward_curve.png"
    fields = ["step", "version", "reward", "groups_with_signal", "validation_accuracy"]
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(curve)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p["step"] for p in curve], [p["reward"] for p in curve], label="train reward")
    evals = [{"step": 0, "validation_accuracy": start_accuracy}]  # the SFT start
    evals += [p for p in curve if "validation_accuracy" in p]
    ax.plot(
        [p["step"] for p in evals],
        [p["validation_accuracy"] for p in evals],
        "o-",
        label="validation accuracy (greedy)",
    )
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1)
    ax.set_title("Loom demo: two-digit addition, tiny model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return csv_path, png_path


def _print_summary(result: DemoResult) -> None:
    table = Table(title="Loom demo")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("job", result.job_id)
    table.add_row("held-out accuracy before RL (after SFT)", f"{result.accuracy_before:.1%}")
    table.add_row(
        f"held-out accuracy after RL (best version {result.best_version})",
        f"{result.accuracy_after:.1%}",
    )
    table.add_row("held-out accuracy, last version", f"{result.accuracy_final:.1%}")
    table.add_row("wall time", f"{result.wall_s:.0f} s")
    table.add_row("reward curve", f"{result.csv_path}\n{result.png_path}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=os.environ.get("LOOM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("LOOM_API_KEY"))
    parser.add_argument("--out", type=Path, default=Path("runs/arith_grpo"))
    args = parser.parse_args()
    if not args.api_key:
        parser.error("--api-key (or LOOM_API_KEY) is required")
    run_demo(args.url, args.api_key, args.out)


if __name__ == "__main__":
    main()
