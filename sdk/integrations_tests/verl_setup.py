"""What the verl tests build on disk and in memory: a tiny local model (a config and a
WordLevel tokenizer with a chat template: no hub, no weights), verl's own trainer config
composed by Hydra from verl's config files, a function tool, a reward function.

The emulated SGLang engines answer ``output_ids = 0..n-1``; in this vocabulary ids 0-2
spell a hermes tool call (``<tool_call> {"name": "search", ...} </tool_call>``), so every
answer of n >= 3 tokens is a call of the ``search`` tool, and verl's ``ToolAgentLoop``
parses it with its hermes parser."""

from __future__ import annotations

import json
from pathlib import Path

CALL = json.dumps({"name": "search", "arguments": {"query": "prorsa"}}, separators=(",", ":"))
WORDS = ["<tool_call>", CALL, "</tool_call>"] + [f"w{i}" for i in range(3, 64)] + [
    "[UNK]", "<pad>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "tool", "result", "for",
    "prorsa", "what", "is", "the", "answer", "question"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m.role }} "
    "{% if m.content is string %}{{ m.content }} {% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call> {{ c.function | tojson }} </tool_call> {% endfor %}"
    "<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")

TOOLS = '''
from verl.tools.function_tool import function_tool


@function_tool
def search(query: str) -> str:
    """Look a query up.

    Args:
        query: what to look up.
    """
    return f"result for {query}"
'''

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(ground_truth)
'''


def write_model(root: Path) -> Path:
    """A model folder verl's HFModelConfig loads: config.json and the tokenizer's files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                   eos_token="<|im_end|>", bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    model = root / "tiny-model"
    fast.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(WORDS), "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
        "max_position_embeddings": 2048, "pad_token_id": WORDS.index("<pad>"),
        "eos_token_id": WORDS.index("<|im_end|>"), "bos_token_id": WORDS.index("<|im_start|>")}))
    return model


def compose_config(root: Path, model: Path, *, turns: int, response_length: int, batch: int, n: int):
    """verl's ``ppo_trainer`` config (its own files, by Hydra) for a tool-calling rollout."""
    import verl
    from hydra import compose, initialize_config_dir

    (root / "tools.py").write_text(TOOLS)
    (root / "reward.py").write_text(REWARD)
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.prompt_length=512",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={turns}",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={root / 'tools.py'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"reward.custom_reward_function.path={root / 'reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        f"data.train_batch_size={batch}",
        "trainer.experiment_name=verl-itest",
    ]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)
