"""The multi-turn rollout of :class:`trl_ext.PPOTrainer` with ``tools`` / ``environment_factory``: TRL GRPOTrainer's
tool-calling loop (``_tool_call_loop``, TRL 1.16) producing one token sequence per episode. How it works:
docs/ppo-internals.md#the-multi-turn-rollout."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import UserInputError
from .tool_calls import ToolCallCounts, ToolExecutor
from .toolbox import Toolbox

__all__ = ["Episode", "EpisodeBatch", "MultiTurnRollout", "left_pad", "turn_ids"]


@dataclass
class Episode:
    """One episode on this process: its completion's token ids after the prompt (actions and observations)."""

    prompt_ids: list[int]
    ids: list[int]
    action: list[bool]
    logprobs: list[float]
    messages: list[dict]
    """What reward functions get as the completion: assistant messages (with ``tool_calls``) and tool messages."""
    turns: int = 1
    truncated: str | None = None
    """``"length"`` (``response_length`` reached or a tool result did not fit), ``"iterations"`` (the last turn
    called tools after ``max_tool_calling_iterations`` rounds), or None."""
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    """The environment's per-turn rewards (``get_turn_reward``): ``(position, reward)``, the position (in ``ids``)
    of the last token of the turn the reward scores."""

    def append(self, ids: list[int], action: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.action += [action] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


@dataclass
class EpisodeBatch:
    """The episodes of one rollout and their tensors ``(batch, width)`` (width: the longest completion)."""

    episodes: list[Episode]
    counts: ToolCallCounts = field(default_factory=ToolCallCounts)
    observation_mask: torch.Tensor | None = None
    """True at observation tokens (None when no episode called a tool: the single-turn rollout)."""
    ends_with_eos: torch.Tensor | None = None
    lengths: torch.Tensor | None = None

    @property
    def completions(self) -> list[list[dict]]:
        return [episode.messages for episode in self.episodes]

    def marked_texts(self, tokenizer) -> list[str]:
        """Each episode's completion as text, its observation spans between ``[observation]`` and
        ``[/observation]`` (special tokens kept: the turns' boundaries show)."""
        texts = []
        for e in self.episodes:
            parts, start = [], 0
            for end in range(1, len(e.ids) + 1):
                if end == len(e.ids) or e.action[end] != e.action[start]:
                    text = tokenizer.decode(e.ids[start:end], skip_special_tokens=False)
                    parts.append(text if e.action[start] else f"[observation]{text}[/observation]")
                    start = end
            texts.append("".join(parts))
        return texts

    def metrics(self, gather) -> dict:
        """``tools/*`` (TRL's call and failure frequencies, plus timeouts) and ``episodes/*`` of the update."""
        episodes = self.episodes
        device = self.lengths.device if self.lengths is not None else None
        per_episode = torch.tensor([[e.turns, sum(e.action), len(e.ids) - sum(e.action), e.truncated == "length",
                                     e.truncated == "iterations"] for e in episodes], dtype=torch.float32,
                                   device=device)
        counts = torch.tensor([self.counts.calls, self.counts.failures, self.counts.timeouts], dtype=torch.float32,
                              device=device)
        per_episode, counts = gather(per_episode), gather(counts.unsqueeze(0)).sum(0)
        calls, failures, timeouts = counts.tolist()
        means = per_episode.mean(0).tolist()
        return {
            "tools/call_frequency": calls / per_episode.shape[0],
            "tools/failure_frequency": failures / calls if calls else 0.0,
            "tools/timeout_frequency": timeouts / calls if calls else 0.0,
            "episodes/turns_mean": means[0],
            "episodes/action_tokens_mean": means[1],
            "episodes/observation_tokens_mean": means[2],
            "episodes/truncated_length_frac": means[3],
            "episodes/truncated_iterations_frac": means[4],
        }


def turn_ids(response: torch.Tensor, budget: int, eos_token_id: int, pad_token_id: int) -> list[int]:
    """A sampled turn's tokens: through its EOS (or up to the first pad), at most ``budget``."""
    ids = response.tolist()
    for stop, token in enumerate(ids):
        if token == eos_token_id:
            ids = ids[: stop + 1]
            break
        if token == pad_token_id:
            ids = ids[:stop]
            break
    return ids[:budget]


def left_pad(rows: list[list[int]], pad_token_id: int, like: torch.Tensor) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = like.new_full((len(rows), width), pad_token_id)
    for i, r in enumerate(rows):
        if r:
            out[i, width - len(r):] = torch.tensor(r, dtype=like.dtype)
    return out


class MultiTurnRollout:
    """The feature object of ``tools`` / ``environment_factory`` (module docstring), built once by the trainer."""

    def __init__(self, toolbox: Toolbox, args, processing_class, engine_prompt_length: int | None = None):
        self.toolbox = toolbox
        self.response_length = args.response_length
        self.max_iterations = args.max_tool_calling_iterations
        self.pad_token_id = processing_class.pad_token_id
        self.eos_token_id = processing_class.eos_token_id
        self.executor = ToolExecutor(toolbox.standalone_tools, args.tool_timeout_s, args.tool_num_workers)
        self.prompt_ids: list[list[int]] = []
        self.engine_prompt_length = engine_prompt_length
        """With the continuous-batching engine: the prompt length its cache was sized for (None without)."""

    def close(self) -> None:
        self.executor.close()

    @staticmethod
    def check_launch(accelerator, fsdp: bool, gather_deepspeed3_params: bool) -> None:
        """Each process runs its own turns, so the number of ``generate`` calls differs between processes: refused
        where a forward pass is collective (FSDP; ZeRO-3 without ``ds3_gather_for_generation``)."""
        from ...runtime.engines import zero3_enabled

        if fsdp:
            raise UserInputError("tools: not supported under FSDP (each process runs its own number of turns, and "
                                 "FSDP's forward passes need every process); use DDP or DeepSpeed")
        if zero3_enabled(accelerator) and not gather_deepspeed3_params:
            raise UserInputError("ds3_gather_for_generation: false with tools under ZeRO-3 (each process runs its "
                                 "own number of turns, and sharded generation needs every process); set it to true")

    def begin(self, data: dict) -> dict:
        """The prompt batch with each row's environment reset and its prompt rendered with its tools: new left-padded
        ``input_ids``, and ``prompt`` as reward functions then get it (the reset text included).

        A prompt that ``reset`` left unchanged keeps the ids the batch holds (the trainer's dataset was rendered with
        the same tools by :meth:`Toolbox.render_dataset`; its attention mask says which are padding); only a prompt
        with reset text, or a batch without an attention mask, is rendered here."""
        columns = {k: v for k, v in data.items() if isinstance(v, list)}
        n = data["input_ids"].shape[0]
        rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        prompts = self.toolbox.start_batch(rows, data["prompt"])
        mask = data.get("attention_mask")
        self.prompt_ids = [
            data["input_ids"][i][mask[i].bool()].tolist() if mask is not None and prompt == data["prompt"][i]
            else self.toolbox.render_prompt(prompt, i) for i, prompt in enumerate(prompts)]
        longest = max(map(len, self.prompt_ids))
        if self.engine_prompt_length is not None and longest > self.engine_prompt_length:
            raise UserInputError(
                f"rollout_engine: a prompt of {longest} tokens (with its environment's reset text) is longer than the "
                f"{self.engine_prompt_length} the continuous-batching cache was sized for (the longest dataset prompt "
                "with its tools); use rollout_engine: generate, or shorter reset text")
        return {**data, "prompt": prompts, "input_ids": left_pad(self.prompt_ids, self.pad_token_id,
                                                                 data["input_ids"])}

    def _turn_ids(self, response: torch.Tensor, budget: int) -> list[int]:
        return turn_ids(response, budget, self.eos_token_id, self.pad_token_id)

    def run(self, queries: torch.Tensor, sample) -> tuple[torch.Tensor, torch.Tensor, EpisodeBatch]:
        """The episodes of ``queries`` (rendered by :meth:`begin`): ``(query_responses, logprobs, batch)``.
        ``sample(queries, max_new_tokens)`` samples one turn: ``(query_responses, logprobs)``, as a single-turn
        rollout does."""
        context_length = queries.shape[1]
        query_responses, logprobs = sample(queries, self.response_length)
        episodes = []
        for i, (response, row_logprobs) in enumerate(zip(query_responses[:, context_length:], logprobs)):
            ids = self._turn_ids(response, self.response_length)
            message = self.toolbox.parse(ids, self.prompt_ids[i], i)
            episodes.append(Episode(self.prompt_ids[i], [], [], [], [message]))
            episodes[-1].append(ids, True, row_logprobs[: len(ids)].tolist())
        batch = EpisodeBatch(episodes)
        active = [i for i, e in enumerate(episodes) if e.messages[-1].get("tool_calls")]
        if not active:
            return query_responses, logprobs, self._finish(batch, queries, None)
        rounds = 0
        while active and (self.max_iterations is None or rounds < self.max_iterations):
            active = self._one_round(batch, active, queries, sample)
            rounds += 1
        for i in active:  # still calling tools when the rounds ran out
            episodes[i].truncated = "iterations"
        return self._finish(batch, queries, logprobs)

    def _one_round(self, batch: EpisodeBatch, active: list[int], queries, sample) -> list[int]:
        """Run the active episodes' tool calls, append the results, sample the next turn; the episodes still
        calling tools."""
        episodes = batch.episodes
        calls = {i: episodes[i].messages[-1]["tool_calls"] for i in active}
        results = self.executor.run(calls, {i: self.toolbox.tool_dict(i) for i in active}, batch.counts,
                                    on_timeout=self.toolbox.replace_environment)
        for i in active:  # the environment's reward for the turn whose calls just ran: on that turn's last token
            reward = self.toolbox.turn_reward(i)
            if reward is not None:
                episodes[i].turn_rewards.append((len(episodes[i].ids) - 1, reward))
        continuing = []
        for i in active:
            suffix = self.toolbox.tool_suffix_ids(results[i])
            episode = episodes[i]
            if len(episode.ids) + len(suffix) > self.response_length:  # TRL: the result is dropped, the episode ends
                episode.truncated = "length"
                continue
            episode.messages += results[i]
            episode.append(suffix, False)
            if len(episode.ids) < self.response_length:
                continuing.append(i)
            else:
                episode.truncated = "length"
        if not continuing:
            return []
        prefixes = left_pad([episodes[i].prompt_ids + episodes[i].ids for i in continuing], self.pad_token_id,
                            queries)
        budget = max(self.response_length - len(episodes[i].ids) for i in continuing)
        query_responses, logprobs = sample(prefixes, budget)
        still = []
        for k, i in enumerate(continuing):
            episode = episodes[i]
            prefix = episode.prompt_ids + episode.ids
            ids = self._turn_ids(query_responses[k, prefixes.shape[1]:], self.response_length - len(episode.ids))
            episode.append(ids, True, logprobs[k, : len(ids)].tolist())
            episode.turns += 1
            message = self.toolbox.parse(ids, prefix, i) if ids else None
            if message:
                episode.messages.append(message)
                if message.get("tool_calls"):
                    still.append(i)
        return still

    def _finish(self, batch: EpisodeBatch, queries: torch.Tensor, logprobs: torch.Tensor | None):
        """The batch's tensors; with ``logprobs`` None (no tool call) only the bookkeeping (single-turn tensors)."""
        episodes = batch.episodes
        device = queries.device
        for e in episodes:
            if e.truncated is None and len(e.ids) >= self.response_length and e.ids[-1] != self.eos_token_id:
                e.truncated = "length"
        batch.lengths = torch.tensor([len(e.ids) for e in episodes], device=device)
        batch.ends_with_eos = torch.tensor([bool(e.ids) and e.ids[-1] == self.eos_token_id for e in episodes],
                                           device=device)
        if logprobs is None:
            return batch
        width = max(1, int(batch.lengths.max()))
        responses = queries.new_full((len(episodes), width), self.pad_token_id)
        all_logprobs = torch.zeros((len(episodes), width), dtype=logprobs.dtype, device=device)
        batch.observation_mask = torch.zeros((len(episodes), width), dtype=torch.bool, device=device)
        for i, e in enumerate(episodes):
            n = len(e.ids)
            responses[i, :n] = torch.tensor(e.ids, dtype=queries.dtype)
            all_logprobs[i, :n] = torch.tensor(e.logprobs, dtype=logprobs.dtype)
            batch.observation_mask[i, :n] = ~torch.tensor(e.action, dtype=torch.bool)
        return torch.cat((queries, responses), 1), all_logprobs, batch
