"""Build a tiny, randomly initialised vision-language model and its processor, in one of three
families transformers ships: LLaVA (a CLIP tower and a Qwen2 language model; the default),
Qwen2-VL, and Idefics3 (SmolVLM). Each sees 32x32 images through a two-layer tower of width 32,
uses the byte-level BPE tokenizer of handlers/tiny_model.py plus its family's image tokens, and has
a chat template whose messages hold image entries.

Used by `adapterd demo --method sft-vision` (and dpo-vision, grpo-vision) and by the tests, so that
neither downloads a model: each trains a few steps on the CPU in seconds and loads back as any
vision-language model does (`AutoProcessor`, `AutoModelForImageTextToText`). Run as
`python -m handlers.tiny_vlm OUT_DIR [llava|qwen2-vl|idefics3]` (the daemon never imports this
module: it imports torch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessor,
    Idefics3Processor,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedModel,
    ProcessorMixin,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

from handlers.tiny_model import CORPUS, SPECIAL_TOKENS, build_tokenizer

IMAGE_SIZE = 32
PATCH_SIZE = 8
VISION_CORPUS = [*CORPUS, "What is in this picture? Describe the image. A red square. A green square. A blue square. What colour is it?"]
# Qwen2-VL's image entry: the processor widens `<|image_pad|>` to the image's tokens.
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def chat_template(image: str) -> str:
    """ChatML with content that is a string or a list of {"type": "image"} / {"type": "text", "text": ...}
    entries, each image entry written as `image`. Rows read from a dataset carry every key on every
    entry (an image entry has "text": None): the template tests the type."""
    parts = (
        "{% for part in parts %}{% if part['type'] == 'image' %}{{ '" + image + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    )
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
        "{% else %}{% set parts = message['content'] %}{% endif %}"
        "{% if message['role'] == 'assistant' %}{% generation %}" + parts + "{{ '<|im_end|>' }}{% endgeneration %}"
        "{% else %}" + parts + "{{ '<|im_end|>' }}{% endif %}{{ '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )


def text_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """The two-layer language model every family gets, sized to the tokenizer."""
    return dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **extra,
    )


def llava() -> tuple[ProcessorMixin, Callable[[ProcessorMixin], PreTrainedModel]]:
    """LLaVA: CLIP drops its CLS token, so a 32x32 image is (32 / 8)^2 = 16 `<image>` tokens."""
    template = chat_template("<image>")
    tokenizer = build_tokenizer(special_tokens=[*SPECIAL_TOKENS, "<image>"], corpus=VISION_CORPUS, chat_template=template, image_token="<image>")
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_resize=True, do_center_crop=True,
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=template, image_token="<image>",
    )

    def model(processor: ProcessorMixin) -> PreTrainedModel:
        tok = processor.tokenizer
        vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=32)
        return LlavaForConditionalGeneration(LlavaConfig(
            vision_config=vision, text_config=Qwen2Config(**text_config(tok, tie_word_embeddings=True)),
            image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default", vision_feature_layer=-1,
            tie_word_embeddings=True,
        ))

    return processor, model


def qwen2_vl() -> tuple[ProcessorMixin, Callable[[ProcessorMixin], PreTrainedModel]]:
    """Qwen2-VL: 8-pixel patches merged 2x2, so a 32x32 image is 4 `<|image_pad|>` tokens."""
    template = chat_template(QWEN_IMAGE)
    tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer = build_tokenizer(
        special_tokens=[*SPECIAL_TOKENS, *tokens], corpus=VISION_CORPUS, chat_template=template, image_token="<|image_pad|>",
        video_token="<|video_pad|>", vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
    )
    pixels = IMAGE_SIZE * IMAGE_SIZE
    sizes: dict[str, Any] = dict(size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), video_processor=Qwen2VLVideoProcessor(**sizes),
                                 tokenizer=tokenizer, chat_template=template)

    def model(processor: ProcessorMixin) -> PreTrainedModel:
        tok = processor.tokenizer
        ids = tok.convert_tokens_to_ids
        # mrope splits each head's rotary half (head size 8 / 2 = 4) over time, height and width.
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
        return Qwen2VLForConditionalGeneration(Qwen2VLConfig(
            vision_config=dict(depth=2, embed_dim=32, hidden_size=32, mlp_ratio=2, num_heads=4, patch_size=PATCH_SIZE,
                               spatial_merge_size=2, temporal_patch_size=2),
            text_config=text_config(tok, max_window_layers=2, rope_parameters=rope),
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True,
        ))

    return processor, model


def idefics3() -> tuple[ProcessorMixin, Callable[[ProcessorMixin], PreTrainedModel]]:
    """Idefics3 (SmolVLM): 16 patches shuffled down by 2x2, so a 32x32 image is 4 `<image>` tokens."""
    template = chat_template("<image>")
    tokens = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tokenizer = build_tokenizer(special_tokens=[*SPECIAL_TOKENS, *tokens], corpus=VISION_CORPUS, chat_template=template, image_token="<image>")
    image_processor = Idefics3ImageProcessor(size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE}, do_image_splitting=False)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4, chat_template=template)

    def model(processor: ProcessorMixin) -> PreTrainedModel:
        tok = processor.tokenizer
        return Idefics3ForConditionalGeneration(Idefics3Config(
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               image_size=IMAGE_SIZE, patch_size=PATCH_SIZE),
            text_config=text_config(tok, model_type="llama", tie_word_embeddings=True),
            image_token_id=tok.convert_tokens_to_ids("<image>"), scale_factor=2, tie_word_embeddings=True,
        ))

    return processor, model


FAMILIES = {"llava": llava, "qwen2-vl": qwen2_vl, "idefics3": idefics3}


def save_tiny_vlm(out_dir: Path, family: str = "llava", seed: int = 0) -> Path:
    import torch

    processor, build_model = FAMILIES[family]()
    torch.manual_seed(seed)
    model = build_model(processor)
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    print(save_tiny_vlm(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "llava"))
