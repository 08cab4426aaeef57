"""Build a tiny, randomly initialised Qwen2 model and a byte-level BPE tokenizer with a chat template.

Used by `adapterd demo` and by the tests, so that neither needs to download a model: two layers of
width 32 train a few SFT steps on the CPU in about a second. Run as
`python -m handlers.tiny_model OUT_DIR [SEED] [--nan]` (the daemon never imports this module: it
imports torch). `--nan` builds the broken twin a gate must fail (see `save_tiny_model`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "adapterd trains adapters from a stream of requests.",
    "What is the capital of France? The capital of France is Paris.",
    "Two plus two equals four. Three plus five equals eight.",
    "Kafka keeps the requests; the Hub keeps the adapters.",
    "user assistant system question answer prompt completion chosen rejected",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 yes no true false good bad",
]

def build_tokenizer(
    vocab_size: int = 320, *, special_tokens: list[str] = SPECIAL_TOKENS, corpus: list[str] = CORPUS,
    chat_template: str = CHAT_TEMPLATE, **named_tokens: str,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `corpus`; `named_tokens` name special tokens by role (`image_token="<image>"`)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        **({"extra_special_tokens": named_tokens} if named_tokens else {}),
    )
    wrapped.chat_template = chat_template
    return wrapped


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    import torch

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def poison(model: Qwen2ForCausalLM) -> None:
    """Make the final norm's weight NaN: every hidden state it scales, so every logit and every
    loss, is NaN, on any CPU (IEEE arithmetic carries a NaN through every sum and product). A large
    learning rate is no substitute: whether it ends in NaN or in a flat, finite loss depends on the
    CPU's kernels (issue 36)."""
    import torch

    with torch.no_grad():
        model.model.norm.weight.fill_(math.nan)


def save_tiny_model(out_dir: Path, seed: int = 0, *, nan: bool = False) -> Path:
    """The tiny model and its tokenizer in `out_dir`; another `seed` gives other weights on the same
    tokenizer (a distillation teacher the student differs from). With `nan`, the model is poisoned
    (`poison`): a run that trains it logs nothing but NaN losses, as a diverged run does, so a gate
    that must fail fails by construction (`adapterd demo --gate`, the tests)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    if nan:
        poison(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    arguments = sys.argv[2:]
    print(save_tiny_model(Path(sys.argv[1]), *(int(seed) for seed in arguments if seed != "--nan"), nan="--nan" in arguments))
