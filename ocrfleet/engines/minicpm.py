"""MiniCPM-OCR through transformers (`minicpm_ocr`: MiniCPMOcrForConditionalGeneration and
its processor), the recogniser of the device workers.

- Loaded once per process from `OCRFLEET_MINICPM_MODEL_PATH`; a missing or wrong folder is
  a CheckpointError at construction, i.e. at worker start, never a download.
- Text regions get plain text, tables HTML, formulas LaTeX: one prompt per category
  (`PROMPTS`, whose sha256 is in the version and so in run_id), in the checkpoint's chat
  template.
- Greedy decoding (`do_sample=False`, `num_beams=1`), `max_new_tokens`, dtype, batch size
  and attention implementation from settings; the generation parameters the model really
  runs with (the checkpoint's generation_config.json with ours on top) are in `params`.
- A page's regions go in batches, left-padded with attention masks; a region whose
  generation ends at the token limit instead of at an end token is `truncated`.
- CUDA out-of-memory halves the batch and retries; the smaller size sticks for the process.
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import lru_cache
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from PIL import Image

from ocrfleet import ir
from ocrfleet.checkpoints import CheckpointError, checkpoint_folder, folder_sha256
from ocrfleet.config import Settings
from ocrfleet.engines.base import Reading

log = logging.getLogger(__name__)

VARIABLE = "OCRFLEET_MINICPM_MODEL_PATH"
# One instruction per category, after the region's image in the user turn.
PROMPTS = {
    ir.Category.text: "Text Recognition:",
    ir.Category.table: "Table Recognition (HTML):",
    ir.Category.formula: "Formula Recognition (LaTeX):",
}
GREEDY = {"do_sample": False, "num_beams": 1}
_DTYPES = ("bfloat16", "float16", "float32")


def prompts_sha256() -> str:
    blob = json.dumps({str(k): v for k, v in PROMPTS.items()}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


@lru_cache(maxsize=4)
def _checkpoint_sha256(folder: Path, stamp: tuple[tuple[str, int, int], ...]) -> str:
    return folder_sha256(folder)


def checkpoint_sha256(folder: Path) -> str:
    """The checkpoint's hash, recomputed only when a file's size or mtime changes."""
    stamp = tuple(
        (str(p), p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    )
    return _checkpoint_sha256(folder, stamp)


def generation_params(folder: Path, settings: Settings) -> dict[str, Any]:
    """What `generate` runs with: the checkpoint's generation config with ours on top."""
    from transformers import GenerationConfig

    config = (
        GenerationConfig.from_pretrained(folder)
        if (folder / "generation_config.json").is_file()
        else GenerationConfig()
    )
    config.update(**GREEDY, max_new_tokens=settings.minicpm_max_new_tokens)
    params = config.to_diff_dict()
    params.pop("transformers_version", None)
    return json.loads(json.dumps(params, sort_keys=True, default=str))


def describe(settings: Settings) -> dict[str, Any]:
    """Everything that changes this engine's output, without loading the model (run_id):
    the checkpoint by its content, not by where an image mounts it."""
    folder = checkpoint_folder(settings.minicpm_model_path, VARIABLE)
    return {
        "model_sha256": checkpoint_sha256(folder)[:16],
        "prompts_sha256": prompts_sha256()[:16],
        "generation": generation_params(folder, settings),
        "dtype": settings.minicpm_dtype,
        "batch_size": settings.minicpm_batch_size,
        "attn_implementation": settings.minicpm_attn_implementation,
        "transformers": package_version("transformers"),
        "torch": package_version("torch"),
    }


def version(settings: Settings) -> str:
    described = describe(settings)
    blob = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return f"minicpm-ocr@{described['model_sha256'][:12]}+{blob[:12]}"


class MiniCPMRecogniser:
    """Implements `ocrfleet.engines.base.Recogniser`, with its own mode for tables and
    formulas (`categories`)."""

    name = "minicpm"
    categories = frozenset(PROMPTS)

    def __init__(self, settings: Settings) -> None:
        import torch
        from transformers import AutoProcessor, MiniCPMOcrForConditionalGeneration

        folder = checkpoint_folder(settings.minicpm_model_path, VARIABLE)
        declared = json.loads((folder / "config.json").read_text()).get("model_type")
        if declared != "minicpm_ocr":
            raise CheckpointError(
                f"{folder} holds a {declared!r} model, not minicpm_ocr ({VARIABLE})"
            )
        if settings.minicpm_dtype not in _DTYPES:
            raise CheckpointError(
                f"minicpm_dtype must be one of {_DTYPES}, not {settings.minicpm_dtype!r}"
            )
        from ocrfleet.tasks.devices import device_report

        device = settings.minicpm_device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device_report(device)  # a configured device this process cannot use: StartupError
        self.device = torch.device(device)
        self.model = MiniCPMOcrForConditionalGeneration.from_pretrained(
            folder,
            dtype=getattr(torch, settings.minicpm_dtype),
            attn_implementation=settings.minicpm_attn_implementation,
        )
        self.model.to(self.device).eval()
        self.processor = AutoProcessor.from_pretrained(folder)
        tokenizer = self.processor.tokenizer
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            raise CheckpointError(f"{folder}: the tokenizer has no pad token")
        self.generation = generation_params(folder, settings)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        if not self.eos_ids:
            raise CheckpointError(f"{folder}: the generation config names no eos_token_id")
        self.max_new_tokens = settings.minicpm_max_new_tokens
        self.batch_size = settings.minicpm_batch_size
        parameter = next(self.model.parameters())
        self.params: dict[str, Any] = {
            **describe(settings),
            "device": str(parameter.device),
            "dtype": str(parameter.dtype).removeprefix("torch."),
            "attn_implementation": self.model.config._attn_implementation,
        }
        self.version = version(settings)

    def prompt_for(self, category: ir.Category) -> str:
        """The chat text for one region of `category` (the checkpoint's template)."""
        messages = [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": PROMPTS[category]}],
            }
        ]
        return self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def generate_tokens(
        self, crops: list[Image.Image], categories: list[ir.Category]
    ) -> list[list[int]]:
        """The generated token ids of one batched generation, padding included; raises on
        any failure."""
        import torch

        texts = [self.prompt_for(category) for category in categories]
        images = [[image.convert("RGB")] for image in crops]
        inputs = self.processor(images=images, text=texts, padding=True, return_tensors="pt")
        inputs = inputs.to(self.device)
        with torch.inference_mode():
            out = self.model.generate(
                **inputs,
                **GREEDY,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.processor.tokenizer.pad_token_id,
            )
        return out[:, inputs["input_ids"].shape[1] :].cpu().tolist()

    def generate(self, crops: list[Image.Image], categories: list[ir.Category]) -> list[Reading]:
        """One batched generation, decoded up to each row's first end token."""
        readings = []
        for tokens in self.generate_tokens(crops, categories):
            ends = [i for i, token in enumerate(tokens) if token in self.eos_ids]
            body = tokens[: ends[0]] if ends else tokens
            text = self.processor.tokenizer.decode(body, skip_special_tokens=True).strip()
            readings.append(Reading(text, None, truncated=not ends))
        return readings

    def recognise(
        self, crops: list[Image.Image], categories: list[ir.Category] | None = None
    ) -> list[Reading]:
        import torch

        kinds = [ir.Category(c).scored_as for c in categories or [ir.Category.text] * len(crops)]
        if len(kinds) != len(crops):
            raise ValueError(f"{len(kinds)} categories for {len(crops)} crops")
        readings: list[Reading] = []
        start = 0
        while start < len(crops):
            size = self.batch_size
            try:
                readings += self.generate(crops[start : start + size], kinds[start : start + size])
            except torch.cuda.OutOfMemoryError:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                if size == 1:
                    raise
                self.batch_size = size // 2
                log.warning("minicpm: CUDA out of memory, batch size now %d", self.batch_size)
                continue
            start += size
        return readings
