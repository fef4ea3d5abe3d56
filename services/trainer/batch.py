"""From wire `Datum`s to padded tensors, micro-batches of rows of similar length, and from
logits to per-token logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from services.common.errors import InvalidInput
from services.trainer.schemas import Datum

# Any valid id: padded positions are hidden by the attention mask and carry no loss.
PAD_ID = 0


@dataclass(frozen=True)
class Batch:
    """Right-padded [B, T] tensors. `loss_mask` is 0 at position 0 and on padding."""

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor | None
    advantages: Tensor | None
    lengths: list[int]
    proximal_logprobs: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int((self.loss_mask > 0).sum().item())

    @property
    def padded_tokens(self) -> int:
        return len(self.lengths) * max(self.lengths)

    def rows(self, rows: list[int], extra: Tensor | None = None) -> tuple[Batch, Tensor | None]:
        """These rows, cut to the longest of them; `extra` ([B, T], e.g. reference logprobs)
        cut the same way."""
        index = torch.tensor(rows, device=self.input_ids.device)
        span = max(self.lengths[i] for i in rows)

        def cut(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor[index, :span]

        part = Batch(
            input_ids=self.input_ids[index, :span],
            attention_mask=self.attention_mask[index, :span],
            loss_mask=self.loss_mask[index, :span],
            old_logprobs=cut(self.old_logprobs),
            advantages=cut(self.advantages),
            lengths=[self.lengths[i] for i in rows],
            proximal_logprobs=cut(self.proximal_logprobs),
        )
        return part, cut(extra)


def validate_data(data: list[Datum], vocab_size: int, max_length: int, *, needs_loss: bool) -> None:
    """Reject what would otherwise fail deep inside torch with an index error."""
    for i, datum in enumerate(data):
        if len(datum.input_ids) > max_length:
            raise InvalidInput(
                f"data[{i}]: {len(datum.input_ids)} tokens exceed the model's maximum "
                f"length of {max_length}"
            )
        too_big = [t for t in datum.input_ids if t >= vocab_size]
        if too_big:
            raise InvalidInput(
                f"data[{i}]: token id {too_big[0]} is outside the model's vocabulary "
                f"(size {vocab_size}; valid ids are 0..{vocab_size - 1})"
            )
        if any(w < 0 for w in datum.loss_mask):
            raise InvalidInput(f"data[{i}]: loss_mask weights must be non-negative")
    if needs_loss and not any(w > 0 for datum in data for w in datum.loss_mask[1:]):
        raise InvalidInput(
            "No token carries loss: every loss_mask is 0 after position 0 "
            "(position i weighs the prediction of input_ids[i], so position 0 never counts)"
        )


def collate(data: list[Datum], device: torch.device) -> Batch:
    lengths = [len(d.input_ids) for d in data]
    width = max(lengths)

    def padded(rows: list[list[float]] | list[list[int]], dtype: torch.dtype) -> Tensor:
        values = [list(row) + [0] * (width - len(row)) for row in rows]
        return torch.tensor(values, dtype=dtype, device=device)

    loss_mask = padded([d.loss_mask for d in data], torch.float32)
    loss_mask[:, 0] = 0.0

    def optional(rows: list[list[float] | None]) -> Tensor | None:
        present = [row for row in rows if row is not None]
        return padded(present, torch.float32) if len(present) == len(rows) else None

    return Batch(
        input_ids=padded([d.input_ids for d in data], torch.long),
        attention_mask=padded([[1] * n for n in lengths], torch.long),
        loss_mask=loss_mask,
        old_logprobs=optional([d.logprobs for d in data]),
        advantages=optional([d.advantages for d in data]),
        lengths=lengths,
        proximal_logprobs=optional([d.proximal_logprobs for d in data]),
    )


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Row indices grouped for separate forward passes, longest rows first, each group's padded
    size (rows × its longest row) within `token_budget`; a row longer than the budget goes
    alone. Sorting by length keeps a short row from being padded to a long one: a batch with a
    long-tailed length mix otherwise spends most of its compute on padding."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """[B, T] log p(input_ids[:, i] | input_ids[:, :i]); position 0 (nothing before it) is 0.

    gather - logsumexp rather than log_softmax: no second [B, T, V] tensor in the forward."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))


def unpad(per_token: Tensor, lengths: list[int]) -> list[list[float]]:
    rows = per_token.detach().cpu().tolist()
    return [row[:n] for row, n in zip(rows, lengths, strict=True)]
