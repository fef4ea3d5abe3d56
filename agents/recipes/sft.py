"""The `sft` recipe: supervised fine-tuning on prompt/completion pairs (tokenized by the
rollout engine's tokenizer) or on ready training sequences (`data`, as the trainer takes them).
Each step's batch is drawn from a generator seeded by the step, so a resumed run trains on the
batches the first attempt would have."""

from __future__ import annotations

import random
from typing import Any, Self

from pydantic import Field, model_validator

from agents.algorithms import sft_datum
from agents.recipes.recipe import Recipe
from agents.recipes.run import RecipeRun
from services.common.schemas import StrictModel
from services.trainer.schemas import AdamParams, Datum, LossConfig

MAX_EXAMPLES = 100_000


class Example(StrictModel):
    prompt: str = Field(min_length=1)
    completion: str = Field(
        min_length=1,
        description="Learned after the prompt; end it with "
        "the model's end-of-text token to teach it to stop.",
    )


class SftConfig(StrictModel):
    examples: list[Example] = Field(default=[], max_length=MAX_EXAMPLES)
    data: list[Datum] = Field(
        default=[],
        max_length=MAX_EXAMPLES,
        description="Instead of examples: token ids and loss masks.",
    )
    steps: int = Field(ge=1, le=1_000_000)
    batch_size: int = Field(default=8, ge=1, le=4096)
    adam: AdamParams = AdamParams()
    checkpoint_every: int = Field(
        default=10,
        ge=1,
        description="Steps between checkpoints "
        "(each publishes a version); the last step always is one.",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if bool(self.examples) == bool(self.data):
            raise ValueError(
                "give either `examples` (prompt/completion texts) or `data` "
                "(token ids), not both or neither"
            )
        return self


def run_sft(run: RecipeRun, config: SftConfig) -> dict[str, Any]:
    data = config.data or _tokenized(run, config.examples)
    for step in range(run.start_step, config.steps + 1):
        batch = random.Random(f"{config.seed}:{step}").sample(
            data, min(config.batch_size, len(data))
        )
        trained = run.job.forward_backward(batch, LossConfig(name="cross_entropy"))
        run.job.optim_step(config.adam).result()
        loss = trained.result().loss
        run.job.log_metrics(step, {"sft/loss": loss})
        if step % config.checkpoint_every == 0 or step == config.steps:
            run.checkpoint(step, {"loss": loss}, metrics={"sft/loss": loss})
    return {"steps": config.steps, "final_loss": run.state.get("loss")}


def _tokenized(run: RecipeRun, examples: list[Example]) -> list[Datum]:
    prompts = run.loom.tokenize([e.prompt for e in examples])
    completions = run.loom.tokenize([e.completion for e in examples])
    return [sft_datum(p, c) for p, c in zip(prompts, completions, strict=True)]


SFT = Recipe(
    name="sft",
    config=SftConfig,
    run=run_sft,
    description="Supervised fine-tuning on prompt/completion pairs or token ids.",
)
