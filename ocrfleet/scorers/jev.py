"""MiniCPM-OCR-Jev through transformers: Qwen3.5-2B with a 2-way classification head reads
[region crop, rendered candidate] and the candidate text; score = softmax(logits)[1].

Per unit: precheck -> render -> forward in batches. Every failure is a verdict for that unit
only (`precheck_failed`, `render_failed`, `forward_failed`), never an exception, never a
low score. Loading is eager: a bad model path fails at construction, i.e. at worker start.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ocrfleet import ir
from ocrfleet.checkpoints import folder_sha256 as _folder_sha256
from ocrfleet.config import Settings
from ocrfleet.scorers.base import Policy, Unit, judgement, settings_thresholds
from ocrfleet.scorers.precheck import precheck
from ocrfleet.scorers.render import RenderError, content_bounds, render, renderer_version

log = logging.getLogger(__name__)

# The user prompt, byte for byte as the model's documentation gives it. Each `<image>` is
# where one image goes, in the order [original crop, rendered candidate].
PROMPT_TEMPLATE = (
    "<image>\nOCR文本：\n{text}\n<image>\n"
    "第一张图是原图，第二张图是上述 OCR 文本渲染得到的图片。\n"
    "请判断该 OCR 文本及其对应渲染图是否与原图内容一致。\n"
    "这是一个二分类任务：一致标为 1，不一致标为 0。"
)
IMAGE_PLACEHOLDER = "<image>"
# The sequence ends with the user turn: the classifier reads its last token. (No assistant
# header: nothing is generated.) Part of the scorer version, like the prompt.
ADD_GENERATION_PROMPT = False
POSITIVE_LABEL = 1
# Architecture names a Jev checkpoint may declare; all load as
# Qwen3_5ForSequenceClassification (the released checkpoint says MiniCPMOCR…, model type
# qwen3_5, which transformers has no class of that name for).
JEV_ARCHITECTURES = frozenset(
    {"Qwen3_5ForSequenceClassification", "MiniCPMOCRForSequenceClassification"}
)
_DTYPES = ("bfloat16", "float16", "float32")


class JevModelError(RuntimeError):
    """The Jev checkpoint cannot be used (missing path, missing files, wrong head)."""


@dataclass(frozen=True)
class Prepared:
    """A unit that passed precheck and rendering: ready for the model."""

    index: int
    unit: Unit
    rendered: Image.Image


def policy(settings: Settings) -> Policy:
    """One threshold per category (the settings', else the classifier's decision boundary)
    for every engine; no best-of-N margin."""
    return Policy(fixed=settings_thresholds(settings))


def _prompt_sha256() -> str:
    return hashlib.sha256(f"{PROMPT_TEMPLATE}\0{ADD_GENERATION_PROMPT}".encode()).hexdigest()


def messages_for(text: str) -> list[dict[str, Any]]:
    """The one chat message: PROMPT_TEMPLATE with the candidate text, split at each image.

    The template is split before the text is inserted, so `<image>` inside a candidate
    stays text and never adds an image."""
    chunks = PROMPT_TEMPLATE.split(IMAGE_PLACEHOLDER)
    content: list[dict[str, Any]] = []
    for number, chunk in enumerate(chunks):
        if chunk:
            content.append({"type": "text", "text": chunk.replace("{text}", text)})
        if number < len(chunks) - 1:
            content.append({"type": "image"})
    return [{"role": "user", "content": content}]


class JevScorer:
    """The GPU scorer. Implements `ocrfleet.scorers.base.Scorer`."""

    name = "jev"

    def __init__(self, settings: Settings) -> None:
        import torch
        from transformers import AutoProcessor, Qwen3_5ForSequenceClassification

        self.settings = settings
        path = settings.jev_model_path
        if path is None:
            raise JevModelError("the jev scorer needs OCRFLEET_JEV_MODEL_PATH (a local folder)")
        path = Path(path)
        if not path.is_dir():
            raise JevModelError(f"OCRFLEET_JEV_MODEL_PATH is not a folder: {path}")
        if not (path / "config.json").is_file():
            raise JevModelError(f"no config.json in the Jev checkpoint folder {path}")
        declared = json.loads((path / "config.json").read_text()).get("architectures") or []
        if unknown := sorted(set(declared) - JEV_ARCHITECTURES):
            raise JevModelError(
                f"{path} declares architectures {unknown}; a Jev checkpoint is one of "
                f"{sorted(JEV_ARCHITECTURES)}"
            )
        if settings.jev_dtype not in _DTYPES:
            raise JevModelError(f"jev_dtype must be one of {_DTYPES}, not {settings.jev_dtype!r}")
        self.font_path = settings.render_font_path
        self.renderer_version = renderer_version(self.font_path)  # fails now if font missing

        device = settings.jev_device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = Qwen3_5ForSequenceClassification.from_pretrained(
            path,
            dtype=getattr(torch, settings.jev_dtype),
            attn_implementation=settings.jev_attn_implementation,
        )
        self.model.to(self.device).eval()
        if self.model.config.num_labels != 2:
            raise JevModelError(
                f"{path} has a {self.model.config.num_labels}-way head; Jev has 2 labels"
            )
        self.processor = AutoProcessor.from_pretrained(path)
        # Left padding. The head pools the rightmost token that is not text_config's
        # pad_token_id (transformers' GenericForSequenceClassification), i.e. the last token
        # of the prompt; a config without pad_token_id gets the tokenizer's pad token.
        self.processor.tokenizer.padding_side = "left"
        text_config = self.model.config.get_text_config()
        if text_config.pad_token_id is None:
            if self.processor.tokenizer.pad_token_id is None:
                raise JevModelError(f"{path}: neither the config nor the tokenizer has a pad token")
            text_config.pad_token_id = self.processor.tokenizer.pad_token_id
        self.batch_size = settings.jev_batch_size

        model_hash = _folder_sha256(path)[:16]
        parameter = next(self.model.parameters())
        self.params: dict[str, Any] = {
            "model_path": str(path),
            "model_sha256": model_hash,
            "dtype": str(parameter.dtype).removeprefix("torch."),
            "device": str(parameter.device),
            "batch_size": self.batch_size,
            "attn_implementation": self.model.config._attn_implementation,
            "pad_token_id": text_config.pad_token_id,
            "add_generation_prompt": ADD_GENERATION_PROMPT,
            "prompt_sha256": _prompt_sha256()[:16],
            "renderer_version": self.renderer_version,
            "torch": torch.__version__,
        }
        self.version = (
            f"minicpm-ocr-jev@{model_hash}+prompt-{_prompt_sha256()[:8]}+{self.renderer_version}"
        )

    # -- inputs ------------------------------------------------------------------------

    def prompt_for(self, text: str) -> str:
        """The chat text the tokenizer receives for one candidate (checkpoint's template)."""
        return self.processor.apply_chat_template(
            messages_for(text), tokenize=False, add_generation_prompt=ADD_GENERATION_PROMPT
        )

    def render_unit(self, unit: Unit) -> Image.Image:
        """The candidate drawn into the crop's content bounds (raises RenderError)."""
        return render(
            unit.text,
            unit.category,
            unit.crop.size,
            content_bounds(unit.crop),
            font_path=self.font_path,
        )

    def build_inputs(self, pairs: list[tuple[Unit, Image.Image]]) -> Any:
        """Model inputs (a BatchFeature) for (unit, rendered) pairs, left-padded.

        Images go in the order [crop, rendered] per unit, matching the prompt's `<image>`s."""
        texts = [self.prompt_for(unit.text) for unit, _ in pairs]
        images: list[Image.Image] = []
        for unit, rendered in pairs:
            images += [unit.crop.convert("RGB"), rendered]
        return self.processor(text=texts, images=images, padding=True, return_tensors="pt")

    # -- scoring -----------------------------------------------------------------------

    def forward(self, pairs: list[tuple[Unit, Image.Image]]) -> list[float]:
        """P(consistent) for each pair, in one forward pass. Raises on any failure."""
        import torch

        inputs = self.build_inputs(pairs).to(self.device)
        with torch.inference_mode():
            logits = self.model(**inputs).logits
        probabilities = torch.softmax(logits.float(), dim=-1)[:, POSITIVE_LABEL]
        return [float(value) for value in probabilities.cpu()]

    def _free_cuda(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _forward_all(self, ready: list[Prepared], out: list[ir.Score | None]) -> None:
        """Batches of `batch_size`; a failing batch is retried one unit at a time, and CUDA
        out-of-memory halves the batch first. Only units that still fail get forward_failed."""
        import torch

        batch_size, start = self.batch_size, 0
        while start < len(ready):
            chunk = ready[start : start + batch_size]
            try:
                scores = self.forward([(item.unit, item.rendered) for item in chunk])
            except torch.cuda.OutOfMemoryError as error:
                self._free_cuda()
                if batch_size > 1:
                    batch_size //= 2
                    log.warning("jev: CUDA out of memory, batch size now %d", batch_size)
                    continue
                out[chunk[0].index] = self._failed_forward(chunk[0].unit, error)
                start += 1
                continue
            except Exception as error:
                if len(chunk) == 1:
                    out[chunk[0].index] = self._failed_forward(chunk[0].unit, error)
                else:
                    log.warning(
                        "jev: batch of %d failed (%s); retrying one by one", len(chunk), error
                    )
                    for item in chunk:
                        out[item.index] = self._score_one(item)
                start += len(chunk)
                continue
            for item, score in zip(chunk, scores, strict=True):
                out[item.index] = judgement(self, item.unit, ir.Verdict.scored, score=score)
            start += len(chunk)

    def _score_one(self, item: Prepared) -> ir.Score:
        try:
            (score,) = self.forward([(item.unit, item.rendered)])
        except Exception as error:
            self._free_cuda()
            return self._failed_forward(item.unit, error)
        return judgement(self, item.unit, ir.Verdict.scored, score=score)

    def _failed_forward(self, unit: Unit, error: BaseException) -> ir.Score:
        return judgement(
            self, unit, ir.Verdict.forward_failed, error=f"{type(error).__name__}: {error}"
        )

    def score(self, units: list[Unit]) -> list[ir.Score]:
        out: list[ir.Score | None] = [None] * len(units)
        ready: list[Prepared] = []
        for index, unit in enumerate(units):
            reason = precheck(unit, self.settings)
            if reason is not None:
                out[index] = judgement(self, unit, ir.Verdict.precheck_failed, error=reason)
                continue
            try:
                rendered = self.render_unit(unit)
            except RenderError as error:
                out[index] = judgement(self, unit, ir.Verdict.render_failed, error=str(error))
                continue
            except Exception as error:  # a renderer bug must not take the page down
                log.exception("jev: renderer crashed on region %d", unit.region_number)
                reason = f"renderer crashed: {type(error).__name__}: {error}"
                out[index] = judgement(self, unit, ir.Verdict.render_failed, error=reason)
                continue
            ready.append(Prepared(index, unit, rendered))
        self._forward_all(ready, out)
        assert all(score is not None for score in out)
        return [score for score in out if score is not None]
