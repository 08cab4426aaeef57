"""Build a tiny, randomly initialised vision-language model and its processor: LLaVA, a CLIP vision
tower of width 32 on 32x32 images (16 image tokens each) and a two-layer Qwen2 language model, with
the byte-level BPE tokenizer of handlers/tiny_model.py plus an `<image>` token, and a chat template
whose messages hold image entries.

Used by `adapterd demo --method sft-vision` (and dpo-vision, grpo-vision) and by the tests, so that
neither downloads a model: it trains a few steps on the CPU in about a second and loads back as any
vision-language model does (`AutoProcessor`, `AutoModelForImageTextToText`). Run as
`python -m handlers.tiny_vlm OUT_DIR` (the daemon never imports this module: it imports torch).
"""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    Qwen2Config,
)

from handlers.tiny_model import CORPUS, SPECIAL_TOKENS, build_tokenizer

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKEN = "<image>"

# Content is a string or a list of {"type": "image"} / {"type": "text", "text": ...} entries; each
# image entry becomes one `<image>`, which the processor widens to the image's 16 tokens. Rows read
# from a dataset carry every key on every entry (an image entry has "text": None): test the type.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% for part in parts %}{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{{ '<|im_end|>' }}{% endgeneration %}"
    "{% else %}"
    "{% for part in parts %}{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{{ '<|im_end|>' }}"
    "{% endif %}{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VISION_CORPUS = [*CORPUS, "What is in this picture? Describe the image. A red square. A green square. A blue square. What colour is it?"]


def build_processor() -> LlavaProcessor:
    tokenizer = build_tokenizer(
        special_tokens=[*SPECIAL_TOKENS, IMAGE_TOKEN], corpus=VISION_CORPUS, chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN,
    )
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_resize=True, do_center_crop=True,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",  # CLIP's CLS token dropped: (32 / 8)^2 = 16 image tokens
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def build_model(processor: LlavaProcessor, seed: int = 0) -> LlavaForConditionalGeneration:
    import torch

    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE,
        projection_dim=32,
    )
    text = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_vlm(out_dir: Path) -> Path:
    processor = build_processor()
    model = build_model(processor)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(save_tiny_vlm(Path(sys.argv[1])))
