"""A real TRL GRPOTrainer small enough for CPU tests, also runnable under torchrun.

A Llama of a few thousand parameters built from its config, a character-level
tokenizer built in-process, prompts in a ``datasets.Dataset`` and a binary
Python reward that sometimes returns ``None`` (TRL's "unscorable").

    torchrun --nproc_per_node 2 tests/trl_run.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

CHARACTERS = list("abcdefghijklmnopqrstuvwxyz0123456789 +=?")


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *CHARACTERS])}
    characters = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    characters.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=characters, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def tiny_llama(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=3 + len(CHARACTERS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return LlamaForCausalLM(config)


def prompts(count: int = 16) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(count)]})


def binary_reward(completions: list[str], **_: Any) -> list[float | None]:
    """1 if the completion has an 'a', None (unscorable) if it has a 'b' instead, else 0."""
    return [1.0 if "a" in c else (None if "b" in c else 0.0) for c in completions]


def length_reward(completions: list[str], **_: Any) -> list[float]:
    return [float(len(c) % 3 == 0) for c in completions]


def config(output_dir: Path, **overrides: Any) -> Any:
    from trl import GRPOConfig

    settings: dict[str, Any] = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, num_generations=4, max_completion_length=8,
        report_to="none", per_device_train_batch_size=8, max_steps=3, logging_steps=1, save_strategy="no",
        learning_rate=1e-3, seed=0, temperature=1.5,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def sourced_prompts(count: int = 16) -> Any:
    """Prompts from two sources, ``alpha`` and ``beta``, in a ``data_source`` column."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(count)],
                              "data_source": ["alpha" if i % 2 else "beta" for i in range(count)]})


def trainer(output_dir: Path, monitor: Any, reward_funcs: list | None = None, eval_monitor: Any = None,
            eval_dataset: Any = None, train_dataset: Any = None, **overrides: Any) -> Any:
    from advmon.integrations.trl import MonitoredGRPOTrainer

    return MonitoredGRPOTrainer(
        model=tiny_llama(), reward_funcs=reward_funcs or [binary_reward], args=config(output_dir, **overrides),
        train_dataset=train_dataset if train_dataset is not None else prompts(), eval_dataset=eval_dataset,
        processing_class=tokenizer(),
        monitor=monitor, eval_monitor=eval_monitor,
    )


def main(out: Path) -> None:
    """Train three steps on every process; rank 0 writes TRL's log and the advantages it logged."""
    import advmon

    monitor = advmon.Monitor("trl-ddp", sinks=[advmon.JsonlSink(out / "trl-ddp.jsonl")], reward_range=(0, 1))
    run = trainer(out / "trainer", monitor, per_device_train_batch_size=4)
    run.train()
    monitor.close()
    if run.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(run.state.log_history))
        (out / "advantages.json").write_text(json.dumps(list(run._logs["advantages"])))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
